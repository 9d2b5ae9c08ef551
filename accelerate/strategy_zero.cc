// ZeroStrategy: ZeRO stages 1 and 2 through dist::ZeroOptimizer, registered as "zero1" and
// "zero2" (ZeRO-3 is the fsdp strategy: accelerate/strategy_fsdp.cc).
//
// Note [zero in the facade]
// With zero_stage 1-2 and world size > 1, prepare(optimizer) builds a dist::ZeroOptimizer over
// the optimizer's parameters, bucketed per param group, and the optimizer that steps is
// optim::Optimizer::rebuild of yours over this rank's shards, one group per group of yours (so
// any optimizer that implements rebuild, with decay / no-decay groups). Your optimizer object
// keeps the learning rates (schedulers drive them; the facade copies every group's lr and
// weight decay into the stepping one before each step) but never steps and holds no state.
// Then:
//  - backward() reduces gradients on every micro-batch (ZeRO has no no_sync); stage 2 adds
//    the reduced shards of an accumulation window up in a 1/N-sized buffer, so accumulation and
//    no_sync() still give the gradient of the whole window.
//  - grads() are the shard parameters with their gradient slices: fp16 unscaling, the inf/NaN
//    check and clip_grad_norm_ act on them with the norm all-reduced, so they equal the
//    unsharded ones.
//  - save_state writes each rank's shard state as pieces of the parameters' slots (Note [zero
//    pieces] in accelerate/strategy_pieces.cc); load_state reads them back on any mesh, also into
//    a single process.
//  - mixed precision (AcceleratorConfig::zero.param_dtype, stages 1-2; Note [zero mixed
//    precision] in parallel/zero.cc): the trainable parameters become bf16/fp16 views when the
//    optimizer is prepared, the stepping optimizer holds fp32 master shards, and grads() are
//    the fp32 gradient shards. Everything that reads or writes the model as a whole (save_state,
//    load_state, get_state_dict, save_model) first points the parameters at the gathered fp32
//    masters (ZeroOptimizer::use_master_parameters) and back afterwards, so checkpoints and
//    exports hold master weights that a run without mixed precision loads as they are, and a
//    loaded checkpoint sets the masters, not rounded copies. Stage 1 then accumulates a window's
//    gradients in the fp32 shards as stage 2 does.
// ZeRO's gradient hooks are always on (every micro-batch is reduced); the first gradient of a
// backward queues an end-of-backward callback (Note [end-of-backward callbacks] in
// autograd/engine.h) that waits for the collectives and adds the window up, so a plain
// loss.backward() works as acc.backward() does (Note [plain backward] in
// accelerate/accelerator.cc).
#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "autograd/engine.h"
#include "core/error.h"
#include "accelerate/strategies/zero_options.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"

namespace accel::dist {

namespace {

class ZeroStrategy final : public ReplicatedStrategy {
 public:
  ZeroStrategy(const StrategyContext& ctx, int stage)
      : ReplicatedStrategy(ctx),
        stage_(stage),
        options_(ctx.options_as<ZeroStrategyOptions>(stage == 1 ? "zero1" : "zero2").zero) {}
  std::string_view name() const override { return stage_ == 1 ? "zero1" : "zero2"; }

  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    // Trainable parameters come from rank 0 when the optimizer is prepared (ZeroOptimizer
    // broadcasts its flat buffers); frozen ones and buffers here.
    for (auto& [name, p] : trainable_parameters(*model))
      ACCEL_CHECK(p.is_contiguous(), ValueError, "prepare", "parameter ", name,
                  " is not contiguous ", p.shape_str());
    broadcast_frozen(*model, ctx_.ddp.broadcast_buffers);
    models_.push_back(model);
  }

  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override {
    // Parameters named after the prepared models, for messages.
    std::unordered_map<const TensorImpl*, std::string> names;
    for (size_t i = 0; i < models_.size(); ++i)
      for (auto& [name, p] : models_[i]->named_parameters())
        names.emplace(p.impl(), models_.size() == 1 ? name : std::to_string(i) + "." + name);
    std::vector<NamedParams> groups(user->num_param_groups());
    std::vector<optim::ParamGroup> probe(user->num_param_groups());
    size_t n = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const Tensor& p : user->params(g)) {
        auto it = names.find(p.impl());
        std::string name = it != names.end() ? it->second : "param" + std::to_string(n);
        ++n;
        ACCEL_CHECK(p.requires_grad(), ValueError, "prepare", "parameter '", name,
                    "' of the optimizer does not require grad; ZeRO shards trainable parameters");
        // ZeRO re-points the parameters into its flat buffers: moving them afterwards would
        // detach them from it.
        ACCEL_CHECK(p.device() == ctx_.device, ValueError, "prepare", "parameter '", name,
                    "' is on ", p.device(), ", not ", ctx_.device,
                    ": prepare the model before its optimizer");
        groups[g].emplace_back(std::move(name), p);
        probe[g].params.push_back(p);
      }
    }
    // Refuse an optimizer that cannot be rebuilt before anything collective runs (every rank
    // refuses alike): the probe holds no state and is dropped.
    (void)user->rebuild(std::move(probe));

    auto slot = std::make_unique<Slot>();
    slot->user = user;
    // The touch hooks go before ZeRO's own (a backward that reached none of these parameters
    // issued no collective to wait for).
    std::weak_ptr<bool> flag = slot->touched;
    std::weak_ptr<bool> alive = alive_;
    for (auto& group : groups)
      for (auto& [name, p] : group) {
        Tensor h = p;
        h.register_post_accumulate_grad_hook([this, flag, alive](Tensor&) {
          auto f = flag.lock();
          if (!f || !alive.lock() || *f) return;
          *f = true;
          if (queued_) return;
          queued_ = true;
          autograd::queue_callback([this, alive](bool succeeded) {
            if (alive.lock()) finish_backward(succeeded);
          });
        });
      }
    ZeroOptions zo;
    zo.stage = stage_;
    zo.bucket_cap_bytes = ctx_.ddp.bucket_cap_bytes;
    zo.find_unused_parameters = ctx_.ddp.find_unused_parameters;
    zo.root = 0;
    zo.param_dtype = options_.param_dtype;
    zo.reduce_in_fp32 = options_.reduce_in_fp32;
    if (ctx_.hsdp()) zo.replicate = ctx_.dp_replicate;  // Note [mesh support]
    const optim::Optimizer& u = *user;
    slot->zero = std::make_unique<ZeroOptimizer>(
        std::move(groups),
        [&u](std::vector<optim::ParamGroup> shard_groups) {
          return u.rebuild(std::move(shard_groups));
        },
        ctx_.shard_group(), zo);
    slot->stepping = slot->zero->shared_optimizer();
    slots_.push_back(std::move(slot));
    return slots_.back()->stepping;
  }

  void backward(const Tensor& loss, bool sync) override {
    const bool prev = sync_;
    sync_ = sync;
    std::exception_ptr err;
    try {
      loss.backward();  // finish_backward runs at its end
    } catch (...) {
      err = std::current_exception();
    }
    sync_ = prev;
    if (err) std::rethrow_exception(err);
  }

  void set_sync(bool sync) override { sync_ = sync; }

  StepGrads grads(const optim::Optimizer& stepping) override {
    StepGrads out;
    const ZeroOptimizer& zero = *slot_of(stepping).zero;
    out.params = slot_of(stepping).zero->attach_gradients();
    out.sharded = true;
    out.shard_group = ctx_.shard_group();
    // Leaf b is this rank's slice [r * shard_numel, (r + 1) * shard_numel) of bucket b's flat
    // buffer: one part per parameter of the bucket (its overlap with the slice), named after the
    // prepared models (what the composition weighs by layout: Note [composed gradient norms] in
    // accelerate/composition.cc). Computed once per optimizer (the buckets are fixed at prepare).
    if (grad_names_models_ != models_.size()) {
      grad_names_.clear();
      parts_.clear();
      for (size_t m = 0; m < models_.size(); ++m)
        for (auto& [name, p] : models_[m]->named_parameters())
          grad_names_.emplace(p.impl(), std::to_string(m) + ":" + name);
      grad_names_models_ = models_.size();
    }
    if (const auto c = parts_.find(&zero); c != parts_.end()) {
      out.parts = c->second;
      return out;
    }
    const int64_t r = shard_rank();
    const auto& buckets = zero.buckets();
    out.parts.resize(out.params.size());
    for (size_t b = 0; b < buckets.size() && b < out.params.size(); ++b) {
      const Bucket& bk = buckets[b];
      const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
      for (size_t j = 0; j < bk.params.size(); ++j) {
        const Tensor& p = zero.params()[bk.params[j]].second;
        // Every parameter of the bucket, overlapping or not (length 0): each rank then lists the
        // same parts, as the replicated-gradient check's collectives need.
        const int64_t begin = std::min(hi, std::max(lo, bk.offset[j]));
        const int64_t end = std::max(begin, std::min(hi, bk.offset[j] + p.numel()));
        const auto it = grad_names_.find(p.impl());
        if (it == grad_names_.end()) {  // not a prepared model's: nothing names the parts
          out.parts.clear();
          return out;
        }
        out.parts[b].push_back({it->second, begin - lo, end - begin, 1.0});
      }
    }
    parts_[&zero] = out.parts;
    return out;
  }

  void after_step(optim::Optimizer& stepping, bool stepped) override {
    slot_of(stepping).zero->finish_step(stepped);
  }

  void zero_grad(optim::Optimizer& stepping, bool) override { slot_of(stepping).zero->zero_grad(); }

  // ---- the whole model reads and loads as fp32 master weights under param_dtype ----
  void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank) override {
    const size_t first = out.size();
    with_masters(false, [&] {
      ReplicatedStrategy::state_entries(out, mid_window, world_rank);
      // The gathered masters go when the parameters point back: the entries keep copies.
      if (options_.param_dtype)
        for (size_t e = first; e < out.size(); ++e)
          if (out[e].name.rfind("model.", 0) == 0) out[e].local = out[e].local.clone();
    });
  }
  void apply_state(StrategyState& state) override {
    with_masters(true, [&] { ReplicatedStrategy::apply_state(state); });
  }
  io::TensorDict full_state_dict(size_t index) override {
    io::TensorDict out;
    with_masters(false, [&] { out = ReplicatedStrategy::full_state_dict(index); });
    return out;
  }
  void save_model(size_t index, const std::string& path) override {
    with_masters(false, [&] { ReplicatedStrategy::save_model(index, path); });
  }
  // Under param_dtype the values go into the fp32 masters (gathered for the while), not into
  // 16-bit copies.
  void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                  std::exception_ptr& err) override {
    with_masters(true, [&] { ReplicatedStrategy::load_model(index, src, err); });
  }

 private:
  std::map<const ZeroOptimizer*, std::vector<std::vector<StepGrads::Part>>> parts_;
  // End of a backward that gave some slot gradients: wait for their collectives, then (unless
  // the backward failed) add the window up.
  void finish_backward(bool succeeded) {
    queued_ = false;
    std::exception_ptr err;
    for (auto& s : slots_) {
      if (!*s->touched) continue;
      *s->touched = false;
      try {
        // Note [hsdp]: where the window's shards add up here, they cross replicas once, summed.
        const bool own_window = stage_ == 2 || s->zero->mixed_precision();
        s->zero->set_replicate_sync(!own_window);
        s->zero->finish_gradient_sync();
        if (succeeded) after_backward(*s, sync_);
        if (own_window && sync_) s->zero->average_shards_across_replicas();
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  }

  // Runs fn with the parameters pointing at the fp32 masters (collective), then back at the
  // compute buffers; `take_values` (a load): what fn wrote into them becomes the masters. On an
  // exception nothing is taken (the facade restores its snapshot). No-op wrapper without
  // param_dtype.
  void with_masters(bool take_values, const std::function<void()>& fn) {
    for (auto& s : slots_)
      if (s->zero) s->zero->use_master_parameters();
    auto back = [&](bool take) {
      for (auto& s : slots_)
        if (s->zero) s->zero->use_compute_parameters(take);
    };
    try {
      fn();
    } catch (...) {
      back(false);
      throw;
    }
    back(take_values);
  }

  int stage_;            // 1 or 2
  ZeroOptions options_;  // param_dtype, reduce_in_fp32
  bool sync_ = true;     // Strategy::set_sync
  bool queued_ = false;  // the end-of-backward callback is queued
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  void after_backward(Slot& s, bool sync) {
    NoGradGuard ng;
    if (stage_ == 2 || s.zero->mixed_precision()) {
      // Each reduce-scatter overwrites the shards: the window's micro-batches add up here.
      const std::vector<Tensor> shards = s.zero->gradient_shards();
      if (!sync) {
        if (s.accum.empty()) {
          for (auto& g : shards) s.accum.push_back(g.clone());
        } else {
          for (size_t b = 0; b < s.accum.size(); ++b) s.accum[b].add_(shards[b]);
        }
      } else if (!s.accum.empty()) {
        for (size_t b = 0; b < s.accum.size(); ++b) Tensor(shards[b]).add_(s.accum[b]);
        s.accum.clear();
      }
    }
  }
};

StrategySpec zero_spec(int stage) {
  StrategySpec s;
  s.name = stage == 1 ? "zero1" : "zero2";
  s.zero_stage = stage;
  s.make = [stage](const StrategyContext& ctx) {
    return std::make_unique<ZeroStrategy>(ctx, stage);
  };
  // Note [one process under ZeRO]: 16-bit compute parameters change what a step computes.
  s.runs_alone = [name = s.name](const StrategyContext& ctx) {
    return ctx.options_as<ZeroStrategyOptions>(name).zero.param_dtype.has_value();
  };
  s.options = ZeroStrategyOptions::from;
  return s;
}

const StrategyRegistration kZero1(zero_spec(1));
const StrategyRegistration kZero2(zero_spec(2));

}  // namespace

}  // namespace accel::dist
