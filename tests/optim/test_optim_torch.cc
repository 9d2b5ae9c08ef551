// Adadelta, Adagrad, RMSprop, SGD with Nesterov, LBFGS and ReduceLROnPlateau against PyTorch:
// tests/optim/optim_fixture.txt, written by make_optim_fixture.py with python3-torch (the test
// never runs Python). Trajectories in float64 with two parameter groups (one with its own lr and
// weight decay) agree to 1e-12; state_dict round trips resume bit-exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::check_close;
using accel::test::error_of;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::vector<double> numbers(const std::string& s) {
  std::vector<double> out;
  for (const std::string& t : split(s, ',')) out.push_back(std::stod(t));
  return out;
}

// kind -> case -> rows (fields after kind and case)
std::map<std::string, std::vector<std::vector<std::string>>> fixture(const std::string& kind) {
  std::ifstream f(std::string(ACCEL_SOURCE_ROOT) + "/tests/optim/optim_fixture.txt");
  REQUIRE_MESSAGE(f.good(), "cannot read tests/optim/optim_fixture.txt");
  std::map<std::string, std::vector<std::vector<std::string>>> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> r = split(line, '|');
    if (r[0] != kind) continue;
    out[r[1]].emplace_back(r.begin() + 2, r.end());
  }
  REQUIRE_FALSE(out.empty());
  return out;
}

const std::vector<double> kP1 = {0.5, -1.0, 2.0, 0.0, -0.25};
const std::vector<double> kP2 = {0.3, -0.7, 1.2, 0.9};

Tensor loss_of(const Tensor& p1, const Tensor& p2) {
  return add(sum(add(mul(pow(p1, 3.0), 0.7 / 3), p1)),
             sum(sub(mul(pow(p2, 2.0), 0.5), mul(pow(p2, 3.0), 0.3 / 3))));
}

struct Problem {
  Tensor p1 = tensor(kP1, Shape{5}, TensorOptions(kFloat64)).requires_grad_();
  Tensor p2 = tensor(kP2, Shape{2, 2}, TensorOptions(kFloat64)).requires_grad_();
  // group 0: its own lr and weight decay; group 1: the optimizer's
  std::vector<optim::ParamGroup> groups(double lr0, double wd0) const {
    return {optim::ParamGroup{{p1}, lr0, wd0}, optim::ParamGroup{{p2}, {}, {}}};
  }
  void step(optim::Optimizer& opt) const {
    opt.zero_grad();
    loss_of(p1, p2).backward();
    opt.step();
  }
};

// The cases of make_optim_fixture.py's OPT_CASES, built over pr's parameters.
std::unique_ptr<optim::Optimizer> make_case(const std::string& name, const Problem& pr) {
  using namespace optim;
  if (name == "adadelta")
    return std::make_unique<Adadelta>(pr.groups(0.5, 0.1), AdadeltaOptions(1.0).rho(0.9).eps(1e-6));
  if (name == "adadelta_wd")
    return std::make_unique<Adadelta>(pr.groups(2.0, 0.0),
                                      AdadeltaOptions(1.0).rho(0.8).eps(1e-4).weight_decay(0.05));
  if (name == "adagrad")
    return std::make_unique<Adagrad>(pr.groups(0.2, 0.1),
                                     AdagradFields{.lr = 0.1,
                                                   .lr_decay = 0.01,
                                                   .weight_decay = 0.0,
                                                   .initial_accumulator_value = 0.1,
                                                   .eps = 1e-10});
  if (name == "adagrad_plain")
    return std::make_unique<Adagrad>(pr.groups(0.05, 0.0),
                                     AdagradFields{.lr = 0.1, .weight_decay = 0.02});
  if (name == "rmsprop")
    return std::make_unique<RMSprop>(pr.groups(0.02, 0.1),
                                     RMSpropFields{.lr = 0.01, .alpha = 0.99, .eps = 1e-8});
  if (name == "rmsprop_momentum")
    return std::make_unique<RMSprop>(
        pr.groups(0.02, 0.1),
        RMSpropFields{.lr = 0.01, .alpha = 0.9, .eps = 1e-6, .momentum = 0.8});
  if (name == "rmsprop_centered")
    return std::make_unique<RMSprop>(
        pr.groups(0.02, 0.0),
        RMSpropFields{.lr = 0.01, .alpha = 0.95, .weight_decay = 0.05, .centered = true});
  if (name == "rmsprop_centered_momentum")
    return std::make_unique<RMSprop>(
        pr.groups(0.03, 0.1),
        RMSpropFields{.lr = 0.01, .alpha = 0.9, .momentum = 0.5, .centered = true});
  if (name == "sgd_nesterov")
    return std::make_unique<SGD>(pr.groups(0.05, 0.1),
                                 SGDFields{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  FAIL("unknown case " << name);
  return nullptr;
}

Tensor rosenbrock(const Tensor& a, const Tensor& b) {
  const Tensor x = cat({a, b}, 0);
  const Tensor head = x.slice(0, 0, 3), tail = x.slice(0, 1, 4);
  return sum(add(mul(pow(sub(tail, pow(head, 2.0)), 2.0), 100.0), pow(rsub(head, 1.0), 2.0)));
}

optim::LBFGSOptions lbfgs_case(const std::string& name) {
  optim::LBFGSOptions o;
  if (name == "plain") {
    o.lr(0.05);
    o.max_iter(4);
    o.history_size(3);
  } else if (name == "strong_wolfe") {
    o.lr(1.0);
    o.max_iter(6);
    o.history_size(4);
    o.line_search_fn("strong_wolfe");
  } else if (name == "strong_wolfe_eval") {
    o.lr(1.0);
    o.max_iter(20);
    o.max_eval(9);
    o.tolerance_grad(1e-9);
    o.tolerance_change(1e-12);
    o.history_size(10);
    o.line_search_fn("strong_wolfe");
  } else {
    FAIL("unknown case " << name);
  }
  return o;
}

struct Rosen {
  Tensor a =
      tensor(std::vector<double>{-1.2, 1.0}, Shape{2}, TensorOptions(kFloat64)).requires_grad_();
  Tensor b =
      tensor(std::vector<double>{0.8, -0.5}, Shape{2}, TensorOptions(kFloat64)).requires_grad_();
  int calls = 0;
  std::function<Tensor()> closure(optim::Optimizer& opt) {
    return [this, &opt] {
      ++calls;
      opt.zero_grad();
      Tensor loss = rosenbrock(a, b);
      loss.backward();
      return loss;
    };
  }
};

optim::ReduceLROnPlateauOptions plateau_case(const std::string& name) {
  using optim::PlateauMode;
  using optim::ThresholdMode;
  if (name == "min_rel")
    return {PlateauMode::Min, 0.5, 2, 0.05, ThresholdMode::Rel, 1, {0.001, 0.02}};
  if (name == "min_abs") return {PlateauMode::Min, 0.1, 1, 0.02, ThresholdMode::Abs, 0, {0.0}};
  if (name == "max_rel") return {PlateauMode::Max, 0.3, 3, 1e-4, ThresholdMode::Rel, 2, {0.004}};
  if (name == "max_abs_eps")
    return {PlateauMode::Max, 0.9, 0, 0.0, ThresholdMode::Abs, 0, {0.0}, 0.004};
  FAIL("unknown case " << name);
  return {};
}

}  // namespace

TEST_CASE("Adadelta, Adagrad, RMSprop and SGD Nesterov follow PyTorch's trajectories") {
  const auto cases = fixture("opt");
  CHECK(cases.size() == 9);
  for (const auto& [name, rows] : cases) {
    Problem pr;
    auto opt = make_case(name, pr);
    for (const auto& r : rows) {
      pr.step(*opt);
      const std::string what = name + " step " + r[0];
      check_close(pr.p1, numbers(r[1]), 1e-12, 1e-12, what + " p1");
      check_close(pr.p2, numbers(r[2]), 1e-12, 1e-12, what + " p2");
    }
    CHECK(opt->step_count(1) == int64_t(rows.size()));
  }
}

TEST_CASE("the new optimizers resume bit-exactly from state_dict, also through safetensors") {
  for (const char* name : {"adadelta", "adagrad", "rmsprop_centered_momentum", "rmsprop"}) {
    INFO(name);
    Problem a, b;
    auto oa = make_case(name, a);
    auto ob = make_case(name, b);
    for (int i = 0; i < 2; ++i) a.step(*oa);
    const std::string path = std::string("/tmp/accel_optim_torch_") + name + ".safetensors";
    io::save_safetensors(path, oa->state_dict());
    {
      NoGradGuard ng;
      b.p1.copy_(a.p1);
      b.p2.copy_(a.p2);
    }
    ob->load_state_dict(io::load_safetensors(path));
    std::remove(path.c_str());
    CHECK(ob->step_count(0) == 2);
    for (int i = 0; i < 3; ++i) {
      a.step(*oa);
      b.step(*ob);
    }
    CHECK(equal(a.p1, b.p1));
    CHECK(equal(a.p2, b.p2));
    // rebuild keeps the type, the options and the groups' hyperparameters
    auto re = oa->rebuild({optim::ParamGroup{{zeros({3}, TensorOptions(kFloat64))}, {}, {}},
                           optim::ParamGroup{{zeros({2}, TensorOptions(kFloat64))}, {}, {}}});
    CHECK(typeid(*re) == typeid(*oa));
    CHECK(re->lr(0) == oa->lr(0));
    CHECK(re->weight_decay(0) == oa->weight_decay(0));
    CHECK(re->lr(1) == oa->lr(1));
  }
}

TEST_CASE("option checks name the optimizer") {
  Problem pr;
  CHECK(error_of([&] { optim::Adadelta({pr.p1}, {.rho = 1.5}); }).find("Adadelta") !=
        std::string::npos);
  CHECK(error_of([&] { optim::Adagrad({pr.p1}, {.lr_decay = -1}); }).find("lr_decay") !=
        std::string::npos);
  CHECK(error_of([&] { optim::RMSprop({pr.p1}, {.momentum = -0.1}); }).find("RMSprop") !=
        std::string::npos);
  CHECK(error_of([&] {
          optim::LBFGSOptions o;
          o.line_search_fn("armijo");
          optim::LBFGS({pr.p1}, o);
        }).find("strong_wolfe") != std::string::npos);
}

TEST_CASE("LBFGS minimises Rosenbrock along PyTorch's iterates, with and without strong_wolfe") {
  const auto cases = fixture("lbfgs");
  CHECK(cases.size() == 3);
  for (const auto& [name, rows] : cases) {
    Rosen r;
    optim::LBFGS opt({r.a, r.b}, lbfgs_case(name));
    auto closure = r.closure(opt);
    for (const auto& row : rows) {
      const Tensor loss = opt.step(closure);
      const std::string what = name + " step " + row[0];
      check_close(loss, numbers(row[1]), 1e-12, 1e-12, what + " loss");
      check_close(cat({r.a, r.b}, 0), numbers(row[2]), 1e-12, 1e-12, what + " x");
    }
  }
}

TEST_CASE("LBFGS: resumes bit-exactly from state_dict; refuses step(), sharding, bad state") {
  for (const std::string name : {"plain", "strong_wolfe"}) {
    INFO(name);
    Rosen r1, r2;
    optim::LBFGS o1({r1.a, r1.b}, lbfgs_case(name));
    optim::LBFGS o2({r2.a, r2.b}, lbfgs_case(name));
    auto c1 = r1.closure(o1), c2 = r2.closure(o2);
    o1.step(c1);
    o1.step(c1);
    const io::TensorDict sd = o1.state_dict();
    CHECK(sd.count("state.lbfgs.old_dirs"));
    CHECK(sd.at("state.lbfgs.func_evals").item<int64_t>() == o1.func_evals());
    const std::string path = "/tmp/accel_optim_torch_lbfgs_" + name + ".safetensors";
    io::save_safetensors(path, sd);
    {
      NoGradGuard ng;
      r2.a.copy_(r1.a);
      r2.b.copy_(r1.b);
    }
    o2.load_state_dict(io::load_safetensors(path));
    std::remove(path.c_str());
    CHECK(o2.n_iter() == o1.n_iter());
    for (int i = 0; i < 2; ++i) {
      const Tensor l1 = o1.step(c1), l2 = o2.step(c2);
      CHECK(l1.item<double>() == l2.item<double>());
    }
    CHECK(equal(r1.a, r2.a));
    CHECK(equal(r1.b, r2.b));
    CHECK(o1.func_evals() == o2.func_evals());
  }
  Rosen r;
  optim::LBFGS opt({r.a, r.b});
  CHECK(error_of([&] { opt.step(); }).find("step(closure)") != std::string::npos);
  const std::string shard = error_of([&] { (void)opt.rebuild({}); });
  CHECK(shard.find("LBFGS") != std::string::npos);
  CHECK(shard.find("cannot be sharded") != std::string::npos);
  CHECK(opt.requires_closure());
  io::TensorDict bad = opt.state_dict();
  bad["state.lbfgs.func_evals"] = scalar_tensor(int64_t(3), kInt64);
  bad["state.lbfgs.n_iter"] = scalar_tensor(int64_t(3), kInt64);
  bad["state.lbfgs.d"] = zeros({3}, TensorOptions(kFloat64));
  const std::string msg = error_of([&] { opt.load_state_dict(bad); });
  CHECK(msg.find("state.lbfgs.d: checkpoint") != std::string::npos);
  CHECK(opt.func_evals() == 0);  // nothing applied
  // A parameter of another dtype cannot join the flat vector.
  CHECK(error_of([&] {
          optim::LBFGS({r.a, zeros({2}).requires_grad_()});
        }).find("one dtype") != std::string::npos);
}

TEST_CASE("ReduceLROnPlateau follows PyTorch's lr sequence and resumes from state_dict") {
  const auto cases = fixture("plateau");
  CHECK(cases.size() == 4);
  for (const auto& [name, rows] : cases) {
    INFO(name);
    Tensor p = zeros({1}).requires_grad_(), q = zeros({1}).requires_grad_();
    optim::SGD opt({optim::ParamGroup{{p}, 0.1, {}}, optim::ParamGroup{{q}, 0.05, {}}},
                   {.lr = 0.1});
    optim::ReduceLROnPlateau sched(opt, plateau_case(name));
    // A second scheduler restarted from the first's state halfway.
    Tensor p2 = zeros({1}).requires_grad_(), q2 = zeros({1}).requires_grad_();
    optim::SGD opt2({optim::ParamGroup{{p2}, 0.1, {}}, optim::ParamGroup{{q2}, 0.05, {}}},
                    {.lr = 0.1});
    optim::ReduceLROnPlateau sched2(opt2, plateau_case(name));
    for (size_t i = 0; i < rows.size(); ++i) {
      const double metric = numbers(rows[i][1])[0];
      sched.step(metric);
      const std::vector<double> lrs = numbers(rows[i][2]);
      INFO("step " << rows[i][0]);
      CHECK(opt.lr(0) == lrs[0]);
      CHECK(opt.lr(1) == lrs[1]);
      CHECK(sched.get_last_lr() == lrs);
      if (i == rows.size() / 2) sched2.load_state_dict(sched.state_dict());
      if (i > rows.size() / 2) {
        sched2.step(metric);
        CHECK(opt2.lr(0) == lrs[0]);
        CHECK(opt2.lr(1) == lrs[1]);
      }
    }
    CHECK(sched.last_epoch() == int64_t(rows.size()));
    CHECK(sched2.last_epoch() == sched.last_epoch());
    CHECK(sched2.best() == sched.best());
  }
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  optim::ReduceLROnPlateau sched(opt, {.patience = 0});
  CHECK(error_of([&] { sched.step(); }).find("step(metric)") != std::string::npos);
  sched.step(std::nan(""));            // NaN never improves: a bad epoch
  CHECK(sched.num_bad_epochs() == 0);  // ... past patience 0: reduced
  CHECK(opt.lr(0) == doctest::Approx(0.01));
  CHECK(error_of([&] { optim::ReduceLROnPlateau(opt, {.factor = 1.0}); }).find("factor") !=
        std::string::npos);
  io::TensorDict sd = sched.state_dict();
  sd.erase("best");
  CHECK(error_of([&] { sched.load_state_dict(sd); }).find("missing 'best'") != std::string::npos);
}
