// The strategy seam (Note [strategy registry] in accelerate/strategy_registry.h): this file alone
// registers a strategy the library does not have, local SGD (every rank steps on its own
// gradients; every k optimizer steps the ranks average their parameters), and trains with it
// through Accelerator::prepare (selected by AcceleratorConfig::strategy, options as a typed value)
// and through accel-run (`--strategy local_sgd` -> ACCEL_STRATEGY -> AcceleratorConfig::with_env).
// The parameters must equal a reference computed here without the Accelerator; DDP's (what the
// facade gave before the seam, for any name) differ from it, so a facade that ignored the name
// fails.
//
// The binary is its own worker: `test_strategy_seam worker <out> <code|env>` runs one rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "accelerate/strategy_base.h"
#include "accelerate/strategy_registry.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "autograd/ops.h"
#include "optim/sgd.h"
#include "core/generator.h"
#include "tests/common/spawn.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace accel;
using namespace std::chrono_literals;
using accel::test::check_close;
using accel::test::fresh_dir;

namespace {

// fresh_dir's prefix: /tmp/strategy-seam-<pid>-<tag>.
constexpr char kScratch[] = "strategy-seam";

constexpr int kSteps = 7;
constexpr double kLr = 0.1;

// ---- the toy strategy: everything a strategy of its own needs ----
struct LocalSgdOptions : dist::StrategyOptions {
  int every = 2;  // average the parameters after every `every` optimizer steps
};

class LocalSgdStrategy final : public dist::ReplicatedStrategy {
 public:
  explicit LocalSgdStrategy(const dist::StrategyContext& ctx)
      : ReplicatedStrategy(ctx), every_(ctx.options_as<LocalSgdOptions>("local_sgd").every) {}
  std::string_view name() const override { return "local_sgd"; }
  void prepare_model(const std::shared_ptr<nn::Module>& model) override {
    NoGradGuard ng;
    for (auto& [n, p] : model->named_parameters()) broadcast_in_place(p);  // rank 0's start
    models_.push_back(model);
  }
  void backward(const Tensor& loss, bool) override { loss.backward(); }  // local gradients
  void after_step(optim::Optimizer&, bool stepped) override {
    if (!stepped || ++steps_ % every_ != 0) return;
    NoGradGuard ng;
    for (auto& m : models_)
      for (auto& [n, p] : m->named_parameters()) {
        ctx_.group->all_reduce(p, dist::ReduceOp::Sum);
        Tensor(p).div_(double(ctx_.world_size));
      }
  }

 private:
  int every_;
  int steps_ = 0;
};

// With one process there is nothing to average: runs_alone is left null ("none").
dist::StrategySpec local_sgd_spec() {
  dist::StrategySpec s;
  s.name = "local_sgd";
  s.make = [](const dist::StrategyContext& ctx) { return std::make_unique<LocalSgdStrategy>(ctx); };
  return s;
}
const dist::StrategyRegistration kLocalSgd(local_sgd_spec());

// ---- the problem: y = x . (0.5, -1, 2, 0.25), rank r's own 8 samples ----
struct Lin : nn::Module {
  Tensor w, b;
  Lin() {
    Generator g(7);
    w = register_parameter("w", randn({1, 4}, {}, &g));
    b = register_parameter("b", zeros({1}));
  }
  Tensor forward(const Tensor& x) override { return linear(x, w, b); }
};

std::pair<Tensor, Tensor> rank_data(int rank) {
  Generator g(100 + uint64_t(rank));
  Tensor x = randn({8, 4}, {}, &g);
  Tensor y = sum(mul(x, tensor({0.5f, -1.0f, 2.0f, 0.25f})), {1}, true);
  return {x, y};
}

std::vector<double> params_of(const nn::Module& m) {
  std::vector<double> out;
  for (auto& [n, p] : m.named_parameters())
    for (float v : p.to_vector<float>()) out.push_back(double(v));
  return out;
}

// Local SGD of `world` replicas, averaged every `every` steps, without the Accelerator: each
// rank's parameters (after a last local step they differ).
std::vector<std::vector<double>> reference(int world, int every, bool average) {
  std::vector<std::shared_ptr<Lin>> m;
  for (int r = 0; r < world; ++r) m.push_back(std::make_shared<Lin>());
  for (int s = 1; s <= kSteps; ++s) {
    for (int r = 0; r < world; ++r) {
      auto [x, y] = rank_data(r);
      m[r]->zero_grad(true);
      mse_loss(m[r]->forward(x), y).backward();
      NoGradGuard ng;
      for (auto& [n, p] : m[r]->named_parameters()) Tensor(p).sub_(mul(p.grad(), kLr));
    }
    if (!average || s % every != 0) continue;
    NoGradGuard ng;
    for (Tensor Lin::*field : {&Lin::w, &Lin::b}) {
      Tensor mean_p = zeros_like((*m[0]).*field);
      for (int r = 0; r < world; ++r) mean_p = add(mean_p, (*m[r]).*field);
      mean_p = div(mean_p, double(world));
      for (int r = 0; r < world; ++r) ((*m[r]).*field).copy_(mean_p);
    }
  }
  std::vector<std::vector<double>> out;
  for (auto& r : m) out.push_back(params_of(*r));
  return out;
}

// ---- local SGD at tp 2: the tp step cuts the model, then the program's strategy runs over dp ----
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Mlp() {
    Generator g(11);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 6, true, &g));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(6, 1, true, &g));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
};

// One rank of local SGD (every 3 steps) on the Mlp in float64, on the data of its dp index (tp
// peers alike); writes its full parameters (get_state_dict: tp pieces gathered) to `out`.<rank>.
int tp_worker(const std::string& out) {
  AcceleratorConfig c;
  c.cpu = true;
  c.strategy = "local_sgd";
  auto o = std::make_shared<LocalSgdOptions>();
  o->every = 3;
  c.strategy_options = o;
  c.tp_plan = {{"fc1", dist::colwise()}, {"fc2", dist::rowwise()}};
  Accelerator acc(c);
  auto model = std::make_shared<Mlp>();
  model->to(kFloat64);
  model = acc.prepare_model(model);
  optim::SGDOptions so;
  so.lr(kLr);
  auto opt = acc.prepare_optimizer(std::make_shared<optim::SGD>(model->parameters(), so));
  auto [x, y] = rank_data(acc.mesh().coordinate("dp"));
  x = x.to(kFloat64);
  y = y.to(kFloat64);
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    acc.backward(mse_loss((*model)(x), y));
    opt->step();
  }
  std::ofstream f(out + "." + std::to_string(acc.process_index()));
  f << acc.strategy_name();
  for (const auto& [name, t] : acc.get_state_dict(*model))
    for (double v : t.contiguous().to_vector<double>()) f << " " << std::hexfloat << v;
  f << "\n";
  return f.good() ? 0 : 1;
}

// One rank: kSteps of SGD through the Accelerator; writes "<strategy> <params...>" to `out`.
int worker(const std::string& out, const std::string& how) {
  AcceleratorConfig c;
  c.cpu = true;
  c.project_dir = std::filesystem::path(out).parent_path().string();
  if (how == "code") {
    c.read_env = false;
    c.strategy = "local_sgd";
    auto o = std::make_shared<LocalSgdOptions>();
    o->every = 3;
    c.strategy_options = o;
  }
  Accelerator acc(c);
  auto model = acc.prepare_model(std::make_shared<Lin>());
  optim::SGDOptions so;
  so.lr(kLr);
  auto opt = acc.prepare_optimizer(std::make_shared<optim::SGD>(model->parameters(), so));
  auto [x, y] = rank_data(acc.process_index());
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    acc.backward(mse_loss(model->forward(x), y));
    opt->step();
  }
  std::ofstream f(out + "." + std::to_string(acc.process_index()));
  f << acc.strategy_name();
  for (double v : params_of(*model)) f << " " << std::hexfloat << v;
  f << "\n";
  return f.good() ? 0 : 1;
}

struct RankOut {
  std::string strategy;
  std::vector<double> params;
};
RankOut read_rank(const std::string& path) {
  std::ifstream f(path);
  RankOut r;
  std::string v;
  f >> r.strategy;
  while (f >> v) r.params.push_back(std::strtod(v.c_str(), nullptr));
  return r;
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

bool differs(const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-3) return true;
  return false;
}

}  // namespace

TEST_CASE("a strategy registered by a test file is listed and refuses a second registration") {
  const auto names = dist::registered_strategies();
  for (const char* n : {"none", "ddp", "zero1", "zero2", "fsdp", "local_sgd"})
    CHECK_MESSAGE(std::find(names.begin(), names.end(), n) != names.end(), n);
  CHECK_THROWS_AS(dist::register_strategy(local_sgd_spec()), ValueError);
  AcceleratorConfig c;
  c.read_env = false;
  c.strategy = "no_such_strategy";
  try {
    Accelerator acc(c);
    FAIL("an unknown strategy was accepted");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("local_sgd") != std::string::npos);  // lists what exists
  }
}

TEST_CASE("the registry agrees with core/parallelism.h's built-in strategies") {
  // accel-run decides stages from kBuiltinStrategies without linking the
  // registry (Note [built-in strategies]): every entry is registered with its stage, and every
  // other registered strategy claims none.
  for (const BuiltinStrategy& b : kBuiltinStrategies) {
    const dist::StrategySpec* spec = dist::find_strategy(b.name);
    REQUIRE_MESSAGE(spec != nullptr, b.name);
    CHECK(spec->zero_stage == b.zero_stage);
  }
  for (const std::string& n : dist::registered_strategies())
    if (!find_builtin_strategy(n)) CHECK_MESSAGE(dist::find_strategy(n)->zero_stage < 0, n);
}

TEST_CASE("local SGD trains through Accelerator::prepare (AcceleratorConfig::strategy)") {
  const std::string dir = fresh_dir(kScratch, "code");
  auto res = accel::test::run_world(self_exe(), {"worker", dir + "/out", "code"}, 2, {}, 120s);
  for (auto& r : res) REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto want = reference(2, 3, true);
  for (int rank = 0; rank < 2; ++rank) {
    RankOut o = read_rank(dir + "/out." + std::to_string(rank));
    CHECK(o.strategy == "local_sgd");
    check_close(o.params, want[rank], 1e-5, 1e-5);
  }
  CHECK(differs(want[0], want[1]));  // step 7 came after the last average (step 6)
  // Averaging every 3 of 7 steps is not DDP (whose replicas equal the mean-gradient run) and
  // not independent training: the comparison above can tell them apart.
  CHECK(differs(want[0], reference(2, 1, true)[0]));
  CHECK(differs(want[0], reference(2, 3, false)[0]));
  std::filesystem::remove_all(dir);
}

TEST_CASE("local SGD trains through accel-run --strategy local_sgd (ACCEL_STRATEGY)") {
  const std::string dir = fresh_dir(kScratch, "run");
  const std::string cmd = std::string("'") + ACCEL_RUN_PATH +
                          "' launch -q --cpu --num_processes 2 --strategy local_sgd '" +
                          self_exe() + "' worker '" + dir + "/out' env > '" + dir + "/log' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir + "/log");
  std::stringstream ss;
  ss << log.rdbuf();
  REQUIRE_MESSAGE(rc == 0, ss.str());
  const auto want = reference(2, 2, true);  // LocalSgdOptions' default: every 2 steps
  for (int rank = 0; rank < 2; ++rank) {
    RankOut o = read_rank(dir + "/out." + std::to_string(rank));
    CHECK(o.strategy == "local_sgd");
    check_close(o.params, want[rank], 1e-5, 1e-5);
  }
  std::filesystem::remove_all(dir);
}

// Before the composition, tp ran with ddp or fsdp only and refused a program's own strategy by
// name. Now the tp step cuts the model and local SGD averages over the dp groups: tp 2 x dp 2
// trains as dp 2 does (the same local SGD, every layer split over 2 ranks).
TEST_CASE("local SGD composes with tp: tp 2 x dp 2 equals dp 2") {
  const std::string dir = fresh_dir(kScratch, "tp");
  auto tp =
      accel::test::run_world(self_exe(), {"tp", dir + "/tp"}, 4, {{"ACCEL_TP_SIZE", "2"}}, 120s);
  for (auto& r : tp) REQUIRE_MESSAGE(r.code == 0, r.output);
  auto dp = accel::test::run_world(self_exe(), {"tp", dir + "/dp"}, 2, {}, 120s);
  for (auto& r : dp) REQUIRE_MESSAGE(r.code == 0, r.output);
  const RankOut d0 = read_rank(dir + "/dp.0"), d1 = read_rank(dir + "/dp.1");
  CHECK(d0.strategy == "local_sgd");
  CHECK(differs(d0.params, d1.params));  // step 7 came after the last average (step 6)
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const RankOut o = read_rank(dir + "/tp." + std::to_string(rank));
    CHECK(o.strategy == "local_sgd");
    // Mesh order dp_replicate, dp_shard, tp: rank = dp index x 2 + tp index.
    check_close(o.params, (rank / 2 == 0 ? d0 : d1).params, 1e-12, 1e-12);
  }
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "worker") return worker(argv[2], argv[3]);
  if (argc == 3 && std::string(argv[1]) == "tp") return tp_worker(argv[2]);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
