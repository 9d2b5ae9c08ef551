// One output line of build/bench/workloads: key=value pairs separated by spaces, printed (and
// flushed) when the Line goes out of scope (the contract is in docs/bench.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace accel::bench {

class Line {
 public:
  Line& kv(const char* key, const std::string& v) {
    if (!text_.empty()) text_.push_back(' ');
    text_.append(key).append("=").append(v);
    return *this;
  }
  Line& kv(const char* key, int64_t v) { return kv(key, std::to_string(v)); }
  Line& kv(const char* key, double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return kv(key, std::string(buf));
  }
  ~Line() {
    // --busy N (workloads.cc): every line says how many busy processes ran beside it.
    if (const char* b = std::getenv("ACCEL_BENCH_BUSY"); b != nullptr && std::atoi(b) > 0)
      text_.append(" busy=").append(b);
    std::printf("%s\n", text_.c_str());
    std::fflush(stdout);
  }

 private:
  std::string text_;
};

}  // namespace accel::bench
