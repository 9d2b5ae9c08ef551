// DdpStrategy: replicated models whose gradients DistributedDataParallel averages on sync steps.
//
// Note [gradient sync]
// Each prepared model with trainable parameters gets a DistributedDataParallel (parallel/ddp.h).
// Its gradient hooks are armed while the facade is on a sync step outside no_sync()
// (Strategy::set_sync) and paused (DDP's no_sync) otherwise: armed, each bucket is all-reduced
// (Avg) as soon as its gradients are ready, overlapping the rest of backward, and at the end of
// the backward (an end-of-backward callback, Note [end-of-backward callbacks] in
// autograd/engine.h) the strategy waits for the buckets of every model that got gradients. This
// holds for Accelerator::backward and for a plain loss.backward() of the user's alike (Note
// [plain backward] in accelerate/accelerator.cc), as PyTorch DDP's hooks do.
// Micro-batches of an accumulation window (non-sync steps, no_sync()) only accumulate locally;
// the sync step's backward averages the accumulated sum, so k micro-batches per rank over W
// ranks produce the gradient of the whole k*W batch, as one process would. A model whose
// parameters got no gradient in a backward (a second model of a GAN, say) is not synced by it;
// one that got only some raises DDP's unused-parameter error unless
// config.ddp.find_unused_parameters.
#include <exception>

#include "autograd/engine.h"
#include "core/error.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"

namespace accel::dist {

namespace {

class DdpStrategy final : public ReplicatedStrategy {
 public:
  using ReplicatedStrategy::ReplicatedStrategy;
  ~DdpStrategy() override { *alive_ = false; }
  std::string_view name() const override { return "ddp"; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    auto replica = std::make_unique<Replica>();
    // Every rank starts from rank 0's weights: DDP broadcasts the trainable parameters and the
    // buffers, the frozen parameters are broadcast here.
    broadcast_frozen(*model, trainable_parameters(*model).empty());
    NamedParams trainable = trainable_parameters(*model);
    if (!trainable.empty()) {
      // The touch hook goes first so that it has run even when a DDP hook throws. The first
      // gradient of a backward queues the wait for the buckets at its end.
      std::weak_ptr<bool> alive = alive_;
      Replica* r = replica.get();
      for (auto& [name, p] : trainable) {
        Tensor h = p;
        h.register_post_accumulate_grad_hook([this, alive, r](Tensor&) {
          if (!alive.lock() || r->touched) return;
          r->touched = true;
          if (queued_) return;
          queued_ = true;
          autograd::queue_callback([this, alive](bool) {
            if (alive.lock()) finish_backward();
          });
        });
      }
      DDPOptions o = ctx_.ddp;
      o.root = 0;
      replica->ddp = std::make_unique<DistributedDataParallel>(model, ctx_.dp_group(), o);
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

  // Note [gradient sync]: the hooks (armed by set_sync) do the work; the wait happens in the
  // end-of-backward callback, also when the backward throws (the started buckets issue the same
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
  // End of a backward: wait for the buckets of the models that got gradients (a paused model
  // only accumulated locally).
  void finish_backward() {
    queued_ = false;
    std::exception_ptr err;
    for (auto& r : replicas_) {
      const bool touched = r->touched;
      r->touched = false;
      if (!r->ddp || !touched || r->paused) continue;
      try {
        r->ddp->finish_gradient_sync();
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  }

  // Per prepared model: its DDP (null without trainable parameters), and whether it got
  // gradients in the current backward.
  struct Replica {
    std::unique_ptr<DistributedDataParallel> ddp;
    // Held while the facade is not on a sync step: DDP's hooks only accumulate locally then.
    std::unique_ptr<DistributedDataParallel::NoSync> paused;
    bool touched = false;
  };
  std::vector<std::unique_ptr<Replica>> replicas_;  // parallel to models_
  bool sync_ = true;                                // Strategy::set_sync
  bool queued_ = false;                             // the end-of-backward wait is queued
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

const StrategyRegistration kDdp([] {
  StrategySpec s;
  s.name = "ddp";
  s.make = [](const StrategyContext& ctx) { return std::make_unique<DdpStrategy>(ctx); };
  s.zero_stage = 0;
  return s;
}());

}  // namespace

}  // namespace accel::dist
