// Tensor methods of the free ops (core/tensor.h, "ops as methods"): each is one call of the free
// function in autograd/ops.h, so defaults, errors and autograd are the free function's. Free
// functions are called qualified: inside a member, an unqualified name finds the method first.
#include "autograd/ops.h"

namespace accel {

namespace {

// Note [in-place methods]
// An in-place method computes the out-of-place op and copies the result into `self`. The checks
// before the copy keep it from being silently lossy, as torch refuses the same cases: an
// int tensor's add_(0.5) would truncate (the op promotes to float), a broadcast that grows the
// result would not fit. The grad-mode check comes first so that no graph is recorded for a call
// that is refused anyway.
void check_inplace_method(const Tensor& self, const char* op) {
  ACCEL_CHECK(self.defined(), ValueError, op, "tensor is undefined");
  ACCEL_CHECK(!(grad_enabled() && self.requires_grad()), ValueError, op,
              "in-place operation on a tensor that requires grad (shape ", self.sizes(),
              "); wrap it in NoGradGuard or use detach()");
}

Tensor& assign_inplace(Tensor& self, const Tensor& result, const char* op) {
  ACCEL_CHECK(result.dtype() == self.dtype(), DTypeError, op, "result dtype ", result.dtype(),
              " cannot be stored in place into a ", self.dtype(), " tensor");
  ACCEL_CHECK(result.sizes() == self.sizes(), ShapeError, op, "result shape ", result.sizes(),
              " differs from the in-place tensor's shape ", self.sizes());
  return self.copy_(result);
}

}  // namespace

Tensor Tensor::add(const Tensor& other, Scalar alpha) const {
  return accel::add(*this, other, alpha);
}
Tensor Tensor::add(Scalar other) const { return accel::add(*this, other); }
Tensor Tensor::sub(const Tensor& other, Scalar alpha) const {
  return accel::sub(*this, other, alpha);
}
Tensor Tensor::sub(Scalar other) const { return accel::sub(*this, other); }
Tensor Tensor::mul(const Tensor& other) const { return accel::mul(*this, other); }
Tensor Tensor::mul(Scalar other) const { return accel::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return accel::div(*this, other); }
Tensor Tensor::div(Scalar other) const { return accel::div(*this, other); }
Tensor Tensor::pow(const Tensor& exponent) const { return accel::pow(*this, exponent); }
Tensor Tensor::maximum(const Tensor& other) const { return accel::maximum(*this, other); }
Tensor Tensor::minimum(const Tensor& other) const { return accel::minimum(*this, other); }

Tensor Tensor::eq(const Tensor& other) const { return accel::eq(*this, other); }
Tensor Tensor::eq(Scalar other) const { return accel::eq(*this, other); }
Tensor Tensor::ne(const Tensor& other) const { return accel::ne(*this, other); }
Tensor Tensor::ne(Scalar other) const { return accel::ne(*this, other); }
Tensor Tensor::lt(const Tensor& other) const { return accel::lt(*this, other); }
Tensor Tensor::lt(Scalar other) const { return accel::lt(*this, other); }
Tensor Tensor::le(const Tensor& other) const { return accel::le(*this, other); }
Tensor Tensor::le(Scalar other) const { return accel::le(*this, other); }
Tensor Tensor::gt(const Tensor& other) const { return accel::gt(*this, other); }
Tensor Tensor::gt(Scalar other) const { return accel::gt(*this, other); }
Tensor Tensor::ge(const Tensor& other) const { return accel::ge(*this, other); }
Tensor Tensor::ge(Scalar other) const { return accel::ge(*this, other); }
Tensor Tensor::logical_and(const Tensor& other) const { return accel::logical_and(*this, other); }
Tensor Tensor::logical_or(const Tensor& other) const { return accel::logical_or(*this, other); }
Tensor Tensor::logical_not() const { return accel::logical_not(*this); }
bool Tensor::equal(const Tensor& other) const { return accel::equal(*this, other); }
bool Tensor::allclose(const Tensor& other, double rtol, double atol) const {
  return accel::allclose(*this, other, rtol, atol);
}

Tensor Tensor::neg() const { return accel::neg(*this); }
Tensor Tensor::rsqrt() const { return accel::rsqrt(*this); }
Tensor Tensor::tanh() const { return accel::tanh(*this); }
Tensor Tensor::sigmoid() const { return accel::sigmoid(*this); }
Tensor Tensor::sin() const { return accel::sin(*this); }
Tensor Tensor::cos() const { return accel::cos(*this); }
Tensor Tensor::sign() const { return accel::sign(*this); }
Tensor Tensor::reciprocal() const { return accel::reciprocal(*this); }
Tensor Tensor::square() const { return accel::square(*this); }
Tensor Tensor::log1p() const { return accel::log1p(*this); }
Tensor Tensor::expm1() const { return accel::expm1(*this); }
Tensor Tensor::erf() const { return accel::erf(*this); }
Tensor Tensor::clamp(std::optional<Scalar> lo, std::optional<Scalar> hi) const {
  return accel::clamp(*this, lo, hi);
}
Tensor Tensor::masked_fill(const Tensor& mask, Scalar value) const {
  return accel::masked_fill(*this, mask, value);
}

Tensor Tensor::amax(const Shape& dims, bool keepdim) const {
  return accel::amax(*this, dims, keepdim);
}
Tensor Tensor::amin(const Shape& dims, bool keepdim) const {
  return accel::amin(*this, dims, keepdim);
}
Tensor Tensor::max() const { return accel::max(*this); }
Tensor Tensor::min() const { return accel::min(*this); }
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const {
  return accel::max(*this, dim, keepdim);
}
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const {
  return accel::min(*this, dim, keepdim);
}
Tensor Tensor::argmax() const { return accel::argmax(*this); }
Tensor Tensor::argmin(int64_t dim, bool keepdim) const {
  return accel::argmin(*this, dim, keepdim);
}
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim) const {
  return accel::var(*this, dims, correction, keepdim);
}
Tensor Tensor::std_dev(const Shape& dims, int64_t correction, bool keepdim) const {
  return accel::std_dev(*this, dims, correction, keepdim);
}
Tensor Tensor::std(const Shape& dims, int64_t correction, bool keepdim) const {
  return accel::std_dev(*this, dims, correction, keepdim);
}
Tensor Tensor::prod(const Shape& dims, bool keepdim) const {
  return accel::prod(*this, dims, keepdim);
}
Tensor Tensor::norm(double p) const { return accel::norm(*this, p); }

Tensor Tensor::mm(const Tensor& other) const { return accel::mm(*this, other); }
Tensor Tensor::bmm(const Tensor& other) const { return accel::bmm(*this, other); }
Tensor Tensor::softmax(int64_t dim) const { return accel::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return accel::log_softmax(*this, dim); }

Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  return accel::index_select(*this, dim, index);
}
Tensor Tensor::gather(int64_t dim, const Tensor& index) const {
  return accel::gather(*this, dim, index);
}
Tensor Tensor::scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const {
  return accel::scatter_add(*this, dim, index, src);
}
Tensor Tensor::index_add(int64_t dim, const Tensor& index, const Tensor& src) const {
  return accel::index_add(*this, dim, index, src);
}
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const {
  return accel::split(*this, split_size, dim);
}
std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  return accel::split(*this, sizes, dim);
}
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  return accel::chunk(*this, chunks, dim);
}
Tensor Tensor::tril(int64_t diagonal) const { return accel::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return accel::triu(*this, diagonal); }

Tensor& Tensor::add_(Scalar other) {
  check_inplace_method(*this, "add_");
  return assign_inplace(*this, accel::add(*this, other), "add_");
}
Tensor& Tensor::sub_(Scalar other) {
  check_inplace_method(*this, "sub_");
  return assign_inplace(*this, accel::sub(*this, other), "sub_");
}
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  check_inplace_method(*this, "sub_");
  return assign_inplace(*this, accel::sub(*this, other, alpha), "sub_");
}
Tensor& Tensor::div_(const Tensor& other) {
  check_inplace_method(*this, "div_");
  return assign_inplace(*this, accel::div(*this, other), "div_");
}
Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) {
  check_inplace_method(*this, "masked_fill_");
  return assign_inplace(*this, accel::masked_fill(*this, mask, value), "masked_fill_");
}
Tensor& Tensor::index_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  check_inplace_method(*this, "index_add_");
  return assign_inplace(*this, accel::index_add(*this, dim, index, src), "index_add_");
}
Tensor& Tensor::scatter_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  check_inplace_method(*this, "scatter_add_");
  return assign_inplace(*this, accel::scatter_add(*this, dim, index, src), "scatter_add_");
}
Tensor& Tensor::tril_(int64_t diagonal) {
  check_inplace_method(*this, "tril_");
  return assign_inplace(*this, accel::tril(*this, diagonal), "tril_");
}
Tensor& Tensor::triu_(int64_t diagonal) {
  check_inplace_method(*this, "triu_");
  return assign_inplace(*this, accel::triu(*this, diagonal), "triu_");
}

Tensor Tensor::to(Device d, DType t, bool non_blocking) const { return to(d, non_blocking).to(t); }
Tensor Tensor::to(const Tensor& other, bool non_blocking) const {
  return to(other.device(), other.dtype(), non_blocking);
}
Tensor Tensor::type_as(const Tensor& other) const { return to(other.dtype()); }
Tensor Tensor::float32() const { return to(kFloat32); }
Tensor Tensor::float64() const { return to(kFloat64); }
Tensor Tensor::half() const { return to(kFloat16); }
Tensor Tensor::bfloat16() const { return to(kBFloat16); }
Tensor Tensor::int32() const { return to(kInt32); }
Tensor Tensor::int64() const { return to(kInt64); }
Tensor Tensor::cuda(int index, bool non_blocking) const {
  return to(Device::cuda(index), non_blocking);
}
bool Tensor::is_cuda() const { return device().is_cuda(); }
bool Tensor::is_cpu() const { return device().is_cpu(); }

Tensor Tensor::operator[](const Tensor& index) const { return accel::index(*this, {index}); }
Tensor Tensor::index(const std::vector<indexing::TensorIndex>& indices) const {
  return accel::index(*this, indices);
}
Tensor Tensor::index_put(const std::vector<indexing::TensorIndex>& indices, const Tensor& values,
                         bool accumulate) const {
  return accel::index_put(*this, indices, values, accumulate);
}
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& values,
                           bool accumulate) {
  check_inplace_method(*this, "index_put_");
  return assign_inplace(*this, accel::index_put(*this, indices, values, accumulate), "index_put_");
}
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, Scalar value) {
  check_inplace_method(*this, "index_put_");
  const Tensor v = full({}, value, TensorOptions(dtype(), device()));
  return assign_inplace(*this, accel::index_put(*this, indices, v), "index_put_");
}
Tensor Tensor::masked_select(const Tensor& mask) const { return accel::masked_select(*this, mask); }
Tensor Tensor::masked_scatter(const Tensor& mask, const Tensor& source) const {
  return accel::masked_scatter(*this, mask, source);
}
Tensor& Tensor::masked_scatter_(const Tensor& mask, const Tensor& source) {
  check_inplace_method(*this, "masked_scatter_");
  return assign_inplace(*this, accel::masked_scatter(*this, mask, source), "masked_scatter_");
}
Tensor Tensor::take_along_dim(const Tensor& indices, std::optional<int64_t> dim) const {
  return accel::take_along_dim(*this, indices, dim);
}
Tensor Tensor::nonzero() const { return accel::nonzero(*this); }
std::vector<Tensor> Tensor::nonzero_numpy() const { return accel::nonzero_numpy(*this); }
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending, bool stable) const {
  return accel::sort(*this, dim, descending, stable);
}
Tensor Tensor::argsort(int64_t dim, bool descending, bool stable) const {
  return accel::argsort(*this, dim, descending, stable);
}
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return accel::topk(*this, k, dim, largest, sorted);
}
Tensor Tensor::multinomial(int64_t num_samples, bool replacement, Generator* gen) const {
  return accel::multinomial(*this, num_samples, replacement, gen);
}
Tensor Tensor::repeat(const Shape& repeats) const { return accel::repeat(*this, repeats); }
Tensor Tensor::view_as(const Tensor& other) const {
  ACCEL_CHECK(other.defined(), ValueError, "view_as", "other tensor is undefined");
  return view(other.sizes());
}
Tensor Tensor::norm(double p, const Shape& dims, bool keepdim) const {
  return accel::norm(*this, p, dims, keepdim);
}
Tensor Tensor::norm(std::string_view p, const Shape& dims, bool keepdim) const {
  return accel::norm(*this, p, dims, keepdim);
}
Tensor Tensor::new_empty(const Shape& shape) const {
  return empty(shape, TensorOptions(dtype(), device()));
}
Tensor Tensor::new_zeros(const Shape& shape) const {
  return zeros(shape, TensorOptions(dtype(), device()));
}
Tensor Tensor::new_ones(const Shape& shape) const {
  return ones(shape, TensorOptions(dtype(), device()));
}
Tensor Tensor::new_full(const Shape& shape, Scalar value) const {
  return full(shape, value, TensorOptions(dtype(), device()));
}

}  // namespace accel
