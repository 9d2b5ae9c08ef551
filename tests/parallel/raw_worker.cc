// Worker for parallel/'s raw entry points used the way PyTorch's tutorials write them (issue 36):
// forward through the wrapper, a plain loss.backward(), opt.step(), opt.zero_grad(), in float64,
// against one process on the full batch (1e-12) and against the explicit calls (bit for bit).
// `raw_worker <scenario>` under the env contract; exit 0 passed, 1 check failed, 2 unexpected
// exception.
//   ddp_plain      DDP: ddp.forward / loss.backward(); replicas identical, gradients bit for bit
//                  those of ddp.backward(loss), finish_gradient_sync() afterwards a no-op, the
//                  model called directly (no buffers) the same numbers
//   ddp_accum      no_sync() micro-batches, then synced ones, plain backward; two synced plain
//                  backwards per step; unused parameters (DistError from loss.backward() on
//                  every rank; find_unused_parameters: zeros)
//   ddp_direct_bn  a batch-norm model called directly after wrapping: DistError naming it on
//                  every rank, before any collective of that backward; the wrapper works after
//   zero_plain <1|2>
//                  ZeroOptimizer: zero.forward / loss.backward() / zero.step() / zero.zero_grad()
//   fsdp_plain     FullyShardedModel: fsdp(x) / loss.backward() / opt.step() / opt.zero_grad()
//                  (no prepare_step / after_step), with accumulation, against the explicit calls
//   fsdp_stale     the model called directly after opt.step() without after_step(): DistError on
//                  every rank at its backward, also on the rank whose root slice is empty
//   hsdp_plain     world 4, replicate 2 x shard 2: FSDP and ZeRO-2 through the same raw loop
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "autograd/ops.h"
#include "optim/sgd.h"
#include "comm/process_group.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "parallel/ddp.h"
#include "parallel/fsdp.h"
#include "parallel/zero.h"
#include "tests/common/worker_check.h"
#include "tests/common/util.h"

using namespace accel;
using namespace accel::dist;
using accel::test::contains;

namespace {

using accel::test::g_failures;
using accel::test::g_rank;

constexpr int64_t kIn = 8, kHidden = 16, kClasses = 4, kBatch = 12;
constexpr int kSteps = 3;
constexpr double kTol = 1e-12;  // float64: one process on the full batch vs the ranks' average

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3, unused;
  explicit Net(bool with_unused = false) {
    Generator gen(7);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, kHidden, true, &gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kHidden, true, &gen));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(kHidden, kClasses, true, &gen));
    if (with_unused)
      unused = register_module("unused", std::make_shared<nn::Linear>(kHidden, 3, true, &gen));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    return fc3->forward(relu(fc2->forward(relu(fc1->forward(x)))));
  }
};

// Batch statistics as buffers: what DDP's forward broadcasts.
struct BnNet : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::BatchNorm1d> bn;
  BnNet() {
    Generator gen(9);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kIn, kHidden, true, &gen));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(kHidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kClasses, true, &gen));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    return fc2->forward(relu(bn->forward(fc1->forward(x))));
  }
};

// BnNet with its whole forward under activation checkpointing: the recompute inside the
// backward updates the batch statistics again before the first parameter gradient arrives.
struct CkptBnNet : BnNet {
  Tensor forward(const Tensor& x) override {
    return autograd::checkpoint([this](const Tensor& t) { return BnNet::forward(t); }, x);
  }
};

// FSDP units: the ModuleList's three layers; the root unit is `scale` alone, one element, so
// with two ranks rank 1's slice of the root holds none of it (an optimizer step changes only
// rank 0's root shard).
struct FNet : nn::Module {
  std::shared_ptr<nn::ModuleList> layers;
  Tensor scale;
  FNet() {
    Generator gen(11);
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    layers->push_back(std::make_shared<nn::Linear>(kIn, kHidden, true, &gen));
    layers->push_back(std::make_shared<nn::Linear>(kHidden, kHidden, true, &gen));
    layers->push_back(std::make_shared<nn::Linear>(kHidden, kClasses, true, &gen));
    scale = register_parameter("scale", full({1}, Scalar(1.5)));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu((*layers)[0]->forward(x));
    h = relu((*layers)[1]->forward(h));
    return mul((*layers)[2]->forward(h), scale);
  }
};

struct Batch {
  Tensor x, y;
};
Batch batch(int step) {
  Generator gen(uint64_t(100 + step));
  Tensor x = randn({kBatch, kIn}, TensorOptions(kFloat64), &gen);
  Tensor y = randint(0, kClasses, {kBatch}, TensorOptions(kInt64), &gen);
  return {x, y};
}
Batch rows(const Batch& b, int64_t lo, int64_t n) {
  return {b.x.narrow(0, lo, n).contiguous(), b.y.narrow(0, lo, n).contiguous()};
}
Batch local(const Batch& b, int rank, int world) {
  const int64_t per = kBatch / world;
  return rows(b, rank * per, per);
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.lr(0.1);
  o.momentum(0.9);
  o.weight_decay(0.01);
  return o;
}

// One process, the full batch, `steps` SGD steps.
template <typename M, typename... A>
std::shared_ptr<M> reference(int steps, A... args) {
  auto net = std::make_shared<M>(args...);
  optim::SGD opt(net->parameters(), sgd_options());
  for (int s = 0; s < steps; ++s) {
    Batch b = batch(s);
    cross_entropy(net->forward(b.x), b.y).backward();
    opt.step();
    opt.zero_grad();
  }
  return net;
}

double max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return 1e30;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined() || (a[i].defined() && a[i].sizes() != b[i].sizes()))
      return 1e30;
    if (a[i].defined()) m = std::max(m, max(abs(sub(a[i], b[i]))).item<double>());
  }
  return m;
}
double max_diff(const nn::Module& a, const nn::Module& b) {
  return max_diff(a.parameters(), b.parameters());
}
std::vector<Tensor> grads_of(const nn::Module& m) {
  std::vector<Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return g;
}

// The largest difference between this rank's parameters and rank 0's (0: identical replicas).
double diff_to_rank0(ProcessGroup& pg, const nn::Module& m) {
  std::vector<Tensor> flat;
  for (auto& p : m.parameters()) flat.push_back(p.detach().reshape({p.numel()}));
  Tensor mine = cat(flat, 0).contiguous();
  Tensor theirs = mine.clone();
  pg.broadcast(theirs, 0);
  return max(abs(sub(mine, theirs))).item<double>();
}

void perturb_unless_root(nn::Module& m, int rank) {
  // Ranks start from different values: the wrappers broadcast rank 0's.
  if (rank == 0) return;
  NoGradGuard ng;
  for (auto& p : m.parameters()) p.add_(ones_like(p), double(rank) * 0.37);
}

// Runs fn, which must throw DistError; returns its message ("" and a failed check otherwise).
template <typename F>
std::string dist_error(const char* what, F fn) {
  try {
    fn();
  } catch (const DistError& e) {
    return e.what();
  } catch (const std::exception& e) {
    WCHECK(false, what << ": not a DistError: " << e.what());
    return "";
  }
  WCHECK(false, what << ": no error");
  return "";
}

// ---- DDP -----------------------------------------------------------------------------------

void scenario_ddp_plain(ProcessGroup& pg) {
  const int r = pg.rank(), w = pg.size();
  auto ref = reference<Net>(kSteps);
  // plain: the tutorial; expl: ddp.backward(loss); direct: the model called directly.
  auto plain = std::make_shared<Net>(), expl = std::make_shared<Net>(),
       direct = std::make_shared<Net>();
  for (auto* m : {plain.get(), expl.get(), direct.get()}) perturb_unless_root(*m, r);
  DDPOptions o;
  o.bucket_cap_bytes = 256;  // several buckets
  DistributedDataParallel dp(plain, nullptr, o), de(expl, nullptr, o), dd(direct, nullptr, o);
  WCHECK(dp.buckets().size() > 2, "buckets " << dp.buckets().size());
  optim::SGD op(plain->parameters(), sgd_options()), oe(expl->parameters(), sgd_options()),
      od(direct->parameters(), sgd_options());
  for (int s = 0; s < kSteps; ++s) {
    Batch b = local(batch(s), r, w);
    Tensor loss = cross_entropy(dp.forward(b.x), b.y);
    loss.backward();
    const auto g = grads_of(*plain);
    // Code written for the explicit sync still works: a no-op now (no collective, no error).
    dp.finish_gradient_sync();
    dp.finish_gradient_sync();
    WCHECK(max_diff(g, grads_of(*plain)) == 0, "finish_gradient_sync changed the gradients");
    de.backward(cross_entropy(de.forward(b.x), b.y));
    WCHECK(max_diff(g, grads_of(*expl)) == 0,
           "step " << s << ": plain backward vs ddp.backward gradients differ by "
                   << max_diff(g, grads_of(*expl)));
    // DDP's hooks are on the parameters: a direct call syncs the same (no buffers to broadcast).
    Tensor out = s % 2 ? direct->forward(b.x) : (*direct)(b.x);
    cross_entropy(out, b.y).backward();
    WCHECK(max_diff(g, grads_of(*direct)) == 0, "step " << s << ": direct call gradients differ");
    op.step();
    op.zero_grad();
    oe.step();
    oe.zero_grad();
    od.step();
    od.zero_grad();
  }
  const double d = max_diff(*plain, *ref), replicas = diff_to_rank0(pg, *plain);
  std::cout << "rank " << r << " ddp plain backward: max |param - one process| = " << d
            << ", |param - rank 0's| = " << replicas << std::endl;
  WCHECK(d < kTol, "plain backward differs from one process by " << d);
  WCHECK(replicas == 0, "replicas differ by " << replicas);
  WCHECK(max_diff(*plain, *expl) == 0, "plain vs ddp.backward parameters differ");
  WCHECK(max_diff(*plain, *direct) == 0, "plain vs direct-call parameters differ");
}

void scenario_ddp_accum(ProcessGroup& pg) {
  const int r = pg.rank(), w = pg.size();
  auto ref = reference<Net>(kSteps);
  const int64_t per = kBatch / w, half = per / 2;
  // mode 0: no_sync() for the first half, plain backward; 1: the same with ddp.backward;
  // 2: two synced plain backwards (each averages; .grad accumulates the averages).
  std::vector<std::shared_ptr<Net>> nets;
  for (int mode = 0; mode < 3; ++mode) {
    auto net = std::make_shared<Net>();
    perturb_unless_root(*net, r);
    DistributedDataParallel ddp(net);
    optim::SGD opt(net->parameters(), sgd_options());
    for (int s = 0; s < kSteps; ++s) {
      Batch b = local(batch(s), r, w);
      Batch b1 = rows(b, 0, half), b2 = rows(b, half, per - half);
      auto loss_of = [&](const Batch& mb) {
        return mul(cross_entropy(ddp.forward(mb.x), mb.y), double(mb.x.size(0)) / double(per));
      };
      if (mode == 2) {
        loss_of(b1).backward();
        loss_of(b2).backward();
      } else {
        {
          auto guard = ddp.no_sync();
          if (mode == 0)
            loss_of(b1).backward();
          else
            ddp.backward(loss_of(b1));
        }
        if (mode == 0)
          loss_of(b2).backward();
        else
          ddp.backward(loss_of(b2));
      }
      opt.step();
      opt.zero_grad();
    }
    const double d = max_diff(*net, *ref);
    std::cout << "rank " << r << " ddp accumulation mode " << mode
              << ": max |param - one process| = " << d << std::endl;
    WCHECK(d < kTol, "accumulation mode " << mode << " differs from one process by " << d);
    WCHECK(diff_to_rank0(pg, *net) == 0, "accumulation mode " << mode << ": replicas differ");
    nets.push_back(net);
  }
  WCHECK(max_diff(*nets[0], *nets[1]) == 0, "no_sync: plain vs ddp.backward differ");

  // Unused parameters: the error comes out of loss.backward() on every rank, and again next time.
  {
    auto net = std::make_shared<Net>(/*with_unused=*/true);
    DistributedDataParallel ddp(net);
    Batch b = local(batch(0), r, w);
    for (int k = 0; k < 2; ++k) {
      std::string msg =
          dist_error("unused", [&] { cross_entropy(ddp.forward(b.x), b.y).backward(); });
      std::cout << "rank " << r << " unused: " << msg << std::endl;
      WCHECK(contains(msg, "unused.weight") && contains(msg, "unused.bias") &&
                 contains(msg, "find_unused_parameters"),
             "unused parameters not named: " << msg);
      net->zero_grad();
    }
  }
  {
    // Plain SGD: the unused parameters get a zero gradient here and none in one process, which
    // weight decay or momentum would tell apart.
    optim::SGDOptions so;
    so.lr(0.1);
    auto plain_ref = std::make_shared<Net>(true);
    optim::SGD ref_opt(plain_ref->parameters(), so);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = batch(s);
      cross_entropy(plain_ref->forward(b.x), b.y).backward();
      ref_opt.step();
      ref_opt.zero_grad();
    }
    auto net = std::make_shared<Net>(true);
    DDPOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(net, nullptr, o);
    optim::SGD opt(net->parameters(), so);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = local(batch(s), r, w);
      cross_entropy(ddp.forward(b.x), b.y).backward();
      opt.step();
      opt.zero_grad();
    }
    const double d = max_diff(*net, *plain_ref);
    WCHECK(d < kTol, "find_unused_parameters with plain backward differs by " << d);
  }
}

void scenario_ddp_direct_bn(ProcessGroup& pg) {
  const int r = pg.rank(), w = pg.size();
  auto net = std::make_shared<BnNet>();
  perturb_unless_root(*net, r);
  DistributedDataParallel ddp(net);
  Batch b = local(batch(0), r, w);
  // Through the wrapper: fine.
  cross_entropy(ddp.forward(b.x), b.y).backward();
  net->zero_grad();
  // Called directly: its batch statistics were updated without the broadcast before.
  for (int how = 0; how < 2; ++how) {
    std::string msg = dist_error("direct call", [&] {
      Tensor out = how == 0 ? net->forward(b.x) : (*net)(b.x);
      cross_entropy(out, b.y).backward();
    });
    std::cout << "rank " << r << " direct call " << how << ": " << msg << std::endl;
    WCHECK(contains(msg, "[ddp]") && contains(msg, "BnNet") && contains(msg, "bn.running_mean") &&
               contains(msg, "ddp.forward(x)"),
           "the error does not name the model, its buffers and the wrapper: " << msg);
    net->zero_grad();
  }
  // A forward through the wrapper whose backward recomputes it (activation checkpointing) is
  // not a direct call, though its buffers change again inside the backward; mixed with a direct
  // call in one loss, it is.
  {
    auto ck = std::make_shared<CkptBnNet>();
    DistributedDataParallel dck(ck);
    for (int s = 0; s < 2; ++s) {
      cross_entropy(dck.forward(b.x), b.y).backward();
      ck->zero_grad();
    }
    std::string msg = dist_error("wrapper and direct call in one loss", [&] {
      Tensor out = dck.forward(b.x);
      add(cross_entropy(out, b.y), cross_entropy(ck->forward(b.x), b.y)).backward();
    });
    WCHECK(contains(msg, "CkptBnNet") && contains(msg, "ddp.forward(x)"), "mixed call: " << msg);
    ck->zero_grad();
  }
  // No collective was left half done: the wrapper syncs as before on every rank.
  for (int s = 0; s < 2; ++s) {
    cross_entropy(ddp.forward(b.x), b.y).backward();
    Tensor g = net->fc1->weight.grad().clone();
    Tensor g0 = g.clone();
    pg.broadcast(g0, 0);
    WCHECK(max(abs(sub(g, g0))).item<double>() == 0,
           "gradients differ across ranks after the error");
    net->zero_grad();
  }
}

// ---- ZeRO 1/2 ------------------------------------------------------------------------------

void scenario_zero_plain(ProcessGroup& pg, int stage) {
  const int r = pg.rank(), w = pg.size();
  auto ref = reference<Net>(kSteps);
  auto factory = [](std::vector<Tensor> ps) {
    return std::make_unique<optim::SGD>(std::move(ps), sgd_options());
  };
  ZeroOptions zo;
  zo.stage = stage;
  zo.bucket_cap_bytes = 256;
  // plain: zero.forward + loss.backward(); expl: zero.backward(loss); direct: the model itself.
  std::vector<std::shared_ptr<Net>> nets;
  for (int mode = 0; mode < 3; ++mode) {
    auto net = std::make_shared<Net>();
    perturb_unless_root(*net, r);
    ZeroOptimizer zero(net, factory, nullptr, zo);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = local(batch(s), r, w);
      if (mode == 0) {
        cross_entropy(zero.forward(b.x), b.y).backward();
        zero.finish_gradient_sync();  // a no-op after a backward that synced itself
      } else if (mode == 1) {
        zero.backward(cross_entropy(zero.forward(b.x), b.y));
      } else {
        cross_entropy(net->forward(b.x), b.y).backward();
      }
      zero.step();
      zero.zero_grad();
    }
    const double d = max_diff(*net, *ref);
    std::cout << "rank " << r << " zero" << stage << " mode " << mode
              << ": max |param - one process| = " << d << std::endl;
    WCHECK(d < kTol, "zero" << stage << " mode " << mode << " differs from one process by " << d);
    WCHECK(diff_to_rank0(pg, *net) == 0,
           "zero" << stage << " mode " << mode << ": replicas differ");
    nets.push_back(net);
  }
  WCHECK(max_diff(*nets[0], *nets[1]) == 0, "plain vs zero.backward differ");
  WCHECK(max_diff(*nets[0], *nets[2]) == 0, "plain vs direct call differ");
}

// ---- FSDP ----------------------------------------------------------------------------------

optim::ParamGroup group_of(std::vector<Tensor> ps) {
  optim::ParamGroup g;
  g.params = std::move(ps);
  return g;
}

double fsdp_diff(FullyShardedModel& fsdp, const nn::Module& ref) {
  io::TensorDict full = fsdp.full_state_dict();
  double m = 0;
  for (auto& [name, p] : ref.named_parameters()) {
    if (!full.count(name)) return 1e30;
    m = std::max(m, max(abs(sub(full[name], p))).item<double>());
  }
  return m;
}

void scenario_fsdp_plain(ProcessGroupPtr pg, ProcessGroupPtr replicate, int64_t lo, int64_t n) {
  const int r = pg->rank();
  auto ref = reference<FNet>(kSteps);
  FsdpOptions fo;
  fo.replicate = replicate;
  // 0: fsdp(x), plain backward, opt.step(), opt.zero_grad(); 1: the explicit split step;
  // 2: model->forward + after_step(), zero_grad(false); 3: two synced plain backwards per step.
  std::vector<std::unique_ptr<FullyShardedModel>> models;
  for (int mode = 0; mode < 4; ++mode) {
    auto net = std::make_shared<FNet>();
    perturb_unless_root(*net, r);
    auto fsdp = std::make_unique<FullyShardedModel>(net, pg, fo);
    WCHECK(fsdp->units().size() == 4 && fsdp->units()[0].numel == 1,
           "units " << fsdp->units().size() << ", root of " << fsdp->units()[0].numel);
    optim::SGD opt(fsdp->shard_param_groups({group_of(net->parameters())}), sgd_options());
    for (int s = 0; s < kSteps; ++s) {
      Batch b = rows(batch(s), lo, n);
      if (mode == 0) {
        Tensor out = s % 2 ? fsdp->forward(b.x) : (*fsdp)(b.x);
        cross_entropy(out, b.y).backward();
        opt.step();
        opt.zero_grad();
      } else if (mode == 1) {
        fsdp->backward(cross_entropy(net->forward(b.x), b.y));
        fsdp->prepare_step();
        opt.step();
        fsdp->after_step();
        fsdp->zero_grad();
      } else if (mode == 2) {
        cross_entropy(net->forward(b.x), b.y).backward();
        opt.step();
        fsdp->after_step();
        opt.zero_grad(/*set_to_none=*/false);
      } else {
        const int64_t h = n / 2;
        for (Batch mb : {rows(b, 0, h), rows(b, h, n - h)})
          mul(cross_entropy(fsdp->forward(mb.x), mb.y), double(mb.x.size(0)) / double(n))
              .backward();
        opt.step();
        opt.zero_grad();
      }
    }
    const double d = fsdp_diff(*fsdp, *ref);
    std::cout << "rank " << r << " fsdp mode " << mode << ": max |param - one process| = " << d
              << std::endl;
    WCHECK(d < kTol, "fsdp mode " << mode << " differs from one process by " << d);
    models.push_back(std::move(fsdp));
  }
  io::TensorDict a = models[0]->full_state_dict(), b = models[1]->full_state_dict();
  for (auto& [k, v] : a)
    WCHECK(b.count(k) && max(abs(sub(v, b[k]))).item<double>() == 0,
           "plain vs explicit split step differ in " << k);
}

// `nonempty_only`: the optimizer holds only this rank's non-empty slices, so on the rank whose
// slice of the one-element root is empty nothing writes the root's shard: only the ranks'
// agreement (the flag all-reduce) makes that rank re-gather or raise with the others.
void scenario_fsdp_stale(ProcessGroupPtr pg) {
  const int r = pg->rank(), w = pg->size();
  for (bool nonempty_only : {false, true}) {
    auto net = std::make_shared<FNet>();
    FullyShardedModel fsdp(net, pg);
    auto groups = fsdp.shard_param_groups({group_of(net->parameters())});
    if (nonempty_only) {
      std::vector<Tensor> kept;
      for (const Tensor& t : groups[0].params)
        if (t.numel() > 0) kept.push_back(t);
      groups[0].params = kept;
    }
    optim::SGD opt(groups, sgd_options());
    Batch b = local(batch(0), r, w);
    // Before any step a direct call is harmless.
    cross_entropy(net->forward(b.x), b.y).backward();
    opt.step();
    opt.zero_grad();
    // After the step the root unit (scale) still holds its old value: the backward refuses.
    std::string msg =
        dist_error("stale root", [&] { cross_entropy(net->forward(b.x), b.y).backward(); });
    std::cout << "rank " << r
              << " stale root (optimizer over non-empty slices only: " << nonempty_only
              << "): " << msg << std::endl;
    WCHECK(contains(msg, "[fsdp]") && contains(msg, "FNet") && contains(msg, "scale") &&
               contains(msg, "fsdp.forward(x)") && contains(msg, "after_step"),
           "the error does not name the model, the root parameters and the fix: " << msg);
    fsdp.zero_grad();  // the failed backward's partial gradients
    // after_step() fixes it; fsdp(x) after the next step does it by itself, on every rank.
    fsdp.after_step();
    cross_entropy(net->forward(b.x), b.y).backward();
    opt.step();
    opt.zero_grad();
    cross_entropy(fsdp(b.x), b.y).backward();
    opt.step();
    opt.zero_grad();
    // The root every rank uses after a forward is the stepped one.
    Tensor stepped = fsdp.full_state_dict()["scale"];
    fsdp(b.x);
    Tensor used = net->scale.detach().clone();
    WCHECK(max(abs(sub(used, stepped))).item<double>() == 0,
           "the root in use " << used.item<double>() << ", its shards " << stepped.item<double>());
  }
}

// ---- HSDP ----------------------------------------------------------------------------------

// World 4 as replicate 2 x shard 2: shard groups {0,1}, {2,3}; replicate groups {0,2}, {1,3}.
void scenario_hsdp_plain(ProcessGroup& world) {
  const int r = world.rank();
  WCHECK(world.size() == 4, "hsdp_plain needs 4 ranks");
  ProcessGroupPtr s0 = new_group({0, 1}), s1 = new_group({2, 3});
  ProcessGroupPtr r0 = new_group({0, 2}), r1 = new_group({1, 3});
  ProcessGroupPtr shard = r < 2 ? s0 : s1, replicate = r % 2 == 0 ? r0 : r1;
  const int64_t per = kBatch / 4;
  scenario_fsdp_plain(shard, replicate, r * per, per);
  // ZeRO-2 over the shard group, replicated across the other: the raw loop.
  auto ref = reference<Net>(kSteps);
  auto net = std::make_shared<Net>();
  ZeroOptions zo;
  zo.stage = 2;
  zo.bucket_cap_bytes = 256;
  zo.replicate = replicate;
  ZeroOptimizer zero(
      net,
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::SGD>(std::move(ps), sgd_options());
      },
      shard, zo);
  for (int s = 0; s < kSteps; ++s) {
    Batch b = rows(batch(s), r * per, per);
    cross_entropy(zero.forward(b.x), b.y).backward();
    zero.step();
    zero.zero_grad();
  }
  const double d = max_diff(*net, *ref);
  std::cout << "rank " << r << " hsdp zero2: max |param - one process| = " << d << std::endl;
  WCHECK(d < kTol, "hsdp zero2 differs from one process by " << d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: raw_worker <scenario> [args]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    InitOptions io;
    io.timeout = std::chrono::milliseconds(30000);
    auto pg = init_process_group(io);
    g_rank = pg->rank();
    const int w = pg->size(), r = pg->rank();
    if (scenario == "ddp_plain") {
      scenario_ddp_plain(*pg);
    } else if (scenario == "ddp_accum") {
      scenario_ddp_accum(*pg);
    } else if (scenario == "ddp_direct_bn") {
      scenario_ddp_direct_bn(*pg);
    } else if (scenario == "zero_plain" && argc >= 3) {
      scenario_zero_plain(*pg, std::atoi(argv[2]));
    } else if (scenario == "fsdp_plain") {
      scenario_fsdp_plain(pg, nullptr, r * (kBatch / w), kBatch / w);
    } else if (scenario == "fsdp_stale") {
      scenario_fsdp_stale(pg);
    } else if (scenario == "hsdp_plain") {
      scenario_hsdp_plain(*pg);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 2;
    }
    if (g_failures == 0) std::cout << "rank " << g_rank << " ok " << scenario << std::endl;
    pg->barrier();
    pg.reset();
    destroy_process_group();
  } catch (const std::exception& e) {
    std::cout << "rank " << g_rank << " unexpected exception: " << e.what() << std::endl;
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
