// DdpStrategy: replicated models whose gradients DistributedDataParallel averages on sync steps.
//
// Note [gradient sync]
// Each prepared model with trainable parameters gets a DistributedDataParallel (dist/ddp.h)
// whose gradient hooks are paused (its no_sync) except inside Accelerator::backward on a sync
// step: there the buckets are all-reduced (Avg) as soon as their gradients are ready, overlapping
// the rest of backward, and backward() waits for them before it returns. A plain
// loss.backward() of your own therefore only accumulates locally, as it did without DDP.
// Micro-batches of an accumulation window (non-sync steps, no_sync()) only accumulate locally;
// the sync step's backward averages the accumulated sum, so k micro-batches per rank over W
// ranks produce the gradient of the whole k*W batch, as one process would. A model whose
// parameters got no gradient in a backward (a second model of a GAN, say) is not synced by it;
// one that got only some raises DDP's unused-parameter error unless
// config.ddp.find_unused_parameters.
#include <exception>

#include "core/error.h"
#include "dist/strategy_base.h"

namespace accel::dist {

namespace {

class DdpStrategy final : public ReplicatedStrategy {
 public:
  using ReplicatedStrategy::ReplicatedStrategy;
  std::string_view name() const override { return "ddp"; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    auto replica = std::make_unique<Replica>();
    // Every rank starts from rank 0's weights: DDP broadcasts the trainable parameters and the
    // buffers, the frozen parameters are broadcast here.
    broadcast_frozen(*model, trainable_parameters(*model).empty());
    NamedParams trainable = trainable_parameters(*model);
    if (!trainable.empty()) {
      // The touch hook goes first so that it has run even when a DDP hook throws.
      std::weak_ptr<bool> flag = replica->touched;
      for (auto& [name, p] : trainable) {
        Tensor h = p;
        h.register_post_accumulate_grad_hook([flag](Tensor&) {
          if (auto f = flag.lock()) *f = true;
        });
      }
      DDPOptions o = ctx_.ddp;
      o.root = 0;
      replica->ddp = std::make_unique<DistributedDataParallel>(model, ctx_.group, o);
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

  // Note [gradient sync]: on a sync step unpause every DDP, run backward (buckets are reduced as
  // it goes), wait for the models that got gradients, pause again. On an exception the started
  // syncs are still finished (they issue the same collectives as the peers') before it
  // propagates.
  void backward(const Tensor& loss, bool sync) override {
    if (!sync) {
      loss.backward();
      return;
    }
    for (auto& r : replicas_) {
      *r->touched = false;
      if (r->ddp) r->paused.reset();
    }
    std::exception_ptr err;
    try {
      loss.backward();
    } catch (...) {
      err = std::current_exception();
    }
    for (auto& r : replicas_) {
      if (!r->ddp || !*r->touched) continue;
      try {
        r->ddp->finish_gradient_sync();
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    try {
      for (auto& r : replicas_)
        if (r->ddp && !r->paused)
          r->paused = std::make_unique<DistributedDataParallel::NoSync>(*r->ddp);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    if (err) std::rethrow_exception(err);
  }

  void after_step(optim::Optimizer&, bool) override {}

 private:
  // Per prepared model: its DDP (null without trainable parameters), and whether it got
  // gradients in the current backward.
  struct Replica {
    std::unique_ptr<DistributedDataParallel> ddp;
    // Held except during a synced backward: DDP's hooks only copy and reduce inside one.
    std::unique_ptr<DistributedDataParallel::NoSync> paused;
    std::shared_ptr<bool> touched = std::make_shared<bool>(false);
  };
  std::vector<std::unique_ptr<Replica>> replicas_;  // parallel to models_
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(const StrategyContext& ctx) {
  return std::make_unique<DdpStrategy>(ctx);
}

}  // namespace accel::dist
