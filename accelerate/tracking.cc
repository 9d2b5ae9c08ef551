// JSONL and TensorBoard trackers; see accelerate/tracking.h.
#include "accelerate/tracking.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {
// Writes all of `data` to the tracker's file; IoError naming it otherwise.
void write_out(const file_io::Fd& out, const std::string& path, const std::string& data) {
  ACCEL_CHECK(out, IoError, "tracker", "'", path, "' is closed (after finish())");
  ACCEL_CHECK(file_io::write_all(out.get(), data.data(), data.size()), IoError, "tracker",
              "write to '", path, "' failed: ", std::strerror(errno));
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// JSON has no inf/NaN: write them as strings so a diverging loss is still visible.
nlohmann::json metric_json(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}
}  // namespace

JsonlTracker::JsonlTracker(const std::string& dir, const std::string& file_name) {
  path_ = (fs::path(dir) / file_name).string();
  out_ = file_io::create_file(path_, "tracker", file_io::CreateMode::kAppend,
                              /*create_dirs=*/true);
}

// One write(2) per line: O_APPEND keeps lines whole.
void JsonlTracker::write_line(const std::string& line) { write_out(out_, path_, line + '\n'); }

void JsonlTracker::log(const Metrics& metrics, int64_t step) {
  nlohmann::json j = nlohmann::json::object();
  if (step >= 0) j["step"] = step;
  for (auto& [k, v] : metrics) j[k] = metric_json(v);
  write_line(j.dump());
}

void JsonlTracker::store_init_configuration(const std::map<std::string, std::string>& config) {
  nlohmann::json j;
  j["config"] = config;
  write_line(j.dump());
}

void JsonlTracker::finish() { out_.reset(); }

// ---- TensorBoard ----
//
// Note [tfevents encoding]
// An event file is a sequence of TFRecords: uint64 length (LE), uint32 masked crc32c of the
// length bytes, the data, uint32 masked crc32c of the data. Each record is a tensorflow.Event
// proto; we hand-encode the few fields we need:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2", as TensorFlow's writer does.

namespace {
struct CrcTable {
  uint32_t t[256];
  CrcTable() {
    const uint32_t poly = 0x82f63b78u;  // CRC-32C, reflected
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
      t[i] = c;
    }
  }
};
const CrcTable& crc_table() {
  static const CrcTable table;
  return table;
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  s.push_back(char(uint8_t(v)));
}
void put_tag(std::string& s, uint32_t field, uint32_t wire) { put_varint(s, (field << 3) | wire); }
void put_fixed(std::string& s, const void* p, size_t n) {
  s.append(static_cast<const char*>(p), n);
}
void put_bytes(std::string& s, uint32_t field, const std::string& b) {
  put_tag(s, field, 2);
  put_varint(s, b.size());
  s += b;
}
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);  // double, fixed64
  put_fixed(e, &wall_time, 8);
  if (step != 0) {
    put_tag(e, 2, 0);
    put_varint(e, uint64_t(step));
  }
  return e;
}
}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const uint32_t* table = crc_table().t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardTracker::TensorBoardTracker(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (fs::path(dir) / ("events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." +
                            host + "." + std::to_string(getpid())))
              .string();
  out_ = file_io::create_file(path_, "tracker", file_io::CreateMode::kReplace,
                              /*create_dirs=*/true);
  std::string e = event_header(now_seconds(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

void TensorBoardTracker::write_record(const std::string& data) {
  uint64_t len = data.size();
  uint32_t len_crc = masked_crc32c(&len, 8);
  uint32_t data_crc = masked_crc32c(data.data(), data.size());
  std::string record;
  put_fixed(record, &len, 8);
  put_fixed(record, &len_crc, 4);
  record += data;
  put_fixed(record, &data_crc, 4);
  write_out(out_, path_, record);
}

void TensorBoardTracker::log(const Metrics& metrics, int64_t step) {
  std::string summary;
  for (auto& [k, v] : metrics) {
    std::string value;
    put_bytes(value, 1, k);
    float f = float(v);
    put_tag(value, 2, 5);  // float, fixed32
    put_fixed(value, &f, 4);
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(now_seconds(), step < 0 ? 0 : step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardTracker::finish() { out_.reset(); }

TrackerPtr make_tracker(const std::string& name, const std::string& dir) {
  if (name == "jsonl") return std::make_unique<JsonlTracker>(dir);
  if (name == "tensorboard") return std::make_unique<TensorBoardTracker>(dir);
  ACCEL_THROW(ValueError, "tracker", "unknown tracker '", name,
              "' (expected jsonl or tensorboard)");
}

}  // namespace accel::dist
