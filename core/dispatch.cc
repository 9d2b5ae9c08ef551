#include "core/dispatch.h"

namespace accel::detail {

void throw_no_kernel(const char* op, Device d) {
  ACCEL_THROW(DeviceError, op, "no kernel registered for device ", d,
              d.is_cuda() ? " (accel was built without CUDA, or the op has no CUDA kernel yet)" : "");
}

}  // namespace accel::detail

namespace accel {
// Stubs of the elementwise family live with core because creation and in-place ops use them.
ACCEL_DEFINE_STUB(unary_stub);
ACCEL_DEFINE_STUB(binary_stub);
ACCEL_DEFINE_STUB(where_stub);
ACCEL_DEFINE_STUB(copy_stub);
ACCEL_DEFINE_STUB(fill_stub);
ACCEL_DEFINE_STUB(cross_device_copy_stub);
}  // namespace accel
