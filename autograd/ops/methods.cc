// Tensor methods of the free ops (core/tensor.h, "ops as methods"): each is one call of the free
// function in autograd/ops.h, so defaults, errors and autograd are the free function's. Free
// functions are called qualified: inside a member, an unqualified name finds the method first.
#include "autograd/function.h"
#include "autograd/ops.h"

namespace accel {

ACCEL_DIFFERENTIABLE_OP(index_add_, "index_add_");
ACCEL_DIFFERENTIABLE_OP(scatter_add_, "scatter_add_");
ACCEL_DIFFERENTIABLE_OP(tril_, "tril_");
ACCEL_DIFFERENTIABLE_OP(triu_, "triu_");
ACCEL_DIFFERENTIABLE_OP(index_put_, "index_put_");
ACCEL_DIFFERENTIABLE_OP(masked_scatter_, "masked_scatter_");

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

// In-place methods with no backward of their own: the out-of-place op, stored into self by
// autograd::inplace_method (Note [in-place methods] in autograd/function.h), which records it.
// None reads self's old value in its backward. (add_, sub_, div_ are in ops/inplace.cc;
// masked_fill_ is in ops/unary.cc with its in-place kernel.)
Tensor& Tensor::index_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  return autograd::inplace_method(*this, "index_add_", {src},
                                  [&](const Tensor& s, const std::vector<Tensor>& o) {
                                    return accel::index_add(s, dim, index, o[0]);
                                  });
}
Tensor& Tensor::scatter_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  return autograd::inplace_method(*this, "scatter_add_", {src},
                                  [&](const Tensor& s, const std::vector<Tensor>& o) {
                                    return accel::scatter_add(s, dim, index, o[0]);
                                  });
}
Tensor& Tensor::tril_(int64_t diagonal) {
  return autograd::inplace_method(
      *this, "tril_", {},
      [&](const Tensor& s, const std::vector<Tensor>&) { return accel::tril(s, diagonal); });
}
Tensor& Tensor::triu_(int64_t diagonal) {
  return autograd::inplace_method(
      *this, "triu_", {},
      [&](const Tensor& s, const std::vector<Tensor>&) { return accel::triu(s, diagonal); });
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
// index_put_ and masked_scatter_ are autograd::inplace_method calls (Note [in-place methods] in
// autograd/function.h); neither backward reads self's old value.
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& values,
                           bool accumulate) {
  return autograd::inplace_method(*this, "index_put_", {values},
                                  [&](const Tensor& s, const std::vector<Tensor>& o) {
                                    return accel::index_put(s, indices, o[0], accumulate);
                                  });
}
Tensor& Tensor::index_put_(const std::vector<indexing::TensorIndex>& indices, Scalar value) {
  return autograd::inplace_method(
      *this, "index_put_", {}, [&](const Tensor& s, const std::vector<Tensor>&) {
        return accel::index_put(s, indices, full({}, value, TensorOptions(s.dtype(), s.device())));
      });
}
Tensor Tensor::masked_select(const Tensor& mask) const { return accel::masked_select(*this, mask); }
Tensor Tensor::masked_scatter(const Tensor& mask, const Tensor& source) const {
  return accel::masked_scatter(*this, mask, source);
}
Tensor& Tensor::masked_scatter_(const Tensor& mask, const Tensor& source) {
  return autograd::inplace_method(*this, "masked_scatter_", {source},
                                  [&](const Tensor& s, const std::vector<Tensor>& o) {
                                    return accel::masked_scatter(s, mask, o[0]);
                                  });
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
