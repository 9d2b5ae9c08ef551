// Every CUDA kernel against the CPU reference kernel, per dtype, on fresh random inputs.
//
// The stubs are called directly with the same arguments on both devices (so each kernel's
// contract is exercised, not only the paths the op layer happens to take), plus a few end-to-end
// checks through the public ops, including backward. Without a CUDA device the program prints
// why and exits with 77, which meson reports as SKIP. Seed: ACCEL_TEST_SEED, else random (printed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/dispatch.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/stubs/conv.h"
#include "kernels/stubs/index.h"
#include "kernels/stubs/linalg.h"
#include "kernels/stubs/nn.h"
#include "kernels/stubs/optim.h"
#include "kernels/stubs/reduce.h"
#include "core/generator.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/device.h"

using namespace accel;

namespace {

const Device kGPU = Device::cuda(0);

uint64_t g_seed = 0;
Generator& gen() {
  static Generator g(g_seed);
  return g;
}

// ---------------- inputs ----------------

Tensor rnd(const Shape& s, DType dt, double lo = -2.0, double hi = 2.0) {
  if (is_floating(dt)) return uniform(s, lo, hi, TensorOptions(dt), &gen());
  if (dt == kBool) return randint(0, 2, s, TensorOptions(kInt64), &gen()).to(kBool);
  return randint(int64_t(lo), int64_t(hi) + 1, s, TensorOptions(dt), &gen());
}
Tensor gpu(const Tensor& t) { return t.to(kGPU); }
Tensor empty_on(const Shape& s, DType dt, Device d) { return empty(s, TensorOptions(dt, d)); }

// ---------------- comparison ----------------

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::Float64: return {1e-10, 1e-9};
    case DType::Float32: return {1e-5, 1e-4};
    case DType::Float16: return {2e-3, 5e-3};
    case DType::BFloat16: return {1.6e-2, 1.6e-2};
    default: return {0, 0};  // integers and bool: exact
  }
}
Tol scaled(Tol t, double f) { return {t.atol * f, t.rtol * f}; }

// got (CUDA) vs want (CPU): same shape and dtype, |got - want| <= atol + rtol |want| everywhere,
// NaN where the reference has NaN, infinities equal.
void check_close(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  REQUIRE_MESSAGE(got.device().is_cuda(), what);
  REQUIRE_MESSAGE(got.sizes() == want.sizes(), what << ": shape " << got.sizes() << " vs " << want.sizes());
  REQUIRE_MESSAGE(got.dtype() == want.dtype(), what << ": dtype " << got.dtype() << " vs " << want.dtype());
  const std::vector<double> g = got.to(kCPU).to_vector<double>();
  const std::vector<double> w = want.to_vector<double>();
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
    } else if (std::isinf(w[i])) {
      ok = g[i] == w[i];
    } else {
      const double err = std::abs(g[i] - w[i]);
      ok = err <= tol.atol + tol.rtol * std::abs(w[i]);
      worst = std::max(worst, err);
    }
    if (!ok && bad++ == 0) first = i;
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << g.size() << " elements differ; first at " << first
                               << ": cuda " << (g.empty() ? 0 : g[first]) << " cpu " << (w.empty() ? 0 : w[first])
                               << " (worst abs error " << worst << ", seed " << g_seed << ")");
}

std::string name(const char* what, DType dt) {
  std::ostringstream os;
  os << what << " [" << dt << "]";
  return os.str();
}

const DType kFloats[] = {kFloat32, kFloat64, kFloat16, kBFloat16};
const DType kInts[] = {kInt32, kInt64, kUInt8};

// ---------------- elementwise ----------------

struct UnaryCase {
  UnaryOp op;
  const char* name;
  double lo, hi;  // input domain
  double p0 = 0, p1 = 0;
};

const UnaryCase kUnaryFloat[] = {
    {UnaryOp::Neg, "neg", -3, 3},        {UnaryOp::Exp, "exp", -5, 5},
    {UnaryOp::Log, "log", 0.01, 5},      {UnaryOp::Sqrt, "sqrt", 0, 9},
    {UnaryOp::Rsqrt, "rsqrt", 0.1, 9},   {UnaryOp::Abs, "abs", -3, 3},
    {UnaryOp::Tanh, "tanh", -4, 4},      {UnaryOp::Sigmoid, "sigmoid", -8, 8},
    {UnaryOp::Relu, "relu", -3, 3},      {UnaryOp::GeluErf, "gelu_erf", -5, 5},
    {UnaryOp::GeluTanh, "gelu_tanh", -5, 5}, {UnaryOp::Silu, "silu", -6, 6},
    {UnaryOp::Sin, "sin", -6, 6},        {UnaryOp::Cos, "cos", -6, 6},
    {UnaryOp::Sign, "sign", -3, 3},      {UnaryOp::Reciprocal, "reciprocal", 0.2, 4},
    {UnaryOp::Square, "square", -3, 3},  {UnaryOp::Log1p, "log1p", -0.9, 5},
    {UnaryOp::Expm1, "expm1", -3, 3},    {UnaryOp::Erf, "erf", -3, 3},
    {UnaryOp::PowScalar, "pow 2", -3, 3, 2.0}, {UnaryOp::PowScalar, "pow 1.7", 0.1, 3, 1.7},
    {UnaryOp::Clamp, "clamp", -3, 3, -1.0, 0.5}, {UnaryOp::AddScalar, "add_scalar", -3, 3, 0.75},
    {UnaryOp::MulScalar, "mul_scalar", -3, 3, -1.5}, {UnaryOp::RSubScalar, "rsub_scalar", -3, 3, 2.0},
    {UnaryOp::RDivScalar, "rdiv_scalar", 0.3, 3, 1.5},
};

TEST_CASE("unary float ops: contiguous and strided, every float dtype") {
  for (DType dt : kFloats) {
    for (const UnaryCase& c : kUnaryFloat) {
      // (67, 129): odd sizes exercise the vector tails; the transposed view the strided path.
      const Tensor x = rnd({67, 129}, dt, c.lo, c.hi);
      const Tensor xg = gpu(x);
      const UnaryParams p{c.p0, c.p1};
      Tensor want = empty_on(x.sizes(), dt, kCPU), got = empty_on(x.sizes(), dt, kGPU);
      unary_stub(kCPU, c.op, x, want, p);
      unary_stub(kGPU, c.op, xg, got, p);
      check_close(got, want, tol_for(dt), name(c.name, dt));

      const Tensor xt = x.t(), xgt = xg.t();
      Tensor want_t = empty_on(xt.sizes(), dt, kCPU), got_t = empty_on(xt.sizes(), dt, kGPU);
      unary_stub(kCPU, c.op, xt, want_t, p);
      unary_stub(kGPU, c.op, xgt, got_t, p);
      check_close(got_t, want_t, tol_for(dt), name(c.name, dt) + " strided");
    }
    const Tensor x = rnd({1000}, dt);
    Tensor want = empty_on({1000}, kBool, kCPU), got = empty_on({1000}, kBool, kGPU);
    unary_stub(kCPU, UnaryOp::LogicalNot, x, want, UnaryParams{});
    unary_stub(kGPU, UnaryOp::LogicalNot, gpu(x), got, UnaryParams{});
    check_close(got, want, tol_for(kBool), name("logical_not", dt));
  }
}

TEST_CASE("unary integer ops are exact; undefined ones are DTypeErrors") {
  const UnaryCase cases[] = {
      {UnaryOp::Neg, "neg", -50, 50},         {UnaryOp::Abs, "abs", -50, 50},
      {UnaryOp::Sign, "sign", -5, 5},         {UnaryOp::Square, "square", -50, 50},
      {UnaryOp::Relu, "relu", -5, 5},         {UnaryOp::Clamp, "clamp", -10, 10, -3, 4},
      {UnaryOp::AddScalar, "add_scalar", -9, 9, 7}, {UnaryOp::MulScalar, "mul_scalar", -9, 9, 3},
      {UnaryOp::RSubScalar, "rsub_scalar", -9, 9, 5}, {UnaryOp::PowScalar, "pow 3", -9, 9, 3},
  };
  for (DType dt : kInts) {
    for (const UnaryCase& c : cases) {
      const double lo = dt == kUInt8 ? 0 : c.lo;
      const Tensor x = rnd({33, 65}, dt, lo, c.hi);
      Tensor want = empty_on(x.sizes(), dt, kCPU), got = empty_on(x.sizes(), dt, kGPU);
      unary_stub(kCPU, c.op, x, want, UnaryParams{c.p0, c.p1});
      unary_stub(kGPU, c.op, gpu(x), got, UnaryParams{c.p0, c.p1});
      check_close(got, want, tol_for(dt), name(c.name, dt));
    }
  }
  const Tensor xi = gpu(rnd({4}, kInt64, 1, 5));
  Tensor out = empty_on({4}, kInt64, kGPU);
  CHECK_THROWS_AS(unary_stub(kGPU, UnaryOp::Exp, xi, out, UnaryParams{}), DTypeError);
}

struct BinaryCase {
  BinaryOp op;
  const char* name;
  double lo, hi;
  double alpha = 1.0;
};

TEST_CASE("binary float ops: same shape, broadcast, scalar, strided") {
  const BinaryCase cases[] = {
      {BinaryOp::Add, "add", -3, 3},        {BinaryOp::Add, "add alpha", -3, 3, -0.5},
      {BinaryOp::Sub, "sub", -3, 3},        {BinaryOp::Sub, "sub alpha", -3, 3, 2.0},
      {BinaryOp::Mul, "mul", -3, 3},        {BinaryOp::Div, "div", 0.5, 3},
      {BinaryOp::Pow, "pow", 0.2, 2},       {BinaryOp::Maximum, "maximum", -3, 3},
      {BinaryOp::Minimum, "minimum", -3, 3}, {BinaryOp::Eq, "eq", -2, 2},
      {BinaryOp::Ne, "ne", -2, 2},          {BinaryOp::Lt, "lt", -3, 3},
      {BinaryOp::Le, "le", -3, 3},          {BinaryOp::Gt, "gt", -3, 3},
      {BinaryOp::Ge, "ge", -3, 3},          {BinaryOp::LogicalAnd, "logical_and", -1, 1},
      {BinaryOp::LogicalOr, "logical_or", -1, 1}, {BinaryOp::ReluGrad, "relu_grad", -3, 3},
      {BinaryOp::GeluErfGrad, "gelu_erf_grad", -4, 4}, {BinaryOp::GeluTanhGrad, "gelu_tanh_grad", -4, 4},
      {BinaryOp::SiluGrad, "silu_grad", -4, 4}, {BinaryOp::SigmoidGrad, "sigmoid_grad", 0, 1},
      {BinaryOp::TanhGrad, "tanh_grad", -1, 1},
  };
  // (a shape, b shape): same, row broadcast, column broadcast, scalar, rank-extending.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{45, 77}, {45, 77}}, {{45, 77}, {1, 77}}, {{45, 77}, {45, 1}}, {{45, 77}, {1}}, {{3, 45, 7}, {45, 1}}};
  for (DType dt : kFloats) {
    for (const BinaryCase& c : cases) {
      const DType out_t = is_comparison(c.op) ? kBool : dt;
      for (const auto& [sa, sb] : shapes) {
        // Eq/Ne on small integers so that equal elements occur.
        const bool small_ints = c.op == BinaryOp::Eq || c.op == BinaryOp::Ne;
        const Tensor a = small_ints ? rnd(sa, kInt64, -2, 2).to(dt) : rnd(sa, dt, c.lo, c.hi);
        const Tensor b = small_ints ? rnd(sb, kInt64, -2, 2).to(dt) : rnd(sb, dt, c.lo, c.hi);
        const Shape so = broadcast_shapes(sa, sb, "test");
        Tensor want = empty_on(so, out_t, kCPU), got = empty_on(so, out_t, kGPU);
        binary_stub(kCPU, c.op, a, b, want, c.alpha);
        binary_stub(kGPU, c.op, gpu(a), gpu(b), got, c.alpha);
        std::ostringstream what;
        what << c.name << " " << sa << " " << sb;
        check_close(got, want, tol_for(out_t == kBool ? kBool : dt), name(what.str().c_str(), dt));
      }
      // Strided: a transposed view of each operand.
      const Tensor a = rnd({40, 24}, dt, c.lo, c.hi), b = rnd({24, 40}, dt, c.lo, c.hi);
      Tensor want = empty_on({40, 24}, out_t, kCPU), got = empty_on({40, 24}, out_t, kGPU);
      binary_stub(kCPU, c.op, a, b.t(), want, c.alpha);
      binary_stub(kGPU, c.op, gpu(a), gpu(b).t(), got, c.alpha);
      check_close(got, want, tol_for(out_t == kBool ? kBool : dt), name((std::string(c.name) + " strided").c_str(), dt));
    }
  }
}


TEST_CASE("binary integer and bool ops are exact") {
  const BinaryCase cases[] = {
      {BinaryOp::Add, "add", -20, 20},  {BinaryOp::Sub, "sub alpha", -20, 20, 3.0}, {BinaryOp::Mul, "mul", -9, 9},
      {BinaryOp::Maximum, "maximum", -9, 9}, {BinaryOp::Minimum, "minimum", -9, 9}, {BinaryOp::Eq, "eq", -2, 2},
      {BinaryOp::Ne, "ne", -2, 2},      {BinaryOp::Lt, "lt", -3, 3},  {BinaryOp::Ge, "ge", -3, 3},
      {BinaryOp::LogicalAnd, "logical_and", -1, 1}, {BinaryOp::LogicalOr, "logical_or", -1, 1},
  };
  for (DType dt : {kInt32, kInt64, kUInt8, kBool}) {
    for (const BinaryCase& c : cases) {
      const double lo = (dt == kUInt8 || dt == kBool) ? 0 : c.lo;
      const Tensor a = rnd({31, 57}, dt, lo, c.hi), b = rnd({1, 57}, dt, lo, c.hi);
      const DType out_t = is_comparison(c.op) ? kBool : dt;
      Tensor want = empty_on({31, 57}, out_t, kCPU), got = empty_on({31, 57}, out_t, kGPU);
      binary_stub(kCPU, c.op, a, b, want, c.alpha);
      binary_stub(kGPU, c.op, gpu(a), gpu(b), got, c.alpha);
      check_close(got, want, tol_for(kInt64), name(c.name, dt));
    }
  }
  const Tensor a = gpu(rnd({4}, kInt32, 1, 5));
  Tensor out = empty_on({4}, kInt32, kGPU);
  CHECK_THROWS_AS(binary_stub(kGPU, BinaryOp::Div, a, a, out, 1.0), DTypeError);
}

TEST_CASE("where with broadcasting, every dtype") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    const Tensor cond = rnd({9, 1, 33}, kBool), a = rnd({9, 17, 33}, dt, 0, 9), b = rnd({17, 1}, dt, 0, 9);
    Tensor want = empty_on({9, 17, 33}, dt, kCPU), got = empty_on({9, 17, 33}, dt, kGPU);
    where_stub(kCPU, cond, a, b, want);
    where_stub(kGPU, gpu(cond), gpu(a), gpu(b), got);
    check_close(got, want, Tol{0, 0}, name("where", dt));
  }
}

TEST_CASE("copy between every dtype pair, contiguous, strided and broadcast; fill") {
  const DType all[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool};
  for (DType src_t : all) {
    const Tensor src = is_floating(src_t) ? rnd({23, 41}, src_t, -100, 300) : rnd({23, 41}, src_t, 0, 200);
    const Tensor sg = gpu(src);
    for (DType dst_t : all) {
      if (is_integral(dst_t, true) && is_floating(src_t)) continue;  // float->int truncation of negatives: UB-ish
      Tensor want = empty_on({23, 41}, dst_t, kCPU), got = empty_on({23, 41}, dst_t, kGPU);
      copy_stub(kCPU, want, src);
      copy_stub(kGPU, got, sg);
      std::ostringstream what;
      what << "copy " << src_t << " -> " << dst_t;
      check_close(got, want, Tol{0, 0}, what.str());
      Tensor want_t = empty_on({41, 23}, dst_t, kCPU), got_t = empty_on({41, 23}, dst_t, kGPU);
      copy_stub(kCPU, want_t, src.t());
      copy_stub(kGPU, got_t, sg.t());
      check_close(got_t, want_t, Tol{0, 0}, what.str() + " strided");
    }
    Tensor want_b = empty_on({5, 23, 41}, src_t, kCPU), got_b = empty_on({5, 23, 41}, src_t, kGPU);
    copy_stub(kCPU, want_b, src);
    copy_stub(kGPU, got_b, sg);
    check_close(got_b, want_b, Tol{0, 0}, name("copy broadcast", src_t));
    for (double v : {0.0, 1.0, -2.5, 77.0}) {
      if (!is_floating(src_t) && v < 0) continue;
      Tensor fw = empty_on({7, 9}, src_t, kCPU), fg = empty_on({7, 9}, src_t, kGPU);
      fill_stub(kCPU, fw, Scalar(v));
      fill_stub(kGPU, fg, Scalar(v));
      check_close(fg, fw, Tol{0, 0}, name("fill", src_t));
      Tensor fwt = fw.t(), fgt = fg.t();  // strided fill
      fill_stub(kCPU, fwt, Scalar(v + 1));
      fill_stub(kGPU, fgt, Scalar(v + 1));
      check_close(fg, fw, Tol{0, 0}, name("fill strided", src_t));
    }
  }
}

// ---------------- reductions ----------------

Shape keepdim_shape(const Shape& s, const Shape& dims) {
  Shape o = s;
  for (int64_t d : dims) o[size_t(d)] = 1;
  return o;
}

TEST_CASE("reductions: rows, columns, split rows, permuted dims") {
  struct Case {
    Shape shape;
    Shape dims;
  };
  const Case cases[] = {{{37, 513}, {1}},     {{37, 513}, {0}},   {{37, 513}, {0, 1}}, {{3, 40, 5}, {1}},
                        {{3, 40, 5}, {0, 2}}, {{2, 100000}, {1}}, {{50000, 3}, {0}},   {{6, 7}, {1}},
                        {{2048, 300}, {0}}};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod};
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      int64_t n_red = 1;
      for (int64_t d : c.dims) n_red *= c.shape[size_t(d)];
      for (ReduceOp op : ops) {
        // Prod over many elements under/overflows: keep factors near 1 there.
        const bool prod = op == ReduceOp::Prod;
        const Tensor x = prod ? rnd(c.shape, dt, 0.999, 1.001) : rnd(c.shape, dt);
        const Shape so = keepdim_shape(c.shape, c.dims);
        Tensor want = empty_on(so, dt, kCPU), got = empty_on(so, dt, kGPU);
        reduce_stub(kCPU, op, x, c.dims, want);
        reduce_stub(kGPU, op, gpu(x), c.dims, got);
        // Sums differ by accumulation order: error grows with the number of terms.
        const bool sumlike = op == ReduceOp::Sum || op == ReduceOp::Mean || prod;
        Tol tol = tol_for(dt);
        if (sumlike) tol.atol *= std::sqrt(double(n_red)) * 4;
        std::ostringstream what;
        what << "reduce op " << int(op) << " " << c.shape << " dims " << c.dims;
        check_close(got, want, tol, name(what.str().c_str(), dt));
      }
      if (c.dims.size() == 1) {
        for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin}) {
          // Distinct values: ties resolve to the first index on both, but rounding could tie.
          const Tensor x = rnd(c.shape, kFloat64).to(dt);
          const Shape so = keepdim_shape(c.shape, c.dims);
          Tensor want = empty_on(so, kInt64, kCPU), got = empty_on(so, kInt64, kGPU);
          reduce_stub(kCPU, op, x, c.dims, want);
          reduce_stub(kGPU, op, gpu(x), c.dims, got);
          if (dt == kFloat32 || dt == kFloat64) check_close(got, want, Tol{0, 0}, name("argmax/argmin", dt));
          // 16-bit values tie often: the index must point at an extreme value.
          const Tensor gv = gather(gpu(x), c.dims[0], got).to(kCPU).to(kFloat64);
          const Tensor wv = gather(x, c.dims[0], want).to(kFloat64);
          check_close(gv.to(kGPU), wv, Tol{0, 0}, name("argmax/argmin value", dt));
        }
      }
    }
  }
  // Integer sums to int64 and means to float32.
  const Tensor xi = rnd({30, 1000}, kInt32, -100, 100);
  Tensor want = empty_on({30, 1}, kInt64, kCPU), got = empty_on({30, 1}, kInt64, kGPU);
  reduce_stub(kCPU, ReduceOp::Sum, xi, Shape{1}, want);
  reduce_stub(kGPU, ReduceOp::Sum, gpu(xi), Shape{1}, got);
  check_close(got, want, Tol{0, 0}, "int32 sum");
  Tensor wm = empty_on({1, 1000}, kFloat32, kCPU), gm = empty_on({1, 1000}, kFloat32, kGPU);
  reduce_stub(kCPU, ReduceOp::Mean, xi, Shape{0}, wm);
  reduce_stub(kGPU, ReduceOp::Mean, gpu(xi), Shape{0}, gm);
  check_close(gm, wm, tol_for(kFloat32), "int32 mean");
  // NaN propagates through max/min on both.
  Tensor xn = rnd({4, 50}, kFloat32);
  xn.select(0, 2).narrow(0, 7, 1).fill_(NAN);
  Tensor wn = empty_on({4, 1}, kFloat32, kCPU), gn = empty_on({4, 1}, kFloat32, kGPU);
  reduce_stub(kCPU, ReduceOp::Max, xn, Shape{1}, wn);
  reduce_stub(kGPU, ReduceOp::Max, gpu(xn), Shape{1}, gn);
  check_close(gn, wn, Tol{0, 0}, "max with NaN");
}

// ---------------- matmul ----------------

TEST_CASE("matmul: layouts, batches, broadcast, bias, every float dtype") {
  struct Case {
    const char* what;
    Shape a, b;
    bool ta, tb;  // operand given as a transposed view
    bool bias;
  };
  const Case cases[] = {
      {"2-D", {64, 48}, {48, 80}, false, false, false},   {"a^T", {64, 48}, {48, 80}, true, false, false},
      {"b^T", {64, 48}, {48, 80}, false, true, false},    {"a^T b^T", {33, 17}, {17, 9}, true, true, false},
      {"bias", {70, 40}, {40, 30}, false, true, true},    {"odd sizes", {1, 7}, {7, 1}, false, false, true},
      {"batched", {3, 17, 33}, {3, 33, 9}, false, false, false},
      {"batched b^T", {4, 16, 32}, {4, 32, 24}, false, true, false},
      {"broadcast a", {1, 17, 33}, {3, 33, 9}, false, false, false},
      {"broadcast b", {3, 17, 33}, {1, 33, 9}, false, false, false},
      {"4-D", {2, 3, 8, 16}, {2, 3, 16, 8}, false, false, false},
      {"batched bias", {2, 5, 6}, {2, 6, 7}, false, false, true},
  };
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      // Transposed operand: make the tensor with swapped last dims, then view it back.
      auto make = [&](const Shape& s, bool t) {
        Shape st = s;
        std::swap(st[st.size() - 1], st[st.size() - 2]);
        return t ? rnd(st, dt, -1, 1).transpose(-1, -2) : rnd(s, dt, -1, 1);
      };
      const Tensor a = make(c.a, c.ta), b = make(c.b, c.tb);
      const int64_t n = c.b.back(), k = c.a.back();
      const Tensor bias = c.bias ? rnd({n}, dt, -1, 1) : Tensor();
      Shape so;
      for (size_t d = 0; d + 2 < c.a.size(); ++d) so.push_back(std::max(c.a[d], c.b[d]));
      so.push_back(c.a[c.a.size() - 2]);
      so.push_back(n);
      Tensor want = empty_on(so, dt, kCPU), got = empty_on(so, dt, kGPU);
      matmul_stub(kCPU, a, b, bias, want);
      const Tensor ag = c.ta ? gpu(a.transpose(-1, -2).contiguous()).transpose(-1, -2) : gpu(a);
      const Tensor bg = c.tb ? gpu(b.transpose(-1, -2).contiguous()).transpose(-1, -2) : gpu(b);
      matmul_stub(kGPU, ag, bg, c.bias ? gpu(bias) : Tensor(), got);
      check_close(got, want, scaled(tol_for(dt), std::sqrt(double(k))), name(c.what, dt));
    }
  }
  // TF32 opt-in: f32 inputs rounded to 10-bit mantissas, so a looser bound.
  cuda::set_allow_tf32(true);
  const Tensor a = rnd({128, 256}, kFloat32, -1, 1), b = rnd({256, 64}, kFloat32, -1, 1);
  Tensor want = empty_on({128, 64}, kFloat32, kCPU), got = empty_on({128, 64}, kFloat32, kGPU);
  matmul_stub(kCPU, a, b, Tensor(), want);
  matmul_stub(kGPU, gpu(a), gpu(b), Tensor(), got);
  cuda::set_allow_tf32(false);
  check_close(got, want, Tol{2e-2, 1e-2}, "tf32 matmul");
}

// ---------------- softmax, norms, losses ----------------

TEST_CASE("softmax and log_softmax forward and backward, last and inner dims") {
  for (DType dt : kFloats) {
    for (bool log : {false, true}) {
      for (int64_t dim : {2, 1}) {
        Tensor x = rnd({3, 50, 70}, dt, -6, 6);
        if (dim == 2) {  // a causal-style mask: -inf entries must give exact zeros
          x = masked_fill(x, triu(ones({50, 70}, kBool), 1), -INFINITY);
        }
        Tensor want = empty_on(x.sizes(), dt, kCPU), got = empty_on(x.sizes(), dt, kGPU);
        softmax_stub(kCPU, x, dim, log, want);
        softmax_stub(kGPU, gpu(x), dim, log, got);
        const std::string w = name(log ? "log_softmax" : "softmax", dt) + " dim " + std::to_string(dim);
        check_close(got, want, tol_for(dt), w);
        const Tensor g = rnd(x.sizes(), dt);
        Tensor dw = empty_on(x.sizes(), dt, kCPU), dg = empty_on(x.sizes(), dt, kGPU);
        // log_softmax backward on masked rows: exp(-inf) * sum is 0, grad passes through.
        softmax_backward_stub(kCPU, g, want, dim, log, dw);
        softmax_backward_stub(kGPU, gpu(g), gpu(want), dim, log, dg);
        check_close(dg, dw, scaled(tol_for(dt), 4), w + " backward");
      }
    }
  }
}

TEST_CASE("layer_norm and rms_norm forward and backward") {
  for (DType dt : kFloats) {
    const DType acc = dt == kFloat64 ? kFloat64 : kFloat32;
    for (bool affine : {true, false}) {
      const int64_t rows = 300, n = 96;
      const Tensor x = rnd({rows, n}, dt, -3, 5);
      const Tensor w = affine ? rnd({n}, dt, 0.5, 1.5) : Tensor(), b = affine ? rnd({n}, dt) : Tensor();
      Tensor yw = empty_on({rows, n}, dt, kCPU), yg = empty_on({rows, n}, dt, kGPU);
      Tensor mw = empty_on({rows}, acc, kCPU), mg = empty_on({rows}, acc, kGPU);
      Tensor rw = empty_on({rows}, acc, kCPU), rg = empty_on({rows}, acc, kGPU);
      const Tensor wg = affine ? gpu(w) : Tensor(), bg = affine ? gpu(b) : Tensor();
      layer_norm_stub(kCPU, x, w, b, n, 1e-5, yw, mw, rw);
      layer_norm_stub(kGPU, gpu(x), wg, bg, n, 1e-5, yg, mg, rg);
      const std::string what = name("layer_norm", dt) + (affine ? " affine" : "");
      check_close(yg, yw, scaled(tol_for(dt), 2), what);
      check_close(mg, mw, scaled(tol_for(acc), 10), what + " mean");
      check_close(rg, rw, scaled(tol_for(acc), 10), what + " rstd");

      const Tensor g = rnd({rows, n}, dt);
      Tensor dxw = empty_on({rows, n}, dt, kCPU), dxg = empty_on({rows, n}, dt, kGPU);
      Tensor dww = affine ? empty_on({n}, dt, kCPU) : Tensor(), dwg = affine ? empty_on({n}, dt, kGPU) : Tensor();
      Tensor dbw = affine ? empty_on({n}, dt, kCPU) : Tensor(), dbg = affine ? empty_on({n}, dt, kGPU) : Tensor();
      layer_norm_backward_stub(kCPU, g, x, mw, rw, w, n, dxw, dww, dbw);
      layer_norm_backward_stub(kGPU, gpu(g), gpu(x), gpu(mw), gpu(rw), wg, n, dxg, dwg, dbg);
      check_close(dxg, dxw, scaled(tol_for(dt), 8), what + " dx");
      if (affine) {
        check_close(dwg, dww, scaled(tol_for(dt), std::sqrt(double(rows)) * 4), what + " dweight");
        check_close(dbg, dbw, scaled(tol_for(dt), std::sqrt(double(rows)) * 4), what + " dbias");
      }

      Tensor ryw = empty_on({rows, n}, dt, kCPU), ryg = empty_on({rows, n}, dt, kGPU);
      Tensor rrw = empty_on({rows}, acc, kCPU), rrg = empty_on({rows}, acc, kGPU);
      rms_norm_stub(kCPU, x, w, n, 1e-6, ryw, rrw);
      rms_norm_stub(kGPU, gpu(x), wg, n, 1e-6, ryg, rrg);
      check_close(ryg, ryw, scaled(tol_for(dt), 2), name("rms_norm", dt));
      Tensor rdxw = empty_on({rows, n}, dt, kCPU), rdxg = empty_on({rows, n}, dt, kGPU);
      Tensor rdww = affine ? empty_on({n}, dt, kCPU) : Tensor(), rdwg = affine ? empty_on({n}, dt, kGPU) : Tensor();
      rms_norm_backward_stub(kCPU, g, x, rrw, w, n, rdxw, rdww);
      rms_norm_backward_stub(kGPU, gpu(g), gpu(x), gpu(rrw), wg, n, rdxg, rdwg);
      check_close(rdxg, rdxw, scaled(tol_for(dt), 8), name("rms_norm dx", dt));
      if (affine) check_close(rdwg, rdww, scaled(tol_for(dt), std::sqrt(double(rows)) * 4), name("rms_norm dw", dt));
    }
  }
}

TEST_CASE("cross_entropy and nll_loss forward and backward; bad targets are IndexErrors") {
  const int64_t rows = 45, classes = 1000, ignore = -100;
  for (DType dt : kFloats) {
    const DType acc = dt == kFloat64 ? kFloat64 : kFloat32;
    for (DType it : {kInt64, kInt32}) {
      Tensor target = rnd({rows}, kInt64, 0, classes - 1);
      target.narrow(0, 5, 3).fill_(ignore);
      target = target.to(it);
      for (double ls : {0.0, 0.1}) {
        const Tensor logits = rnd({rows, classes}, dt, -4, 4);
        Tensor lw = empty_on({rows}, dt, kCPU), lg = empty_on({rows}, dt, kGPU);
        Tensor sw = empty_on({rows}, acc, kCPU), sg = empty_on({rows}, acc, kGPU);
        Tensor vw = empty_on({}, dt, kCPU), vg = empty_on({}, dt, kGPU);
        cross_entropy_stub(kCPU, logits, target, ignore, ls, "cross_entropy", lw, sw, vw);
        cross_entropy_stub(kGPU, gpu(logits), gpu(target), ignore, ls, "cross_entropy", lg, sg, vg);
        const std::string what = name("cross_entropy", dt) + " ls " + std::to_string(ls);
        check_close(lg, lw, scaled(tol_for(dt), 4), what + " loss");
        check_close(sg, sw, scaled(tol_for(acc), 10), what + " lse");
        check_close(vg, vw, Tol{0, 0}, what + " valid");
        for (bool per_row : {false, true}) {
          const Tensor g = per_row ? rnd({rows}, dt) : rnd({}, dt);
          Tensor dw = empty_on({rows, classes}, dt, kCPU), dg = empty_on({rows, classes}, dt, kGPU);
          cross_entropy_backward_stub(kCPU, g, logits, target, sw, ignore, ls, dw);
          cross_entropy_backward_stub(kGPU, gpu(g), gpu(logits), gpu(target), gpu(sw), ignore, ls, dg);
          check_close(dg, dw, scaled(tol_for(dt), 4), what + (per_row ? " backward per row" : " backward"));
        }
      }
      const Tensor lp = log_softmax(rnd({rows, classes}, dt), 1);
      Tensor lw = empty_on({rows}, dt, kCPU), lg = empty_on({rows}, dt, kGPU);
      Tensor vw = empty_on({}, dt, kCPU), vg = empty_on({}, dt, kGPU);
      nll_loss_stub(kCPU, lp, target, ignore, "nll_loss", lw, vw);
      nll_loss_stub(kGPU, gpu(lp), gpu(target), ignore, "nll_loss", lg, vg);
      check_close(lg, lw, tol_for(dt), name("nll_loss", dt));
      check_close(vg, vw, Tol{0, 0}, name("nll_loss valid", dt));
      const Tensor g = rnd({rows}, dt);
      Tensor dw = empty_on({rows, classes}, dt, kCPU), dg = empty_on({rows, classes}, dt, kGPU);
      nll_loss_backward_stub(kCPU, g, target, ignore, dw);
      nll_loss_backward_stub(kGPU, gpu(g), gpu(target), ignore, dg);
      check_close(dg, dw, Tol{0, 0}, name("nll_loss backward", dt));
    }
  }
  // A target outside [0, C): IndexError naming the op and the value, as on the CPU.
  Tensor bad = rnd({rows}, kInt64, 0, classes - 1);
  bad.narrow(0, 17, 1).fill_(classes + 3);
  const Tensor logits = gpu(rnd({rows, classes}, kFloat32));
  Tensor l = empty_on({rows}, kFloat32, kGPU), s = empty_on({rows}, kFloat32, kGPU), v = empty_on({}, kFloat32, kGPU);
  try {
    cross_entropy_stub(kGPU, logits, gpu(bad), ignore, 0.0, "cross_entropy", l, s, v);
    FAIL("no IndexError for target 1003");
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[cross_entropy]") == 0);
    CHECK(msg.find("1003") != std::string::npos);
    CHECK(msg.find("position 17") != std::string::npos);
  }
  CHECK_THROWS_AS(cross_entropy(logits, gpu(bad)), IndexError);
}

TEST_CASE("scaled dot-product attention forward and backward, causal and not, strided q/k/v") {
  const int64_t B = 2, H = 3, T = 37, D = 16;
  for (DType dt : kFloats) {
    // The CPU kernel takes f32/f64: 16-bit inputs are compared with the f32 result on the same
    // (rounded) values.
    const DType ref_t = (dt == kFloat16 || dt == kBFloat16) ? kFloat32 : dt;
    for (bool causal : {true, false}) {
      // q, k, v as head views of one packed (B, T, 3, H, D) buffer, as attention layers make them.
      const Tensor qkv = rnd({B, T, 3, H, D}, dt, -1, 1);
      auto heads = [](const Tensor& t, int64_t i) { return t.select(2, i).permute({0, 2, 1, 3}); };
      const Tensor qkv_g = gpu(qkv), qkv_r = qkv.to(ref_t);
      const double scale = 1.0 / std::sqrt(double(D));
      Tensor ow = empty_on({B, H, T, D}, ref_t, kCPU), pw = empty_on({B, H, T, T}, ref_t, kCPU);
      Tensor og = empty_on({B, H, T, D}, dt, kGPU), pg = empty_on({B, H, T, T}, dt, kGPU);
      sdpa_stub(kCPU, heads(qkv_r, 0), heads(qkv_r, 1), heads(qkv_r, 2), scale, causal, ow, pw);
      sdpa_stub(kGPU, heads(qkv_g, 0), heads(qkv_g, 1), heads(qkv_g, 2), scale, causal, og, pg);
      const std::string what = name("sdpa", dt) + (causal ? " causal" : "");
      check_close(og, ow.to(dt), scaled(tol_for(dt), 4), what + " out");
      check_close(pg, pw.to(dt), scaled(tol_for(dt), 4), what + " p");
      const Tensor dout = rnd({B, H, T, D}, dt, -1, 1);
      Tensor dqw = empty_on({B, H, T, D}, ref_t, kCPU), dkw = empty_on({B, H, T, D}, ref_t, kCPU),
             dvw = empty_on({B, H, T, D}, ref_t, kCPU);
      Tensor dqg = empty_on({B, H, T, D}, dt, kGPU), dkg = empty_on({B, H, T, D}, dt, kGPU),
             dvg = empty_on({B, H, T, D}, dt, kGPU);
      sdpa_backward_stub(kCPU, dout.to(ref_t), heads(qkv_r, 0), heads(qkv_r, 1), heads(qkv_r, 2), pw, scale, causal,
                         dqw, dkw, dvw);
      sdpa_backward_stub(kGPU, gpu(dout), heads(qkv_g, 0), heads(qkv_g, 1), heads(qkv_g, 2), pg, scale, causal, dqg,
                         dkg, dvg);
      check_close(dqg, dqw.to(dt), scaled(tol_for(dt), 8), what + " dq");
      check_close(dkg, dkw.to(dt), scaled(tol_for(dt), 8), what + " dk");
      check_close(dvg, dvw.to(dt), scaled(tol_for(dt), 8), what + " dv");
    }
  }
}

// ---------------- indexing ----------------

TEST_CASE("index_select, index_add, gather, scatter_add, tril/triu; bad indices are IndexErrors") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (DType it : {kInt64, kInt32}) {
      for (int64_t dim : {0, 1}) {
        const Tensor x = rnd({50, 40, 6}, dt, 0, 9);
        const int64_t n = x.sizes()[size_t(dim)];
        const Tensor idx = rnd({77}, kInt64, 0, n - 1).to(it);  // duplicates are likely
        Shape so = x.sizes();
        so[size_t(dim)] = 77;
        Tensor want = empty_on(so, dt, kCPU), got = empty_on(so, dt, kGPU);
        index_select_stub(kCPU, x, dim, idx, want, "index_select");
        index_select_stub(kGPU, gpu(x), dim, gpu(idx), got, "index_select");
        check_close(got, want, Tol{0, 0}, name("index_select", dt) + " dim " + std::to_string(dim));

        const Tensor src = rnd(so, dt, 0, 9);
        Tensor aw = x.clone(), ag = gpu(x);
        index_add_stub(kCPU, aw, dim, idx, src, "index_add");
        index_add_stub(kGPU, ag, dim, gpu(idx), gpu(src), "index_add");
        // Atomics add duplicates in another order: 16-bit sums may round differently.
        check_close(ag, aw, scaled(tol_for(dt), 8), name("index_add", dt) + " dim " + std::to_string(dim));

        const Tensor gi = rnd({50, 40, 6}, kInt64, 0, n - 1).narrow(2, 0, 4).contiguous().to(it);
        Tensor gw = empty_on(gi.sizes(), dt, kCPU), gg = empty_on(gi.sizes(), dt, kGPU);
        gather_stub(kCPU, x, dim, gi, gw, "gather");
        gather_stub(kGPU, gpu(x), dim, gpu(gi), gg, "gather");
        check_close(gg, gw, Tol{0, 0}, name("gather", dt));
        const Tensor xt = x.transpose(0, 2);  // strided input
        const Tensor gti = rnd({6, 40, 50}, kInt64, 0, xt.sizes()[size_t(dim)] - 1).to(it);
        Tensor gtw = empty_on(gti.sizes(), dt, kCPU), gtg = empty_on(gti.sizes(), dt, kGPU);
        gather_stub(kCPU, xt, dim, gti, gtw, "gather");
        gather_stub(kGPU, gpu(x).transpose(0, 2), dim, gpu(gti), gtg, "gather");
        check_close(gtg, gtw, Tol{0, 0}, name("gather strided", dt));

        const Tensor ssrc = rnd(gi.sizes(), dt, 0, 9);
        Tensor sw = x.clone(), sg = gpu(x);
        scatter_add_stub(kCPU, sw, dim, gi, ssrc, "scatter_add");
        scatter_add_stub(kGPU, sg, dim, gpu(gi), gpu(ssrc), "scatter_add");
        check_close(sg, sw, scaled(tol_for(dt), 8), name("scatter_add", dt));
      }
    }
    const Tensor m = rnd({3, 7, 9}, dt, 0, 9);
    for (int64_t diag : {-2, 0, 3}) {
      for (bool upper : {false, true}) {
        Tensor tw = empty_on(m.sizes(), dt, kCPU), tg = empty_on(m.sizes(), dt, kGPU);
        trilu_stub(kCPU, m, diag, upper, tw);
        trilu_stub(kGPU, gpu(m), diag, upper, tg);
        check_close(tg, tw, Tol{0, 0}, name(upper ? "triu" : "tril", dt));
      }
    }
  }
  const Tensor w = gpu(rnd({10, 4}, kFloat32));
  const Tensor bad = gpu(tensor(std::vector<int64_t>{1, 2, 10}, {3}));
  try {
    (void)embedding(w, bad);
    FAIL("no IndexError for index 10");
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("10 is out of bounds") != std::string::npos);
    CHECK(msg.find("size 10") != std::string::npos);
  }
  CHECK_THROWS_AS(gather(w, 1, gpu(tensor(std::vector<int64_t>{0, 4}, {1, 2}))), IndexError);
}

// ---------------- convolution and pooling ----------------

TEST_CASE("conv2d forward and backward through cuDNN; pooling forward and backward") {
  struct Case {
    const char* what;
    Shape x, w;
    Conv2dParams p;
    bool bias;
  };
  Conv2dParams strided;
  strided.stride[0] = 2, strided.stride[1] = 2, strided.padding[0] = 1, strided.padding[1] = 1;
  Conv2dParams dilated;
  dilated.dilation[0] = 2, dilated.dilation[1] = 2, dilated.padding[0] = 2, dilated.padding[1] = 2;
  Conv2dParams grouped;
  grouped.groups = 2, grouped.padding[0] = 1, grouped.padding[1] = 1;
  const Case cases[] = {{"3x3", {4, 3, 17, 15}, {8, 3, 3, 3}, Conv2dParams{}, true},
                        {"stride 2 pad 1", {2, 8, 16, 16}, {16, 8, 3, 3}, strided, true},
                        {"dilation 2", {2, 4, 13, 13}, {6, 4, 3, 3}, dilated, false},
                        {"groups 2", {3, 8, 9, 9}, {10, 4, 3, 3}, grouped, true}};
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      const Tensor x = rnd(c.x, dt, -1, 1), w = rnd(c.w, dt, -1, 1);
      const Tensor b = c.bias ? rnd({c.w[0]}, dt, -1, 1) : Tensor();
      const int64_t ho = (c.x[2] + 2 * c.p.padding[0] - c.p.dilation[0] * (c.w[2] - 1) - 1) / c.p.stride[0] + 1;
      const int64_t wo = (c.x[3] + 2 * c.p.padding[1] - c.p.dilation[1] * (c.w[3] - 1) - 1) / c.p.stride[1] + 1;
      const Shape so{c.x[0], c.w[0], ho, wo};
      Tensor want = empty_on(so, dt, kCPU), got = empty_on(so, dt, kGPU);
      conv2d_stub(kCPU, x, w, b, want, c.p);
      conv2d_stub(kGPU, gpu(x), gpu(w), c.bias ? gpu(b) : Tensor(), got, c.p);
      const double k = double(c.w[1] * c.w[2] * c.w[3]);
      const std::string what = name("conv2d", dt) + " " + c.what;
      check_close(got, want, scaled(tol_for(dt), std::sqrt(k)), what);

      const Tensor gout = rnd(so, dt, -1, 1);
      Tensor gxw = empty_on(c.x, dt, kCPU), gww = empty_on(c.w, dt, kCPU), gbw = empty_on({c.w[0]}, dt, kCPU);
      Tensor gxg = empty_on(c.x, dt, kGPU), gwg = empty_on(c.w, dt, kGPU), gbg = empty_on({c.w[0]}, dt, kGPU);
      conv2d_backward_stub(kCPU, x, w, gout, &gxw, &gww, &gbw, c.p);
      conv2d_backward_stub(kGPU, gpu(x), gpu(w), gpu(gout), &gxg, &gwg, &gbg, c.p);
      const double spatial = double(so[0] * so[2] * so[3]);
      check_close(gxg, gxw, scaled(tol_for(dt), std::sqrt(double(c.w[0] * c.w[2] * c.w[3]))), what + " dx");
      check_close(gwg, gww, scaled(tol_for(dt), std::sqrt(spatial) * 2), what + " dw");
      check_close(gbg, gbw, scaled(tol_for(dt), std::sqrt(spatial) * 2), what + " db");
    }
    for (PoolKind kind : {PoolKind::Max, PoolKind::Avg}) {
      for (bool include_pad : {true, false}) {
        Pool2dParams p;
        p.kernel[0] = 3, p.kernel[1] = 2, p.stride[0] = 2, p.stride[1] = 2, p.padding[0] = 1, p.padding[1] = 1;
        p.count_include_pad = include_pad;
        // Distinct values per plane (0..179, exact in every dtype): no ties, so both sides pick the
        // same argmax and the max-pool gradient lands on the same element.
        std::vector<Tensor> planes;
        for (int i = 0; i < 12; ++i) planes.push_back(randperm(180, &gen()));
        const Tensor x = cat(planes).reshape({3, 4, 15, 12}).to(dt);
        const int64_t ho = (15 + 2 - 3) / 2 + 1, wo = (12 + 2 - 2) / 2 + 1;
        Tensor yw = empty_on({3, 4, ho, wo}, dt, kCPU), yg = empty_on({3, 4, ho, wo}, dt, kGPU);
        Tensor wsw, wsg;
        pool2d_stub(kCPU, kind, x, yw, &wsw, p);
        pool2d_stub(kGPU, kind, gpu(x), yg, &wsg, p);
        const std::string what = name(kind == PoolKind::Max ? "max_pool2d" : "avg_pool2d", dt);
        check_close(yg, yw, tol_for(dt), what);
        const Tensor gy = rnd({3, 4, ho, wo}, dt);
        Tensor gxw = empty_on(x.sizes(), dt, kCPU), gxg = empty_on(x.sizes(), dt, kGPU);
        pool2d_backward_stub(kCPU, kind, gy, wsw, gxw, p);
        pool2d_backward_stub(kGPU, kind, gpu(gy), wsg, gxg, p);
        check_close(gxg, gxw, scaled(tol_for(dt), 4), what + " backward");
      }
    }
  }
}

// ---------------- fused AdamW ----------------

TEST_CASE("fused adam/adamw step matches the CPU kernel") {
  for (DType dt : kFloats) {
    for (bool decoupled : {true, false}) {
      Tensor p = rnd({1000, 7}, dt), m = rnd({1000, 7}, dt, -0.1, 0.1), v = rnd({1000, 7}, dt, 0, 0.01);
      Tensor pg = gpu(p), mg = gpu(m), vg = gpu(v);
      for (int step = 1; step <= 3; ++step) {
        const Tensor g = rnd({1000, 7}, dt);
        AdamStepParams hp;
        hp.lr = 1e-2;
        hp.weight_decay = 0.1;
        hp.decoupled = decoupled;
        hp.bias_correction1 = 1 - std::pow(hp.beta1, step);
        hp.bias_correction2 = 1 - std::pow(hp.beta2, step);
        adamw_stub(kCPU, p, g, m, v, hp);
        adamw_stub(kGPU, pg, gpu(g), mg, vg, hp);
      }
      const std::string what = name(decoupled ? "adamw" : "adam", dt);
      check_close(pg, p, scaled(tol_for(dt), 4), what + " param");
      check_close(mg, m, scaled(tol_for(dt), 4), what + " exp_avg");
      check_close(vg, v, scaled(tol_for(dt), 4), what + " exp_avg_sq");
    }
  }
  // 16-bit params with float32 states (a CUDA extension): the same math as all-f32, rounded.
  Tensor p32 = rnd({4096}, kFloat32), m32 = zeros({4096}), v32 = zeros({4096});
  const Tensor g32 = rnd({4096}, kFloat32);
  Tensor pb = gpu(p32.to(kBFloat16)), mb = gpu(m32), vb = gpu(v32);
  Tensor pr = p32.to(kBFloat16).to(kFloat32);
  AdamStepParams hp;
  hp.bias_correction1 = 1 - hp.beta1;
  hp.bias_correction2 = 1 - hp.beta2;
  adamw_stub(kCPU, pr, g32.to(kBFloat16).to(kFloat32), m32, v32, hp);
  adamw_stub(kGPU, pb, gpu(g32.to(kBFloat16)), mb, vb, hp);
  check_close(pb, pr.to(kBFloat16), tol_for(kBFloat16), "adamw bf16 param, f32 states");
  check_close(mb, m32, tol_for(kFloat32), "adamw bf16 param, f32 exp_avg");
}

// ---------------- runtime: devices, memory, streams, copies ----------------

TEST_CASE("devices: count, guard, bad index is a DeviceError") {
  const int n = cuda::device_count();
  REQUIRE(n > 0);
  cuda::set_device(0);
  CHECK(cuda::current_device() == 0);
  {
    cuda::DeviceGuard g(n - 1);
    CHECK(cuda::current_device() == n - 1);
  }
  CHECK(cuda::current_device() == 0);
  CHECK_THROWS_AS(cuda::set_device(n), DeviceError);
  CHECK_THROWS_AS(zeros({2}, Device::cuda(n + 3)), DeviceError);
  try {
    cuda::check_device(Device::cuda(n), "test");
  } catch (const DeviceError& e) {
    CHECK(std::string(e.what()).find("[test]") == 0);
  }
  CHECK(cuda::device_properties(0).multiProcessorCount > 0);
}

TEST_CASE("caching allocator: steady state reuses blocks, stats add up") {
  cuda::synchronize();
  { Tensor warm = empty({1000, 1000}, TensorOptions(kFloat32, kGPU)); }
  const AllocatorStats before = cuda::memory_stats(0);
  for (int i = 0; i < 200; ++i) {
    Tensor t = empty({1000, 1000}, TensorOptions(kFloat32, kGPU));
    Tensor u = t.mul_(2.0);
  }
  const AllocatorStats after = cuda::memory_stats(0);
  CHECK(after.alloc_count == before.alloc_count);
  CHECK(after.cache_hits >= before.cache_hits + 200);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved >= after.bytes_in_use);
  {
    Tensor big = empty({64 << 20}, TensorOptions(kUInt8, kGPU));
    CHECK(cuda::memory_stats(0).bytes_in_use >= before.bytes_in_use + (64u << 20));
  }
  const size_t reserved = cuda::memory_stats(0).bytes_reserved;
  cuda::empty_cache();
  CHECK(cuda::memory_stats(0).bytes_reserved < reserved);
  CHECK(get_allocator(kGPU)->stats().bytes_in_use == cuda::memory_stats(-1).bytes_in_use);
}

TEST_CASE("streams and events: work on a side stream, ordering through events") {
  const cuda::Stream side = cuda::new_stream(0);
  CHECK(cuda::current_stream(0).is_default());
  const Tensor x = gpu(rnd({1 << 20}, kFloat32));
  Tensor y;
  cuda::Event done(true), start(true), ready;
  ready.record(cuda::current_stream(0));  // x's upload was queued on the default stream
  ready.block(side);
  {
    cuda::StreamGuard g(side);
    CHECK(cuda::current_stream(0) == side);
    start.record();
    y = exp(x) * 2.0;  // allocated and computed on `side`
    cuda::record_stream(x, side);
    done.record();
  }
  CHECK(cuda::current_stream(0).is_default());
  done.block(cuda::current_stream(0));
  const Tensor z = y + 1.0;
  done.synchronize();
  CHECK(done.query());
  CHECK(start.elapsed_ms(done) >= 0.0f);
  check_close(z, exp(x.cpu()) * 2.0 + 1.0, tol_for(kFloat32), "side stream result");
}

TEST_CASE("host <-> device copies: pageable, pinned, non_blocking, between dtypes") {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    const Tensor h = rnd({257, 33}, dt, 0, 100);
    const Tensor d = h.to(kGPU);
    CHECK(d.device() == kGPU);
    check_close(d, h, Tol{0, 0}, name("h2d2h roundtrip", dt));
    Tensor pinned = cuda::empty_pinned(h.sizes(), dt);
    CHECK(cuda::is_pinned(pinned.storage()->data()));
    pinned.copy_(d);  // D2H into pinned memory
    check_close(d, pinned, Tol{0, 0}, name("d2h pinned", dt));
    const Tensor back = pinned.to(kGPU, /*non_blocking=*/true);
    cuda::current_stream().synchronize();
    check_close(back, h, Tol{0, 0}, name("pinned h2d non_blocking", dt));
  }
  // Strided destination and converting copy across devices.
  Tensor dst = zeros({33, 257}, TensorOptions(kFloat64, kGPU));
  const Tensor src = rnd({257, 33}, kFloat32);
  Tensor dstt = dst.t();
  dstt.copy_(src);
  check_close(dst.t().contiguous(), src.to(kFloat64), Tol{0, 0}, "strided converting h2d copy_");
}

// ---------------- end to end through the ops, with backward ----------------

TEST_CASE("a small MLP: forward, loss and gradients on CUDA match the CPU") {
  const Tensor x = rnd({64, 100}, kFloat32), target = rnd({64}, kInt64, 0, 9);
  Tensor w1 = rnd({128, 100}, kFloat32, -0.1, 0.1), b1 = rnd({128}, kFloat32, -0.1, 0.1);
  Tensor w2 = rnd({10, 128}, kFloat32, -0.1, 0.1), b2 = rnd({10}, kFloat32, -0.1, 0.1);
  auto run = [&](Device d) {
    Tensor pw1 = w1.to(d).detach().requires_grad_(), pb1 = b1.to(d).detach().requires_grad_();
    Tensor pw2 = w2.to(d).detach().requires_grad_(), pb2 = b2.to(d).detach().requires_grad_();
    Tensor h = gelu(layer_norm(linear(x.to(d), pw1, pb1), {128}));
    Tensor loss = cross_entropy(linear(h, pw2, pb2), target.to(d));
    loss.backward();
    return std::vector<Tensor>{loss.detach(), pw1.grad(), pb1.grad(), pw2.grad(), pb2.grad()};
  };
  const std::vector<Tensor> c = run(kCPU), g = run(kGPU);
  const char* names[] = {"loss", "dw1", "db1", "dw2", "db2"};
  for (size_t i = 0; i < c.size(); ++i) check_close(g[i], c[i], Tol{1e-5, 1e-3}, std::string("mlp ") + names[i]);
}

TEST_CASE("a training step does no cudaMalloc once warm") {
  Tensor w = rnd({256, 256}, kFloat32, -0.05, 0.05).to(kGPU).requires_grad_();
  const Tensor x = gpu(rnd({128, 256}, kFloat32)), target = gpu(rnd({128}, kInt64, 0, 255));
  auto step = [&] {
    Tensor loss = cross_entropy(relu(matmul(x, w)), target);
    loss.backward();
    NoGradGuard ng;
    w.sub_(w.grad() * 0.1);
    w.zero_grad();
  };
  step();
  step();
  const size_t allocs = cuda::memory_stats(0).alloc_count;
  for (int i = 0; i < 5; ++i) step();
  CHECK(cuda::memory_stats(0).alloc_count == allocs);
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("SKIP cuda_vs_cpu: no CUDA device present (%s); the CUDA kernels are compiled and linked but not "
                "run\n",
                cuda::unavailable_reason().c_str());
    return 77;  // meson: skipped
  }
  const char* s = std::getenv("ACCEL_TEST_SEED");
  g_seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
  std::printf("cuda_vs_cpu: %d device(s), %s; seed %llu (ACCEL_TEST_SEED=%llu reproduces)\n", cuda::device_count(),
              cuda::device_properties(0).name, (unsigned long long)g_seed, (unsigned long long)g_seed);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
