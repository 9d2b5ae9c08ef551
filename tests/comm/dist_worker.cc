// Worker process for the multi-process dist tests: `dist_worker <scenario> [args]`, run under the
// env contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The test (test_process_group.cc)
// spawns one per rank and reads exit codes and output:
//   0 = scenario passed on this rank, 1 = a check failed, 2 = unexpected exception.
// Scenario knobs come from environment variables (DIST_TIMEOUT_MS, DIST_VICTIM, ...).
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>

#include "core/tensor.h"
#include "comm/env.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/heartbeat.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace accel::dist;
using Clock = std::chrono::steady_clock;

namespace {

using accel::test::g_failures;
using accel::test::g_rank;

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};

double get(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::Float32: return reinterpret_cast<const float*>(p)[i];
    case DType::Float64: return reinterpret_cast<const double*>(p)[i];
    case DType::Float16: return float(Half::from_bits(reinterpret_cast<const uint16_t*>(p)[i]));
    case DType::BFloat16:
      return float(BFloat16::from_bits(reinterpret_cast<const uint16_t*>(p)[i]));
    case DType::Int32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::Int64: return double(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::UInt8: return reinterpret_cast<const uint8_t*>(p)[i];
    case DType::Bool: return reinterpret_cast<const uint8_t*>(p)[i] ? 1 : 0;
  }
  return 0;
}
void set(const Tensor& t, int64_t i, double v) {
  char* p = static_cast<char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::Float32: reinterpret_cast<float*>(p)[i] = float(v); break;
    case DType::Float64: reinterpret_cast<double*>(p)[i] = v; break;
    case DType::Float16: reinterpret_cast<uint16_t*>(p)[i] = Half(float(v)).bits; break;
    case DType::BFloat16: reinterpret_cast<uint16_t*>(p)[i] = BFloat16(float(v)).bits; break;
    case DType::Int32: reinterpret_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::Int64: reinterpret_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::UInt8: reinterpret_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case DType::Bool: reinterpret_cast<uint8_t*>(p)[i] = v != 0; break;
  }
}

// Rank r's value at index i: small integers, exact in every dtype and in every sum of <= 3.
double value(DType dt, int r, int64_t i) {
  if (dt == kBool) return ((i + r) % 3) == 0 ? 1 : 0;
  int64_t v = (i * 7 + r * 3) % 11;
  if (dt == kUInt8) return double(v);
  return double(v - 5);
}

Tensor make(DType dt, int64_t n, int r, int64_t offset = 0) {
  Tensor t = empty({n}, TensorOptions(dt));
  for (int64_t i = 0; i < n; ++i) set(t, i, value(dt, r, offset + i));
  return t;
}

double reduce_expected(DType dt, ReduceOp op, int world, int64_t i) {
  double acc = value(dt, 0, i);
  for (int r = 1; r < world; ++r) {
    double v = value(dt, r, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc = dt == kBool ? double(acc != 0 || v != 0) : acc + v; break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) acc /= world;
  if (dt == kUInt8) acc = double(uint8_t(int64_t(acc)));
  return acc;
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::Float16: return 1e-2;
    case DType::BFloat16: return 2e-2;
    case DType::Float32: return 1e-6;
    default: return 0;
  }
}

std::vector<ReduceOp> ops_for(DType dt) {
  if (is_floating(dt)) return {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  return {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
}

// ---------------- scenarios ----------------

void scenario_collectives(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  // 4097: over the 16 KiB of a collective that travels over the control plane on TCP groups
  // for 4-byte and wider dtypes (Note [fingerprint paths]), under it for narrower ones.
  const std::vector<int64_t> sizes = {1, 7, 1001, 4097};
  for (DType dt : kAllDTypes) {
    for (int64_t n : sizes) {
      for (ReduceOp op : ops_for(dt)) {
        Tensor t = make(dt, n, r);
        pg.all_reduce(t, op);
        for (int64_t i = 0; i < n; ++i) {
          double want = reduce_expected(dt, op, w, i), got = get(t, i);
          if (std::abs(got - want) > tolerance(dt) * (1 + std::abs(want))) {
            WCHECK(false, "all_reduce " << reduce_op_name(op) << " " << dt << " n=" << n
                                        << " i=" << i << " got " << got << " want " << want);
            break;
          }
        }
        // reduce_scatter: chunk k = n per rank.
        Tensor in = make(dt, n * w, r);
        Tensor out = empty({n}, TensorOptions(dt));
        pg.reduce_scatter(out, in, op);
        for (int64_t j = 0; j < n; ++j) {
          double want = reduce_expected(dt, op, w, int64_t(r) * n + j), got = get(out, j);
          if (std::abs(got - want) > tolerance(dt) * (1 + std::abs(want))) {
            WCHECK(false, "reduce_scatter " << reduce_op_name(op) << " " << dt << " n=" << n
                                            << " j=" << j << " got " << got << " want " << want);
            break;
          }
        }
      }
      for (int root : {0, w - 1}) {
        Tensor t = make(dt, n, r);
        pg.broadcast(t, root);
        for (int64_t i = 0; i < n; ++i) {
          if (get(t, i) != value(dt, root, i)) {
            WCHECK(false, "broadcast root " << root << " " << dt << " n=" << n << " i=" << i);
            break;
          }
        }
      }
      Tensor in = make(dt, n, r);
      Tensor out = empty({n * w}, TensorOptions(dt));
      pg.all_gather(out, in);
      for (int q = 0; q < w; ++q)
        for (int64_t j = 0; j < n; ++j)
          if (get(out, q * n + j) != value(dt, q, j)) {
            WCHECK(false, "all_gather " << dt << " n=" << n << " from rank " << q << " j=" << j);
            q = w;
            break;
          }
      // In place: the input is this rank's chunk of the output.
      Tensor buf = empty({n * w}, TensorOptions(dt));
      for (int64_t j = 0; j < n; ++j) set(buf, r * n + j, value(dt, r, j));
      pg.all_gather(buf, buf.narrow(0, r * n, n));
      for (int64_t j = 0; j < n * w; ++j)
        if (get(buf, j) != value(dt, int(j / n), j % n)) {
          WCHECK(false, "in-place all_gather " << dt << " n=" << n << " j=" << j);
          break;
        }
    }
  }
  // A large f32 all_reduce: many Gloo segments; odd length.
  {
    const int64_t n = 600001;
    Tensor t = make(kFloat32, n, r);
    pg.all_reduce(t, ReduceOp::Sum);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      bad += get(t, i) != reduce_expected(kFloat32, ReduceOp::Sum, w, i);
    WCHECK(bad == 0, bad << " wrong elements in the large all_reduce");
  }
  // Large all_gather and reduce_scatter: several 4 MiB shared-memory chunks / windows (Note [shm
  // all-gather and reduce-scatter]) or Gloo segments; odd lengths.
  {
    const int64_t n = 1100003;
    Tensor in = make(kFloat32, n, r);
    Tensor out = empty({n * w}, TensorOptions(kFloat32));
    pg.all_gather(out, in);
    int bad = 0;
    for (int q = 0; q < w; ++q)
      for (int64_t j = 0; j < n; j += 7) bad += get(out, q * n + j) != value(kFloat32, q, j);
    WCHECK(bad == 0, bad << " wrong elements in the large all_gather");
    const int64_t k = 400003;
    Tensor src = make(kFloat32, k * w, r);
    Tensor dst = empty({k}, TensorOptions(kFloat32));
    pg.reduce_scatter(dst, src, ReduceOp::Sum);
    for (int64_t j = 0; j < k; j += 7)
      bad += get(dst, j) != reduce_expected(kFloat32, ReduceOp::Sum, w, int64_t(r) * k + j);
    WCHECK(bad == 0, bad << " wrong elements in the large reduce_scatter");
  }
  // Zero elements are legal everywhere.
  {
    Tensor z = empty({0}, TensorOptions(kFloat32));
    pg.all_reduce(z);
    pg.broadcast(z, 0);
    Tensor zo = empty({0}, TensorOptions(kFloat32));
    pg.all_gather(zo, z);
    pg.reduce_scatter(zo, z);
  }
  // Barrier: rank 0 arrives late; everyone leaves after it.
  {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto t0 = Clock::now();
    pg.barrier();
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    if (r != 0) WCHECK(waited.count() >= 200, "barrier returned after " << waited.count() << " ms");
  }
  // Bad arguments are errors on the caller, before anything is queued.
  {
    Tensor t = make(kInt32, 4, r);
    bool threw = false;
    try {
      pg.all_reduce(t, ReduceOp::Avg);
    } catch (const DTypeError&) {
      threw = true;
    }
    WCHECK(threw, "avg of int32 accepted");
    threw = false;
    try {
      Tensor out = empty({3}, TensorOptions(kInt32));
      pg.all_gather(out, t);
    } catch (const ShapeError&) {
      threw = true;
    }
    WCHECK(threw, "all_gather with a wrong output size accepted");
    threw = false;
    try {
      pg.broadcast(t, w);
    } catch (const DistError&) {
      threw = true;
    }
    WCHECK(threw, "broadcast from a rank outside the group accepted");
    Tensor m = make(kFloat32, 6, r).view({2, 3}).transpose(0, 1);
    threw = false;
    try {
      pg.all_reduce(m);
    } catch (const ValueError& e) {
      threw = std::string(e.what()).find("contiguous") != std::string::npos;
    }
    WCHECK(threw, "non-contiguous tensor accepted");
  }
  // The group still works after those caller-side errors (nothing was issued).
  Tensor t = make(kFloat64, 3, r);
  pg.all_reduce(t);
  WCHECK(get(t, 2) == reduce_expected(kFloat64, ReduceOp::Sum, w, 2), "after errors");
  // fingerprint_every: 0 checks nothing, k checks every k-th collective (barriers not counted).
  if (auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg); gloo && w > 1) {
    const int every = env_int("DIST_FINGERPRINT_EVERY", 1);
    const int64_t checks = gloo->fingerprint_checks();
    const int64_t issued = int64_t(pg.next_seq());
    if (every == 0) WCHECK(checks == 0, checks << " fingerprint checks with fingerprint_every 0");
    if (every > 0)
      WCHECK(checks >= issued / every - 2 && checks <= issued / every + 1,
             checks << " fingerprint checks for " << issued << " collectives, every " << every);
  }
}

void scenario_async(ProcessGroup& pg) {
  // Many handles in flight, waited in reverse: completion order is issue order, values right.
  const int w = pg.size(), r = pg.rank();
  std::vector<Tensor> ts;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 40; ++k) {
    Tensor t = make(kFloat32, 257 + k, r);
    works.push_back(pg.all_reduce_async(t, ReduceOp::Max));
    ts.push_back(t);
    if (k % 10 == 0) {
      Tensor b = make(kInt64, 9, r);
      works.push_back(pg.broadcast_async(b, k % w));
      ts.push_back(b);
    }
  }
  uint64_t first = works.front()->seq();
  for (size_t i = 0; i < works.size(); ++i) WCHECK(works[i]->seq() == first + i, "seq order");
  for (size_t i = works.size(); i-- > 0;) works[i]->wait();
  for (auto& wk : works) WCHECK(wk->is_completed(), "completed");
  size_t ti = 0;
  for (int k = 0; k < 40; ++k) {
    Tensor& t = ts[ti++];
    for (int64_t i = 0; i < t.numel(); ++i)
      if (get(t, i) != reduce_expected(kFloat32, ReduceOp::Max, w, i)) {
        WCHECK(false, "async all_reduce " << k << " i=" << i);
        break;
      }
    if (k % 10 == 0) {
      Tensor& b = ts[ti++];
      WCHECK(get(b, 3) == value(kInt64, k % w, 3), "async broadcast " << k);
    }
  }
}

void scenario_p2p(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  const int next = (r + 1) % w, prev = (r + w - 1) % w;
  // Everyone sends first, then receives: works because sends are posted, not queued.
  for (int round = 0; round < 3; ++round) {
    Tensor s = make(kFloat64, 11 + round, r);
    Tensor d = empty({11 + round}, TensorOptions(kFloat64));
    auto ws = pg.send_async(s, next, round);
    auto wr = pg.recv_async(d, prev, round);
    wr->wait();
    ws->wait();
    for (int64_t i = 0; i < d.numel(); ++i)
      if (get(d, i) != value(kFloat64, prev, i)) {
        WCHECK(false, "p2p round " << round << " i=" << i);
        break;
      }
  }
  // Collectives and p2p interleave.
  Tensor t = make(kInt32, 5, r);
  pg.all_reduce(t);
  WCHECK(get(t, 1) == reduce_expected(kInt32, ReduceOp::Sum, w, 1), "all_reduce after p2p");
  // Mismatch: the sender sends 6 floats, the receiver expects 7; both raise, naming both sides.
  if (w == 2) {
    bool raised = false;
    std::string msg;
    try {
      if (r == 0) {
        pg.send(make(kFloat32, 6, r), 1, 9);
      } else {
        Tensor d = empty({7}, TensorOptions(kFloat32));
        pg.recv(d, 0, 9);
      }
    } catch (const DistError& e) {
      raised = true;
      msg = e.what();
    }
    WCHECK(raised, "p2p mismatch not detected");
    WCHECK(
        msg.find("6 elements") != std::string::npos && msg.find("7 elements") != std::string::npos,
        "message does not name both sides: " << msg);
    std::cout << "rank " << r << " p2p mismatch: " << msg << std::endl;
    // The group is still usable.
    Tensor u = make(kFloat32, 4, r);
    pg.all_reduce(u);
    WCHECK(get(u, 0) == reduce_expected(kFloat32, ReduceOp::Sum, w, 0), "after p2p mismatch");
  }
}

// The victim dies in the chosen way before collective #3; survivors must raise within timeout.
void scenario_failure(ProcessGroup& pg, const std::string& how) {
  const int victim = env_int("DIST_VICTIM", 1);
  const int r = pg.rank();
  for (int k = 0; k < 3; ++k) {
    Tensor t = make(kFloat32, 1000, r);
    pg.all_reduce(t);
  }
  if (r == victim) {
    std::cout << "rank " << r << " dying by " << how << std::endl;
    if (how == "exit") std::_Exit(3);
    if (how == "throw") throw std::runtime_error("victim threw");  // uncaught: terminate
    if (how == "stop") {
      raise(SIGSTOP);
      std::_Exit(4);  // only reached if someone continues us
    }
  }
  auto t0 = Clock::now();
  std::string msg;
  try {
    for (int k = 0; k < 3; ++k) {
      Tensor t = make(kFloat32, 100000, r);
      pg.all_reduce(t);
    }
  } catch (const DistError& e) {
    msg = e.what();
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::cout << "rank " << r << " raised after " << ms << " ms: " << msg << std::endl;
  WCHECK(!msg.empty(), "no DistError on a surviving rank");
  WCHECK(msg.find("all_reduce") != std::string::npos, "message lacks the op: " << msg);
  WCHECK(msg.find("seq 3") != std::string::npos, "message lacks the sequence number: " << msg);
  WCHECK(ms < pg.timeout().count() + 3000,
         "took " << ms << " ms, timeout " << pg.timeout().count());
  // Afterwards the group refuses work at once, with the first error.
  auto t1 = Clock::now();
  bool raised = false;
  try {
    Tensor t = make(kFloat32, 3, r);
    pg.all_reduce(t);
  } catch (const DistError& e) {
    raised = std::string(e.what()).find("failed earlier") != std::string::npos;
  }
  WCHECK(raised, "a broken group accepted work");
  WCHECK(Clock::now() - t1 < std::chrono::seconds(1), "a broken group was slow to refuse");
}

// Every kind of mismatch (op, dtype, count, root, reduce op, order) raises on every rank within
// a fraction of the timeout, naming what each side called, and moves no data: every tensor
// still holds this rank's own values afterwards, and the group stays usable. Run on the
// shared-memory path (default) and on TCP (ACCEL_DIST_SHM=0) by test_process_group.
void scenario_mismatch(ProcessGroup& pg) {
  const int r = pg.rank(), w = pg.size();
  const bool last = r == w - 1;
  const auto limit = std::chrono::milliseconds(env_int("DIST_TIMEOUT_MS", 30000) / 2);
  auto expect = [&](const char* what, std::function<void()> fn, std::vector<std::string> needles) {
    std::string msg;
    auto t0 = Clock::now();
    try {
      fn();
    } catch (const DistError& e) {
      msg = e.what();
    }
    auto took = Clock::now() - t0;
    WCHECK(!msg.empty(), what << ": mismatch not detected");
    WCHECK(took < limit, what << ": detected only after "
                              << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                              << " ms");
    for (auto& n : needles)
      WCHECK(msg.find(n) != std::string::npos, what << ": '" << n << "' missing in: " << msg);
    std::cout << "rank " << r << " " << what << ": " << msg << std::endl;
  };
  // Whether t still holds make(dt, n, r): nothing was reduced, gathered or broadcast into it.
  auto untouched = [&](const char* what, const Tensor& t) {
    Tensor ref = make(t.dtype(), t.numel(), r);
    WCHECK(std::memcmp(t.data_ptr(), ref.data_ptr(), t.nbytes()) == 0,
           what << ": the tensor changed although the collective was refused");
  };
  const uint64_t s0 = pg.next_seq();
  const std::string seq0 = "collective mismatch at seq " + std::to_string(s0);
  // Element counts differ on the last rank.
  {
    Tensor t = make(kFloat32, last ? 12 : 10, r);
    expect("numel", [&] { pg.all_reduce(t); }, {seq0, "10 elements", "12 elements"});
    untouched("numel", t);
  }
  // Counts of several shared-memory chunks (4 MiB slots) on one side, few elements on the other.
  {
    Tensor t = make(kFloat32, last ? (int64_t(3) << 20) + 5 : 7, r);
    expect("large numel", [&] { pg.all_reduce(t); }, {"3145733 elements", "7 elements"});
    untouched("large numel", t);
  }
  // An empty all-reduce against a non-empty one.
  {
    Tensor t = make(kFloat32, last ? 0 : 5, r);
    expect("empty", [&] { pg.all_reduce(t); }, {"0 elements", "5 elements"});
    untouched("empty", t);
  }
  // Different ops.
  {
    Tensor t = make(kFloat32, 10, r);
    expect("op",
           [&] {
             if (r == 0)
               pg.broadcast(t, 0);
             else
               pg.all_reduce(t);
           },
           {"broadcast(root 0", "all_reduce(sum"});
    untouched("op", t);
  }
  {
    Tensor in = make(kFloat32, 4, r);
    Tensor out = make(kFloat32, 4 * w, r);
    expect("op gather",
           [&] {
             if (last)
               pg.all_gather(out, in);
             else
               pg.all_reduce(in);
           },
           {"all_gather(float32, 4 elements per rank", "all_reduce(sum, float32, 4 elements"});
    untouched("op gather in", in);
    untouched("op gather out", out);
  }
  {
    Tensor t = make(kFloat32, 10, r);
    expect("op barrier",
           [&] {
             if (r == 0)
               pg.barrier();
             else
               pg.all_reduce(t);
           },
           {"barrier()", "all_reduce(sum"});
    untouched("op barrier", t);
  }
  // Different dtypes.
  {
    Tensor t = make(r == 0 ? kFloat64 : kFloat32, 10, r);
    expect("dtype", [&] { pg.all_reduce(t); }, {"float64", "float32"});
    untouched("dtype", t);
  }
  // Different roots.
  {
    Tensor t = make(kFloat32, 10, r);
    expect("root", [&] { pg.broadcast(t, last ? 1 : 0); }, {"root 0", "root 1"});
    untouched("root", t);
  }
  // Different reduce ops.
  {
    Tensor t = make(kFloat32, 10, r);
    expect("reduce op", [&] { pg.all_reduce(t, r == 0 ? ReduceOp::Max : ReduceOp::Sum); },
           {"max", "sum"});
    untouched("reduce op", t);
  }
  // The same two calls in a different order: both raise, each at its own seq.
  {
    Tensor a = make(kFloat32, 6, r), b = make(kFloat32, 6, r);
    auto first = [&] { r == 0 ? pg.all_reduce(a) : pg.broadcast(b, 0); };
    auto second = [&] { r == 0 ? pg.broadcast(b, 0) : pg.all_reduce(a); };
    expect("order 1", first, {"broadcast(root 0", "all_reduce(sum"});
    expect("order 2", second, {"broadcast(root 0", "all_reduce(sum"});
    untouched("order a", a);
    untouched("order b", b);
  }
  // After detected mismatches the group is still in step and usable.
  Tensor t = make(kFloat32, 10, r);
  pg.all_reduce(t);
  WCHECK(get(t, 4) == reduce_expected(kFloat32, ReduceOp::Sum, w, 4), "after mismatch");
  Tensor big = make(kFloat32, (int64_t(3) << 20) + 5, r);
  pg.all_reduce(big);
  WCHECK(get(big, (int64_t(3) << 20) + 1) ==
             reduce_expected(kFloat32, ReduceOp::Sum, w, (int64_t(3) << 20) + 1),
         "large after mismatch");
  Tensor bc = make(kFloat32, 10, r);
  pg.broadcast(bc, w - 1);
  WCHECK(get(bc, 3) == value(kFloat32, w - 1, 3), "broadcast after mismatch");
}

// Timing of small all_reduces with the fingerprint check on and off (prints, does not assert).
void scenario_fingerprint_cost(ProcessGroup& pg) {
  const int iters = env_int("DIST_ITERS", 300);
  Tensor t = make(kFloat32, 64, pg.rank());
  for (int i = 0; i < 20; ++i) pg.all_reduce(t);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) pg.all_reduce(t);
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  double fp_us = gloo && gloo->fingerprint_checks()
                     ? gloo->fingerprint_seconds() * 1e6 / double(gloo->fingerprint_checks())
                     : 0;
  std::cout << "rank " << pg.rank() << " small all_reduce " << us << " us/op, fingerprint " << fp_us
            << " us/check" << std::endl;
}

// Heartbeat: the victim stops itself (SIGSTOP) after three collectives; the others are already
// waiting in the next all_reduce, whose timeout (DIST_TIMEOUT_MS) is far longer than the
// heartbeat's (ACCEL_HEARTBEAT_TIMEOUT): they must raise within the heartbeat timeout, naming the
// stopped rank.
void scenario_hb_stop(ProcessGroup& pg) {
  const int victim = env_int("DIST_VICTIM", 1);
  const int r = pg.rank();
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  WCHECK(gloo && gloo->heartbeat(), "no heartbeat running");
  if (!gloo || !gloo->heartbeat()) return;
  const auto hb_ms = gloo->heartbeat()->timeout().count();
  for (int k = 0; k < 3; ++k) {
    Tensor t = make(kFloat32, 1000, r);
    pg.all_reduce(t);
  }
  if (r == victim) {
    std::cout << "rank " << r << " stopping itself" << std::endl;
    raise(SIGSTOP);
    std::_Exit(4);  // only reached if someone continues us
  }
  auto t0 = Clock::now();
  std::string msg;
  try {
    Tensor t = make(kFloat32, 1000, r);
    pg.all_reduce(t);
  } catch (const DistError& e) {
    msg = e.what();
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::cout << "rank " << r << " detected after " << ms << " ms (heartbeat timeout " << hb_ms
            << " ms): " << msg << std::endl;
  WCHECK(!msg.empty(), "no DistError on a surviving rank");
  WCHECK(msg.find("rank " + std::to_string(victim) + " at ") != std::string::npos &&
             msg.find("sent no heartbeat") != std::string::npos,
         "message does not name the stopped rank: " << msg);
  WCHECK(ms < hb_ms + 8000, "took " << ms << " ms, heartbeat timeout " << hb_ms << " ms");
  WCHECK(ms < pg.timeout().count() / 2, "not faster than the collective timeout");
}

// Staggered normal exit: rank k leaves k * DIST_STAGGER_MS after the last collective; nobody
// may take an earlier rank's departure for a failure while it is still finishing.
void scenario_hb_staggered(ProcessGroup& pg) {
  const int r = pg.rank();
  for (int k = 0; k < 3; ++k) {
    Tensor t = make(kFloat32, 1000, r);
    pg.all_reduce(t);
  }
  pg.barrier();
  // Busy computing (not in a collective) until it is this rank's turn to leave: its heartbeat
  // thread must keep the others from taking it for stopped.
  const auto leave_at =
      Clock::now() + std::chrono::milliseconds(env_int("DIST_STAGGER_MS", 2000) * r);
  volatile double sink = 0;
  while (Clock::now() < leave_at)
    for (int i = 0; i < 100000; ++i) sink = sink + 1e-9 * i;
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  std::string failure = gloo ? gloo->failure_message() : "";
  WCHECK(failure.empty(), "the group failed after a peer exited normally: " << failure);
  // Rank 0 leaves right after the barrier, possibly before the first beat (1 s interval) arrives;
  // every later rank has computed for at least one stagger (longer than the interval).
  WCHECK(r == 0 || !gloo || !gloo->heartbeat() || gloo->heartbeat()->beats_received() > 0,
         "no heartbeat was received");
}

// Configuration read by init_process_group: prints "shm <0|1> heartbeat <ms|off>", and checks
// them against DIST_EXPECT_SHM / DIST_EXPECT_HB_MS (-1 = off) when set.
void scenario_config(ProcessGroup& pg) {
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  if (!gloo) return;
  const bool shm = gloo->uses_shm();
  const long hb = gloo->heartbeat() ? long(gloo->heartbeat()->timeout().count()) : -1;
  std::cout << "rank " << pg.rank() << " shm " << shm << " heartbeat " << hb << std::endl;
  if (std::getenv("DIST_EXPECT_SHM"))
    WCHECK(int(shm) == env_int("DIST_EXPECT_SHM", 1), "shared memory " << shm);
  if (std::getenv("DIST_EXPECT_HB_MS"))
    WCHECK(hb == env_int("DIST_EXPECT_HB_MS", 0), "heartbeat timeout " << hb);
  // The group works either way.
  Tensor t = make(kFloat32, 100, pg.rank());
  pg.all_reduce(t);
  WCHECK(get(t, 7) == reduce_expected(kFloat32, ReduceOp::Sum, pg.size(), 7), "all_reduce");
}

// OpenMP team size after init_process_group: checks it against DIST_EXPECT_OMP (Note
// [oversubscribed OpenMP]).
void scenario_omp_fit(ProcessGroup& pg) {
  const int threads = omp_get_max_threads();
  std::cout << "rank " << pg.rank() << " omp threads " << threads << std::endl;
  WCHECK(threads == env_int("DIST_EXPECT_OMP", -1), "OpenMP threads " << threads);
}

// A forged point-to-point header (absurd element count, unknown dtype): the receiver must
// reject it without sizing anything from it, naming both sides. Rank 0 forges through the raw
// Gloo context (the slot layout of comm/gloo/process_group_gloo.cc); rank 1 receives.
void scenario_p2p_forged(ProcessGroup& pg) {
  const int r = pg.rank();
  const std::string kind = std::getenv("DIST_FORGE") ? std::getenv("DIST_FORGE") : "huge";
  struct Header {
    uint32_t magic = 0x50325041;
    uint8_t dtype = 0;
    uint8_t ok = 1;
    uint16_t pad = 0;
    int64_t numel = 0;
    uint64_t count = 0;
    uint64_t pad2 = 0;
  };
  const int tag = 3;
  if (r == 0) {
    auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
    Header h;
    if (kind == "huge") h.numel = int64_t(1) << 40;  // 4 TiB of float32
    if (kind == "negative") h.numel = -5;
    if (kind == "dtype") {
      h.dtype = 200;
      h.numel = 10;
    }
    Header verdict;
    auto hdr = gloo->context()->createUnboundBuffer(&h, sizeof(h));
    auto ack = gloo->context()->createUnboundBuffer(&verdict, sizeof(verdict));
    hdr->send(1, (uint64_t(0xA2) << 56) | (uint64_t(tag) << 8));
    ack->recv(1, (uint64_t(0xA4) << 56) | (uint64_t(tag) << 8));
    try {
      hdr->waitSend(std::chrono::milliseconds(10000));
      ack->waitRecv(std::chrono::milliseconds(10000));
      std::cout << "rank 0 verdict " << int(verdict.ok) << std::endl;
    } catch (const std::exception& e) {
      // The receiver fails the group after refusing: a closed connection is fine here.
      std::cout << "rank 0 forger: " << e.what() << std::endl;
    }
    return;
  }
  if (r != 1) return;
  auto t0 = Clock::now();
  std::string msg;
  try {
    Tensor d = empty({10}, TensorOptions(kFloat32));
    pg.recv(d, 0, tag);
  } catch (const DistError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("NOT A DistError: ") + e.what();
  }
  std::cout << "rank 1 forged " << kind << ": " << msg << std::endl;
  WCHECK(msg.find("[recv] rank 1 of") == 0, "not a DistError from recv: " << msg);
  if (kind == "huge") {
    WCHECK(msg.find("1099511627776 elements") != std::string::npos &&
               msg.find("10 elements") != std::string::npos &&
               msg.find("bytes a mismatched message may take") != std::string::npos,
           "message does not name both sides and the limit: " << msg);
  } else {
    WCHECK(msg.find("corrupt header from rank 0") != std::string::npos,
           "not reported as a corrupt header: " << msg);
  }
  WCHECK(Clock::now() - t0 < std::chrono::seconds(20), "took too long");
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(&pg);
  WCHECK(gloo && !gloo->failure_message().empty(), "the group was not marked failed");
}

}  // namespace

// init / all_reduce / destroy, DIST_CYCLES times in one process with the same MASTER_PORT
// (issue 22 item 9): a fast rank must not join the previous cycle's store, nor read a stale
// address from it. Each cycle's all-reduce carries the cycle number, so a rank that met a peer of
// another cycle would see a wrong sum.
int scenario_reinit() {
  const int cycles = env_int("DIST_CYCLES", 20);
  int done = 0;
  for (int c = 0; c < cycles; ++c) {
    try {
      InitOptions io;
      io.timeout = std::chrono::milliseconds(env_int("DIST_TIMEOUT_MS", 30000));
      auto pg = init_process_group(io);
      g_rank = pg->rank();
      Tensor t = full({4}, double(c * 100 + pg->rank()), TensorOptions(kFloat64));
      pg->all_reduce(t);
      double want = 0;
      for (int q = 0; q < pg->size(); ++q) want += c * 100 + q;
      WCHECK(get(t, 0) == want, "cycle " << c << ": sum " << get(t, 0) << ", want " << want);
      pg.reset();
      destroy_process_group();
      ++done;
    } catch (const std::exception& e) {
      std::cout << "rank " << g_rank << " cycle " << c << " failed: " << e.what() << std::endl;
      ++g_failures;
      break;
    }
  }
  std::cout << "rank " << g_rank << " completed " << done << " of " << cycles << " cycles"
            << std::endl;
  if (g_failures == 0) std::cout << "rank " << g_rank << " ok reinit" << std::endl;
  return g_failures == 0 ? 0 : 1;
}

// A rank lost while the group forms (issue 22 item 8). Knobs: DIST_VICTIM (rank), DIST_INIT_FAULT
// ("kill" or "stop"), DIST_FAULT_AFTER_MS (from process start), DIST_ABSENT (a rank that never
// starts its initialisation: it stops itself at once), DIST_FAKE_GLOO=1 (the victim is not a
// real rank: it joins the store and the heartbeat, then publishes a Gloo address that makes
// rank 0 the listening side of their pair, and never connects: rank 0 waits inside Gloo's pair
// connect when the fault comes). The other ranks must fail their init_process_group naming the
// victim (or the absent rank); each prints "rank R init failed after T ms (fault at F ms): msg".
int scenario_init_fault() {
  const auto t_start = Clock::now();
  const DistEnv env = read_dist_env();
  g_rank = env.rank;
  const int victim = env_int("DIST_VICTIM", 1);
  const int absent = env_int("DIST_ABSENT", -1);
  const int after_ms = env_int("DIST_FAULT_AFTER_MS", 1500);
  const std::string fault =
      std::getenv("DIST_INIT_FAULT") ? std::getenv("DIST_INIT_FAULT") : "kill";
  const auto timeout = std::chrono::milliseconds(env_int("DIST_TIMEOUT_MS", 30000));
  if (env.rank == absent) {
    std::cout << "rank " << env.rank << " never arrives" << std::endl;
    raise(SIGSTOP);
    return 4;
  }
  if (env.rank == victim) {
    std::thread([=] {
      std::this_thread::sleep_until(t_start + std::chrono::milliseconds(after_ms));
      std::cout << "rank " << victim << " faulting (" << fault << ") at " << after_ms << " ms"
                << std::endl;
      raise(fault == "stop" ? SIGSTOP : SIGKILL);
    }).detach();
    if (env_int("DIST_FAKE_GLOO", 0) == 1) {
      StoreOptions so;
      so.timeout = timeout;
      so.token = env.token;
      so.member = env.rank;
      auto base = std::make_shared<TcpStore>(env.master_addr, env.master_port, false, so);
      auto st = std::make_shared<PrefixStore>("default", base);
      Milliseconds hb_timeout = kDefaultHeartbeatTimeout;
      if (const char* h = std::getenv("ACCEL_HEARTBEAT_TIMEOUT"))
        hb_timeout = Milliseconds(int64_t(std::atof(h) * 1000));
      Heartbeat hb(st, env.rank, env.world_size, "127.0.0.1", kDefaultHeartbeatInterval, hb_timeout,
                   timeout, nullptr);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(0x7f000001);
      addr.sin_port = 0xffff;  // the highest port in Gloo's order: rank 0 listens and waits
      auto bytes =
          gloo::transport::tcp::Address(reinterpret_cast<sockaddr*>(&addr), sizeof(addr)).bytes();
      std::string all;
      for (int q = 0; q + 1 < env.world_size; ++q) all.append(bytes.begin(), bytes.end());
      st->set("gloo/" + std::to_string(env.rank), all);
      std::this_thread::sleep_for(std::chrono::minutes(10));
      return 4;
    }
    try {
      InitOptions io;
      io.timeout = timeout;
      auto pg = init_process_group(io);
    } catch (const std::exception& e) {
      std::cout << "rank " << env.rank << " (victim) init failed: " << e.what() << std::endl;
    }
    std::this_thread::sleep_for(std::chrono::minutes(10));
    return 4;
  }
  std::string msg;
  try {
    InitOptions io;
    io.timeout = timeout;
    auto pg = init_process_group(io);
  } catch (const DistError& e) {
    msg = e.what();
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_start).count();
  const int named = victim >= 0 ? victim : absent;
  std::cout << "rank " << env.rank << " init failed after " << ms << " ms (fault at "
            << (victim >= 0 ? after_ms : 0) << " ms): " << msg << std::endl;
  WCHECK(!msg.empty(), "init_process_group did not fail");
  WCHECK(msg.find("[init] rank " + std::to_string(env.rank) + " of ") == 0, "not an init error");
  // With a rank absent, a survivor whose peer gave up at the same deadline first may report that
  // peer's departure instead (the test checks that one of them names the absent rank).
  const bool peer_gave_up =
      victim < 0 && msg.find("its heartbeat port is closed") != std::string::npos;
  WCHECK(peer_gave_up || msg.find("rank " + std::to_string(named) + " ") != std::string::npos,
         "the lost rank is not named: " << msg);
  if (g_failures == 0) std::cout << "rank " << env.rank << " ok init_fault" << std::endl;
  return g_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: dist_worker <scenario>\n";
    return 2;
  }
  std::string scenario = argv[1];
  try {
    if (scenario == "reinit") return scenario_reinit();
    if (scenario == "init_fault") return scenario_init_fault();
    InitOptions io;
    io.timeout = std::chrono::milliseconds(env_int("DIST_TIMEOUT_MS", 30000));
    io.fingerprint_every = env_int("DIST_FINGERPRINT_EVERY", 1);
    auto pg = init_process_group(io);
    g_rank = pg->rank();
    if (scenario == "collectives") {
      scenario_collectives(*pg);
    } else if (scenario == "async") {
      scenario_async(*pg);
    } else if (scenario == "p2p") {
      scenario_p2p(*pg);
    } else if (scenario == "exit" || scenario == "throw" || scenario == "stop") {
      scenario_failure(*pg, scenario);
    } else if (scenario == "mismatch") {
      scenario_mismatch(*pg);
    } else if (scenario == "hb_stop") {
      scenario_hb_stop(*pg);
    } else if (scenario == "hb_staggered") {
      scenario_hb_staggered(*pg);
    } else if (scenario == "omp_fit") {
      scenario_omp_fit(*pg);
    } else if (scenario == "config") {
      scenario_config(*pg);
    } else if (scenario == "p2p_forged") {
      scenario_p2p_forged(*pg);
    } else if (scenario == "fingerprint_cost") {
      scenario_fingerprint_cost(*pg);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    // Collectives are done on this rank; do not tear down while a peer still talks to us.
    const bool no_final_barrier = scenario == "exit" || scenario == "throw" || scenario == "stop" ||
                                  scenario == "hb_stop" || scenario == "p2p_forged" ||
                                  scenario == "hb_staggered";
    if (!no_final_barrier) pg->barrier();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
