// The definitions of every kernel stub declared in kernels/stubs/ (one place, so that autograd/
// calls them and each backend registers into them without either depending on the other).
// core/dispatch.cc defines the copy/fill stubs core needs itself.
#include "kernels/stubs/conv.h"
#include "kernels/stubs/elementwise.h"
#include "kernels/stubs/index.h"
#include "kernels/stubs/linalg.h"
#include "kernels/stubs/nn.h"
#include "kernels/stubs/optim.h"
#include "kernels/stubs/reduce.h"
#include "kernels/stubs/sort.h"

namespace accel {

// elementwise.h
ACCEL_DEFINE_STUB(unary_stub);
ACCEL_DEFINE_STUB(binary_stub);
ACCEL_DEFINE_STUB(where_stub);
// reduce.h
ACCEL_DEFINE_STUB(reduce_stub);
// linalg.h
ACCEL_DEFINE_STUB(matmul_stub);
ACCEL_DEFINE_STUB(matmul_lowp_preferred_stub);
ACCEL_DEFINE_STUB(matmul_lowp_stub);
ACCEL_DEFINE_STUB(round_to_lowp_stub);
// conv.h
ACCEL_DEFINE_STUB(conv2d_stub);
ACCEL_DEFINE_STUB(conv2d_backward_stub);
ACCEL_DEFINE_STUB(pool2d_stub);
ACCEL_DEFINE_STUB(pool2d_backward_stub);
// index.h
ACCEL_DEFINE_STUB(index_select_stub);
ACCEL_DEFINE_STUB(index_add_stub);
ACCEL_DEFINE_STUB(gather_stub);
ACCEL_DEFINE_STUB(scatter_add_stub);
ACCEL_DEFINE_STUB(trilu_stub);
ACCEL_DEFINE_STUB(index_stub);
ACCEL_DEFINE_STUB(index_put_stub);
ACCEL_DEFINE_STUB(nonzero_stub);
// sort.h
ACCEL_DEFINE_STUB(sort_stub);
ACCEL_DEFINE_STUB(multinomial_stub);
// nn.h
ACCEL_DEFINE_STUB(softmax_stub);
ACCEL_DEFINE_STUB(softmax_backward_stub);
ACCEL_DEFINE_STUB(layer_norm_stub);
ACCEL_DEFINE_STUB(layer_norm_backward_stub);
ACCEL_DEFINE_STUB(rms_norm_stub);
ACCEL_DEFINE_STUB(rms_norm_backward_stub);
ACCEL_DEFINE_STUB(cross_entropy_stub);
ACCEL_DEFINE_STUB(cross_entropy_backward_stub);
ACCEL_DEFINE_STUB(nll_loss_stub);
ACCEL_DEFINE_STUB(nll_loss_backward_stub);
ACCEL_DEFINE_STUB(sdpa_stub);
ACCEL_DEFINE_STUB(sdpa_backward_stub);
ACCEL_DEFINE_STUB(group_norm_stub);
ACCEL_DEFINE_STUB(group_norm_backward_stub);
// optim.h
ACCEL_DEFINE_STUB(adamw_stub);

}  // namespace accel
