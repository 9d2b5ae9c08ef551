// NCCL process group (built only with CUDA; skips when no GPU is visible). One process on one
// GPU checks every collective and dtype through the backend; with two or more GPUs,
// accel-selftest --backend nccl runs as two processes.
#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "core/tensor.h"
#include "comm/nccl/process_group_nccl.h"
#include "comm/process_group.h"
#include "kernels/cuda/device.h"
#include "tests/common/spawn.h"

using namespace accel;
using namespace accel::dist;
using namespace std::chrono_literals;

namespace {
Tensor make(DType dt, int64_t n, double base) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = dt == kBool ? (i % 3 == 0) : double((i * 7) % 11) - 5 + base;
  return tensor(v, {n}).to(dt).to(Device::cuda(0));
}
}  // namespace

TEST_CASE("nccl: every collective and dtype on one GPU") {
  if (!cuda::is_available()) {
    MESSAGE("skipped: no GPU (" << cuda::unavailable_reason() << ")");
    return;
  }
  cuda::set_device(0);
  auto pg = new_nccl_group(std::make_shared<MemoryStore>(), 0, 1);
  CHECK(pg->backend() == "nccl");
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    CAPTURE(dt);
    for (int64_t n : {1, 7, 1001}) {
      Tensor t = make(dt, n, 0);
      auto want = t.cpu().tolist();
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
        pg->all_reduce(t, op);
        CHECK(t.cpu().tolist() == want);  // one rank: the identity
      }
      if (is_floating(dt)) {
        pg->all_reduce(t, ReduceOp::Avg);
        CHECK(t.cpu().tolist() == want);
      }
      pg->broadcast(t, 0);
      CHECK(t.cpu().tolist() == want);
      Tensor out = zeros({n}, TensorOptions(dt, Device::cuda(0)));
      pg->all_gather(out, t);
      CHECK(out.cpu().tolist() == want);
      Tensor rs = zeros({n}, TensorOptions(dt, Device::cuda(0)));
      pg->reduce_scatter(rs, t);
      CHECK(rs.cpu().tolist() == want);
    }
  }
  pg->barrier();
  // Async handles in issue order; wrong device or shape are caller errors.
  std::vector<WorkPtr> ws;
  std::vector<Tensor> ts;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(make(kFloat32, 100 + k, k));
    ws.push_back(pg->all_reduce_async(ts.back()));
  }
  for (int k = 7; k >= 0; --k) ws[size_t(k)]->wait();
  CHECK(ws[7]->seq() == ws[0]->seq() + 7);
  Tensor cpu = zeros({4});
  CHECK_THROWS_AS(pg->all_reduce(cpu), DeviceError);
  Tensor small = zeros({3}, TensorOptions(kFloat32, Device::cuda(0)));
  CHECK_THROWS_AS(pg->all_gather(small, make(kFloat32, 2, 0)), ShapeError);
}

TEST_CASE("nccl: a subgroup from split is an NCCL group of its own (one GPU: a world of one)") {
  if (!cuda::is_available()) {
    MESSAGE("skipped: no GPU (" << cuda::unavailable_reason() << ")");
    return;
  }
  cuda::set_device(0);
  auto pg = new_nccl_group(std::make_shared<MemoryStore>(), 0, 1);
  ProcessGroupPtr sub = pg->split(/*color=*/0, /*key=*/0);
  REQUIRE(sub != nullptr);
  CHECK(sub->backend() == "nccl");
  CHECK(sub->is_subgroup());
  CHECK(sub->size() == 1);
  Tensor t = make(kFloat32, 1001, 1);
  auto want = t.cpu().tolist();
  sub->all_reduce(t);
  CHECK(t.cpu().tolist() == want);
  pg->all_reduce(t);  // the parent still works alongside
  CHECK(t.cpu().tolist() == want);
  CHECK(pg->split(/*color=*/-1, /*key=*/0) == nullptr);
}

TEST_CASE("nccl: two processes through accel-selftest (needs two GPUs)") {
  if (cuda::device_count() < 2) {
    MESSAGE("skipped: needs 2 GPUs, found " << cuda::device_count());
    return;
  }
  std::string exe = accel::test::helper_path("../../comm/tools/accel-selftest");
  auto res = accel::test::run_world(exe, {"--backend", "nccl", "--quiet", "--timeout-ms", "60000"},
                                    2, {}, 120s);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].code == 0);
  }
  CHECK(res[0].output.find("PASS") != std::string::npos);
}
