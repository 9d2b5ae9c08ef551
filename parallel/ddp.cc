#include "parallel/ddp.h"

#include "core/error.h"

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
  broadcast_parameters();
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 ProcessGroupPtr pg, DDPOptions options)
    : DistributedDataParallel(trainable_parameters(*module), std::move(pg), options) {
  module_ = std::move(module);
  broadcast_buffers();
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
  return module_->call_values(std::move(inputs));
}

void DistributedDataParallel::backward(const Tensor& loss) {
  loss.backward();
  finish_gradient_sync();
}

void DistributedDataParallel::finish_gradient_sync() { bucketer_->finish(); }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), prev_(ddp.bucketer_->sync()) {
  ddp_.bucketer_->set_sync(false);
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.bucketer_->set_sync(prev_); }

}  // namespace accel::dist
