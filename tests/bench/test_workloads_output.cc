// build/bench/workloads: the output contract of docs/bench.md, checked on the cheapest workload
// (`op`, under a second). Every result line is `key=value` pairs separated by single spaces,
// starting with workload=NAME, with a positive finite figure. Timings are never compared.
#include <doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kWorkloads = ACCEL_WORKLOADS_PATH;

struct Run {
  int status = -1;
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `exe args` through the shell, capturing stdout and stderr.
Run run(const std::string& exe, const std::string& args) {
  char tmpl[] = "/tmp/accel_bench_test_XXXXXX";
  const int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string err_path = tmpl;
  const std::string cmd = "'" + exe + "' " + args + " 2>'" + err_path + "'";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_file(err_path);
  std::remove(err_path.c_str());
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  return lines;
}

bool valid_key(const std::string& k) {
  if (k.empty() || !(std::islower(static_cast<unsigned char>(k[0])) || k[0] == '_')) return false;
  for (const char c : k)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
      return false;
  return true;
}

// key=value pairs of one line, checking the format: single spaces, no empty keys or values,
// no repeated keys.
std::map<std::string, std::string> parse_line(const std::string& line) {
  INFO("line: '", line, "'");
  CHECK_FALSE(line.empty());
  CHECK(line.front() != ' ');
  CHECK(line.back() != ' ');
  CHECK(line.find("  ") == std::string::npos);
  std::map<std::string, std::string> kv;
  std::stringstream ss(line);
  for (std::string tok; ss >> tok;) {
    const size_t eq = tok.find('=');
    REQUIRE_MESSAGE(eq != std::string::npos, "token without '=': ", tok);
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    CHECK_MESSAGE(valid_key(k), "bad key: ", k);
    CHECK_MESSAGE(!v.empty(), "empty value for ", k);
    CHECK_MESSAGE(v.find('=') == std::string::npos, "'=' in the value of ", k);
    CHECK_MESSAGE(kv.count(k) == 0, "repeated key ", k);
    kv[k] = v;
  }
  return kv;
}

// A positive finite number, the whole value.
bool positive_number(const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end != v.c_str() && *end == '\0' && std::isfinite(d) && d > 0;
}

// The first line of every run: the CPU features (docs/bench.md), each flag 0 or 1.
void check_features_line(const std::string& line) {
  INFO("line: '", line, "'");
  CHECK(line.rfind("cpu_features=", 0) == 0);
  auto kv = parse_line(line);
  for (const char* flag :
       {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"}) {
    CAPTURE(flag);
    REQUIRE(kv.count(flag) == 1);
    CHECK((kv[flag] == "0" || kv[flag] == "1"));
  }
  // Without bf16 instructions the bench says the bf16 targets cannot be measured.
  const bool bf16 = kv["avx512_bf16"] == "1" || kv["amx_bf16"] == "1";
  CHECK(kv.count("bf16_targets") == (bf16 ? 0u : 1u));
}

// The two op lines (grad, nograd) of a run, after the features line, each checked for format
// and a positive `figure`.
std::map<std::string, std::map<std::string, std::string>> op_lines(const Run& r,
                                                                   const std::string& figure) {
  std::map<std::string, std::map<std::string, std::string>> by_mode;
  std::vector<std::string> lines = lines_of(r.out);
  REQUIRE(lines.size() == 3);  // stdout carries the features line and result lines only
  check_features_line(lines.front());
  lines.erase(lines.begin());
  for (const std::string& line : lines) {
    auto kv = parse_line(line);
    CHECK(line.rfind("workload=op ", 0) == 0);  // workload comes first
    CHECK(kv["workload"] == "op");
    INFO("line: '", line, "'");
    REQUIRE(kv.count(figure) == 1);
    CHECK_MESSAGE(positive_number(kv[figure]), figure, "=", kv[figure]);
    by_mode[kv["mode"]] = kv;
  }
  CHECK(by_mode.count("grad") == 1);
  CHECK(by_mode.count("nograd") == 1);
  return by_mode;
}

bool exists(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string dir_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

}  // namespace

TEST_CASE("workloads op prints one key=value line per mode with a positive us_per_op") {
  REQUIRE_MESSAGE(exists(kWorkloads), kWorkloads, " is not built (ninja -C build bench/workloads)");
  const Run r = run(kWorkloads, "op");
  INFO("stderr: ", r.err);
  CHECK(r.status == 0);
  op_lines(r, "us_per_op");
}

TEST_CASE("workloads rejects bad usage with status 2 and prints nothing on stdout") {
  REQUIRE(exists(kWorkloads));
  for (const char* args : {"", "no-such-workload", "--vs bogus op", "--rounds 0 op", "--steps x op",
                           "op mlp", "--precision fp8 op", "--precision"}) {
    INFO("args: ", args);
    const Run r = run(kWorkloads, args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK_FALSE(r.err.empty());  // the reason, or the usage
  }
}

TEST_CASE("--vs libtorch without the peer prints our figures, says so, and exits 1") {
  REQUIRE(exists(kWorkloads));
  // The runner looks for the peer beside itself (dirname(argv[0])/peers/torch_workloads): a
  // link to it in an empty directory has none.
  char tmpl[] = "/tmp/accel_bench_dir_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl, link = dir + "/workloads";
  REQUIRE(symlink(kWorkloads.c_str(), link.c_str()) == 0);
  const Run r = run(link, "--vs libtorch op");
  const Run plain = run(link, "--vs none op");
  unlink(link.c_str());
  rmdir(dir.c_str());
  INFO("stderr: ", r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("libtorch peer not built") != std::string::npos);
  for (const auto& [mode, kv] : op_lines(r, "us_per_op")) {
    CAPTURE(mode);
    CHECK(kv.at("libtorch") == "unavailable");
  }
  CHECK(plain.status == 0);  // not asked for: no error
  op_lines(plain, "us_per_op");
}

TEST_CASE("--vs libtorch with the peer prints both figures and their ratio") {
  REQUIRE(exists(kWorkloads));
  const std::string peer = dir_of(kWorkloads) + "/peers/torch_workloads";
  if (!exists(peer)) {
    MESSAGE("libtorch peer not built (", peer, "): the combined line is not checked");
    return;
  }
  const Run r = run(kWorkloads, "--vs libtorch --rounds 1 op");
  INFO("stderr: ", r.err);
  CHECK(r.status == 0);
  for (const auto& [mode, kv] : op_lines(r, "ratio")) {
    CAPTURE(mode);
    REQUIRE(kv.count("accel_us_per_op") == 1);
    REQUIRE(kv.count("libtorch_us_per_op") == 1);
    CHECK(positive_number(kv.at("accel_us_per_op")));
    CHECK(positive_number(kv.at("libtorch_us_per_op")));
    // ratio is the peer's time over ours, as printed (3 decimals).
    const double ratio = std::stod(kv.at("ratio"));
    const double expect =
        std::stod(kv.at("libtorch_us_per_op")) / std::stod(kv.at("accel_us_per_op"));
    CHECK(ratio == doctest::Approx(expect).epsilon(0.02));
    CHECK(kv.at("rounds") == "1");
  }
}
