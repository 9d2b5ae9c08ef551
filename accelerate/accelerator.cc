// Accelerator facade; see accelerate/accelerator.h.
#include "core/env_contract.h"
#include "accelerate/accelerator.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "nn/load_report.h"
#include "nn/utils.h"
#include "autograd/ops.h"
#include "core/generator.h"
#include "core/settings.h"
#include "core/storage.h"
#include "accelerate/checkpoint.h"
#include "accelerate/composition.h"
#include "accelerate/config_detail.h"
#include "comm/env.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"

namespace accel {

namespace fs = std::filesystem;

namespace {

bool cuda_present() {
  try {
    return get_allocator(Device::cuda(0)) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

using config_detail::check_config;
using config_detail::resolve_strategy;

// ---------------------------------------------------------------------------------------------
// construction

Accelerator::Accelerator(AcceleratorConfig config)
    : config_([&] {
        AcceleratorConfig c = config.read_env ? config.with_env() : config;
        resolve_strategy(c, /*fill_name=*/true);
        return c;
      }()),
      scaler_([&] {
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
  mesh_ = std::make_unique<dist::DeviceMesh>(config_detail::build_mesh(config_, env));
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
  // Note [mesh agreement] in parallel/parallel_dims.h: before any subgroup is made.
  config_detail::check_mesh_agreement(config_, group_);
  mesh_ = std::make_unique<dist::DeviceMesh>(config_detail::mesh_with_groups(*mesh_, group_));
  dist::StrategyContext ctx;
  ctx.group = group_;
  ctx.rank = rank_;
  ctx.world_size = world_size_;
  // Note [mesh support] in accelerate/accelerator_mesh.cc; with cp the engine's groups take the
  // cp ranks in (Note [context-parallel groups] in comm/device_mesh.cc).
  ctx.dp = mesh_->group("dp_cp");
  ctx.dp_shard = mesh_->group("dp_shard_cp");
  ctx.dp_replicate = mesh_->group("dp_replicate");
  ctx.device = device_;
  ctx.scaler = &scaler_;
  ctx.ddp = config_.ddp;
  ctx.mixed_precision = config_.mixed_precision;
  const dist::StrategySpec& spec = *dist::find_strategy(config_.strategy);  // resolved above
  ctx.options = config_detail::strategy_options(config_, spec);
  strategy_ = config_detail::compose_strategy(config_, *mesh_, group_, ctx, spec);
  logging_dir_ = config_.project_dir;
  if (config_.seed) set_seed(*config_.seed);
  config_detail::publish_data_shard(*mesh_, world_size_, this);
}

Accelerator::~Accelerator() {
  for (auto& t : trackers_) t->finish();
  config_detail::withdraw_data_shard(this);
  if (owns_group_) {
    // The strategy and the mesh hold subgroups of the world: gone before the world is.
    strategy_.reset();
    mesh_.reset();
    group_.reset();
    dist::destroy_process_group();
  }
}

// ---------------------------------------------------------------------------------------------
// prepare

void Accelerator::prepare_module(const std::shared_ptr<nn::Module>& model) {
  ACCEL_CHECK(model != nullptr, ValueError, "prepare", "model is null");
  model->to(device_);
  strategy_->prepare_model(model);
  models_.push_back(model);
  // Note [plain backward]: notice gradients that did not come through Accelerator::backward.
  std::weak_ptr<BackwardFlags> flags = backward_flags_;
  for (auto& [name, p] : model->named_parameters()) {
    if (!p.requires_grad()) continue;
    Tensor h = p;
    h.register_post_accumulate_grad_hook([flags](Tensor&) {
      if (auto f = flags.lock(); f && !f->in_accelerator_backward) f->plain_backward = true;
    });
  }
}

dist::DistributedDataParallel* Accelerator::ddp(const nn::Module& model) const {
  return strategy_->ddp(model);
}

size_t Accelerator::model_index(const nn::Module& model, const char* op) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].get() == &model) return i;
  ACCEL_THROW(ValueError, op, "the ", model.type_name(),
              " is not a model this accelerator prepared");
}

io::TensorDict Accelerator::get_state_dict(const nn::Module& model) {
  return strategy_->checkpoint().full_state_dict(model_index(model, "get_state_dict"));
}

// A rank that fails (the main process cannot write the file) must not leave the others waiting:
// the outcome is agreed on, and every rank raises.
void Accelerator::save_model(const nn::Module& model, const std::string& path) {
  const size_t index = model_index(model, "save_model");
  std::exception_ptr err;
  try {
    strategy_->checkpoint().save_model(index, path);
  } catch (...) {
    err = std::current_exception();
  }
  if (world_size_ > 1) {
    Tensor failed = full({1}, err ? 1.0 : 0.0, TensorOptions(kFloat32, device_));
    group_->all_reduce(failed, dist::ReduceOp::Max);
    ACCEL_CHECK(err || failed.item<double>() == 0, IoError, "save_model",
                "another rank could not write '", path, "'");
  }
  if (err) std::rethrow_exception(err);
}

std::vector<int> Accelerator::agree_failed(bool failed) {
  if (world_size_ == 1) return failed ? std::vector<int>{0} : std::vector<int>{};
  Tensor flags = zeros({world_size_}, TensorOptions(kFloat32, device_));
  if (failed) flags.narrow(0, rank_, 1).fill_(1.0);
  group_->all_reduce(flags, dist::ReduceOp::Sum);
  std::vector<int> out;
  const std::vector<double> v = flags.cpu().tolist();
  for (int r = 0; r < world_size_; ++r)
    if (v[size_t(r)] > 0) out.push_back(r);
  return out;
}

namespace {

// The names and shapes of `src` against the model's state (Module::load_state_dict's rules).
// `cp`: the strategy of prepared model `index` (tensor parallelism: the file holds full tensors,
// the model its shards; pipeline parallelism: other stages hold some entries), or null.
nn::LoadResult check_model_source(const nn::Module& model, io::SafetensorsCheckpoint& src,
                                  bool strict, const dist::StrategyCheckpoint* cp, size_t index) {
  const io::TensorDict own = model.state_handles();
  // A tied name the file lacks gets its values through another name of the same tensor (files
  // written by transformers drop tied names without recording them): the file learns it as an
  // alias, so every strategy reads it under whichever name it keeps.
  const std::map<std::string, std::string> alias_of = model.tied_aliases();  // alias -> first
  auto tied_in_file = [&](const std::string& name) -> std::string {
    auto it = alias_of.find(name);
    const std::string& first = it == alias_of.end() ? name : it->second;
    if (first != name && src.contains(first)) return first;
    for (const auto& [alias, f] : alias_of)
      if (f == first && alias != name && src.contains(alias)) return alias;
    return {};
  };
  nn::LoadResult r;
  std::vector<std::string> mismatched;
  for (const auto& [name, t] : own) {
    if (!src.contains(name)) {
      const std::string other = tied_in_file(name);
      if (!other.empty()) {
        src.add_alias(name, other);
        continue;
      }
      r.missing_keys.push_back(name);
    } else if (const Shape want = cp ? cp->full_shape(index, name, t.sizes()) : t.sizes();
               src.info(name).shape != want) {
      mismatched.push_back(name + ": file " + shape_str(src.info(name).shape) + ", model " +
                           shape_str(want));
    }
  }
  for (const std::string& name : src.names())
    if (!own.count(name) && !(cp && cp->held_elsewhere(index, name)))
      r.unexpected_keys.push_back(name);
  if (mismatched.empty() && (!strict || (r.missing_keys.empty() && r.unexpected_keys.empty())))
    return r;
  ACCEL_THROW(ValueError, "load_model", "'", src.path(), "' does not fit the ", model.type_name(),
              nn::load_report(r, mismatched, strict),
              strict ? " (strict = false loads the names both have)" : "");
}

}  // namespace

// Note [streaming model loads]
// Accelerator::load_model reads pretrained weights the way a ZeRO-3 resume reads its shards: the
// file (or every file of a sharded set) is opened and its header checked, names and shapes are
// compared with the model on every rank and agreed on (all ranks load or none does), then each
// rank reads, with pread, only what it keeps, straight into the model's tensors: under ZeRO-3
// its span of each trainable parameter (1/N of the model) and the buffers and frozen parameters
// whole, then the root units are gathered; under DDP, ZeRO-1/2 and one process every tensor
// whole (every rank holds the whole model; under ZeRO-1/2 param_dtype into the fp32 masters,
// gathered whole for the while as a checkpoint save does). No rank ever holds another copy of
// the model, so the load's peak is the model state itself plus a bounded conversion buffer
// (io::kSafetensorsReadChunkBytes) when the file's dtype differs.
nn::LoadResult Accelerator::load_model(nn::Module& model, const std::string& path, bool strict) {
  std::optional<size_t> index;
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].get() == &model) index = i;
  std::exception_ptr err;
  std::unique_ptr<io::SafetensorsCheckpoint> src;
  nn::LoadResult result;
  try {
    if (!index)
      ACCEL_CHECK(model.sharded().empty(), ValueError, "load_model", "the ", model.type_name(),
                  " is sharded by an engine this accelerator did not prepare: ", model.sharded());
    src = std::make_unique<io::SafetensorsCheckpoint>(path);
    result = check_model_source(model, *src, strict, index ? &strategy_->checkpoint() : nullptr,
                                index.value_or(0));
  } catch (...) {
    err = std::current_exception();
  }
  if (!index) {  // not prepared: this process alone, the whole model
    if (err) std::rethrow_exception(err);
    NoGradGuard ng;
    for (auto& [name, t] : model.state_handles()) {
      if (!src->contains(name)) continue;
      if (nn::is_deferred(t)) t.storage()->materialize();
      dist::read_into(*src, name, 0, t.numel(), t);
    }
    return result;
  }
  std::vector<int> failed = agree_failed(bool(err));
  auto raise = [&](const char* what) {
    if (err) std::rethrow_exception(err);
    std::string ranks;
    for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    ACCEL_THROW(IoError, "load_model", "rank(s) ", ranks, " could not ", what, " '", path, "'");
  };
  if (!failed.empty()) raise("load");
  strategy_->checkpoint().load_model(*index, *src, err);
  failed = agree_failed(bool(err));
  if (!failed.empty()) raise("read (the model is partly loaded)");
  return result;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(
    std::shared_ptr<optim::Optimizer> opt) {
  ACCEL_CHECK(opt != nullptr, ValueError, "prepare", "optimizer is null");
  std::shared_ptr<optim::Optimizer> stepping = strategy_->prepare_optimizer(opt);
  auto wrapped = std::make_shared<AcceleratedOptimizer>(*this, std::move(opt), std::move(stepping));
  optimizers_.push_back(wrapped);
  return wrapped;
}

std::shared_ptr<data::DataLoader> Accelerator::prepare_data_loader(
    std::shared_ptr<data::DataLoader> loader) {
  ACCEL_CHECK(loader != nullptr, ValueError, "prepare", "data loader is null");
  data::DataLoaderOptions o = loader->options();
  o.rank = mesh_->coordinate("dp");  // tp ranks of one dp index read the same batches
  o.world_size = mesh_->size("dp");
  // Context parallelism: each rank of a cp group reads the same batches and keeps its tokens.
  const dist::SequenceSplit seq = dist::sequence_split(*mesh_);
  o.sequence_shard = {.dim = 1, .rank = seq.rank, .size = seq.size};
  o.even_batches = config_.even_batches;
  o.split_batches = config_.split_batches;
  if (device_.is_cuda()) o.pin_memory = true;
  if (config_.device_placement) o.device = device_;
  auto sharded = std::make_shared<data::DataLoader>(loader->dataset(), o);
  // Keep the caller's global position (after load_state_dict; Note [global loader position]).
  if (loader->epoch() != 0 || loader->batches_consumed() != 0)
    sharded->resume(loader->position(), is_main_process() ? "prepare" : nullptr);
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
// optimizer / scheduler wrappers (Note [strategy seam] in accelerate/strategy.h)

AcceleratedOptimizer::AcceleratedOptimizer(Accelerator& acc, std::shared_ptr<optim::Optimizer> opt,
                                           std::shared_ptr<optim::Optimizer> stepping)
    : acc_(acc), opt_(std::move(opt)), stepping_(stepping ? std::move(stepping) : opt_) {}

AcceleratedOptimizer::~AcceleratedOptimizer() = default;

std::vector<Tensor> AcceleratedOptimizer::params() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt_->num_param_groups(); ++g)
    for (const Tensor& p : opt_->params(g)) out.push_back(p);
  return out;
}

bool AcceleratedOptimizer::step() {
  skipped_ = false;
  if (!acc_.sync_gradients()) return false;  // accumulating: gradients are not complete yet
  skipped_ = !acc_.step_prepared_optimizer(*this);
  return !skipped_;
}

Tensor AcceleratedOptimizer::step(const std::function<Tensor()>& closure) {
  ACCEL_CHECK(bool(closure), ValueError, "AcceleratedOptimizer.step", "empty closure");
  if (stepping_->requires_closure()) {
    skipped_ = false;
    return acc_.step_prepared_closure(*this, closure);
  }
  Tensor loss;
  {
    EnableGradGuard grad;
    loss = closure();
  }
  step();
  return loss;
}

void AcceleratedOptimizer::zero_grad(bool set_to_none) {
  if (!acc_.sync_gradients()) return;
  acc_.zero_grad_prepared_optimizer(*this, set_to_none);
}

void Accelerator::zero_grad_prepared_optimizer(AcceleratedOptimizer& o, bool set_to_none) {
  check_plain_backward("zero_grad");
  backward_flags_->plain_backward = false;  // the next step's gradients start here
  strategy_->zero_grad(o.stepping_optimizer(), set_to_none);
}

// Note [plain backward]
// A prepared model's gradients are synced by the strategy's gradient hooks, armed on sync steps
// outside no_sync() (Strategy::set_sync, kept up to date by accumulate(), no_sync() and
// load_state), with the wait at the end of the backward (Note [end-of-backward callbacks] in
// autograd/engine.h), as PyTorch DDP and FSDP do. So a plain loss.backward() gives the same
// gradients as acc.backward(loss) whenever the latter would not change the loss: the sync is the
// same, under DDP, ZeRO 1-3 and one process, with accumulate() and no_sync() windows alike.
// acc.backward also divides the loss by gradient_accumulation_steps and multiplies it by the
// fp16 loss scale; a plain backward cannot, and the unscale of a gradient that was never scaled
// (or k times too large) would be silently wrong. The accelerator's own gradient hooks notice a
// gradient that arrived outside acc.backward; with gradient_accumulation_steps > 1 or fp16 the
// next optimizer step, gradient clipping or zero_grad raises ValueError naming acc.backward
// (and keeps raising until the gradients are zeroed by a zero_grad that found none).
void Accelerator::check_plain_backward(const char* op) const {
  if (!backward_flags_->plain_backward) return;
  const bool accumulating = config_.gradient_accumulation_steps > 1;
  if (!accumulating && !scaler_.enabled()) return;
  ACCEL_THROW(ValueError, op,
              "the gradients come from a plain loss.backward(), but this "
              "Accelerator scales the loss (",
              accumulating ? "gradient_accumulation_steps = " +
                                 std::to_string(config_.gradient_accumulation_steps) + " divides it"
                           : std::string(""),
              accumulating && scaler_.enabled() ? "; " : "",
              scaler_.enabled() ? "fp16 multiplies it by the loss scale" : "",
              "): call acc.backward(loss) instead of loss.backward()");
}

void Accelerator::update_sync() { strategy_->set_sync(sync_gradients_ && !no_sync_); }

bool Accelerator::step_prepared_optimizer(AcceleratedOptimizer& o) {
  check_plain_backward("step");
  optim::Optimizer& user = o.optimizer();
  optim::Optimizer& stepping = o.stepping_optimizer();
  if (&stepping != &user)  // the user's optimizer drives lr / weight decay (schedulers hold it)
    for (size_t g = 0; g < user.num_param_groups(); ++g) {
      stepping.set_lr(g, user.lr(g));
      stepping.set_weight_decay(g, user.weight_decay(g));
    }
  // What the step reads (under ZeRO this hands the gradient shards to the stepping optimizer).
  const dist::StepGrads grads = strategy_->grads(stepping);
  if (scaler_.enabled()) {
    // Sharded gradients: the inf/NaN flag is all-reduced inside unscale_().
    scaler_.unscale_(grads.params, group_.get());
    if (scaler_.found_inf()) {
      scaler_.update();
      strategy_->after_step(stepping, false);
      return false;
    }
  }
  stepping.step();
  if (scaler_.enabled()) scaler_.update();
  strategy_->after_step(stepping, true);
  ++optimizer_steps_;
  return true;
}

// Note [closure optimizers]
// LBFGS evaluates the loss several times per step (its line search and iterations) and decides
// with the loss values: it gets the user's closure, and under DDP each call's loss is averaged
// across processes (the backward inside averages the gradients already), so every rank sees the
// same numbers, takes the same decisions and the replicas stay identical: the same run as one
// process on the whole batch. ZeRO refuses such an optimizer at prepare (it cannot be sharded:
// Note [LBFGS and sharding] in optim/lbfgs.h). fp16 loss scaling (a step that must be
// skippable and gradients that must be unscaled before the optimizer reads them) and gradient
// accumulation (one closure call is one micro-batch) do not fit it and are refused.
Tensor Accelerator::step_prepared_closure(AcceleratedOptimizer& o,
                                          const std::function<Tensor()>& closure) {
  check_plain_backward("step");
  optim::Optimizer& stepping = o.stepping_optimizer();
  ACCEL_CHECK(!scaler_.enabled(), ValueError, "step",
              "an optimizer driven by step(closure) (LBFGS) evaluates the loss inside its step "
              "and cannot have its gradients unscaled or its step skipped: fp16 loss scaling is "
              "not supported with it (use bf16 or fp32)");
  ACCEL_CHECK(config_.gradient_accumulation_steps == 1, ValueError, "step",
              "an optimizer driven by step(closure) (LBFGS) calls the closure several times per "
              "step, each call a whole batch: gradient_accumulation_steps must be 1, got ",
              config_.gradient_accumulation_steps);
  Tensor loss = stepping.step([&]() -> Tensor {
    Tensor l = closure();
    if (world_size_ > 1 && l.defined()) l = reduce(l.detach(), "mean");
    return l;
  });
  strategy_->after_step(stepping, true);
  ++optimizer_steps_;
  return loss;
}

AcceleratedScheduler::AcceleratedScheduler(Accelerator& acc,
                                           std::shared_ptr<optim::LRScheduler> sched)
    : acc_(acc), sched_(std::move(sched)) {}

void AcceleratedScheduler::step() {
  if (!acc_.sync_gradients() || acc_.optimizer_step_was_skipped()) return;
  sched_->step();
}

void AcceleratedScheduler::step(double metric) {
  auto* plateau = dynamic_cast<optim::ReduceLROnPlateau*>(sched_.get());
  ACCEL_CHECK(plateau != nullptr, ValueError, "AcceleratedScheduler.step",
              "step(metric) is ReduceLROnPlateau's; this scheduler steps with step()");
  if (!acc_.sync_gradients() || acc_.optimizer_step_was_skipped()) return;
  plateau->step(metric);
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
  acc_.update_sync();
}
Accelerator::AccumulateScope::~AccumulateScope() {
  acc_.no_sync_ = prev_no_sync_;
  acc_.update_sync();
}

Accelerator::NoSyncScope::NoSyncScope(Accelerator& acc) : acc_(acc), prev_(acc.no_sync_) {
  acc_.no_sync_ = true;
  acc_.update_sync();
}
Accelerator::NoSyncScope::~NoSyncScope() {
  acc_.no_sync_ = prev_;
  acc_.update_sync();
}

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
  const Tensor l = loss_for_backward(loss);
  // Autocast is a forward-pass scope: the backward of every op already runs in the dtypes its
  // forward chose, so a backward() called inside the scope must not cast again.
  AutocastSuspend no_autocast;
  BackwardFlags& flags = *backward_flags_;
  const bool was_inside = flags.in_accelerator_backward;
  flags.in_accelerator_backward = true;
  try {
    strategy_->backward(l, sync_gradients_ && !no_sync_);
  } catch (...) {
    flags.in_accelerator_backward = was_inside;
    throw;
  }
  flags.in_accelerator_backward = was_inside;
}

Tensor Accelerator::loss_for_backward(const Tensor& loss) {
  Tensor l = loss;
  if (config_.gradient_accumulation_steps > 1)
    l = div(l, double(config_.gradient_accumulation_steps));
  return scaler_.scale_loss(l);
}

double Accelerator::clip_grad_norm_(double max_norm, double p) {
  return clip_grad_norm_(model_params(), max_norm, p);
}

// The gradients every prepared optimizer steps with (Strategy::grads), unscaled under fp16 (once
// per step); `sharded` when each rank holds a disjoint part of them.
std::vector<Tensor> Accelerator::step_grads(
    bool& sharded, dist::ProcessGroupPtr* shard_group,
    std::vector<std::vector<dist::StepGrads::Part>>* parts) {
  std::vector<Tensor> all;
  sharded = false;
  for (auto& o : optimizers_) {
    dist::StepGrads g = strategy_->grads(o->stepping_optimizer());
    sharded = sharded || g.sharded;
    if (shard_group && g.shard_group) *shard_group = g.shard_group;
    for (size_t k = 0; k < g.params.size(); ++k) {
      all.push_back(g.params[k]);
      if (!parts) continue;
      parts->emplace_back();
      if (k < g.parts.size()) parts->back() = std::move(g.parts[k]);
    }
  }
  return all;
}

// Sharded gradients: the p-norm's p-th power (or the max) is reduced across ranks, so the norm
// and the clipping equal the unsharded ones (bucket padding holds zeros and adds nothing).
// Replicated ones: the local norm of `params`.
double Accelerator::clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p) {
  check_plain_backward("clip_grad_norm_");
  bool sharded = false;
  dist::ProcessGroupPtr over = group_;  // HSDP: the shard group (replicas hold equal parts)
  // Models cut along the mesh: each part's weight (Note [composed gradient norms] in
  // accelerate/composition.cc).
  std::vector<std::vector<dist::StepGrads::Part>> parts;
  std::vector<Tensor> all = step_grads(sharded, &over, &parts);
  if (scaler_.enabled()) scaler_.unscale_(all.empty() ? params : all, group_.get());
  if (!sharded) return nn::clip_grad_norm_(params, max_norm, p);
  ACCEL_CHECK(max_norm >= 0, ValueError, "clip_grad_norm_", "max_norm must be >= 0, got ",
              max_norm);
  ACCEL_CHECK(p > 0, ValueError, "clip_grad_norm_", "norm type must be > 0, got ", p);
  NoGradGuard ng;
  const bool inf = std::isinf(p);
  Tensor total = zeros({}, TensorOptions(kFloat64, device_));
  for (size_t k = 0; k < all.size(); ++k) {
    const Tensor g = all[k].grad();
    if (!g.defined()) continue;
    const Tensor n = dist::grad_norm_term(g, parts[k], p);
    if (n.defined()) total = inf ? maximum(total, n) : add(total, n);
  }
  over->all_reduce(total, inf ? dist::ReduceOp::Max : dist::ReduceOp::Sum);
  const double total_norm = inf ? total.item<double>() : std::pow(total.item<double>(), 1.0 / p);
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef >= 1.0))
    for (const Tensor& sp : all)
      if (sp.grad().defined()) sp.grad().mul_(coef);
  return total_norm;
}

void Accelerator::clip_grad_value_(double clip_value) {
  check_plain_backward("clip_grad_value_");
  bool sharded = false;
  std::vector<Tensor> all = step_grads(sharded);
  if (scaler_.enabled()) scaler_.unscale_(all.empty() ? model_params() : all, group_.get());
  nn::clip_grad_value_(sharded ? all : model_params(), clip_value);
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
// checkpoints (Note [atomic checkpoints] in accelerate/checkpoint.h)

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

}  // namespace accel
