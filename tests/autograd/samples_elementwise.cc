// Gradcheck samples: binary/unary elementwise ops, where, masked_fill, clamp.
#include "samples.h"

using namespace accel;
using accel::testing::rnd;
using accel::testing::rnd_pos;

GRAD_SAMPLE("add", "same shape", (rnd({2, 3}), rnd({2, 3})), { return add(x[0], x[1]); });
GRAD_SAMPLE("add", "broadcast + alpha", (rnd({2, 3}), rnd({3})),
            { return add(x[0], x[1], 0.5); });
GRAD_SAMPLE("sub", "broadcast column", (rnd({2, 3}), rnd({2, 1})), { return sub(x[0], x[1]); });
GRAD_SAMPLE("mul", "broadcast", (rnd({2, 1, 3}), rnd({4, 1})), { return mul(x[0], x[1]); });
GRAD_SAMPLE("div", "broadcast", (rnd({2, 3}), rnd_pos({3})), { return div(x[0], x[1]); });
GRAD_SAMPLE("pow", "tensor exponent", (rnd_pos({2, 3}), rnd({2, 3})),
            { return pow(x[0], x[1]); });
GRAD_SAMPLE("maximum", "no ties", (rnd({5}), rnd({5})), { return maximum(x[0], x[1]); });
GRAD_SAMPLE("minimum", "broadcast", (rnd({2, 4}), rnd({4})), { return minimum(x[0], x[1]); });
GRAD_SAMPLE("add_scalar", "x + 2", (rnd({3, 2})), { return add(x[0], 2.0); });
GRAD_SAMPLE("mul_scalar", "x * -1.5", (rnd({3, 2})), { return mul(x[0], -1.5); });
GRAD_SAMPLE("rsub_scalar", "1 - x", (rnd({4})), { return 1.0 - x[0]; });
GRAD_SAMPLE("rdiv_scalar", "2 / x", (rnd_pos({4})), { return 2.0 / x[0]; });
GRAD_SAMPLE("pow_scalar", "x^3", (rnd({4})), { return pow(x[0], 3); });
GRAD_SAMPLE("pow_scalar", "x^0.5", (rnd_pos({4})), { return pow(x[0], 0.5); });
GRAD_SAMPLE("neg", "", (rnd({2, 2})), { return neg(x[0]); });
GRAD_SAMPLE("exp", "", (rnd({2, 3})), { return exp(x[0]); });
GRAD_SAMPLE("log", "", (rnd_pos({2, 3})), { return log(x[0]); });
GRAD_SAMPLE("sqrt", "", (rnd_pos({2, 3})), { return sqrt(x[0]); });
GRAD_SAMPLE("rsqrt", "", (rnd_pos({2, 3})), { return rsqrt(x[0]); });
GRAD_SAMPLE("abs", "", (rnd({6})), { return abs(x[0]); });
GRAD_SAMPLE("tanh", "", (rnd({2, 3})), { return tanh(x[0]); });
GRAD_SAMPLE("sigmoid", "", (rnd({2, 3})), { return sigmoid(x[0]); });
GRAD_SAMPLE("relu", "", (rnd({8})), { return relu(x[0]); });
GRAD_SAMPLE("gelu_erf", "", (rnd({2, 4})), { return gelu(x[0]); });
GRAD_SAMPLE("gelu_tanh", "", (rnd({2, 4})), { return gelu(x[0], "tanh"); });
GRAD_SAMPLE("silu", "", (rnd({2, 4})), { return silu(x[0]); });
GRAD_SAMPLE("sin", "", (rnd({5})), { return sin(x[0]); });
GRAD_SAMPLE("cos", "", (rnd({5})), { return cos(x[0]); });
GRAD_SAMPLE("reciprocal", "", (rnd_pos({5})), { return reciprocal(x[0]); });
GRAD_SAMPLE("square", "", (rnd({5})), { return square(x[0]); });
GRAD_SAMPLE("log1p", "", (rnd_pos({5})), { return log1p(x[0]); });
GRAD_SAMPLE("expm1", "", (rnd({5})), { return expm1(x[0]); });
GRAD_SAMPLE("erf", "", (rnd({5})), { return erf(x[0]); });
GRAD_SAMPLE("clamp", "both bounds", (rnd({8})), { return clamp(x[0], -0.5, 0.5); });
GRAD_SAMPLE("where", "broadcast cond", (rnd({2, 3}), rnd({3})), {
  Tensor c = gt(tensor({1.f, -1.f, 1.f}), tensor({0.f}));
  return where(c, x[0], x[1]);
});
GRAD_SAMPLE("masked_fill", "row mask", (rnd({2, 3})), {
  Tensor m = gt(tensor({1.f, -1.f, 1.f}), tensor({0.f}));
  return masked_fill(x[0], m, 0.25);
});
