#include "autograd/nn/conv.h"

#include <cmath>

#include "autograd/nn/init.h"
#include "autograd/ops.h"

namespace accel::nn {

// Appended piece by piece: `"(" + std::to_string(h)` trips GCC 12's false -Wrestrict on
// operator+(const char*, string&&) (GCC PR 105651).
std::string Size2::str() const {
  std::string s = "(";
  s += std::to_string(h);
  s += ", ";
  s += std::to_string(w);
  s += ")";
  return s;
}

namespace {
void check_positive(const Size2& s, const char* op, const char* what, int64_t min) {
  ACCEL_CHECK(s.h >= min && s.w >= min, ValueError, op, what, " must be >= ", min, ", got ",
              s.str());
}
}  // namespace

// ---------------- Conv2d ----------------

Conv2d::Conv2d(int64_t in, int64_t out, Size2 k, Size2 s, Size2 p, Size2 d, int64_t g,
               bool with_bias, Generator* gen)
    : in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      dilation(d),
      groups(g) {
  ACCEL_CHECK(in > 0 && out > 0, ValueError, "Conv2d", "channels must be positive, got ", in,
              " -> ", out);
  ACCEL_CHECK(g > 0 && in % g == 0 && out % g == 0, ValueError, "Conv2d", "groups (", g,
              ") must divide in_channels (", in, ") and out_channels (", out, ")");
  check_positive(k, "Conv2d", "kernel_size", 1);
  check_positive(s, "Conv2d", "stride", 1);
  check_positive(p, "Conv2d", "padding", 0);
  check_positive(d, "Conv2d", "dilation", 1);
  weight = register_parameter("weight", empty({out, in / g, k.h, k.w}));
  if (with_bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", gen);
  if (bias.defined()) {
    const double fan_in = double(in_channels / groups * kernel_size.h * kernel_size.w);
    const double bound = 1.0 / std::sqrt(fan_in);
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  ACCEL_CHECK(x.defined(), ValueError, "Conv2d", "input is undefined");
  ACCEL_CHECK(x.dim() == 4 && x.size(1) == in_channels, ShapeError, "Conv2d", "expected input (N, ",
              in_channels, ", H, W), got ", x.sizes());
  return conv2d(x, weight, bias, stride.shape(), padding.shape(), dilation.shape(), groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + stride.str();
  if (padding.h || padding.w) s += ", padding=" + padding.str();
  if (dilation.h != 1 || dilation.w != 1) s += ", dilation=" + dilation.str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

// ---------------- pooling ----------------

MaxPool2d::MaxPool2d(Size2 k, std::optional<Size2> s, Size2 p)
    : kernel_size(k), stride(s.value_or(k)), padding(p) {
  check_positive(kernel_size, "MaxPool2d", "kernel_size", 1);
  check_positive(stride, "MaxPool2d", "stride", 1);
  check_positive(padding, "MaxPool2d", "padding", 0);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size.shape(), stride.shape(), padding.shape());
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str();
}

AvgPool2d::AvgPool2d(Size2 k, std::optional<Size2> s, Size2 p, bool include_pad)
    : kernel_size(k), stride(s.value_or(k)), padding(p), count_include_pad(include_pad) {
  check_positive(kernel_size, "AvgPool2d", "kernel_size", 1);
  check_positive(stride, "AvgPool2d", "stride", 1);
  check_positive(padding, "AvgPool2d", "padding", 0);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size.shape(), stride.shape(), padding.shape(), count_include_pad);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str() + (count_include_pad ? "" : ", count_include_pad=false");
}

}  // namespace accel::nn
