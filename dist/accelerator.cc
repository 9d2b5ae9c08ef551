// Accelerator facade; see dist/accelerator.h.
#include "dist/accelerator.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "autograd/nn/safetensors.h"
#include "autograd/nn/utils.h"
#include "autograd/ops.h"
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

std::string rank_file(const std::string& stem, int rank, const char* ext) {
  return stem + "_rank" + std::to_string(rank) + ext;
}
std::string indexed(const char* stem, size_t i, const char* ext) {
  return i == 0 ? std::string(stem) + ext : std::string(stem) + "_" + std::to_string(i) + ext;
}

}  // namespace

AcceleratorConfig AcceleratorConfig::with_env() const {
  AcceleratorConfig c = *this;
  if (const char* v = env_or_null("ACCEL_MIXED_PRECISION"))
    c.mixed_precision = dist::parse_mixed_precision(v, "ACCEL_MIXED_PRECISION");
  if (const char* v = env_or_null("ACCEL_USE_CPU")) c.cpu = parse_env_bool("ACCEL_USE_CPU", v);
  try {
    if (const char* v = env_or_null("ACCEL_ZERO_STAGE"))
      c.zero_stage = dist::parse_env_int("ACCEL_ZERO_STAGE", v, 0, 3);
    if (const char* v = env_or_null("ACCEL_GRADIENT_ACCUMULATION_STEPS"))
      c.gradient_accumulation_steps =
          dist::parse_env_int("ACCEL_GRADIENT_ACCUMULATION_STEPS", v, 1, 1 << 30);
  } catch (const DistError& e) {
    throw ValueError(e.what());
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// construction

Accelerator::Accelerator(AcceleratorConfig config)
    : config_(config.read_env ? config.with_env() : config),
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

void Accelerator::prepare_module(const std::shared_ptr<nn::Module>& model) {
  ACCEL_CHECK(model != nullptr, ValueError, "prepare", "model is null");
  model->to(device_);
  if (world_size_ > 1) {
    // Every rank starts from rank 0's weights, as DDP's constructor does.
    NoGradGuard ng;
    for (auto& [name, p] : model->named_parameters()) {
      ACCEL_CHECK(p.is_contiguous(), ValueError, "prepare", "parameter ", name,
                  " is not contiguous ", p.shape_str());
      group_->broadcast(p, 0);
    }
    for (auto& [name, b] : model->named_buffers())
      if (b.is_contiguous()) group_->broadcast(b, 0);
  }
  models_.push_back(model);
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(
    std::shared_ptr<optim::Optimizer> opt) {
  ACCEL_CHECK(opt != nullptr, ValueError, "prepare", "optimizer is null");
  ACCEL_CHECK(config_.zero_stage == 0 || world_size_ == 1, ValueError, "prepare", "zero_stage ",
              config_.zero_stage, " with ", world_size_,
              " processes needs the ZeRO optimizer (dist/zero.h), which this build does not have; "
              "use zero_stage 0");
  auto wrapped = std::make_shared<AcceleratedOptimizer>(*this, std::move(opt));
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

std::vector<Tensor> AcceleratedOptimizer::params() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt_->num_param_groups(); ++g)
    for (const Tensor& p : opt_->params(g)) out.push_back(p);
  return out;
}

bool AcceleratedOptimizer::step() {
  skipped_ = false;
  if (!acc_.sync_gradients_) return false;  // accumulating: gradients are not complete yet
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
  if (acc_.sync_gradients_) opt_->zero_grad(set_to_none);
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
  l.backward();
  if (sync_gradients_ && !no_sync_ && world_size_ > 1) sync_model_gradients();
}

void Accelerator::sync_model_gradients() {
  NoGradGuard ng;
  std::vector<Tensor> params = model_params();
  // One flat buffer per dtype, in parameter order (Note [gradient sync]).
  std::vector<DType> dtypes;
  for (auto& p : params)
    if (std::find(dtypes.begin(), dtypes.end(), p.dtype()) == dtypes.end()) dtypes.push_back(p.dtype());
  for (DType dt : dtypes) {
    std::vector<Tensor> pieces;
    std::vector<Tensor> members;
    for (auto& p : params) {
      if (p.dtype() != dt) continue;
      Tensor g = p.grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : zeros({p.numel()}, TensorOptions(dt, p.device())));
      members.push_back(p);
    }
    Tensor flat = cat(pieces, 0).contiguous();
    group_->all_reduce(flat, dist::ReduceOp::Avg);
    int64_t off = 0;
    for (auto& p : members) {
      Tensor part = flat.narrow(0, off, p.numel()).view(p.sizes());
      off += p.numel();
      Tensor g = p.grad();
      if (g.defined()) {
        g.copy_(part);
      } else {
        p.set_grad(part.clone());
      }
    }
  }
}

double Accelerator::clip_grad_norm_(double max_norm, double p) {
  return clip_grad_norm_(model_params(), max_norm, p);
}

double Accelerator::clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double p) {
  if (scaler_.enabled()) {
    // Unscale every prepared optimizer's gradients (once per step) before measuring them.
    std::vector<Tensor> all;
    for (auto& o : optimizers_)
      for (auto& t : o->params()) all.push_back(t);
    scaler_.unscale_(all.empty() ? params : all, group_.get());
  }
  ACCEL_INTERNAL_ASSERT(!grads_sharded());
  return nn::clip_grad_norm_(params, max_norm, p);
}

void Accelerator::clip_grad_value_(double clip_value) {
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
  ACCEL_CHECK(keep_rows >= 0 && keep_rows <= x.size(0), ValueError, "gather",
              "cannot keep ", keep_rows, " rows of a tensor of shape ", x.shape_str());
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
    ACCEL_CHECK(same, ShapeError, "gather", "rank ", r, " has a tensor of ", dr[0],
                " dims, dtype ", DType(dr[1]), " and trailing sizes that differ from rank ", rank_,
                "'s ", x.shape_str(), " (", x.dtype(), ")");
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

Tensor Accelerator::gather(const Tensor& t) {
  return gather_rows(t, t.dim() == 0 ? 1 : t.size(0));
}

Tensor Accelerator::gather_for_metrics(const Tensor& t, int64_t num_padding) {
  ACCEL_CHECK(t.defined() && t.dim() >= 1, ShapeError, "gather_for_metrics",
              "expected a tensor with a batch dim, got ", t.defined() ? t.shape_str() : "undefined");
  ACCEL_CHECK(num_padding >= 0 && num_padding <= t.size(0), ValueError, "gather_for_metrics",
              "num_padding ", num_padding, " is not in [0, ", t.size(0), "] for shape ", t.shape_str());
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
  if (op == "sum") rop = dist::ReduceOp::Sum;
  else if (op == "mean") rop = dist::ReduceOp::Avg;
  else if (op == "max") rop = dist::ReduceOp::Max;
  else if (op == "min") rop = dist::ReduceOp::Min;
  else ACCEL_THROW(ValueError, "reduce", "unknown reduction '", op, "' (sum, mean, max, min)");
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
  ACCEL_CHECK(dim >= 0 && dim < t.dim(), IndexError, "pad_across_processes", "dim out of range for ",
              t.shape_str());
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
  logging_dir_ = run_name.empty() ? config_.project_dir
                                  : (fs::path(config_.project_dir) / run_name).string();
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

  // Replicated state (models, optimizers without ZeRO, schedulers): the main process writes it.
  if (is_main_process()) {
    for (size_t i = 0; i < models_.size(); ++i)
      nn::save_safetensors(at(indexed("model", i, ".safetensors")), models_[i]->state_dict());
    for (size_t i = 0; i < optimizers_.size(); ++i)
      nn::save_safetensors(at(indexed("optimizer", i, ".safetensors")), optimizers_[i]->state_dict());
    for (size_t i = 0; i < schedulers_.size(); ++i)
      nn::save_safetensors(at(indexed("scheduler", i, ".safetensors")), schedulers_[i]->state_dict());
  }
  // Per-rank state: loader positions, RNG, registered objects.
  for (size_t i = 0; i < loaders_.size(); ++i)
    dist::write_file_durable(at(rank_file(indexed("loader", i, ""), rank_, ".json")),
                             data::state_to_json(loaders_[i]->state_dict()));
  dist::write_file_durable(at(rank_file("rng", rank_, ".txt")), default_generator().state());
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

std::string Accelerator::load_state(const std::string& dir) {
  const std::string path = dist::resolve_checkpoint_dir(dir.empty() ? checkpoints_dir() : dir);
  auto at = [&](const std::string& f) { return (fs::path(path) / f).string(); };
  nlohmann::json s;
  try {
    s = nlohmann::json::parse(dist::read_file(at(dist::kCheckpointStateFile)));
  } catch (const nlohmann::json::exception& e) {
    ACCEL_THROW(IoError, "load_state", "'", at(dist::kCheckpointStateFile), "' is not valid JSON: ",
                e.what());
  }
  auto count = [&](const char* key, size_t mine, const char* what) {
    const size_t theirs = s.value(key, size_t(0));
    ACCEL_CHECK(theirs == mine, ValueError, "load_state", "checkpoint '", path, "' holds ", theirs,
                " ", what, ", this accelerator prepared ", mine);
  };
  ACCEL_CHECK(s.value("format", 0) == 1, IoError, "load_state", "'", path,
              "': unsupported checkpoint format");
  ACCEL_CHECK(s.value("world_size", 0) == world_size_, ValueError, "load_state", "checkpoint '",
              path, "' was saved by ", s.value("world_size", 0), " processes, this run has ",
              world_size_);
  count("num_models", models_.size(), "models");
  count("num_optimizers", optimizers_.size(), "optimizers");
  count("num_schedulers", schedulers_.size(), "schedulers");
  count("num_loaders", loaders_.size(), "data loaders");

  for (size_t i = 0; i < models_.size(); ++i)
    models_[i]->load_state_dict(nn::load_safetensors(at(indexed("model", i, ".safetensors"))));
  for (size_t i = 0; i < optimizers_.size(); ++i)
    optimizers_[i]->load_state_dict(nn::load_safetensors(at(indexed("optimizer", i, ".safetensors"))));
  for (size_t i = 0; i < schedulers_.size(); ++i)
    schedulers_[i]->load_state_dict(nn::load_safetensors(at(indexed("scheduler", i, ".safetensors"))));
  for (size_t i = 0; i < loaders_.size(); ++i)
    loaders_[i]->load_state_dict(
        data::state_from_json(dist::read_file(at(rank_file(indexed("loader", i, ""), rank_, ".json")))));
  default_generator().set_state(dist::read_file(at(rank_file("rng", rank_, ".txt"))));
  sync_gradients_ = s.value("sync_gradients", true);
  for (size_t i = 0; i < models_.size(); ++i) {
    NoGradGuard ng;
    models_[i]->zero_grad(true);
    if (sync_gradients_) continue;
    nn::TensorDict grads =
        nn::load_safetensors(at(rank_file(indexed("grads", i, ""), rank_, ".safetensors")));
    for (auto& [pname, p] : models_[i]->named_parameters()) {
      auto it = grads.find(pname);
      if (it == grads.end()) continue;
      ACCEL_CHECK(it->second.sizes() == p.sizes(), ShapeError, "load_state", "gradient of ", pname,
                  " has shape ", it->second.shape_str(), ", parameter ", p.shape_str());
      p.set_grad(it->second.to(p.device(), p.dtype()));
    }
  }
  for (auto& c : customs_) {
    const std::string f = at(rank_file("custom_" + c.name, rank_, ".json"));
    ACCEL_CHECK(fs::exists(f), IoError, "load_state", "checkpoint '", path, "' has no state for '",
                c.name, "' (", f, ")");
    c.load(nlohmann::json::parse(dist::read_file(f)).get<std::map<std::string, std::string>>());
  }
  scaler_.load_state_dict(s.at("scaler").get<std::map<std::string, std::string>>());
  step_ = s.value("step", int64_t(0));
  optimizer_steps_ = s.value("optimizer_steps", int64_t(0));
  save_iteration_ = s.value("save_iteration", int64_t(-1)) + 1;
  wait_for_everyone();
  return path;
}

}  // namespace accel
