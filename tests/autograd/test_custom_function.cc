// Custom autograd functions (Note [custom functions] in autograd/custom_function.h): libtorch's
// Function<T> / AutogradContext, each ctx feature, each error, and double backward through one.
#include <doctest/doctest.h>

#include "accel.h"
#include "autograd/gradcheck.h"

using namespace accel;
using autograd::AutogradContext;
using autograd::variable_list;

namespace {

Tensor f64(std::vector<double> v, Shape s) { return tensor(v, s).to(kFloat64); }

// y = x * c, c a double kept in saved_data: the example of the header.
struct MulConst : autograd::Function<MulConst> {
  static Tensor forward(AutogradContext* ctx, Tensor x, double c) {
    ctx->saved_data["c"] = c;
    return mul(x, c);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {mul(g[0], ctx->saved_data["c"].toDouble()), Tensor()};
  }
};

// y = x^3 with a backward from ops on the saved input: double backward works through it.
struct Cube : autograd::Function<Cube> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return mul(mul(x, x), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const Tensor x = ctx->get_saved_variables()[0];
    return {mul(g[0], mul(mul(x, x), 3.0))};
  }
};

// y = exp(x), saving its output (which the backward gets with the node as grad_fn under
// create_graph).
struct Exp : autograd::Function<Exp> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    Tensor y = exp(x);
    ctx->save_for_backward({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {mul(g[0], ctx->get_saved_variables()[0])};
  }
};

// a * b with needs_input_grad recorded in forward and backward.
struct Mul2 : autograd::Function<Mul2> {
  static inline std::vector<bool> seen_forward, seen_backward;
  static Tensor forward(AutogradContext* ctx, Tensor a, Tensor b) {
    seen_forward = {ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    ctx->save_for_backward({a, b});
    return mul(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    seen_backward = {ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    const variable_list s = ctx->get_saved_variables();
    return {ctx->needs_input_grad(0) ? mul(g[0], s[1]) : Tensor(),
            ctx->needs_input_grad(1) ? mul(g[0], s[0]) : Tensor()};
  }
};

// x += 1 in place (mark_dirty).
struct AddOneInPlace : autograd::Function<AddOneInPlace> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    x.add_(1.0);
    ctx->mark_dirty({x});
    return x;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

// (2 x, x > 0 as floats): the mask marked non-differentiable; records what backward received.
struct WithMask : autograd::Function<WithMask> {
  static inline bool materialize = true;
  static inline bool mask_grad_defined = false;
  static variable_list forward(AutogradContext* ctx, Tensor x) {
    Tensor mask = gt(x, 0.0).to(x.dtype());
    ctx->mark_non_differentiable({mask});
    ctx->set_materialize_grads(materialize);
    return {mul(x, 2.0), mask};
  }
  static variable_list backward(AutogradContext*, variable_list g) {
    mask_grad_defined = g[1].defined();
    return {g[0].defined() ? mul(g[0], 2.0) : Tensor()};
  }
};

// Returns its argument unchanged (an alias comes back).
struct Identity : autograd::Function<Identity> {
  static Tensor forward(AutogradContext*, Tensor x) { return x; }
  static variable_list backward(AutogradContext*, variable_list g) { return {mul(g[0], 3.0)}; }
};

// Backwards that break the rules.
struct TooFew : autograd::Function<TooFew> {
  static Tensor forward(AutogradContext*, Tensor x, Tensor y) { return add(x, y); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};
struct GradForScalar : autograd::Function<GradForScalar> {
  static Tensor forward(AutogradContext*, Tensor x, double) { return mul(x, 2.0); }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], g[0]}; }
};
struct WrongShape : autograd::Function<WrongShape> {
  static Tensor forward(AutogradContext*, Tensor x) { return mul(x, 2.0); }
  static variable_list backward(AutogradContext*, variable_list) {
    return {zeros({7}, TensorOptions(kFloat64))};
  }
};
struct Broadcasting : autograd::Function<Broadcasting> {  // returns (2, 3) for a (3) input
  static Tensor forward(AutogradContext*, Tensor x) { return mul(x, 2.0); }
  static variable_list backward(AutogradContext*, variable_list g) {
    return {g[0].unsqueeze(0).expand({2, 3}), Tensor(), Tensor()};  // extra undefined: allowed
  }
};
struct Saves : autograd::Function<Saves> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    ctx->save_for_backward({x});
    return mul(x, 2.0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {mul(g[0], ctx->get_saved_variables()[0])};
  }
};

}  // namespace

TEST_CASE("custom Function: apply, saved_data, a non-tensor argument") {
  Tensor x = f64({1.0, -2.0}, {2}).requires_grad_(true);
  Tensor y = MulConst::apply(x, 2.5);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()).find("MulConst") != std::string::npos);
  CHECK(y.to_vector<double>() == std::vector<double>{2.5, -5.0});
  sum(y).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.5, 2.5});
  // No grad mode, or nothing requiring grad: the forward's result, no node.
  {
    NoGradGuard no_grad;
    CHECK(MulConst::apply(x, 2.0).grad_fn() == nullptr);
  }
  CHECK_FALSE(MulConst::apply(f64({1.0}, {1}), 2.0).requires_grad());
  // IValue kinds: the wrong accessor names both.
  autograd::IValue v(3);
  CHECK(v.isInt());
  CHECK(v.toInt() == 3);
  CHECK_THROWS_WITH_AS(v.toDouble(), doctest::Contains("expected Double but got Int"), ValueError);
  CHECK(autograd::IValue("s").toStringRef() == "s");
  CHECK(autograd::IValue(Shape{2, 3}).toIntVector() == std::vector<int64_t>{2, 3});
  CHECK(autograd::IValue().isNone());
}

TEST_CASE("custom Function: needs_input_grad in forward and backward") {
  Tensor a = f64({1.0, 2.0}, {2}).requires_grad_(true);
  Tensor b = f64({3.0, 4.0}, {2});
  sum(Mul2::apply(a, b)).backward();
  CHECK(Mul2::seen_forward == std::vector<bool>{true, false});
  CHECK(Mul2::seen_backward == std::vector<bool>{true, false});
  CHECK(a.grad().to_vector<double>() == std::vector<double>{3.0, 4.0});
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("custom Function: saved tensors are version-checked and freed after backward") {
  Tensor x0 = f64({0.5, 1.5}, {2}).requires_grad_(true);
  Tensor x = mul(x0, 1.0);
  Tensor y = Saves::apply(x);
  x.add_(1.0);
  CHECK_THROWS_WITH_AS(sum(y).backward(), doctest::Contains("modified by an in-place operation"),
                       ValueError);
  Tensor y2 = Saves::apply(mul(x0, 1.0));
  sum(y2).backward();
  CHECK_THROWS_WITH_AS(sum(y2).backward(), doctest::Contains("second time"), ValueError);
  Tensor y3 = Saves::apply(mul(x0, 1.0));
  sum(y3).backward(Tensor(), /*retain_graph=*/true);
  CHECK_NOTHROW(sum(y3).backward());
}

TEST_CASE("custom Function: mark_dirty (in place), its refusals") {
  Tensor a = f64({1.0, 2.0}, {2}).requires_grad_(true);
  Tensor x = mul(a, 3.0);
  const uint32_t v0 = x.version();
  Tensor y = AddOneInPlace::apply(x);
  CHECK(y.is_same(x));  // the argument itself, with the node as its history
  CHECK(x.version() > v0);
  CHECK(x.to_vector<double>() == std::vector<double>{4.0, 7.0});
  REQUIRE(x.grad_fn() != nullptr);
  CHECK(std::string(x.grad_fn()->name()).find("AddOneInPlace") != std::string::npos);
  sum(mul(x, x)).backward();  // d/da (3a + 1)^2 = 6 (3a + 1)
  CHECK(a.grad().to_vector<double>() == std::vector<double>{24.0, 42.0});
  Tensor leaf = f64({1.0}, {1}).requires_grad_(true);
  CHECK_THROWS_WITH_AS(AddOneInPlace::apply(leaf), doctest::Contains("leaf"), ValueError);
  Tensor base = mul(a, 1.0);
  CHECK_THROWS_WITH_AS(AddOneInPlace::apply(base.slice(0, 0, 1)), doctest::Contains("view"),
                       ValueError);
}

TEST_CASE("custom Function: mark_non_differentiable and set_materialize_grads") {
  for (bool materialize : {true, false}) {
    INFO("materialize ", materialize);
    WithMask::materialize = materialize;
    Tensor x = f64({-1.0, 2.0}, {2}).requires_grad_(true);
    variable_list r = WithMask::apply(x);
    CHECK(r[0].requires_grad());
    CHECK_FALSE(r[1].requires_grad());
    CHECK(r[1].to_vector<double>() == std::vector<double>{0.0, 1.0});
    sum(r[0]).backward();
    CHECK(WithMask::mask_grad_defined == materialize);  // zeros, or undefined
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 2.0});
  }
}

TEST_CASE("custom Function: an argument returned as it is keeps its own history") {
  Tensor a = f64({1.0, 2.0}, {2}).requires_grad_(true);
  Tensor x = mul(a, 2.0);
  const auto before = x.grad_fn();
  Tensor y = Identity::apply(x);
  CHECK_FALSE(y.is_same(x));
  CHECK(x.grad_fn() == before);
  sum(y).backward();  // 3 (custom) * 2 (mul)
  CHECK(a.grad().to_vector<double>() == std::vector<double>{6.0, 6.0});
}

TEST_CASE("custom Function: backward results are checked") {
  Tensor x = f64({1.0, 2.0, 3.0}, {3}).requires_grad_(true);
  Tensor y = f64({1.0, 1.0, 1.0}, {3});
  CHECK_THROWS_WITH_AS(sum(TooFew::apply(x, y)).backward(),
                       doctest::Contains("incorrect number of gradients (expected 2 but got 1)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(sum(GradForScalar::apply(x, 1.0)).backward(),
                       doctest::Contains("non-tensor argument 1"), ValueError);
  CHECK_THROWS_WITH_AS(sum(WrongShape::apply(x)).backward(), doctest::Contains("shape (7,)"),
                       ShapeError);
  sum(Broadcasting::apply(x)).backward();  // (2, 3) summed to (3)
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 2.0, 2.0});
  CHECK_THROWS_AS(
      [] {
        AutogradContext ctx;
        return ctx.needs_input_grad(0);
      }(),
      IndexError);
}

TEST_CASE("custom Function: double backward through saved inputs and outputs") {
  Tensor x = f64({0.5, -1.0, 1.5}, {3}).requires_grad_(true);
  const Tensor g = autograd::grad({sum(Cube::apply(x))}, {x}, {}, std::nullopt, true)[0];
  REQUIRE(g.requires_grad());
  CHECK(autograd::grad({sum(g)}, {x})[0].to_vector<double>() ==
        std::vector<double>{3.0, -6.0, 9.0});  // 6 x
  Generator gen(4);
  Tensor z = uniform({4}, -1, 1, TensorOptions(kFloat64), &gen).requires_grad_(true);
  const auto fn_cube = [](const std::vector<Tensor>& in) { return Cube::apply(in[0]); };
  const auto fn_exp = [](const std::vector<Tensor>& in) { return Exp::apply(in[0]); };
  const auto fn_mul = [](const std::vector<Tensor>& in) { return Mul2::apply(in[0], in[1]); };
  auto r1 = autograd::gradgradcheck(fn_cube, {z});
  CHECK_MESSAGE(r1.ok, r1.message);
  auto r2 = autograd::gradgradcheck(fn_exp, {z});  // the saved output gets the node as grad_fn
  CHECK_MESSAGE(r2.ok, r2.message);
  Tensor w = uniform({4}, -1, 1, TensorOptions(kFloat64), &gen).requires_grad_(true);
  auto r3 = autograd::gradgradcheck(fn_mul, {z, w});
  CHECK_MESSAGE(r3.ok, r3.message);
}
