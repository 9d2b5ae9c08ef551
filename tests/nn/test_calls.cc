// Modules with any inputs and outputs (Note [module calls] in nn/module.h): typed
// forwards through TypedModule, the type-erased call, hooks, containers, call wrappers and entry
// wrappers, error messages; and the module / optimizer habits (chaining, apply, step(closure),
// GradScaler's PyTorch spelling).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "accel.h"
#include "tests/common/check.h"

using namespace accel;
using accel::test::error_of;

namespace {

bool same(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && allclose(a, b, 0, 0);
}

// Two inputs, a tuple of two outputs (a siamese pair): y1 = a W, y2 = b W + a.
struct Pair : nn::TypedModule<Pair> {
  std::shared_ptr<nn::Linear> fc = register_module("fc", std::make_shared<nn::Linear>(3, 3));
  int calls = 0;
  std::tuple<Tensor, Tensor> forward(const Tensor& a, const Tensor& b) {
    ++calls;
    return {fc->forward(a), fc->forward(b) + a};
  }
};

// An optional input, plain arguments with defaults, a struct result.
struct VaeOut {
  Tensor recon, mu, logvar;
};
struct Vae : nn::TypedModule<Vae> {
  std::shared_ptr<nn::Linear> enc = register_module("enc", std::make_shared<nn::Linear>(4, 4));
  std::shared_ptr<nn::Linear> dec = register_module("dec", std::make_shared<nn::Linear>(2, 4));
  VaeOut forward(const Tensor& x, std::optional<Tensor> cond = std::nullopt, bool sample = false,
                 double scale = 1.0) {
    Tensor h = enc->forward(cond ? x + *cond : x);
    auto parts = h.chunk(2, 1);
    Tensor z = parts[0] * scale;
    if (sample) z = z + 1.0;
    return {dec->forward(z), parts[0], parts[1]};
  }
};

// One input by value, a struct result with an optional and a nested tuple, through fields().
class Heads {
 public:
  Tensor logits;
  std::optional<Tensor> loss;
  std::tuple<Tensor, Tensor> extra;
  Heads() = default;
  Heads(Tensor l, std::optional<Tensor> s, std::tuple<Tensor, Tensor> e)
      : logits(std::move(l)), loss(std::move(s)), extra(std::move(e)) {}
  auto fields() { return std::tie(logits, loss, extra); }
};
struct HeadNet : nn::TypedModule<HeadNet> {
  Heads forward(Tensor x, std::optional<Tensor> target = std::nullopt) {
    std::optional<Tensor> loss;
    if (target) loss = mse_loss(x, *target);
    return Heads(x * 2.0, loss, {x + 1.0, x - 1.0});
  }
};

// Variable number of results.
struct Splitter : nn::TypedModule<Splitter> {
  int64_t parts;
  explicit Splitter(int64_t p) : parts(p) {}
  std::vector<Tensor> forward(const Tensor& x) const {
    std::vector<Tensor> out;
    for (int64_t i = 0; i < parts; ++i) out.push_back(x * double(i + 1));
    return out;
  }
};

// Sequential chain pieces: one tensor -> two, two -> one.
struct Fork : nn::TypedModule<Fork> {
  std::tuple<Tensor, Tensor> forward(Tensor x) { return {x + 1.0, x * 3.0}; }
};
struct Join : nn::TypedModule<Join> {
  Tensor forward(const Tensor& a, const Tensor& b) { return a * b; }
};
// One tensor plus an optional: usable wherever a one-tensor module is.
struct Shift : nn::TypedModule<Shift> {
  Tensor forward(const Tensor& x, std::optional<Tensor> by = std::nullopt) {
    return by ? x + *by : x + 10.0;
  }
};

struct Scale : nn::Module {
  double k;
  explicit Scale(double s) : k(s) {}
  Tensor forward(const Tensor& x) override { return x * k; }
};

Tensor rnd(int64_t rows, int64_t cols, uint64_t seed) {
  Generator g(seed);
  return randn({rows, cols}, {}, &g);
}

}  // namespace

TEST_CASE("typed forward: two inputs, tuple output, through operator(), forward and call<R>") {
  auto m = std::make_shared<Pair>();
  Tensor a = rnd(2, 3, 1), b = rnd(2, 3, 2);
  auto [y1, y2] = m->forward(a, b);
  auto [z1, z2] = (*m)(a, b);
  CHECK(same(y1, z1));
  CHECK(same(y2, z2));
  // Through a Module pointer (a ModuleList entry): the caller names the result type.
  std::shared_ptr<nn::Module> base = m;
  auto [w1, w2] = base->call<std::tuple<Tensor, Tensor>>(a, b);
  CHECK(same(y1, w1));
  CHECK(same(y2, w2));
  auto [p1, p2] = base->call<std::pair<Tensor, Tensor>>(a, b);
  CHECK(same(y2, p2));
  std::vector<Tensor> all = base->call<std::vector<Tensor>>(a, b);
  REQUIRE(all.size() == 2);
  CHECK(same(all[1], y2));
  CHECK(base->forward_signature() == "forward(Tensor, Tensor) -> tuple<Tensor, Tensor>");
  CHECK(m->calls == 5);
  // Gradients flow through every path alike.
  Tensor x = a.detach().requires_grad_(true);
  auto [g1, g2] = base->call<std::tuple<Tensor, Tensor>>(x, b);
  (g1.sum() + g2.sum()).backward();
  CHECK(allclose(x.grad(), m->fc->weight.sum({0}).expand({2, 3}) + 1.0, 1e-6, 1e-6));
}

TEST_CASE("typed forward: optional input, plain arguments, struct output") {
  auto vae = std::make_shared<Vae>();
  Tensor x = rnd(3, 4, 3), c = rnd(3, 4, 4);
  VaeOut plain = vae->forward(x);
  VaeOut viaop = (*vae)(x);  // default arguments hold for operator()
  CHECK(same(plain.recon, viaop.recon));
  CHECK(same(plain.logvar, viaop.logvar));
  VaeOut cond = (*vae)(x, c, true, 0.5);
  CHECK(same(cond.recon, vae->forward(x, c, true, 0.5).recon));
  CHECK(!same(cond.recon, plain.recon));
  // Type-erased: trailing optional<Tensor> may be left out; bool / int / double travel.
  std::shared_ptr<nn::Module> base = vae;
  CHECK(same(base->call<VaeOut>(x, c, false, 1.0).recon, vae->forward(x, c).recon));
  CHECK(same(base->call<VaeOut>(x, std::nullopt, true, 2).recon,  // an int where a double goes
             vae->forward(x, std::nullopt, true, 2.0).recon));
  CHECK(same(base->call<VaeOut>(x, Tensor(), false, 1.0).mu, plain.mu));  // None
  CHECK(base->forward_signature() == "forward(Tensor, optional<Tensor>, bool, double) -> VaeOut");
  // The erased call leaves out what has defaults: forward's own defaults (sample = false,
  // scale = 1.0) apply, as on the typed path. The one-tensor virtual then finds three results.
  CHECK(same(base->call<VaeOut>(x, c).recon, vae->forward(x, c).recon));
  CHECK(error_of([&] { base->forward(x); }).find("returned 3 tensor(s)") != std::string::npos);
}

TEST_CASE("struct results through fields(), optional fields, nested tuples, vectors") {
  auto net = std::make_shared<HeadNet>();
  Tensor x = rnd(2, 2, 5), t = rnd(2, 2, 6);
  std::shared_ptr<nn::Module> base = net;
  Heads h = base->call<Heads>(x);
  CHECK(!h.loss.has_value());
  CHECK(same(std::get<1>(h.extra), x - 1.0));
  Heads h2 = base->call<Heads>(x, t);
  REQUIRE(h2.loss.has_value());
  CHECK(same(*h2.loss, mse_loss(x, t)));
  // The one-tensor virtual of a module returning a struct.
  CHECK(error_of([&] {
          base->forward(x);
        }).find("HeadNet.forward(Tensor, optional<Tensor>) -> Heads returned 4 tensor(s)") !=
        std::string::npos);
  // The flattened form: logits, loss (undefined), extra.0, extra.1.
  std::vector<Tensor> flat = base->call_values({nn::Value::from_tensor(x)});
  REQUIRE(flat.size() == 4);
  CHECK(!flat[1].defined());
  auto sp = std::make_shared<Splitter>(3);
  std::vector<Tensor> parts = (*sp)(x);
  CHECK(parts.size() == 3);
  CHECK(same(std::static_pointer_cast<nn::Module>(sp)->call<std::vector<Tensor>>(x)[2], x * 3.0));
}

TEST_CASE("type-erased calls name the module type and signature on wrong arity, types, results") {
  auto vae = std::make_shared<Vae>();
  std::shared_ptr<nn::Module> base = vae;
  Tensor x = rnd(1, 4, 7);
  std::string e = error_of([&] { base->call<VaeOut>(x, x, true, 1.0, x); });
  CHECK(e.find("Vae.forward(Tensor, optional<Tensor>, bool, double) -> VaeOut") !=
        std::string::npos);
  CHECK(e.find("(Tensor, Tensor, bool, double, Tensor)") != std::string::npos);
  // Parameters with defaults may be left out on the erased path (forward's own defaults).
  CHECK(same(base->call<VaeOut>(x).mu, vae->forward(x).mu));
  e = error_of([&] { base->call<VaeOut>(x, x, 3, 1.0); });  // int where a bool goes
  CHECK(e.find("(Tensor, Tensor, int64, double)") != std::string::npos);
  e = error_of([&] { base->call<VaeOut>(true, x, false, 1.0); });
  CHECK(e.find("Vae.forward") != std::string::npos);
  // A result type of another size.
  e = error_of([&] { base->call<std::tuple<Tensor, Tensor>>(x, x, false, 1.0); });
  CHECK(e.find("Vae.forward") != std::string::npos);
  CHECK(e.find("returned 3 tensor(s); the result type tuple<Tensor, Tensor> holds 2") !=
        std::string::npos);
  // A one-tensor module called with two.
  auto lin = std::make_shared<nn::Linear>(4, 4);
  e = error_of([&] { lin->call(x, x); });
  CHECK(e.find("Linear.forward(Tensor) -> Tensor: called with (Tensor, Tensor)") !=
        std::string::npos);
}

TEST_CASE("forward pre-hooks and forward hooks see and replace the flattened tensors") {
  auto vae = std::make_shared<Vae>();
  Tensor x = rnd(2, 4, 8), c = rnd(2, 4, 9);
  std::vector<std::vector<bool>> seen_defined;
  std::vector<size_t> seen_outputs;
  auto pre = vae->register_forward_pre_hook([&](nn::Module& m, std::vector<Tensor>& in) {
    CHECK(&m == vae.get());
    std::vector<bool> d;
    for (auto& t : in) d.push_back(t.defined());
    seen_defined.push_back(d);  // tensors only: the bool and the double are not shown
  });
  auto post = vae->register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        seen_outputs.push_back(out.size());
        CHECK(in.size() == seen_defined.back().size());  // the arguments after the pre-hooks
      });
  VaeOut direct = vae->forward(x);  // forward() runs no hooks
  CHECK(seen_defined.empty());
  // As PyTorch's hooks see the positional arguments given, operator() shows what it was given.
  VaeOut a = (*vae)(x);
  VaeOut b = (*vae)(x, c, false, 1.0);
  std::shared_ptr<nn::Module> base = vae;
  (void)base->call<VaeOut>(x, std::nullopt, false, 1.0);
  REQUIRE(seen_defined.size() == 3);
  CHECK(seen_defined[0] == std::vector<bool>{true});
  CHECK(seen_defined[1] == std::vector<bool>{true, true});
  CHECK(seen_defined[2] == std::vector<bool>{true, false});
  CHECK(seen_outputs == std::vector<size_t>{3, 3, 3});
  CHECK(same(a.recon, direct.recon));
  CHECK(same(b.recon, vae->forward(x, c).recon));
  pre.remove();
  post.remove();
  pre.remove();  // twice: a no-op
  const size_t n = seen_outputs.size();
  (void)(*vae)(x);
  CHECK(seen_outputs.size() == n);

  // Replacing: a pre-hook fills the None with a tensor; a forward hook replaces mu.
  auto fill = vae->register_forward_pre_hook([&](nn::Module&, std::vector<Tensor>& in) {
    if (!in[1].defined()) in[1] = c;
  });
  auto swap =
      vae->register_forward_hook([&](nn::Module&, const std::vector<Tensor>&,
                                     std::vector<Tensor>& out) { out[1] = zeros_like(out[1]); });
  VaeOut r = (*vae)(x, std::nullopt);
  CHECK(same(r.recon, vae->forward(x, c).recon));
  CHECK(r.mu.abs().sum().item<double>() == 0);
  fill.remove();
  swap.remove();
  // Changing how many tensors there are is refused.
  auto bad = vae->register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) { out.pop_back(); });
  CHECK(error_of([&] { (void)(*vae)(x); }).find("changed the number of result tensors") !=
        std::string::npos);
  bad.remove();
  auto bad2 = vae->register_forward_pre_hook(
      [&](nn::Module&, std::vector<Tensor>& in) { in.push_back(x); });
  CHECK(error_of([&] { (void)(*vae)(x); }).find("changed the number of tensor arguments") !=
        std::string::npos);
  bad2.remove();
}

TEST_CASE("hooks on one-tensor modules: operator() and Sequential run them, forward() does not") {
  auto lin = std::make_shared<nn::Linear>(3, 3);
  int calls = 0;
  auto h = lin->register_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
        ++calls;
        CHECK(in.size() == 1);
        out[0] = out[0] * 0.0;
      });
  Tensor x = rnd(2, 3, 10);
  CHECK(lin->forward(x).abs().sum().item<double>() > 0);
  CHECK((*lin)(x).abs().sum().item<double>() == 0);
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<Scale>(2.0), lin);
  CHECK(seq->forward(x).abs().sum().item<double>() == 0);
  CHECK(calls == 2);
  h.remove();
  CHECK(same((*lin)(x), lin->forward(x)));
}

TEST_CASE("Sequential chains multi-output entries into multi-input ones") {
  Tensor x = rnd(2, 2, 11);
  // x -> (x+1, 3x) -> (x+1)*3x -> *2
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<Fork>(), std::make_shared<Join>(),
                                              std::make_shared<Scale>(2.0));
  CHECK(same(seq->forward(x), (x + 1.0) * (x * 3.0) * 2.0));
  CHECK(same((*seq)(x), seq->forward(x)));
  CHECK(seq->forward_signature() == "forward(Tensor) -> Tensor");
  // Two in, two out: Join then Fork.
  auto seq2 = std::make_shared<nn::Sequential>(std::make_shared<Join>(), std::make_shared<Fork>());
  auto [u, v] = seq2->call<std::tuple<Tensor, Tensor>>(x, x);
  CHECK(same(u, x * x + 1.0));
  CHECK(same(v, x * x * 3.0));
  // forward(x) needs one tensor at the end.
  auto seq3 =
      std::make_shared<nn::Sequential>(std::make_shared<Scale>(1.0), std::make_shared<Fork>());
  CHECK(error_of([&] { seq3->forward(x); }).find("the last entry (Fork) gave 2") !=
        std::string::npos);
  // A typed module with a trailing optional fits a one-tensor chain.
  auto seq4 =
      std::make_shared<nn::Sequential>(std::make_shared<Shift>(), std::make_shared<Scale>(2.0));
  CHECK(same(seq4->forward(x), (x + 10.0) * 2.0));
  // An empty Sequential is the identity for any number of tensors.
  auto empty = std::make_shared<nn::Sequential>();
  auto [p, q] = empty->call<std::tuple<Tensor, Tensor>>(x, x * 2.0);
  CHECK(same(q, x * 2.0));
}

TEST_CASE("call wrappers and entry wrappers route every call path of a wrapped entry") {
  auto list = std::make_shared<nn::ModuleList>();
  list->push_back(std::make_shared<Pair>());
  list->push_back(std::make_shared<Scale>(3.0));
  auto pair = list->at<Pair>(0);
  int wrapped = 0;
  std::vector<size_t> arity;
  auto wrapper = [&](nn::Module&, nn::Values& in, const nn::CallFn& call) {
    ++wrapped;
    arity.push_back(in.size());
    return call(in);
  };
  pair->set_call_wrapper(wrapper);
  list->at<Scale>(1)->set_call_wrapper(wrapper);
  CHECK(error_of([&] { pair->set_call_wrapper(wrapper); }).find("already has a call wrapper") !=
        std::string::npos);
  list->wrap(0);
  list->wrap(1);
  Tensor a = rnd(1, 3, 12), b = rnd(1, 3, 13);
  // Typed operator() of the original module, the entry's call<R>, the entry's direct forward.
  (void)(*pair)(a, b);
  (void)(*list)[0]->call<std::tuple<Tensor, Tensor>>(a, b);
  (void)(*list)[1]->forward(a);
  CHECK(wrapped == 3);
  CHECK(arity == std::vector<size_t>{2, 2, 1});
  // Only a direct forward() of the original bypasses it (as module.forward() in PyTorch).
  (void)pair->forward(a, b);
  CHECK(wrapped == 3);
  CHECK(list->at<Pair>(0).get() == pair.get());
  list->unwrap(0);
  list->unwrap(1);
  pair->set_call_wrapper({});
  (void)(*pair)(a, b);
  CHECK(wrapped == 3);
}

TEST_CASE("train / eval / to chain and return the module; apply visits children first") {
  auto seq = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(2, 2),
                                              std::make_shared<nn::Dropout>(0.5));
  nn::Module& m = seq->eval().to(kFloat64).to(kCPU);
  CHECK(&m == seq.get());
  CHECK(!seq->is_training());
  CHECK(seq->at<nn::Linear>(0)->weight.dtype() == kFloat64);
  CHECK(seq->train().is_training());
  seq->eval();  // void-style callers still compile
  CHECK(!(*seq)[1]->is_training());
  std::vector<std::string> order;
  nn::Module& r = seq->apply([&](nn::Module& mod) { order.push_back(mod.type_name()); });
  CHECK(&r == seq.get());
  CHECK(order == std::vector<std::string>{"Linear", "Dropout", "Sequential"});
  // The usual use: initialise every Linear.
  seq->apply([](nn::Module& mod) {
    if (auto* l = dynamic_cast<nn::Linear*>(&mod)) {
      NoGradGuard ng;
      l->weight.fill_(0.25);
    }
  });
  CHECK(seq->at<nn::Linear>(0)->weight.sum().item<double>() == 1.0);
}

TEST_CASE("Optimizer::step(closure) evaluates the closure with grad on, returns its loss") {
  auto run = [](auto make) {
    Generator g(3);
    auto lin = std::make_shared<nn::Linear>(3, 1, true, &g);
    auto ref = std::make_shared<nn::Linear>(3, 1, true, &g);
    ref->load_state_dict(lin->state_dict());
    Tensor x = rnd(4, 3, 14), y = rnd(4, 1, 15);
    auto opt = make(lin->parameters());
    auto opt_ref = make(ref->parameters());
    for (int step = 0; step < 3; ++step) {
      Tensor loss;
      {
        NoGradGuard ng;  // step(closure) turns grad mode on for the closure
        loss = opt->step([&] {
          opt->zero_grad();
          Tensor l = mse_loss(lin->forward(x), y);
          l.backward();
          return l;
        });
      }
      opt_ref->zero_grad();
      Tensor l = mse_loss(ref->forward(x), y);
      l.backward();
      opt_ref->step();
      CHECK(loss.item<double>() == l.item<double>());
    }
    CHECK(same(lin->weight, ref->weight));
  };
  run([](std::vector<Tensor> p) {
    return std::make_shared<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9));
  });
  run([](std::vector<Tensor> p) { return std::make_shared<optim::Adam>(p); });
  run([](std::vector<Tensor> p) { return std::make_shared<optim::AdamW>(p); });
  // Through the base class too.
  run([](std::vector<Tensor> p) -> std::shared_ptr<optim::Optimizer> {
    return std::make_shared<optim::SGD>(p);
  });
}

TEST_CASE("GradScaler: scale(loss), unscale_(opt), step(opt) skipping inf, update()") {
  dist::GradScalerOptions so;
  so.init_scale = 8.0;
  so.growth_interval = 1;
  dist::GradScaler scaler(so);
  Tensor w = ones({2}).requires_grad_(true);
  optim::SGD opt({w}, optim::SGDOptions{0.5});
  Tensor loss = (w * 3.0).sum();
  Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item<double>() == 48.0);
  scaled.backward();
  CHECK(w.grad().sum().item<double>() == 48.0);
  CHECK(scaler.step(opt));  // unscaled to 3 each, stepped
  CHECK(allclose(w, full({2}, -0.5), 0, 0));
  scaler.update();
  CHECK(scaler.get_scale() == 16.0);  // grew (interval 1)
  // An inf gradient: the step is skipped, the scale backs off.
  opt.zero_grad();
  (scaler.scale(w.sum()) * std::numeric_limits<double>::infinity()).backward();
  CHECK(!scaler.step(opt));
  CHECK(allclose(w, full({2}, -0.5), 0, 0));
  scaler.update();
  CHECK(scaler.get_scale() == 8.0);
  // unscale_ before clipping, then step does not unscale again; two optimizers, one skipping.
  Tensor v = ones({1}).requires_grad_(true);
  optim::SGD opt2({v}, optim::SGDOptions{1.0});
  opt.zero_grad();
  scaler.scale((w * 2.0).sum() + (v * std::numeric_limits<double>::quiet_NaN()).sum()).backward();
  scaler.unscale_(opt);
  CHECK(w.grad().sum().item<double>() == 4.0);
  CHECK(scaler.step(opt));  // its gradients are finite
  CHECK(w.grad().sum().item<double>() == 4.0);
  CHECK(!scaler.step(opt2));  // NaN
  CHECK(v.item<double>() == 1.0);
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);  // any inf backs off
  // Disabled: step is the optimizer's step.
  dist::GradScalerOptions off;
  off.enabled = false;
  dist::GradScaler none(off);
  CHECK(same(none.scale(loss), loss));
  opt.zero_grad();
  (w * 1.0).sum().backward();
  CHECK(none.step(opt));
}
