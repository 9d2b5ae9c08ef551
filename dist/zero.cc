#include "dist/zero.h"

#include "core/error.h"
#include "dist/ddp.h"

// Note [zero layout]
// Bucket b (dist/buckets.h) is a flat buffer of numel_b elements, numel_b a multiple of the
// world size N; parameters sit at fixed offsets, the tail is zero padding. Rank r owns elements
// [r * numel_b / N, (r + 1) * numel_b / N) of every bucket, which is exactly the slice a ring
// reduce-scatter of the bucket leaves on rank r, so stage 2/3 gradients need no reshuffling.
// A slice may cut a parameter in two; that is harmless for elementwise optimizers, whose
// update of an element depends only on that element's parameter, gradient and state. Padding
// has zero gradient and zero value, so it stays zero under SGD, Adam and AdamW.
// Stages 1/2 keep the full flat buffer and make every parameter a view into it
// (nn::assign_tensor_data keeps the module's handles and autograd metadata), so an in-place
// all-gather after the step updates the model. Stage 3 keeps only the owned slices; parameters
// point at an empty tensor until gather_parameters() assembles the buckets again.

namespace accel::dist {

namespace {
ProcessGroupPtr group_or_default(ProcessGroupPtr pg) { return pg ? pg : default_group(); }

int64_t bytes_of(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (auto& t : ts)
    if (t.defined()) n += int64_t(t.nbytes());
  return n;
}
}  // namespace

ZeroOptimizer::ZeroOptimizer(NamedParams params, const OptimizerFactory& make_optimizer,
                             ProcessGroupPtr pg, ZeroOptions options)
    : pg_(group_or_default(std::move(pg))), options_(options) {
  ACCEL_CHECK(options_.stage >= 1 && options_.stage <= 3, ValueError, "zero",
              "stage must be 1, 2 or 3, got ", options_.stage);
  ACCEL_CHECK(options_.root >= 0 && options_.root < pg_->size(), DistError, "zero", "root ",
              options_.root, " is outside [0, ", pg_->size(), ")");
  ACCEL_CHECK(bool(make_optimizer), ValueError, "zero", "no optimizer factory");
  bucketer_ = std::make_unique<GradBucketer>(
      std::move(params), pg_, options_.bucket_cap_bytes,
      options_.stage == 1 ? GradReduction::AllReduce : GradReduction::ReduceScatter,
      options_.find_unused_parameters, "zero");
  init(make_optimizer);
}

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<nn::Module> module,
                             const OptimizerFactory& make_optimizer, ProcessGroupPtr pg,
                             ZeroOptions options)
    : ZeroOptimizer(trainable_parameters(*module), make_optimizer, std::move(pg), options) {
  module_ = std::move(module);
  // Buffers (e.g. batch-norm statistics) are replicated, not sharded: start from root's.
  if (pg_->size() > 1) {
    NoGradGuard no_grad;
    for (auto& [name, buf] : module_->named_buffers()) {
      if (!buf.defined() || buf.numel() == 0) continue;
      Tensor tmp = buf.contiguous();
      pg_->broadcast(tmp, options_.root);
      if (!tmp.is_same(buf)) {
        Tensor dst = buf;
        dst.copy_(tmp);
      }
    }
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::point_params_at(const std::vector<Tensor>& flats) {
  const auto& params = bucketer_->params();
  for (size_t b = 0; b < bucketer_->buckets().size(); ++b) {
    const Bucket& bk = bucketer_->buckets()[b];
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const size_t i = bk.params[j];
      Tensor p = params[i].second;
      const Shape& shape = shapes_[i];
      nn::assign_tensor_data(p, flats[b].narrow(0, bk.offset[j], shape_numel(shape)).view(shape));
    }
  }
}

void ZeroOptimizer::init(const OptimizerFactory& make_optimizer) {
  NoGradGuard no_grad;
  const auto& params = bucketer_->params();
  const auto& buckets = bucketer_->buckets();
  const int r = pg_->rank();
  for (auto& [name, p] : params) shapes_.push_back(p.sizes());
  // Flatten, and start every rank from root's values.
  std::vector<Tensor> flats;
  for (const Bucket& bk : buckets) {
    Tensor flat = zeros({bk.numel}, TensorOptions(bk.dtype, bk.device));
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const Tensor& p = params[bk.params[j]].second;
      flat.narrow(0, bk.offset[j], p.numel()).copy_(p.reshape({p.numel()}));
    }
    if (pg_->size() > 1) pg_->broadcast(flat, options_.root);
    flats.push_back(flat);
  }
  if (options_.stage < 3) {
    flat_ = flats;
    point_params_at(flat_);
    for (size_t b = 0; b < buckets.size(); ++b)
      shards_.push_back(flat_[b].narrow(0, r * buckets[b].shard_numel, buckets[b].shard_numel));
  } else {
    for (size_t b = 0; b < buckets.size(); ++b)
      owned_.push_back(
          flats[b].narrow(0, r * buckets[b].shard_numel, buckets[b].shard_numel).clone());
    flats.clear();  // the full copies go away: only slices stay
    release_parameters();
    shards_ = owned_;
  }
  for (auto& s : shards_) s.requires_grad_(true);
  optimizer_ = make_optimizer(shards_);
  ACCEL_CHECK(optimizer_ != nullptr, ValueError, "zero", "the optimizer factory returned null");
}

void ZeroOptimizer::gather_parameters() {
  if (options_.stage < 3 || !full_.empty()) return;
  NoGradGuard no_grad;
  const auto& buckets = bucketer_->buckets();
  std::vector<Tensor> full;
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < buckets.size(); ++b) {
    full.push_back(empty({buckets[b].numel}, TensorOptions(buckets[b].dtype, buckets[b].device)));
    works.push_back(pg_->all_gather_async(full.back(), owned_[b]));
  }
  for (auto& w : works) w->wait();
  full_ = std::move(full);
  point_params_at(full_);
}

void ZeroOptimizer::release_parameters() {
  if (options_.stage < 3) return;
  const auto& params = bucketer_->params();
  for (auto& [name, p] : params) {
    Tensor handle = p;
    // Keeps dtype and device; no elements until the next gather.
    nn::assign_tensor_data(handle, empty({0}, TensorOptions(p.dtype(), p.device())));
  }
  full_.clear();
}

Tensor ZeroOptimizer::forward(const Tensor& x) {
  ACCEL_CHECK(module_ != nullptr, DistError, "zero",
              "forward() needs the Module constructor; with a parameter list call "
              "gather_parameters() and then your model");
  ACCEL_CHECK(!bucketer_->in_backward(), DistError, "zero",
              "the previous backward's gradient sync was not finished: call "
              "finish_gradient_sync() (or zero.backward(loss)) first");
  gather_parameters();
  return module_->forward(x);
}

void ZeroOptimizer::backward(const Tensor& loss) {
  ACCEL_CHECK(options_.stage < 3 || !full_.empty(), DistError, "zero",
              "stage 3 parameters are not gathered: run forward() through the ZeroOptimizer "
              "(or call gather_parameters() before your forward)");
  loss.backward();
  finish_gradient_sync();
}

void ZeroOptimizer::finish_gradient_sync() {
  bucketer_->finish();
  if (options_.stage >= 2) bucketer_->release_staging();
  if (options_.stage == 3) release_parameters();
}

void ZeroOptimizer::step() {
  ACCEL_CHECK(!bucketer_->in_backward(), DistError, "zero",
              "step() before finish_gradient_sync(): the gradients are still being reduced");
  const auto& buckets = bucketer_->buckets();
  const int r = pg_->rank();
  for (size_t b = 0; b < buckets.size(); ++b) {
    Tensor g = options_.stage == 1 ? bucketer_->buffer(b).narrow(0, r * buckets[b].shard_numel,
                                                                 buckets[b].shard_numel)
                                   : bucketer_->shard(b);
    shards_[b].set_grad(g);
  }
  optimizer_->step();
  for (auto& s : shards_) s.set_grad(Tensor());
  if (options_.stage < 3 && pg_->size() > 1) {
    NoGradGuard no_grad;
    std::vector<WorkPtr> works;
    for (size_t b = 0; b < buckets.size(); ++b)
      works.push_back(pg_->all_gather_async(flat_[b], shards_[b].detach()));
    for (auto& w : works) w->wait();
  }
}

void ZeroOptimizer::zero_grad() {
  for (auto& [name, p] : bucketer_->params()) {
    Tensor h = p;
    h.set_grad(Tensor());
  }
}

ZeroMemory ZeroOptimizer::memory() const {
  ZeroMemory m;
  for (auto& [name, p] : bucketer_->params())
    m.full_param_bytes += p.numel() > 0 ? int64_t(p.nbytes()) : 0;
  if (options_.stage < 3) {
    m.param_bytes = bytes_of(flat_);
  } else {
    m.param_bytes = bytes_of(owned_);
    m.gathered_param_bytes = bytes_of(full_);
    // Released parameters report 0 elements; the unsharded size comes from the buckets.
    m.full_param_bytes = 0;
    for (const Bucket& bk : bucketer_->buckets())
      m.full_param_bytes += bk.used * int64_t(dtype_size(bk.dtype));
  }
  if (options_.stage == 1) {
    m.grad_bytes = bucketer_->staging_bytes();
  } else {
    for (size_t b = 0; b < bucketer_->buckets().size(); ++b)
      m.grad_bytes += int64_t(bucketer_->shard(b).nbytes());
    m.grad_bytes += bucketer_->staging_bytes();
  }
  for (auto& [key, t] : optimizer_->state_dict())
    if (key.rfind("state.", 0) == 0 && t.defined()) m.optimizer_bytes += int64_t(t.nbytes());
  return m;
}

}  // namespace accel::dist
