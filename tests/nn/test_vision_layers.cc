// The nn pieces the vision model zoo added (docs/nn.md): hardswish / hardsigmoid (functions,
// in-place forms, modules) and max_pool2d's ceil_mode against PyTorch in float64 (the fixture
// tests/nn/vision_layers_fixture.safetensors, made by make_vision_layers_fixture.py with
// python3-torch), gradcheck of both activations, and Sequential's named entries.
#include <doctest/doctest.h>

#include <functional>

#include "accel.h"
#include "autograd/gradcheck.h"
#include "tests/common/check.h"
#include "tests/common/util.h"

using namespace accel;
using accel::test::contains;
using accel::test::error_of;

namespace {

const Tensor& fx(const std::string& k) {
  static const nn::TensorDict t = nn::load_safetensors(
      std::string(ACCEL_SOURCE_ROOT) + "/tests/nn/vision_layers_fixture.safetensors");
  auto it = t.find(k);
  REQUIRE_MESSAGE(it != t.end(), "fixture lacks ", k);
  return it->second;
}

bool close(const Tensor& a, const Tensor& b, double tol) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && allclose(a, b, tol, tol);
}

// Forward and input gradient of `f` on case `name` against PyTorch.
void check_case(const std::string& name, const std::function<Tensor(const Tensor&)>& f,
                double tol = 1e-12, double grad_tol = 1e-12) {
  CAPTURE(name);
  Tensor x = fx(name + ".x").clone();
  x.requires_grad_();
  const Tensor out = f(x);
  CHECK(close(out.detach(), fx(name + ".out"), tol));
  sum(mul(out, fx(name + ".w"))).backward();
  CHECK_MESSAGE(close(x.grad(), fx(name + ".grad"), grad_tol),
                "gradient differs from PyTorch's by ",
                max(abs(sub(x.grad(), fx(name + ".grad")))).item<double>());
}

}  // namespace

TEST_CASE("hardswish and hardsigmoid against PyTorch, the ends -3 and 3 included") {
  // The fixture's first entries are -4, -3, -2.5, -1, 0, 0.5, 2.9, 3, 3.5, 5 (of 30, so torch
  // ran its vectorised kernels on them): torch's backward gives hardswish -0.5 at -3 and 1 at 3
  // (x / 3 + 1/2 on [-3, 3)), hardsigmoid 0 at both ends (1/6 strictly inside).
  check_case("hardswish", [](const Tensor& x) { return hardswish(x); });
  // torch 1.13's hardsigmoid_backward multiplies by one_sixth(1.0f / 6.0f), 1/6 rounded to float
  // even for float64 (a relative error of 3e-8); accel's gradient is g / 6.
  check_case(
      "hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); }, 1e-12, 1e-8);
  const Tensor g = fx("hardswish.grad"), w = fx("hardswish.w");
  CHECK(g.data<double>()[1] == doctest::Approx(-0.5 * w.data<double>()[1]));
  CHECK(g.data<double>()[7] == doctest::Approx(w.data<double>()[7]));
}

TEST_CASE("hardswish / hardsigmoid: gradcheck, in place, modules, errors") {
  Tensor x = mul(randn({4, 5}, TensorOptions(kFloat64)), 3.0);
  x.requires_grad_();
  CHECK(
      autograd::gradcheck([](const std::vector<Tensor>& in) { return hardswish(in[0]); }, {x}).ok);
  CHECK(autograd::gradcheck([](const std::vector<Tensor>& in) { return hardsigmoid(in[0]); }, {x})
            .ok);

  // In place: the same values and gradient as out of place.
  for (bool swish : {true, false}) {
    CAPTURE(swish);
    Tensor a = x.detach().clone(), b = x.detach().clone();
    a.requires_grad_();
    b.requires_grad_();
    Tensor ya = swish ? hardswish(a) : hardsigmoid(a);
    Tensor yb = mul(b, 1.0);  // not a leaf: in place is allowed
    swish ? hardswish_(yb) : hardsigmoid_(yb);
    CHECK(equal(ya, yb));
    sum(mul(ya, ya)).backward();
    sum(mul(yb, yb)).backward();
    CHECK(allclose(a.grad(), b.grad(), 1e-14, 1e-14));
  }
  nn::Hardswish hs(true);
  nn::Hardsigmoid hsig(nn::HardsigmoidOptions().inplace(false));
  Tensor v = tensor(std::vector<double>{-4.0, 0.0, 1.5, 4.0}, {4});
  CHECK(allclose(hsig.forward(v), tensor(std::vector<double>{0.0, 0.5, 0.75, 1.0}, {4})));
  Tensor y = hs.forward(v);
  CHECK(y.data<double>() == v.data<double>());  // inplace: the input itself
  CHECK(allclose(v, tensor(std::vector<double>{0.0, 0.0, 1.125, 4.0}, {4})));
  CHECK(hs.repr() == "Hardswish(inplace=true)");
  CHECK(hsig.repr() == "Hardsigmoid()");
  CHECK(contains(error_of<DTypeError>([] { hardswish(zeros({2}, TensorOptions(kInt64))); }),
                 "[hardswish]"));
}

TEST_CASE("max_pool2d ceil_mode against PyTorch") {
  using S = Shape;
  check_case("pool_k3s2_8x8", [](const Tensor& x) {
    return max_pool2d(x, {3, 3}, {2, 2}, {0, 0}, {1, 1}, true);
  });
  // The last window of H would start in the right padding: dropped (5 -> 3 rows, not 4).
  check_case("pool_k2s2p1_5x6", [](const Tensor& x) {
    return max_pool2d(x, {2, 2}, {2, 2}, {1, 1}, {1, 1}, true);
  });
  check_case("pool_k32s21p1_6x9", [](const Tensor& x) {
    return max_pool2d(x, {3, 2}, {2, 1}, {1, 1}, {1, 1}, true);
  });
  check_case("pool_unbatched_k3s2_10x7", [](const Tensor& x) {
    return nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true)).forward(x);
  });
  check_case("pool_k2s2_6x6", [](const Tensor& x) {
    return max_pool2d(x, {2, 2}, S{}, {0, 0}, {1, 1}, true);
  });
  CHECK(max_pool2d(fx("pool_k3s2_8x8.x"), {3, 3}, {2, 2}).sizes() == S{2, 3, 3, 3});  // floor
  CHECK(fx("pool_k3s2_8x8.out").sizes() == S{2, 3, 4, 4});

  // Gradcheck through the padded overhang.
  Tensor x = randn({1, 2, 5, 6}, TensorOptions(kFloat64));
  x.requires_grad_();
  CHECK(autograd::gradcheck(
            [](const std::vector<Tensor>& in) {
              return max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true);
            },
            {x})
            .ok);

  nn::MaxPool2d pool(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true));
  CHECK(pool.repr() ==
        "MaxPool2d(kernel_size=(3, 3), stride=(2, 2), padding=(0, 0), dilation=(1, 1), "
        "ceil_mode=true)");
  CHECK(contains(error_of<ValueError>([] {
                   max_pool2d(zeros({1, 1, 4, 4}), {2, 2}, {}, {0, 0}, {2, 2});
                 }),
                 "[max_pool2d] dilation (2, 2) is not supported"));
  CHECK(contains(error_of<ValueError>([] { nn::MaxPool2d(nn::MaxPool2dOptions(2).dilation(2)); }),
                 "[MaxPool2d] dilation (2, 2) is not supported"));
  CHECK(contains(error_of<ShapeError>([] {
                   max_pool2d(zeros({1, 1, 2, 2}), {3, 3}, {2, 2}, {0, 0}, {1, 1}, true);
                 }),
                 "[max_pool2d] kernel (3, 3) is larger than the input"));
}

TEST_CASE("Sequential: named entries (torch's Sequential(OrderedDict))") {
  auto head = std::make_shared<nn::Linear>(4, 3);
  nn::Sequential seq({{"pre_logits", std::make_shared<nn::Linear>(5, 4)},
                      {"act", std::make_shared<nn::Tanh>()},
                      {"head", head}});
  std::vector<std::string> names;
  for (const auto& [n, p] : seq.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"pre_logits.weight", "pre_logits.bias", "head.weight",
                                          "head.bias"});
  CHECK(seq.size() == 3);
  CHECK(seq.at<nn::Linear>(2) == head);
  const Tensor x = randn({2, 5});
  CHECK(seq.forward(x).sizes() == Shape{2, 3});
  // set(i) replaces the child that holds entry i, whatever its name.
  seq.set(2, std::make_shared<nn::Linear>(4, 7));
  CHECK(seq.forward(x).sizes() == Shape{2, 7});
  CHECK(seq.parameter("head.weight").sizes() == Shape{7, 4});
  // push_back(module) after named entries: named by its index, as torch's append.
  seq.push_back(std::make_shared<nn::ReLU>());
  CHECK(seq.named_children().back().first == "3");
  CHECK(contains(error_of<ValueError>([&] { seq.push_back("act", std::make_shared<nn::ReLU>()); }),
                 "[Sequential.push_back] an entry named 'act' exists already (Tanh)"));
  CHECK(contains(error_of<ValueError>([&] { seq.push_back("x", nullptr); }),
                 "[Sequential.push_back] entry 'x' cannot be None"));
}
