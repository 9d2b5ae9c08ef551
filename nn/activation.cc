#include "nn/activation.h"

#include "autograd/ops.h"

namespace accel::nn {

namespace {
// ", inplace=true" when set, as torch's repr (Note [in-place activations] for what it does).
std::string inplace_repr(bool inplace) { return inplace ? "inplace=true" : ""; }
std::string join_repr(std::string a, bool inplace) { return inplace ? a + ", inplace=true" : a; }
// inplace: x itself, overwritten by in_place (the in-place op); else out_of_place(x).
template <typename InPlace, typename OutOfPlace>
Tensor run(const Tensor& x, bool inplace, InPlace&& in_place, OutOfPlace&& out_of_place) {
  if (!inplace) return out_of_place(x);
  Tensor y = x;  // the caller's impl: its values and history change, as torch's inplace=True
  in_place(y);
  return y;
}
}  // namespace

Tensor ReLU::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { relu_(y); }, [](const Tensor& v) { return relu(v); });
}
std::string ReLU::extra_repr() const { return inplace_repr(inplace); }

Tensor ReLU6::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { relu6_(y); }, [](const Tensor& v) { return relu6(v); });
}
std::string ReLU6::extra_repr() const { return inplace_repr(inplace); }

Tensor SELU::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { selu_(y); }, [](const Tensor& v) { return selu(v); });
}
std::string SELU::extra_repr() const { return inplace_repr(inplace); }

Tensor Hardsigmoid::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { hardsigmoid_(y); },
      [](const Tensor& v) { return hardsigmoid(v); });
}
std::string Hardsigmoid::extra_repr() const { return inplace_repr(inplace); }

Tensor Hardswish::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { hardswish_(y); }, [](const Tensor& v) { return hardswish(v); });
}
std::string Hardswish::extra_repr() const { return inplace_repr(inplace); }

Hardtanh::Hardtanh(double lo, double hi, bool inplace_)
    : min_val(lo), max_val(hi), inplace(inplace_) {
  ACCEL_CHECK(hi >= lo, ValueError, "Hardtanh", "max_val (", hi,
              ") must be greater than or equal to min_val (", lo, ")");
}
Tensor Hardtanh::forward(const Tensor& x) {
  return run(
      x, inplace, [&](Tensor& y) { hardtanh_(y, min_val, max_val); },
      [&](const Tensor& v) { return hardtanh(v, min_val, max_val); });
}
std::string Hardtanh::extra_repr() const {
  return join_repr("min_val=" + std::to_string(min_val) + ", max_val=" + std::to_string(max_val),
                   inplace);
}

CELU::CELU(double a, bool inplace_) : alpha(a), inplace(inplace_) {
  ACCEL_CHECK(a != 0.0, ValueError, "CELU", "alpha must not be zero");
}
Tensor CELU::forward(const Tensor& x) {
  return run(
      x, inplace, [&](Tensor& y) { celu_(y, alpha); },
      [&](const Tensor& v) { return celu(v, alpha); });
}
std::string CELU::extra_repr() const {
  return join_repr("alpha=" + std::to_string(alpha), inplace);
}

Tensor Threshold::forward(const Tensor& x) {
  return run(
      x, inplace, [&](Tensor& y) { threshold_(y, threshold, value); },
      [&](const Tensor& v) { return accel::threshold(v, threshold, value); });
}
std::string Threshold::extra_repr() const {
  return join_repr("threshold=" + std::to_string(threshold) + ", value=" + std::to_string(value),
                   inplace);
}

GELU::GELU(std::string approx) : approximate(std::move(approx)) {
  ACCEL_CHECK(approximate == "none" || approximate == "tanh", ValueError, "GELU",
              "approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
}
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate.c_str()); }
std::string GELU::extra_repr() const {
  return approximate == "none" ? "" : "approximate='" + approximate + "'";
}

Tensor SiLU::forward(const Tensor& x) {
  return run(
      x, inplace, [](Tensor& y) { silu_(y); }, [](const Tensor& v) { return silu(v); });
}
std::string SiLU::extra_repr() const { return inplace_repr(inplace); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim, end_dim); }
std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

Tensor LeakyReLU::forward(const Tensor& x) {
  return run(
      x, inplace, [&](Tensor& y) { leaky_relu_(y, negative_slope); },
      [&](const Tensor& v) { return leaky_relu(v, negative_slope); });
}
std::string LeakyReLU::extra_repr() const {
  return join_repr("negative_slope=" + std::to_string(negative_slope), inplace);
}
Tensor ELU::forward(const Tensor& x) {
  return run(
      x, inplace, [&](Tensor& y) { elu_(y, alpha); },
      [&](const Tensor& v) { return elu(v, alpha); });
}
std::string ELU::extra_repr() const { return join_repr("alpha=" + std::to_string(alpha), inplace); }
Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }
std::string Softmax::extra_repr() const { return "dim=" + std::to_string(dim); }
Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim); }
std::string LogSoftmax::extra_repr() const { return "dim=" + std::to_string(dim); }

}  // namespace accel::nn
