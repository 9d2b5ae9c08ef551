// DistributedDataParallel: data-parallel training over a ProcessGroup, as torch's DDP tutorial
// writes it:
//
//   auto pg = dist::init_process_group();
//   auto model = std::make_shared<MLP>();
//   dist::DistributedDataParallel ddp(model);        // rank 0's parameters everywhere
//   optim::AdamW opt(model->parameters());
//   for (...) {
//     Tensor loss = cross_entropy(ddp.forward(x_local), y_local);  // or ddp(x_local)
//     loss.backward();  // buckets all-reduced while backward runs, waited for at its end
//     opt.step();
//     opt.zero_grad();
//   }
//
// - At construction the parameters (and buffers) of rank `root` are broadcast to every rank.
// - Gradients are averaged in buckets of about bucket_cap_bytes (25 MiB), filled in reverse
//   parameter order; each bucket's all-reduce is issued asynchronously the moment its last
//   gradient is accumulated, so communication overlaps the rest of backward (see
//   parallel/buckets.h, Note [bucket order] for why the order is fixed and deterministic), and
//   the end of the backward waits for them (Note [sync at the end of backward] in
//   parallel/buckets.cc): after loss.backward() every rank holds the averaged gradients.
// - After backward each parameter's .grad is a view of its bucket (no copy back).
// - no_sync(): backward passes inside accumulate gradients locally; the next synced backward
//   averages the accumulated sum.
// - A parameter that got no gradient raises DistError naming it (after the collectives, so peers
//   are not left waiting), unless find_unused_parameters.
// - ddp.backward(loss) is loss.backward() that also syncs on a rank whose loss reached none of
//   the parameters (no hook fires there); finish_gradient_sync() is a no-op after a backward that
//   synced itself (kept for code that calls it).
// - Calling the wrapped model directly (model->forward(x), (*model)(x)) gives the same gradients
//   (the hooks are on the parameters) and is allowed, except where it skips the wrapper's
//   broadcast of buffers that the forward changed (Note [direct calls of a DDP model] in
//   parallel/ddp.cc): then the backward raises DistError on every rank naming the model.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"
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
  // (Note [module calls] in nn/module.h), e.g. ddp.forward<VaeOut>(x, cond).
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
  // loss.backward(); on a rank none of whose parameters got a gradient (so no hook synced),
  // the zero-filled collectives its peers issued (GradBucketer::finish). Inside no_sync: only
  // the backward.
  void backward(const Tensor& loss);
  // Waits for every bucket (GradBucketer::finish); a no-op after a backward that was finished
  // at its end (Note [sync at the end of backward] in parallel/buckets.cc), so it may be called
  // after loss.backward() as before.
  void finish_gradient_sync();
  // The Accelerator calls its models directly and broadcasts buffers itself: no check that
  // forwards went through forward() (Note [direct calls of a DDP model]).
  void allow_direct_calls() { check_direct_calls_ = false; }

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
  std::vector<uint32_t> buffer_versions() const;
  bool checks_direct_calls() const;
  void check_direct_call() const;
  void hook_outputs(const std::vector<Tensor>& outputs);

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr pg_;
  DDPOptions options_;
  std::unique_ptr<GradBucketer> bucketer_;
  // Note [direct calls of a DDP model]: the module's buffer versions after the last forward().
  std::vector<uint32_t> forward_versions_;
  bool check_direct_calls_ = true;
  // Set by the gradient hook of a forward()'s output until the end of that backward.
  std::shared_ptr<bool> wrapper_pass_ = std::make_shared<bool>(false);
};

// Named parameters of a module that require grad (what DDP and ZeRO synchronise).
NamedParams trainable_parameters(const nn::Module& module);
// Rank `root`'s value of t on every rank, in place (t may be a non-contiguous view; empty: no-op).
void broadcast_in_place(ProcessGroup& pg, const Tensor& t, int root);
// Every buffer of `module` (replicated state such as batch-norm statistics) from `root`.
void broadcast_module_buffers(ProcessGroup& pg, const nn::Module& module, int root);

}  // namespace accel::dist
