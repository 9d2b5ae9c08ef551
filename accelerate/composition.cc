// Note [composed strategy]
// The Accelerator's strategy is always one ComposedStrategy: a dist::ParallelPlan (Note [apply
// order] in parallel/parallelize.h) whose last slot is the data-parallel engine the config names
// (dist::Strategy from the registry: none, ddp, zero1, zero2, fsdp, or a program's own), built
// over the mesh's data-parallel group (the ranks holding the same pieces of every model). There is
// no case per dimension or per engine: what the model steps cut is recorded per parameter (its
// Layout along each cut dimension), and everything beyond prepare is generic over those records:
//  - prepare_model: the plan's steps in order (tp cuts the parameters into this rank's shards, then
//    the engine wraps the model as it would any other); so every engine composes with tp;
//  - backward, step, zero_grad, memory: the engine's;
//  - gradient norms (grads()): Note [composed gradient norms];
//  - the replicated-gradient check (Note [replicated gradient check] in
//    parallel/replicated_check.h): at the first step, or every step under
//    ACCEL_VERIFY_PLACEMENTS=1, each gradient (or, in a ZeRO bucket shard, each parameter's part)
//    that a cut dimension replicates is compared over that dimension's group;
//  - checkpoints (format 2, Note [format-2 strategy seam] in accelerate/strategy.h): the engine's
//    pieces, each placed in its global tensor by this rank's recorded piece (set_place from
//    ParallelPlan::place), so a checkpoint loads at any tp size and any engine;
//  - get_state_dict / save_model: the engine's full (locally whole) state dict, each cut tensor
//    un-sharded along its layout (ParallelPlan::unshard): the file a 1-process run writes;
//    load_model reads each full tensor, keeps this rank's part (ParallelPlan::part), and hands that
//    to the engine through a file in a private folder (mkdtemp: random name, mode 0700; the
//    engine's load_model reads a safetensors file);
//  - full_shape: the recorded global shape.
// When no step cuts a model (tp 1) every layout is whole, every weight 1, and each call is the
// engine's own: the results are those of the engine alone.
//
// Note [composed gradient norms]
// The engine names each gradient entry it returns (StepGrads::names: "<model>:<parameter>"; a
// ZeRO-1/2 bucket shard one part per parameter it overlaps, StepGrads::parts). A gradient element
// is held alike by k ranks of the world: the engine's replicas (a DDP replica over dp, an HSDP
// replica over dp_replicate) times the ranks of the cut dimensions that replicate its parameter.
// The facade sums the weighted p-th powers over the world, so that every element of the full
// model counts once:
//  - k a power of two: weight 1 / k (exact in binary; the sums are bit-identical to the tp strategy
//    this replaced);
//  - otherwise (tp 3, dp 3 x tp 2, ...): weight 1 on the one primary holder (coordinate 0 along the
//    replicating dimensions, the first engine replica), 0 on the others, as 1 / 3 is not exact.
#include "accelerate/composition.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "autograd/ops.h"
#include "core/env_contract.h"
#include "io/safetensors.h"
#include "parallel/replicated_check.h"

namespace accel::dist {

namespace fs = std::filesystem;

namespace {

// A folder only this process can use: mkdtemp creates it atomically with a random name and mode
// 0700, and fails rather than reuse anything already there.
std::string private_tmp_dir(int rank) {
  std::string tmpl =
      (fs::temp_directory_path() / ("accel-load-" + std::to_string(rank) + "-XXXXXX")).string();
  ACCEL_CHECK(::mkdtemp(tmpl.data()) != nullptr, IoError, "load_model",
              "cannot create a private temporary folder from '", tmpl, "': ", std::strerror(errno));
  return tmpl;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string_view(v) == "1";
}

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The data-parallel slot of kApplyOrder: the engine's prepare.
class EngineStep final : public ApplyStep {
 public:
  explicit EngineStep(Strategy& engine) : engine_(engine) {}
  std::string_view name() const override { return "data_parallel"; }
  bool active(const DeviceMesh&) const override { return true; }
  void apply(ParallelModel& pm, const StepContext&) override { engine_.prepare_model(pm.module()); }
  bool takes_deferred() const override { return engine_.takes_deferred_models(); }

 private:
  Strategy& engine_;
};

class ComposedStrategy final : public Strategy, public StrategyCheckpoint {
 public:
  ComposedStrategy(const DeviceMesh& mesh, ParallelOptions options,
                   std::unique_ptr<Strategy> engine, ProcessGroupPtr world, int engine_rank,
                   int engine_size)
      : engine_(std::move(engine)),
        plan_(mesh, std::move(options), std::make_unique<EngineStep>(*engine_)),
        world_(std::move(world)),
        world_rank_(world_ ? world_->rank() : 0),
        engine_rank_(engine_rank),
        engine_size_(engine_size) {
    engine_->checkpoint().set_place([this](size_t m, const std::string& name, const Shape& local) {
      return plan_.place(m, name, local);
    });
    if (pp_active()) {
      auto elsewhere = [this](size_t m, const std::string& name) {
        return plan_.held_elsewhere(m, name);
      };
      engine_->checkpoint().set_elsewhere(elsewhere);
      set_elsewhere(elsewhere);
    }
  }

  std::string_view name() const override { return engine_->name(); }
  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    plan_.prepare_model(model);
  }
  std::shared_ptr<optim::Optimizer> prepare_optimizer(
      const std::shared_ptr<optim::Optimizer>& user) override {
    if (!pp_active()) return engine_->prepare_optimizer(user);
    // Note [pp step]: the user's optimizer was built over the whole model; this stage steps the
    // parameters it kept (the others were dropped), through a rebuild of it over them, group by
    // group, which the engine then takes as the user's.
    std::set<const TensorImpl*> kept;
    for (const auto& pm : plan_.models())
      for (const Tensor& p : pm->module()->parameters()) kept.insert(p.impl());
    std::vector<optim::ParamGroup> groups(user->num_param_groups());
    bool all = true;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const Tensor& p : user->params(g)) {
        // The pp step freed the storage of what it dropped: a tensor of no prepared model that
        // still holds elements is the user's, and the engine says what it makes of it.
        if (kept.count(p.impl()) || p.numel() > 0)
          groups[g].params.push_back(p);
        else
          all = false;
      }
      ACCEL_CHECK(!groups[g].params.empty(), ValueError, "prepare", "pp_size ",
                  plan_.mesh().size("pp"), ": pipeline stage ", plan_.mesh().coordinate("pp"),
                  " holds none of the parameters of the optimizer's group ", g, " (of ",
                  user->num_param_groups(),
                  "): give each stage's parameters groups of their own, or keep every group "
                  "spread over the layers");
    }
    if (all) return engine_->prepare_optimizer(user);
    return engine_->prepare_optimizer(std::shared_ptr<optim::Optimizer>(user->rebuild(groups)));
  }
  const std::vector<PipelineChunk>* pipeline(const nn::Module& m) const override {
    for (const auto& pm : plan_.models())
      if (pm->module().get() == &m) return pm->pipeline.empty() ? nullptr : &pm->pipeline;
    return nullptr;
  }
  DistributedDataParallel* ddp(const nn::Module& m) const override { return engine_->ddp(m); }
  bool takes_deferred_models() const override { return engine_->takes_deferred_models(); }
  void backward(const Tensor& loss, bool sync) override { engine_->backward(loss, sync); }
  void set_sync(bool sync) override { engine_->set_sync(sync); }
  bool takes_partial_backwards() const override { return engine_->takes_partial_backwards(); }
  void after_step(optim::Optimizer& stepping, bool stepped) override {
    engine_->after_step(stepping, stepped);
  }
  void zero_grad(optim::Optimizer& stepping, bool set_to_none) override {
    engine_->zero_grad(stepping, set_to_none);
  }
  StrategyMemory memory() const override { return engine_->memory(); }
  StrategyCheckpoint& checkpoint() override { return *this; }

  // Note [composed gradient norms].
  StepGrads grads(const optim::Optimizer& stepping) override {
    StepGrads g = engine_->grads(stepping);
    if (!plan_.cuts_models()) {  // every weight 1: the engine's reduction as it is
      g.parts.clear();
      return g;
    }
    const bool by_parts = g.parts.size() == g.params.size();
    ACCEL_CHECK(by_parts || g.names.size() == g.params.size(), ValueError, "clip_grad_norm_",
                "strategy '", name(),
                "' does not name its gradients (StepGrads::names), which a "
                "model cut along ",
                cut_dims(), " needs");
    const int shard = g.sharded && g.shard_group ? g.shard_group->size() : 1;
    const int64_t engine_holders = g.sharded ? engine_size_ / shard : engine_size_;
    const bool engine_primary = g.sharded ? engine_rank_ < shard : engine_rank_ == 0;
    // Under a sharding engine the peers' spans of a replicated gradient are equal only when
    // their local shapes are (uneven shards move the flat offsets: not compared).
    const bool comparable = !g.sharded || plan_.even_shapes();
    const bool check = comparable && (!replicated_checked_ || check_every_step_);
    const std::vector<std::string>& dims = plan_.cut_dims();
    std::vector<std::vector<std::string>> rep_names(dims.size());
    std::vector<std::vector<Tensor>> rep_grads(dims.size());
    std::vector<std::vector<StepGrads::Part>> parts(g.params.size());
    for (size_t k = 0; k < g.params.size(); ++k) {
      parts[k] = by_parts ? g.parts[k] : std::vector<StepGrads::Part>{{g.names[k], 0, -1, 1.0}};
      bool same = true;
      for (StepGrads::Part& part : parts[k]) {
        const size_t colon = part.name.find(':');
        const size_t m = std::stoul(part.name.substr(0, colon));
        const std::string pname = part.name.substr(colon + 1);
        const int64_t holders = engine_holders * plan_.holders(m, pname);
        part.weight = power_of_two(holders)                       ? 1.0 / double(holders)
                      : engine_primary && plan_.primary(m, pname) ? 1.0
                                                                  : 0.0;
        same = same && part.weight == parts[k].front().weight;
        if (!check) continue;
        const Tensor& grad = g.params[k].grad();
        for (const std::string& d : plan_.replicated_dims(m, pname)) {
          const size_t i = size_t(std::find(dims.begin(), dims.end(), d) - dims.begin());
          rep_names[i].push_back(pname);
          rep_grads[i].push_back(!grad.defined() || part.length < 0
                                     ? grad
                                     : grad.reshape({-1}).narrow(0, part.begin, part.length));
        }
      }
      // One weight for the whole entry (bucket padding holds zeros and adds nothing).
      if (same && parts[k].size() > 1) parts[k] = {{"", 0, -1, parts[k].front().weight}};
    }
    if (check) {
      // The verdict is the stage's (its ranks list the same parameters; the world at pp 1).
      ProcessGroup* verdict = pp_active() ? plan_.mesh().group("dp_cp_tp").get() : world_.get();
      for (size_t i = 0; i < dims.size(); ++i)
        check_replicated_grads(rep_names[i], rep_grads[i], *plan_.mesh().group(dims[i]), dims[i],
                               verdict);
      replicated_checked_ = true;
    }
    g.parts = std::move(parts);
    g.sharded = true;
    g.shard_group = world_;
    return g;
  }

  // ---- checkpoints ----
  void state_entries(std::vector<ckpt::StateEntry>& out, bool mid_window, int world_rank) override {
    engine_->checkpoint().state_entries(out, mid_window, world_rank);
  }
  std::unique_ptr<StrategyState> read_pieces(ckpt::CheckpointSource& src, bool mid_window,
                                             int world_rank) override {
    return engine_->checkpoint().read_pieces(src, mid_window, world_rank);
  }
  void apply_state(StrategyState& state) override { engine_->checkpoint().apply_state(state); }
  void finish_load() override { engine_->checkpoint().finish_load(); }

  io::TensorDict full_state_dict(size_t index) override {
    io::TensorDict d = engine_->checkpoint().full_state_dict(index);
    for (auto& [name, t] : d) t = plan_.unshard(index, name, t);
    if (pp_active()) gather_stages(index, d);
    return d;
  }

  void save_model(size_t index, const std::string& path) override {
    // Uncut models: the engine's (ZeRO-3 streams it unit by unit).
    if (!plan_.cuts_models()) return engine_->checkpoint().save_model(index, path);
    const io::TensorDict d = full_state_dict(index);
    if (world_rank_ == 0) io::save_safetensors(path, d);
  }

  void load_model(size_t index, const io::SafetensorsCheckpoint& src,
                  std::exception_ptr& err) override {
    if (!plan_.cuts_models()) return engine_->checkpoint().load_model(index, src, err);
    // This rank's part of every entry the file holds, as a file the engine reads; on an error an
    // empty one, so that the engine's collectives still run and no peer waits.
    io::TensorDict out;
    std::string tmp;
    try {
      tmp = private_tmp_dir(world_rank_);
      for (const auto& [name, t] : plan_.models().at(index)->module()->state_dict()) {
        if (!src.contains(name)) continue;
        const io::SafetensorsFile::Info& in = src.info(name);
        Tensor whole = empty(in.shape, TensorOptions(in.dtype));
        src.read_range(name, 0, in.numel, whole);
        out[name] = plan_.part(index, name, whole);
      }
    } catch (...) {
      if (!err) err = std::current_exception();
      out.clear();
    }
    try {
      ACCEL_CHECK(!tmp.empty(), IoError, "load_model", "no private temporary folder");
      const std::string f = (fs::path(tmp) / "model.safetensors").string();
      io::save_safetensors(f, out);
      const io::SafetensorsCheckpoint local(f);
      engine_->checkpoint().load_model(index, local, err);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    std::error_code ec;
    if (!tmp.empty()) fs::remove_all(tmp, ec);
  }

  Shape full_shape(size_t index, const std::string& name, const Shape& local) const override {
    return plan_.full_shape(index, name, local);
  }

 private:
  bool pp_active() const {
    const std::vector<std::string>& dims = plan_.cut_dims();
    return std::find(dims.begin(), dims.end(), "pp") != dims.end();
  }

  // Every stage's entries of model `index` into `d` (this stage's, whole): each entry, in name
  // order, broadcast over pp from the stage holding it.
  void gather_stages(size_t index, io::TensorDict& d) const {
    const ParallelModel& pm = *plan_.models().at(index);
    const ProcessGroupPtr& pp = plan_.mesh().group("pp");
    Device dev = kCPU;
    for (const Tensor& p : pm.module()->parameters()) dev = p.device();
    std::map<std::string, int> owner;
    for (const auto& [name, t] : d) owner[name] = pp->rank();
    for (const auto& [name, e] : pm.elsewhere) owner[name] = e.pp_rank;
    NoGradGuard ng;
    for (const auto& [name, r] : owner) {
      Tensor t;
      if (r == pp->rank()) {
        t = d.at(name).contiguous();
        if (t.device() != dev) t = t.to(dev);
      } else {
        const HeldElsewhere& e = pm.elsewhere.at(name);
        t = empty(e.shape, TensorOptions(e.dtype, dev));
      }
      pp->broadcast(t, r);
      d[name] = t;
    }
  }

  std::string cut_dims() const {
    std::string s;
    for (const std::string& d : plan_.cut_dims()) s += (s.empty() ? "" : ", ") + d;
    return s;
  }

  std::unique_ptr<Strategy> engine_;
  ParallelPlan plan_;
  ProcessGroupPtr world_;
  int world_rank_ = 0, engine_rank_ = 0, engine_size_ = 1;
  // Note [replicated gradient check]: at the first step, or every step when asked.
  bool replicated_checked_ = false;
  const bool check_every_step_ = env_flag(env::kVerifyPlacements);
};

}  // namespace

std::unique_ptr<Strategy> compose(const DeviceMesh& mesh, ParallelOptions options,
                                  std::unique_ptr<Strategy> engine, ProcessGroupPtr world,
                                  int engine_rank, int engine_size) {
  ACCEL_CHECK(engine != nullptr, ValueError, "accelerator", "no data-parallel engine");
  return std::make_unique<ComposedStrategy>(mesh, std::move(options), std::move(engine),
                                            std::move(world), engine_rank, engine_size);
}

Tensor grad_norm_term(const Tensor& g, const std::vector<StepGrads::Part>& parts, double p) {
  const bool inf = std::isinf(p);
  auto term = [&](const Tensor& x) {
    return inf        ? amax(abs(x)).to(kFloat64)
           : p == 2.0 ? sum(mul(x, x)).to(kFloat64)
                      : pow(norm(x, p).to(kFloat64), p);
  };
  if (parts.empty()) return term(g);
  Tensor out;
  for (const StepGrads::Part& part : parts) {
    if (part.length == 0 || (!inf && part.weight == 0.0)) continue;  // none, or another's
    Tensor n = term(part.length < 0 ? g : g.reshape({-1}).narrow(0, part.begin, part.length));
    if (!inf && part.weight != 1.0) n = mul(n, part.weight);
    out = !out.defined() ? n : inf ? maximum(out, n) : add(out, n);
  }
  return out;
}

}  // namespace accel::dist
