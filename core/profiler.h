// A kernel-level profiler: while a Profiler is alive, every stub call (core/dispatch.h) on any
// thread is timed, and its self time (minus the stub calls it makes itself) is summed per
// stub and op (`unary_stub:gelu_erf`, `matmul_stub`, ...), as torch.profiler's table sums self
// time per aten op. What the table does not hold is outside any kernel: graph recording,
// allocation, dispatch, Python-free framework code.
//
// Two more things for `build/bench/workloads` (the workload limits, docs/performance.md):
//   - replay: calls of the stubs named in ProfileOptions::replay are captured once per distinct
//     call (stub, every tensor's dtype / sizes / strides / offset, every other argument's bytes)
//     with copies of their tensors, and counted, so that each can be run again alone later;
//   - bytes: with ProfileOptions::count_bytes, the storages that the other stubs touch are kept
//     (alive, so that a reused address is not mistaken for the same tensor) and
//     floor_bytes() = 2 x the bytes of every storage some kernel wrote (written once, read back
//     at least once) + the bytes of every storage only read.
// One Profiler at a time; CPU kernels only (a CUDA launch returns before the kernel runs, so a
// CUDA stub's time is its launch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace accel {

struct ProfileOptions {
  std::vector<std::string> replay;  // stub names, e.g. {"matmul_stub", "conv2d_stub"}
  bool count_bytes = false;
};

struct ProfileRow {
  std::string op;  // stub name, ":" and the op label when the stub has one
  int64_t calls = 0;
  double self_ms = 0;   // summed over all threads
  double total_ms = 0;  // self + nested stub calls
};

struct ReplayCall {
  std::string stub;
  std::string key;            // identifies the call (see above)
  int64_t count = 0;          // calls with this key while the profiler was alive
  std::function<void()> run;  // the call again, on copies of its tensors
};

class Profiler {
 public:
  explicit Profiler(ProfileOptions options = {});
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Sorted by self time, largest first.
  std::vector<ProfileRow> rows() const;
  // Captured calls in first-call order. The profiler keeps its own copies.
  std::vector<ReplayCall> replays() const;
  int64_t floor_bytes() const;
  // Forgets rows, replays and bytes (e.g. after warm-up steps).
  void reset();
};

}  // namespace accel
