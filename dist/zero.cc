#include "dist/zero.h"

#include <string>

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

ZeroOptimizer::ZeroOptimizer(std::vector<NamedParams> groups,
                             const GroupOptimizerFactory& make_optimizer, ProcessGroupPtr pg,
                             ZeroOptions options)
    : pg_(group_or_default(std::move(pg))), options_(options) {
  ACCEL_CHECK(options_.stage >= 1 && options_.stage <= 3, ValueError, "zero",
              "stage must be 1, 2 or 3, got ", options_.stage);
  ACCEL_CHECK(options_.root >= 0 && options_.root < pg_->size(), DistError, "zero", "root ",
              options_.root, " is outside [0, ", pg_->size(), ")");
  ACCEL_CHECK(bool(make_optimizer), ValueError, "zero", "no optimizer factory");
  ACCEL_CHECK(!groups.empty(), ValueError, "zero", "no parameter groups");
  NamedParams all;
  for (size_t g = 0; g < groups.size(); ++g) {
    ACCEL_CHECK(!groups[g].empty(), ValueError, "zero", "parameter group ", g, " is empty");
    for (auto& np : groups[g]) {
      all.push_back(std::move(np));
      group_of_.push_back(g);
    }
  }
  num_groups_ = groups.size();
  bucketer_ = std::make_unique<GradBucketer>(
      std::move(all), pg_, options_.bucket_cap_bytes,
      options_.stage == 1 ? GradReduction::AllReduce : GradReduction::ReduceScatter,
      options_.find_unused_parameters, "zero", num_groups_ > 1 ? group_of_ : std::vector<size_t>{});
  init(make_optimizer);
}

namespace {
std::vector<NamedParams> one_group(NamedParams params) {
  std::vector<NamedParams> out;
  out.push_back(std::move(params));
  return out;
}
GroupOptimizerFactory from_flat(const OptimizerFactory& f) {
  ACCEL_CHECK(bool(f), ValueError, "zero", "no optimizer factory");
  return [f](std::vector<optim::ParamGroup> groups) { return f(std::move(groups.at(0).params)); };
}
}  // namespace

ZeroOptimizer::ZeroOptimizer(NamedParams params, const OptimizerFactory& make_optimizer,
                             ProcessGroupPtr pg, ZeroOptions options)
    : ZeroOptimizer(one_group(std::move(params)), from_flat(make_optimizer), std::move(pg),
                    options) {}

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<nn::Module> module,
                             const OptimizerFactory& make_optimizer, ProcessGroupPtr pg,
                             ZeroOptions options)
    : ZeroOptimizer(trainable_parameters(*module), make_optimizer, std::move(pg), options) {
  module_ = std::move(module);
  // Buffers (e.g. batch-norm statistics) are replicated, not sharded: start from root's.
  broadcast_module_buffers(*pg_, *module_, options_.root);
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

void ZeroOptimizer::init(const GroupOptimizerFactory& make_optimizer) {
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
  // One optimizer group per parameter group: its buckets' shards in bucket order.
  std::vector<optim::ParamGroup> groups(num_groups_);
  bucket_to_opt_.assign(buckets.size(), 0);
  for (size_t g = 0; g < num_groups_; ++g)
    for (size_t b = 0; b < buckets.size(); ++b)
      if (bucket_group(b) == g) {
        bucket_to_opt_[b] = opt_to_bucket_.size();
        opt_to_bucket_.push_back(b);
        groups[g].params.push_back(shards_[b]);
      }
  std::unique_ptr<optim::Optimizer> o = make_optimizer(std::move(groups));
  ACCEL_CHECK(o != nullptr, ValueError, "zero", "the optimizer factory returned null");
  optimizer_ = std::move(o);
}

size_t ZeroOptimizer::bucket_group(size_t b) const {
  return group_of_[bucketer_->buckets()[b].params.at(0)];
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

std::vector<Tensor> ZeroOptimizer::gradient_shards() const {
  const auto& buckets = bucketer_->buckets();
  const int r = pg_->rank();
  std::vector<Tensor> out;
  for (size_t b = 0; b < buckets.size(); ++b)
    out.push_back(options_.stage == 1 ? bucketer_->buffer(b).narrow(0, r * buckets[b].shard_numel,
                                                                    buckets[b].shard_numel)
                                      : bucketer_->shard(b));
  return out;
}

std::vector<Tensor> ZeroOptimizer::attach_gradients() {
  ACCEL_CHECK(!bucketer_->in_backward(), DistError, "zero",
              "step() before finish_gradient_sync(): the gradients are still being reduced");
  std::vector<Tensor> g = gradient_shards();
  for (size_t b = 0; b < shards_.size(); ++b) shards_[b].set_grad(g[b]);
  return shards_;
}

void ZeroOptimizer::finish_step(bool stepped) {
  for (auto& s : shards_) s.set_grad(Tensor());
  if (stepped && options_.stage < 3 && pg_->size() > 1) {
    NoGradGuard no_grad;
    std::vector<WorkPtr> works;
    for (size_t b = 0; b < shards_.size(); ++b)
      works.push_back(pg_->all_gather_async(flat_[b], shards_[b].detach()));
    for (auto& w : works) w->wait();
  }
}

void ZeroOptimizer::step() {
  attach_gradients();
  optimizer_->step();
  finish_step(true);
}

void ZeroOptimizer::reload_shards_from_parameters() {
  if (options_.stage < 3) return;
  ACCEL_CHECK(!full_.empty(), DistError, "zero",
              "reload_shards_from_parameters needs the gathered parameters");
  NoGradGuard ng;
  const auto& buckets = bucketer_->buckets();
  const int r = pg_->rank();
  for (size_t b = 0; b < buckets.size(); ++b)
    owned_[b].copy_(full_[b].narrow(0, r * buckets[b].shard_numel, buckets[b].shard_numel));
}

nn::TensorDict ZeroOptimizer::shard_state_dict() const {
  nn::TensorDict out;
  for (auto& [key, t] : optimizer_->state_dict()) {
    if (key.rfind("state.", 0) != 0) {
      out[key] = t;
      continue;
    }
    const size_t dot = key.find('.', 6);
    const size_t k = std::stoul(key.substr(6, dot - 6));
    out["state." + std::to_string(opt_to_bucket_.at(k)) + key.substr(dot)] = t;
  }
  return out;
}

void ZeroOptimizer::load_shard_state_dict(const nn::TensorDict& by_bucket) {
  nn::TensorDict d;
  for (auto& [key, t] : optimizer_->state_dict())  // this optimizer's own groups
    if (key.rfind("param_groups.", 0) == 0) d[key] = t;
  for (auto& [key, t] : by_bucket) {
    if (key.rfind("state.", 0) != 0) continue;
    const size_t dot = key.find('.', 6);
    size_t b = 0;
    try {
      b = std::stoul(key.substr(6, dot - 6));
    } catch (const std::exception&) {
      ACCEL_THROW(ValueError, "zero", "load_shard_state_dict: bad key '", key, "'");
    }
    ACCEL_CHECK(dot != std::string::npos && b < bucket_to_opt_.size(), ValueError, "zero",
                "load_shard_state_dict: key '", key, "' names no bucket of ",
                bucket_to_opt_.size());
    d["state." + std::to_string(bucket_to_opt_[b]) + key.substr(dot)] = t;
  }
  optimizer_->load_state_dict(d);
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
