// Accelerator facade; see dist/accelerator.h.
#include "core/env_contract.h"
#include "dist/accelerator.h"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <typeinfo>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "autograd/nn/safetensors.h"
#include "autograd/nn/utils.h"
#include "autograd/ops.h"
#include "autograd/optim/adam.h"
#include "autograd/optim/sgd.h"
#include "core/generator.h"
#include "core/storage.h"
#include "dist/checkpoint.h"
#include "dist/env.h"

namespace accel {

namespace fs = std::filesystem;

std::string_view distributed_type_name(DistributedType t) {
  switch (t) {
    case DistributedType::No: return "NO";
    case DistributedType::MultiCPU: return "MULTI_CPU";
    case DistributedType::MultiGPU: return "MULTI_GPU";
  }
  return "?";
}

namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool parse_env_bool(const char* name, const std::string& v) {
  if (v == "1" || v == "true" || v == "True" || v == "TRUE" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "False" || v == "FALSE" || v == "no") return false;
  ACCEL_THROW(ValueError, "accelerator", name, "='", v, "': expected true or false");
}

bool cuda_present() {
  try {
    return get_allocator(Device::cuda(0)) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

void check_config(const AcceleratorConfig& c) {
  ACCEL_CHECK(c.gradient_accumulation_steps >= 1, ValueError, "accelerator",
              "gradient_accumulation_steps must be >= 1, got ", c.gradient_accumulation_steps);
  ACCEL_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3, ValueError, "accelerator",
              "zero_stage must be in 0..3, got ", c.zero_stage);
  ACCEL_CHECK(c.total_limit >= 0, ValueError, "accelerator", "total_limit must be >= 0, got ",
              c.total_limit);
}

// The demangled dynamic type of an object, for messages.
template <typename T>
std::string type_name_of(const T& obj) {
  const char* mangled = typeid(obj).name();
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : mangled;
  std::free(d);
  return out;
}

std::string rank_file(const std::string& stem, int rank, const char* ext) {
  return stem + "_rank" + std::to_string(rank) + ext;
}
std::string indexed(const char* stem, size_t i, const char* ext) {
  return i == 0 ? std::string(stem) + ext : std::string(stem) + "_" + std::to_string(i) + ext;
}

}  // namespace

AcceleratorConfig AcceleratorConfig::with_env() const {
  AcceleratorConfig c = *this;
  if (const char* v = env_or_null(env::kMixedPrecision))
    c.mixed_precision = dist::parse_mixed_precision(v, env::kMixedPrecision);
  if (const char* v = env_or_null(env::kUseCpu)) c.cpu = parse_env_bool(env::kUseCpu, v);
  try {
    if (const char* v = env_or_null(env::kZeroStage))
      c.zero_stage = dist::parse_env_int(env::kZeroStage, v, 0, 3);
    if (const char* v = env_or_null(env::kGradientAccumulationSteps))
      c.gradient_accumulation_steps =
          dist::parse_env_int(env::kGradientAccumulationSteps, v, 1, 1 << 30);
  } catch (const DistError& e) {
    throw ValueError(e.what());
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// construction

Accelerator::Accelerator(AcceleratorConfig config)
    : config_(config.read_env ? config.with_env() : config), scaler_([&] {
        dist::GradScalerOptions o = config_.scaler;
        o.enabled = config_.mixed_precision == MixedPrecision::FP16;
        return o;
      }()) {
  check_config(config_);
  const dist::DistEnv env = dist::read_dist_env();
  rank_ = env.rank;
  world_size_ = env.world_size;
  local_rank_ = env.local_rank;
  local_world_size_ = env.local_world_size;
  const bool gpu = !config_.cpu && cuda_present();
  device_ = gpu ? Device::cuda(local_rank_) : kCPU;
  if (world_size_ > 1) {
    distributed_type_ = gpu ? DistributedType::MultiGPU : DistributedType::MultiCPU;
    if (dist::is_initialized()) {
      group_ = dist::default_group();
    } else {
      dist::InitOptions o;
      o.backend = gpu ? "nccl" : "gloo";
      o.timeout = config_.timeout;
      group_ = dist::init_process_group(o);
      owns_group_ = true;
    }
    ACCEL_CHECK(group_->size() == world_size_ && group_->rank() == rank_, DistError, "accelerator",
                "process group is rank ", group_->rank(), " of ", group_->size(),
                " but the environment says rank ", rank_, " of ", world_size_);
  }
  logging_dir_ = config_.project_dir;
  if (config_.seed) set_seed(*config_.seed);
}

Accelerator::~Accelerator() {
  for (auto& t : trackers_) t->finish();
  if (owns_group_) {
    group_.reset();
    dist::destroy_process_group();
  }
}

// ---------------------------------------------------------------------------------------------
// prepare

namespace {
// Rank 0's value of t on every rank (t may be a non-contiguous view).
void broadcast_in_place(dist::ProcessGroup& group, const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  Tensor tmp = t.contiguous();
  group.broadcast(tmp, 0);
  if (!tmp.is_same(t)) {
    Tensor dst = t;
    dst.copy_(tmp);
  }
}
}  // namespace

void Accelerator::prepare_module(const std::shared_ptr<nn::Module>& model) {
  ACCEL_CHECK(model != nullptr, ValueError, "prepare", "model is null");
  model->to(device_);
  auto replica = std::make_unique<Replica>();
  if (world_size_ > 1) {
    NoGradGuard ng;
    // Every rank starts from rank 0's weights. DDP broadcasts the trainable parameters (and the
    // buffers), ZeRO the trainable parameters when its optimizer is prepared; frozen ones here.
    for (auto& [name, p] : model->named_parameters())
      if (!p.requires_grad()) broadcast_in_place(*group_, p);
    dist::NamedParams trainable = dist::trainable_parameters(*model);
    if (config_.zero_stage == 0 && !trainable.empty()) {
      // The touch hook goes first so that it has run even when a DDP hook throws.
      std::weak_ptr<bool> flag = replica->touched;
      for (auto& [name, p] : trainable) {
        Tensor h = p;
        h.register_post_accumulate_grad_hook([flag](Tensor&) {
          if (auto f = flag.lock()) *f = true;
        });
      }
      dist::DDPOptions o = config_.ddp;
      o.root = 0;
      replica->ddp = std::make_unique<dist::DistributedDataParallel>(model, group_, o);
      replica->paused = std::make_unique<dist::DistributedDataParallel::NoSync>(*replica->ddp);
    } else {
      for (auto& [name, p] : trainable)
        ACCEL_CHECK(p.is_contiguous(), ValueError, "prepare", "parameter ", name,
                    " is not contiguous ", p.shape_str());
      if (config_.zero_stage == 0 || config_.ddp.broadcast_buffers)
        for (auto& [name, b] : model->named_buffers()) broadcast_in_place(*group_, b);
    }
  }
  models_.push_back(model);
  replicas_.push_back(std::move(replica));
}

dist::DistributedDataParallel* Accelerator::ddp(const nn::Module& model) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].get() == &model) return replicas_[i]->ddp.get();
  return nullptr;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(
    std::shared_ptr<optim::Optimizer> opt) {
  ACCEL_CHECK(opt != nullptr, ValueError, "prepare", "optimizer is null");
  auto wrapped = std::make_shared<AcceleratedOptimizer>(*this, std::move(opt));
  if (config_.zero_stage > 0 && world_size_ > 1) {
    // Note [zero in the facade]: ZeRO over this optimizer's parameters, named after the
    // prepared models for its messages.
    const optim::Optimizer& o = wrapped->optimizer();
    ACCEL_CHECK(typeid(o) == typeid(optim::SGD) || typeid(o) == typeid(optim::Adam) ||
                    typeid(o) == typeid(optim::AdamW),
                ValueError, "prepare", "zero_stage ", config_.zero_stage,
                " rebuilds the optimizer over the parameter shards and knows SGD, Adam and "
                "AdamW; got ",
                type_name_of(o));
    ACCEL_CHECK(o.num_param_groups() == 1, ValueError, "prepare", "zero_stage ", config_.zero_stage,
                " shards all parameters as one flat space, so the optimizer "
                "must have one param group; it has ",
                o.num_param_groups());
    std::unordered_map<const TensorImpl*, std::string> names;
    for (size_t i = 0; i < models_.size(); ++i)
      for (auto& [name, p] : models_[i]->named_parameters())
        names.emplace(p.impl(), models_.size() == 1 ? name : std::to_string(i) + "." + name);
    dist::NamedParams named;
    for (const Tensor& p : o.params(0)) {
      auto it = names.find(p.impl());
      std::string name = it != names.end() ? it->second : "param" + std::to_string(named.size());
      ACCEL_CHECK(p.requires_grad(), ValueError, "prepare", "parameter '", name,
                  "' of the optimizer does not require grad; ZeRO shards trainable parameters");
      // ZeRO re-points the parameters into its flat buffers: moving them afterwards would
      // detach them from it.
      ACCEL_CHECK(p.device() == device_, ValueError, "prepare", "parameter '", name, "' is on ",
                  p.device(), ", not ", device_, ": prepare the model before its optimizer");
      named.emplace_back(std::move(name), p);
    }
    wrapped->init_zero(group_, std::move(named), config_.zero_stage);
  }
  optimizers_.push_back(wrapped);
  return wrapped;
}

std::shared_ptr<data::DataLoader> Accelerator::prepare_data_loader(
    std::shared_ptr<data::DataLoader> loader) {
  ACCEL_CHECK(loader != nullptr, ValueError, "prepare", "data loader is null");
  data::DataLoaderOptions o = loader->options();
  o.rank = rank_;
  o.world_size = world_size_;
  o.even_batches = config_.even_batches;
  o.split_batches = config_.split_batches;
  if (device_.is_cuda()) o.pin_memory = true;
  if (config_.device_placement) o.device = device_;
  auto sharded = std::make_shared<data::DataLoader>(loader->dataset(), o);
  // Keep the position the caller's loader had (a loader prepared after load_state_dict).
  if (loader->epoch() != 0 || loader->batches_consumed() != 0)
    sharded->seek(loader->epoch(), loader->batches_consumed());
  loaders_.push_back(sharded);
  return sharded;
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(
    std::shared_ptr<optim::LRScheduler> s) {
  ACCEL_CHECK(s != nullptr, ValueError, "prepare", "scheduler is null");
  auto wrapped = std::make_shared<AcceleratedScheduler>(*this, std::move(s));
  schedulers_.push_back(wrapped);
  return wrapped;
}

std::vector<Tensor> Accelerator::model_params() const {
  std::vector<Tensor> out;
  for (auto& m : models_)
    for (auto& p : m->parameters())
      if (p.requires_grad()) out.push_back(p);
  return out;
}

// ---------------------------------------------------------------------------------------------
// optimizer / scheduler wrappers

AcceleratedOptimizer::AcceleratedOptimizer(Accelerator& acc, std::shared_ptr<optim::Optimizer> opt)
    : acc_(acc), opt_(std::move(opt)) {}

AcceleratedOptimizer::~AcceleratedOptimizer() = default;

namespace {

// The shard optimizer of Note [zero in the facade]: the user's optimizer type, whose step()
// first asks the facade (lr, fp16 unscale and skip).
using StepGate = std::function<bool(optim::Optimizer&)>;

template <typename Base>
class GatedOptimizer final : public Base {
 public:
  template <typename Options>
  GatedOptimizer(std::vector<Tensor> params, const Options& options, StepGate gate)
      : Base(std::move(params), options), gate_(std::move(gate)) {}
  void step() override {
    if (gate_(*this)) Base::step();
  }

 private:
  StepGate gate_;
};

std::unique_ptr<optim::Optimizer> clone_for_shards(const optim::Optimizer& o,
                                                   std::vector<Tensor> shards, StepGate gate) {
  if (typeid(o) == typeid(optim::SGD)) {
    optim::SGDOptions so = static_cast<const optim::SGD&>(o).options();
    so.lr = o.lr(0);
    so.weight_decay = o.weight_decay(0);
    return std::make_unique<GatedOptimizer<optim::SGD>>(std::move(shards), so, std::move(gate));
  }
  if (typeid(o) == typeid(optim::Adam)) {
    optim::AdamOptions ao = static_cast<const optim::Adam&>(o).options();
    ao.lr = o.lr(0);
    ao.weight_decay = o.weight_decay(0);
    return std::make_unique<GatedOptimizer<optim::Adam>>(std::move(shards), ao, std::move(gate));
  }
  if (typeid(o) == typeid(optim::AdamW)) {
    const optim::AdamOptions& a = static_cast<const optim::AdamW&>(o).options();
    optim::AdamWOptions wo;
    wo.lr = o.lr(0);
    wo.beta1 = a.beta1;
    wo.beta2 = a.beta2;
    wo.eps = a.eps;
    wo.weight_decay = o.weight_decay(0);
    wo.fused = a.fused;
    return std::make_unique<GatedOptimizer<optim::AdamW>>(std::move(shards), wo, std::move(gate));
  }
  ACCEL_THROW(ValueError, "prepare",
              "ZeRO through the Accelerator rebuilds the optimizer over "
              "the parameter shards and knows SGD, Adam and AdamW; got ",
              type_name_of(o));
}

}  // namespace

void AcceleratedOptimizer::init_zero(const dist::ProcessGroupPtr& group, dist::NamedParams params,
                                     int stage) {
  dist::ZeroOptions zo;
  zo.stage = stage;
  zo.bucket_cap_bytes = acc_.config_.ddp.bucket_cap_bytes;
  zo.find_unused_parameters = acc_.config_.ddp.find_unused_parameters;
  zo.root = 0;
  // The touch hooks go before ZeRO's own (Note [gradient sync]).
  std::weak_ptr<bool> flag = touched_;
  for (auto& [name, p] : params) {
    Tensor h = p;
    h.register_post_accumulate_grad_hook([flag](Tensor&) {
      if (auto f = flag.lock()) *f = true;
    });
  }
  zero_params_ = params;
  const optim::Optimizer& user = *opt_;
  zero_ = std::make_unique<dist::ZeroOptimizer>(
      std::move(params),
      [&](std::vector<Tensor> shards) {
        auto o = clone_for_shards(user, std::move(shards),
                                  [this](optim::Optimizer& s) { return gate_step(s); });
        shard_opt_ = o.get();
        return o;
      },
      group, zo);
  if (stage >= 2) {
    // Stages 2/3 keep the reduced gradient shards inside the ZeroOptimizer and hand them to the
    // shard optimizer only during step(): one probing step (its update skipped by the gate)
    // records them. They are persistent (dist/buckets.h: GradBucketer::shard), so clipping,
    // unscaling and accumulation can reach them between backward and step; gate_step checks on
    // every step that they still are the same tensors.
    probing_ = true;
    try {
      zero_->step();
    } catch (...) {
      probing_ = false;
      throw;
    }
    probing_ = false;
    ACCEL_CHECK(shard_grads_.size() == zero_->buckets().size(), Error, "prepare",
                "internal: the ZeRO probe saw ", shard_grads_.size(), " gradient shards for ",
                zero_->buckets().size(), " buckets");
  }
  if (stage == 3) zero_->gather_parameters();  // the model is usable right after prepare
}

bool AcceleratedOptimizer::gate_step(optim::Optimizer& s) {
  const std::vector<Tensor>& shards = s.params(0);
  if (probing_) {
    shard_grads_.clear();
    for (const Tensor& t : shards) {
      ACCEL_CHECK(t.grad().defined(), Error, "prepare",
                  "internal: a ZeRO shard has no gradient during step()");
      shard_grads_.push_back(t.grad());
    }
    return false;
  }
  for (size_t b = 0; b < shard_grads_.size(); ++b)
    ACCEL_CHECK(shards[b].grad().is_same(shard_grads_[b]), Error, "zero",
                "internal: the gradient shard of bucket ", b,
                " is not the tensor recorded at "
                "prepare(); the ZeroOptimizer changed how it hands gradients to its optimizer");
  s.set_lr(0, opt_->lr(0));
  s.set_weight_decay(0, opt_->weight_decay(0));
  if (acc_.scaler_.enabled()) {
    // Each rank sees only its slices: the inf/NaN flag is all-reduced inside unscale_().
    acc_.scaler_.unscale_(shards, acc_.group_.get());
    if (acc_.scaler_.found_inf()) return false;
  }
  return true;
}

std::vector<Tensor> AcceleratedOptimizer::shard_params_with_grads() {
  std::vector<Tensor> ps = shard_opt_->params(0);
  for (size_t b = 0; b < ps.size() && b < shard_grads_.size(); ++b) ps[b].set_grad(shard_grads_[b]);
  return ps;
}

void AcceleratedOptimizer::after_zero_backward(bool sync) {
  NoGradGuard ng;
  if (zero_->stage() >= 2) {
    // Each reduce-scatter overwrites the shards: the window's micro-batches add up here.
    if (!sync) {
      if (grad_accum_.empty()) {
        for (auto& g : shard_grads_) grad_accum_.push_back(g.clone());
      } else {
        for (size_t b = 0; b < grad_accum_.size(); ++b) grad_accum_[b].add_(shard_grads_[b]);
      }
    } else if (!grad_accum_.empty()) {
      for (size_t b = 0; b < grad_accum_.size(); ++b) shard_grads_[b].add_(grad_accum_[b]);
      grad_accum_.clear();
    }
  }
  // Stage 3 freed the parameters after the reduction; the window's next forward needs them.
  if (zero_->stage() == 3 && !sync) zero_->gather_parameters();
}

std::vector<Tensor> AcceleratedOptimizer::params() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt_->num_param_groups(); ++g)
    for (const Tensor& p : opt_->params(g)) out.push_back(p);
  return out;
}

bool AcceleratedOptimizer::step() {
  skipped_ = false;
  if (!acc_.sync_gradients_) return false;  // accumulating: gradients are not complete yet
  if (zero_) {
    zero_->step();  // gate_step: lr, unscale, skip on inf/NaN; then the all-gather (stages 1/2)
    if (acc_.scaler_.enabled()) {
      skipped_ = acc_.scaler_.found_inf();
      acc_.scaler_.update();
    }
    if (zero_->stage() == 3) zero_->gather_parameters();  // Note [zero in the facade]
    if (skipped_) return false;
    ++acc_.optimizer_steps_;
    return true;
  }
  if (acc_.scaler_.enabled()) {
    acc_.scaler_.unscale_(params(), acc_.group_.get());
    if (acc_.scaler_.found_inf()) {
      skipped_ = true;
      acc_.scaler_.update();
      return false;
    }
    opt_->step();
    acc_.scaler_.update();
  } else {
    opt_->step();
  }
  ++acc_.optimizer_steps_;
  return true;
}

void AcceleratedOptimizer::zero_grad(bool set_to_none) {
  if (!acc_.sync_gradients_) return;
  if (zero_) {
    zero_->zero_grad();
    return;
  }
  opt_->zero_grad(set_to_none);
}

AcceleratedScheduler::AcceleratedScheduler(Accelerator& acc,
                                           std::shared_ptr<optim::LRScheduler> sched)
    : acc_(acc), sched_(std::move(sched)) {}

void AcceleratedScheduler::step() {
  if (!acc_.sync_gradients_ || acc_.optimizer_step_was_skipped()) return;
  sched_->step();
}

bool Accelerator::optimizer_step_was_skipped() const {
  for (auto& o : optimizers_)
    if (o->step_was_skipped()) return true;
  return false;
}

// ---------------------------------------------------------------------------------------------
// training step

Accelerator::AccumulateScope::AccumulateScope(Accelerator& acc)
    : acc_(acc), prev_no_sync_(acc.no_sync_) {
  ++acc_.step_;
  acc_.sync_gradients_ = acc_.step_ % acc_.config_.gradient_accumulation_steps == 0 ||
                         (acc_.config_.sync_with_dataloader && acc_.at_end_of_loader());
  if (!acc_.sync_gradients_) acc_.no_sync_ = true;
}
Accelerator::AccumulateScope::~AccumulateScope() { acc_.no_sync_ = prev_no_sync_; }

Accelerator::NoSyncScope::NoSyncScope(Accelerator& acc) : acc_(acc), prev_(acc.no_sync_) {
  acc_.no_sync_ = true;
}
Accelerator::NoSyncScope::~NoSyncScope() { acc_.no_sync_ = prev_; }

bool Accelerator::at_end_of_loader() const {
  for (auto& l : loaders_)
    if (l->size() > 0 && l->batches_consumed() == l->size()) return true;
  return false;
}

AutocastGuard Accelerator::autocast() const {
  const bool on = config_.mixed_precision != MixedPrecision::No;
  return AutocastGuard(on, config_.mixed_precision == MixedPrecision::FP16 ? kFloat16 : kBFloat16);
}

void Accelerator::backward(const Tensor& loss) {
  ACCEL_CHECK(loss.defined(), ValueError, "backward", "loss is undefined");
  ACCEL_CHECK(loss.numel() == 1, ShapeError, "backward", "loss must have one element, got ",
              loss.shape_str());
  Tensor l = loss;
  if (config_.gradient_accumulation_steps > 1)
    l = div(l, double(config_.gradient_accumulation_steps));
  l = scaler_.scale_loss(l);
  // Autocast is a forward-pass scope: the backward of every op already runs in the dtypes its
  // forward chose, so a backward() called inside the scope must not cast again.
  AutocastSuspend no_autocast;
  const bool sync = sync_gradients_ && !no_sync_;
  if (world_size_ == 1 || (!sync && !zero_active())) {
    l.backward();
    return;
  }
  run_backward(l, sync);
}

bool Accelerator::zero_active() const {
  for (auto& o : optimizers_)
    if (o->zero_) return true;
  return false;
}

std::vector<AcceleratedOptimizer*> Accelerator::zero_optimizers() const {
  std::vector<AcceleratedOptimizer*> out;
  for (auto& o : optimizers_)
    if (o->zero_) out.push_back(o.get());
  return out;
}

bool Accelerator::grads_sharded() const {
  for (auto& o : optimizers_)
    if (o->zero_ && o->zero_->stage() >= 2) return true;
  return false;
}

// Note [gradient sync]: on a sync step unpause every DDP, run backward (buckets are reduced as
// it goes), wait for the models that got gradients, pause again. ZeRO reduces on every
// micro-batch (Note [zero in the facade]). On an exception the started syncs are still
// finished (they issue the same collectives as the peers') before it propagates.
void Accelerator::run_backward(const Tensor& l, bool sync) {
  const std::vector<AcceleratedOptimizer*> zeros = zero_optimizers();
  for (auto& r : replicas_) {
    *r->touched = false;
    if (sync && r->ddp) r->paused.reset();
  }
  for (auto* z : zeros) *z->touched_ = false;
  auto pause_all = [&] {
    for (auto& r : replicas_)
      if (r->ddp && !r->paused)
        r->paused = std::make_unique<dist::DistributedDataParallel::NoSync>(*r->ddp);
  };
  std::exception_ptr err;
  try {
    l.backward();
  } catch (...) {
    err = std::current_exception();
  }
  for (auto& r : replicas_) {
    if (!sync || !r->ddp || !*r->touched) continue;
    try {
      r->ddp->finish_gradient_sync();
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  for (auto* z : zeros) {
    if (!*z->touched_) continue;
    try {
      z->zero_->finish_gradient_sync();
      if (!err) z->after_zero_backward(sync);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  try {
    pause_all();
  } catch (...) {
    if (!err) err = std::current_exception();
  }
  if (err) std::rethrow_exception(err);
}

double Accelerator::clip_grad_norm_(double max_norm, double p) {
  return clip_grad_norm_(model_params(), max_norm, p);
}

double Accelerator::clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p) {
  if (grads_sharded()) return sharded_clip_grad_norm_(max_norm, p);
  if (scaler_.enabled()) {
    // Unscale every prepared optimizer's gradients (once per step) before measuring them.
    std::vector<Tensor> all;
    for (auto& o : optimizers_)
      for (auto& t : o->params()) all.push_back(t);
    scaler_.unscale_(all.empty() ? params : all, group_.get());
  }
  return nn::clip_grad_norm_(params, max_norm, p);
}

// ZeRO-2/3: every rank holds 1/N of the gradient; the p-norm's p-th power (or the max) is
// reduced across ranks, so the norm and the clipping equal the unsharded ones. The padding of
// the buckets holds zeros and adds nothing. Covers every ZeRO optimizer's gradients.
double Accelerator::sharded_clip_grad_norm_(double max_norm, double p) {
  ACCEL_CHECK(max_norm >= 0, ValueError, "clip_grad_norm_", "max_norm must be >= 0, got ",
              max_norm);
  ACCEL_CHECK(p > 0, ValueError, "clip_grad_norm_", "norm type must be > 0, got ", p);
  std::vector<Tensor> shard_params;
  for (auto* z : zero_optimizers())
    for (auto& t : z->shard_params_with_grads()) shard_params.push_back(t);
  if (scaler_.enabled()) scaler_.unscale_(shard_params, group_.get());
  NoGradGuard ng;
  const bool inf = std::isinf(p);
  Tensor total = zeros({}, TensorOptions(kFloat64, device_));
  for (const Tensor& sp : shard_params) {
    const Tensor g = sp.grad();
    Tensor n = inf        ? amax(abs(g)).to(kFloat64)
               : p == 2.0 ? sum(mul(g, g)).to(kFloat64)
                          : pow(norm(g, p).to(kFloat64), p);
    total = inf ? maximum(total, n) : add(total, n);
  }
  group_->all_reduce(total, inf ? dist::ReduceOp::Max : dist::ReduceOp::Sum);
  const double total_norm = inf ? total.item<double>() : std::pow(total.item<double>(), 1.0 / p);
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef >= 1.0))
    for (const Tensor& sp : shard_params) sp.grad().mul_(coef);
  return total_norm;
}

void Accelerator::clip_grad_value_(double clip_value) {
  if (grads_sharded()) {
    ACCEL_CHECK(clip_value >= 0, ValueError, "clip_grad_value_", "clip_value must be >= 0, got ",
                clip_value);
    std::vector<Tensor> shard_params;
    for (auto* z : zero_optimizers())
      for (auto& t : z->shard_params_with_grads()) shard_params.push_back(t);
    if (scaler_.enabled()) scaler_.unscale_(shard_params, group_.get());
    nn::clip_grad_value_(shard_params, clip_value);
    return;
  }
  if (scaler_.enabled()) {
    std::vector<Tensor> all;
    for (auto& o : optimizers_)
      for (auto& t : o->params()) all.push_back(t);
    scaler_.unscale_(all.empty() ? model_params() : all, group_.get());
  }
  nn::clip_grad_value_(model_params(), clip_value);
}

// ---------------------------------------------------------------------------------------------
// collectives

namespace {
constexpr int64_t kMaxGatherDims = 8;
}

Tensor Accelerator::gather_rows(const Tensor& t, int64_t keep_rows) {
  ACCEL_CHECK(t.defined(), ValueError, "gather", "tensor is undefined");
  Tensor x = t.dim() == 0 ? t.reshape({1}) : t;
  ACCEL_CHECK(keep_rows >= 0 && keep_rows <= x.size(0), ValueError, "gather", "cannot keep ",
              keep_rows, " rows of a tensor of shape ", x.shape_str());
  x = x.narrow(0, 0, keep_rows);
  if (world_size_ == 1) return x.contiguous().clone();
  ACCEL_CHECK(x.dim() <= kMaxGatherDims, ShapeError, "gather", "at most ", kMaxGatherDims,
              " dims supported, got ", x.shape_str());
  NoGradGuard ng;
  // Every rank learns every rank's shape first: rows may differ, the rest must agree.
  std::vector<int64_t> desc(size_t(kMaxGatherDims + 2), -1);
  desc[0] = x.dim();
  desc[1] = int64_t(x.dtype());
  for (int64_t d = 0; d < x.dim(); ++d) desc[size_t(2 + d)] = x.size(d);
  Tensor mine = tensor(desc, {kMaxGatherDims + 2}).to(device_);
  Tensor all = empty({world_size_ * (kMaxGatherDims + 2)}, TensorOptions(kInt64, device_));
  group_->all_gather(all, mine);
  std::vector<int64_t> a = all.cpu().to_vector<int64_t>();
  int64_t max_rows = 0;
  std::vector<int64_t> rows(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    const int64_t* dr = &a[size_t(r * (kMaxGatherDims + 2))];
    bool same = dr[0] == desc[0] && dr[1] == desc[1];
    for (int64_t d = 1; same && d < x.dim(); ++d) same = dr[2 + d] == desc[size_t(2 + d)];
    ACCEL_CHECK(same, ShapeError, "gather", "rank ", r, " has a tensor of ", dr[0], " dims, dtype ",
                DType(dr[1]), " and trailing sizes that differ from rank ", rank_, "'s ",
                x.shape_str(), " (", x.dtype(), ")");
    rows[size_t(r)] = dr[2];
    max_rows = std::max(max_rows, dr[2]);
  }
  Shape padded_shape = x.sizes();
  padded_shape[0] = max_rows;
  Tensor padded = zeros(padded_shape, TensorOptions(x.dtype(), device_));
  if (keep_rows > 0) padded.narrow(0, 0, keep_rows).copy_(x);
  Shape out_shape = padded_shape;
  out_shape[0] = max_rows * world_size_;
  Tensor out = empty(out_shape, TensorOptions(x.dtype(), device_));
  group_->all_gather(out, padded);
  std::vector<Tensor> parts;
  for (int r = 0; r < world_size_; ++r)
    if (rows[size_t(r)] > 0) parts.push_back(out.narrow(0, r * max_rows, rows[size_t(r)]));
  if (parts.empty()) return out.narrow(0, 0, 0).contiguous();
  return cat(parts, 0);
}

Tensor Accelerator::gather(const Tensor& t) { return gather_rows(t, t.dim() == 0 ? 1 : t.size(0)); }

Tensor Accelerator::gather_for_metrics(const Tensor& t, int64_t num_padding) {
  ACCEL_CHECK(t.defined() && t.dim() >= 1, ShapeError, "gather_for_metrics",
              "expected a tensor with a batch dim, got ",
              t.defined() ? t.shape_str() : "undefined");
  ACCEL_CHECK(num_padding >= 0 && num_padding <= t.size(0), ValueError, "gather_for_metrics",
              "num_padding ", num_padding, " is not in [0, ", t.size(0), "] for shape ",
              t.shape_str());
  return gather_rows(t, t.size(0) - num_padding);
}

Tensor Accelerator::gather_for_metrics(const Tensor& t, const data::Batch& batch) {
  ACCEL_CHECK(t.defined() && t.dim() >= 1 && t.size(0) == batch.size(), ShapeError,
              "gather_for_metrics", "tensor ", t.defined() ? t.shape_str() : "undefined",
              " does not have one row per sample of the batch (", batch.size(), ")");
  return gather_for_metrics(t, batch.num_padding);
}

Tensor Accelerator::reduce(const Tensor& t, const std::string& op) {
  dist::ReduceOp rop;
  if (op == "sum")
    rop = dist::ReduceOp::Sum;
  else if (op == "mean")
    rop = dist::ReduceOp::Avg;
  else if (op == "max")
    rop = dist::ReduceOp::Max;
  else if (op == "min")
    rop = dist::ReduceOp::Min;
  else
    ACCEL_THROW(ValueError, "reduce", "unknown reduction '", op, "' (sum, mean, max, min)");
  ACCEL_CHECK(op != "mean" || t.is_floating_point(), DTypeError, "reduce",
              "mean needs a floating tensor, got ", t.dtype());
  Tensor x = t.contiguous().clone();
  if (world_size_ > 1) group_->all_reduce(x, rop);
  return x;
}

Tensor Accelerator::pad_across_processes(const Tensor& t, int64_t dim, double pad_value,
                                         bool pad_first) {
  ACCEL_CHECK(t.defined() && t.dim() >= 1, ShapeError, "pad_across_processes",
              "expected a tensor with at least one dim");
  if (dim < 0) dim += t.dim();
  ACCEL_CHECK(dim >= 0 && dim < t.dim(), IndexError, "pad_across_processes",
              "dim out of range for ", t.shape_str());
  if (world_size_ == 1) return t;
  Tensor mine = tensor(std::vector<int64_t>{t.size(dim)}, {1}).to(device_);
  Tensor all = empty({world_size_}, TensorOptions(kInt64, device_));
  group_->all_gather(all, mine);
  int64_t max_size = 0;
  for (int64_t s : all.cpu().to_vector<int64_t>()) max_size = std::max(max_size, s);
  if (max_size == t.size(dim)) return t;
  Shape pad_shape = t.sizes();
  pad_shape[size_t(dim)] = max_size - t.size(dim);
  Tensor pad = full(pad_shape, pad_value, TensorOptions(t.dtype(), t.device()));
  return pad_first ? cat({pad, t}, dim) : cat({t, pad}, dim);
}

Tensor Accelerator::broadcast(const Tensor& t, int root) {
  ACCEL_CHECK(root >= 0 && root < world_size_, ValueError, "broadcast", "root ", root,
              " is not a rank of ", world_size_);
  if (world_size_ == 1) return t;
  Tensor x = t.contiguous().clone();
  group_->broadcast(x, root);
  return x;
}

// ---------------------------------------------------------------------------------------------
// process control

void Accelerator::wait_for_everyone() {
  if (world_size_ > 1) group_->barrier();
}

void Accelerator::main_process_first(const std::function<void()>& fn) {
  if (is_main_process()) fn();
  wait_for_everyone();
  if (!is_main_process()) fn();
}

void Accelerator::local_main_process_first(const std::function<void()>& fn) {
  if (is_local_main_process()) fn();
  wait_for_everyone();
  if (!is_local_main_process()) fn();
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  manual_seed(seed + (device_specific ? uint64_t(rank_) : 0));
}

// ---------------------------------------------------------------------------------------------
// trackers

void Accelerator::init_trackers(const std::string& run_name,
                                const std::map<std::string, std::string>& config) {
  trackers_ready_ = true;
  if (!is_main_process()) return;
  for (auto& t : trackers_) t->finish();
  trackers_.clear();
  logging_dir_ =
      run_name.empty() ? config_.project_dir : (fs::path(config_.project_dir) / run_name).string();
  for (const std::string& name : config_.log_with) {
    if (name == "all") {
      trackers_.push_back(dist::make_tracker("jsonl", logging_dir_));
      trackers_.push_back(dist::make_tracker("tensorboard", logging_dir_));
    } else {
      trackers_.push_back(dist::make_tracker(name, logging_dir_));
    }
  }
  if (!config.empty())
    for (auto& t : trackers_) t->store_init_configuration(config);
}

void Accelerator::log(const dist::Metrics& metrics, int64_t step) {
  if (!is_main_process()) return;
  if (!trackers_ready_) init_trackers();
  for (auto& t : trackers_) t->log(metrics, step);
}

void Accelerator::end_training() {
  for (auto& t : trackers_) t->finish();
  trackers_.clear();
  trackers_ready_ = false;
  wait_for_everyone();
}

// ---------------------------------------------------------------------------------------------
// checkpoints (Note [atomic checkpoints] in dist/checkpoint.h)

std::string Accelerator::checkpoints_dir() const {
  return (fs::path(config_.project_dir) / "checkpoints").string();
}

void Accelerator::register_for_checkpointing(const std::string& name, SaveFn save, LoadFn load) {
  ACCEL_CHECK(!name.empty() && name.find('/') == std::string::npos, ValueError,
              "register_for_checkpointing", "bad name '", name, "'");
  for (auto& c : customs_)
    ACCEL_CHECK(c.name != name, ValueError, "register_for_checkpointing", "'", name,
                "' is registered already");
  customs_.push_back({name, std::move(save), std::move(load)});
}

// Note [zero checkpoints]
// Under ZeRO each rank writes its shard optimizer's state_dict (zero_optimizer_rank<r>: per
// bucket b "state.<b>.step" and "state.<b>.<slot>", the slot being rank r's slice of the
// bucket's flat buffer, Note [zero layout] in dist/zero.cc) and, inside an accumulation window,
// its accumulated gradient shards (zero_grads_rank<r>: "bucket.<b>"); state.json records each
// bucket's (used, numel) and the world size. Which parameter sits where in a bucket depends
// only on the parameters and bucket_cap_bytes, not on the world size (dist::assign_buckets),
// so another world size only changes the padding and the slice boundaries: a rank of the new
// run reads, from the old ranks' files, just the slices that overlap its new slice. A single
// process (or DDP) cuts the flat buffers into the per-parameter state of the plain optimizer,
// and a plain checkpoint is sharded the same way into a ZeRO run.
namespace {

// One optimizer state as flat per-bucket arrays, whatever way it is stored.
class FlatStateSource {
 public:
  virtual ~FlatStateSource() = default;
  // Slot names with state in bucket b (empty: the bucket never stepped) and its step count.
  // `near` is an element of the bucket the caller will read (to open the right file first).
  virtual std::vector<std::string> slots(size_t b, int64_t near) = 0;
  virtual int64_t step(size_t b, int64_t near) = 0;
  // dst (hi - lo elements) := elements [lo, hi) of slot `slot` of bucket b, hi <= used(b).
  virtual void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) = 0;
};

std::string state_key(size_t i, const std::string& slot) {
  return "state." + std::to_string(i) + "." + slot;
}

// Slot names of "state.<i>.<slot>" keys (without "step").
std::vector<std::string> slots_of(const nn::TensorDict& d, size_t i) {
  const std::string prefix = "state." + std::to_string(i) + ".";
  std::vector<std::string> out;
  for (auto it = d.lower_bound(prefix); it != d.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    std::string slot = it->first.substr(prefix.size());
    if (slot != "step" && slot.find('.') == std::string::npos) out.push_back(slot);
  }
  return out;
}

int64_t step_of(const nn::TensorDict& d, size_t i) {
  auto it = d.find(state_key(i, "step"));
  return it == d.end() ? 0 : int64_t(it->second.item<double>());
}

// The per-rank files of a ZeRO checkpoint (opened lazily, each once).
class ZeroFileSource final : public FlatStateSource {
 public:
  ZeroFileSource(std::function<std::string(int)> file_of, int world, std::vector<int64_t> numel)
      : file_of_(std::move(file_of)), world_(world), numel_(std::move(numel)) {}
  std::vector<std::string> slots(size_t b, int64_t near) override {
    return slots_of(file(owner(b, near)), b);
  }
  int64_t step(size_t b, int64_t near) override { return step_of(file(owner(b, near)), b); }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const int64_t sn = numel_[b] / world_;
    for (int64_t q = lo / sn; q < world_ && q * sn < hi; ++q) {
      const int64_t a = std::max(lo, q * sn), e = std::min(hi, (q + 1) * sn);
      if (a >= e) continue;
      const nn::TensorDict& d = file(int(q));
      auto it = d.find(state_key(b, slot));
      ACCEL_CHECK(it != d.end() && it->second.numel() == sn, IoError, "load_state", "'",
                  file_of_(int(q)), "' has no slice of ", state_key(b, slot), " with ", sn,
                  " elements");
      dst.narrow(0, a - lo, e - a).copy_(it->second.reshape({-1}).narrow(0, a - q * sn, e - a));
    }
  }
  int64_t numel(size_t b) const { return numel_[b]; }

 private:
  int owner(size_t b, int64_t near) const {
    return int(std::min<int64_t>(near / (numel_[b] / world_), world_ - 1));
  }
  const nn::TensorDict& file(int q) {
    auto it = files_.find(q);
    if (it == files_.end()) it = files_.emplace(q, nn::load_safetensors(file_of_(q))).first;
    return it->second;
  }
  std::function<std::string(int)> file_of_;
  int world_;
  std::vector<int64_t> numel_;
  std::map<int, nn::TensorDict> files_;
};

// A plain optimizer's per-parameter state (state.<k>.<slot>) laid out in buckets.
class PlainSource final : public FlatStateSource {
 public:
  PlainSource(const nn::TensorDict& d, std::vector<dist::Bucket> buckets)
      : d_(d), buckets_(std::move(buckets)) {}
  std::vector<std::string> slots(size_t b, int64_t) override {
    std::vector<std::string> out;
    for (size_t k : buckets_[b].params)
      for (auto& s : slots_of(d_, k))
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return out;
  }
  int64_t step(size_t b, int64_t) override {
    int64_t st = 0;
    for (size_t k : buckets_[b].params) st = std::max(st, step_of(d_, k));
    return st;
  }
  void read(size_t b, const std::string& slot, int64_t lo, int64_t hi, Tensor dst) override {
    const dist::Bucket& bk = buckets_[b];
    dst.zero_();  // a parameter without this slot (never stepped) contributes zeros
    for (size_t j = 0; j < bk.params.size(); ++j) {
      auto it = d_.find(state_key(bk.params[j], slot));
      if (it == d_.end()) continue;
      const int64_t off = bk.offset[j], n = it->second.numel();
      const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
      if (a < e)
        dst.narrow(0, a - lo, e - a).copy_(it->second.reshape({-1}).narrow(0, a - off, e - a));
    }
  }

 private:
  const nn::TensorDict& d_;
  std::vector<dist::Bucket> buckets_;
};

// Shard-optimizer state for rank r of `buckets` (the new layout) from `src`.
nn::TensorDict shard_state(FlatStateSource& src, const std::vector<dist::Bucket>& buckets, int r,
                           const nn::TensorDict& param_groups) {
  nn::TensorDict out = param_groups;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const dist::Bucket& bk = buckets[b];
    const int64_t lo = r * bk.shard_numel, hi = std::min(lo + bk.shard_numel, bk.used);
    std::vector<std::string> slots = src.slots(b, std::min(lo, bk.used - 1));
    if (slots.empty()) continue;
    out[state_key(b, "step")] =
        scalar_tensor(src.step(b, std::min(lo, bk.used - 1)), TensorOptions(kInt64));
    for (const std::string& slot : slots) {
      Tensor t = zeros({bk.shard_numel});
      if (lo < hi) src.read(b, slot, lo, hi, t.narrow(0, 0, hi - lo));
      out[state_key(b, slot)] = t;
    }
  }
  return out;
}

// Plain per-parameter state for `params` laid out in `buckets` from `src`.
nn::TensorDict unsharded_state(FlatStateSource& src, const std::vector<dist::Bucket>& buckets,
                               const std::vector<Tensor>& params,
                               const nn::TensorDict& param_groups) {
  nn::TensorDict out = param_groups;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const dist::Bucket& bk = buckets[b];
    std::vector<std::string> slots = src.slots(b, 0);
    if (slots.empty()) continue;
    const int64_t st = src.step(b, 0);
    for (size_t j = 0; j < bk.params.size(); ++j) {
      const size_t k = bk.params[j];
      const Tensor& p = params[k];
      out[state_key(k, "step")] = scalar_tensor(st, TensorOptions(kInt64));
      for (const std::string& slot : slots) {
        Tensor t = zeros({p.numel()});
        src.read(b, slot, bk.offset[j], bk.offset[j] + p.numel(), t);
        out[state_key(k, slot)] = t.view(p.sizes());
      }
    }
  }
  return out;
}

// The "param_groups.*" entries of an optimizer state dict.
nn::TensorDict param_groups_of(const nn::TensorDict& d) {
  nn::TensorDict out;
  for (auto& [k, v] : d)
    if (k.rfind("param_groups.", 0) == 0) out[k] = v;
  return out;
}

}  // namespace

struct ZeroCheckpoint {
  static std::string shard_file(size_t i, int rank) {
    return rank_file(indexed("zero_optimizer", i, ""), rank, ".safetensors");
  }
  static std::string accum_file(size_t i, int rank) {
    return rank_file(indexed("zero_grads", i, ""), rank, ".safetensors");
  }

  // Every rank, inside save_state: its shard files; returns the layout for state.json.
  static nlohmann::json save(Accelerator& acc,
                             const std::function<std::string(const std::string&)>& at) {
    nlohmann::json opts = nlohmann::json::array();
    for (size_t i = 0; i < acc.optimizers_.size(); ++i) {
      AcceleratedOptimizer& o = *acc.optimizers_[i];
      if (!o.zero_) {
        opts.push_back(nullptr);
        continue;
      }
      const std::string f = at(shard_file(i, acc.rank_));
      nn::save_safetensors(f, o.shard_opt_->state_dict());
      dist::fsync_path(f);
      if (!o.grad_accum_.empty()) {
        nn::TensorDict g;
        for (size_t b = 0; b < o.grad_accum_.size(); ++b)
          g["bucket." + std::to_string(b)] = o.grad_accum_[b];
        const std::string gf = at(accum_file(i, acc.rank_));
        nn::save_safetensors(gf, g);
        dist::fsync_path(gf);
      }
      nlohmann::json buckets = nlohmann::json::array();
      for (const dist::Bucket& bk : o.zero_->buckets()) buckets.push_back({bk.used, bk.numel});
      opts.push_back({{"stage", o.zero_->stage()}, {"buckets", buckets}});
    }
    return opts;
  }

  // The bucket layout of optimizer i in the checkpoint, checked against `buckets` (this run's
  // layout of the same parameters).
  static std::vector<int64_t> saved_numel(const nlohmann::json& layout,
                                          const std::vector<dist::Bucket>& buckets,
                                          const std::string& path) {
    const auto& saved = layout.at("buckets");
    bool same = saved.size() == buckets.size();
    std::vector<int64_t> numel;
    for (size_t b = 0; same && b < buckets.size(); ++b) {
      same = saved[b].at(0).get<int64_t>() == buckets[b].used;
      numel.push_back(saved[b].at(1).get<int64_t>());
    }
    ACCEL_CHECK(same, ValueError, "load_state", "checkpoint '", path, "' holds ZeRO state in ",
                saved.size(), " buckets that do not match this run's ", buckets.size(),
                " (the parameters or ddp.bucket_cap_bytes differ)");
    return numel;
  }

  // What load_state hands optimizer i (Note [checkpoint loading]): read and, where the layout
  // differs, re-sharded (Note [zero checkpoints]); nothing is applied yet.
  struct LoadedOptimizer {
    bool zero = false;
    nn::TensorDict state;  // the wrapped optimizer's state (under ZeRO: its param groups)
    nn::TensorDict shard;  // under ZeRO: this rank's shard optimizer state
  };
  static LoadedOptimizer read_optimizer(Accelerator& acc, size_t i, const std::string& path,
                                        const nlohmann::json& zero_layouts, int saved_world) {
    auto at = [&](const std::string& f) { return (fs::path(path) / f).string(); };
    AcceleratedOptimizer& o = *acc.optimizers_[i];
    nn::TensorDict saved = nn::load_safetensors(at(indexed("optimizer", i, ".safetensors")));
    const nlohmann::json* layout = nullptr;
    if (zero_layouts.is_array() && !zero_layouts.at(i).is_null()) layout = &zero_layouts.at(i);
    LoadedOptimizer out;
    if (o.zero_) {
      out.zero = true;
      out.state = param_groups_of(saved);  // lr / weight decay the schedulers set
      const nn::TensorDict own_groups = param_groups_of(o.shard_opt_->state_dict());
      const std::vector<dist::Bucket>& buckets = o.zero_->buckets();
      if (layout) {
        std::vector<int64_t> numel = saved_numel(*layout, buckets, path);
        if (saved_world == acc.world_size_) {
          out.shard = nn::load_safetensors(at(shard_file(i, acc.rank_)));  // the same slices
        } else {
          ZeroFileSource src([&](int q) { return at(shard_file(i, q)); }, saved_world, numel);
          out.shard = shard_state(src, buckets, acc.rank_, own_groups);
        }
      } else {
        PlainSource src(saved, buckets);
        out.shard = shard_state(src, buckets, acc.rank_, own_groups);
      }
      return out;
    }
    if (!layout) {
      out.state = std::move(saved);
      return out;
    }
    // A ZeRO checkpoint into a plain optimizer: cut the flat buffers into per-parameter state.
    const optim::Optimizer& u = *o.opt_;
    ACCEL_CHECK(
        u.num_param_groups() == 1, ValueError, "load_state", "checkpoint '", path,
        "' holds ZeRO state, which loads into an optimizer with one param group; this one has ",
        u.num_param_groups());
    dist::NamedParams named;
    for (const Tensor& p : u.params(0)) named.emplace_back("p", p);
    const std::vector<dist::Bucket> buckets =
        dist::assign_buckets(named, acc.config_.ddp.bucket_cap_bytes, 1);
    std::vector<int64_t> numel = saved_numel(*layout, buckets, path);
    ZeroFileSource src([&](int q) { return at(shard_file(i, q)); }, saved_world, numel);
    out.state = unsharded_state(src, buckets, u.params(0), param_groups_of(saved));
    return out;
  }

  static void apply_optimizer(AcceleratedOptimizer& o, const LoadedOptimizer& l) {
    if (!l.zero) {
      o.load_state_dict(l.state);
      return;
    }
    o.opt_->load_state_dict(l.state);
    o.shard_opt_->load_state_dict(l.shard);
    o.grad_accum_.clear();
  }

  // Stage 3 keeps the truth in its parameter slices: after the model was loaded into the
  // gathered parameters, copy this rank's slices out of them.
  static void refresh_stage3_slices(AcceleratedOptimizer& o, int rank) {
    if (!o.zero_ || o.zero_->stage() != 3) return;
    NoGradGuard ng;
    const std::vector<dist::Bucket>& buckets = o.zero_->buckets();
    std::vector<Tensor> slices = o.shard_opt_->params(0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      const dist::Bucket& bk = buckets[b];
      const int64_t lo = rank * bk.shard_numel, hi = lo + bk.shard_numel;
      Tensor dst = slices[b];
      dst.zero_();
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const Tensor& p = o.zero_params_[bk.params[j]].second;
        const int64_t off = bk.offset[j], n = p.numel();
        const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
        if (a < e) dst.narrow(0, a - lo, e - a).copy_(p.reshape({-1}).narrow(0, a - off, e - a));
      }
    }
  }

  // Accumulated gradient shards of a checkpoint saved inside a window (same world size);
  // nullopt where the optimizer keeps none (not ZeRO-2/3).
  static std::optional<std::vector<Tensor>> read_accum(const AcceleratedOptimizer& o, size_t i,
                                                       const std::string& path, int rank) {
    if (!o.zero_ || o.zero_->stage() < 2) return std::nullopt;
    const std::string f = (fs::path(path) / accum_file(i, rank)).string();
    std::vector<Tensor> out;
    if (!fs::exists(f)) return out;
    nn::TensorDict g = nn::load_safetensors(f);
    for (size_t b = 0; b < o.shard_grads_.size(); ++b) {
      auto it = g.find("bucket." + std::to_string(b));
      ACCEL_CHECK(it != g.end() && it->second.numel() == o.shard_grads_[b].numel(), IoError,
                  "load_state", "'", f, "' has no gradient shard for bucket ", b);
      out.push_back(it->second.to(o.shard_grads_[b].device(), o.shard_grads_[b].dtype()));
    }
    return out;
  }
};

std::string Accelerator::save_state(const std::string& dir) {
  const bool automatic = dir.empty();
  const std::string final_dir =
      automatic ? (fs::path(checkpoints_dir()) /
                   (std::string(dist::kCheckpointPrefix) + std::to_string(save_iteration_)))
                      .string()
                : fs::path(dir).lexically_normal().string();
  const std::string name = fs::path(final_dir).filename().string();
  ACCEL_CHECK(!name.empty() && name != "." && name != "..", ValueError, "save_state",
              "bad checkpoint directory '", dir, "'");
  std::string parent = fs::path(final_dir).parent_path().string();
  if (parent.empty()) parent = ".";
  const std::string tmp = dist::checkpoint_tmp_dir(final_dir);
  auto at = [&](const std::string& f) { return (fs::path(tmp) / f).string(); };

  if (is_main_process()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    ACCEL_CHECK(!ec, IoError, "save_state", "cannot create '", parent, "': ", ec.message());
    dist::begin_checkpoint_dir(tmp);
  }
  wait_for_everyone();
  dist::run_checkpoint_hook("begin");

  // ZeRO-3 frees the full parameters after a synced backward; the model file needs them.
  for (auto* z : zero_optimizers()) z->zero_->gather_parameters();
  // Replicated state (models, optimizers without ZeRO, schedulers): the main process writes it.
  // Under ZeRO the optimizer file holds the wrapper's param groups; the shards follow.
  if (is_main_process()) {
    for (size_t i = 0; i < models_.size(); ++i)
      nn::save_safetensors(at(indexed("model", i, ".safetensors")), models_[i]->state_dict());
    for (size_t i = 0; i < optimizers_.size(); ++i)
      nn::save_safetensors(at(indexed("optimizer", i, ".safetensors")),
                           optimizers_[i]->state_dict());
    for (size_t i = 0; i < schedulers_.size(); ++i)
      nn::save_safetensors(at(indexed("scheduler", i, ".safetensors")),
                           schedulers_[i]->state_dict());
  }
  // Per-rank state: loader positions, RNG, registered objects.
  for (size_t i = 0; i < loaders_.size(); ++i)
    dist::write_file_durable(at(rank_file(indexed("loader", i, ""), rank_, ".json")),
                             data::state_to_json(loaders_[i]->state_dict()));
  dist::write_file_durable(at(rank_file("rng", rank_, ".txt")), default_generator().state());
  const nlohmann::json zero_layout = ZeroCheckpoint::save(*this, at);  // Note [zero checkpoints]
  // Saved inside an accumulation window the local gradients are state too (they are not
  // synced yet, so every rank keeps its own).
  const bool mid_window = !sync_gradients_;
  if (mid_window) {
    for (size_t i = 0; i < models_.size(); ++i) {
      nn::TensorDict grads;
      for (auto& [pname, p] : models_[i]->named_parameters())
        if (p.grad().defined()) grads[pname] = p.grad();
      nn::save_safetensors(at(rank_file(indexed("grads", i, ""), rank_, ".safetensors")), grads);
    }
  }
  for (auto& c : customs_) {
    nlohmann::json j = c.save();
    dist::write_file_durable(at(rank_file("custom_" + c.name, rank_, ".json")), j.dump());
  }
  dist::run_checkpoint_hook("rank_files");
  wait_for_everyone();  // every rank's files are durable before state.json marks completion

  if (is_main_process()) {
    nlohmann::json s;
    s["format"] = 1;
    s["step"] = step_;
    s["optimizer_steps"] = optimizer_steps_;
    s["save_iteration"] = save_iteration_;
    s["world_size"] = world_size_;
    s["mixed_precision"] = std::string(dist::mixed_precision_name(config_.mixed_precision));
    s["zero_stage"] = config_.zero_stage;
    s["num_models"] = models_.size();
    s["num_optimizers"] = optimizers_.size();
    s["num_schedulers"] = schedulers_.size();
    s["num_loaders"] = loaders_.size();
    s["scaler"] = scaler_.state_dict();
    s["sync_gradients"] = sync_gradients_;
    if (zero_active()) s["zero"] = zero_layout;
    std::vector<std::string> customs;
    for (auto& c : customs_) customs.push_back(c.name);
    s["custom"] = customs;
    dist::write_file_durable(at(dist::kCheckpointStateFile), s.dump(2));
    dist::run_checkpoint_hook("state");
    dist::commit_checkpoint_dir(tmp, final_dir);
    dist::run_checkpoint_hook("commit");
  }
  wait_for_everyone();
  if (is_main_process()) {
    dist::write_latest(parent, name);
    dist::run_checkpoint_hook("latest");
    if (automatic) dist::rotate_checkpoints(parent, config_.total_limit, final_dir);
    dist::run_checkpoint_hook("rotate");
  }
  ++save_iteration_;
  wait_for_everyone();
  return final_dir;
}

// Note [checkpoint loading]
// load_state changes nothing unless the whole checkpoint loads:
//   1. read: every file this rank needs (state.json, checked field by field; model, optimizer
//      and scheduler tensors, ZeRO shards re-sharded as needed, loader positions, RNG state,
//      gradients of an open accumulation window, registered objects) into temporaries. A
//      missing, truncated or malformed file is an IoError naming it. Nothing is touched.
//   2. agree: one all-reduce of "did it work" per rank, so that all ranks load or none does
//      (a rank alone in step 3 would wait in the next collective forever).
//   3. apply, after a snapshot of everything it changes. What can still fail here is a
//      component's own check (a model whose shapes differ, an optimizer with other groups, a
//      registered load function that throws): then the snapshot is restored, again on every
//      rank (agreed as in 2), and the error propagates.
// The snapshot copies the model parameters (Module::load_state_dict copies into them in place)
// and keeps handles to the rest: optimizer and scheduler state, gradients and accumulation
// buffers are replaced by the load, not written into, so the old tensors stay intact.
struct CheckpointIo {
  struct Meta {
    int64_t step = 0, optimizer_steps = 0, save_iteration = 0;
    int world_size = 1;
    bool sync_gradients = true;
    size_t num_models = 0, num_optimizers = 0, num_schedulers = 0, num_loaders = 0;
    std::map<std::string, std::string> scaler;
    nlohmann::json zero;  // null, or per optimizer: null or {"stage", "buckets": [[used, numel]]}
  };

  struct LoaderPos {
    bool seek = false;      // another world size: seek to (epoch, batch) instead
    data::StateDict state;  // same world size: the saved loader state
    int64_t epoch = 0, batch = 0;
  };

  struct Loaded {
    std::string path;
    Meta meta;
    std::vector<nn::TensorDict> models;
    std::vector<ZeroCheckpoint::LoadedOptimizer> optimizers;
    std::vector<nn::TensorDict> schedulers;
    std::vector<LoaderPos> loaders;
    std::string rng;
    std::vector<std::optional<std::vector<Tensor>>> accum;      // per optimizer
    std::vector<std::vector<std::pair<Tensor, Tensor>>> grads;  // per model: (param, grad)
    std::vector<std::map<std::string, std::string>> customs;    // parallel to customs_
  };

  struct Snapshot {
    std::vector<nn::TensorDict> models;
    std::vector<std::vector<std::pair<Tensor, Tensor>>> grads;
    std::vector<nn::TensorDict> optimizers, shard_optimizers;
    std::vector<std::vector<Tensor>> accum;
    std::vector<nn::TensorDict> schedulers;
    std::vector<data::StateDict> loaders;
    std::string rng;
    std::vector<std::map<std::string, std::string>> customs;
    std::map<std::string, std::string> scaler;
    int64_t step = 0, optimizer_steps = 0, save_iteration = 0;
    bool sync_gradients = true;
  };

  static Meta read_meta(const std::string& file) {
    const std::string text = dist::read_file(file);
    Meta m;
    try {
      const nlohmann::json s = nlohmann::json::parse(text);
      ACCEL_CHECK(s.is_object(), IoError, "load_state", "'", file, "' is not a JSON object");
      auto field = [&](const char* key, bool (nlohmann::json::*is)() const noexcept,
                       const char* want) -> const nlohmann::json& {
        ACCEL_CHECK(s.contains(key), IoError, "load_state", "'", file, "' has no \"", key, "\"");
        const nlohmann::json& v = s[key];
        ACCEL_CHECK((v.*is)(), IoError, "load_state", "'", file, "': \"", key, "\" must be ", want,
                    ", got ", v.type_name());
        return v;
      };
      auto count = [&](const char* key) {
        return field(key, &nlohmann::json::is_number_unsigned, "a count").get<size_t>();
      };
      ACCEL_CHECK(
          field("format", &nlohmann::json::is_number_integer, "an integer").get<int64_t>() == 1,
          IoError, "load_state", "'", file, "': unsupported checkpoint format ",
          s["format"].dump());
      m.step = field("step", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.optimizer_steps =
          field("optimizer_steps", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.save_iteration =
          field("save_iteration", &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
      m.world_size = field("world_size", &nlohmann::json::is_number_unsigned, "a count").get<int>();
      ACCEL_CHECK(m.world_size >= 1, IoError, "load_state", "'", file, "': world_size ",
                  m.world_size);
      m.sync_gradients =
          field("sync_gradients", &nlohmann::json::is_boolean, "a boolean").get<bool>();
      m.num_models = count("num_models");
      m.num_optimizers = count("num_optimizers");
      m.num_schedulers = count("num_schedulers");
      m.num_loaders = count("num_loaders");
      const nlohmann::json& sc = field("scaler", &nlohmann::json::is_object, "an object");
      for (auto it = sc.begin(); it != sc.end(); ++it) {
        ACCEL_CHECK(it->is_string(), IoError, "load_state", "'", file, "': scaler.", it.key(),
                    " must be a string");
        m.scaler[it.key()] = it->get<std::string>();
      }
      if (s.contains("zero")) {
        const nlohmann::json& z = field("zero", &nlohmann::json::is_array, "an array");
        bool well_formed = z.size() == m.num_optimizers;
        for (const auto& e : z) {
          if (e.is_null()) continue;
          well_formed =
              well_formed && e.is_object() && e.contains("buckets") && e["buckets"].is_array();
          if (!well_formed) break;
          for (const auto& b : e["buckets"])
            well_formed = well_formed && b.is_array() && b.size() == 2 &&
                          b[0].is_number_integer() && b[1].is_number_integer() &&
                          b[1].get<int64_t>() > 0;
        }
        ACCEL_CHECK(well_formed, IoError, "load_state", "'", file, "': malformed ZeRO layout");
        m.zero = z;
      }
    } catch (const nlohmann::json::exception& e) {
      ACCEL_THROW(IoError, "load_state", "'", file,
                  "' is not a valid checkpoint state: ", e.what());
    }
    return m;
  }

  // Step 1 of Note [checkpoint loading]: reads, checks, changes nothing.
  static Loaded read(Accelerator& acc, const std::string& path) {
    auto at = [&](const std::string& f) { return (fs::path(path) / f).string(); };
    Loaded l;
    l.path = path;
    l.meta = read_meta(at(dist::kCheckpointStateFile));
    const Meta& m = l.meta;
    auto count = [&](size_t theirs, size_t mine, const char* what) {
      ACCEL_CHECK(theirs == mine, ValueError, "load_state", "checkpoint '", path, "' holds ",
                  theirs, " ", what, ", this accelerator prepared ", mine);
    };
    const bool saved_zero = !m.zero.is_null();
    // Re-sharding (Note [zero checkpoints]) is what lets a ZeRO checkpoint, or a plain one into
    // a ZeRO run, change world size; otherwise resume is exact and needs the same processes.
    const bool reshard = m.world_size != acc.world_size_;
    ACCEL_CHECK(!reshard || saved_zero || acc.zero_active(), ValueError, "load_state",
                "checkpoint '", path, "' was saved by ", m.world_size, " processes, this run has ",
                acc.world_size_,
                " (only ZeRO checkpoints, or loads into a ZeRO run, change the world size)");
    ACCEL_CHECK(!reshard || m.sync_gradients, ValueError, "load_state", "checkpoint '", path,
                "' was saved inside a gradient accumulation window by ", m.world_size,
                " processes; its per-rank gradients only resume with ", m.world_size);
    count(m.num_models, acc.models_.size(), "models");
    count(m.num_optimizers, acc.optimizers_.size(), "optimizers");
    count(m.num_schedulers, acc.schedulers_.size(), "schedulers");
    count(m.num_loaders, acc.loaders_.size(), "data loaders");
    // A rank's own file, or rank 0's when the checkpoint had fewer ranks.
    auto rank_or_first = [&](const std::string& stem, const char* ext) {
      std::string f = at(rank_file(stem, acc.rank_, ext));
      return (!reshard || fs::exists(f)) ? f : at(rank_file(stem, 0, ext));
    };

    for (size_t i = 0; i < acc.models_.size(); ++i)
      l.models.push_back(nn::load_safetensors(at(indexed("model", i, ".safetensors"))));
    for (size_t i = 0; i < acc.optimizers_.size(); ++i)
      l.optimizers.push_back(ZeroCheckpoint::read_optimizer(acc, i, path, m.zero, m.world_size));
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      l.schedulers.push_back(nn::load_safetensors(at(indexed("scheduler", i, ".safetensors"))));
    for (size_t i = 0; i < acc.loaders_.size(); ++i) {
      const std::string f =
          at(rank_file(indexed("loader", i, ""), reshard ? 0 : acc.rank_, ".json"));
      LoaderPos pos;
      try {
        pos.state = data::state_from_json(dist::read_file(f));
        if (reshard) {
          // Another world size shards the data differently: resume at the same global sample
          // of the saved epoch (rounded down to a whole global batch of this run).
          pos.seek = true;
          const data::StateDict& ls = pos.state;
          pos.epoch = std::stoll(ls.at("epoch"));
          const int64_t consumed = std::stoll(ls.at("batches_consumed"));
          const int64_t old_batch = std::stoll(ls.at("batch_size"));
          const int64_t old_global =
              ls.at("split_batches") == "1" ? old_batch : old_batch * m.world_size;
          const int64_t global = acc.loaders_[i]->batch_sampler().global_batch_size();
          pos.batch =
              std::min(global > 0 ? consumed * old_global / global : 0, acc.loaders_[i]->size());
        }
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& e) {  // ValueError of state_from_json, std::stoll, at()
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid loader state: ", e.what());
      }
      l.loaders.push_back(std::move(pos));
    }
    {
      const std::string f = rank_or_first("rng", ".txt");
      l.rng = dist::read_file(f);
      Generator probe(0);
      try {
        probe.set_state(l.rng);
      } catch (const std::exception& e) {
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid generator state: ", e.what());
      }
    }
    for (size_t i = 0; i < acc.optimizers_.size(); ++i)
      l.accum.push_back(m.sync_gradients
                            ? std::nullopt
                            : ZeroCheckpoint::read_accum(*acc.optimizers_[i], i, path, acc.rank_));
    l.grads.resize(acc.models_.size());
    for (size_t i = 0; i < acc.models_.size() && !m.sync_gradients; ++i) {
      const std::string f = at(rank_file(indexed("grads", i, ""), acc.rank_, ".safetensors"));
      nn::TensorDict grads = nn::load_safetensors(f);
      for (auto& [pname, p] : acc.models_[i]->named_parameters()) {
        auto it = grads.find(pname);
        if (it == grads.end()) continue;
        ACCEL_CHECK(it->second.sizes() == p.sizes(), ShapeError, "load_state", "'", f,
                    "': gradient of ", pname, " has shape ", it->second.shape_str(), ", parameter ",
                    p.shape_str());
        l.grads[i].emplace_back(p, it->second.to(p.device(), p.dtype()));
      }
    }
    for (auto& c : acc.customs_) {
      const std::string f = rank_or_first("custom_" + c.name, ".json");
      ACCEL_CHECK(fs::exists(f), IoError, "load_state", "checkpoint '", path,
                  "' has no state for '", c.name, "' (", f, ")");
      try {
        l.customs.push_back(
            nlohmann::json::parse(dist::read_file(f)).get<std::map<std::string, std::string>>());
      } catch (const nlohmann::json::exception& e) {
        ACCEL_THROW(IoError, "load_state", "'", f, "' is not a valid state of '", c.name,
                    "': ", e.what());
      }
    }
    return l;
  }

  // Step 3 of Note [checkpoint loading].
  static void apply(Accelerator& acc, const Loaded& l) {
    for (size_t i = 0; i < acc.models_.size(); ++i) acc.models_[i]->load_state_dict(l.models[i]);
    for (auto* z : acc.zero_optimizers()) ZeroCheckpoint::refresh_stage3_slices(*z, acc.rank_);
    for (size_t i = 0; i < acc.optimizers_.size(); ++i)
      ZeroCheckpoint::apply_optimizer(*acc.optimizers_[i], l.optimizers[i]);
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      acc.schedulers_[i]->load_state_dict(l.schedulers[i]);
    for (size_t i = 0; i < acc.loaders_.size(); ++i) {
      if (l.loaders[i].seek) {
        acc.loaders_[i]->seek(l.loaders[i].epoch, l.loaders[i].batch);
      } else {
        acc.loaders_[i]->load_state_dict(l.loaders[i].state);
      }
    }
    default_generator().set_state(l.rng);
    acc.sync_gradients_ = l.meta.sync_gradients;
    for (size_t i = 0; i < acc.optimizers_.size(); ++i) {
      if (acc.sync_gradients_) {
        acc.optimizers_[i]->grad_accum_.clear();
      } else if (l.accum[i]) {
        acc.optimizers_[i]->grad_accum_ = *l.accum[i];
      }
    }
    NoGradGuard ng;
    for (size_t i = 0; i < acc.models_.size(); ++i) {
      acc.models_[i]->zero_grad(true);
      for (const auto& [p, g] : l.grads[i]) Tensor(p).set_grad(g);
    }
    for (size_t i = 0; i < acc.customs_.size(); ++i) acc.customs_[i].load(l.customs[i]);
    acc.scaler_.load_state_dict(l.meta.scaler);
    acc.step_ = l.meta.step;
    acc.optimizer_steps_ = l.meta.optimizer_steps;
    acc.save_iteration_ = l.meta.save_iteration + 1;
  }

  static Snapshot snapshot(Accelerator& acc) {
    Snapshot s;
    NoGradGuard ng;
    for (auto& m : acc.models_) {
      nn::TensorDict d = m->state_dict();
      for (auto& [k, v] : d) v = v.clone();  // loads copy into parameters in place
      s.models.push_back(std::move(d));
      std::vector<std::pair<Tensor, Tensor>> g;
      for (auto& [pname, p] : m->named_parameters()) g.emplace_back(p, p.grad());
      s.grads.push_back(std::move(g));
    }
    for (auto& o : acc.optimizers_) {
      s.optimizers.push_back(o->opt_->state_dict());
      s.shard_optimizers.push_back(o->shard_opt_ ? o->shard_opt_->state_dict() : nn::TensorDict{});
      s.accum.push_back(o->grad_accum_);
    }
    for (auto& sc : acc.schedulers_) s.schedulers.push_back(sc->state_dict());
    for (auto& ld : acc.loaders_) s.loaders.push_back(ld->state_dict());
    s.rng = default_generator().state();
    for (auto& c : acc.customs_) s.customs.push_back(c.save());
    s.scaler = acc.scaler_.state_dict();
    s.step = acc.step_;
    s.optimizer_steps = acc.optimizer_steps_;
    s.save_iteration = acc.save_iteration_;
    s.sync_gradients = acc.sync_gradients_;
    return s;
  }

  static void restore(Accelerator& acc, const Snapshot& s) {
    NoGradGuard ng;
    for (size_t i = 0; i < acc.models_.size(); ++i) {
      acc.models_[i]->load_state_dict(s.models[i]);
      for (const auto& [p, g] : s.grads[i]) Tensor(p).set_grad(g);
    }
    for (auto* z : acc.zero_optimizers()) ZeroCheckpoint::refresh_stage3_slices(*z, acc.rank_);
    for (size_t i = 0; i < acc.optimizers_.size(); ++i) {
      AcceleratedOptimizer& o = *acc.optimizers_[i];
      o.opt_->load_state_dict(s.optimizers[i]);
      if (o.shard_opt_) o.shard_opt_->load_state_dict(s.shard_optimizers[i]);
      o.grad_accum_ = s.accum[i];
    }
    for (size_t i = 0; i < acc.schedulers_.size(); ++i)
      acc.schedulers_[i]->load_state_dict(s.schedulers[i]);
    for (size_t i = 0; i < acc.loaders_.size(); ++i) acc.loaders_[i]->load_state_dict(s.loaders[i]);
    default_generator().set_state(s.rng);
    for (size_t i = 0; i < acc.customs_.size(); ++i) acc.customs_[i].load(s.customs[i]);
    acc.scaler_.load_state_dict(s.scaler);
    acc.step_ = s.step;
    acc.optimizer_steps_ = s.optimizer_steps;
    acc.save_iteration_ = s.save_iteration;
    acc.sync_gradients_ = s.sync_gradients;
  }

  // Step 2: the ranks whose `failed` was true (collective; every rank gets the same list).
  static std::vector<int> failed_ranks(Accelerator& acc, bool failed) {
    if (acc.world_size_ == 1) return failed ? std::vector<int>{0} : std::vector<int>{};
    Tensor flags = zeros({acc.world_size_}, TensorOptions(kFloat32, acc.device_));
    if (failed) flags.narrow(0, acc.rank_, 1).fill_(1.0);
    acc.group_->all_reduce(flags, dist::ReduceOp::Sum);
    std::vector<int> out;
    for (int r = 0; r < acc.world_size_; ++r)
      if (flags.narrow(0, r, 1).item<double>() > 0) out.push_back(r);
    return out;
  }

  // Rethrows this rank's own error, or names the ranks that failed.
  [[noreturn]] static void rethrow(const std::exception_ptr& err, const std::vector<int>& failed,
                                   const std::string& dir, const char* what) {
    if (err) std::rethrow_exception(err);
    std::string ranks;
    for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    ACCEL_THROW(IoError, "load_state", "rank(s) ", ranks, " could not ", what, " checkpoint '", dir,
                "'; no rank changed anything");
  }
};

std::string Accelerator::load_state(const std::string& dir) {
  const std::string where = dir.empty() ? checkpoints_dir() : dir;
  for (auto* z : zero_optimizers()) z->zero_->gather_parameters();  // stage 3: full shapes
  std::exception_ptr err;
  std::optional<CheckpointIo::Loaded> loaded;
  try {
    loaded = CheckpointIo::read(*this, dist::resolve_checkpoint_dir(where));
  } catch (...) {
    err = std::current_exception();
  }
  std::vector<int> failed = CheckpointIo::failed_ranks(*this, bool(err));
  if (!failed.empty()) CheckpointIo::rethrow(err, failed, where, "read");

  const CheckpointIo::Snapshot before = CheckpointIo::snapshot(*this);
  try {
    CheckpointIo::apply(*this, *loaded);
  } catch (...) {
    err = std::current_exception();
  }
  failed = CheckpointIo::failed_ranks(*this, bool(err));
  if (!failed.empty()) {
    try {
      CheckpointIo::restore(*this, before);
    } catch (...) {  // the state came from these very objects; keep the error that matters
    }
    CheckpointIo::rethrow(err, failed, where, "load");
  }
  return loaded->path;
}

}  // namespace accel
