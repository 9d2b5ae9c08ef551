// nn::init (torch.nn.init): statistics of every random initialiser with fixed seeds and generous
// bounds, orthogonality of orthogonal_, the truncated normal's moments (closed form), gains and
// fans, the generator argument, leaves that require grad, deferred tensors, errors.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "accel.h"

using namespace accel;
namespace init = accel::nn::init;

namespace {

struct Moments {
  double mean = 0, std = 0, lo = 0, hi = 0;
};

Moments moments(const Tensor& t) {
  const std::vector<double> v = t.to(kFloat64).contiguous().to_vector<double>();
  Moments m;
  m.lo = m.hi = v[0];
  for (double x : v) {
    m.mean += x;
    m.lo = std::min(m.lo, x);
    m.hi = std::max(m.hi, x);
  }
  m.mean /= double(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / double(v.size()));
  return m;
}

double phi(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
double cdf(double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST_CASE("init: uniform_, normal_, constant_, ones_, zeros_, eye_") {
  Generator gen(1);
  Tensor t = empty({200, 100});
  init::uniform_(t, -2.0, 3.0, &gen);
  Moments m = moments(t);
  CHECK(m.lo >= -2.0);
  CHECK(m.hi <= 3.0);
  CHECK(m.mean == doctest::Approx(0.5).epsilon(0.05));
  CHECK(m.std == doctest::Approx(5.0 / std::sqrt(12.0)).epsilon(0.03));
  init::normal_(t, 1.5, 0.25, &gen);
  m = moments(t);
  CHECK(m.mean == doctest::Approx(1.5).epsilon(0.01));
  CHECK(m.std == doctest::Approx(0.25).epsilon(0.03));
  init::constant_(t, 0.75);
  CHECK(moments(t).lo == 0.75);
  CHECK(moments(t).hi == 0.75);
  init::ones_(t);
  CHECK(moments(t).lo == 1.0);
  init::zeros_(t);
  CHECK(moments(t).hi == 0.0);
  Tensor e = full({3, 5}, 7.0);
  init::eye_(e);
  const std::vector<double> ev = e.tolist();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) CHECK(ev[size_t(i * 5 + j)] == (i == j ? 1.0 : 0.0));
  CHECK_THROWS_AS(init::eye_(zeros({2, 2, 2})), ShapeError);
}

TEST_CASE("init: the generator argument decides the values; null uses the default generator") {
  Tensor x = empty({64, 32}), y = empty({64, 32});
  using Fn = void (*)(Tensor, Generator*);
  const Fn fns[] = {[](Tensor t, Generator* g) {
                      init::kaiming_uniform_(t, 0.0, init::FanMode::FanIn, "relu", g);
                    },
                    [](Tensor t, Generator* g) { init::xavier_normal_(t, 1.0, g); },
                    [](Tensor t, Generator* g) { init::trunc_normal_(t, 0.0, 1.0, -2.0, 2.0, g); },
                    [](Tensor t, Generator* g) { init::orthogonal_(t, 1.0, g); }};
  for (Fn fn : fns) {
    Generator a(42), b(42);
    fn(x, &a);
    fn(y, &b);
    CHECK(equal(x, y));
    fn(y, &b);
    CHECK(!equal(x, y));  // the stream moved on
  }
  manual_seed(9);
  init::orthogonal_(x);
  manual_seed(9);
  init::orthogonal_(y);
  CHECK(equal(x, y));
}

TEST_CASE("init: kaiming and xavier stds, bounds, modes, nonlinearities") {
  Generator gen(7);
  // A conv weight (out 64, in 32, 3 x 3): fan_in 288, fan_out 576.
  Tensor w = empty({64, 32, 3, 3});
  init::kaiming_uniform_(w, 0.0, init::FanMode::FanIn, "relu", &gen);
  Moments m = moments(w);
  const double std_in = std::sqrt(2.0) / std::sqrt(288.0);
  CHECK(m.hi <= std::sqrt(3.0) * std_in);
  CHECK(m.lo >= -std::sqrt(3.0) * std_in);
  CHECK(m.std == doctest::Approx(std_in).epsilon(0.03));
  init::kaiming_normal_(w, 0.0, init::FanMode::FanOut, "relu", &gen);
  CHECK(moments(w).std == doctest::Approx(std::sqrt(2.0) / std::sqrt(576.0)).epsilon(0.03));
  // leaky_relu with slope a = 0.2: gain sqrt(2 / 1.04).
  init::kaiming_normal_(w, 0.2, init::FanMode::FanIn, "leaky_relu", &gen);
  CHECK(moments(w).std == doctest::Approx(std::sqrt(2.0 / 1.04) / std::sqrt(288.0)).epsilon(0.03));
  // Linear's default, a = sqrt(5): bound 1 / sqrt(fan_in).
  Tensor lin = empty({300, 50});
  init::kaiming_uniform_(lin, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", &gen);
  m = moments(lin);
  CHECK(m.hi <= 1.0 / std::sqrt(50.0));
  CHECK(m.hi > 0.95 / std::sqrt(50.0));
  init::xavier_uniform_(lin, 2.0, &gen);
  m = moments(lin);
  const double b = 2.0 * std::sqrt(6.0 / 350.0);
  CHECK(m.hi <= b);
  CHECK(m.lo >= -b);
  CHECK(m.std == doctest::Approx(b / std::sqrt(3.0)).epsilon(0.03));
  init::xavier_normal_(lin, 0.5, &gen);
  CHECK(moments(lin).std == doctest::Approx(0.5 * std::sqrt(2.0 / 350.0)).epsilon(0.03));
  // Zero-element tensors are a no-op, as torch.
  CHECK_NOTHROW(init::kaiming_uniform_(empty({0, 3})));
}

TEST_CASE("init: calculate_gain and fans as torch.nn.init") {
  CHECK(init::calculate_gain("linear") == 1.0);
  CHECK(init::calculate_gain("conv_transpose2d") == 1.0);
  CHECK(init::calculate_gain("sigmoid") == 1.0);
  CHECK(init::calculate_gain("tanh") == doctest::Approx(5.0 / 3.0));
  CHECK(init::calculate_gain("relu") == doctest::Approx(std::sqrt(2.0)));
  CHECK(init::calculate_gain("selu") == 0.75);
  CHECK(init::calculate_gain("leaky_relu") == doctest::Approx(std::sqrt(2.0 / (1 + 1e-4))));
  CHECK(init::calculate_gain("leaky_relu", 0.0) == doctest::Approx(std::sqrt(2.0)));
  // A negative slope is a slope, not "use the default" (it was before).
  CHECK(init::calculate_gain("leaky_relu", -0.5) == doctest::Approx(std::sqrt(2.0 / 1.25)));
  auto [fi, fo] = init::calculate_fan_in_and_fan_out(empty({8, 4, 5}));  // conv1d (out, in, k)
  CHECK(fi == 20);
  CHECK(fo == 40);
}

TEST_CASE("init: trunc_normal_ matches the truncated normal's moments and stays in [a, b]") {
  Generator gen(11);
  struct Case {
    double mean, std, a, b;
  };
  for (const Case& c : {Case{0.0, 1.0, -2.0, 2.0}, Case{0.0, 1.0, 0.0, 3.0},
                        Case{1.0, 0.02, 0.97, 1.1}, Case{0.0, 1.0, 3.0, 5.0}}) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    Tensor t = empty({400, 250});
    init::trunc_normal_(t, c.mean, c.std, c.a, c.b, &gen);
    const Moments m = moments(t);
    CHECK(m.lo >= c.a);
    CHECK(m.hi <= c.b);
    // Closed form: with al, be standardised and Z = cdf(be) - cdf(al),
    // mean = mu + s (phi(al) - phi(be)) / Z, var = s^2 (1 + (al phi(al) - be phi(be)) / Z -
    // ((phi(al) - phi(be)) / Z)^2).
    const double al = (c.a - c.mean) / c.std, be = (c.b - c.mean) / c.std;
    const double z = cdf(be) - cdf(al);
    const double r = (phi(al) - phi(be)) / z;
    const double want_mean = c.mean + c.std * r;
    const double want_std = c.std * std::sqrt(1.0 + (al * phi(al) - be * phi(be)) / z - r * r);
    CHECK(std::abs(m.mean - want_mean) < 0.02 * want_std + 1e-6);
    CHECK(m.std == doctest::Approx(want_std).epsilon(0.02));
  }
  CHECK_THROWS_AS(init::trunc_normal_(empty({3}), 0.0, 1.0, 2.0, -2.0), ValueError);
  CHECK_THROWS_AS(init::trunc_normal_(empty({3}), 0.0, 0.0), ValueError);
}

TEST_CASE("init: orthogonal_ gives Q^T Q = I (tall, wide, conv) and scales by gain") {
  Generator gen(5);
  auto gram_error = [](const Tensor& q, double gain) {
    // q (r, c): the smaller Gram matrix is gain^2 I.
    Tensor g = q.size(0) >= q.size(1) ? matmul(q.t(), q) : matmul(q, q.t());
    Tensor id = mul(eye(g.size(0), TensorOptions(kFloat64)), gain * gain);
    return max(abs(sub(g, id))).item();
  };
  Tensor tall = empty({50, 20}, TensorOptions(kFloat64));
  init::orthogonal_(tall, 1.0, &gen);
  CHECK(gram_error(tall, 1.0) < 1e-5);
  Tensor wide = empty({20, 50}, TensorOptions(kFloat64));
  init::orthogonal_(wide, 2.0, &gen);
  CHECK(gram_error(wide, 2.0) < 1e-5);
  // float32 and a conv weight (16, 3, 3, 3) viewed as (16, 27): orthonormal rows.
  Tensor conv = empty({16, 3, 3, 3});
  init::orthogonal_(conv, 1.0, &gen);
  CHECK(gram_error(conv.reshape({16, 27}).to(kFloat64), 1.0) < 1e-5);
  // Square: orthogonal both ways; the sign correction makes Q that of the QR of the normal
  // matrix with R's diagonal positive, so Q^T G is upper triangular with a positive diagonal.
  Generator ga(8), gb(8);
  Tensor sq = empty({6, 6}, TensorOptions(kFloat64));
  init::orthogonal_(sq, 1.0, &ga);
  Tensor g = randn({6, 6}, TensorOptions(kFloat64), &gb);
  Tensor r = matmul(sq.t(), g);
  const std::vector<double> rv = r.tolist();
  for (int i = 0; i < 6; ++i) {
    CHECK(rv[size_t(i * 6 + i)] > 0);
    for (int j = 0; j < i; ++j) CHECK(std::abs(rv[size_t(i * 6 + j)]) < 1e-10);
  }
  CHECK_THROWS_AS(init::orthogonal_(empty({5})), ShapeError);
}

TEST_CASE("init: leaves that require grad are written without history; deferred ones skipped") {
  Generator gen(3);
  Tensor p = zeros({8, 4}).requires_grad_(true);
  init::orthogonal_(p, 1.0, &gen);
  CHECK(p.requires_grad());
  CHECK(p.is_leaf());
  init::trunc_normal_(p, 0.0, 0.02, -0.04, 0.04, &gen);
  init::eye_(p);
  CHECK(p.is_leaf());
  sum(mul(p, p)).backward();  // still a usable leaf
  CHECK(p.grad().defined());
  CHECK_THROWS_AS(init::orthogonal_(zeros({3, 3}, TensorOptions(kInt64))), DTypeError);
  // Under DeferredInit nothing is allocated, and the generator advances as if it were filled.
  std::shared_ptr<nn::Linear> lazy;
  Generator g1(21), g2(21);
  {
    nn::DeferredInit deferred;
    lazy = std::make_shared<nn::Linear>(16, 8);
    init::orthogonal_(lazy->weight, 1.0, &g1);
    init::trunc_normal_(lazy->weight, 0.0, 1.0, -2.0, 2.0, &g1);
  }
  Tensor eager = empty({8, 16});
  init::orthogonal_(eager, 1.0, &g2);
  init::trunc_normal_(eager, 0.0, 1.0, -2.0, 2.0, &g2);
  CHECK(g1.next_double() == g2.next_double());
}
