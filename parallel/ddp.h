// DistributedDataParallel: data-parallel training over a ProcessGroup.
//
//   auto pg = dist::init_process_group();
//   auto model = std::make_shared<MLP>();
//   dist::DistributedDataParallel ddp(model);        // rank 0's parameters everywhere
//   optim::AdamW opt(model->parameters());
//   for (...) {
//     Tensor loss = cross_entropy(ddp.forward(x_local), y_local);   // or ddp.forward<R>(a, b)
//     ddp.backward(loss);      // buckets all-reduced while backward runs; waits at the end
//     opt.step();
//     opt.zero_grad();
//   }
//
// - At construction the parameters (and buffers) of rank `root` are broadcast to every rank.
// - Gradients are averaged in buckets of about bucket_cap_bytes (25 MiB), filled in reverse
//   parameter order; each bucket's all-reduce is issued asynchronously the moment its last
//   gradient is accumulated, so communication overlaps the rest of backward (see
//   parallel/buckets.h, Note [bucket order] for why the order is fixed and deterministic).
// - After backward each parameter's .grad is a view of its bucket (no copy back).
// - no_sync(): backward passes inside accumulate gradients locally; the next synced backward
//   averages the accumulated sum.
// - A parameter that got no gradient raises DistError naming it (after the collectives, so peers
//   are not left waiting), unless find_unused_parameters.
// Calling loss.backward() yourself works too: then call finish_gradient_sync() before stepping.
#pragma once

#include <memory>

#include "autograd/nn/module.h"
#include "parallel/buckets.h"
#include "comm/process_group.h"

namespace accel::dist {

struct DDPOptions {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // module buffers from root at construction and every forward
  int root = 0;
};

class DistributedDataParallel {
 public:
  // A plain list of named parameters; `pg` null means the default group.
  explicit DistributedDataParallel(NamedParams params, ProcessGroupPtr pg = nullptr,
                                   DDPOptions options = {});
  // A module: its parameters that require grad, and its buffers.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroupPtr pg = nullptr,
                                   DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Module form only: re-broadcasts buffers when asked, then calls the module (its hooks run):
  // ddp.forward(x) for one tensor, ddp.forward<R>(args...) for any signature and result type
  // (Note [module calls] in autograd/nn/module.h), e.g. ddp.forward<VaeOut>(x, cond).
  template <typename R = Tensor, typename... A>
  R forward(const A&... args) {
    std::vector<Tensor> out = forward_values(nn::call_detail::pack(args...));
    return nn::call_detail::unflatten<R>(std::move(out), [this] { return module_->call_name(); });
  }
  template <typename R = Tensor, typename... A>
  R operator()(const A&... args) {
    return forward<R>(args...);
  }
  // The type-erased form of forward.
  std::vector<Tensor> forward_values(nn::Values inputs);
  // loss.backward() followed by finish_gradient_sync() (or only the backward inside no_sync).
  void backward(const Tensor& loss);
  // Waits for every bucket; see GradBucketer::finish.
  void finish_gradient_sync();

  // RAII: gradients accumulate locally while it lives.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  const SyncStats& last_stats() const { return bucketer_->last_stats(); }
  const std::vector<Bucket>& buckets() const { return bucketer_->buckets(); }
  const NamedParams& parameters() const { return bucketer_->params(); }
  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const ProcessGroupPtr& process_group() const { return pg_; }

 private:
  void broadcast_parameters();
  void broadcast_buffers();

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr pg_;
  DDPOptions options_;
  std::unique_ptr<GradBucketer> bucketer_;
};

// Named parameters of a module that require grad (what DDP and ZeRO synchronise).
NamedParams trainable_parameters(const nn::Module& module);
// Rank `root`'s value of t on every rank, in place (t may be a non-contiguous view; empty: no-op).
void broadcast_in_place(ProcessGroup& pg, const Tensor& t, int root);
// Every buffer of `module` (replicated state such as batch-norm statistics) from `root`.
void broadcast_module_buffers(ProcessGroup& pg, const nn::Module& module, int root);

}  // namespace accel::dist
