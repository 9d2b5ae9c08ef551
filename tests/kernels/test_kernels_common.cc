// kernels/common/: the code the CPU and CUDA kernels share (docs/kernels.md). The activation
// gradients are checked against finite differences of the forward formulas (so a formula and its
// gradient cannot drift apart), the CPU's float policy against libm in double, the geometry and
// accumulation rules against hand-worked cases.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/half.h"
#include "kernels/common/acc_dtype.h"
#include "kernels/common/geometry.h"
#include "kernels/common/optim.h"
#include "kernels/common/scalar_math.h"
#include "kernels/stubs/optim.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/vec_math.h"

using namespace accel;

namespace {

// libm in double: the reference policy.
struct StdMath {
  template <typename A>
  static A exp(A x) {
    return std::exp(x);
  }
  template <typename A>
  static A erf(A x) {
    return std::erf(x);
  }
  template <typename A>
  static A tanh(A x) {
    return std::tanh(x);
  }
  template <typename A>
  static A sqrt(A x) {
    return std::sqrt(x);
  }
};

// Central difference of f at x.
template <typename F>
double fd(F f, double x) {
  const double h = 1e-6;
  return (f(x + h) - f(x - h)) / (2 * h);
}

const double kXs[] = {-6.0, -3.0, -1.5, -0.7, -0.1, 0.0, 0.05, 0.4, 1.0, 2.5, 5.0};

}  // namespace

TEST_CASE("scalar math: each gradient is the derivative of its forward formula") {
  using common::sigmoid;
  for (double x : kXs) {
    INFO("x = ", x);
    const double g = 1.7;
    CHECK(common::gelu_erf_grad<StdMath>(g, x) ==
          doctest::Approx(g * fd([](double v) { return common::gelu_erf<StdMath>(v); }, x))
              .epsilon(1e-7));
    CHECK(common::gelu_tanh_grad<StdMath>(g, x) ==
          doctest::Approx(g * fd([](double v) { return common::gelu_tanh<StdMath>(v); }, x))
              .epsilon(1e-7));
    CHECK(common::silu_grad<StdMath>(g, x) ==
          doctest::Approx(g * fd([](double v) { return common::silu<StdMath>(v); }, x))
              .epsilon(1e-7));
    // sigmoid and tanh take the saved output y.
    CHECK(common::sigmoid_grad(g, sigmoid<StdMath>(x)) ==
          doctest::Approx(g * fd([](double v) { return sigmoid<StdMath>(v); }, x)).epsilon(1e-7));
    CHECK(common::tanh_grad(g, std::tanh(x)) ==
          doctest::Approx(g * fd([](double v) { return std::tanh(v); }, x)).epsilon(1e-7));
    if (x != 0.0) CHECK(common::relu_grad(g, x) == (x > 0 ? g : 0.0));
  }
  // Known values: gelu_erf(1) = Phi(1), gelu_tanh(1) per its definition, silu(1) = sigmoid(1).
  CHECK(common::gelu_erf<StdMath>(1.0) == doctest::Approx(0.8413447460685429).epsilon(1e-15));
  CHECK(common::gelu_tanh<StdMath>(1.0) == doctest::Approx(0.8411919906082768).epsilon(1e-14));
  CHECK(common::silu<StdMath>(1.0) == doctest::Approx(0.7310585786300049).epsilon(1e-15));
}

TEST_CASE("scalar math: the CPU float policy stays within float accuracy of libm") {
  for (double x : kXs) {
    INFO("x = ", x);
    const float xf = float(x);
    const double tol = 2e-6;
    CHECK(double(common::gelu_erf<cpu::CpuMath>(xf)) ==
          doctest::Approx(common::gelu_erf<StdMath>(double(xf))).epsilon(tol).scale(1));
    CHECK(double(common::gelu_erf_grad<cpu::CpuMath>(1.0f, xf)) ==
          doctest::Approx(common::gelu_erf_grad<StdMath>(1.0, double(xf))).epsilon(tol).scale(1));
    CHECK(double(common::silu_grad<cpu::CpuMath>(1.0f, xf)) ==
          doctest::Approx(common::silu_grad<StdMath>(1.0, double(xf))).epsilon(tol).scale(1));
    // Doubles take libm: the same bits as the reference.
    CHECK(common::gelu_erf<cpu::CpuMath>(x) == common::gelu_erf<StdMath>(x));
  }
}

TEST_CASE("scalar math: clamp, sign, relu") {
  CHECK(common::clamp(5.0, -1.0, 2.0) == 2.0);
  CHECK(common::clamp(-5.0, -1.0, 2.0) == -1.0);
  CHECK(common::clamp(0.5f, -1.0f, 2.0f) == 0.5f);
  CHECK(std::isnan(common::clamp(std::nan(""), -1.0, 2.0)));  // NaN stays NaN
  CHECK(common::sign(-3.0) == -1.0);
  CHECK(common::sign(0.0) == 0.0);
  CHECK(common::sign(int64_t(7)) == 1);
  CHECK(common::relu(-2) == 0);
  CHECK(common::relu(2.5) == 2.5);
}

TEST_CASE("row geometry: outer x n x inner around a dim") {
  const Shape s{2, 3, 4};
  auto g = common::row_geometry(s, 1);
  CHECK((g.outer == 2 && g.n == 3 && g.inner == 4));
  g = common::row_geometry(s, 0);
  CHECK((g.outer == 1 && g.n == 2 && g.inner == 12));
  g = common::row_geometry(s, 2);
  CHECK((g.outer == 6 && g.n == 4 && g.inner == 1));
  g = common::row_geometry(Shape{}, 0);  // 0-dim: one row of one element
  CHECK((g.outer == 1 && g.n == 1 && g.inner == 1));
}

TEST_CASE("matmul geometry: size-1 dims dropped, broadcast dims marked, contiguous dims merged") {
  common::MatmulGeometry g;
  // a (2, 3, 4, 5) contiguous @ b (3, 5, 6) padded to (1, 3, 5, 6) -> out (2, 3, 4, 6).
  REQUIRE(common::matmul_geometry(Shape{2, 3, 4, 5}, Shape{60, 20, 5, 1}, Shape{1, 3, 5, 6},
                                  Shape{0, 30, 6, 1}, Shape{2, 3, 4, 6}, Shape{72, 24, 6, 1}, g));
  CHECK((g.m == 4 && g.n == 6 && g.k == 5));
  CHECK(g.nb == 2);  // b broadcasts over dim 0 only: dims 0 and 1 cannot merge
  CHECK((g.a_size[0] == 2 && g.a_stride[0] == 60 && g.b_size[0] == 1 && g.b_stride[0] == 0));
  CHECK((g.a_size[1] == 3 && g.b_size[1] == 3 && g.b_stride[1] == 30 && g.out_stride[1] == 24));
  // Both operands contiguous over (2, 3): one merged batch dim of 6; a transposed b is col-major.
  REQUIRE(common::matmul_geometry(Shape{2, 3, 4, 5}, Shape{60, 20, 5, 1}, Shape{2, 3, 5, 6},
                                  Shape{90, 30, 1, 5}, Shape{2, 3, 4, 6}, Shape{72, 24, 6, 1}, g));
  CHECK((g.nb == 1 && g.out_size[0] == 6 && g.a_stride[0] == 20 && g.b_stride[0] == 30));
  CHECK((g.b.row_stride == 1 && g.b.col_stride == 5));
  // An expanded dim (stride 0, size > 1) counts as broadcast; out's size-1 dims are dropped.
  REQUIRE(common::matmul_geometry(Shape{1, 4, 2, 3}, Shape{6, 0, 3, 1}, Shape{1, 4, 3, 2},
                                  Shape{24, 6, 2, 1}, Shape{1, 4, 2, 2}, Shape{16, 4, 2, 1}, g));
  CHECK((g.nb == 1 && g.a_size[0] == 1 && g.a_stride[0] == 0 && g.b_size[0] == 4));
  // More batch dims than the geometry holds, or a matrix that is neither row- nor column-major.
  Shape many(size_t(common::MatmulGeometry::kMaxBatch + 3), 1);
  CHECK_FALSE(common::matmul_geometry(many, many, many, many, many, many, g));
  CHECK_FALSE(common::matmul_geometry(Shape{4, 5}, Shape{10, 2}, Shape{5, 6}, Shape{6, 1},
                                      Shape{4, 6}, Shape{6, 1}, g));
}

TEST_CASE("accumulation rule: types and dtypes agree") {
  static_assert(std::is_same_v<common::acc_t<Half>, float>);
  static_assert(std::is_same_v<common::acc_t<BFloat16>, float>);
  static_assert(std::is_same_v<common::acc_t<float>, float>);
  static_assert(std::is_same_v<common::acc_t<double>, double>);
  static_assert(std::is_same_v<common::acc_t<int32_t>, int32_t>);
  static_assert(std::is_same_v<common::sum_acc_t<Half>, float>);
  static_assert(std::is_same_v<common::sum_acc_t<double>, double>);
  static_assert(std::is_same_v<common::sum_acc_t<uint8_t>, int64_t>);
  static_assert(std::is_same_v<common::sum_acc_t<bool>, int64_t>);
  CHECK(acc_dtype(kFloat16) == kFloat32);
  CHECK(acc_dtype(kBFloat16) == kFloat32);
  CHECK(acc_dtype(kFloat32) == kFloat32);
  CHECK(acc_dtype(kFloat64) == kFloat64);
  CHECK(acc_dtype(kInt64) == kInt64);
  CHECK(sum_acc_dtype(kBFloat16) == kFloat32);
  CHECK(sum_acc_dtype(kFloat64) == kFloat64);
  CHECK(sum_acc_dtype(kInt32) == kInt64);
  CHECK(sum_acc_dtype(kBool) == kInt64);
}

TEST_CASE("adam update: the first step moves by lr against the gradient's sign") {
  AdamStepParams hp;
  hp.lr = 0.1, hp.eps = 0.0, hp.weight_decay = 0.01;
  hp.bias_correction1 = 1 - hp.beta1, hp.bias_correction2 = 1 - hp.beta2;  // step 1
  const common::AdamCoeffs<double> c(common::adam_scalars(hp));
  double p = 1.0, m = 0.0, v = 0.0;
  common::adam_update<StdMath>(p, 0.5, m, v, c);
  CHECK(m == doctest::Approx(0.05));
  CHECK(v == doctest::Approx(0.00025));
  CHECK(p == doctest::Approx(1.0 * (1 - 0.1 * 0.01) - 0.1));  // decay, then lr * sign(g)
  hp.decoupled = false;  // Adam: weight decay joins the gradient instead
  const common::AdamCoeffs<double> c2(common::adam_scalars(hp));
  p = 1.0, m = 0.0, v = 0.0;
  common::adam_update<StdMath>(p, -0.5, m, v, c2);
  CHECK(p == doctest::Approx(1.1));  // g + wd * p = -0.49 < 0: one lr step up
}
