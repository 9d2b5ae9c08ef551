#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace accel::nn::init {

namespace {

void check_float(const Tensor& t, const char* op) {
  ACCEL_CHECK(t.defined(), ValueError, op, "tensor is undefined");
  ACCEL_CHECK(t.is_floating_point(), DTypeError, op, "expected a floating tensor, got ", t.dtype(),
              " of shape ", t.sizes());
}

// Writes `values` (a CPU tensor of t's shape) into t without recording history.
Tensor assign(Tensor t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
  return t;
}

// A parameter built under nn::DeferredInit (or released by ZeRO-3) has no memory to fill.
bool unallocated(const Tensor& t) { return !t.storage()->allocated(); }

}  // namespace

// Note [value sinks]
// Deferred init keeps only a rank's region of each parameter (issue 37: a model larger than one
// process holds, tensor-parallel and sharded): the caller (parallel/materialize.h) replays a
// module's reset_parameters with each deferred parameter a full-shape tensor without memory and
// binds a sink to it; each elementwise initialiser then draws the whole tensor's values in
// chunks, exactly as eager construction draws them (one generator value per element, in element
// order, the same arithmetic per element), and hands every chunk to the sink, which keeps the
// elements of its region. So the kept values are eager construction's bit for bit while no
// buffer larger than a chunk exists. An initialiser that needs the whole tensor at once
// (orthogonal_'s QR, eye_'s diagonal), one applied to part of the tensor, or code that asks
// whether the tensor has values (and would then write some) cannot stream: it marks the scope
// needs_whole and the caller materialises that module whole instead (still exact: the replay is
// deterministic). Eager tensors never reach any of this: it sits on the unallocated branch.

namespace {
thread_local SinkScope* g_scope = nullptr;  // innermost live scope on this thread
}  // namespace

SinkScope::SinkScope(std::vector<std::pair<Tensor, ValueSink>> sinks) {
  for (auto& [t, sink] : sinks) {
    ACCEL_CHECK(t.defined() && !t.storage()->allocated() && t.is_contiguous() && t.offset() == 0 &&
                    t.nbytes() == t.storage()->nbytes() && sink,
                ValueError, "init.SinkScope",
                "a value sink needs a whole unallocated tensor (nn::deferred_tensor) and a "
                "function, got a tensor of shape ",
                t.defined() ? t.sizes() : Shape{});
    sinks_.push_back({t.storage().get(), std::move(sink)});
  }
  outer_ = g_scope;
  g_scope = this;
}

SinkScope::~SinkScope() { g_scope = outer_; }

SinkScope::Binding* SinkScope::lookup(const Tensor& t) {
  for (Binding& b : sinks_)
    if (b.storage == t.storage().get()) return &b;
  return nullptr;
}

const ValueSink* SinkScope::find(const Tensor& t) {
  for (SinkScope* s = g_scope; s != nullptr; s = s->outer_) {
    Binding* b = s->lookup(t);
    if (b == nullptr) continue;
    if (t.offset() == 0 && t.is_contiguous() && t.nbytes() == t.storage()->nbytes())
      return &b->sink;
    s->needs_whole_ = true;  // a part of the tensor: its element order is not the tensor's
    return nullptr;
  }
  return nullptr;
}

void SinkScope::note_value_needed(const Tensor& t) {
  for (SinkScope* s = g_scope; s != nullptr; s = s->outer_) {
    if (s->lookup(t) == nullptr) continue;
    s->needs_whole_ = true;
    return;
  }
}

namespace {

// Pulls from the generator exactly what filling `t` would (uniform and randn draw one value per
// element, in element order), in chunks so that no parameter-sized buffer is allocated, and
// hands each chunk (after `finish`, the initialiser's arithmetic per element) to the sink bound
// to t (Note [value sinks]) or throws it away. Keeps the generator stream of deferred
// construction equal to eager construction's (Note [deferred init] in nn/module.cc).
void draw_unallocated(const Tensor& t, bool normal, double lo, double hi, Generator* gen,
                      std::optional<DType> uniform_dtype = std::nullopt,
                      const std::function<void(Tensor&)>& finish = {}) {
  const ValueSink* sink = SinkScope::find(t);
  for (int64_t done = 0; done < t.numel(); done += kSinkChunk) {
    const int64_t n = std::min(kSinkChunk, t.numel() - done);
    Tensor v = normal ? randn({n}, TensorOptions(kFloat64), gen)
                      : uniform({n}, lo, hi, TensorOptions(uniform_dtype.value_or(t.dtype())), gen);
    if (sink == nullptr) continue;
    if (finish) finish(v);
    (*sink)(done, v);
  }
}

double fan(const Tensor& t, FanMode mode, const char* op) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t f = mode == FanMode::FanIn ? fan_in : fan_out;
  ACCEL_CHECK(f > 0, ValueError, op, "fan is zero for a tensor of shape ", t.sizes());
  return double(f);
}

}  // namespace

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  ACCEL_CHECK(t.defined() && t.dim() >= 2, ShapeError, "calculate_fan_in_and_fan_out",
              "fan in and fan out need a tensor with at least 2 dims, got shape ",
              t.defined() ? t.sizes() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const char* nonlinearity, std::optional<double> param) {
  const std::string n = nonlinearity;
  if (n == "linear" || n == "conv1d" || n == "conv2d" || n == "conv3d" || n == "conv_transpose1d" ||
      n == "conv_transpose2d" || n == "conv_transpose3d" || n == "sigmoid")
    return 1.0;
  if (n == "tanh") return 5.0 / 3.0;
  if (n == "relu") return std::sqrt(2.0);
  if (n == "leaky_relu") {
    ACCEL_CHECK(!param || std::isfinite(*param), ValueError, "calculate_gain", "negative_slope ",
                *param, " is not a valid number");
    const double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (n == "selu") return 3.0 / 4.0;
  ACCEL_THROW(ValueError, "calculate_gain", "unsupported nonlinearity '", n, "'");
}

Tensor uniform_(Tensor t, double lo, double hi, Generator* gen) {
  check_float(t, "init.uniform_");
  ACCEL_CHECK(lo <= hi, ValueError, "init.uniform_", "lo ", lo, " > hi ", hi);
  if (unallocated(t)) {
    draw_unallocated(t, /*normal=*/false, lo, hi, gen);
    return t;
  }
  return assign(t, uniform(t.sizes(), lo, hi, TensorOptions(t.dtype()), gen));
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  check_float(t, "init.normal_");
  ACCEL_CHECK(std >= 0, ValueError, "init.normal_", "std must be >= 0, got ", std);
  // Draw in float64 so the values do not depend on t's precision before the final rounding.
  auto scale = [&](Tensor& v) {
    if (std == 1.0 && mean == 0.0) return;
    double* p = v.data<double>();
    for (int64_t i = 0; i < v.numel(); ++i) p[i] = mean + std * p[i];
  };
  if (unallocated(t)) {
    draw_unallocated(t, /*normal=*/true, 0.0, 1.0, gen, std::nullopt, scale);
    return t;
  }
  Tensor v = randn(t.sizes(), TensorOptions(kFloat64), gen);
  scale(v);
  return assign(t, v);
}

Tensor constant_(Tensor t, Scalar value) {
  ACCEL_CHECK(t.defined(), ValueError, "init.constant_", "tensor is undefined");
  if (unallocated(t)) {
    if (const ValueSink* sink = SinkScope::find(t)) {
      NoGradGuard no_grad;
      for (int64_t done = 0; done < t.numel(); done += kSinkChunk) {
        Tensor v = empty({std::min(kSinkChunk, t.numel() - done)}, TensorOptions(t.dtype()));
        v.fill_(value);
        (*sink)(done, v);
      }
    }
    return t;
  }
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor zeros_(Tensor t) { return constant_(std::move(t), 0); }
Tensor ones_(Tensor t) { return constant_(std::move(t), 1); }

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, const char* nonlinearity,
                        Generator* gen) {
  check_float(t, "init.kaiming_uniform_");
  if (t.numel() == 0) return t;  // torch: a no-op (with a warning)
  const double std =
      calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode, "init.kaiming_uniform_"));
  const double bound = std::sqrt(3.0) * std;  // uniform(-b, b) has std b / sqrt(3)
  return uniform_(std::move(t), -bound, bound, gen);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, const char* nonlinearity, Generator* gen) {
  check_float(t, "init.kaiming_normal_");
  if (t.numel() == 0) return t;
  const double std =
      calculate_gain(nonlinearity, a) / std::sqrt(fan(t, mode, "init.kaiming_normal_"));
  return normal_(std::move(t), 0.0, std, gen);
}

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  check_float(t, "init.xavier_uniform_");
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / double(fi + fo));
  return uniform_(std::move(t), -bound, bound, gen);
}

Tensor xavier_normal_(Tensor t, double gain, Generator* gen) {
  check_float(t, "init.xavier_normal_");
  auto [fi, fo] = calculate_fan_in_and_fan_out(t);
  return normal_(std::move(t), 0.0, gain * std::sqrt(2.0 / double(fi + fo)), gen);
}

Tensor eye_(Tensor t) {
  check_float(t, "init.eye_");
  ACCEL_CHECK(t.dim() == 2, ShapeError, "init.eye_",
              "only tensors with 2 dims are supported, got shape ", t.sizes());
  if (unallocated(t)) {
    SinkScope::note_value_needed(t);  // the diagonal is not a stream: Note [value sinks]
    return t;
  }
  Tensor v = zeros(t.sizes(), TensorOptions(kFloat64));
  double* p = v.data<double>();
  for (int64_t i = 0; i < std::min(t.size(0), t.size(1)); ++i) p[i * t.size(1) + i] = 1.0;
  return assign(t, v);
}

namespace {

// erf^-1 on [-1, 1] (+-inf at the ends): Giles' single-precision approximation ("Approximating
// the erfinv function", GPU Computing Gems, 2011) refined by Newton steps on erf to double.
double erfinv(double y) {
  if (y <= -1.0) return -std::numeric_limits<double>::infinity();
  if (y >= 1.0) return std::numeric_limits<double>::infinity();
  double w = -std::log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941})
      p = c + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682})
      p = c + p * w;
  }
  double x = p * y;
  const double two_over_sqrt_pi = 2.0 / std::sqrt(M_PI);
  for (int it = 0; it < 3; ++it) {
    const double d = two_over_sqrt_pi * std::exp(-x * x);
    if (d == 0.0) break;  // far tail: the approximation is as good as it gets
    x -= (std::erf(x) - y) / d;
  }
  return x;
}

double norm_cdf(double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

Tensor trunc_normal_(Tensor t, double mean, double std, double a, double b, Generator* gen) {
  const char* op = "init.trunc_normal_";
  check_float(t, op);
  ACCEL_CHECK(std > 0.0 && std::isfinite(std), ValueError, op, "std must be > 0, got ", std,
              " (shape ", t.sizes(), ")");
  ACCEL_CHECK(a < b, ValueError, op, "a ", a, " must be below b ", b, " (shape ", t.sizes(), ")");
  // As torch: u uniform in [2 cdf(a') - 1, 2 cdf(b') - 1] (a', b' standardised), then
  // mean + std sqrt(2) erfinv(u), clamped to [a, b] against rounding at the ends.
  const double lo = 2.0 * norm_cdf((a - mean) / std) - 1.0;
  const double hi = 2.0 * norm_cdf((b - mean) / std) - 1.0;
  auto transform = [&](Tensor& v) {
    double* p = v.data<double>();
    for (int64_t i = 0; i < v.numel(); ++i)
      p[i] = std::clamp(mean + std * std::sqrt(2.0) * erfinv(p[i]), a, b);
  };
  if (unallocated(t)) {
    draw_unallocated(t, /*normal=*/false, lo, hi, gen, kFloat64, transform);
    return t;
  }
  Tensor v = uniform(t.sizes(), lo, hi, TensorOptions(kFloat64), gen);
  transform(v);
  return assign(t, v);
}

Tensor orthogonal_(Tensor t, double gain, Generator* gen) {
  const char* op = "init.orthogonal_";
  check_float(t, op);
  ACCEL_CHECK(t.dim() >= 2, ShapeError, op,
              "only tensors with 2 or more dims are supported, got shape ", t.sizes());
  if (t.numel() == 0) return t;  // torch: a no-op
  if (unallocated(t)) {
    SinkScope::note_value_needed(t);  // a QR of the whole matrix: Note [value sinks]
    draw_unallocated(t, /*normal=*/true, 0.0, 1.0, gen);
    return t;
  }
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  // The normal (rows, cols) matrix, drawn in row-major order (as torch draws it).
  Tensor g = randn({rows, cols}, TensorOptions(kFloat64), gen);
  // A: (m, n), m >= n: the matrix, or its transpose when rows < cols; column-major columns.
  const bool flip = rows < cols;
  const int64_t m = flip ? cols : rows, n = flip ? rows : cols;
  const double* gp = g.data<double>();
  std::vector<std::vector<double>> q(static_cast<size_t>(n),
                                     std::vector<double>(static_cast<size_t>(m)));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      (flip ? q[size_t(i)][size_t(j)] : q[size_t(j)][size_t(i)]) = gp[i * cols + j];
  // Gram-Schmidt, each column orthogonalised twice against the previous ones ("twice is
  // enough": orthogonal to rounding). It gives the Q of A = QR with R's diagonal positive, which
  // is exactly torch's QR after its sign correction (Q diag(sign(diag R))).
  for (int64_t j = 0; j < n; ++j) {
    std::vector<double>& v = q[size_t(j)];
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k = 0; k < j; ++k) {
        const std::vector<double>& u = q[size_t(k)];
        double dot = 0.0;
        for (int64_t i = 0; i < m; ++i) dot += u[size_t(i)] * v[size_t(i)];
        for (int64_t i = 0; i < m; ++i) v[size_t(i)] -= dot * u[size_t(i)];
      }
    }
    double nrm = 0.0;
    for (double x : v) nrm += x * x;
    nrm = std::sqrt(nrm);
    // A zero column has probability 0 for a normal matrix; torch's sign(0) zeroes it as well.
    for (double& x : v) x = nrm > 0.0 ? x / nrm : 0.0;
  }
  // Back to t's (rows, cols) layout: Q when not flipped, Q^T when flipped, times gain.
  Tensor out = empty({rows, cols}, TensorOptions(kFloat64));
  double* op_ = out.data<double>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      op_[i * cols + j] = gain * (flip ? q[size_t(i)][size_t(j)] : q[size_t(j)][size_t(i)]);
  return assign(t, out.reshape(t.sizes()));
}

}  // namespace accel::nn::init
