// The composition of parallel dimensions (Note [apply order] in parallel/parallelize.h, Note
// [composed strategy] in accelerate/composition.cc): the built-in steps, the pp step's cut of a
// model into stages (Note [pp step]); gradient clipping on meshes whose replication counts are not
// powers of two (tp 3, dp 3) equal to one process bit for bit (Note [composed gradient norms]).
//
// The binary is its own worker: `test_composition clip <out>` runs one rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "autograd/ops.h"
#include "core/generator.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "parallel/parallelize.h"
#include "tests/common/spawn.h"
#include "tests/common/util.h"

using namespace accel;
using namespace std::chrono_literals;

namespace {

// ---- the fixed order ----
std::vector<std::string>& order_log() {
  static std::vector<std::string> log;
  return log;
}

struct LoggingStep : dist::ApplyStep {
  explicit LoggingStep(std::string slot) : slot_(std::move(slot)) {}
  std::string_view name() const override { return slot_; }
  bool active(const dist::DeviceMesh&) const override { return true; }
  void check(const dist::ParallelModel&, const dist::StepContext&) const override {
    order_log().push_back("check " + slot_);
  }
  void apply(dist::ParallelModel&, const dist::StepContext&) override {
    order_log().push_back("apply " + slot_);
  }
  std::string slot_;
};

TEST_CASE("parallelize: the model slots are built in; the pp step runs first") {
  // Only the model slots take registrations, once each (pp, tp and cp are built in).
  CHECK_THROWS_WITH_AS(
      dist::register_apply_step("data_parallel", [] { return std::make_unique<LoggingStep>("x"); }),
      doctest::Contains("not a slot"), ValueError);
  for (const char* slot : {"pp", "tp", "cp"}) {
    CAPTURE(slot);
    CHECK_THROWS_WITH_AS(
        dist::register_apply_step(slot, [slot] { return std::make_unique<LoggingStep>(slot); }),
        doctest::Contains("has a step already"), ValueError);
  }
  // cp cuts no parameter; pp records Stage layouts, tp Shard / Replicate ones.
  CHECK(dist::registered_model_dims() == std::vector<std::string>{"pp", "tp"});
  {
    // A cp 2 mesh takes the cp step (active), which records no cut dimension.
    const dist::DeviceMesh cp({{"dp", 1}, {"cp", 2}}, 0, 1);
    dist::ParallelPlan with_cp(cp, {}, std::make_unique<LoggingStep>("data_parallel"));
    CHECK(with_cp.cut_dims().empty());
  }
  // A model without a pipeline form is refused at pp 2 before anything changes (the pp step's
  // check runs before the data-parallel step's).
  order_log().clear();
  const dist::DeviceMesh pp({{"pp", 2}, {"tp", 1}}, 0, 1);
  dist::ParallelPlan plan(pp, {}, std::make_unique<LoggingStep>("data_parallel"));
  CHECK(plan.cut_dims() == std::vector<std::string>{"pp"});
  auto m = std::make_shared<nn::Linear>(2, 2);
  CHECK_THROWS_WITH_AS(plan.prepare_model(m), doctest::Contains("has no pipeline form"),
                       ValueError);
  CHECK(order_log().empty());
  CHECK(plan.models().empty());
  CHECK(m->weight.numel() == 4);
}

// ---- the pp step (Note [pp step] in parallel/pp_step.cc) ----
// Three Linear layers in a chain; the split cuts it into stages.
struct Chain : nn::Module, dist::PipelineModel {
  std::shared_ptr<nn::Linear> l0, l1, l2;
  bool cover_l2 = true;
  Chain() {
    l0 = register_module("l0", std::make_shared<nn::Linear>(4, 4));
    l1 = register_module("l1", std::make_shared<nn::Linear>(4, 4));
    l2 = register_module("l2", std::make_shared<nn::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override { return (*l2)((*l1)((*l0)(x))); }
  std::vector<dist::PipelineLayer> pipeline_layers() override {
    std::vector<dist::PipelineLayer> out = {{"l0", [this](const Tensor& x) { return (*l0)(x); }},
                                            {"l1", [this](const Tensor& x) { return (*l1)(x); }}};
    if (cover_l2) out.push_back({"l2", [this](const Tensor& x) { return (*l2)(x); }});
    return out;
  }
};

TEST_CASE("pp step: a stage keeps its layers, records the others, refuses direct calls") {
  order_log().clear();
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    const dist::DeviceMesh pp({{"pp", 2}}, rank, 1);
    dist::ParallelPlan plan(pp, {}, std::make_unique<LoggingStep>("data_parallel"));
    auto m = std::make_shared<Chain>();
    auto opt_handle = m->l2->weight;  // an optimizer built before prepare holds handles like it
    dist::ParallelModel& pm = plan.prepare_model(m);
    // Three layers over two stages: l0, l1 on rank 0, l2 on rank 1.
    const std::vector<std::string> kept =
        rank == 0 ? std::vector<std::string>{"l0.bias", "l0.weight", "l1.bias", "l1.weight"}
                  : std::vector<std::string>{"l2.bias", "l2.weight"};
    std::vector<std::string> names;
    for (const auto& [n, t] : m->state_dict()) names.push_back(n);
    CHECK(names == kept);
    CHECK(pm.pipeline.size() == 1);
    CHECK(pm.elsewhere.size() == 6 - kept.size());
    if (rank == 0) {
      CHECK(pm.elsewhere.at("l2.weight").shape == Shape{2, 4});
      CHECK(pm.elsewhere.at("l2.weight").pp_rank == 1);
      CHECK(opt_handle.numel() == 0);  // the storage is freed for every handle
      CHECK(plan.held_elsewhere(0, "l2.bias"));
      // The chunk runs l0 and l1.
      CHECK(pm.pipeline[0](ones({3, 4})).sizes() == Shape{3, 4});
    } else {
      CHECK(pm.pipeline[0](ones({3, 4})).sizes() == Shape{3, 2});
    }
    // Each kept tensor is a Stage of pp: its only holder, primary and lead at any pp rank.
    const dist::TensorPlace p = plan.place(0, kept[0], m->state_dict().at(kept[0]).sizes());
    CHECK(p.primary);
    CHECK(p.lead);
    CHECK(p.layout == "pp: Stage");
    CHECK(plan.holders(0, kept[0]) == 1);
    CHECK_THROWS_WITH_AS((*m)(ones({3, 4})), doctest::Contains("split into pipeline stages"),
                         ValueError);
    // Its forward called past the wrapper reaches a layer without parameters: an error, no crash.
    CHECK_THROWS_AS(m->forward(ones({3, 4})), Error);
  }
  // A split that does not cover the model: l2's parameters belong to no layer.
  {
    const dist::DeviceMesh pp({{"pp", 2}}, 0, 1);
    dist::ParallelPlan plan(pp, {}, std::make_unique<LoggingStep>("data_parallel"));
    auto m = std::make_shared<Chain>();
    m->cover_l2 = false;
    CHECK_THROWS_WITH_AS(plan.prepare_model(m), doctest::Contains("'l2.weight' of"), ValueError);
    CHECK(m->l2->weight.numel() == 8);  // nothing changed
  }
  // More stages than layers; a split point that names no layer.
  {
    const dist::DeviceMesh pp({{"pp", 4}}, 0, 1);
    dist::ParallelPlan plan(pp, {}, std::make_unique<LoggingStep>("data_parallel"));
    CHECK_THROWS_WITH_AS(plan.prepare_model(std::make_shared<Chain>()),
                         doctest::Contains("3 layers cannot fill 4 virtual stages"), ValueError);
    dist::ParallelOptions o;
    o.pipeline.split = {"l9"};
    const dist::DeviceMesh pp2({{"pp", 2}}, 0, 1);
    dist::ParallelPlan bad(pp2, o, std::make_unique<LoggingStep>("data_parallel"));
    CHECK_THROWS_WITH_AS(bad.prepare_model(std::make_shared<Chain>()),
                         doctest::Contains("split point 'l9' names no layer"), ValueError);
  }
  // Weights tied across stages are refused.
  {
    const dist::DeviceMesh pp({{"pp", 2}}, 0, 1);
    dist::ParallelPlan plan(pp, {}, std::make_unique<LoggingStep>("data_parallel"));
    auto m = std::make_shared<Chain>();
    m->l1->set_parameter("bias", m->l0->bias);
    dist::ParallelOptions o;
    o.pipeline.split = {"l1"};  // l0 | l1, l2
    dist::ParallelPlan split(pp, o, std::make_unique<LoggingStep>("data_parallel"));
    CHECK_THROWS_WITH_AS(split.prepare_model(m), doctest::Contains("tied"), ValueError);
  }
}

// ---- gradient clipping: every element counted once, exactly ----
// Gradients of powers of two: the p-th powers and their sums are exact in any order, and DDP's
// and ZeRO's average of equal gradients ((c / 3 rounded) x 3) gives c back exactly. So a norm
// computed right equals one process's bit for bit; a weight 1 / 3 for a gradient held alike by 3
// tp ranks (the tp strategy's rule before the composition) does not.
// (With these a weight 1 / 3 on the tp-replicated fc2.bias and scale gives a norm 1 ulp off.)
double grad_of(const std::string& name) {
  static const std::map<std::string, double> c = {{"fc1.weight", 0.5},
                                                  {"fc1.bias", -2.0},
                                                  {"fc2.weight", 0.25},
                                                  {"fc2.bias", 1.0},
                                                  {"scale", 4.0}};
  return c.at(name);
}

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  nn::Parameter scale;  // replicated along tp: no plan entry
  Mlp() {
    Generator g(5);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 5, true, &g));  // tp 3: 2, 2, 1
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(5, 3, true, &g));
    scale = register_parameter("scale", ones({4}));
  }
  // The loss sum_k c_k * sum(parameter k): parameter k's gradient is c_k everywhere, on every rank
  // and for every piece of it.
  Tensor forward(const Tensor& x) override {
    Tensor loss = mul(sum(x), 0.0);
    for (auto& [name, p] : named_parameters()) loss = add(loss, mul(sum(p), grad_of(name)));
    return loss;
  }
};

int clip_worker(const std::string& out) {
  AcceleratorConfig c;
  c.cpu = true;
  c.tp_plan = {{"fc1", dist::colwise()}, {"fc2", dist::rowwise()}};
  Accelerator acc(c);
  auto model = std::make_shared<Mlp>();
  model->to(kFloat64);
  model = acc.prepare_model(model);
  optim::SGDOptions so;
  so.lr(0.1);
  auto opt = acc.prepare_optimizer(std::make_shared<optim::SGD>(model->parameters(), so));
  std::ofstream f(out + "." + std::to_string(acc.process_index()));
  for (int step = 0; step < 2; ++step) {
    opt->zero_grad();
    acc.backward((*model)(ones({2, 4}, TensorOptions(kFloat64))));
    const double norm = acc.clip_grad_norm_(1.0);
    opt->step();
    f << "norm " << std::hexfloat << norm << "\n";
  }
  return f.good() ? 0 : 1;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

TEST_CASE("clip_grad_norm_ at tp 3 (uneven) and dp 3 equals one process bit for bit") {
  const std::string dir = test::fresh_dir("composition", "clip");
  auto run = [&](const std::string& tag, int world, const std::map<std::string, std::string>& env) {
    const std::string out = dir + "/" + tag;
    auto res = test::run_world(self_exe(), {"clip", out}, world, env, 120s);
    for (const auto& r : res) REQUIRE_MESSAGE(r.code == 0, tag, ": ", r.output);
    std::vector<std::vector<std::string>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(read_lines(out + "." + std::to_string(r)));
    return ranks;
  };
  const auto one = run("one", 1, {});
  REQUIRE(one[0].size() == 2);
  const std::vector<std::pair<std::string, std::pair<int, std::map<std::string, std::string>>>>
      meshes = {
          {"tp 3 (DDP inside, uneven shards)", {3, {{"ACCEL_TP_SIZE", "3"}}}},
          {"dp 3 (DDP)", {3, {{"ACCEL_DP_REPLICATE_SIZE", "3"}}}},
          {"dp 3 (ZeRO-2)", {3, {{"ACCEL_ZERO_STAGE", "2"}}}},
          {"tp 2 x shard 2 (ZeRO-2)", {4, {{"ACCEL_TP_SIZE", "2"}, {"ACCEL_ZERO_STAGE", "2"}}}},
      };
  for (size_t i = 0; i < meshes.size(); ++i) {
    const std::string name = meshes[i].first;
    CAPTURE(name);
    const auto got =
        run("mesh" + std::to_string(i), meshes[i].second.first, meshes[i].second.second);
    for (const auto& lines : got) CHECK(lines == one[0]);  // every rank, every step, bit for bit
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "clip") return clip_worker(argv[2]);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
