// Tensor: a strided view (shape, strides, offset, dtype) over a shared Storage, plus optional
// autograd metadata. Copying a Tensor copies a reference; views share storage.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/intrusive_ptr.h"
#include "core/shape.h"
#include "core/small_pool.h"
#include "core/storage.h"

namespace accel {

class Tensor;
class Generator;
namespace autograd {
class Node;
}
namespace indexing {
class TensorIndex;  // core/tensor_index.h: an int, Slice, None, Ellipsis, bool or Tensor
}

// A scalar argument (python-number-like): a double, or an int64 that stays exact.
struct Scalar {
  double d = 0;
  int64_t i = 0;
  bool is_int = false;
  Scalar() = default;
  Scalar(double v) : d(v), i(int64_t(v)), is_int(false) {}  // NOLINT
  Scalar(float v) : Scalar(double(v)) {}                    // NOLINT
  Scalar(int v) : d(v), i(v), is_int(true) {}               // NOLINT
  Scalar(int64_t v) : d(double(v)), i(v), is_int(true) {}   // NOLINT
  Scalar(bool v) : d(v), i(v), is_int(true) {}              // NOLINT
  double to_double() const { return is_int ? double(i) : d; }
  int64_t to_int() const { return is_int ? i : int64_t(d); }
};

// Gradient hook: receives the incoming gradient; returning a defined tensor replaces it.
using GradHook = std::function<Tensor(const Tensor&)>;
// Runs after a leaf's .grad has been accumulated (DDP's "grad ready" signal).
using PostAccumulateHook = std::function<void(Tensor&)>;
struct AutogradMeta;  // below Tensor

class TensorImpl : public RefCounted {
 public:
  TensorImpl(StoragePtr storage, Shape sizes, Shape strides, int64_t offset, DType dtype);
  // A new contiguous tensor at offset 0 (empty(), every op's output): strides computed in place.
  TensorImpl(StoragePtr storage, const Shape& sizes, DType dtype);
  ~TensorImpl() override;
  // Note [small object pool] (core/small_pool.cc).
  static void* operator new(size_t n) { return small_pool_alloc(n); }
  static void operator delete(void* p, size_t n) noexcept { small_pool_free(p, n); }

  StoragePtr storage_;
  Shape sizes_;
  Shape strides_;
  int64_t offset_ = 0;  // in elements
  int64_t numel_ = 0;
  DType dtype_;
  bool is_contiguous_ = true;
  std::unique_ptr<AutogradMeta> autograd_;
  // Note [views and in-place autograd] (autograd/function.h): set by the differentiable view ops
  // (view, slice, select, transpose, ...) to the tensor whose storage this one views, which is
  // never itself such a view; null for every other tensor (detach() and op outputs included).
  IntrusivePtr<TensorImpl> view_base_;
  bool view_no_grad_ = false;  // the view was made while grad mode was off

  void refresh();  // recompute numel_ and is_contiguous_ after sizes/strides change
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(IntrusivePtr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return bool(impl_); }
  TensorImpl* impl() const { return impl_.get(); }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata ----
  DType dtype() const { return impl_->dtype_; }
  Device device() const { return impl_->storage_->device(); }
  int64_t dim() const { return int64_t(impl_->sizes_.size()); }
  const Shape& sizes() const { return impl_->sizes_; }
  const Shape& shape() const { return impl_->sizes_; }
  const Shape& strides() const { return impl_->strides_; }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return impl_->numel_; }
  int64_t offset() const { return impl_->offset_; }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const { return impl_->is_contiguous_; }
  bool is_floating_point() const { return is_floating(dtype()); }
  const StoragePtr& storage() const { return impl_->storage_; }
  // Pointer to the first element (storage base + offset).
  void* data_ptr() const {
    return static_cast<char*>(impl_->storage_->data()) + impl_->offset_ * int64_t(element_size());
  }
  template <typename T>
  T* data() const;          // checks dtype_of<T> == dtype()
  std::string str() const;  // printing, like torch's repr
  std::string shape_str() const { return accel::shape_str(sizes()); }

  // ---- views (share storage; differentiable) ----
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers
  Tensor reshape(const Shape& shape) const;  // view when possible, else copy
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const Shape& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;  // self when already contiguous, else a copy
  Tensor operator[](int64_t i) const { return select(0, i); }
  Tensor operator[](const Tensor& index) const;  // index({index}): x[idx], x[mask]

  // ---- conversion ----
  Tensor to(DType t) const;  // differentiable between floating types
  Tensor to(Device d, bool non_blocking = false) const;
  Tensor to(Device d, DType t) const { return to(d).to(t); }
  Tensor cpu() const { return to(kCPU); }
  Tensor clone() const;
  // Value of a one-element tensor.
  template <typename T>
  T item() const;
  double item() const { return item<double>(); }
  std::vector<double> tolist() const;  // flattened, as doubles (tests, printing)
  template <typename T>
  std::vector<T> to_vector() const;  // flattened, converted to T

  // ---- in-place (defined in autograd/ops/inplace.cc) ----
  // Recorded by autograd as in PyTorch (Note [in-place ops] in autograd/function.h): the tensor's
  // grad_fn becomes the op's node and its version is bumped; in place through a view rebases the
  // base's history. While grad mode is on they refuse a leaf that requires grad (and views of
  // one); under NoGradGuard they write without recording (optimizers, init). A backward that
  // needs a value overwritten since its forward throws ValueError naming the op.
  Tensor& copy_(const Tensor& src);  // broadcasts src; converts dtype/device
  Tensor& fill_(Scalar v);
  Tensor& zero_() { return fill_(0); }
  Tensor& add_(const Tensor& o, Scalar alpha = 1);
  Tensor& sub_(const Tensor& o) { return sub_(o, 1); }
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(Scalar s);
  Tensor& div_(Scalar s);
  Tensor& clamp_(Scalar lo, Scalar hi);
  Tensor& clamp_min_(Scalar lo);
  Tensor& clamp_max_(Scalar hi);
  Tensor& pow_(Scalar e);
  Tensor& pow_(const Tensor& e);
  Tensor& neg_();
  Tensor& exp_();
  Tensor& log_();
  Tensor& sqrt_();
  Tensor& rsqrt_();
  Tensor& abs_();
  Tensor& relu_();
  Tensor& sigmoid_();
  Tensor& tanh_();
  Tensor& sin_();
  Tensor& cos_();
  Tensor& reciprocal_();
  Tensor& square_();
  Tensor& log1p_();
  Tensor& expm1_();
  Tensor& erf_();
  // Compound assignment: the in-place ops above (`out += identity` records add_).
  Tensor& operator+=(const Tensor& o) { return add_(o); }
  Tensor& operator+=(Scalar s) { return add_(s); }
  Tensor& operator-=(const Tensor& o) { return sub_(o); }
  Tensor& operator-=(Scalar s) { return sub_(s); }
  Tensor& operator*=(const Tensor& o) { return mul_(o); }
  Tensor& operator*=(Scalar s) { return mul_(s); }
  Tensor& operator/=(const Tensor& o) { return div_(o); }
  Tensor& operator/=(Scalar s) { return div_(s); }

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool r = true);
  Tensor& set_requires_grad(bool r) { return requires_grad_(r); }
  bool is_leaf() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Accumulated gradient; undefined Tensor when none yet.
  Tensor grad() const;
  void set_grad(const Tensor& g);
  void zero_grad(bool set_to_none = true);
  void retain_grad();
  // Reverse-mode from this tensor, libtorch's signature. `gradient` defaults to ones for a
  // one-element tensor; retain_graph defaults to create_graph; create_graph records the
  // gradients' own graph, so .grad of the leaves has history (Note [double backward] in
  // autograd/engine.h).
  void backward(const Tensor& gradient = Tensor(), std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false) const;
  Tensor detach() const;  // shares storage (and its version counter), no history
  Tensor& detach_();
  // libtorch's `t.data()` (torch's `t.data`): a detached alias, so `p.data().add_(u)` updates a
  // parameter without recording. Unlike torch it shares the version counter with `t`.
  Tensor data() const { return detach(); }
  // The storage's version counter, bumped by every in-place write (torch's `t._version`).
  uint32_t version() const { return impl_->storage_->version(); }
  // A view made by a differentiable view op, and the tensor it views (Note [views and in-place
  // autograd]); view_base() is undefined for a non-view.
  bool is_view() const { return bool(impl_->view_base_); }
  Tensor view_base() const { return Tensor(impl_->view_base_); }
  void register_hook(GradHook hook);
  void register_post_accumulate_grad_hook(PostAccumulateHook hook);
  AutogradMeta& autograd_meta();  // creates when absent
  AutogradMeta* autograd_meta_if() const { return impl_->autograd_.get(); }

  // ---- arithmetic sugar (defined with the ops) ----
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& o) const;
  Tensor pow(Scalar e) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor abs() const;
  Tensor sqrt() const;
  Tensor relu() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  // ---- ops as methods (defined in autograd/ops/methods.cc) ----
  // The torch.Tensor methods of the free ops in autograd/ops.h, each a one-line call of its free
  // function (same defaults, same errors, same autograd). tests/autograd/test_tensor_methods.cc
  // fails when an op of ops.h has neither a method here nor a reason in its exclusion list.
  // C++ keywords cannot be method names: t.float()/double()/int()/long()/bool() are
  // t.float32()/float64()/int32()/int64()/to(kBool). In-place variants (trailing _) compute
  // the op, then copy into this tensor; a result of another dtype or shape is an error.
  Tensor add(const Tensor& other, Scalar alpha = 1) const;
  Tensor add(Scalar other) const;
  Tensor sub(const Tensor& other, Scalar alpha = 1) const;
  Tensor sub(Scalar other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(Scalar other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(Scalar other) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;
  Tensor eq(Scalar other) const;
  Tensor ne(const Tensor& other) const;
  Tensor ne(Scalar other) const;
  Tensor lt(const Tensor& other) const;
  Tensor lt(Scalar other) const;
  Tensor le(const Tensor& other) const;
  Tensor le(Scalar other) const;
  Tensor gt(const Tensor& other) const;
  Tensor gt(Scalar other) const;
  Tensor ge(const Tensor& other) const;
  Tensor ge(Scalar other) const;
  Tensor logical_and(const Tensor& other) const;
  Tensor logical_or(const Tensor& other) const;
  Tensor logical_not() const;
  bool equal(const Tensor& other) const;
  bool allclose(const Tensor& other, double rtol = 1e-5, double atol = 1e-8) const;
  Tensor neg() const;
  Tensor rsqrt() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor sign() const;
  Tensor reciprocal() const;
  Tensor square() const;
  Tensor log1p() const;
  Tensor expm1() const;
  Tensor erf() const;
  Tensor clamp(std::optional<Scalar> lo, std::optional<Scalar> hi = std::nullopt) const;
  Tensor masked_fill(const Tensor& mask, Scalar value) const;
  Tensor amax(const Shape& dims = {}, bool keepdim = false) const;
  Tensor amin(const Shape& dims = {}, bool keepdim = false) const;
  Tensor max() const;  // over everything, 0-dim
  Tensor min() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;  // values, indices
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;  // flattened index
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  Tensor var(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std_dev(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const Shape& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor prod(const Shape& dims = {}, bool keepdim = false) const;
  Tensor norm(double p = 2.0) const;
  Tensor mm(const Tensor& other) const;
  Tensor bmm(const Tensor& other) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor index_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  // in-place
  Tensor& add_(Scalar other);
  Tensor& sub_(Scalar other);
  Tensor& sub_(const Tensor& other, Scalar alpha);
  Tensor& div_(const Tensor& other);
  Tensor& masked_fill_(const Tensor& mask, Scalar value);
  Tensor& index_add_(int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& scatter_add_(int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& tril_(int64_t diagonal = 0);
  Tensor& triu_(int64_t diagonal = 0);
  // conversion
  Tensor to(Device d, DType t, bool non_blocking) const;
  Tensor to(const Tensor& other, bool non_blocking = false) const;  // other's device and dtype
  Tensor type_as(const Tensor& other) const;                        // other's dtype
  Tensor float32() const;
  Tensor float64() const;
  Tensor half() const;
  Tensor bfloat16() const;
  Tensor int32() const;
  Tensor int64() const;
  Tensor cuda(int index = 0, bool non_blocking = false) const;
  bool is_cuda() const;
  bool is_cpu() const;
  // indexing (autograd/ops/indexing.cc, docs/indexing.md): t.index({Slice(), idx, None, "...",
  // 3, mask}) is t[:, idx, None, ..., 3, mask] (core/tensor_index.h); index_put_ is assignment
  // t[...] = values (accumulate: +=, duplicates summed).
  Tensor index(const std::vector<indexing::TensorIndex>& indices) const;
  Tensor index_put(const std::vector<indexing::TensorIndex>& indices, const Tensor& values,
                   bool accumulate = false) const;
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& values,
                     bool accumulate = false);
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, Scalar value);
  Tensor masked_select(const Tensor& mask) const;
  Tensor masked_scatter(const Tensor& mask, const Tensor& source) const;
  Tensor& masked_scatter_(const Tensor& mask, const Tensor& source);
  Tensor take_along_dim(const Tensor& indices, std::optional<int64_t> dim = std::nullopt) const;
  Tensor nonzero() const;                     // (n, dim) int64 coordinates
  std::vector<Tensor> nonzero_numpy() const;  // torch's nonzero(as_tuple=True)
  // sorting and sampling (autograd/ops/sort.cc); indices are int64
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false,
                                  bool stable = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false, bool stable = false) const;
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true,
                                  bool sorted = true) const;
  Tensor multinomial(int64_t num_samples, bool replacement = false, Generator* gen = nullptr) const;
  // shapes, norms
  Tensor repeat(const Shape& repeats) const;
  Tensor view_as(const Tensor& other) const;
  // p: any real, INFINITY, -INFINITY; "fro" (2-norm over dims); dims empty = all dims.
  Tensor norm(double p, const Shape& dims, bool keepdim = false) const;
  Tensor norm(std::string_view p, const Shape& dims = {}, bool keepdim = false) const;
  // New tensors with this tensor's dtype and device (torch.Tensor.new_*).
  Tensor new_empty(const Shape& shape) const;
  Tensor new_zeros(const Shape& shape) const;
  Tensor new_ones(const Shape& shape) const;
  Tensor new_full(const Shape& shape, Scalar value) const;

 private:
  IntrusivePtr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

struct AutogradMeta {
  static void* operator new(size_t n) { return small_pool_alloc(n); }
  static void operator delete(void* p, size_t n) noexcept { small_pool_free(p, n); }
  bool requires_grad = false;
  bool retains_grad = false;
  uint32_t output_nr = 0;                          // which output of grad_fn this tensor is
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only, created lazily
  std::vector<GradHook> hooks;                     // leaves: run by AccumulateGrad
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  Tensor grad;                            // accumulated gradient (leaves)
  std::shared_ptr<Tensor> retained_grad;  // non-leaves after retain_grad()
  std::string name;                       // optional, shows up in error messages
  uint32_t attr_version = 0;  // views: the version grad_fn was made for (Note [views and in-place
                              // autograd]); a view whose base moved on gets a fresh one
};

// A view (of a base made in grad mode) requires grad when its base does: an in-place write
// through a sibling view may have given the base history after this view was made.
inline bool Tensor::requires_grad() const {
  const TensorImpl* i = impl_.get();
  if (i->autograd_ && i->autograd_->requires_grad) return true;
  const TensorImpl* b = i->view_base_.get();
  return b && !i->view_no_grad_ && b->autograd_ && b->autograd_->requires_grad;
}
inline bool Tensor::is_leaf() const {
  if (impl_->view_base_) [[unlikely]]
    return !grad_fn();  // a view's history may have to be regenerated first
  return !impl_->autograd_ || !impl_->autograd_->grad_fn;
}

// ---- creation (options: dtype, device, requires_grad) ----
struct TensorOptions {
  DType dtype = kFloat32;
  Device device = kCPU;
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}    // NOLINT
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  TensorOptions& with_dtype(DType t) {
    dtype = t;
    return *this;
  }
  TensorOptions& with_device(Device d) {
    device = d;
    return *this;
  }
  TensorOptions& with_requires_grad(bool r = true) {
    requires_grad = r;
    return *this;
  }
};

Tensor empty(const Shape& shape, TensorOptions opt = {});
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opt = {});
Tensor zeros(const Shape& shape, TensorOptions opt = {});
Tensor ones(const Shape& shape, TensorOptions opt = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions opt = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
// [start, end) with step; dtype int64 unless given.
Tensor arange(Scalar end, TensorOptions opt = TensorOptions(kInt64));
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opt = TensorOptions(kInt64));
Tensor linspace(double start, double end, int64_t steps, TensorOptions opt = {});
Tensor eye(int64_t n, TensorOptions opt = {});
// Uniform [0, 1) / [lo, hi), standard normal, integers in [lo, hi).
Tensor rand(const Shape& shape, TensorOptions opt = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opt = {},
               Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opt = {}, Generator* gen = nullptr);
Tensor randint(int64_t lo, int64_t hi, const Shape& shape,
               TensorOptions opt = TensorOptions(kInt64), Generator* gen = nullptr);
Tensor randperm(int64_t n, Generator* gen = nullptr);
// rand / randn with t's shape, dtype (floating) and device.
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
// Wraps external memory without copying. `deleter` (may be empty) runs when storage dies.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = kCPU,
                 std::function<void(void*)> deleter = {});
Tensor from_blob(void* data, const Shape& shape, const Shape& strides, DType dtype,
                 Device device = kCPU, std::function<void(void*)> deleter = {});
// Copies host values into a new tensor. Shape defaults to {values.size()}.
template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, TensorOptions opt);
Tensor tensor(std::initializer_list<float> values, TensorOptions opt = {});
Tensor tensor(const std::vector<float>& values, const Shape& shape, TensorOptions opt = {});
Tensor tensor(const std::vector<double>& values, const Shape& shape,
              TensorOptions opt = TensorOptions(kFloat64));
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape,
              TensorOptions opt = TensorOptions(kInt64));
Tensor tensor(const std::vector<int32_t>& values, const Shape& shape,
              TensorOptions opt = TensorOptions(kInt32));
Tensor scalar_tensor(Scalar v, TensorOptions opt = {});

// ---- grad mode ----
bool grad_enabled();
void set_grad_enabled(bool e);
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- implementation helpers for templates ----
template <typename T>
T* Tensor::data() const {
  ACCEL_CHECK(dtype_of<T>::value == dtype(), DTypeError, "data", "tensor has dtype ", dtype(),
              ", requested ", dtype_of<T>::value);
  return static_cast<T*>(data_ptr());
}

}  // namespace accel
