// tp_worker's dropout scenarios (Note [dropout under tensor parallelism] in parallel/tp_random.cc):
//   dropout         the masks dropout draws after colwise and rowwise layers, with and without
//                   sequence parallel, over 4 ranks and over pairs, equal this rank's slice of the
//                   one-process masks (so they differ across ranks on sharded activations and are
//                   identical on replicated ones); packed colwise outputs, split attention heads,
//                   channel dropout; activation checkpointing redraws the forward's masks; shapes
//                   that do not fit the layout and tp ranks seeded apart are ValueErrors on every
//                   rank naming the module
//   train_dropout   the small GPT with dropout 0.1 trained 20 steps at tp 4 and tp 2, with and
//                   without sequence parallel, equals one process (1e-10); at tp 2 x dp 2 (+SP)
//                   the replicated parameters stay identical across the tp ranks
//   resume_dropout  tp 2 x dp 2 + SP with dropout: stopped after 4 steps (model, optimizer and
//                   generator state saved) and resumed in a fresh model equals the straight run
//                   bit for bit
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "comm/device_mesh.h"
#include "comm/process_group.h"
#include "core/generator.h"
#include "examples/models.h"
#include "parallel/tensor_parallel.h"
#include "tests/common/tensors.h"
#include "tests/common/worker_check.h"
#include "tests/parallel/tp_scenarios.h"

using namespace accel;
using namespace accel::dist;
using accel::test::g_rank;
using accel::test::max_abs_diff;

namespace {

constexpr double kP = 0.3;
constexpr int64_t kB = 2, kT = 8, kC = 8;

// Every rank's copy of t (same shape) stacked: (p, ...).
Tensor gathered(const Tensor& t, const ProcessGroupPtr& g) {
  Shape s{g->size()};
  for (int64_t d : t.sizes()) s.push_back(d);
  Tensor all = empty(s, TensorOptions(t.dtype()));
  g->all_gather(all, t.contiguous());
  return all;
}

// A colwise and a rowwise layer with the masks dropout draws after each: the masks of ones (0 or
// 1 / (1 - p)), so a mask is compared as it is.
enum class Mode { Plain, Flatten, Attention, Checkpoint };
struct Probe : nn::Module {
  Probe(Mode mode_, double p_) : mode(mode_), p(p_), up(nullptr), down(nullptr) {
    Generator gen(7);
    up = register_module("up", std::make_shared<nn::Linear>(kC, 4 * kC, true, &gen));
    down = register_module("down", std::make_shared<nn::Linear>(4 * kC, kC, true, &gen));
    to(kFloat64);
  }
  // x: (B, T, C), or this rank's (B, T / tp, C) under sequence parallel.
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*up)(x);  // (B, T, 4C): features sharded under tp
    m_up = dropout(ones_like(h), p, true);
    Tensor y = (*down)(gelu(h) * m_up);  // (B, T, C): replicated, or sequence chunks under SP
    if (mode == Mode::Flatten) return dropout(y.reshape({-1, kC}), p, true);
    if (mode == Mode::Attention) {  // attention over (B, 2 heads, T, C / 2), no heads split
      const Tensor q = y.reshape({y.size(0), y.size(1), 2, kC / 2}).transpose(1, 2);
      return scaled_dot_product_attention(q, q, q, Tensor(), p);
    }
    if (mode == Mode::Checkpoint) {  // a checkpointed dropout: its recompute runs in backward
      return autograd::checkpoint(
          [this](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{dropout(in[0], p, true)};
          },
          {y})[0];
    }
    m_down = dropout(ones_like(y), p, true);
    m_channel = dropout1d(ones_like(y), p, true);  // planes (B, T)
    return y * m_down * m_channel;
  }
  Mode mode;
  double p;
  nn::Child<nn::Linear> up, down;
  Tensor m_up, m_down, m_channel;
};

TpPlan probe_plan(bool sp) {
  return {{"up", colwise({.sequence_parallel = sp})}, {"down", rowwise({.sequence_parallel = sp})}};
}

Tensor probe_input() {
  Generator gen(11);
  return randn({kB, kT, kC}, TensorOptions(kFloat64), &gen);
}

bool throws_value_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    bool ok = true;
    for (const auto& n : needles) ok = ok && msg.find(n) != std::string::npos;
    if (!ok) std::cout << "rank " << g_rank << " unexpected message: " << msg << std::endl;
    return ok;
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return false;
  }
  return false;
}

void masks_over(const ProcessGroupPtr& g, const std::string& label) {
  const int p = g->size(), r = g->rank();
  const Tensor x = probe_input();
  // One process: the masks of the full tensors.
  auto ref = std::make_shared<Probe>(Mode::Plain, kP);
  manual_seed(42);
  const Tensor ref_out = (*ref)(x);
  const double kept = ref->m_down.ne(0.0).to(kFloat64).mean().item<double>();
  WCHECK(kept > 0.5 && kept < 0.9, label << ": one process keeps " << kept << " of the mask");
  for (bool sp : {false, true}) {
    const std::string what = label + (sp ? " sequence parallel" : "");
    auto probe = std::make_shared<Probe>(Mode::Plain, kP);
    parallelize(probe, g, probe_plan(sp));
    manual_seed(42);
    const int64_t n = kT / p;
    const Tensor out = (*probe)(sp ? x.narrow(1, r * n, n).contiguous() : x);
    // Features of the colwise output: this rank's columns of the one-process mask.
    const int64_t f = 4 * kC / p;
    WCHECK(max_abs_diff(probe->m_up, ref->m_up.narrow(2, r * f, f)) == 0.0,
           what << ": the colwise output's mask is not this rank's columns of one process's");
    const Tensor want_down = sp ? ref->m_down.narrow(1, r * n, n) : ref->m_down;
    const Tensor want_channel = sp ? ref->m_channel.narrow(1, r * n, n) : ref->m_channel;
    WCHECK(max_abs_diff(probe->m_down, want_down) == 0.0,
           what << ": the rowwise output's mask is not one process's (slice)");
    WCHECK(max_abs_diff(probe->m_channel, want_channel) == 0.0,
           what << ": dropout1d's mask is not one process's (slice)");
    EXPECT_CLOSE_TP(out, sp ? ref_out.narrow(1, r * n, n) : ref_out, 1e-12, what << ": output");
    const Tensor all = gathered(probe->m_down, g);
    for (int q = 1; q < p; ++q) {
      const double d = max_abs_diff(all.select(0, q), all.select(0, 0));
      // Sequence chunks: independent masks (here: different); replicated: the same mask.
      WCHECK(sp ? d > 0 : d == 0,
             what << ": tp rank " << q << "'s mask against rank 0's differs by " << d);
    }
  }
}

// A packed [q | k | v] colwise output (chunks 3): each block's columns of this rank.
void packed_over(const ProcessGroupPtr& g, const std::string& label) {
  struct Packed : nn::Module {
    Packed() : qkv(nullptr) {
      Generator gen(8);
      qkv = register_module("qkv", std::make_shared<nn::Linear>(kC, 3 * kC, true, &gen));
      to(kFloat64);
    }
    Tensor forward(const Tensor& x) override { return dropout(ones_like((*qkv)(x)), kP, true); }
    nn::Child<nn::Linear> qkv;
  };
  const int p = g->size(), r = g->rank();
  const Tensor x = probe_input();
  auto ref = std::make_shared<Packed>();
  manual_seed(5);
  const Tensor full = (*ref)(x);
  auto m = std::make_shared<Packed>();
  parallelize(m, g, {{"qkv", colwise({.chunks = 3})}});
  manual_seed(5);
  const Tensor mine = (*m)(x);
  const int64_t n = kC / p;
  std::vector<Tensor> blocks;
  for (int64_t c = 0; c < 3; ++c) blocks.push_back(full.narrow(2, c * kC + r * n, n));
  WCHECK(max_abs_diff(mine, cat(blocks, 2)) == 0.0,
         label << ": a packed colwise output's mask is not this rank's blocks of one process's");
}

// Attention with dropout on the weights and the output, heads split over tp: the output equals
// one process (every rank's heads drew their one-process masks).
void attention_over(const ProcessGroupPtr& g, const std::string& label) {
  const int p = g->size(), r = g->rank();
  auto make = [] {
    Generator gen(9);
    auto a = std::make_shared<nn::CausalSelfAttention>(kC, 4, true, kP, &gen);
    a->to(kFloat64);
    return a;
  };
  const Tensor x = probe_input();
  auto ref = make();
  manual_seed(6);
  const Tensor want = (*ref)(x);
  for (bool sp : {false, true}) {
    auto a = make();
    parallelize(a, g,
                {{"qkv", colwise({.chunks = 3, .sequence_parallel = sp})},
                 {"proj", rowwise({.sequence_parallel = sp})}});
    manual_seed(6);
    const int64_t n = kT / p;
    const Tensor got = (*a)(sp ? x.narrow(1, r * n, n).contiguous() : x);
    EXPECT_CLOSE_TP(got, sp ? want.narrow(1, r * n, n) : want, 1e-12,
                    label << (sp ? " sequence parallel" : "")
                          << ": attention with dropout against one process");
  }
}

// Activation checkpointing: the recompute in backward draws the forward's masks in the forward's
// layout (autograd::checkpoint keeps it), so the gradients equal those without checkpointing.
void checkpoint_over(const ProcessGroupPtr& g, const std::string& label) {
  const int p = g->size(), r = g->rank();
  const int64_t n = kT / p;
  const Tensor x = probe_input().narrow(1, r * n, n).contiguous();
  auto grads = [&](Mode mode) {
    auto probe = std::make_shared<Probe>(mode, kP);
    parallelize(probe, g, probe_plan(true));
    manual_seed(13);
    Tensor xi = x.detach().clone().requires_grad_(true);
    const Tensor out = (*probe)(xi);
    Generator wg(14);
    sum(out * randn(out.sizes(), TensorOptions(kFloat64), &wg)).backward();
    return xi.grad();
  };
  const Tensor with_ckpt = grads(Mode::Checkpoint);
  // The reference: the same forward with its last dropout not checkpointed.
  auto probe = std::make_shared<Probe>(Mode::Checkpoint, kP);
  parallelize(probe, g, probe_plan(true));
  manual_seed(13);
  Tensor xi = x.detach().clone().requires_grad_(true);
  Tensor out;
  {
    const Tensor h = (*probe->up)(xi);
    const Tensor m_up = dropout(ones_like(h), kP, true);
    const Tensor y = (*probe->down)(gelu(h) * m_up);
    out = dropout(y, kP, true);
  }
  Generator wg(14);
  sum(out * randn(out.sizes(), TensorOptions(kFloat64), &wg)).backward();
  EXPECT_CLOSE_TP(with_ckpt, xi.grad(), 1e-12,
                  label << ": gradients through a checkpointed dropout in a sequence region");
}

void errors_over(const ProcessGroupPtr& g, const std::string& label) {
  const int p = g->size(), r = g->rank();
  const int64_t n = kT / p;
  const Tensor chunk = probe_input().narrow(1, r * n, n).contiguous();
  {
    std::ostringstream flat;  // the flattened chunk (B * T / tp, C), as the error prints it
    flat << Shape{kB * n, kC};
    const std::string flat_shape = flat.str();
    auto probe = std::make_shared<Probe>(Mode::Flatten, kP);
    parallelize(probe, g, probe_plan(true));
    manual_seed(1);
    WCHECK(throws_value_error(
               [&] { (*probe)(chunk); },
               {"[dropout]", "tensor-parallel rowwise 'down' (sequence parallel)", flat_shape}),
           label << ": dropout on a flattened sequence chunk must be a ValueError naming the "
                    "module that sharded it");
  }
  {
    auto probe = std::make_shared<Probe>(Mode::Attention, kP);
    parallelize(probe, g, probe_plan(true));
    manual_seed(1);
    WCHECK(throws_value_error([&] { (*probe)(chunk); },
                              {"[dropout]", "attention weights", "splits no heads",
                               "tensor-parallel rowwise 'down'"}),
           label << ": attention-weight dropout on sequence chunks must be a ValueError");
  }
  {  // tp ranks seeded apart: the first forward that draws raises on every rank
    auto probe = std::make_shared<Probe>(Mode::Plain, kP);
    parallelize(probe, g, probe_plan(false));
    manual_seed(uint64_t(100 + g_rank));
    WCHECK(throws_value_error([&] { (*probe)(probe_input()); },
                              {"[parallelize]", "not in tp rank 0's state", "Probe",
                               "seed every rank of a tp group alike"}),
           label << ": generators seeded apart must be a ValueError on every rank");
    auto quiet = std::make_shared<Probe>(Mode::Plain, 0.0);  // no dropout: nothing to check
    parallelize(quiet, g, probe_plan(false));
    bool threw = false;
    try {
      (*quiet)(probe_input());
    } catch (const std::exception& e) {
      threw = true;
      std::cout << "rank " << g_rank << ": " << e.what() << std::endl;
    }
    WCHECK(!threw, label << ": a model without dropout needs no common seed");
  }
}

// ---- training ----

models::GptConfig dropout_gpt() {
  models::GptConfig c;
  c.vocab = 32;
  c.context = 8;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 16;
  c.dropout = 0.1;
  return c;
}

std::shared_ptr<models::Gpt> make_dropout_gpt() {
  Generator gen(1234);
  auto m = std::make_shared<models::Gpt>(dropout_gpt(), &gen);
  m->to(kFloat64);
  return m;
}

std::pair<Tensor, Tensor> batch_of(int step) {
  Generator gen(9000 + step % 2);
  Tensor data = randint(0, 32, {4, 9}, TensorOptions(kInt64), &gen);
  return {data.narrow(1, 0, 8).contiguous(), data.narrow(1, 1, 8).contiguous()};
}

constexpr int kSteps = 20;
constexpr uint64_t kSeed = 77;

optim::AdamWOptions adamw() {
  optim::AdamWOptions o;
  o.lr(1e-2);
  return o;
}

struct TpRun {
  ProcessGroupPtr tp, dp;
  bool sp = false, loss_parallel = false;
  std::string label;
};

struct Trainer {
  std::shared_ptr<models::Gpt> model;
  std::unique_ptr<optim::AdamW> opt;
  TpRun run;
  explicit Trainer(const TpRun& r) : model(make_dropout_gpt()), run(r) {
    if (r.tp)
      parallelize(
          model, r.tp,
          models::gpt_tp_plan({.sequence_parallel = r.sp, .loss_parallel = r.loss_parallel}));
    opt = std::make_unique<optim::AdamW>(model->parameters(), adamw());
  }
  // One step on this dp rank's rows; returns the loss (mean over dp).
  double step(int s) {
    auto [x, y] = batch_of(s);
    const int dp = run.dp ? run.dp->size() : 1, d = run.dp ? run.dp->rank() : 0;
    const int64_t b = 4 / dp;
    x = x.narrow(0, d * b, b).contiguous();
    y = y.narrow(0, d * b, b).contiguous();
    opt->zero_grad();
    const Tensor out = (*model)(x);
    Tensor loss =
        run.loss_parallel ? models::lm_loss_parallel(out, y, run.tp) : models::lm_loss(out, y);
    loss.backward();
    Tensor l = loss.detach().reshape({1}).clone();
    if (run.dp) {
      for (Tensor& p : model->parameters())
        if (p.grad().defined()) run.dp->all_reduce(p.grad(), ReduceOp::Avg);
      run.dp->all_reduce(l, ReduceOp::Avg);
    }
    if (run.tp)
      tp_clip_grad_norm_(*model, 0.5);
    else
      nn::clip_grad_norm_(model->parameters(), 0.5);
    opt->step();
    return l.item<double>();
  }
};

void scenario_train_dropout_impl(const ProcessGroupPtr& world) {
  std::vector<double> ref_losses;
  io::TensorDict ref_params;
  {
    Trainer t(TpRun{});
    manual_seed(kSeed);
    for (int s = 0; s < kSteps; ++s) ref_losses.push_back(t.step(s));
    for (auto& [n, v] : t.model->named_parameters()) ref_params[n] = v.detach().clone();
  }
  WCHECK(std::isfinite(ref_losses.back()) && ref_losses.back() < ref_losses.front() - 0.1,
         "the reference must learn: " << ref_losses.front() << " -> " << ref_losses.back());
  {  // the dropout is live: the first step's loss without it differs
    Trainer t(TpRun{});
    t.model->eval();
    const double plain = t.step(0);
    WCHECK(
        std::abs(plain - ref_losses[0]) > 1e-3,
        "dropout 0.1 must change the loss: " << plain << " without, " << ref_losses[0] << " with");
  }
  auto factory = [](const std::vector<int>& ranks) { return new_group(ranks); };
  DeviceMesh m4(mesh_dims({.tp = 4}), world->rank(), world->size(), factory);
  DeviceMesh m22(mesh_dims({.dp_shard = 2, .tp = 2}), world->rank(), world->size(), factory);
  // dp 1: every rank of a tp group draws what one process draws.
  const std::vector<TpRun> runs = {
      {m4.group("tp"), nullptr, true, false, "tp 4, sequence parallel"},
      {m4.group("tp"), nullptr, false, true, "tp 4, vocab-parallel loss"},
      {m22.group("tp"), nullptr, true, true, "tp 2, sequence parallel, vocab-parallel loss"},
      {m22.group("tp"), nullptr, false, false, "tp 2"},
  };
  for (const TpRun& r : runs) {
    Trainer t(r);
    manual_seed(kSeed);
    double worst = 0;
    for (int s = 0; s < kSteps; ++s)
      worst = std::max(worst, std::abs(t.step(s) - ref_losses[size_t(s)]));
    double worst_param = 0;
    for (const auto& [n, v] : tp_full_parameters(*t.model))
      worst_param = std::max(worst_param, max_abs_diff(v, ref_params.at(n)));
    WCHECK(worst <= 1e-10 && worst_param <= 1e-10,
           r.label << " with dropout: losses differ from one process by " << worst
                   << ", parameters by " << worst_param);
    if (g_rank == 0)
      std::cout << r.label << ", dropout 0.1: losses within " << worst << ", parameters within "
                << worst_param << " of one process (loss " << ref_losses.front() << " -> "
                << ref_losses.back() << ")" << std::endl;
  }
  // tp 2 x dp 2 (+SP), each dp rank seeded apart (as Accelerator::set_seed(s, true) does), the tp
  // ranks alike: not one process's masks (a dp rank draws for its rows), but the replicated
  // parameters stay identical across the tp ranks, and the run learns as one process does.
  for (bool sp : {false, true}) {
    Trainer t({m22.group("tp"), m22.group("dp_shard"), sp, false, "tp 2 x dp 2"});
    manual_seed(kSeed + uint64_t(m22.coordinate("dp_shard")));
    std::vector<double> losses;
    for (int s = 0; s < kSteps; ++s) losses.push_back(t.step(s));
    double apart = 0;
    int replicated = 0;
    for (auto& [n, v] : t.model->named_parameters()) {
      if (is_tp_sharded(*t.model, n)) continue;
      ++replicated;
      const Tensor all = gathered(v.detach(), t.run.tp);
      apart = std::max(apart, max_abs_diff(all.select(0, 1), all.select(0, 0)));
    }
    double mean = 0, ref_mean = 0;
    for (int s = kSteps - 5; s < kSteps; ++s) {
      mean += losses[size_t(s)] / 5;
      ref_mean += ref_losses[size_t(s)] / 5;
    }
    const std::string what = std::string("tp 2 x dp 2") + (sp ? ", sequence parallel" : "");
    WCHECK(replicated > 0 && apart == 0.0,
           what << " with dropout: replicated parameters differ across the tp ranks by " << apart);
    WCHECK(std::isfinite(mean) && std::abs(mean - ref_mean) < 0.15,
           what << " with dropout: mean loss of the last 5 steps " << mean << ", one process "
                << ref_mean);
    if (g_rank == 0)
      std::cout << what << ", dropout 0.1: " << replicated
                << " replicated parameters, apart across tp by " << apart
                << "; mean loss of the last 5 steps " << mean << " (one process " << ref_mean << ")"
                << std::endl;
  }
}

void scenario_resume_dropout_impl(const ProcessGroupPtr& world) {
  auto factory = [](const std::vector<int>& ranks) { return new_group(ranks); };
  DeviceMesh m22(mesh_dims({.dp_shard = 2, .tp = 2}), world->rank(), world->size(), factory);
  const TpRun run{m22.group("tp"), m22.group("dp_shard"), true, false, "tp 2 x dp 2, SP"};
  const uint64_t seed = kSeed + uint64_t(m22.coordinate("dp_shard"));
  constexpr int kStop = 4, kEnd = 8;
  std::vector<double> straight;
  io::TensorDict straight_params;
  {
    Trainer t(run);
    manual_seed(seed);
    for (int s = 0; s < kEnd; ++s) straight.push_back(t.step(s));
    straight_params = tp_full_parameters(*t.model);
  }
  // Stop after kStop steps, keeping what a checkpoint keeps: this rank's model and optimizer
  // state and its generator's state (the Accelerator's rng_rank<r>.txt).
  io::TensorDict model_state, opt_state;
  std::string rng;
  {
    Trainer t(run);
    manual_seed(seed);
    for (int s = 0; s < kStop; ++s) t.step(s);
    for (auto& [n, v] : t.model->state_dict()) model_state[n] = v.detach().clone();
    for (auto& [n, v] : t.opt->state_dict()) opt_state[n] = v.detach().clone();
    rng = default_generator().state();
  }
  manual_seed(12345);  // the resumed process starts elsewhere
  Trainer t(run);
  t.model->load_state_dict(model_state);
  t.opt->load_state_dict(opt_state);
  default_generator().set_state(rng);
  double worst = 0;
  for (int s = kStop; s < kEnd; ++s)
    worst = std::max(worst, std::abs(t.step(s) - straight[size_t(s)]));
  double worst_param = 0;
  for (const auto& [n, v] : tp_full_parameters(*t.model))
    worst_param = std::max(worst_param, max_abs_diff(v, straight_params.at(n)));
  WCHECK(worst == 0.0 && worst_param == 0.0,
         "resumed with dropout at tp 2 x dp 2 + SP: losses differ from the straight run by "
             << worst << ", parameters by " << worst_param);
  if (g_rank == 0)
    std::cout << "resume with dropout, tp 2 x dp 2 + SP: losses and parameters differ from the "
                 "straight run by "
              << worst << ", " << worst_param << std::endl;
}

}  // namespace

void scenario_dropout(const ProcessGroupPtr& world) {
  auto pair = world->split(world->rank() / 2, 0);  // {0,1} and {2,3}
  for (const auto& [g, label] :
       std::vector<std::pair<ProcessGroupPtr, std::string>>{{world, "tp 4"}, {pair, "tp 2"}}) {
    masks_over(g, label);
    packed_over(g, label);
    attention_over(g, label);
    checkpoint_over(g, label);
    errors_over(g, label);
  }
}

void scenario_train_dropout(const ProcessGroupPtr& world) { scenario_train_dropout_impl(world); }
void scenario_resume_dropout(const ProcessGroupPtr& world) { scenario_resume_dropout_impl(world); }
