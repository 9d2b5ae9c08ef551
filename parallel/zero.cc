#include "parallel/zero.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/ddp.h"
#include "parallel/hsdp.h"

// Note [zero layout]
// Bucket b (parallel/buckets.h) is a flat buffer of numel_b elements, numel_b a multiple of the
// world size N; parameters sit at fixed offsets, the tail is zero padding. Rank r owns elements
// [r * numel_b / N, (r + 1) * numel_b / N) of every bucket, which is exactly the slice a ring
// reduce-scatter of the bucket leaves on rank r, so stage 2 gradients need no reshuffling.
// A slice may cut a parameter in two; that is harmless for elementwise optimizers, whose
// update of an element depends only on that element's parameter, gradient and state. Padding
// has zero gradient and zero value, so it stays zero under SGD, Adam and AdamW.
// Both stages keep the full flat buffer and make every parameter a view into it
// (nn::assign_tensor_data keeps the module's handles and autograd metadata), so an in-place
// all-gather after the step updates the model. ZeRO-3 (parameters sharded too) is not here: the
// one engine for it is FullyShardedModel (parallel/fsdp.h), which shards per wrapping unit.

// Note [zero mixed precision]
// With param_dtype (stages 1-2) a bucket has three forms: flat_[b], the full buffer in the compute
// dtype that the parameters are views of (forward and backward run on it); master_[b], this
// rank's slice in the master dtype (fp32), the leaf the optimizer steps; and the reduced
// gradient slice. The constructor lays flat_ out as the fp32 buckets (assign_buckets) and points
// the parameters at it (no per-parameter 16-bit copies); init() fills it one fp32 bucket at a
// time. The gradient bucketer is built over the parameters in the dtype the gradients are
// reduced in: the compute dtype (its bucket_cap_bytes scaled by the dtype sizes, so the buckets
// hold the same parameters as the fp32 layout: checked, and checkpoint layouts do not depend on
// the option), or fp32 with reduce_in_fp32 (built before the parameters are converted; its hooks
// cast each 16-bit gradient into the fp32 bucket). A 16-bit reduced slice is cast into
// master_grad_[b] after the sync, so the optimizer, unscaling and clipping see fp32 gradients.
// After the step each rank casts its master slice into its slice of flat_[b] and the buckets
// are all-gathered in the compute dtype. Stage 1 drops the parameters' .grad after each sync
// (the bucketer points them at the reduced bucket): the strategy adds the fp32 shards of an
// accumulation window up, as for stage 2. Masters live only as 1/N slices, so the model's fp32
// values exist in full only inside use_master_parameters() (checkpoints, state dicts).

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
  ACCEL_CHECK(options_.stage == 1 || options_.stage == 2, ValueError, "zero",
              "ZeroOptions::stage must be 1 or 2, got ", options_.stage,
              options_.stage == 3 ? " (ZeRO-3 is dist::FullyShardedModel, parallel/fsdp.h)" : "");
  ACCEL_CHECK(options_.root >= 0 && options_.root < pg_->size(), DistError, "zero", "root ",
              options_.root, " is outside [0, ", pg_->size(), ")");
  hsdp::check_groups("zero", *pg_, options_.replicate);
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
  // Note [zero mixed precision]: check, keep the fp32 values, convert the parameters.
  std::vector<Tensor> masters;
  size_t cap = options_.bucket_cap_bytes;
  const std::optional<DType> compute = options_.param_dtype;
  if (compute) {
    ACCEL_CHECK(*compute == kBFloat16 || *compute == kFloat16, ValueError, "zero",
                "ZeroOptions::param_dtype must be bfloat16 or float16, got ", *compute);
    for (auto& [name, p] : all) {
      ACCEL_CHECK(p.defined(), ValueError, "zero", "parameter '", name, "' is undefined");
      ACCEL_CHECK(p.dtype() == kFloat32, DTypeError, "zero", "parameter '", name, "' has dtype ",
                  p.dtype(),
                  "; ZeroOptions::param_dtype needs float32 parameters (the master "
                  "weights)");
      masters.push_back(p.detach());
    }
    master_dtype_ = kFloat32;
  }
  // The compute buffers, laid out as the fp32 buckets; the parameters become views of them (the
  // values come in init(), no per-parameter 16-bit copies).
  std::vector<Bucket> layout;
  auto to_compute = [&] {
    NoGradGuard ng;
    layout = assign_buckets(all, options_.bucket_cap_bytes, pg_->size(),
                            num_groups_ > 1 ? group_of_ : std::vector<size_t>{});
    for (const Bucket& bk : layout) {
      Tensor f = empty({bk.numel}, TensorOptions(*compute, bk.device));
      if (bk.numel > bk.used) f.narrow(0, bk.used, bk.numel - bk.used).zero_();
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const Tensor& m = masters[bk.params[j]];
        nn::assign_tensor_data(all[bk.params[j]].second,
                               f.narrow(0, bk.offset[j], m.numel()).view(m.sizes()));
      }
      flat_.push_back(f);
    }
  };
  auto restore_masters = [&] {
    for (size_t i = 0; i < all.size() && i < masters.size(); ++i)
      nn::assign_tensor_data(all[i].second, masters[i]);
  };
  const bool reduce_in_compute = compute && !options_.reduce_in_fp32;
  if (reduce_in_compute) {
    // The same buckets as in fp32: the cap counts compute-dtype bytes.
    if (cap > 0) cap = std::max<size_t>(1, cap * dtype_size(*compute) / dtype_size(master_dtype_));
    to_compute();
  }
  try {
    NamedParams handles = all;  // the bucketer's copy; `all` keeps the handles for a rollback
    bucketer_ = std::make_unique<GradBucketer>(
        std::move(handles), pg_, cap,
        options_.stage == 1 ? GradReduction::AllReduce : GradReduction::ReduceScatter,
        options_.find_unused_parameters, "zero",
        num_groups_ > 1 ? group_of_ : std::vector<size_t>{});
  } catch (...) {
    restore_masters();  // a refused model keeps its fp32 parameters
    throw;
  }
  if (compute && !reduce_in_compute) to_compute();
  try {
    // Bucketed alike whatever the dtype (the scaled cap): init() fills flat_ by the bucketer's.
    bool same = !compute || layout.size() == bucketer_->buckets().size();
    for (size_t b = 0; same && compute && b < layout.size(); ++b)
      same = layout[b].params == bucketer_->buckets()[b].params &&
             layout[b].offset == bucketer_->buckets()[b].offset &&
             layout[b].numel == bucketer_->buckets()[b].numel;
    ACCEL_CHECK(same, DistError, "zero",
                "internal: the compute-dtype buckets differ from the gradient buckets");
    init(make_optimizer, masters);
  } catch (...) {
    if (compute) restore_masters();
    throw;
  }
  // Note [sync at the end of backward] in parallel/buckets.cc: a plain loss.backward() reduces.
  // Calling the model directly is harmless (ZeRO's forward() broadcasts nothing; it only casts
  // inputs under param_dtype, and a float32 input then fails loudly, not silently).
  bucketer_->set_backward_hooks(nullptr, [this] { sync_gradients(); });
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
  hsdp::broadcast_buffers(options_.replicate, *module_);
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

void ZeroOptimizer::init(const GroupOptimizerFactory& make_optimizer,
                         const std::vector<Tensor>& masters) {
  NoGradGuard no_grad;
  const auto& params = bucketer_->params();
  const auto& buckets = bucketer_->buckets();
  const int r = pg_->rank();
  for (auto& [name, p] : params) shapes_.push_back(p.sizes());
  // Flatten, and start every rank from root's values (bucket by bucket under param_dtype: one
  // fp32 bucket at a time on top of the masters' slices and the compute buffers).
  std::vector<Tensor> flats;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    const DType dt = mixed_precision() ? master_dtype_ : bk.dtype;
    Tensor flat = zeros({bk.numel}, TensorOptions(dt, bk.device));
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const Tensor& p = mixed_precision() ? masters[bk.params[j]] : params[bk.params[j]].second;
      flat.narrow(0, bk.offset[j], p.numel()).copy_(p.reshape({p.numel()}));
    }
    if (pg_->size() > 1) pg_->broadcast(flat, options_.root);
    hsdp::broadcast_from_first_replica(options_.replicate, flat);
    if (!mixed_precision()) {
      flats.push_back(flat);
      continue;
    }
    // Note [zero mixed precision]: the compute buffer in full, the master as this rank's slice.
    const int64_t sn = bk.shard_numel;
    master_.push_back(flat.narrow(0, r * sn, sn).clone());
    flat_[b].copy_(flat);
    if (bk.dtype != master_dtype_)  // reduced in 16 bits
      master_grad_.push_back(zeros({sn}, TensorOptions(master_dtype_, bk.device)));
  }
  if (mixed_precision()) {
    point_params_at(flat_);
    shards_ = master_;
  } else {
    flat_ = flats;
    point_params_at(flat_);
    for (size_t b = 0; b < buckets.size(); ++b)
      shards_.push_back(flat_[b].narrow(0, r * buckets[b].shard_numel, buckets[b].shard_numel));
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

std::vector<Tensor> ZeroOptimizer::forward_values(nn::Values inputs) {
  ACCEL_CHECK(module_ != nullptr, DistError, "zero",
              "forward() needs the Module constructor; with a parameter list call your model");
  ACCEL_CHECK(!bucketer_->in_backward(), DistError, "zero",
              "the previous backward's gradient sync was not finished: call "
              "finish_gradient_sync() (or zero.backward(loss)) first");
  bucketer_->forget_backward_end();  // a new iteration: its backward is not finished yet
  // Mixed precision: the model computes in its parameters' dtype (FSDP casts inputs alike).
  const DType compute = options_.param_dtype.value_or(kFloat32);
  if (mixed_precision())
    for (nn::Value& v : inputs) {
      if (!v.is_tensor()) continue;
      const Tensor& x = v.tensor();
      if (x.defined() && is_floating(x.dtype()) && x.dtype() != compute) v.tensor() = x.to(compute);
    }
  return module_->call_values(std::move(inputs));
}

void ZeroOptimizer::backward(const Tensor& loss) {
  const uint64_t finished = bucketer_->finish_count();
  loss.backward();
  // Synced at its end unless no hook fired here (Note [sync at the end of backward]).
  if (bucketer_->finish_count() == finished) sync_gradients();
}

void ZeroOptimizer::finish_gradient_sync() {
  if (bucketer_->finished_at_backward_end()) return;
  sync_gradients();
}

void ZeroOptimizer::sync_gradients() {
  const bool synced = bucketer_->sync();
  bucketer_->finish();
  if (synced && replicate_sync_ && hsdp::active(options_.replicate))  // Note [hsdp]
    for (size_t b = 0; b < bucketer_->buckets().size(); ++b)
      hsdp::average_across_replicas(
          options_.replicate, options_.stage == 1 ? bucketer_->buffer(b) : bucketer_->shard(b));
  if (mixed_precision() && synced) {
    // Note [zero mixed precision]: fp32 gradient shards; no 16-bit .grad left on the parameters.
    NoGradGuard ng;
    if (!master_grad_.empty())
      for (size_t b = 0; b < master_grad_.size(); ++b) master_grad_[b].copy_(reduced_slice(b));
    if (options_.stage == 1) zero_grad();
  }
  if (options_.stage == 2) bucketer_->release_staging();
}

void ZeroOptimizer::average_shards_across_replicas() {
  for (const Tensor& g : gradient_shards()) hsdp::average_across_replicas(options_.replicate, g);
}

Tensor ZeroOptimizer::reduced_slice(size_t b) const {
  const Bucket& bk = bucketer_->buckets()[b];
  return options_.stage == 1
             ? bucketer_->buffer(b).narrow(0, pg_->rank() * bk.shard_numel, bk.shard_numel)
             : bucketer_->shard(b);
}

std::vector<Tensor> ZeroOptimizer::gradient_shards() const {
  if (!master_grad_.empty()) return master_grad_;
  std::vector<Tensor> out;
  for (size_t b = 0; b < bucketer_->buckets().size(); ++b) out.push_back(reduced_slice(b));
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
  if (!stepped) return;
  NoGradGuard no_grad;
  std::vector<Tensor> mine = shards_;
  if (mixed_precision()) {
    // This rank's updated masters, cast into its slice of the compute buffers.
    const auto& buckets = bucketer_->buckets();
    for (size_t b = 0; b < master_.size(); ++b) {
      const int64_t sn = buckets[b].shard_numel;
      mine[b] = flat_[b].narrow(0, pg_->rank() * sn, sn);
      mine[b].copy_(master_[b]);
    }
  }
  if (pg_->size() == 1) return;
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < shards_.size(); ++b)
    works.push_back(pg_->all_gather_async(flat_[b], mine[b].detach()));
  for (auto& w : works) w->wait();
}

void ZeroOptimizer::use_master_parameters() {
  if (!mixed_precision() || !master_full_.empty()) return;
  NoGradGuard ng;
  const auto& buckets = bucketer_->buckets();
  std::vector<Tensor> full;
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < buckets.size(); ++b) {
    full.push_back(empty({buckets[b].numel}, TensorOptions(master_dtype_, buckets[b].device)));
    if (pg_->size() > 1) {
      works.push_back(pg_->all_gather_async(full.back(), master_[b].detach()));
    } else {
      full.back().copy_(master_[b]);
    }
  }
  for (auto& w : works) w->wait();
  master_full_ = std::move(full);
  point_params_at(master_full_);
}

void ZeroOptimizer::use_compute_parameters(bool take_values) {
  if (master_full_.empty()) return;
  if (take_values) {
    NoGradGuard ng;
    const auto& buckets = bucketer_->buckets();
    for (size_t b = 0; b < buckets.size(); ++b) {
      const int64_t sn = buckets[b].shard_numel;
      master_[b].detach().copy_(master_full_[b].narrow(0, pg_->rank() * sn, sn));
      flat_[b].copy_(master_full_[b]);
    }
  }
  point_params_at(flat_);
  master_full_.clear();
}

void ZeroOptimizer::step() {
  attach_gradients();
  optimizer_->step();
  finish_step(true);
}

io::TensorDict ZeroOptimizer::shard_state_dict() const {
  io::TensorDict out;
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

void ZeroOptimizer::load_shard_state_dict(const io::TensorDict& by_bucket) {
  io::TensorDict copy = by_bucket;
  for (auto& [k, v] : copy)
    if (v.defined()) v = v.clone();  // the caller keeps its tensors to itself
  load_shard_state_dict(std::move(copy));
}

void ZeroOptimizer::load_shard_state_dict(io::TensorDict&& by_bucket) {
  io::TensorDict d;
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
  by_bucket.clear();
  optimizer_->load_state_dict(std::move(d));
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
  m.master_param_bytes = bytes_of(master_);
  m.param_bytes = bytes_of(flat_) + m.master_param_bytes + bytes_of(master_full_);
  if (options_.stage == 1) {
    m.grad_bytes = bucketer_->staging_bytes();
  } else {
    for (size_t b = 0; b < bucketer_->buckets().size(); ++b)
      m.grad_bytes += int64_t(bucketer_->shard(b).nbytes());
    m.grad_bytes += bucketer_->staging_bytes();
  }
  m.grad_bytes += bytes_of(master_grad_);
  for (auto& [key, t] : optimizer_->state_dict())
    if (key.rfind("state.", 0) == 0 && t.defined()) m.optimizer_bytes += int64_t(t.nbytes());
  return m;
}

}  // namespace accel::dist
