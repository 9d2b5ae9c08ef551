// torch's names and defaults (issue 36, item 4): nn::utils::clip_grad_norm_, options structs in
// libtorch's builder spelling and as designated initializers, AdamOptions betas, Embedding's
// padding_idx / max_norm, nll_loss class weights, inplace activations, convolution and pooling
// options (padding_mode), losses broadcasting a target with torch's warning, dropout2d on 3-D
// input, and a 0-dim buffer loaded from shape (1,). Values and gradients against PyTorch in
// float64 come from tests/nn/spellings_fixture.safetensors, written by make_spellings_fixture.py
// with python3-torch (no Python at test time).
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "accel.h"
#include "tests/common/check.h"
#include "tests/common/util.h"
#include "tests/common/tensors.h"

using namespace accel;
using accel::test::close_to;
using accel::test::contains;
using accel::test::error_of;
using accel::test::leaf;

namespace {

const io::TensorDict& fixture() {
  static const io::TensorDict t = io::load_safetensors(std::string(ACCEL_SOURCE_ROOT) +
                                                       "/tests/nn/spellings_fixture.safetensors");
  return t;
}

Tensor fx(const std::string& k) {
  auto it = fixture().find(k);
  REQUIRE_MESSAGE(it != fixture().end(), "fixture lacks ", k);
  return it->second.clone();
}

// Backward of sum(out * name.g); checks out against name.out.
void backward_checked(const std::string& name, const Tensor& out, double tol = 1e-12) {
  CHECK_MESSAGE(close_to(out, fx(name + ".out"), tol), name, ": output differs from PyTorch");
  sum(mul(out, fx(name + ".g"))).backward();
}

void check_grad(const std::string& name, const std::string& what, const Tensor& leaf_t,
                double tol = 1e-12) {
  CHECK_MESSAGE(close_to(leaf_t.grad(), fx(name + ".grad." + what), tol), name, ": gradient of ",
                what, " differs from PyTorch");
}

// Collects warnings for the scope (Note [warnings] in core/warning.h).
struct WarningCapture {
  std::vector<std::string> lines;
  WarningHandler prev;
  WarningCapture() {
    reset_warnings_shown();
    prev = set_warning_handler([this](const std::string& l) { lines.push_back(l); });
  }
  ~WarningCapture() { set_warning_handler(prev); }
};

Tensor param(const Shape& s) {
  Tensor p = randn(s, TensorOptions(kFloat64));
  p.requires_grad_();
  return p;
}

}  // namespace

// ---------------- 1. nn::utils ----------------

TEST_CASE("clip_grad_norm_ / clip_grad_value_ are nn::utils::, and nn:: names the same functions") {
  // One implementation: the nn:: names are using-declarations of nn::utils::.
  double (*a)(const std::vector<Tensor>&, double, double, bool) = &nn::utils::clip_grad_norm_;
  double (*b)(const std::vector<Tensor>&, double, double, bool) = &nn::clip_grad_norm_;
  CHECK((a == b));
  void (*c)(const std::vector<Tensor>&, double) = &nn::utils::clip_grad_value_;
  void (*d)(const std::vector<Tensor>&, double) = &nn::clip_grad_value_;
  CHECK((c == d));

  Tensor p = param({3});
  sum(mul(p, tensor(std::vector<double>{3.0, 4.0, 0.0}, {3}))).backward();
  CHECK(nn::utils::clip_grad_norm_({p}, 1.0) == doctest::Approx(5.0));
  CHECK(norm(p.grad()).item() == doctest::Approx(1.0).epsilon(1e-5));
  nn::utils::clip_grad_value_({p}, 0.1);
  CHECK(amax(abs(p.grad())).item() <= 0.1 + 1e-15);
}

TEST_CASE("parameters_to_vector / vector_to_parameters: round trip, in place, errors") {
  Tensor a = param({2, 3}), b = param({4});
  Tensor v = nn::utils::parameters_to_vector({a, b});
  CHECK(v.sizes() == Shape{10});
  CHECK(equal(v.narrow(0, 0, 6).reshape({2, 3}), a.detach()));
  CHECK(equal(v.narrow(0, 6, 4), b.detach()));
  // Differentiable, as torch's.
  sum(mul(v, v)).backward();
  CHECK(close_to(a.grad(), mul(a.detach(), 2.0), 1e-12));

  const Tensor a_before = a;
  nn::utils::vector_to_parameters(arange(10, TensorOptions(kFloat64)), {a, b});
  CHECK(a.is_same(a_before));  // written into, not rebound
  CHECK(a.requires_grad());
  CHECK(equal(b, tensor(std::vector<double>{6, 7, 8, 9}, {4})));

  CHECK(contains(error_of<ShapeError>([&] {
                   nn::utils::vector_to_parameters(zeros({9}), {a, b});
                 }),
                 "[vector_to_parameters] the vector has 9 elements but the 2 parameters hold 10"));
  CHECK(contains(error_of<DTypeError>([&] {
                   nn::utils::parameters_to_vector({a, zeros({2}, TensorOptions(kFloat32))});
                 }),
                 "[parameters_to_vector] parameter 1 has dtype"));
}

// ---------------- 2. options structs ----------------

TEST_CASE("optimizer options: libtorch's builder and designated initializers, one trajectory") {
  auto run = [](auto make) {
    manual_seed(7);
    Tensor w = param({4});
    auto opt = make(std::vector<Tensor>{w});
    for (int i = 0; i < 3; ++i) {
      opt.zero_grad();
      sum(mul(mul(w, w), w)).backward();
      opt.step();
    }
    return w.detach();
  };
  // SGD
  Tensor s1 = run([](std::vector<Tensor> p) {
    return optim::SGD(p, optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
  });
  Tensor s2 = run([](std::vector<Tensor> p) {
    return optim::SGD(p, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  });
  CHECK(equal(s1, s2));
  // Adam / AdamW with betas.
  Tensor a1 = run([](std::vector<Tensor> p) {
    return optim::AdamW(p, optim::AdamWOptions(1e-2).betas({0.8, 0.95}).weight_decay(0.1));
  });
  Tensor a2 = run([](std::vector<Tensor> p) {
    return optim::AdamW(p, {.lr = 1e-2, .betas = {0.8, 0.95}, .weight_decay = 0.1});
  });
  Tensor a3 = run([](std::vector<Tensor> p) {
    return optim::AdamW(p, optim::AdamWOptions(1e-2).weight_decay(0.1));  // betas 0.9, 0.999
  });
  CHECK(equal(a1, a2));
  CHECK(!equal(a1, a3));
  Tensor b1 = run([](std::vector<Tensor> p) {
    return optim::Adam(p, optim::AdamOptions(1e-2).betas(std::make_tuple(0.5, 0.9)).eps(1e-6));
  });
  Tensor b2 = run([](std::vector<Tensor> p) {
    return optim::Adam(p, {.lr = 1e-2, .betas = {0.5, 0.9}, .eps = 1e-6});
  });
  CHECK(equal(b1, b2));
  // The other optimizers.
  CHECK(equal(run([](std::vector<Tensor> p) {
                return optim::RMSprop(p, optim::RMSpropOptions(1e-2).momentum(0.5).centered(true));
              }),
              run([](std::vector<Tensor> p) {
                return optim::RMSprop(p, {.lr = 1e-2, .momentum = 0.5, .centered = true});
              })));
  CHECK(equal(
      run([](std::vector<Tensor> p) {
        return optim::Adagrad(p, optim::AdagradOptions(0.1).lr_decay(0.01));
      }),
      run([](std::vector<Tensor> p) { return optim::Adagrad(p, {.lr = 0.1, .lr_decay = 0.01}); })));
  CHECK(equal(
      run([](std::vector<Tensor> p) {
        return optim::Adadelta(p, optim::AdadeltaOptions(0.5).rho(0.8));
      }),
      run([](std::vector<Tensor> p) { return optim::Adadelta(p, {.lr = 0.5, .rho = 0.8}); })));
}

TEST_CASE("optimizer options: read back as libtorch's getters; torch's defaults; errors") {
  Tensor w = param({2});
  optim::Adam adam({w}, optim::AdamOptions(3e-4).betas({0.9, 0.95}));
  CHECK(adam.options().lr() == 3e-4);
  CHECK(std::get<0>(adam.options().betas()) == 0.9);
  CHECK(std::get<1>(adam.options().betas()) == 0.95);
  CHECK(adam.options().eps() == 1e-8);
  CHECK(adam.options().weight_decay() == 0.0);
  optim::AdamW adamw({w});
  CHECK(adamw.options().weight_decay() == 1e-2);  // AdamW's default
  CHECK(std::get<1>(adamw.options().betas()) == 0.999);
  optim::LBFGS lbfgs({w}, optim::LBFGSOptions(0.5).history_size(7).line_search_fn("strong_wolfe"));
  CHECK(lbfgs.options().history_size() == 7);
  CHECK(lbfgs.options().line_search_fn() == "strong_wolfe");
  // Setter and getter on a variable; a getter is a reference (libtorch's `o.lr() = v`).
  optim::SGDOptions o(0.1);
  o.momentum(0.9);
  o.dampening() = 0.1;
  CHECK(o.momentum() == 0.9);
  CHECK(o.dampening() == 0.1);
  // An options object keeps its fields: the aggregate of a designated initializer converts.
  optim::SGDFields f{.lr = 0.3};
  optim::SGDOptions from_fields = f;
  CHECK(from_fields.lr() == 0.3);
  // rebuild() keeps betas.
  auto rebuilt = adam.rebuild({optim::ParamGroup{{param({2})}, {}, {}}});
  CHECK(std::get<1>(dynamic_cast<optim::Adam&>(*rebuilt).options().betas()) == 0.95);

  CHECK(contains(error_of<ValueError>([&] {
                   optim::Adam({w}, optim::AdamOptions().betas({0.9, 1.0}));
                 }),
                 "[Adam] invalid beta parameter at index 1: 1"));
  CHECK(contains(error_of<ValueError>([&] {
                   optim::AdamW({w}, {.betas = {-0.1, 0.9}});
                 }),
                 "[AdamW] invalid beta parameter at index 0: -0.1"));
}

// ---------------- 3. Embedding ----------------

TEST_CASE("Embedding padding_idx: zero row at init, no gradient, negative index, vs PyTorch") {
  // The options spelling and the designated one.
  nn::Embedding e(nn::EmbeddingOptions(7, 3).padding_idx(2));
  CHECK(e.padding_idx == 2);
  CHECK(equal(e.weight.select(0, 2), zeros({3})));   // torch zeroes the padding row
  CHECK(!equal(e.weight.select(0, 1), zeros({3})));  // and only it
  nn::Embedding e2({.num_embeddings = 5, .embedding_dim = 4, .padding_idx = -1});
  CHECK(e2.padding_idx == 4);
  CHECK(equal(e2.weight.select(0, 4), zeros({4})));
  CHECK(e.repr() == "Embedding(7, 3, padding_idx=2)");

  for (const char* name : {"emb_pad", "emb_negpad"}) {
    const std::string cname = name;
    CAPTURE(cname);
    const Tensor w0 = fx(std::string(name) + ".weight");
    nn::Embedding m(nn::EmbeddingOptions(w0.size(0), w0.size(1))
                        .padding_idx(std::string(name) == "emb_pad" ? 2 : -1));
    m.to(kFloat64);
    {
      NoGradGuard ng;
      m.weight.copy_(w0);  // a nonzero padding row: its gradient must still be zero
    }
    backward_checked(name, m.forward(fx(std::string(name) + ".idx")));
    check_grad(name, "weight", m.weight);
  }
  // The free function, torch's F.embedding(input, weight, padding_idx).
  Tensor w = leaf(fx("emb_pad.weight"));
  backward_checked("emb_pad", embedding(w, fx("emb_pad.idx"), 2));
  check_grad("emb_pad", "weight", w);

  CHECK(contains(
      error_of<ValueError>([] { nn::Embedding(nn::EmbeddingOptions(4, 2).padding_idx(4)); }),
      "[Embedding] padding_idx 4 must be within num_embeddings 4"));
  CHECK(contains(error_of<ValueError>([&] { embedding(w, fx("emb_pad.idx"), -8); }),
                 "[embedding] padding_idx -8 must be within num_embeddings"));
}

TEST_CASE("Embedding max_norm: rows renormalised in place before the lookup, vs PyTorch") {
  nn::Embedding m(nn::EmbeddingOptions(6, 3).max_norm(1.5));
  m.to(kFloat64);
  {
    NoGradGuard ng;
    m.weight.copy_(fx("emb_maxnorm.weight"));
  }
  backward_checked("emb_maxnorm", m.forward(fx("emb_maxnorm.idx")), 1e-10);
  check_grad("emb_maxnorm", "weight", m.weight, 1e-10);
  CHECK(close_to(m.weight.detach(), fx("emb_maxnorm.weight_after"), 1e-10));
  CHECK(m.repr() == "Embedding(6, 3, max_norm=1.500000)");
}

// ---------------- 4. nll_loss class weights ----------------

TEST_CASE("nll_loss with class weights: torch's weighted mean, sum, none, ignore_index") {
  struct C {
    const char* name;
    int64_t ignore;
    Reduction r;
  };
  for (const C& c :
       {C{"nll_w_mean", -100, Reduction::Mean}, C{"nll_w_sum", -100, Reduction::Sum},
        C{"nll_w_none", -100, Reduction::None}, C{"nll_w_ncd_ignore1", 1, Reduction::Mean}}) {
    const std::string cname = c.name;
    CAPTURE(cname);
    const std::string n = c.name;
    Tensor x = leaf(fx(n + ".x"));
    backward_checked(n, nll_loss(x, fx(n + ".t"), fx(n + ".w"), c.ignore, c.r));
    check_grad(n, "x", x);
    // The module holds the weight as a buffer.
    nn::NLLLoss m(fx(n + ".w"), c.ignore, c.r);
    CHECK(m.named_buffers().size() == 1);
    CHECK(close_to(m(x.detach(), fx(n + ".t")), fx(n + ".out"), 1e-12));
  }
  // The weighted mean divides by the sum of the targets' weights, not by the count.
  Tensor lp = log_softmax(tensor(std::vector<double>{0.1, 0.2, 0.3, 0.4}, {2, 2}), 1);
  Tensor t = tensor(std::vector<int64_t>{0, 1}, {2});
  Tensor w = tensor(std::vector<double>{1.0, 3.0}, {2});
  const double expect =
      -(1.0 * lp.select(0, 0).select(0, 0).item() + 3.0 * lp.select(0, 1).select(0, 1).item()) /
      4.0;
  CHECK(nll_loss(lp, t, w).item() == doctest::Approx(expect).epsilon(1e-14));
  // cross_entropy with weights is nll_loss of log_softmax with them (torch's identity).
  Tensor x = leaf(fx("ce_w.x"));
  backward_checked("ce_w", nll_loss(log_softmax(x, 1), fx("ce_w.t"), fx("ce_w.w")));
  check_grad("ce_w", "x", x);
  CHECK(close_to(cross_entropy(fx("ce_w.x"), fx("ce_w.t"), fx("ce_w.w")), fx("ce_w.out"), 1e-12));
  // float32 on the fused kernel.
  CHECK(close_to(nll_loss(lp.to(kFloat32), t, w.to(kFloat32)).to(kFloat64),
                 tensor(std::vector<double>{expect}, {}), 1e-6));

  CHECK(
      contains(error_of<ShapeError>([&] { nll_loss(lp, t, zeros({3}, TensorOptions(kFloat64))); }),
               "[nll_loss] weight of shape (3,) must be (C) = (2) for input of shape (2, 2)"));
  Tensor wg = leaf(w);
  CHECK(contains(error_of<ValueError>([&] { nll_loss(lp, t, wg); }),
                 "[nll_loss] the derivative for 'weight' is not implemented"));
  CHECK(contains(error_of<DTypeError>([&] { nll_loss(lp, t, ones({2}, TensorOptions(kInt64))); }),
                 "[nll_loss] expected a floating point weight"));
}

// ---------------- 5. inplace activations ----------------

TEST_CASE("inplace activations: the input is overwritten, gradients equal the out-of-place op") {
  struct C {
    const char* name;
    std::shared_ptr<nn::Module> out_of_place, in_place;
  };
  const std::vector<C> cases = {
      {"ReLU", std::make_shared<nn::ReLU>(), std::make_shared<nn::ReLU>(true)},
      {"ReLU options", std::make_shared<nn::ReLU>(),
       std::make_shared<nn::ReLU>(nn::ReLUOptions().inplace(true))},
      {"ReLU6", std::make_shared<nn::ReLU6>(), std::make_shared<nn::ReLU6>(true)},
      {"LeakyReLU", std::make_shared<nn::LeakyReLU>(0.2),
       std::make_shared<nn::LeakyReLU>(nn::LeakyReLUOptions().negative_slope(0.2).inplace(true))},
      {"ELU", std::make_shared<nn::ELU>(1.3), std::make_shared<nn::ELU>(1.3, true)},
      {"SELU", std::make_shared<nn::SELU>(), std::make_shared<nn::SELU>(nn::SELUOptions(true))},
      {"CELU", std::make_shared<nn::CELU>(0.7),
       std::make_shared<nn::CELU>(nn::CELUOptions().alpha(0.7).inplace(true))},
      {"Hardtanh", std::make_shared<nn::Hardtanh>(-0.5, 0.7),
       std::make_shared<nn::Hardtanh>(
           nn::HardtanhOptions().min_val(-0.5).max_val(0.7).inplace(true))},
      {"Threshold", std::make_shared<nn::Threshold>(0.1, -2.0),
       std::make_shared<nn::Threshold>(nn::ThresholdOptions(0.1, -2.0).inplace(true))},
      {"SiLU", std::make_shared<nn::SiLU>(), std::make_shared<nn::SiLU>(true)},
  };
  for (const C& c : cases) {
    const std::string cname = c.name;
    CAPTURE(cname);
    Tensor x0 = mul(randn({3, 5}, TensorOptions(kFloat64)), 2.0);
    Tensor g = randn({3, 5}, TensorOptions(kFloat64));
    // Out of place.
    Tensor a = leaf(x0);
    Tensor ya = c.out_of_place->forward(mul(a, 1.0));
    sum(mul(ya, g)).backward();
    // In place on a non-leaf: the same values, written into the input, the same gradient.
    Tensor b = leaf(x0);
    Tensor h = mul(b, 1.0);
    Tensor yb = c.in_place->forward(h);
    CHECK(yb.is_same(h));
    CHECK(equal(h, ya));
    sum(mul(yb, g)).backward();
    CHECK(close_to(b.grad(), a.grad(), 1e-12));
    CHECK(contains(c.in_place->repr(), "inplace=true"));
  }
  // A leaf that requires grad cannot be written in place (torch's error too).
  Tensor leaf_x = leaf(randn({2}, TensorOptions(kFloat64)));
  CHECK_THROWS_AS(nn::ReLU(true).forward(leaf_x), Error);
  // Without grad the module writes the caller's tensor.
  Tensor y = tensor(std::vector<double>{-1.0, 2.0}, {2});
  nn::ReLU(true).forward(y);
  CHECK(equal(y, tensor(std::vector<double>{0.0, 2.0}, {2})));
}

TEST_CASE("hardtanh, relu6, selu, celu, threshold, leaky_relu, elu, silu against PyTorch") {
  struct C {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    double grad_tol = 1e-12;
  };
  const std::vector<C> cases = {
      {"hardtanh", [](const Tensor& x) { return hardtanh(x, -0.5, 0.7); }},
      {"relu6", [](const Tensor& x) { return relu6(x); }},
      {"selu", [](const Tensor& x) { return selu(x); }},
      // torch 1.13's celu backward is off the exact derivative exp(x / alpha) by up to 5e-9
      // here (checked in Python: the exact value equals ours to 1e-16).
      {"celu", [](const Tensor& x) { return celu(x, 0.7); }, 1e-8},
      {"threshold", [](const Tensor& x) { return threshold(x, 0.1, -2.0); }},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); }},
      {"elu", [](const Tensor& x) { return elu(x, 1.3); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
  };
  for (const C& c : cases) {
    const std::string cname = c.name;
    CAPTURE(cname);
    Tensor x = leaf(fx(std::string(c.name) + ".x"));
    backward_checked(c.name, c.f(x));
    check_grad(c.name, "x", x, c.grad_tol);
  }
  CHECK(contains(error_of<ValueError>([] { hardtanh(zeros({2}), 1.0, 0.0); }),
                 "[hardtanh] max_val (0) must be greater than or equal to min_val (1)"));
  CHECK(contains(error_of<ValueError>([] { celu(zeros({2}), 0.0); }),
                 "[celu] alpha must not be zero"));
}

TEST_CASE("Dropout inplace: the same draws and result as out of place") {
  Generator g1(5), g2(5);
  nn::Dropout a(0.4, &g1);
  nn::Dropout b(nn::DropoutOptions(0.4).inplace(true), &g2);
  Tensor x = randn({4, 6}, TensorOptions(kFloat64));
  Tensor ya = a.forward(x);
  Tensor xb = x.clone();
  Tensor yb = b.forward(xb);
  CHECK(equal(ya, yb));
  CHECK(equal(xb, ya));  // written in place
  CHECK(b.repr() == "Dropout(p=0.400000, inplace=true)");
  // Dropout2d's channel masks in place too.
  Generator g3(9), g4(9);
  Tensor z = randn({2, 3, 2, 2}, TensorOptions(kFloat64));
  Tensor z2 = z.clone();
  CHECK(equal(nn::Dropout2d(0.5, &g3).forward(z), nn::Dropout2d(0.5, true, &g4).forward(z2)));
  CHECK(equal(dropout2d(z, 0.5, true, &g3), dropout2d_(z2 = z.clone(), 0.5, true, &g4)));
}

// ---------------- 6. convolution and pooling options ----------------

TEST_CASE("Conv options: libtorch's builder, {5, 5} kernel sizes, designated, same init") {
  manual_seed(3);
  auto c1 = std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 64, 5).stride(2).bias(false));
  CHECK(c1->weight.sizes() == Shape{64, 1, 5, 5});
  CHECK(!c1->bias.defined());
  CHECK(c1->stride.h == 2);
  CHECK(c1->named_parameters().size() == 1);
  manual_seed(3);
  nn::Conv2d c2(1, 64, 5, 2, 0, 1, 1, false);  // the positional form: the same draws
  CHECK(equal(c1->weight, c2.weight));

  nn::Conv2d c3(nn::Conv2dOptions(3, 8, {3, 5}).padding({1, 2}).dilation({1, 2}).groups(1));
  CHECK(c3.weight.sizes() == Shape{8, 3, 3, 5});
  CHECK(c3.forward(zeros({1, 3, 6, 9})).sizes() == Shape{1, 8, 6, 5});
  nn::Conv2d c4({.in_channels = 2, .out_channels = 4, .kernel_size = {3, 3}, .bias = false});
  CHECK(!c4.bias.defined());
  nn::Conv2d c5(1, 6, {5, 5});  // positional, a braced kernel size
  CHECK(c5.kernel_size.w == 5);

  nn::Conv1d d1(nn::Conv1dOptions(4, 8, 3).stride(2).padding(1).bias(false));
  CHECK(d1.weight.sizes() == Shape{8, 4, 3});
  CHECK(d1.forward(zeros({2, 4, 9})).sizes() == Shape{2, 8, 5});
  nn::ConvTranspose2d t1(nn::ConvTranspose2dOptions(4, 2, {4, 4}).stride(2).padding(1));
  CHECK(t1.forward(zeros({1, 4, 5, 5})).sizes() == Shape{1, 2, 10, 10});
  nn::ConvTranspose1d t2(nn::ConvTranspose1dOptions(2, 3, 4).stride(2).output_padding(1));
  CHECK(t2.forward(zeros({1, 2, 5})).sizes() == Shape{1, 3, 13});

  CHECK(contains(
      error_of<ValueError>(
          [] { nn::Conv2d(nn::Conv2dOptions(1, 2, 3).padding_mode("reflection")); }),
      "[Conv2d] padding_mode must be \"zeros\", \"reflect\", \"replicate\" or \"circular\", "
      "got \"reflection\""));
  CHECK(contains(error_of<ValueError>([] {
                   nn::ConvTranspose2d(nn::ConvTranspose2dOptions(1, 2, 3).padding_mode("reflect"));
                 }),
                 "[ConvTranspose2d] only padding_mode \"zeros\" is supported"));
  CHECK(contains(error_of<ValueError>(
                     [] { nn::Conv2d(nn::Conv2dFields{.in_channels = 1, .out_channels = 2}); }),
                 "[Conv2d] kernel_size must be >= 1, got (0, 0)"));
}

TEST_CASE("Conv padding_mode reflect / replicate / circular against PyTorch") {
  struct C {
    const char* name;
    std::function<std::shared_ptr<nn::Module>()> make;
  };
  const std::vector<C> cases = {
      {"conv2d_reflect",
       [] {
         return std::make_shared<nn::Conv2d>(
             nn::Conv2dOptions(2, 3, {3, 2}).padding({1, 2}).padding_mode("reflect"));
       }},
      {"conv2d_replicate",
       [] {
         return std::make_shared<nn::Conv2d>(
             nn::Conv2dOptions(2, 3, 3).stride(2).padding(1).padding_mode("replicate"));
       }},
      {"conv2d_circular",
       [] {
         return std::make_shared<nn::Conv2d>(
             nn::Conv2dOptions(2, 4, 3).padding({2, 1}).dilation({2, 1}).groups(2).padding_mode(
                 "circular"));
       }},
      {"conv1d_reflect",
       [] {
         return std::make_shared<nn::Conv1d>(
             nn::Conv1dOptions(2, 3, 3).padding(2).padding_mode("reflect"));
       }},
  };
  for (const C& c : cases) {
    const std::string n = c.name;
    CAPTURE(n);
    auto m = c.make();
    m->to(kFloat64);
    m->load_state_dict({{"weight", fx(n + ".weight")}, {"bias", fx(n + ".bias")}});
    Tensor x = leaf(fx(n + ".x"));
    backward_checked(n, m->forward(x));
    check_grad(n, "x", x);
    check_grad(n, "weight", m->parameter("weight"));
    check_grad(n, "bias", m->parameter("bias"));
    CHECK(contains(m->repr(), "padding_mode="));
  }
}

TEST_CASE("Pooling options: MaxPool2dOptions({2, 2}).stride(2), MaxPool2d({2, 2}), AvgPool2d") {
  nn::MaxPool2d p1(nn::MaxPool2dOptions({2, 2}).stride(2));
  CHECK(p1.kernel_size.h == 2);
  CHECK(p1.stride.w == 2);
  nn::MaxPool2d p2({2, 2});  // the kernel size, not an aggregate of two fields
  CHECK(p2.kernel_size.w == 2);
  CHECK(p2.stride.w == 2);  // stride defaults to the kernel
  nn::MaxPool2d p3(nn::MaxPool2dOptions(3).stride(1).padding(1));
  CHECK(p3.forward(zeros({1, 1, 5, 5})).sizes() == Shape{1, 1, 5, 5});
  nn::MaxPool2d p4(nn::MaxPool2dOptions(nn::MaxPool2dFields{.kernel_size = {2, 3}, .stride = 1}));
  CHECK(p4.kernel_size.w == 3);
  CHECK(p4.stride.h == 1);
  nn::AvgPool2d a1(nn::AvgPool2dOptions({3, 3}).stride(2).padding(1).count_include_pad(false));
  CHECK(!a1.count_include_pad);
  CHECK(a1.forward(ones({1, 1, 5, 5})).sizes() == Shape{1, 1, 3, 3});
  CHECK(equal(a1.forward(ones({1, 1, 5, 5})), ones({1, 1, 3, 3})));
  nn::AvgPool2d a2({2, 2});
  CHECK(a2.stride.h == 2);
  CHECK(contains(error_of<ValueError>([] { nn::MaxPool2d(nn::MaxPool2dOptions(0)); }),
                 "[MaxPool2d] kernel_size must be >= 1, got (0, 0)"));
  CHECK(contains(error_of<ValueError>([] {
                   nn::MaxPool2d({2, 2, 2});
                 }),
                 "[MaxPool2d] kernel_size must have 1 or 2 entries, got 3"));
  nn::AdaptiveMaxPool2d am({5, 7});
  CHECK(am.output_size.w == 7);
  CHECK(!am.return_indices);
}

// ---------------- 7. losses broadcasting a target ----------------

TEST_CASE("losses broadcast a target of another shape, with torch's warning once, vs PyTorch") {
  WarningCapture w;
  struct C {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
  };
  const std::vector<C> cases = {
      {"mse_bcast_mean", [](const Tensor& x, const Tensor& t) { return mse_loss(x, t); }},
      {"mse_bcast_none",
       [](const Tensor& x, const Tensor& t) { return mse_loss(x, t, Reduction::None); }},
      {"l1_bcast_sum",
       [](const Tensor& x, const Tensor& t) { return l1_loss(x, t, Reduction::Sum); }},
      {"smooth_l1_bcast_mean",
       [](const Tensor& x, const Tensor& t) { return smooth_l1_loss(x, t, Reduction::Mean, 0.5); }},
      {"huber_bcast_none",
       [](const Tensor& x, const Tensor& t) { return huber_loss(x, t, Reduction::None, 0.7); }},
      {"kl_bcast_batchmean",
       [](const Tensor& x, const Tensor& t) { return kl_div(x, t, Reduction::BatchMean); }},
  };
  for (const C& c : cases) {
    const std::string n = c.name;
    CAPTURE(n);
    Tensor x = leaf(fx(n + ".x")), t = leaf(fx(n + ".t"));
    backward_checked(n, c.f(x, t));
    check_grad(n, "x", x);
    check_grad(n, "t", t);
  }
  REQUIRE(w.lines.size() == cases.size());
  CHECK(w.lines[0] ==
        "[mse_loss] using a target size (4,) that is different to the input size (4, 1): both "
        "broadcast to (4, 4). This will likely lead to incorrect results due to broadcasting. "
        "Please ensure they have the same size.");
  // Once per message: the same call again says nothing, other shapes say it again.
  mse_loss(fx("mse_bcast_mean.x"), fx("mse_bcast_mean.t"));
  nn::MSELoss()(fx("mse_bcast_mean.x"), fx("mse_bcast_mean.t"));
  CHECK(w.lines.size() == cases.size());
  mse_loss(zeros({2, 1}), zeros({2}));
  CHECK(w.lines.size() == cases.size() + 1);
  // Equal shapes never warn.
  mse_loss(zeros({3}), zeros({3}));
  CHECK(w.lines.size() == cases.size() + 1);
  // Shapes that do not broadcast, and the losses torch refuses too.
  CHECK(contains(error_of<ShapeError>([] { mse_loss(zeros({3}), zeros({4})); }), "[mse_loss]"));
  CHECK(contains(error_of<ShapeError>([] {
                   binary_cross_entropy(full({4, 1}, 0.5), full({4}, 0.5));
                 }),
                 "[binary_cross_entropy] input of shape (4, 1)"));
  CHECK(contains(error_of<ShapeError>([] {
                   binary_cross_entropy_with_logits(zeros({4, 1}), zeros({4}));
                 }),
                 "[binary_cross_entropy_with_logits]"));
}

TEST_CASE("warnings go to stderr by default, once per message") {
  reset_warnings_shown();
  WarningHandler none;
  WarningHandler prev = set_warning_handler(none);  // stderr
  CHECK(!prev);
  ACCEL_WARN_ONCE("test_spellings", "shown on stderr once");
  ACCEL_WARN_ONCE("test_spellings", "shown on stderr once");
  std::vector<std::string> seen;
  set_warning_handler([&](const std::string& l) { seen.push_back(l); });
  ACCEL_WARN_ONCE("test_spellings", "shown on stderr once");  // already shown
  ACCEL_WARN_ONCE("test_spellings", "another ", 3);
  CHECK(seen == std::vector<std::string>{"[test_spellings] another 3"});
  set_warning_handler(nullptr);
}

// ---------------- 8. dropout2d on 3-D input ----------------

TEST_CASE("dropout2d reads a 3-D input as (N, C, L) with a warning, as torch; dropout1d / 3d") {
  WarningCapture w;
  // A draw per (n, c): each row of the last dim is all dropped or all kept, and rows of one
  // channel in different batch entries are drawn apart (as (C, H, W) they would share a draw).
  Generator g(11);
  Tensor x = ones({8, 4, 5}, TensorOptions(kFloat64));
  Tensor y = dropout2d(x, 0.5, true, &g);
  Tensor rows = amax(y, {2});
  CHECK(equal(rows, amin(y, {2})));  // constant along L
  const bool n_matters =
      !equal(rows.select(0, 0), rows.select(0, 1)) || !equal(rows.select(0, 2), rows.select(0, 3));
  CHECK(n_matters);
  REQUIRE(w.lines.size() == 1);
  CHECK(contains(w.lines[0],
                 "[dropout2d] received a 3-D input (8, 4, 5) and, as torch, treats it as "
                 "(N, C, L)"));
  // The module too; 4-D keeps one draw per (n, c) plane.
  Generator g2(11);
  CHECK(equal(nn::Dropout2d(0.5, &g2).forward(x), y));
  Tensor y4 = dropout2d(ones({3, 2, 4, 4}, TensorOptions(kFloat64)), 0.5, true, &g);
  CHECK(equal(amax(y4, {2, 3}), amin(y4, {2, 3})));
  // dropout1d: (N, C, L) and unbatched (C, L), the same draws as dropout2d on (N, C, L).
  Generator g3(11);
  CHECK(equal(dropout1d(x, 0.5, true, &g3), y));
  Tensor y1 = dropout1d(ones({6, 5}, TensorOptions(kFloat64)), 0.5, true, &g);
  CHECK(equal(amax(y1, {1}), amin(y1, {1})));
  Tensor y3 = nn::Dropout3d(0.5, &g).forward(ones({2, 3, 2, 2, 2}, TensorOptions(kFloat64)));
  CHECK(equal(amax(y3, {2, 3, 4}), amin(y3, {2, 3, 4})));
  CHECK(w.lines.size() == 1);  // dropout1d / 3d do not warn
  CHECK(contains(error_of<ShapeError>([] {
                   dropout1d(zeros({2, 3, 4, 5}), 0.5);
                 }),
                 "[dropout1d] expected a 2-D or 3-D input (C, L) or (N, C, L), got (2, 3, 4, 5)"));
  CHECK(contains(error_of<ShapeError>([] {
                   dropout2d(zeros({2, 3}), 0.5);
                 }),
                 "[dropout2d] expected a 3-D (N, C, L) or 4-D (N, C, H, W) input, got (2, 3)"));
}

// ---------------- 9. a 0-dim buffer saved as (1,) ----------------

TEST_CASE("load_state_dict: a 0-dim num_batches_tracked saved as (1,) loads; other shapes refuse") {
  nn::BatchNorm2d bn(3);
  io::TensorDict sd = bn.state_dict();
  REQUIRE(sd.at("num_batches_tracked").dim() == 0);
  sd["num_batches_tracked"] = tensor(std::vector<int64_t>{42}, {1});  // older files' shape
  sd["running_mean"] = full({3}, 0.5);
  bn.load_state_dict(sd);
  CHECK(bn.num_batches_tracked.dim() == 0);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 42);
  CHECK(equal(bn.running_mean, full({3}, 0.5)));
  // Through a file, as a checkpoint of older code would come.
  sd["num_batches_tracked"] = tensor(std::vector<int64_t>{7}, {1});
  const std::string path = "test_spellings_bn.safetensors";
  io::save_safetensors(path, sd);
  nn::BatchNorm2d bn2(3);
  bn2.load(path);
  std::remove(path.c_str());
  CHECK(bn2.num_batches_tracked.item<int64_t>() == 7);

  sd["num_batches_tracked"] = tensor(std::vector<int64_t>{1, 2}, {2});
  CHECK(contains(error_of<ValueError>([&] { bn.load_state_dict(sd); }),
                 "size mismatch for num_batches_tracked: copying a param with shape (2,) from "
                 "checkpoint, the shape in current model is ()"));
  sd["num_batches_tracked"] = zeros({1, 1}, TensorOptions(kInt64));
  CHECK(contains(error_of<ValueError>([&] { bn.load_state_dict(sd); }),
                 "size mismatch for num_batches_tracked: copying a param with shape (1, 1) from "
                 "checkpoint, the shape in current model is ()"));
  sd["num_batches_tracked"] = zeros({}, TensorOptions(kInt64));
  sd["running_mean"] = zeros({1});  // a (1,) where the model has (3): still refused
  CHECK(contains(error_of<ValueError>([&] { bn.load_state_dict(sd); }),
                 "size mismatch for running_mean: copying a param with shape (1,) from checkpoint, "
                 "the shape in current model is (3,)"));
  CHECK(bn.num_batches_tracked.item<int64_t>() == 42);  // nothing loaded
}
