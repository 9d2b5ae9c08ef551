#include "core/dispatch_optim.h"

namespace accel {

ACCEL_DEFINE_STUB(adamw_stub);

}  // namespace accel
