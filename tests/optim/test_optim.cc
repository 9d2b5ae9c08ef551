// Optimizers against updates computed by hand in double, parameter groups, state_dict round
// trips; LR schedulers against known values; gradient clipping.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::check_close;
using accel::test::error_of;

namespace {

const std::vector<double> kInit = {0.5, -1.0, 2.0, 0.0, -0.25};

// Gradient of the loss sum(c * p^3 / 3 + p) at p: c * p^2 + 1 (so every element moves).
constexpr double kC = 0.7;
Tensor loss_of(const Tensor& p) { return sum(add(mul(pow(p, 3.0), kC / 3.0), p)); }
double grad_of(double p) { return kC * p * p + 1.0; }

Tensor param(DType dt = kFloat32) {
  return tensor(kInit, Shape{int64_t(kInit.size())}, TensorOptions(kFloat64))
      .to(dt)
      .requires_grad_();
}

void train(optim::Optimizer& opt, const Tensor& p, int steps) {
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    loss_of(p).backward();
    opt.step();
  }
}

// Reference Adam / AdamW in double.
std::vector<double> adam_ref(int steps, double lr, double b1, double b2, double eps, double wd,
                             bool decoupled) {
  std::vector<double> p = kInit, m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad_of(p[i]);
      if (decoupled) {
        p[i] *= 1.0 - lr * wd;
      } else {
        g += wd * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  return p;
}

std::vector<double> sgd_ref(int steps, double lr, double mom, double damp, double wd,
                            bool nesterov) {
  std::vector<double> p = kInit, buf(p.size(), 0.0);
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad_of(p[i]) + wd * p[i];
      if (mom != 0) {
        buf[i] = t == 1 ? g : mom * buf[i] + (1 - damp) * g;
        g = nesterov ? g + mom * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
  return p;
}

}  // namespace

TEST_CASE("AdamW and Adam after 3 steps match a float64 reference (fused and op paths)") {
  const double lr = 0.1, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
  for (bool fused : {true, false}) {
    for (DType dt : {kFloat32, kFloat64}) {
      INFO("fused " << fused << " dtype " << dt);
      const double rtol = dt == kFloat64 ? 1e-12 : 2e-6, atol = dt == kFloat64 ? 1e-14 : 1e-6;
      Tensor p = param(dt);
      optim::AdamW adamw(
          {p}, {.lr = lr, .betas = {b1, b2}, .eps = eps, .weight_decay = wd, .fused = fused});
      train(adamw, p, 3);
      check_close(p, adam_ref(3, lr, b1, b2, eps, wd, true), rtol, atol);
      CHECK(adamw.step_count(0) == 3);

      Tensor q = param(dt);
      optim::Adam adam(
          {q}, {.lr = lr, .betas = {b1, b2}, .eps = eps, .weight_decay = wd, .fused = fused});
      train(adam, q, 3);
      check_close(q, adam_ref(3, lr, b1, b2, eps, wd, false), rtol, atol);
    }
  }
  // The decoupled and L2 variants differ (the reference is not trivially the same).
  const auto a = adam_ref(3, lr, b1, b2, eps, wd, true),
             b = adam_ref(3, lr, b1, b2, eps, wd, false);
  CHECK(std::abs(a[0] - b[0]) > 1e-4);
}

TEST_CASE(
    "fused AdamW kernel equals the op-based step on a large tensor (vector + parallel path)") {
  // 100003 elements: several threads' worth of work and a ragged tail for the 8-wide loop.
  const int64_t n = 100003;
  manual_seed(7);
  Tensor init = randn({n});
  Tensor a = init.clone().requires_grad_(), b = init.clone().requires_grad_();
  optim::AdamW fa({a}, {.lr = 1e-2, .fused = true});
  optim::AdamW fb({b}, {.lr = 1e-2, .fused = false});
  for (int step = 0; step < 3; ++step) {
    Tensor g = randn({n});
    a.set_grad(g.clone());
    b.set_grad(g.clone());
    fa.step();
    fb.step();
  }
  CHECK(allclose(a, b, 1e-5, 1e-7));
  CHECK(allclose(fa.state(0, "exp_avg_sq"), fb.state(0, "exp_avg_sq"), 1e-5, 1e-12));
  // Half-precision parameters take the fused path too (computing in float).
  Tensor h = init.to(kBFloat16).requires_grad_();
  optim::AdamW fh({h}, {.lr = 1e-2});
  h.set_grad(ones({n}, kBFloat16));
  fh.step();
  CHECK(fh.state(0, "exp_avg").dtype() == kBFloat16);
  Tensor hf = init.clone().requires_grad_();
  optim::AdamW ff({hf}, {.lr = 1e-2});
  hf.set_grad(ones({n}));
  ff.step();
  CHECK(allclose(h.to(kFloat32), hf, 1e-2, 1e-2));
}

TEST_CASE("SGD: plain, momentum with dampening, Nesterov, weight decay vs hand-computed") {
  struct Case {
    double mom, damp, wd;
    bool nesterov;
  };
  for (const Case& c : {Case{0, 0, 0, false}, Case{0.9, 0.1, 0.01, false}, Case{0.9, 0, 0.05, true},
                        Case{0, 0, 0.2, false}}) {
    INFO("momentum " << c.mom << " dampening " << c.damp << " wd " << c.wd << " nesterov "
                     << c.nesterov);
    Tensor p = param(kFloat64);
    optim::SGD sgd({p}, {.lr = 0.05,
                         .momentum = c.mom,
                         .dampening = c.damp,
                         .weight_decay = c.wd,
                         .nesterov = c.nesterov});
    train(sgd, p, 3);
    check_close(p, sgd_ref(3, 0.05, c.mom, c.damp, c.wd, c.nesterov), 1e-12, 1e-14);
  }
  // One plain step written out: p - lr * (c p^2 + 1).
  Tensor p = param(kFloat64);
  optim::SGD sgd({p}, {.lr = 0.1});
  train(sgd, p, 1);
  CHECK(p.tolist()[0] == doctest::Approx(0.5 - 0.1 * (0.7 * 0.25 + 1)));
  CHECK_THROWS_AS(optim::SGD({param()}, {.nesterov = true}), ValueError);
  CHECK_THROWS_AS(optim::SGD({param()}, {.lr = -1}), ValueError);
}

TEST_CASE("parameter groups carry their own lr and weight decay") {
  Tensor a = param(kFloat64), b = param(kFloat64);
  optim::SGD sgd(std::vector<optim::ParamGroup>{{{a}, {}, {}}, {{b}, 0.01, 0.5}},
                 {.lr = 0.1, .weight_decay = 0.0});
  CHECK(sgd.num_param_groups() == 2);
  CHECK(sgd.lr(0) == 0.1);
  CHECK(sgd.lr(1) == 0.01);
  CHECK(sgd.weight_decay(1) == 0.5);
  sgd.zero_grad();
  loss_of(a).backward();
  loss_of(b).backward();
  sgd.step();
  CHECK(a.tolist()[1] == doctest::Approx(-1.0 - 0.1 * grad_of(-1.0)));
  CHECK(b.tolist()[1] == doctest::Approx(-1.0 - 0.01 * (grad_of(-1.0) + 0.5 * -1.0)));
  CHECK_THROWS_AS(sgd.lr(2), IndexError);
  // The same parameter twice is refused.
  CHECK_THROWS_AS(optim::SGD(std::vector<optim::ParamGroup>{{{a}, {}, {}}, {{a}, {}, {}}}),
                  ValueError);
  // Non-leaf tensors and integer tensors are refused.
  CHECK_THROWS_AS(optim::SGD({mul(a, 2.0)}), ValueError);
  CHECK_THROWS_AS(optim::SGD({ones({2}, kInt64)}), DTypeError);
}

// rebuild: the same type and options over other parameters, per-group lr / weight decay kept
// unless the new group sets them; the rebuilt optimizer steps exactly like the source would.
TEST_CASE("rebuild: same type and options over other parameters, group hyperparameters kept") {
  auto check_same_updates = [](const std::function<std::unique_ptr<optim::Optimizer>(
                                   std::vector<optim::ParamGroup>)>& make) {
    // Source over (a0, b0), rebuilt over fresh (a1, b1): 3 steps give bit-identical values.
    Tensor a0 = param(kFloat64), b0 = param(kFloat64), a1 = param(kFloat64), b1 = param(kFloat64);
    std::unique_ptr<optim::Optimizer> src = make({{{a0}, {}, {}}, {{b0}, 0.02, 0.0}});
    std::unique_ptr<optim::Optimizer> re = src->rebuild({{{a1}, {}, {}}, {{b1}, {}, {}}});
    REQUIRE(re != nullptr);
    CHECK(typeid(*re) == typeid(*src));
    REQUIRE(re->num_param_groups() == 2);
    for (size_t g = 0; g < 2; ++g) {
      CHECK(re->lr(g) == src->lr(g));
      CHECK(re->weight_decay(g) == src->weight_decay(g));
    }
    CHECK(re->params(1)[0].is_same(b1));
    for (int i = 0; i < 3; ++i) {
      src->zero_grad();
      re->zero_grad();
      loss_of(a0).backward();
      loss_of(b0).backward();
      loss_of(a1).backward();
      loss_of(b1).backward();
      src->step();
      re->step();
    }
    CHECK(a1.tolist() == a0.tolist());
    CHECK(b1.tolist() == b0.tolist());
    CHECK(re->step_count(0) == 3);
    // A group that sets its own lr / weight decay keeps them.
    Tensor c = param(kFloat64), d = param(kFloat64);
    auto own = src->rebuild({{{c}, 0.5, 0.25}, {{d}, {}, {}}});
    CHECK(own->lr(0) == 0.5);
    CHECK(own->weight_decay(0) == 0.25);
    CHECK(own->lr(1) == 0.02);
    CHECK(own->step_count(0) == 0);  // no state is copied
    // Another number of groups is refused.
    CHECK_THROWS_AS(src->rebuild({{{c}, {}, {}}}), ValueError);
  };
  check_same_updates([](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(
        std::move(g), optim::SGDFields{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  });
  check_same_updates([](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::Adam>(std::move(g),
                                         optim::AdamFields{.lr = 0.05, .weight_decay = 0.1});
  });
  check_same_updates([](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::AdamW>(
        std::move(g), optim::AdamWOptions(0.05).betas({0.9, 0.99}).weight_decay(0.3));
  });
  // A subclass that does not implement rebuild is refused by name (its base would drop its
  // changes), and so is an optimizer type without rebuild.
  struct OwnSGD : optim::SGD {
    using optim::SGD::SGD;
  };
  Tensor p = param(kFloat64), q = param(kFloat64);
  OwnSGD own(std::vector<Tensor>{p});
  try {
    own.rebuild({{{q}, {}, {}}});
    FAIL("OwnSGD was rebuilt");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("OwnSGD") != std::string::npos);
  }
  struct Plain : optim::Optimizer {
    explicit Plain(std::vector<Tensor> ps)
        : Optimizer("Plain", {optim::ParamGroup{std::move(ps), {}, {}}}, 0.1, 0.0) {}
    void step() override {}
    std::vector<std::string> slot_names() const override { return {}; }
  };
  Plain plain({p});
  CHECK_THROWS_WITH_AS(plain.rebuild({{{q}, {}, {}}}), doctest::Contains("Plain"), ValueError);
}

TEST_CASE("zero_grad and parameters without gradients") {
  Tensor a = param(), b = param();
  optim::AdamW opt({a, b});
  loss_of(a).backward();
  const std::vector<double> b0 = b.tolist();
  opt.step();
  CHECK(b.tolist() == b0);  // no gradient: untouched, no state
  CHECK(opt.step_count(0) == 1);
  CHECK(opt.step_count(1) == 0);
  CHECK_FALSE(opt.state(1, "exp_avg").defined());
  opt.zero_grad(false);
  CHECK(a.grad().defined());
  CHECK(a.grad().tolist() == std::vector<double>(5, 0.0));
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_THROWS_AS(opt.state(0, "momentum_buffer"), ValueError);
}

TEST_CASE("optimizer state_dict round trip resumes exactly, also through safetensors") {
  for (int kind = 0; kind < 2; ++kind) {
    INFO("kind " << kind);
    auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
      if (kind == 0)
        return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions(0.05));
      return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions(0.05).momentum(0.9));
    };
    Tensor p = param(), q = param();
    auto opt = make({p, q});
    train(*opt, p, 2);  // q never gets a gradient: no state for it
    opt->set_lr(0, 0.02);
    io::TensorDict sd = opt->state_dict();
    CHECK(sd.at("state.0.step").item<int64_t>() == 2);
    CHECK_FALSE(sd.count("state.1.step"));
    CHECK(sd.at("param_groups.0.lr").item() == doctest::Approx(0.02));
    CHECK(sd.at("param_groups.0.params").tolist() == std::vector<double>{0, 1});
    CHECK(sd.count(kind == 0 ? "state.0.exp_avg_sq" : "state.0.momentum_buffer"));

    // Save + load through a file, into a fresh optimizer over copies of the parameters.
    const std::string path = "/tmp/accel_optim_state_" + std::to_string(kind) + ".safetensors";
    io::save_safetensors(path, sd);
    Tensor p2 = p.detach().clone().requires_grad_(), q2 = q.detach().clone().requires_grad_();
    auto opt2 = make({p2, q2});
    opt2->load_state_dict(io::load_safetensors(path));
    std::remove(path.c_str());
    CHECK(opt2->lr(0) == doctest::Approx(0.02));
    train(*opt, p, 2);
    train(*opt2, p2, 2);
    CHECK(equal(p, p2));
    CHECK(opt2->step_count(0) == 4);

    // Mismatches are refused with a list of problems.
    Tensor r = param();
    auto small = make({r});
    std::string msg = error_of([&] { small->load_state_dict(sd); });
    CHECK(msg.find("load_state_dict") != std::string::npos);
    CHECK(msg.find("params does not match") != std::string::npos);
    io::TensorDict bad = sd;
    bad["state.0." + std::string(kind == 0 ? "exp_avg" : "momentum_buffer")] = zeros({3});
    bad["bogus"] = zeros({1});
    auto opt3 = make({param(), param()});
    msg = error_of([&] { opt3->load_state_dict(bad); });
    CHECK(msg.find("checkpoint (3,), parameter (5,)") != std::string::npos);
    CHECK(msg.find("unexpected key bogus") != std::string::npos);
    CHECK(opt3->step_count(0) == 0);  // nothing applied
  }
}

TEST_CASE("LR schedulers produce PyTorch's values") {
  auto run = [](auto make, int n) {
    Tensor p = param();
    optim::SGD opt({p}, {.lr = 1.0});
    auto sched = make(opt);
    std::vector<double> lrs;
    for (int i = 0; i < n; ++i) {
      lrs.push_back(sched->get_last_lr()[0]);
      CHECK(opt.lr(0) == lrs.back());
      opt.step();
      sched->step();
    }
    return lrs;
  };
  auto approx = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("epoch " << i);
      CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-9));
    }
  };
  using std::make_unique;
  approx(run([](auto& o) { return make_unique<optim::StepLR>(o, 2, 0.5); }, 5),
         {1, 1, 0.5, 0.5, 0.25});
  approx(run(
             [](auto& o) {
               return make_unique<optim::MultiStepLR>(o, std::vector<int64_t>{4, 2}, 0.1);
             },
             6),
         {1, 1, 0.1, 0.1, 0.01, 0.01});
  approx(run([](auto& o) { return make_unique<optim::ExponentialLR>(o, 0.5); }, 4),
         {1, 0.5, 0.25, 0.125});
  approx(run([](auto& o) { return make_unique<optim::ConstantLR>(o, 0.5, 2); }, 4),
         {0.5, 0.5, 1, 1});
  approx(run([](auto& o) { return make_unique<optim::ConstantLR>(o, 1.0, 2); }, 3), {1, 1, 1});
  approx(run([](auto& o) { return make_unique<optim::LinearLR>(o, 0.25, 1.0, 3); }, 5),
         {0.25, 0.5, 0.75, 1, 1});
  approx(run(
             [](auto& o) {
               return make_unique<optim::LambdaLR>(o,
                                                   [](int64_t e) { return 1.0 / double(e + 1); });
             },
             3),
         {1, 0.5, 1.0 / 3});
  approx(run([](auto& o) { return make_unique<optim::CosineAnnealingLR>(o, 4, 0.0); }, 7),
         {1, 0.853553390593, 0.5, 0.146446609407, 0, 0.146446609407, 0.5});
  approx(run([](auto& o) { return make_unique<optim::CosineAnnealingLR>(o, 2, 0.1); }, 3),
         {1, 0.55, 0.1});
  approx(run([](auto& o) { return make_unique<optim::WarmupDecayLR>(o, 2, 6); }, 8),
         {0, 0.5, 1, 0.853553390593, 0.5, 0.146446609407, 0, 0});
  approx(
      run([](auto& o) { return make_unique<optim::WarmupDecayLR>(o, 2, 6, optim::Decay::Linear); },
          8),
      {0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0});
  approx(run(
             [](auto& o) {
               return make_unique<optim::WarmupDecayLR>(o, 0, 2, optim::Decay::Cosine, 0.1);
             },
             4),
         {1, 0.55, 0.1, 0.1});
  // OneCycleLR(max_lr=1, total_steps=10): PyTorch's phases, cosine and three-phase linear.
  approx(run([](auto& o) { return make_unique<optim::OneCycleLR>(o, 1.0, 10); }, 10),
         {0.04, 0.52, 1, 0.950484632013, 0.81174565395, 0.611262021936, 0.388741978064,
          0.18825834605, 0.0495193679865, 4e-06});
  approx(run(
             [](auto& o) {
               return make_unique<optim::OneCycleLR>(
                   o, 1.0, 10,
                   optim::OneCycleOptions{.anneal = optim::Anneal::Linear, .three_phase = true});
             },
             10),
         {0.04, 0.52, 1, 0.52, 0.04, 0.0320008, 0.0240016, 0.0160024, 0.0080032, 4e-06});
  // Past total_steps: an error, as in PyTorch.
  Tensor p = param();
  optim::SGD opt({p}, {.lr = 1.0});
  optim::OneCycleLR oc(opt, 1.0, 2);
  oc.step();
  oc.step();
  CHECK_THROWS_AS(oc.step(), ValueError);
  CHECK_THROWS_AS(optim::StepLR(opt, 0), ValueError);
}

TEST_CASE("schedulers apply per group and resume from state_dict") {
  Tensor a = param(), b = param();
  optim::SGD opt(std::vector<optim::ParamGroup>{{{a}, 1.0, {}}, {{b}, 0.1, {}}});
  optim::StepLR s(opt, 1, 0.5);
  s.step();
  s.step();
  CHECK(s.get_last_lr() == std::vector<double>{0.25, 0.025});
  CHECK(opt.lr(1) == doctest::Approx(0.025));
  io::TensorDict sd = s.state_dict();
  CHECK(sd.at("last_epoch").item<int64_t>() == 2);

  Tensor c = param(), d = param();
  optim::SGD opt2(std::vector<optim::ParamGroup>{{{c}, 1.0, {}}, {{d}, 0.1, {}}});
  optim::StepLR s2(opt2, 1, 0.5);
  s2.load_state_dict(sd);
  CHECK(opt2.lr(0) == doctest::Approx(0.25));
  s.step();
  s2.step();
  CHECK(s2.get_last_lr() == s.get_last_lr());
  CHECK(s2.last_epoch() == 3);
  sd["extra"] = zeros({});
  CHECK_THROWS_AS(s2.load_state_dict(sd), ValueError);
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_") {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({1}).requires_grad_(),
         c = zeros({3}).requires_grad_();
  auto set = [&] {
    a.set_grad(tensor({3.f, -4.f}));
    b.set_grad(tensor({12.f}));
  };
  set();
  // ||(3, -4, 12)|| = 13; c has no gradient and is skipped.
  double n = nn::clip_grad_norm_({a, b, c}, 6.5);
  CHECK(n == doctest::Approx(13.0));
  const double coef = 6.5 / (13.0 + 1e-6);
  CHECK(a.grad().tolist()[0] == doctest::Approx(3 * coef));
  CHECK(b.grad().tolist()[0] == doctest::Approx(12 * coef));
  CHECK(nn::clip_grad_norm_({a, b}, 100.0) == doctest::Approx(6.5).epsilon(1e-6));
  CHECK(b.grad().tolist()[0] == doctest::Approx(12 * coef));  // below max: untouched
  set();
  CHECK(nn::clip_grad_norm_({a, b}, 100.0, nn::kInfNorm) == doctest::Approx(12.0));
  CHECK(nn::clip_grad_norm_({a, b}, 100.0, 1.0) == doctest::Approx(19.0));
  CHECK(nn::clip_grad_norm_({a, b}, 1.0, 1.0) == doctest::Approx(19.0));
  CHECK(a.grad().tolist()[1] == doctest::Approx(-4.0 / (19.0 + 1e-6)));
  set();
  nn::clip_grad_value_({a, b, c}, 3.5);
  CHECK(a.grad().tolist() == std::vector<double>{3, -3.5});
  CHECK(b.grad().tolist() == std::vector<double>{3.5});
  // Non-finite norms.
  a.set_grad(tensor({INFINITY, 1.f}));
  CHECK_THROWS_AS(nn::clip_grad_norm_({a}, 1.0, 2.0, true), ValueError);
  CHECK(std::isinf(nn::clip_grad_norm_({a}, 1.0)));
  CHECK(nn::clip_grad_norm_({c}, 1.0) == 0.0);
  CHECK_THROWS_AS(nn::clip_grad_norm_({a}, -1.0), ValueError);
}

TEST_CASE("end to end: an MLP learns XOR with AdamW + cosine schedule + clipping") {
  manual_seed(42);
  auto mlp = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(2, 16),
                                              std::make_shared<nn::Tanh>(),
                                              std::make_shared<nn::Linear>(16, 1));
  Tensor x = tensor({0.f, 0.f, 0.f, 1.f, 1.f, 0.f, 1.f, 1.f}).view({4, 2});
  Tensor y = tensor({0.f, 1.f, 1.f, 0.f}).view({4, 1});
  optim::AdamW opt(mlp->parameters(), {.lr = 0.05, .weight_decay = 0.0});
  optim::CosineAnnealingLR sched(opt, 400, 1e-3);
  nn::BCEWithLogitsLoss criterion;
  double first = 0, last = 0;
  for (int step = 0; step < 400; ++step) {
    opt.zero_grad();
    Tensor loss = criterion(mlp->forward(x), y);
    loss.backward();
    nn::clip_grad_norm_(mlp->parameters(), 1.0);
    opt.step();
    sched.step();
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(first > 0.5);
  CHECK(last < 0.05);
  Tensor pred = gt(mlp->forward(x), 0.0);
  CHECK(pred.tolist() == std::vector<double>{0, 1, 1, 0});
}
