// build/bench/workloads: the output contract of docs/bench.md, checked on the cheapest workload
// (`op`, under a second). Every result line is `key=value` pairs separated by single spaces,
// starting with workload=NAME, with a positive finite figure. Timings are never compared.
// zero-memory (multi-process, through the Accelerator) runs once, tiny.
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

#include "tests/common/util.h"

using accel::test::read_file;

namespace {

const std::string kWorkloads = ACCEL_WORKLOADS_PATH;

struct Run {
  int status = -1;
  std::string out, err;
};

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
  // The bf16 GEMM route and why (Note [bf16 GEMM where it does not pay]); without bf16
  // instructions, or where they are slower than float32 FMAs, the bench says the bf16 speed
  // targets cannot be measured.
  REQUIRE(kv.count("bf16_gemm") == 1);
  CHECK((kv["bf16_gemm"] == "native" || kv["bf16_gemm"] == "f32"));
  CHECK(!kv["bf16_gemm_why"].empty());
  const bool bf16 = kv["avx512_bf16"] == "1" || kv["amx_bf16"] == "1";
  if (!bf16) {
    CHECK(kv["bf16_targets"] == "unmeasurable_without_bf16_instructions");
  } else if (kv["bf16_gemm"] == "f32") {
    CHECK(kv["bf16_targets"] == "unmeasurable_bf16_gemm_slower_than_f32_here");
  } else {
    CHECK(kv.count("bf16_targets") == 0u);
  }
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

TEST_CASE("workloads mlp prints its limit and efficiency, and --profile the per-op table") {
  // 2 steps on Fashion-MNIST (a Debian package the test command installs).
  const Run r = run(kWorkloads, "--steps 2 --warmup 0 --profile mlp");
  INFO("stderr: ", r.err);
  REQUIRE(r.status == 0);
  const auto lines = lines_of(r.out);
  REQUIRE(lines.size() >= 3);
  check_features_line(lines[0]);
  auto kv = parse_line(lines[1]);
  CHECK(kv["workload"] == "mlp");
  for (const char* k : {"ms_per_step", "limit_ms", "efficiency", "compute_ms", "memory_ms",
                        "floor_mb", "copy_gbs"}) {
    CAPTURE(k);
    CHECK(positive_number(kv[k]));
  }
  // The three Linear layers: 3 forward products, 3 weight gradients, 2 input gradients.
  CHECK(kv["replayed_calls"] == "8");
  CHECK(kv["replayed_shapes"] == "8");
  bool matmul_row = false, outside_row = false;
  for (size_t i = 2; i < lines.size(); ++i) {
    auto p = parse_line(lines[i]);
    CHECK(p["workload"] == "profile");
    CHECK(p["of"] == "mlp");
    matmul_row = matmul_row || p["op"] == "matmul_stub";
    if (p["op"] == "outside_kernels") {
      outside_row = true;
      CHECK(positive_number(p["step_ms"]));
      CHECK(positive_number(p["kernels_ms"]));
    }
  }
  CHECK(matmul_row);
  CHECK(outside_row);
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
  const accel::test::TempDir tmp("bench-dir");
  const std::string link = tmp / "workloads";
  REQUIRE(symlink(kWorkloads.c_str(), link.c_str()) == 0);
  const Run r = run(link, "--vs libtorch op");
  const Run plain = run(link, "--vs none op");
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

// zero-memory, tiny: a 2-block GPT of width 64 at world sizes 1 and 2, stages 0 and 3, two
// measured steps. Checks the line per (stage, world) in order, that every figure is a number,
// that the flags reach the model (its parameter count), the invariants between the figures,
// and the three target lines. The figures themselves are not judged.
TEST_CASE("workloads zero-memory prints one line per stage and world size, then the targets") {
  REQUIRE(exists(kWorkloads));
  const Run r = run(kWorkloads,
                    "zero-memory --d-model 64 --layers 2 --steps 2 --warmup 1 --worlds 1,2 "
                    "--stages 0,3");
  INFO("stderr: ", r.err);
  REQUIRE(r.status == 0);
  std::vector<std::string> all = lines_of(r.out), lines, estimates;
  // After each (stage, world) line, the estimate against the measured state (issue 41).
  for (const std::string& l : all)
    (l.find(" check=estimate_state ") != std::string::npos ? estimates : lines).push_back(l);
  REQUIRE(lines.size() == 1 + 4 + 3);  // features, (stage, world) lines, target lines
  REQUIRE(estimates.size() == 4);
  for (const std::string& line : estimates) {
    INFO("line: '", line, "'");
    auto kv = parse_line(line);
    REQUIRE(positive_number(kv["state_mb"]));
    REQUIRE(positive_number(kv["est_state_mb"]));
    REQUIRE(positive_number(kv["est_peak_mb"]));
    const double ratio = std::stod(kv["est_over_state"]);
    CHECK(ratio ==
          doctest::Approx(std::stod(kv["est_state_mb"]) / std::stod(kv["state_mb"])).epsilon(0.01));
    CHECK((kv["result"] == "PASS") == (std::abs(ratio - 1.0) <= 0.10));
    CHECK(kv["result"] == "PASS");  // accel::estimate is exact on the strategies' tensors
  }
  check_features_line(lines[0]);
  // Gpt(vocab 256, context 64, d 64, 2 blocks): embeddings, blocks, final LayerNorm, head.
  const long long d = 64, v = 256, t = 64;
  const long long block =
      2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  const long long params = v * d + t * d + 2 * block + 2 * d + d * v;
  const std::pair<int, int> order[] = {{0, 1}, {3, 1}, {0, 2}, {3, 2}};
  std::map<std::pair<int, int>, std::map<std::string, std::string>> by;
  for (int i = 0; i < 4; ++i) {
    const std::string& line = lines[size_t(1 + i)];
    INFO("line: '", line, "'");
    CHECK(line.rfind("workload=zero-memory ", 0) == 0);
    auto kv = parse_line(line);
    CHECK(kv["stage"] == std::to_string(order[i].first));
    CHECK(kv["world"] == std::to_string(order[i].second));
    // ZeRO-3 builds the model deferred (no memory until sharded): its model_rss_mb may be 0.
    REQUIRE(kv.count("model_rss_mb") == 1);
    CHECK(std::stod(kv["model_rss_mb"]) >= 0);
    CHECK(kv["init"] == (order[i].first == 3 && order[i].second > 1 ? "deferred" : "eager"));
    for (const char* k :
         {"peak_rss_mb", "steady_rss_mb", "alloc_peak_mb", "ms_step", "alloc_reserved_mb",
          "base_rss_mb", "rank0_steady_rss_mb", "rank0_alloc_peak_mb", "loss"}) {
      CAPTURE(k);
      REQUIRE(kv.count(k) == 1);
      CHECK_MESSAGE(positive_number(kv[k]), k, "=", kv[k]);
    }
    CHECK(std::stoll(kv["params"]) == params);
    CHECK(kv["steps"] == "2");
    CHECK(kv["warmup"] == "1");
    // The steady window is part of the run; rank 0 is one of the ranks of the maximum.
    CHECK(std::stod(kv["steady_rss_mb"]) <= std::stod(kv["peak_rss_mb"]));
    CHECK(std::stod(kv["rank0_steady_rss_mb"]) <= std::stod(kv["steady_rss_mb"]));
    CHECK(std::stod(kv["rank0_alloc_peak_mb"]) <= std::stod(kv["alloc_peak_mb"]));
    if (order[i].second > 1) CHECK(kv["threads"] == "1");  // ranks share the cores
    by[order[i]] = kv;
  }
  // Same data, seed and model: DDP and ZeRO-3 train the same thing (to float reduction order).
  for (const int world : {1, 2}) {
    CAPTURE(world);
    CHECK(std::stod(by[{3, world}]["loss"]) ==
          doctest::Approx(std::stod(by[{0, world}]["loss"])).epsilon(1e-3));
  }
  // The targets at the largest world size measured, each PASS or FAIL with its figure.
  const char* checks[] = {"zero3_over_ddp_peak", "stages_monotone", "zero3_over_ddp_ms"};
  for (int i = 0; i < 3; ++i) {
    const std::string& line = lines[size_t(5 + i)];
    INFO("line: '", line, "'");
    auto kv = parse_line(line);
    CHECK(kv["workload"] == "zero-memory");
    CHECK(kv["check"] == checks[i]);
    CHECK(kv["world"] == "2");
    CHECK((kv["result"] == "PASS" || kv["result"] == "FAIL"));
    REQUIRE(kv.count(checks[i]) == 1);
    const std::string value = kv[checks[i]];
    if (i == 1) {
      CHECK((value == "yes" || value == "no"));
      CHECK((kv["result"] == "PASS") == (value == "yes"));
    } else {
      REQUIRE(positive_number(value));
      const double ratio = std::stod(value), target = std::stod(kv["target_max"]);
      CHECK((kv["result"] == "PASS") == (ratio <= target));
      const char* figure = i == 0 ? "steady_rss_mb" : "ms_step";
      CHECK(ratio == doctest::Approx(std::stod(by[{3, 2}][figure]) / std::stod(by[{0, 2}][figure]))
                         .epsilon(0.01));
    }
  }
}

TEST_CASE("workloads zero-memory rejects bad lists and sizes with status 2") {
  REQUIRE(exists(kWorkloads));
  for (const char* args : {"--stages 4 zero-memory", "--stages 0,,3 zero-memory",
                           "--worlds 0 zero-memory", "--worlds 1,x zero-memory",
                           "--d-model 0 zero-memory", "--layers -1 zero-memory", "--worlds"}) {
    INFO("args: ", args);
    const Run r = run(kWorkloads, args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK_FALSE(r.err.empty());
  }
}
