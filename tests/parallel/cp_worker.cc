// Worker for the context-parallel tests (test_context_parallel.cc): `cp_worker <scenario>`, one
// process per rank under the env contract, any world size (the cp group is the world). Exit 0 =
// passed on this rank ("ok <scenario>" printed), 1 = a check failed, 2 = unexpected exception.
//   ring      ring_attention (parallel/context_parallel.h) on this rank's zig-zag tokens against
//             scaled_dot_product_attention over the whole sequence in one process: outputs and the
//             gradients of q, k, v, causal and not, float64 (1e-12) and float32 (1e-5), the fused
//             block backward and the composed one (what runs off the CPU); bf16 within 2e-2
//   sharding  cp_positions, cp_shard_sequence and cp_unshard_sequence round trips; bad lengths
//             are ShapeErrors naming the sizes
//   scope     a CausalSelfAttention called inside the ContextAttentionGuard the cp step installs
//             equals the one-process module; attention dropout, a mask and MultiheadAttention's
//             need_weights are refused by name
//   plan      the cp step through dist::ParallelPlan (no Accelerator, no engine): a GPT on this
//             rank's tokens equals its rows of the one-process forward; a second prepare and bad
//             plans are refused
#include <cmath>
#include <functional>
#include <iostream>
#include <string>

#include "autograd/context_attention.h"
#include "comm/process_group.h"
#include "nn/attention.h"
#include "examples/models.h"
#include "parallel/context_parallel.h"
#include "parallel/parallelize.h"
#include "tests/common/tensors.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace accel::dist;
using accel::test::g_failures;
using accel::test::g_rank;
using accel::test::max_abs_diff;

namespace {

#define EXPECT_CLOSE(a, b, tol, what)                                   \
  do {                                                                  \
    const double d_ = max_abs_diff((a).to(kFloat64), (b).to(kFloat64)); \
    WCHECK(d_ <= (tol), what << ": max difference " << d_);             \
  } while (0)

Tensor rnd(const Shape& s, DType dt, uint64_t seed) {
  Generator gen(seed);
  return randn(s, TensorOptions(kFloat64), &gen).to(dt);
}

void scenario_ring(const ProcessGroupPtr& world) {
  const int c = world->size(), r = world->rank();
  const int64_t B = 2, H = 3, L = 5, T = 2 * c * L, D = 4, Dv = 6;
  struct Case {
    DType dt;
    bool causal, composed;
    double tol;
  };
  const Case cases[] = {{kFloat64, true, false, 1e-12}, {kFloat64, false, false, 1e-12},
                        {kFloat64, true, true, 1e-12},  {kFloat64, false, true, 1e-12},
                        {kFloat32, true, false, 2e-5},  {kBFloat16, true, false, 3e-2}};
  for (const Case& cs : cases) {
    const std::string what = std::string(dtype_name(cs.dt)) + (cs.causal ? " causal" : " full") +
                             (cs.composed ? " composed" : " fused");
    dist::detail::set_ring_attention_composed(cs.composed);
    // One process: the whole sequence (the reference in float64 for bf16).
    const DType ref_dt = cs.dt == kBFloat16 ? kFloat64 : cs.dt;
    Tensor q = rnd({B, H, T, D}, ref_dt, 1).requires_grad_(true);
    Tensor k = rnd({B, H, T, D}, ref_dt, 2).requires_grad_(true);
    Tensor v = rnd({B, H, T, Dv}, ref_dt, 3).requires_grad_(true);
    const Tensor w = rnd({B, H, T, Dv}, ref_dt, 4);
    const double scale = 0.7;
    Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, cs.causal, scale);
    sum(out * w).backward();
    // This rank: its tokens.
    auto mine = [&](const Tensor& t) {
      return cp_shard_sequence(t.detach().to(cs.dt), 2, r, c).contiguous().requires_grad_(true);
    };
    Tensor ql = mine(q), kl = mine(k), vl = mine(v);
    Tensor ol = ring_attention(ql, kl, vl, cs.causal, scale, world);
    sum(ol * cp_shard_sequence(w.to(cs.dt), 2, r, c)).backward();
    auto part = [&](const Tensor& t) { return cp_shard_sequence(t, 2, r, c); };
    EXPECT_CLOSE(ol, part(out), cs.tol, what << " forward");
    EXPECT_CLOSE(ql.grad(), part(q.grad()), cs.tol * 4, what << " dq");
    EXPECT_CLOSE(kl.grad(), part(k.grad()), cs.tol * 4, what << " dk");
    EXPECT_CLOSE(vl.grad(), part(v.grad()), cs.tol * 4, what << " dv");
  }
  dist::detail::set_ring_attention_composed(false);
  // Odd token counts and mismatched shapes are refused by name.
  if (c > 1) {
    const Tensor odd = rnd({1, 1, 3, 2}, kFloat64, 5);
    WCHECK_THROWS_WITH(ring_attention(odd, odd, odd, true, 1.0, world), "not two equal chunks");
  }
  const Tensor a = rnd({1, 1, 4, 2}, kFloat64, 6), b = rnd({1, 1, 4, 3}, kFloat64, 7);
  WCHECK_THROWS_WITH(ring_attention(a, b, a, true, 1.0, world), "[ring_attention]");
}

void scenario_sharding(const ProcessGroupPtr& world) {
  const int c = world->size(), r = world->rank();
  const int64_t L = 3, T = 2 * c * L;
  const Tensor pos = cp_positions(2 * L, r, c);
  for (int64_t i = 0; i < L; ++i) {
    WCHECK(pos.data<int64_t>()[i] == r * L + i, "position " << i);
    WCHECK(pos.data<int64_t>()[L + i] == (2 * c - 1 - r) * L + i, "position " << L + i);
  }
  const Tensor x = rnd({2, T, 3}, kFloat64, 8);
  const Tensor mine = cp_shard_sequence(x, 1, r, c);
  WCHECK(mine.size(1) == 2 * L, "local length " << mine.size(1));
  // The positions pick this rank's tokens out of the whole sequence.
  EXPECT_CLOSE(mine, index_select(x, 1, pos), 0.0, "shard = positions");
  EXPECT_CLOSE(cp_unshard_sequence(mine, 1, world), x, 0.0, "unshard");
  EXPECT_CLOSE(cp_unshard_sequence(mine, -2, world), x, 0.0, "unshard, negative dim");
  const Tensor bad = rnd({2, T + 1, 3}, kFloat64, 9);
  WCHECK_THROWS_WITH(cp_shard_sequence(bad, 1, r, c), "not divisible by 2 x cp_size");
  WCHECK_THROWS_WITH(cp_positions(3, r, c), "not two equal chunks");
}

void scenario_scope(const ProcessGroupPtr& world) {
  const int c = world->size(), r = world->rank();
  const int64_t T = 4 * c;
  Generator gen(3);
  nn::CausalSelfAttention one(8, 2, true, 0.0, &gen);
  one.to(kFloat64);
  const Tensor x = rnd({2, T, 8}, kFloat64, 10);
  const Tensor want = one(x);
  ContextAttention ca;
  ca.what = "context parallelism (test)";
  ca.attend = [world](const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                      double scale) { return ring_attention(q, k, v, causal, scale, world); };
  {
    ContextAttentionGuard scope(&ca);
    const Tensor got = one(cp_shard_sequence(x, 1, r, c));
    EXPECT_CLOSE(got, cp_shard_sequence(want, 1, r, c), 1e-12, "CausalSelfAttention in the scope");
    const Tensor q = rnd({1, 1, 2, 2}, kFloat64, 11);
    WCHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, Tensor(), 0.1, true), "no dropout_p");
    WCHECK_THROWS_WITH(
        scaled_dot_product_attention(q, q, q, ones({2, 2}, TensorOptions(kBool)), 0.0, false),
        "context parallelism (test)");
    nn::CausalSelfAttention dropping(8, 2, true, 0.1, &gen);
    dropping.train();
    WCHECK_THROWS_WITH(dropping(cp_shard_sequence(rnd({1, T, 8}, kFloat32, 12), 1, r, c)),
                       "attention dropout");
    // MultiheadAttention materialises its weights with need_weights (its default): refused.
    nn::MultiheadAttention mha(8, 2);
    const Tensor xm = rnd({T / c, 1, 8}, kFloat32, 13);
    WCHECK_THROWS_WITH(mha.forward(xm, xm, xm), "need_weights under context parallelism (test)");
  }
  WCHECK(context_attention() == nullptr, "the scope is left");
}

// The data-parallel slot of a plan that runs no engine.
struct NoEngine final : ApplyStep {
  std::string_view name() const override { return "data_parallel"; }
  bool active(const DeviceMesh&) const override { return true; }
  void apply(ParallelModel&, const StepContext&) override {}
};

// The cp step without the Accelerator: a GPT's forward on this rank's tokens equals its rows of
// the one-process forward; preparing it again is refused (its positions would be mapped twice).
void scenario_plan(const ProcessGroupPtr& world) {
  const int c = world->size(), r = world->rank();
  const DeviceMesh mesh({{"cp", c}}, r, c, [&](const std::vector<int>& ranks) {
    return int(ranks.size()) == c ? world : ProcessGroupPtr();
  });
  models::GptConfig gc;
  gc.vocab = 16;
  gc.context = 8 * c;
  gc.layers = 2;
  gc.heads = 2;
  gc.d_model = 16;
  Generator gen(4);
  auto model = std::make_shared<models::Gpt>(gc, &gen);
  model->to(kFloat64);
  Generator data(9);
  const Tensor idx = randint(0, gc.vocab, {2, gc.context}, TensorOptions(kInt64), &data);
  const Tensor want = model->forward(idx);
  ParallelOptions o;
  o.cp_plan = models::gpt_cp_plan();
  ParallelPlan plan(mesh, o, std::make_unique<NoEngine>());
  plan.prepare_model(model);
  const Tensor got = model->forward(cp_shard_sequence(idx, 1, r, c));
  EXPECT_CLOSE(got, cp_shard_sequence(want, 1, r, c), 1e-12, "Gpt forward under the cp step");
  WCHECK_THROWS_WITH(plan.prepare_model(model), "prepared for context parallelism already");
  // A plan whose pattern matches nothing, or without attention, is refused before any change.
  ParallelOptions bad;
  bad.cp_plan = {{"blocks.*.nothing", cp_ring_attention()}};
  ParallelPlan bad_plan(mesh, bad, std::make_unique<NoEngine>());
  auto other = std::make_shared<models::Gpt>(gc, &gen);
  WCHECK_THROWS_WITH(bad_plan.prepare_model(other), "matches no module");
  ParallelOptions positions_only;
  positions_only.cp_plan = {{"pos", cp_position_ids()}};
  ParallelPlan pos_plan(mesh, positions_only, std::make_unique<NoEngine>());
  WCHECK_THROWS_WITH(pos_plan.prepare_model(other), "has no ring-attention entry");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: cp_worker <scenario>\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    InitOptions io;
    io.timeout = std::chrono::milliseconds(60000);
    auto world = init_process_group(io);
    g_rank = world->rank();
    if (scenario == "ring") {
      scenario_ring(world);
    } else if (scenario == "sharding") {
      scenario_sharding(world);
    } else if (scenario == "scope") {
      scenario_scope(world);
    } else if (scenario == "plan") {
      scenario_plan(world);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    world->barrier();
    world.reset();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
