// The one thread pool: OpenMP, shared with oneDNN (which is built on GNU OpenMP too).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/threading.h"

namespace accel::cpu {

// Elementwise work below this many elements stays on the calling thread: forking the team costs
// more than the loop (a few microseconds).
constexpr int64_t kParallelGrain = 32768;

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (n < grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(int64_t(0), n);
    return;
  }
  const TeamScope team;  // Notes [OpenMP wait default] and [team under load]
  const int64_t max_threads = std::min<int64_t>(omp_get_max_threads(), (n + grain - 1) / grain);
  if (max_threads <= 1) {
    f(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(int(max_threads))
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = tid * chunk;
    const int64_t e = std::min(n, b + chunk);
    if (b < e) f(b, e);
  }
}

}  // namespace accel::cpu
