#include "parallel/ddp.h"

#include <string>
#include <unordered_set>

#include "autograd/engine.h"
#include "core/error.h"

// Note [direct calls of a DDP model]
// DDP's hooks hang on the parameters, so a model called directly after wrapping it
// (model->forward(x), (*model)(x)) still gets its gradients averaged at the end of backward, as
// in PyTorch. What forward() adds is the broadcast of rank root's buffers before each forward
// (DDPOptions::broadcast_buffers, as torch's DDP): a direct call skips it, and where the forward
// changes buffers (batch-norm running statistics) the replicas' buffers then drift apart
// without a word. forward() records the buffers' versions after it ran; the first gradient of
// the next backward compares (GradBucketer's `begin`, Note [sync at the end of backward] in
// parallel/buckets.cc): a buffer written since, outside forward(), means a forward skipped the
// wrapper, and every rank raises DistError naming the model and the buffers before any
// collective of that backward starts (the ranks run the same forward, so all see it). Where
// forward()'s output is part of the backward, its gradient hook does this check first (before an
// activation checkpoint in the model recomputes and updates the buffers again, which is not a
// direct call) and the parameter gradients do not repeat it; a loss mixing forward()'s output
// and a direct call's still fails there. Models without buffers, or whose forward leaves them
// alone, may be called directly. One process (nothing to broadcast), broadcast_buffers = false
// and the Accelerator (allow_direct_calls: its models are called directly and it broadcasts
// buffers itself) skip the check.

namespace accel::dist {

NamedParams trainable_parameters(const nn::Module& module) {
  NamedParams out;
  for (auto& [name, p] : module.named_parameters())
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

void broadcast_in_place(ProcessGroup& pg, const Tensor& t, int root) {
  if (!t.defined() || t.numel() == 0 || pg.size() == 1) return;
  NoGradGuard no_grad;
  if (t.is_contiguous()) {
    pg.broadcast(t, root);
    return;
  }
  Tensor tmp = t.contiguous();
  pg.broadcast(tmp, root);
  Tensor dst = t;
  dst.copy_(tmp);
}

void broadcast_module_buffers(ProcessGroup& pg, const nn::Module& module, int root) {
  for (auto& [name, buf] : module.named_buffers()) broadcast_in_place(pg, buf, root);
}

namespace {
ProcessGroupPtr group_or_default(ProcessGroupPtr pg) { return pg ? pg : default_group(); }
}  // namespace

DistributedDataParallel::DistributedDataParallel(NamedParams params, ProcessGroupPtr pg,
                                                 DDPOptions options)
    : pg_(group_or_default(std::move(pg))), options_(options) {
  ACCEL_CHECK(options_.root >= 0 && options_.root < pg_->size(), DistError, "ddp", "root ",
              options_.root, " is outside [0, ", pg_->size(), ")");
  bucketer_ = std::make_unique<GradBucketer>(std::move(params), pg_, options_.bucket_cap_bytes,
                                             GradReduction::AllReduce,
                                             options_.find_unused_parameters, "ddp");
  // Note [sync at the end of backward]: a plain loss.backward() averages the gradients.
  bucketer_->set_backward_hooks(
      [this] {
        if (!*wrapper_pass_) check_direct_call();  // checked by an output's hook already
      },
      [this] { bucketer_->finish(); });
  broadcast_parameters();
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 ProcessGroupPtr pg, DDPOptions options)
    : DistributedDataParallel(trainable_parameters(*module), std::move(pg), options) {
  module_ = std::move(module);
  broadcast_buffers();
  forward_versions_ = buffer_versions();
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::broadcast_parameters() {
  if (pg_->size() == 1) return;
  // One broadcast per bucket, through its flat buffer: few collectives for many parameters.
  NoGradGuard no_grad;
  const auto& params = bucketer_->params();
  for (size_t b = 0; b < bucketer_->buckets().size(); ++b) {
    const Bucket& bk = bucketer_->buckets()[b];
    Tensor buf = bucketer_->buffer(b);
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const Tensor& p = params[bk.params[j]].second;
      buf.narrow(0, bk.offset[j], p.numel()).copy_(p.reshape({p.numel()}));
    }
    pg_->broadcast(buf, options_.root);
    for (size_t j = 0; j < bk.params.size(); ++j) {
      Tensor p = params[bk.params[j]].second;
      p.copy_(buf.narrow(0, bk.offset[j], p.numel()).view(p.sizes()));
    }
  }
}

void DistributedDataParallel::broadcast_buffers() {
  if (!module_ || !options_.broadcast_buffers || pg_->size() == 1) return;
  broadcast_module_buffers(*pg_, *module_, options_.root);
}

std::vector<Tensor> DistributedDataParallel::forward_values(nn::Values inputs) {
  ACCEL_CHECK(module_ != nullptr, DistError, "ddp",
              "forward() needs the Module constructor; with a parameter list call your model "
              "directly");
  ACCEL_CHECK(!bucketer_->in_backward(), DistError, "ddp",
              "the previous backward's gradient sync was not finished: call "
              "finish_gradient_sync() (or use ddp.backward(loss)) before the next forward");
  if (grad_enabled()) broadcast_buffers();
  bucketer_->forget_backward_end();  // a new iteration: its backward is not finished yet
  std::vector<Tensor> out = module_->call_values(std::move(inputs));
  forward_versions_ = buffer_versions();
  if (grad_enabled() && checks_direct_calls()) hook_outputs(out);
  return out;
}

bool DistributedDataParallel::checks_direct_calls() const {
  return check_direct_calls_ && module_ && options_.broadcast_buffers && pg_->size() > 1 &&
         !forward_versions_.empty();
}

// Note [direct calls of a DDP model]: the gradient of a forward()'s output arrives before any
// gradient of the model's parameters, and before an activation checkpoint inside the model
// recomputes (and updates the buffers again): the check runs there, and the backward is marked
// as one through the wrapper, so that its first parameter gradient does not check again.
void DistributedDataParallel::hook_outputs(const std::vector<Tensor>& outputs) {
  std::weak_ptr<bool> pass = wrapper_pass_;
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& y : outputs) {
    if (!y.defined() || !y.requires_grad() || !seen.insert(y.impl()).second) continue;
    Tensor h = y;
    h.register_hook([this, pass](const Tensor&) {
      auto flag = pass.lock();
      if (!flag || *flag) return Tensor();
      check_direct_call();
      *flag = true;
      if (autograd::backward_running())
        autograd::queue_callback([pass](bool) {
          if (auto f = pass.lock()) *f = false;
        });
      return Tensor();
    });
  }
}

std::vector<uint32_t> DistributedDataParallel::buffer_versions() const {
  std::vector<uint32_t> v;
  if (!module_) return v;
  for (auto& [name, buf] : module_->named_buffers()) v.push_back(buf.defined() ? buf.version() : 0);
  return v;
}

// Note [direct calls of a DDP model].
void DistributedDataParallel::check_direct_call() const {
  if (!checks_direct_calls()) return;
  const auto buffers = module_->named_buffers();
  if (buffers.size() != forward_versions_.size()) return;  // the module changed: nothing to compare
  std::string changed;
  size_t n = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& b = buffers[i].second;
    if ((b.defined() ? b.version() : 0) == forward_versions_[i]) continue;
    if (n++ < 4) changed += (changed.empty() ? "" : ", ") + buffers[i].first;
  }
  if (n == 0) return;
  if (n > 4) changed += ", ... (" + std::to_string(n) + " in all)";
  ACCEL_THROW(DistError, "ddp", "rank ", pg_->rank(), ": the forward of the wrapped model ",
              module_->type_name(),
              " that produced these gradients did not go through DistributedDataParallel: its "
              "buffers (",
              changed,
              ") changed after the last ddp.forward(), so the model was called directly "
              "(model->forward(x) or (*model)(x)), which skips the broadcast of rank ",
              options_.root,
              "'s buffers before every forward (DDPOptions::broadcast_buffers) and lets the "
              "replicas' buffers drift apart. Call the wrapper: ddp.forward(x) or ddp(x)");
}

void DistributedDataParallel::backward(const Tensor& loss) {
  const uint64_t finished = bucketer_->finish_count();
  loss.backward();
  // Synced at its end unless no hook fired here (Note [sync at the end of backward]).
  if (bucketer_->finish_count() == finished) bucketer_->finish();
}

void DistributedDataParallel::finish_gradient_sync() {
  if (bucketer_->finished_at_backward_end()) return;
  bucketer_->finish();
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), prev_(ddp.bucketer_->sync()) {
  ddp_.bucketer_->set_sync(false);
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.bucketer_->set_sync(prev_); }

}  // namespace accel::dist
