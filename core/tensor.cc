#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/checked_size.h"
#include "core/dispatch.h"
#include "core/generator.h"
#include "core/raw.h"

namespace accel {

// ---------------- TensorImpl ----------------

TensorImpl::TensorImpl(StoragePtr storage, Shape sizes, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  refresh();
}

TensorImpl::TensorImpl(StoragePtr storage, const Shape& sizes, DType dtype)
    : storage_(std::move(storage)), sizes_(sizes), dtype_(dtype) {
  const size_t n = sizes_.size();
  strides_.resize(n);
  int64_t numel = 1, stride = 1;  // strides as contiguous_strides(): a 0 size counts as 1
  for (size_t i = n; i-- > 0;) {
    strides_[i] = stride;
    stride *= std::max<int64_t>(sizes_[i], 1);
    numel *= sizes_[i];
  }
  numel_ = numel;
  is_contiguous_ = true;
}

TensorImpl::~TensorImpl() = default;

void TensorImpl::refresh() {
  numel_ = 1;
  for (int64_t s : sizes_) numel_ *= s;
  // Contiguous: strides match row-major, ignoring dims of size 1.
  bool c = true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) {
      c = false;
      break;
    }
    expected *= sizes_[i];
  }
  is_contiguous_ = c || numel_ == 0;
}

// ---------------- metadata ----------------

int64_t Tensor::size(int64_t d) const { return sizes()[size_t(wrap_dim(d, dim(), "size"))]; }
int64_t Tensor::stride(int64_t d) const { return strides()[size_t(wrap_dim(d, dim(), "stride"))]; }

// ---------------- grad mode ----------------

namespace {
thread_local bool t_grad_enabled __attribute__((tls_model("initial-exec"))) = true;
}
bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool e) { t_grad_enabled = e; }

// ---------------- autograd metadata ----------------
// Only fields of AutogradMeta: creating a tensor that requires grad and detaching are core's, the
// graph and the engine are autograd/'s (Note [core is self-contained] in core/raw.h).

AutogradMeta& Tensor::autograd_meta() {
  // new T, not make_unique<T>(): value-initialisation zero-fills all 150 bytes first (a `rep
  // stosq`, 7 % of a recorded add) before the member initialisers write them again.
  if (!impl_->autograd_) impl_->autograd_.reset(new AutogradMeta);
  return *impl_->autograd_;
}

Tensor& Tensor::requires_grad_(bool r) {
  if (!r && !impl_->autograd_) return *this;
  AutogradMeta& m = autograd_meta();
  ACCEL_CHECK(r || !m.grad_fn, ValueError, "requires_grad_",
              "cannot turn off requires_grad on a non-leaf tensor (shape ", sizes(),
              "); use detach()");
  ACCEL_CHECK(!r || is_floating_point(), DTypeError, "requires_grad_",
              "only floating point tensors can require gradients, got ", dtype());
  m.requires_grad = r;
  return *this;
}

Tensor Tensor::detach() const {
  return Tensor(make_intrusive<TensorImpl>(impl_->storage_, impl_->sizes_, impl_->strides_,
                                           impl_->offset_, impl_->dtype_));
}

Tensor& Tensor::detach_() {
  if (impl_->autograd_) {
    impl_->autograd_->grad_fn.reset();
    impl_->autograd_->requires_grad = false;
  }
  // A detached view is a plain alias: its base's history no longer reaches it.
  impl_->view_base_.reset();
  impl_->view_no_grad_ = false;
  return *this;
}

// ---------------- creation ----------------

namespace {

// empty() under the name of the op that asked, so a bad shape is reported as "[zeros] ...".
Tensor empty_for(const Shape& shape, TensorOptions opt, const char* op) {
  const size_t nbytes = checked_nbytes(shape, dtype_size(opt.dtype), op);
  Tensor t(
      make_intrusive<TensorImpl>(make_intrusive<Storage>(nbytes, opt.device), shape, opt.dtype));
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full_for(const Shape& shape, Scalar value, TensorOptions opt, const char* op) {
  const bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = empty_for(shape, opt, op);
  fill_stub(t.device(), t, value);  // a new tensor starts at version 0
  if (rg) t.requires_grad_(true);
  return t;
}

// Bytes spanned by (shape, strides): 1 + sum (size - 1) * stride elements, 0 when empty.
// ShapeError naming op when a size or stride is negative or the span overflows.
size_t checked_span_bytes(const Shape& shape, const Shape& strides, size_t elem_size,
                          const char* op) {
  ACCEL_CHECK(shape.size() == strides.size(), ShapeError, op, "shape ", shape, " and strides ",
              strides, " differ in rank");
  int64_t span = 1;
  bool overflow = false, empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    ACCEL_CHECK(shape[i] >= 0 && strides[i] >= 0, ShapeError, op, "negative size or stride: shape ",
                shape, " strides ", strides);
    empty |= shape[i] == 0;
    int64_t step = 0;
    overflow |= __builtin_mul_overflow(std::max<int64_t>(shape[i], 1) - 1, strides[i], &step) ||
                __builtin_add_overflow(span, step, &span);
  }
  if (empty) return 0;
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(span, int64_t(elem_size), &bytes);
  ACCEL_CHECK(!overflow, ShapeError, op, "shape ", shape, " with strides ", strides, " spans more ",
              "than ", kMaxTensorBytes, " bytes");
  return size_t(bytes);
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions opt) { return empty_for(shape, opt, "empty"); }

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opt) {
  checked_numel(shape, "empty_strided");
  const size_t nbytes = checked_span_bytes(shape, strides, dtype_size(opt.dtype), "empty_strided");
  auto storage = make_intrusive<Storage>(nbytes, opt.device);
  Tensor t(make_intrusive<TensorImpl>(std::move(storage), shape, strides, 0, opt.dtype));
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, Scalar value, TensorOptions opt) {
  return full_for(shape, value, opt, "full");
}
Tensor zeros(const Shape& shape, TensorOptions opt) { return full_for(shape, 0, opt, "zeros"); }
Tensor ones(const Shape& shape, TensorOptions opt) { return full_for(shape, 1, opt, "ones"); }
Tensor empty_like(const Tensor& t) {
  return empty(t.sizes(), TensorOptions(t.dtype(), t.device()));
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.sizes(), TensorOptions(t.dtype(), t.device()));
}
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), TensorOptions(t.dtype(), t.device())); }
Tensor full_like(const Tensor& t, Scalar v) {
  return full(t.sizes(), v, TensorOptions(t.dtype(), t.device()));
}

namespace {

// Builds on the CPU then moves to the requested device.
template <typename Fill>
Tensor make_on_cpu(const Shape& shape, TensorOptions opt, const char* op, Fill&& fill) {
  TensorOptions cpu_opt(opt.dtype, kCPU);
  Tensor t = empty_for(shape, cpu_opt, op);
  ACCEL_DISPATCH_ALL(opt.dtype, op, [&]<typename T>() {
    T* p = t.data<T>();
    fill(p, t.numel());
  });
  if (opt.device != kCPU) t = raw::to_device(t, opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else {
    return T(v);
  }
}

}  // namespace

Tensor arange(Scalar end, TensorOptions opt) { return arange(0, end, 1, opt); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opt) {
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  ACCEL_CHECK(st != 0, ValueError, "arange", "step must be nonzero");
  ACCEL_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), ValueError, "arange", "step ", st,
              " does not move from ", s, " towards ", e);
  const double count = std::ceil((e - s) / st);
  // Converting a double beyond int64 is undefined; the size check proper happens in empty_for.
  ACCEL_CHECK(std::isfinite(count) && count < 0x1p62, ValueError, "arange", "[", s, ", ", e,
              ") in steps of ", st, " has ", count, " elements, too many for a tensor");
  const int64_t n = int64_t(count);
  const bool exact_int = start.is_int && end.is_int && step.is_int;
  return make_on_cpu({n}, opt, "arange", [&]<typename T>(T* p, int64_t cnt) {
    for (int64_t i = 0; i < cnt; ++i) {
      if (exact_int && is_integral(opt.dtype)) {
        p[i] = from_double<T>(double(start.i + i * step.i));
      } else {
        p[i] = from_double<T>(s + double(i) * st);
      }
    }
  });
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions opt) {
  ACCEL_CHECK(steps >= 0, ValueError, "linspace", "steps must be >= 0, got ", steps);
  return make_on_cpu({steps}, opt, "linspace", [&]<typename T>(T* p, int64_t n) {
    const double d = n > 1 ? (end - start) / double(n - 1) : 0.0;
    for (int64_t i = 0; i < n; ++i) p[i] = from_double<T>(start + double(i) * d);
  });
}

Tensor eye(int64_t n, TensorOptions opt) {
  ACCEL_CHECK(n >= 0, ValueError, "eye", "n must be >= 0, got ", n);
  return make_on_cpu({n, n}, opt, "eye", [&]<typename T>(T* p, int64_t cnt) {
    for (int64_t i = 0; i < cnt; ++i) p[i] = from_double<T>((i / n) == (i % n) ? 1.0 : 0.0);
  });
}

Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opt, Generator* gen) {
  ACCEL_CHECK(is_floating(opt.dtype), DTypeError, "uniform", "expected a floating dtype, got ",
              opt.dtype);
  Generator& g = gen ? *gen : default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  return make_on_cpu(shape, opt, "uniform", [&]<typename T>(T* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = from_double<T>(lo + (hi - lo) * g.next_double());
  });
}

Tensor rand(const Shape& shape, TensorOptions opt, Generator* gen) {
  return uniform(shape, 0.0, 1.0, opt, gen);
}

Tensor randn(const Shape& shape, TensorOptions opt, Generator* gen) {
  ACCEL_CHECK(is_floating(opt.dtype), DTypeError, "randn", "expected a floating dtype, got ",
              opt.dtype);
  Generator& g = gen ? *gen : default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  return make_on_cpu(shape, opt, "randn", [&]<typename T>(T* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = from_double<T>(g.next_normal());
  });
}

Tensor randint(int64_t lo, int64_t hi, const Shape& shape, TensorOptions opt, Generator* gen) {
  ACCEL_CHECK(hi > lo, ValueError, "randint", "empty range [", lo, ", ", hi, ")");
  Generator& g = gen ? *gen : default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  const uint64_t range = uint64_t(hi - lo);
  return make_on_cpu(shape, opt, "randint", [&]<typename T>(T* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      p[i] = from_double<T>(double(lo + int64_t(g.next_u64() % range)));
  });
}

Tensor randperm(int64_t n, Generator* gen) {
  ACCEL_CHECK(n >= 0, ValueError, "randperm", "n must be >= 0, got ", n);
  Generator& g = gen ? *gen : default_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  Tensor t = empty({n}, kInt64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  // Fisher-Yates, high to low.
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = int64_t(g.next_u64() % uint64_t(i + 1));
    std::swap(p[i], p[j]);
  }
  return t;
}

Tensor rand_like(const Tensor& t, Generator* gen) {
  ACCEL_CHECK(t.defined(), ValueError, "rand_like", "tensor is undefined");
  ACCEL_CHECK(t.is_floating_point(), DTypeError, "rand_like", "expected a floating tensor, got ",
              t.dtype(), " of shape ", t.sizes());
  return rand(t.sizes(), TensorOptions(t.dtype(), t.device()), gen);
}

Tensor randn_like(const Tensor& t, Generator* gen) {
  ACCEL_CHECK(t.defined(), ValueError, "randn_like", "tensor is undefined");
  ACCEL_CHECK(t.is_floating_point(), DTypeError, "randn_like", "expected a floating tensor, got ",
              t.dtype(), " of shape ", t.sizes());
  return randn(t.sizes(), TensorOptions(t.dtype(), t.device()), gen);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                 std::function<void(void*)> deleter) {
  return from_blob(data, shape, contiguous_strides(shape), dtype, device, std::move(deleter));
}

Tensor from_blob(void* data, const Shape& shape, const Shape& strides, DType dtype, Device device,
                 std::function<void(void*)> deleter) {
  checked_numel(shape, "from_blob");
  const size_t nbytes = checked_span_bytes(shape, strides, dtype_size(dtype), "from_blob");
  auto storage = make_intrusive<Storage>(data, nbytes, device, std::move(deleter));
  return Tensor(make_intrusive<TensorImpl>(std::move(storage), shape, strides, 0, dtype));
}

template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, TensorOptions opt) {
  const int64_t n = checked_numel(shape, "tensor");
  ACCEL_CHECK(n == int64_t(values.size()), ShapeError, "tensor", "shape ", shape, " holds ", n,
              " elements but ", values.size(), " values were given");
  Tensor host = from_blob(const_cast<T*>(values.data()), shape, dtype_of<T>::value);
  Tensor t = empty(shape, opt.dtype);
  raw::copy_(t, host, /*bump_version=*/false);  // a new tensor starts at version 0
  if (opt.device != kCPU) t = raw::to_device(t, opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}
template Tensor tensor<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor tensor<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);

Tensor tensor(std::initializer_list<float> values, TensorOptions opt) {
  std::vector<float> v(values);
  return tensor<float>(v, Shape{int64_t(v.size())}, opt);
}
Tensor tensor(const std::vector<float>& values, const Shape& shape, TensorOptions opt) {
  return tensor<float>(values, shape, opt);
}
Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opt) {
  return tensor<double>(values, shape, opt);
}
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape, TensorOptions opt) {
  return tensor<int64_t>(values, shape, opt);
}
Tensor tensor(const std::vector<int32_t>& values, const Shape& shape, TensorOptions opt) {
  return tensor<int32_t>(values, shape, opt);
}

Tensor scalar_tensor(Scalar v, TensorOptions opt) { return full({}, v, opt); }

// ---------------- element access ----------------

template <typename T>
T Tensor::item() const {
  ACCEL_CHECK(defined(), ValueError, "item", "tensor is undefined");
  ACCEL_CHECK(numel() == 1, ShapeError, "item", "a tensor with ", numel(),
              " elements cannot be converted to a scalar; shape ", sizes());
  Tensor c = raw::to_device(*this, kCPU);
  return ACCEL_DISPATCH_ALL(c.dtype(), "item", [&]<typename S>() -> T {
    const S v = *static_cast<const S*>(c.data_ptr());
    if constexpr (std::is_same_v<T, bool>) {
      return double(v) != 0;
    } else {
      return T(double(v));
    }
  });
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template bool Tensor::item<bool>() const;

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = raw::to_device(*this, kCPU);
  Tensor d = empty(c.sizes(), TensorOptions(dtype_of<T>::value));
  raw::copy_(d, c, /*bump_version=*/false);
  const T* p = d.data<T>();
  return std::vector<T>(p, p + d.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

std::vector<double> Tensor::tolist() const { return to_vector<double>(); }

// ---------------- printing ----------------

namespace {

void print_rec(std::ostream& os, const std::vector<double>& v, const Shape& shape, size_t d,
               int64_t base, const Shape& cstr, bool floating, int indent) {
  constexpr int64_t kEdge = 3, kSummarise = 1000;
  const bool summarise = shape_numel(shape) > kSummarise;
  if (d == shape.size()) {
    const double x = v[size_t(base)];
    if (floating) {
      os << std::fixed << std::setprecision(4) << x;
    } else {
      os << int64_t(x);
    }
    return;
  }
  os << '[';
  const int64_t n = shape[d];
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdge && i == kEdge) {
      os << "...";
      i = n - kEdge - 1;
      os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
      continue;
    }
    print_rec(os, v, shape, d + 1, base + i * cstr[d], cstr, floating, indent + 1);
    if (i + 1 < n)
      os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
  }
  os << ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const std::vector<double> v = tolist();
  print_rec(os, v, sizes(), 0, 0, contiguous_strides(sizes()), is_floating_point(), 7);
  if (dtype() != kFloat32 && dtype() != kInt64) os << ", dtype=" << dtype();
  if (!device().is_cpu()) os << ", device='" << device() << "'";
  if (requires_grad()) os << ", requires_grad=True";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace accel
