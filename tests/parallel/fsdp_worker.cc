// Worker for the ZeRO-3 unit tests: `fsdp_worker <scenario> [args]` under the env contract.
// Each rank also trains a single-process reference on the full batch and compares.
// Exit: 0 passed, 1 check failed, 2 unexpected exception.
//   match <sgd|adam|adamw> <accum> [prefetch 0|1] [reshard 0|1]
//                      per-unit sharding vs single-process training (two param groups)
//   memory             between steps only shards + root; at most two units gathered in forward
//   errors             bad wrap policies, reading a released parameter, a plain load_state_dict
//                      into the sharded model
//   typed <ckpt 0|1> [reuse]
//                      tests/common/typed_model.h (units with two inputs, optional inputs, plain
//                      arguments, tuple and struct results; a weight tied across two units)
//                      vs single-process training, with or without per-unit checkpointing;
//                      reuse: one unit called twice in each forward
//   typed_deferred     the same model built under nn::DeferredInit: the tied weight's owner
//                      initialises it, the values equal eager construction
//   unused             a unit that gets no gradient: DistError; find_unused_parameters: zeros
//   bf16               param_dtype bf16 with fp32 master shards: close to fp32
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "core/generator.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "parallel/fsdp.h"
#include "comm/process_group.h"
#include "tests/common/typed_model.h"
#include "tests/common/worker_check.h"

using namespace accel;
using namespace accel::dist;

namespace {

using accel::test::g_failures;
using accel::test::g_rank;

constexpr int64_t kIn = 8, kHidden = 16, kClasses = 4, kBatch = 12, kSteps = 4, kBlocks = 3;

FullyShardedModel* g_fsdp = nullptr;  // for the memory probe inside blocks
int64_t g_max_gathered = 0;

// A residual MLP block: the unit.
struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc, out;
  explicit Block(Generator* gen) {
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(kHidden));
    fc = register_module("fc", std::make_shared<nn::Linear>(kHidden, 2 * kHidden, true, gen));
    out = register_module("out", std::make_shared<nn::Linear>(2 * kHidden, kHidden, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    if (g_fsdp) g_max_gathered = std::max(g_max_gathered, g_fsdp->memory().gathered_bytes);
    return x + out->forward(gelu(fc->forward(ln->forward(x))));
  }
};

// Root parameters in typed members (stem, head) around a ModuleList of blocks.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> stem, head, unused;
  std::shared_ptr<nn::ModuleList> blocks;
  bool skip_last = false;
  // default_gen: draw from the default generator (what deferred init replays) instead of a
  // private one.
  explicit Net(bool with_unused = false, bool default_gen = false) {
    Generator own(7);
    Generator* gen = default_gen ? nullptr : &own;
    stem = register_module("stem", std::make_shared<nn::Linear>(kIn, kHidden, true, gen));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < kBlocks; ++i) blocks->push_back(std::make_shared<Block>(gen));
    head = register_module("head", std::make_shared<nn::Linear>(kHidden, kClasses, true, gen));
    if (with_unused)
      unused = register_module("unused", std::make_shared<nn::Linear>(kHidden, 3, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = stem->forward(x);
    size_t i = 0;
    for (const auto& b : *blocks) {
      if (skip_last && ++i == blocks->size()) break;
      h = b->forward(h);
    }
    return head->forward(h);
  }
};

struct Batch {
  Tensor x, y;
};
Batch batch(int step) {
  Generator gen(uint64_t(100 + step));
  Tensor x = randn({kBatch, kIn}, TensorOptions(kFloat32), &gen);
  Tensor y = randint(0, kClasses, {kBatch}, TensorOptions(kInt64), &gen);
  return {x, y};
}
Batch local(const Batch& b, int64_t lo, int64_t n) {
  return {b.x.narrow(0, lo, n).contiguous(), b.y.narrow(0, lo, n).contiguous()};
}

// decay: weights; no decay: biases and norms (the transformer recipe).
std::vector<optim::ParamGroup> groups_of(const nn::Module& m) {
  optim::ParamGroup decay, no_decay;
  for (auto& [name, p] : m.named_parameters()) {
    const bool is_weight = name.size() > 6 && name.substr(name.size() - 6) == "weight" &&
                           name.find("ln") == std::string::npos;
    (is_weight ? decay : no_decay).params.push_back(p);
  }
  decay.weight_decay = 0.1;
  no_decay.weight_decay = 0.0;
  return {decay, no_decay};
}

optim::ParamGroup one_group(std::vector<Tensor> ps) {
  optim::ParamGroup g;
  g.params = std::move(ps);
  return g;
}

std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind,
                                           std::vector<optim::ParamGroup> groups) {
  if (kind == "sgd") {
    optim::SGDOptions o;
    o.lr(0.05);
    o.momentum(0.9);
    return std::make_unique<optim::SGD>(std::move(groups), o);
  }
  if (kind == "adam") {
    optim::AdamOptions o;
    o.lr(0.01);
    return std::make_unique<optim::Adam>(std::move(groups), o);
  }
  optim::AdamWOptions o;
  o.lr(0.01);
  return std::make_unique<optim::AdamW>(std::move(groups), o);
}

// Single-process reference: `steps` optimizer steps over `accum` micro-batches each.
std::pair<std::vector<double>, io::TensorDict> reference(const std::string& kind, int accum) {
  auto net = std::make_shared<Net>();
  auto opt = make_opt(kind, groups_of(*net));
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < accum; ++m) {
      Batch b = batch(s * accum + m);
      Tensor loss = div(cross_entropy(net->forward(b.x), b.y), double(accum));
      loss.backward();
      losses.push_back(loss.item<double>());
    }
    opt->step();
    opt->zero_grad();
  }
  io::TensorDict d = net->state_dict();
  for (auto& [k, v] : d) v = v.clone();
  return {losses, d};
}

bool close(const Tensor& a, const Tensor& b, double tol) {
  return a.sizes() == b.sizes() && max(abs(sub(a.to(kFloat64), b.to(kFloat64)))).item<double>() <=
                                       tol * (1 + max(abs(b.to(kFloat64))).item<double>());
}

int match(ProcessGroupPtr pg, const std::string& kind, int accum, bool prefetch, bool reshard,
          std::optional<DType> param_dtype = std::nullopt) {
  const int w = pg->size(), r = pg->rank();
  auto [ref_losses, ref_state] = reference(kind, accum);
  auto net = std::make_shared<Net>();
  FsdpOptions o;
  o.prefetch = prefetch;
  o.reshard_after_forward = reshard;
  o.param_dtype = param_dtype;
  FullyShardedModel fsdp(net, pg, o);
  WCHECK(fsdp.units().size() == 1 + kBlocks, "units " << fsdp.units().size());
  auto opt = make_opt(kind, fsdp.shard_param_groups(groups_of(*net)));
  const int64_t per = kBatch / w;
  const double tol = param_dtype ? 5e-2 : 1e-5;
  size_t li = 0;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < accum; ++m) {
      Batch b = local(batch(s * accum + m), r * per, per);
      Tensor out;
      {
        // bf16 parameters: the root's own layers run under autocast (units cast their inputs).
        AutocastGuard ac(param_dtype.has_value(), param_dtype.value_or(kBFloat16));
        out = net->forward(b.x);
      }
      Tensor loss = div(cross_entropy(out.to(kFloat32), b.y), double(accum));
      fsdp.backward(loss, m == accum - 1);
      // The global loss is the mean of the ranks' losses.
      Tensor l = loss.detach().clone();
      pg->all_reduce(l, ReduceOp::Avg);
      const double got = l.item<double>(), want = ref_losses[li++];
      WCHECK(std::abs(got - want) <= tol * (1 + std::abs(want)),
             "step " << s << " micro " << m << " loss " << got << " vs " << want);
    }
    fsdp.prepare_step();
    opt->step();
    fsdp.after_step();
    fsdp.zero_grad();
  }
  io::TensorDict full = fsdp.full_state_dict();
  for (auto& [k, v] : ref_state) {
    WCHECK(full.count(k), "missing " << k);
    if (full.count(k)) WCHECK(close(full[k], v, param_dtype ? 5e-2 : 2e-5), "parameter " << k);
  }
  return 0;
}

int memory(ProcessGroupPtr pg) {
  auto net = std::make_shared<Net>();
  FullyShardedModel fsdp(net, pg);
  auto units = fsdp.units();
  const int64_t root_bytes = units[0].numel * 4;
  int64_t unit_bytes = 0;
  for (size_t i = 1; i < units.size(); ++i) unit_bytes = std::max(unit_bytes, units[i].numel * 4);
  const int64_t slack = 4 * pg->size() * 4;  // padding
  auto opt = make_opt("adamw", fsdp.shard_param_groups({one_group(net->parameters())}));
  g_fsdp = &fsdp;
  for (int s = 0; s < 2; ++s) {
    FsdpMemory m = fsdp.memory();
    WCHECK(m.gathered_bytes <= root_bytes + slack,
           "between steps " << m.gathered_bytes << " gathered, root " << root_bytes);
    WCHECK(m.shard_bytes * pg->size() <= m.full_param_bytes + slack * 8,
           "shards " << m.shard_bytes << " of " << m.full_param_bytes);
    g_max_gathered = 0;
    Batch b = local(batch(s), 0, 4);
    Tensor loss = cross_entropy(net->forward(b.x), b.y);
    // The unit running plus at most the prefetched next one, besides the root.
    WCHECK(g_max_gathered <= root_bytes + 2 * unit_bytes + slack,
           "forward gathered " << g_max_gathered << " > root " << root_bytes << " + 2 x "
                               << unit_bytes);
    WCHECK(g_max_gathered >= root_bytes + unit_bytes, "forward gathered " << g_max_gathered);
    fsdp.backward(loss);
    WCHECK(fsdp.memory().unsharded_grad_bytes == 0, "full gradients left after a synced backward");
    fsdp.prepare_step();
    opt->step();
    fsdp.after_step();
    fsdp.zero_grad();
  }
  g_fsdp = nullptr;
  // Parameters of a unit between steps are released: reading one is a clear error.
  bool threw = false;
  try {
    (void)net->blocks->at<Block>(0)->fc->weight.sum().item<double>();
  } catch (const ValueError& e) {
    threw = std::string(e.what()).find("not allocated") != std::string::npos;
  }
  WCHECK(threw, "reading a released parameter did not raise ValueError");
  // The root stays usable: the stem is not released.
  WCHECK(std::isfinite(net->stem->weight.sum().item<double>()), "root parameter unreadable");
  // no_sync keeps full gradients (FSDP semantics) and says so in memory().
  Batch b = local(batch(9), 0, 4);
  fsdp.backward(cross_entropy(net->forward(b.x), b.y), false);
  WCHECK(fsdp.memory().unsharded_grad_bytes >= fsdp.memory().full_param_bytes - slack,
         "no_sync gradients " << fsdp.memory().unsharded_grad_bytes);
  WCHECK(fsdp.memory().gathered_bytes <= root_bytes + slack, "units left gathered after no_sync");
  fsdp.zero_grad();
  return 0;
}

template <typename E, typename F>
void expect_throw(F&& f, const std::string& needle, int line) {
  try {
    f();
  } catch (const E& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      std::cout << "rank " << g_rank << " line " << line << ": message lacks '" << needle
                << "': " << e.what() << std::endl;
      ++g_failures;
    }
    return;
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " line " << line << ": wrong exception: " << e.what()
              << std::endl;
    ++g_failures;
    return;
  }
  std::cout << "rank " << g_rank << " line " << line << ": no exception" << std::endl;
  ++g_failures;
}

bool bit_equal(const Tensor& a, const Tensor& b);

// A module that uses another module's weight (weight tying).
struct TiedUser : nn::Module {
  Tensor w;
  explicit TiedUser(Tensor shared) { w = register_parameter("w", std::move(shared)); }
  Tensor forward(const Tensor& x) override { return matmul(x, w); }
};

struct Tied : nn::Module {
  std::shared_ptr<nn::ModuleList> blocks;
  Tied() {
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    auto a = std::make_shared<nn::Linear>(4, 4);
    blocks->push_back(a);
    blocks->push_back(std::make_shared<TiedUser>(a->weight));
  }
};

int errors(ProcessGroupPtr pg) {
  {
    FsdpOptions o;
    o.wrap = FsdpOptions::Wrap::Classes;
    o.classes = {"NoSuchBlock"};
    expect_throw<DistError>([&] { FullyShardedModel f(std::make_shared<Net>(), pg, o); },
                            "NoSuchBlock", __LINE__);
    o.classes = {"Linear"};  // stem and head are typed members: cannot be hooked
    expect_throw<DistError>([&] { FullyShardedModel f(std::make_shared<Net>(), pg, o); },
                            "not an entry", __LINE__);
    o.classes = {};
    expect_throw<DistError>([&] { FullyShardedModel f(std::make_shared<Net>(), pg, o); },
                            "no class names", __LINE__);
    o.wrap = FsdpOptions::Wrap::MinParams;
    o.min_params = 0;
    expect_throw<DistError>([&] { FullyShardedModel f(std::make_shared<Net>(), pg, o); },
                            "min_params", __LINE__);
  }
  {
    // Note [tied parameters]: a weight used by two units lives in the root unit, once.
    auto tied = std::make_shared<Tied>();
    FullyShardedModel f(tied, pg);
    const auto units = f.units();
    WCHECK(units.size() == 3 && units[0].numel == 16 && units[1].numel == 4 && units[2].numel == 0,
           "tied weight not in the root: " << units[0].numel << " " << units[1].numel);
    WCHECK(f.full_parameter_order().size() == 2, "the tied weight is listed twice");
    io::TensorDict d = f.full_state_dict();
    WCHECK(d.count("blocks.1.w") && bit_equal(d.at("blocks.1.w"), d.at("blocks.0.weight")),
           "the alias does not carry the tied value");
  }
  {
    // By class: the blocks; by size: entries with >= 600 parameters (a Block has 1,104).
    FsdpOptions o;
    o.wrap = FsdpOptions::Wrap::Classes;
    o.classes = {"Block"};
    FullyShardedModel f(std::make_shared<Net>(), pg, o);
    WCHECK(f.units().size() == 1 + kBlocks && f.units()[1].type == "Block", "class policy");
  }
  {
    FsdpOptions o;
    o.wrap = FsdpOptions::Wrap::MinParams;
    o.min_params = 1 << 20;
    FullyShardedModel f(std::make_shared<Net>(), pg, o);
    WCHECK(f.units().size() == 1, "min_params policy: nothing that large, only the root");
  }
  {
    // An optimizer over parameters of another model.
    auto net = std::make_shared<Net>();
    FullyShardedModel f(net, pg);
    auto other = std::make_shared<Net>();
    expect_throw<ValueError>([&] { (void)f.shard_param_groups({one_group(other->parameters())}); },
                             "not a trainable parameter", __LINE__);
  }
  {
    // Note [sharded modules]: a plain load_state_dict into the sharded model, a unit (blocks) or
    // a root-unit module (head) is refused and changes nothing; load_full_parameters loads.
    auto net = std::make_shared<Net>();
    auto src = std::make_shared<Net>();
    {
      NoGradGuard ng;
      for (auto& [n, p] : src->named_parameters()) p.mul_(2.0);
    }
    const io::TensorDict want = src->state_dict(), orig = Net().state_dict();
    FullyShardedModel f(net, pg);
    const char* how = "load_full_parameters";
    expect_throw<ValueError>([&] { net->load_state_dict(want); }, how, __LINE__);
    expect_throw<ValueError>([&] { net->blocks->load_state_dict(src->blocks->state_dict()); }, how,
                             __LINE__);
    expect_throw<ValueError>([&] { net->head->load_state_dict(src->head->state_dict()); }, how,
                             __LINE__);
    io::TensorDict got = f.full_state_dict();
    for (const auto& [n, t] : orig) WCHECK(allclose(got.at(n), t, 0, 0), "changed: " << n);
    f.load_full_parameters([&](const std::string& n) { return want.at(n); });
    got = f.full_state_dict();
    for (const auto& [n, t] : want) WCHECK(allclose(got.at(n), t, 0, 0), "not loaded: " << n);
  }
  return 0;
}

int unused(ProcessGroupPtr pg) {
  {
    auto net = std::make_shared<Net>();
    net->skip_last = true;
    FullyShardedModel fsdp(net, pg);
    Batch b = local(batch(0), 0, 4);
    expect_throw<DistError>([&] { fsdp.backward(cross_entropy(net->forward(b.x), b.y)); },
                            "blocks.2", __LINE__);
    // The group is still in step: a normal backward works afterwards.
    net->skip_last = false;
    fsdp.zero_grad();
    fsdp.backward(cross_entropy(net->forward(b.x), b.y));
    WCHECK(fsdp.has_grads(), "no gradients after the recovery backward");
  }
  {
    auto net = std::make_shared<Net>();
    net->skip_last = true;
    FsdpOptions o;
    o.find_unused_parameters = true;
    FullyShardedModel fsdp(net, pg, o);
    Batch b = local(batch(0), 0, 4);
    fsdp.backward(cross_entropy(net->forward(b.x), b.y));
    fsdp.prepare_step();
    // The skipped block's gradient shard is zero.
    const auto sp = fsdp.spans();
    for (size_t k = 0; k < sp.size(); ++k)
      if (sp[k].name.rfind("blocks.2.", 0) == 0 && sp[k].hi > sp[k].lo)
        WCHECK(fsdp.shard_params()[k].grad().abs().sum().item<double>() == 0, sp[k].name);
  }
  return 0;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// A model built under nn::DeferredInit is materialized unit by unit while it is sharded: the
// same values as eager construction, and never more than the root plus one unit in memory.
int deferred(ProcessGroupPtr pg) {
  manual_seed(11);
  auto eager = std::make_shared<Net>(false, true);
  const io::TensorDict want = eager->state_dict();
  manual_seed(11);
  std::shared_ptr<Net> net;
  {
    nn::DeferredInit d;
    net = std::make_shared<Net>(false, true);
  }
  WCHECK(nn::is_deferred(*net), "not deferred");
  Allocator* a = get_allocator(kCPU);
  a->reset_peak_stats();
  const size_t before = a->stats().bytes_in_use;
  FullyShardedModel fsdp(net, pg);
  const size_t peak = a->stats().peak_bytes_in_use - before;
  const auto units = fsdp.units();
  int64_t unit_bytes = 0;
  for (size_t i = 1; i < units.size(); ++i) unit_bytes = std::max(unit_bytes, units[i].numel * 4);
  int64_t total = 0;
  for (auto& u : units) total += u.numel * 4;
  // root + one unit (its parameters and their flat copy) + the shards, never the whole model.
  WCHECK(int64_t(peak) <= units[0].numel * 4 * 2 + 2 * unit_bytes + total / pg->size() + 65536,
         "peak " << peak << " bytes while sharding a deferred model of " << total);
  io::TensorDict got = fsdp.full_state_dict();
  for (auto& [k, v] : want)
    WCHECK(got.count(k) && bit_equal(got.at(k), v), "deferred " << k << " differs from eager");
  return 0;
}

// Activation checkpointing per unit: the same gradient shards, bit for bit, as without.
int act_ckpt(ProcessGroupPtr pg) {
  std::vector<std::vector<Tensor>> grads(2);
  std::vector<double> losses[2];
  for (int with = 0; with < 2; ++with) {
    auto net = std::make_shared<Net>();
    FsdpOptions o;
    o.activation_checkpointing = with == 1;
    FullyShardedModel fsdp(net, pg, o);
    auto opt = make_opt("adamw", fsdp.shard_param_groups(groups_of(*net)));
    for (int s = 0; s < 3; ++s) {
      Batch b = local(batch(s), pg->rank() * (kBatch / pg->size()), kBatch / pg->size());
      Tensor loss = cross_entropy(net->forward(b.x), b.y);
      fsdp.backward(loss);
      losses[with].push_back(loss.item<double>());
      fsdp.prepare_step();
      if (s == 2)
        for (const Tensor& leaf : fsdp.shard_params())
          grads[size_t(with)].push_back(leaf.grad().defined() ? leaf.grad().clone() : Tensor());
      opt->step();
      fsdp.after_step();
      fsdp.zero_grad();
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    if (grads[0][i].defined())
      WCHECK(bit_equal(grads[0][i], grads[1][i]), "gradient shard " << i << " differs");
  for (size_t i = 0; i < losses[0].size(); ++i)
    WCHECK(losses[0][i] == losses[1][i],
           "loss " << i << ": " << losses[0][i] << " vs " << losses[1][i]);
  return 0;
}
// Note [module calls]: typed units (called through their typed operator() and through the entry's
// call<R>) and a weight tied across units, against one process.
int typed(ProcessGroupPtr pg, bool checkpointing, bool reuse) {
  const int w = pg->size(), r = pg->rank();
  auto batch_of = [](int step) {
    Generator gen(uint64_t(300 + step));
    Tensor x = randn({kBatch, test::kTypedIn}, TensorOptions(kFloat32), &gen);
    Tensor y = randint(0, test::kTypedClasses, {kBatch}, TensorOptions(kInt64), &gen);
    return Batch{x, y};
  };
  std::vector<double> ref_losses;
  auto ref = std::make_shared<test::TypedNet>();
  ref->reuse = reuse;
  {
    auto opt = make_opt("sgd", {one_group(ref->parameters())});
    for (int s = 0; s < kSteps; ++s) {
      Batch b = batch_of(s);
      Tensor loss = test::typed_loss((*ref)(b.x), b.y);
      loss.backward();
      ref_losses.push_back(loss.item<double>());
      opt->step();
      opt->zero_grad();
    }
  }
  auto net = std::make_shared<test::TypedNet>();
  net->reuse = reuse;
  FsdpOptions o;
  o.activation_checkpointing = checkpointing;
  FullyShardedModel fsdp(net, pg, o);
  const auto units = fsdp.units();
  // stem (8x6 + 8) and the tied fc.weight (8x8) in the root; each block unit without it.
  WCHECK(units.size() == 4 && units[0].numel == 56 + 64 && units[2].numel == 8 + 8 + 8 + 64,
         "units " << units.size() << ": root " << units[0].numel << ", block 1 " << units[2].numel);
  auto opt = make_opt("sgd", fsdp.shard_param_groups({one_group(net->parameters())}));
  const int64_t per = kBatch / w;
  for (int s = 0; s < kSteps; ++s) {
    Batch b = local(batch_of(s), r * per, per);
    Tensor loss = test::typed_loss((*net)(b.x), b.y);
    fsdp.backward(loss);
    Tensor l = loss.detach().clone();
    pg->all_reduce(l, ReduceOp::Avg);
    WCHECK(std::abs(l.item<double>() - ref_losses[size_t(s)]) <= 1e-5 * (1 + ref_losses[size_t(s)]),
           "step " << s << " loss " << l.item<double>() << " vs " << ref_losses[size_t(s)]);
    fsdp.prepare_step();
    opt->step();
    fsdp.after_step();
    fsdp.zero_grad();
  }
  // Evaluation without grad goes through the units too.
  {
    NoGradGuard ng;
    Batch b = batch_of(0);
    test::HeadOut e = (*net)(b.x), want = (*ref)(b.x);
    WCHECK(close(e.logits, want.logits, 2e-5), "evaluation logits differ");
  }
  io::TensorDict full = fsdp.full_state_dict();
  for (auto& [k, v] : ref->state_dict()) {
    WCHECK(full.count(k), "missing " << k);
    if (full.count(k)) WCHECK(close(full[k], v, 2e-5), "parameter " << k);
  }
  return 0;
}

int typed_deferred(ProcessGroupPtr pg) {
  manual_seed(13);
  auto eager = std::make_shared<test::TypedNet>(true, true);
  const io::TensorDict want = eager->state_dict();
  manual_seed(13);
  std::shared_ptr<test::TypedNet> net;
  {
    nn::DeferredInit d;
    net = std::make_shared<test::TypedNet>(true, true);
  }
  WCHECK(nn::is_deferred(*net), "not deferred");
  FullyShardedModel fsdp(net, pg);
  io::TensorDict got = fsdp.full_state_dict();
  for (auto& [k, v] : want)
    WCHECK(got.count(k) && bit_equal(got.at(k), v), "deferred " << k << " differs from eager");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) return 2;
    auto pg = init_process_group();
    g_rank = pg->rank();
    const std::string& s = args[0];
    if (s == "match") {
      const bool prefetch = args.size() <= 3 || args[3] == "1";
      const bool reshard = args.size() <= 4 || args[4] == "1";
      match(pg, args.at(1), std::stoi(args.at(2)), prefetch, reshard);
    } else if (s == "memory") {
      memory(pg);
    } else if (s == "errors") {
      errors(pg);
    } else if (s == "unused") {
      unused(pg);
    } else if (s == "act_ckpt") {
      act_ckpt(pg);
    } else if (s == "deferred") {
      deferred(pg);
    } else if (s == "typed") {
      typed(pg, args.at(1) == "1", args.size() > 2 && args[2] == "reuse");
    } else if (s == "typed_deferred") {
      typed_deferred(pg);
    } else if (s == "bf16") {
      match(pg, "adamw", 1, true, true, kBFloat16);
    } else {
      std::cout << "unknown scenario " << s << std::endl;
      return 2;
    }
    pg->barrier();
    if (g_failures) return 1;
    std::cout << "ok " << s << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " exception: " << e.what() << std::endl;
    return 2;
  }
}
