// The op table's registry, input maker, runner and comparison (see op_table.h).
#include "op_table.h"

#include <cmath>
#include <sstream>

#include "core/generator.h"

namespace accel::optable {

Tol Tolerances::for_dtype(DType t) const {
  switch (t) {
    case DType::Float64: return f64;
    case DType::Float32: return f32;
    case DType::Float16: return f16;
    case DType::BFloat16: return bf16;
    default: return {0, 0};  // integers and bool: exact
  }
}

Tolerances Tolerances::scaled(double f) const {
  auto s = [f](Tol t) { return Tol{t.atol * f, t.rtol * f}; };
  return {s(f64), s(f32), s(f16), s(bf16)};
}

const std::vector<DType>& floating_dtypes() {
  static const std::vector<DType> d{kFloat32, kFloat64, kFloat16, kBFloat16};
  return d;
}

// ---- Maker ----

Maker::Maker(DType dtype, Device device, uint64_t seed, DType compute)
    : dtype_(dtype), compute_(compute), device_(device), gen_(seed) {}

Tensor Maker::finish(Tensor f64, bool grad) {
  Tensor t;
  {
    NoGradGuard ng;
    t = f64.to(dtype_);  // round to the case dtype first: every device sees the same values
    if (compute_ != dtype_) t = t.to(compute_);
    t = t.to(device_).detach();
  }
  if (grad && is_floating(t.dtype())) t.requires_grad_(true);
  return t;
}

Tensor Maker::rnd(const Shape& shape, double lo, double hi) {
  Tensor u = uniform(shape, lo, hi, TensorOptions(kFloat64), &gen_);
  if (!is_floating(dtype_)) {
    std::vector<double> v = u.to_vector<double>();
    for (double& e : v) e = std::floor(e);
    u = tensor(v, shape);
  }
  return finish(u, true);
}

Tensor Maker::rnd_const(const Shape& shape, double lo, double hi) {
  return rnd(shape, lo, hi).detach();
}

Tensor Maker::values(const std::vector<double>& v, const Shape& shape, bool grad) {
  return finish(tensor(v, shape), grad);
}

Tensor Maker::rnd_int(const Shape& shape, int64_t lo, int64_t hi) {
  return finish(randint(lo, hi + 1, shape, TensorOptions(kInt64), &gen_).to(kFloat64), false);
}

Tensor Maker::perm(int64_t n, const Shape& shape) {
  return finish(randperm(n, &gen_).to(kFloat64).reshape(shape), true);
}

Tensor Maker::idx(const std::vector<int64_t>& v, const Shape& shape, DType t) {
  return tensor(v, shape).to(t).to(device_);
}

Tensor Maker::rnd_idx(int64_t lo, int64_t hi, const Shape& shape, DType t) {
  return randint(lo, hi, shape, TensorOptions(kInt64), &gen_).to(t).to(device_);
}

Tensor Maker::mask(const std::vector<int>& v, const Shape& shape) {
  std::vector<int64_t> w(v.begin(), v.end());
  return ne(tensor(w, shape), Scalar(int64_t(0))).to(device_);
}

// ---- registry ----

OpCase& Table::add(std::string op, std::string label, MakeFn make, OpFn fn) {
  OpCase c;
  c.op = std::move(op);
  c.label = std::move(label);
  c.make = std::move(make);
  c.fn = std::move(fn);
  cases_.push_back(std::move(c));
  return cases_.back();
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> all = [] {
    Table t;
    detail::add_elementwise_cases(t);
    detail::add_views_cases(t);
    detail::add_reduce_cases(t);
    detail::add_linalg_cases(t);
    detail::add_conv_cases(t);
    detail::add_nn_cases(t);
    detail::add_index_cases(t);
    detail::add_join_cases(t);
    detail::add_optim_cases(t);
    detail::add_indexing_cases(t);
    detail::add_inplace_cases(t);
    detail::add_losses_cases(t);
    detail::add_image_cases(t);
    return t.cases();
  }();
  return all;
}

std::string dims_str(const Shape& s) {
  std::ostringstream os;
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "x" : "") << s[i];
  return os.str();
}

uint64_t case_seed(const OpCase& c) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and compilers
  for (char ch : c.name()) h = (h ^ uint64_t(uint8_t(ch))) * 1099511628211ull;
  return h;
}

// ---- running and comparing ----

RunResult run_case(const OpCase& c, Maker& m, bool backward) {
  In in = c.make(m);
  Tensor out = c.fn(in);
  RunResult r;
  {
    NoGradGuard ng;
    r.out = out.detach().to(kCPU);
  }
  if (!backward || !c.differentiable || !is_floating(out.dtype()) || !out.requires_grad()) return r;
  // The cotangent: fixed random values, rounded to the case dtype like the inputs.
  Generator g(case_seed(c) ^ 0x9e3779b97f4a7c15ull);
  Tensor cot;
  {
    NoGradGuard ng;
    cot =
        uniform(out.sizes(), -1.0, 1.0, TensorOptions(kFloat64), &g).to(m.dtype()).to(out.dtype());
    cot = cot.to(out.device());
  }
  out.backward(cot);
  for (const Tensor& t : in) {
    if (!t.defined() || !is_floating(t.dtype()) || !t.requires_grad()) continue;
    Tensor gr = t.grad();
    r.grads.push_back(gr.defined() ? gr.to(kCPU) : Tensor());
  }
  return r;
}

Compare compare(const Tensor& got, const Tensor& want, Tol tol) {
  Compare c;
  if (got.defined() != want.defined()) {
    c.ok = false;
    c.why = got.defined() ? "reference has no result" : "no result";
    return c;
  }
  if (!got.defined()) return c;
  if (got.sizes() != want.sizes()) {
    std::ostringstream os;
    os << "shape " << got.sizes() << " vs reference " << want.sizes();
    c.ok = false;
    c.why = os.str();
    return c;
  }
  const std::vector<double> g = got.to(kCPU).to_vector<double>();
  const std::vector<double> w = want.to(kCPU).to_vector<double>();
  size_t bad_nonfinite = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) || std::isinf(w[i])) {
      const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i];
      if (!same) ++bad_nonfinite;
      continue;
    }
    const double err = std::isnan(g[i]) ? INFINITY : std::abs(g[i] - w[i]);
    c.max_abs = std::max(c.max_abs, err);
    if (w[i] != 0) c.max_rel = std::max(c.max_rel, err / std::abs(w[i]));
    if (!(err <= tol.atol + tol.rtol * std::abs(w[i]))) c.ok = false;
  }
  if (bad_nonfinite) {
    c.ok = false;
    c.why = std::to_string(bad_nonfinite) + " non-finite reference elements differ";
  }
  return c;
}

}  // namespace accel::optable
