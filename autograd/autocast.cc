// Thread-local autocast state; see autograd/autocast.h and Note [autocast on CPU].
#include "autograd/autocast.h"

namespace accel {

namespace detail {
// initial-exec TLS like grad mode: the ops read it on every call.
constinit thread_local AutocastState tls_autocast __attribute__((tls_model("initial-exec")));
}  // namespace detail

namespace {
using detail::tls_autocast;

void check_low_precision(DType dtype) {
  ACCEL_CHECK(dtype == kBFloat16 || dtype == kFloat16, DTypeError, "autocast",
              "autocast dtype must be bfloat16 or float16, got ", dtype);
}
}  // namespace

void set_autocast_enabled(bool enabled) { tls_autocast.enabled = enabled; }
void set_autocast_dtype(DType dtype) {
  check_low_precision(dtype);
  tls_autocast.dtype = dtype;
}

AutocastGuard::AutocastGuard(bool enabled, DType dtype)
    : prev_enabled_(tls_autocast.enabled), prev_dtype_(tls_autocast.dtype) {
  check_low_precision(dtype);
  tls_autocast.enabled = enabled;
  tls_autocast.dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  tls_autocast.enabled = prev_enabled_;
  tls_autocast.dtype = prev_dtype_;
}

Tensor round_to_precision(const Tensor& x, DType dtype) {
  check_low_precision(dtype);
  ACCEL_CHECK(x.dtype() == kFloat32, DTypeError, "autocast", "round_to_precision expects float32, got ",
              x.dtype(), " of shape ", x.shape_str());
  return x.to(dtype).to(kFloat32);
}

Tensor autocast_cast(const Tensor& x) {
  if (!tls_autocast.enabled || !x.defined()) return x;
  const DType dt = x.dtype();
  if (dt != kFloat32 && dt != kBFloat16 && dt != kFloat16) return x;  // f64, integers, bool
  const DType low = tls_autocast.dtype;
  if (!x.device().is_cpu()) return dt == low ? x : x.to(low);
  // CPU (Note [autocast on CPU]): the values of `low`, held in float32. A low-precision input
  // (a bf16 activation the caller made) is brought to float32 the same way, so that it meets
  // the float32 weights.
  if (dt == low) return x.to(kFloat32);
  return x.to(low).to(kFloat32);
}

Tensor autocast_upcast(const Tensor& x) {
  if (!tls_autocast.enabled || !x.defined()) return x;
  if (x.dtype() == kBFloat16 || x.dtype() == kFloat16) return x.to(kFloat32);
  return x;
}

}  // namespace accel
