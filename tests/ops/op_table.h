// The op table: one list of op cases that drives gradcheck (tests/autograd/gradcheck_main.cc),
// the cross-device runner (tests/ops/op_cross_device.cc) and the kernel benchmarks
// (bench/kernels.cc). See docs/testing.md, "How to add an op case".
//
//   t.add("mul", "broadcast", [](Maker& m) { return In{m.rnd({2, 1, 3}), m.rnd({4, 1})}; },
//         [](const In& x) { return mul(x[0], x[1]); });
//
// The input maker is parameterised by (dtype, device) through the Maker: floating inputs come out
// in the case's dtype on the device (the same values on every device: drawn in float64 on the CPU
// from a per-case seed, then rounded), index and mask inputs stay integer/bool. Every name in
// autograd::differentiable_ops() needs at least one differentiable case.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "accel.h"

namespace accel::optable {

using In = std::vector<Tensor>;

struct Tol {
  double atol = 0, rtol = 0;
};

// Per-dtype tolerances of a cross-device comparison (|got - want| <= atol + rtol |want|);
// integer and bool results are compared exactly.
struct Tolerances {
  Tol f64{1e-10, 1e-9};
  Tol f32{1e-5, 1e-4};
  Tol f16{2e-3, 5e-3};
  Tol bf16{1.6e-2, 1.6e-2};
  Tol for_dtype(DType t) const;
  Tolerances scaled(double f) const;
};

// Builds one case's inputs for (dtype, device). `compute` is the dtype the floating inputs are
// handed to the op in: normally `dtype`; the reference of a 16-bit run on a device whose kernel
// lacks that dtype uses the same rounded values in float32 (Note [16-bit references]).
class Maker {
 public:
  Maker(DType dtype, Device device, uint64_t seed, DType compute);
  Maker(DType dtype, Device device, uint64_t seed) : Maker(dtype, device, seed, dtype) {}
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // Uniform in [lo, hi) (rounded to integers for an integer dtype), requires grad when floating.
  Tensor rnd(const Shape& shape, double lo = -1.0, double hi = 1.0);
  Tensor rnd_pos(const Shape& shape) { return rnd(shape, 0.5, 1.5); }
  // The same draws without requires_grad (targets, constants that get no gradient).
  Tensor rnd_const(const Shape& shape, double lo = -1.0, double hi = 1.0);
  // Given values in the case dtype.
  Tensor values(const std::vector<double>& v, const Shape& shape, bool grad = false);
  // Integer values in [lo, hi] in the case dtype, no grad (ties for comparisons).
  Tensor rnd_int(const Shape& shape, int64_t lo, int64_t hi);
  // A uniform random permutation of 0..n-1 in the case dtype (distinct values: no ties).
  Tensor perm(int64_t n, const Shape& shape);
  // Index (int64 or int32) and mask tensors on the device.
  Tensor idx(const std::vector<int64_t>& v, const Shape& shape, DType t = kInt64);
  Tensor rnd_idx(int64_t lo, int64_t hi, const Shape& shape, DType t = kInt64);
  Tensor mask(const std::vector<int>& v, const Shape& shape);
  Generator& gen() { return gen_; }

 private:
  Tensor finish(Tensor f64, bool grad);
  DType dtype_, compute_;
  Device device_;
  Generator gen_;
};

using MakeFn = std::function<In(Maker&)>;
using OpFn = std::function<Tensor(const In&)>;

const std::vector<DType>& floating_dtypes();  // f32, f64, f16, bf16

struct OpCase {
  std::string op;     // a name in autograd::differentiable_ops(), or any name when !differentiable
  std::string label;  // what this case exercises
  MakeFn make;
  OpFn fn;
  Tolerances tol;
  double grad_tol_scale = 4;            // backward results: tol scaled by this (longer chains)
  std::vector<double> grad_tol_scales;  // per floating input with grad, overriding the above
  std::vector<DType> dtypes = floating_dtypes();
  bool differentiable = true;   // false: no gradcheck, no backward comparison
  std::string cpu_only;         // non-empty: why the case is not compared across devices
  bool gradcheck = true;        // false: too large for finite differences (cross-device only)
  double gradcheck_eps = 1e-6;  // finite-difference step of the float64 gradcheck
  // Benchmarks (bench/kernels.cc): a maker of bench-sized inputs, a label per size, the family
  // row name, and the work per call (bytes moved or FLOPs) for the rate column.
  struct Bench {
    std::string family;  // bench row family, e.g. "softmax"
    std::string shape;   // bench row shape label, e.g. "4096x1024"
    MakeFn make;
    double work = 0;     // per call
    bool flops = false;  // work counts FLOPs (else bytes)
    Tol check;           // the float32 result against the float64 one on the same inputs
  };
  std::vector<Bench> benches;

  std::string name() const { return label.empty() ? op : op + " [" + label + "]"; }

  // Fluent setters for the case files.
  OpCase& tolerances(Tolerances t) {
    tol = t;
    return *this;
  }
  OpCase& tol_scale(double f) {
    tol = tol.scaled(f);
    return *this;
  }
  OpCase& grad_scale(double f) {
    grad_tol_scale = f;
    return *this;
  }
  OpCase& grad_scales(std::vector<double> f) {
    grad_tol_scales = std::move(f);
    return *this;
  }
  double grad_scale_of(size_t input) const {
    return input < grad_tol_scales.size() ? grad_tol_scales[input] : grad_tol_scale;
  }
  OpCase& only(std::vector<DType> d) {
    dtypes = std::move(d);
    return *this;
  }
  OpCase& not_differentiable() {
    differentiable = false;
    return *this;
  }
  OpCase& cpu(std::string why) {
    cpu_only = std::move(why);
    return *this;
  }
  OpCase& eps(double e) {
    gradcheck_eps = e;
    return *this;
  }
  OpCase& no_gradcheck() {
    gradcheck = false;
    return *this;
  }
  OpCase& bench(std::string family, std::string shape, MakeFn mk, double work, bool flops,
                Tol check = {1e-5, 1e-4}) {
    benches.push_back({std::move(family), std::move(shape), std::move(mk), work, flops, check});
    return *this;
  }
};

class Table {
 public:
  OpCase& add(std::string op, std::string label, MakeFn make, OpFn fn);
  const std::vector<OpCase>& cases() const { return cases_; }

 private:
  std::vector<OpCase> cases_;
};

// "4096x1024" (the bench shape labels).
std::string dims_str(const Shape& s);

// Every case, built once. Each family adds its cases in cases_<family>.cc.
const std::vector<OpCase>& op_cases();

// Per-case seed: the same inputs on every device and every run.
uint64_t case_seed(const OpCase& c);

// One run of a case: the forward result and the gradients of every floating input that requires
// grad (undefined where the input got none), all moved to the CPU. The backward seeds a fixed
// random cotangent; `backward` false skips it.
struct RunResult {
  Tensor out;
  std::vector<Tensor> grads;
};
RunResult run_case(const OpCase& c, Maker& m, bool backward);

// Max errors of got vs want (both converted to float64 on the CPU) and whether every element is
// within tol (NaN where want has NaN, infinities equal).
struct Compare {
  bool ok = true;
  double max_abs = 0, max_rel = 0;
  std::string why;  // shape/dtype mismatch, non-finite mismatch
};
Compare compare(const Tensor& got, const Tensor& want, Tol tol);

}  // namespace accel::optable

// Case-file shorthands: OP_INPUTS(m.rnd({2, 3}), ...) and OP_FN(return f(x[0]);).
#define OP_INPUTS(...) [](::accel::optable::Maker& m) { return ::accel::optable::In{__VA_ARGS__}; }
#define OP_FN(...) [](const ::accel::optable::In& x) -> ::accel::Tensor { __VA_ARGS__ }

namespace accel::optable::detail {
// One per case file.
void add_elementwise_cases(Table& t);
void add_views_cases(Table& t);
void add_reduce_cases(Table& t);
void add_linalg_cases(Table& t);
void add_conv_cases(Table& t);
void add_nn_cases(Table& t);
void add_index_cases(Table& t);
void add_join_cases(Table& t);
void add_optim_cases(Table& t);
void add_indexing_cases(Table& t);
void add_inplace_cases(Table& t);
void add_losses_cases(Table& t);
void add_image_cases(Table& t);
}  // namespace accel::optable::detail
