// accel-selftest: checks every collective of the process group under the env contract
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; none set = one process). `accel-run test` runs it
// on every rank. Rank 0 prints one line per check (the check passes only if it passed on every
// rank) and a bandwidth line; every rank exits 0 when all checks passed, 1 otherwise, 2 when the
// group could not be formed.
//
//   accel-selftest [--backend gloo|nccl] [--timeout-ms N] [--mib N] [--quiet]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "comm/env.h"
#include "comm/process_group.h"

using namespace accel;
using namespace accel::dist;

namespace {

struct Args {
  std::string backend = "gloo";
  int timeout_ms = 60000;
  int mib = 16;
  bool quiet = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "accel-selftest: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--backend") {
      a.backend = value();
    } else if (s == "--timeout-ms") {
      a.timeout_ms = std::atoi(value().c_str());
    } else if (s == "--mib") {
      a.mib = std::atoi(value().c_str());
    } else if (s == "--quiet") {
      a.quiet = true;
    } else if (s == "--help" || s == "-h") {
      std::printf(
          "usage: accel-selftest [--backend gloo|nccl] [--timeout-ms N] [--mib N] [--quiet]\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "accel-selftest: unknown argument %s\n", s.c_str());
      std::exit(2);
    }
  }
  return a;
}

// Small integers: exact in every dtype, including bf16 sums over a few ranks.
double value(DType dt, int r, int64_t i) {
  if (dt == kBool) return ((i + r) % 3) == 0;
  int64_t v = (i * 5 + r * 3) % 9;
  return dt == kUInt8 ? double(v) : double(v - 4);
}

Tensor make(DType dt, int64_t n, int r, Device dev) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(dt, r, i);
  Tensor t = tensor(v, {n}).to(dt);
  return dev.is_cpu() ? t : t.to(dev);
}

std::vector<double> host(const Tensor& t) { return t.cpu().tolist(); }

double tol(DType dt) {
  return dt == kFloat16 ? 1e-2 : dt == kBFloat16 ? 2e-2 : dt == kFloat32 ? 1e-6 : 0;
}

class Checker {
 public:
  // `dev`: where the group's collectives take tensors (NCCL: this rank's GPU).
  Checker(ProcessGroup& pg, Device dev, bool quiet) : pg_(pg), dev_(dev), quiet_(quiet) {}

  // Runs `fn` (returns an error text, empty when fine) on every rank; rank 0 reports.
  void check(const std::string& name, const std::function<std::string()>& fn) {
    std::string err;
    try {
      err = fn();
    } catch (const std::exception& e) {
      err = std::string("exception: ") + e.what();
    }
    // Agree on the outcome: a failed collective would make later ones fail too, so stop there.
    Tensor ok = tensor(std::vector<int64_t>{err.empty() ? 1 : 0}, {1}).to(dev_);
    Tensor all = zeros({pg_.size()}, TensorOptions(kInt64, dev_));
    bool agreed = true;
    try {
      pg_.all_gather(all, ok);
    } catch (const std::exception& e) {
      agreed = false;
      err += std::string(err.empty() ? "" : "; ") + "result exchange failed: " + e.what();
    }
    std::vector<int> bad;
    if (agreed) {
      auto v = all.cpu().tolist();
      for (int r = 0; r < pg_.size(); ++r)
        if (v[size_t(r)] == 0) bad.push_back(r);
    } else {
      bad.push_back(pg_.rank());
    }
    if (!err.empty())
      std::fprintf(stderr, "[rank %d] %s: %s\n", pg_.rank(), name.c_str(), err.c_str());
    if (pg_.rank() == 0 && (!quiet_ || !bad.empty())) {
      if (bad.empty()) {
        std::printf("ok    %s\n", name.c_str());
      } else {
        std::ostringstream os;
        for (size_t i = 0; i < bad.size(); ++i) os << (i ? "," : "") << bad[i];
        std::printf("FAIL  %s (ranks %s)\n", name.c_str(), os.str().c_str());
      }
      std::fflush(stdout);
    }
    if (!bad.empty()) ++failed_;
    ++total_;
    if (!agreed) throw std::runtime_error("the process group broke during '" + name + "'");
  }
  int failed() const { return failed_; }
  int total() const { return total_; }

 private:
  ProcessGroup& pg_;
  Device dev_;
  bool quiet_;
  int failed_ = 0, total_ = 0;
};

std::string compare(const std::vector<double>& got, const std::function<double(int64_t)>& want,
                    double tolerance) {
  for (size_t i = 0; i < got.size(); ++i) {
    double w = want(int64_t(i));
    if (std::abs(got[i] - w) > tolerance * (1 + std::abs(w))) {
      std::ostringstream os;
      os << "element " << i << " is " << got[i] << ", expected " << w;
      return os.str();
    }
  }
  return "";
}

// all_reduce (every op), reduce_scatter, broadcast from every root and all_gather, per dtype.
void check_collectives(Checker& c, const ProcessGroupPtr& pg, Device dev, int64_t n) {
  const int w = pg->size(), r = pg->rank();
  const std::vector<DType> dtypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                     kInt32,   kInt64,   kUInt8,   kBool};
  for (DType dt : dtypes) {
    std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
    if (is_floating(dt)) ops.push_back(ReduceOp::Avg);
    for (ReduceOp op : ops) {
      auto expected = [&, dt, op](int64_t i) {
        double acc = value(dt, 0, i);
        for (int q = 1; q < w; ++q) {
          double v = value(dt, q, i);
          acc = op == ReduceOp::Max   ? std::max(acc, v)
                : op == ReduceOp::Min ? std::min(acc, v)
                : dt == kBool         ? double(acc != 0 || v != 0)
                                      : acc + v;
        }
        return op == ReduceOp::Avg ? acc / w : acc;
      };
      std::ostringstream name;
      name << "all_reduce " << reduce_op_name(op) << " " << dt << " x" << n;
      c.check(name.str(), [&] {
        Tensor t = make(dt, n, r, dev);
        pg->all_reduce(t, op);
        return compare(host(t), expected, tol(dt));
      });
      std::ostringstream rs;
      rs << "reduce_scatter " << reduce_op_name(op) << " " << dt << " x" << n << "/rank";
      c.check(rs.str(), [&] {
        Tensor in = make(dt, n * w, r, dev);
        Tensor out = make(dt, n, r, dev);
        pg->reduce_scatter(out, in, op);
        return compare(
            host(out), [&](int64_t j) { return expected(int64_t(r) * n + j); }, tol(dt));
      });
    }
    std::ostringstream bn;
    bn << "broadcast " << dt << " x" << n << " from every root";
    c.check(bn.str(), [&]() -> std::string {
      for (int root = 0; root < w; ++root) {
        Tensor t = make(dt, n, r, dev);
        pg->broadcast(t, root);
        std::string e = compare(
            host(t), [&](int64_t i) { return value(dt, root, i); }, 0);
        if (!e.empty()) return "root " + std::to_string(root) + ": " + e;
      }
      return "";
    });
    std::ostringstream an;
    an << "all_gather " << dt << " x" << n;
    c.check(an.str(), [&] {
      Tensor in = make(dt, n, r, dev);
      Tensor out = make(dt, n * w, r, dev);
      pg->all_gather(out, in);
      return compare(
          host(out), [&](int64_t i) { return value(dt, int(i / n), i % n); }, 0);
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  ProcessGroupPtr pg;
  try {
    InitOptions io;
    io.backend = args.backend;
    io.timeout = std::chrono::milliseconds(args.timeout_ms);
    pg = init_process_group(io);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel-selftest: cannot form the process group: %s\n", e.what());
    return 2;
  }
  const int w = pg->size(), r = pg->rank();
  DistEnv env = read_dist_env();
  Device dev = args.backend == "nccl" ? Device::cuda(env.local_rank) : kCPU;
  if (r == 0)
    std::printf("accel-selftest: backend %s, world size %d, master %s:%d\n",
                std::string(pg->backend()).c_str(), w, env.master_addr.c_str(), env.master_port);
  Checker c(*pg, dev, args.quiet);
  int rc = 0;
  try {
    const int64_t n = 1001;  // odd: uneven ring chunks
    check_collectives(c, pg, dev, n);
    c.check("barrier", [&] {
      pg->barrier();
      return std::string();
    });
    if (w > 1) {
      c.check("send/recv ring", [&] {
        Tensor s = make(kFloat32, n, r, dev);
        Tensor d = make(kFloat32, n, r, dev);
        auto ws = pg->send_async(s, (r + 1) % w, 0);
        auto wr = pg->recv_async(d, (r + w - 1) % w, 0);
        wr->wait();
        ws->wait();
        int src = (r + w - 1) % w;
        return compare(
            host(d), [&](int64_t i) { return value(kFloat32, src, i); }, 0);
      });
    }
    c.check("async all_reduce x8, waited in reverse", [&]() -> std::string {
      std::vector<Tensor> ts;
      std::vector<WorkPtr> ws;
      for (int k = 0; k < 8; ++k) {
        ts.push_back(make(kFloat32, 100 + k, r, dev));
        ws.push_back(pg->all_reduce_async(ts.back(), ReduceOp::Sum));
      }
      for (int k = 7; k >= 0; --k) ws[size_t(k)]->wait();
      for (int k = 0; k < 8; ++k) {
        auto e = compare(
            host(ts[size_t(k)]),
            [&](int64_t i) {
              double s = 0;
              for (int q = 0; q < w; ++q) s += value(kFloat32, q, i);
              return s;
            },
            0);
        if (!e.empty()) return "handle " + std::to_string(k) + ": " + e;
      }
      return "";
    });
    // Bandwidth (informational): one all_reduce of --mib MiB of f32.
    if (args.mib > 0 && w > 1) {
      Tensor big = zeros({int64_t(args.mib) << 18}, TensorOptions(kFloat32, dev));
      pg->all_reduce(big);  // warm-up
      pg->barrier();
      auto t0 = std::chrono::steady_clock::now();
      const int reps = 3;
      for (int i = 0; i < reps; ++i) pg->all_reduce(big);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0)
        std::printf("info  all_reduce %d MiB float32: %.3f GB/s (algbw, %d ranks)\n", args.mib,
                    double(big.nbytes()) * reps / sec * 1e-9, w);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] accel-selftest aborted: %s\n", r, e.what());
    rc = 1;
  }
  if (c.failed() > 0) rc = 1;
  if (r == 0)
    std::printf("%s: %d of %d checks passed on %d rank(s)\n", rc == 0 ? "PASS" : "FAIL",
                c.total() - c.failed(), c.total(), w);
  try {
    if (rc == 0) pg->barrier();  // nobody tears down while a peer still talks to it
  } catch (const std::exception&) {
    rc = 1;
  }
  pg.reset();
  destroy_process_group();
  return rc;
}
