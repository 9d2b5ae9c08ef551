// DdpStrategy: replicated models whose gradients DistributedDataParallel averages on sync steps.
//
// Note [gradient sync]
// Each prepared model with trainable parameters gets a DistributedDataParallel (parallel/ddp.h).
// Its gradient hooks are armed while the facade is on a sync step outside no_sync()
// (Strategy::set_sync) and paused (DDP's no_sync) otherwise: armed, each bucket is all-reduced
// (Avg) as soon as its gradients are ready, overlapping the rest of backward, and at the end of
// the backward DDP itself waits for the buckets of every model that got gradients (an
// end-of-backward callback, Note [sync at the end of backward] in parallel/buckets.cc). This
// holds for Accelerator::backward and for a plain loss.backward() of the user's alike (Note
// [plain backward] in accelerate/accelerator.cc), as PyTorch DDP's hooks do.
// Micro-batches of an accumulation window (non-sync steps, no_sync()) only accumulate locally;
// the sync step's backward averages the accumulated sum, so k micro-batches per rank over W
// ranks produce the gradient of the whole k*W batch, as one process would. A model whose
// parameters got no gradient in a backward (a second model of a GAN, say) is not synced by it;
// one that got only some raises DDP's unused-parameter error unless
// config.ddp.find_unused_parameters.
#include <exception>

#include "core/error.h"
#include "accelerate/strategies/ddp_options.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"

namespace accel::dist {

namespace {

class DdpStrategy final : public ReplicatedStrategy {
 public:
  // Sync off: the hooks stay idle; a synced backward all-reduces what .grad then holds.
  bool takes_partial_backwards() const override { return true; }
  using ReplicatedStrategy::ReplicatedStrategy;
  std::string_view name() const override { return "ddp"; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    auto replica = std::make_unique<Replica>();
    // Every rank starts from rank 0's weights: DDP broadcasts the trainable parameters and the
    // buffers, the frozen parameters are broadcast here.
    broadcast_frozen(*model, trainable_parameters(*model).empty());
    if (!trainable_parameters(*model).empty()) {
      DDPOptions o = ctx_.options_as<DdpStrategyOptions>("ddp").ddp;
      o.root = 0;
      replica->ddp = std::make_unique<DistributedDataParallel>(model, ctx_.dp_group(), o);
      // The facade calls its models directly and broadcasts buffers at prepare only.
      replica->ddp->allow_direct_calls();
      if (!sync_)
        replica->paused = std::make_unique<DistributedDataParallel::NoSync>(*replica->ddp);
    }
    models_.push_back(model);
    replicas_.push_back(std::move(replica));
  }

  DistributedDataParallel* ddp(const nn::Module& model) const override {
    for (size_t i = 0; i < models_.size(); ++i)
      if (models_[i].get() == &model) return replicas_[i]->ddp.get();
    return nullptr;
  }

  // Note [gradient sync]: the hooks (armed by set_sync) do the work; DDP's end-of-backward
  // callback waits, also when the backward throws (the started buckets issue the same
  // collectives as the peers'), before the error propagates.
  void backward(const Tensor& loss, bool sync) override {
    const bool prev = sync_;
    set_sync(sync);
    std::exception_ptr err;
    try {
      loss.backward();
    } catch (...) {
      err = std::current_exception();
    }
    set_sync(prev);
    if (err) std::rethrow_exception(err);
  }

  void set_sync(bool sync) override {
    sync_ = sync;
    for (auto& r : replicas_) {
      if (!r->ddp) continue;
      if (sync) {
        r->paused.reset();
      } else if (!r->paused) {
        r->paused = std::make_unique<DistributedDataParallel::NoSync>(*r->ddp);
      }
    }
  }

  void after_step(optim::Optimizer&, bool) override {}

 private:
  // Per prepared model: its DDP (null without trainable parameters).
  struct Replica {
    std::unique_ptr<DistributedDataParallel> ddp;
    // Held while the facade is not on a sync step: DDP's hooks only accumulate locally then.
    std::unique_ptr<DistributedDataParallel::NoSync> paused;
  };
  std::vector<std::unique_ptr<Replica>> replicas_;  // parallel to models_
  bool sync_ = true;                                // Strategy::set_sync
};

const StrategyRegistration kDdp([] {
  StrategySpec s;
  s.name = "ddp";
  s.make = [](const StrategyContext& ctx) { return std::make_unique<DdpStrategy>(ctx); };
  s.zero_stage = 0;
  s.options = DdpStrategyOptions::from;
  return s;
}());

}  // namespace

}  // namespace accel::dist
