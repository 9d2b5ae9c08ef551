#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"
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

// torch's padding_mode: "zeros" pads inside the convolution; the others pad the input first.
void check_padding_mode(const char* op, const std::string& mode, bool transposed) {
  if (transposed) {
    ACCEL_CHECK(mode == "zeros", ValueError, op,
                "only padding_mode \"zeros\" is supported (as torch), got \"", mode, "\"");
  } else {
    ACCEL_CHECK(mode == "zeros" || mode == "reflect" || mode == "replicate" || mode == "circular",
                ValueError, op,
                "padding_mode must be \"zeros\", \"reflect\", \"replicate\" or \"circular\", "
                "got \"",
                mode, "\"");
  }
}

// in_channels, once padding_mode is checked: the options constructors check it before the
// positional constructor they delegate to draws the initial weights.
int64_t in_after_mode_check(const char* op, const std::string& mode, bool transposed, int64_t in) {
  check_padding_mode(op, mode, transposed);
  return in;
}

// A size given as a braced list (MaxPool2d({2, 2})): one or two numbers.
Size2 size2_of(const char* op, const char* what, std::initializer_list<int64_t> v) {
  ACCEL_CHECK(v.size() == 1 || v.size() == 2, ValueError, op, what,
              " must have 1 or 2 entries, got ", v.size());
  return v.size() == 1 ? Size2(*v.begin()) : Size2(*v.begin(), *(v.begin() + 1));
}

std::string padding_mode_repr(const std::string& mode) {
  return mode == "zeros" ? "" : ", padding_mode=" + mode;
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
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());  // None without
  reset_parameters(gen);
}

Conv2d::Conv2d(const Conv2dFields& o, Generator* gen)
    : Conv2d(in_after_mode_check("Conv2d", o.padding_mode, false, o.in_channels), o.out_channels,
             o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias, gen) {
  padding_mode = o.padding_mode;
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
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, "Conv2d", "input is undefined");
  ACCEL_CHECK(x.dim() == 4 && x.size(1) == in_channels, ShapeError, "Conv2d", "expected input (N, ",
              in_channels, ", H, W), got ", x.sizes());
  if (padding_mode != "zeros") {  // (left, right, top, bottom) = (pw, pw, ph, ph)
    const Tensor xp = pad(x, {padding.w, padding.w, padding.h, padding.h}, padding_mode);
    return conv2d(xp, weight, bias, stride.shape(), {0, 0}, dilation.shape(), groups);
  }
  return conv2d(x, weight, bias, stride.shape(), padding.shape(), dilation.shape(), groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + stride.str();
  if (padding.h || padding.w) s += ", padding=" + padding.str();
  if (dilation.h != 1 || dilation.w != 1) s += ", dilation=" + dilation.str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s + padding_mode_repr(padding_mode);
}

// ---------------- pooling ----------------

MaxPool2d::MaxPool2d(Size2 k, std::optional<Size2> s, Size2 p)
    : kernel_size(k), stride(s.value_or(k)), padding(p) {
  check_positive(kernel_size, "MaxPool2d", "kernel_size", 1);
  check_positive(stride, "MaxPool2d", "stride", 1);
  check_positive(padding, "MaxPool2d", "padding", 0);
}

MaxPool2d::MaxPool2d(const MaxPool2dOptions& o)
    : MaxPool2d(o.kernel_size(), o.stride(), o.padding()) {
  check_positive(o.dilation(), "MaxPool2d", "dilation", 1);
  ACCEL_CHECK(o.dilation().h == 1 && o.dilation().w == 1, ValueError, "MaxPool2d", "dilation ",
              o.dilation().str(), " is not supported (dilated max pooling is not offered)");
  ceil_mode = o.ceil_mode();
}

MaxPool2d::MaxPool2d(std::initializer_list<int64_t> k)
    : MaxPool2d(size2_of("MaxPool2d", "kernel_size", k)) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size.shape(), stride.shape(), padding.shape(), dilation.shape(),
                    ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str() + ", dilation=" + dilation.str() +
         ", ceil_mode=" + (ceil_mode ? "true" : "false");
}

AvgPool2d::AvgPool2d(Size2 k, std::optional<Size2> s, Size2 p, bool include_pad)
    : kernel_size(k), stride(s.value_or(k)), padding(p), count_include_pad(include_pad) {
  check_positive(kernel_size, "AvgPool2d", "kernel_size", 1);
  check_positive(stride, "AvgPool2d", "stride", 1);
  check_positive(padding, "AvgPool2d", "padding", 0);
}

AvgPool2d::AvgPool2d(const AvgPool2dOptions& o)
    : AvgPool2d(o.kernel_size(), o.stride(), o.padding(), o.count_include_pad()) {}

AvgPool2d::AvgPool2d(std::initializer_list<int64_t> k)
    : AvgPool2d(size2_of("AvgPool2d", "kernel_size", k)) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size.shape(), stride.shape(), padding.shape(), count_include_pad);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str() + (count_include_pad ? "" : ", count_include_pad=false");
}

// ---------------- ConvTranspose2d ----------------

namespace {
// torch's _ConvNd.reset_parameters: Kaiming-uniform (a = sqrt(5)) over the weight's own fan_in
// (dim 1 times the kernel), the bias uniform within 1 / sqrt(that fan_in).
void reset_conv_like(Tensor& weight, Tensor& bias, Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, "leaky_relu", gen);
  if (bias.defined()) {
    const double fan_in = double(init::calculate_fan_in_and_fan_out(weight).first);
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0;
    init::uniform_(bias, -bound, bound, gen);
  }
}

void check_channels(const char* op, int64_t in, int64_t out, int64_t g) {
  ACCEL_CHECK(in > 0 && out > 0, ValueError, op, "channels must be positive, got ", in, " -> ",
              out);
  ACCEL_CHECK(g > 0 && in % g == 0 && out % g == 0, ValueError, op, "groups (", g,
              ") must divide in_channels (", in, ") and out_channels (", out, ")");
}
}  // namespace

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Size2 k, Size2 s, Size2 p, Size2 op,
                                 int64_t g, bool with_bias, Size2 d, Generator* gen)
    : in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      output_padding(op),
      groups(g),
      dilation(d) {
  const char* name = "ConvTranspose2d";
  check_channels(name, in, out, g);
  check_positive(k, name, "kernel_size", 1);
  check_positive(s, name, "stride", 1);
  check_positive(p, name, "padding", 0);
  check_positive(op, name, "output_padding", 0);
  check_positive(d, name, "dilation", 1);
  ACCEL_CHECK((op.h < s.h || op.h < d.h) && (op.w < s.w || op.w < d.w), ValueError, name,
              "output_padding ", op.str(), " must be smaller than either stride ", s.str(),
              " or dilation ", d.str());
  weight = register_parameter("weight", empty({in, out / g, k.h, k.w}));
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());  // None without
  reset_parameters(gen);
}

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dFields& o, Generator* gen)
    : ConvTranspose2d(in_after_mode_check("ConvTranspose2d", o.padding_mode, true, o.in_channels),
                      o.out_channels, o.kernel_size, o.stride, o.padding, o.output_padding,
                      o.groups, o.bias, o.dilation, gen) {}

void ConvTranspose2d::reset_parameters(Generator* gen) { reset_conv_like(weight, bias, gen); }

Tensor ConvTranspose2d::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined(), ValueError, "ConvTranspose2d", "input is undefined");
  ACCEL_CHECK(
      (x.dim() == 4 && x.size(1) == in_channels) || (x.dim() == 3 && x.size(0) == in_channels),
      ShapeError, "ConvTranspose2d", "expected input (N, ", in_channels, ", H, W) or (",
      in_channels, ", H, W), got ", x.sizes());
  return conv_transpose2d(x, weight, bias, stride.shape(), padding.shape(), output_padding.shape(),
                          groups, dilation.shape());
}

Tensor ConvTranspose2d::forward(const Tensor& x, const Shape& output_size) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  const char* name = "ConvTranspose2d";
  ACCEL_CHECK(x.defined() && x.dim() >= 3, ShapeError, name, "expected input (N, ", in_channels,
              ", H, W), got ", x.defined() ? x.sizes() : Shape{});
  ACCEL_CHECK(output_size.size() == 2 || output_size.size() == 4, ValueError, name,
              "output_size must have 2 (H, W) or 4 (N, C, H, W) entries, got ", output_size);
  const int64_t k[2] = {kernel_size.h, kernel_size.w}, s[2] = {stride.h, stride.w},
                p[2] = {padding.h, padding.w}, d[2] = {dilation.h, dilation.w};
  Shape op;
  for (int i = 0; i < 2; ++i) {
    const int64_t want = output_size[output_size.size() - 2 + size_t(i)];
    const int64_t min_size =
        (x.size(x.dim() - 2 + i) - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + 1;
    const int64_t max_size = min_size + s[i] - 1;
    ACCEL_CHECK(want >= min_size && want <= max_size, ValueError, name, "requested output_size ",
                output_size, " is not reachable from input ", x.sizes(), ": dim ", i,
                " must be in [", min_size, ", ", max_size, "]");
    op.push_back(want - min_size);
  }
  return conv_transpose2d(x, weight, bias, stride.shape(), padding.shape(), op, groups,
                          dilation.shape());
}

std::string ConvTranspose2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + stride.str();
  if (padding.h || padding.w) s += ", padding=" + padding.str();
  if (output_padding.h || output_padding.w) s += ", output_padding=" + output_padding.str();
  if (dilation.h != 1 || dilation.w != 1) s += ", dilation=" + dilation.str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

// ---------------- Conv1d / ConvTranspose1d ----------------

Conv1d::Conv1d(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d, int64_t g,
               bool with_bias, Generator* gen)
    : in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      dilation(d),
      groups(g) {
  check_channels("Conv1d", in, out, g);
  ACCEL_CHECK(k >= 1 && s >= 1 && p >= 0 && d >= 1, ValueError, "Conv1d",
              "kernel_size, stride, dilation must be positive and padding non-negative, got ", k,
              ", ", s, ", ", d, ", ", p);
  weight = register_parameter("weight", empty({out, in / g, k}));
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());  // None without
  reset_parameters(gen);
}

Conv1d::Conv1d(const Conv1dFields& o, Generator* gen)
    : Conv1d(in_after_mode_check("Conv1d", o.padding_mode, false, o.in_channels), o.out_channels,
             o.kernel_size, o.stride, o.padding, o.dilation, o.groups, o.bias, gen) {
  padding_mode = o.padding_mode;
}

void Conv1d::reset_parameters(Generator* gen) { reset_conv_like(weight, bias, gen); }

Tensor Conv1d::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined() && ((x.dim() == 3 && x.size(1) == in_channels) ||
                              (x.dim() == 2 && x.size(0) == in_channels)),
              ShapeError, "Conv1d", "expected input (N, ", in_channels, ", L) or (", in_channels,
              ", L), got ", x.defined() ? x.sizes() : Shape{});
  if (padding_mode != "zeros")
    return conv1d(pad(x, {padding, padding}, padding_mode), weight, bias, stride, 0, dilation,
                  groups);
  return conv1d(x, weight, bias, stride, padding, dilation, groups);
}

std::string Conv1d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + std::to_string(kernel_size) +
                  ", stride=" + std::to_string(stride);
  if (padding) s += ", padding=" + std::to_string(padding);
  if (dilation != 1) s += ", dilation=" + std::to_string(dilation);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s + padding_mode_repr(padding_mode);
}

ConvTranspose1d::ConvTranspose1d(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p,
                                 int64_t op, int64_t g, bool with_bias, int64_t d, Generator* gen)
    : in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      output_padding(op),
      groups(g),
      dilation(d) {
  check_channels("ConvTranspose1d", in, out, g);
  ACCEL_CHECK(k >= 1 && s >= 1 && p >= 0 && d >= 1 && op >= 0, ValueError, "ConvTranspose1d",
              "kernel_size, stride, dilation must be positive and padding, output_padding ",
              "non-negative, got ", k, ", ", s, ", ", d, ", ", p, ", ", op);
  ACCEL_CHECK(op < s || op < d, ValueError, "ConvTranspose1d", "output_padding ", op,
              " must be smaller than either stride ", s, " or dilation ", d);
  weight = register_parameter("weight", empty({in, out / g, k}));
  bias = register_parameter("bias", with_bias ? empty({out}) : Tensor());  // None without
  reset_parameters(gen);
}

ConvTranspose1d::ConvTranspose1d(const ConvTranspose1dFields& o, Generator* gen)
    : ConvTranspose1d(in_after_mode_check("ConvTranspose1d", o.padding_mode, true, o.in_channels),
                      o.out_channels, o.kernel_size, o.stride, o.padding, o.output_padding,
                      o.groups, o.bias, o.dilation, gen) {}

void ConvTranspose1d::reset_parameters(Generator* gen) { reset_conv_like(weight, bias, gen); }

Tensor ConvTranspose1d::forward(const Tensor& x) {
  check_not_bypassed();  // Note [module calls]: an engine may wrap this layer
  ACCEL_CHECK(x.defined() && ((x.dim() == 3 && x.size(1) == in_channels) ||
                              (x.dim() == 2 && x.size(0) == in_channels)),
              ShapeError, "ConvTranspose1d", "expected input (N, ", in_channels, ", L) or (",
              in_channels, ", L), got ", x.defined() ? x.sizes() : Shape{});
  return conv_transpose1d(x, weight, bias, stride, padding, output_padding, groups, dilation);
}

std::string ConvTranspose1d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + std::to_string(kernel_size) +
                  ", stride=" + std::to_string(stride);
  if (padding) s += ", padding=" + std::to_string(padding);
  if (output_padding) s += ", output_padding=" + std::to_string(output_padding);
  if (dilation != 1) s += ", dilation=" + std::to_string(dilation);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

// ---------------- adaptive pooling ----------------

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 o) : output_size(o) {
  check_positive(o, "AdaptiveAvgPool2d", "output_size", 1);
}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return adaptive_avg_pool2d(x, output_size.shape());
}
std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

AdaptiveMaxPool2d::AdaptiveMaxPool2d(Size2 o, bool ri) : output_size(o), return_indices(ri) {
  check_positive(o, "AdaptiveMaxPool2d", "output_size", 1);
}
AdaptiveMaxPool2d::AdaptiveMaxPool2d(std::initializer_list<int64_t> o)
    : AdaptiveMaxPool2d(size2_of("AdaptiveMaxPool2d", "output_size", o)) {}
Tensor AdaptiveMaxPool2d::forward(const Tensor& x) {
  return adaptive_max_pool2d(x, output_size.shape());
}
std::tuple<Tensor, Tensor> AdaptiveMaxPool2d::forward_with_indices(const Tensor& x) {
  return adaptive_max_pool2d_with_indices(x, output_size.shape());
}
std::string AdaptiveMaxPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

}  // namespace accel::nn
