// Op cases: binary/unary elementwise ops, where, masked_fill, clamp, comparisons, logical ops,
// integer arithmetic, dtype conversions and fill.
#include <string>

#include "op_table.h"

namespace accel::optable::detail {

namespace {
const std::vector<DType> kInts{kInt32, kInt64, kUInt8};
const std::vector<DType> kAll{kFloat32, kFloat64, kFloat16, kBFloat16,
                              kInt32,   kInt64,   kUInt8,   kBool};
}  // namespace

void add_elementwise_cases(Table& t) {
  // ---- binary, differentiable ----
  constexpr int64_t kEltN = int64_t(1) << 20;  // bench rows: 1M floats (3 x 4n bytes moved)
  t.add("add", "same shape", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 3})),
        OP_FN(return add(x[0], x[1]);))
      .bench("add", "1M", OP_INPUTS(m.rnd({kEltN}), m.rnd({kEltN})), 3.0 * kEltN * 4, false);
  t.add("add", "broadcast + alpha", OP_INPUTS(m.rnd({2, 3}), m.rnd({3})),
        OP_FN(return add(x[0], x[1], 0.5);));
  t.add("add", "strided (67, 129) + transposed", OP_INPUTS(m.rnd({67, 129}), m.rnd({129, 67})),
        OP_FN(return add(x[0], x[1].t());))
      .no_gradcheck();
  t.add("sub", "broadcast column", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 1})),
        OP_FN(return sub(x[0], x[1]);));
  t.add("sub", "alpha 2, rank-extending broadcast", OP_INPUTS(m.rnd({3, 45, 7}), m.rnd({45, 1})),
        OP_FN(return sub(x[0], x[1], 2.0);))
      .no_gradcheck();
  t.add("mul", "broadcast", OP_INPUTS(m.rnd({2, 1, 3}), m.rnd({4, 1})),
        OP_FN(return mul(x[0], x[1]);))
      .bench("mul", "1M", OP_INPUTS(m.rnd({kEltN}), m.rnd({kEltN})), 3.0 * kEltN * 4, false);
  t.add("div", "broadcast", OP_INPUTS(m.rnd({2, 3}), m.rnd_pos({3})),
        OP_FN(return div(x[0], x[1]);));
  t.add("pow", "tensor exponent", OP_INPUTS(m.rnd_pos({2, 3}), m.rnd({2, 3})),
        OP_FN(return pow(x[0], x[1]);));
  t.add("maximum", "no ties", OP_INPUTS(m.rnd({5}), m.rnd({5})),
        OP_FN(return maximum(x[0], x[1]);));
  t.add("minimum", "broadcast", OP_INPUTS(m.rnd({2, 4}), m.rnd({4})),
        OP_FN(return minimum(x[0], x[1]);));

  // ---- unary with a scalar ----
  t.add("add_scalar", "x + 2", OP_INPUTS(m.rnd({3, 2})), OP_FN(return add(x[0], 2.0);));
  t.add("mul_scalar", "x * -1.5", OP_INPUTS(m.rnd({3, 2})), OP_FN(return mul(x[0], -1.5);));
  t.add("rsub_scalar", "1 - x", OP_INPUTS(m.rnd({4})), OP_FN(return 1.0 - x[0];));
  t.add("rdiv_scalar", "2 / x", OP_INPUTS(m.rnd_pos({4})), OP_FN(return 2.0 / x[0];));
  t.add("pow_scalar", "x^3", OP_INPUTS(m.rnd({4})), OP_FN(return pow(x[0], 3);));
  t.add("pow_scalar", "x^0.5", OP_INPUTS(m.rnd_pos({4})), OP_FN(return pow(x[0], 0.5);));

  // ---- unary ----
  t.add("neg", "", OP_INPUTS(m.rnd({2, 2})), OP_FN(return neg(x[0]);));
  t.add("exp", "", OP_INPUTS(m.rnd({2, 3})), OP_FN(return exp(x[0]);));
  t.add("exp", "strided (67, 129)", OP_INPUTS(m.rnd({129, 67}, -5, 5)),
        OP_FN(return exp(x[0].t());))
      .no_gradcheck();
  t.add("log", "", OP_INPUTS(m.rnd_pos({2, 3})), OP_FN(return log(x[0]);));
  t.add("sqrt", "", OP_INPUTS(m.rnd_pos({2, 3})), OP_FN(return sqrt(x[0]);));
  t.add("rsqrt", "", OP_INPUTS(m.rnd_pos({2, 3})), OP_FN(return rsqrt(x[0]);));
  t.add("abs", "", OP_INPUTS(m.rnd({6})), OP_FN(return abs(x[0]);));
  t.add("tanh", "", OP_INPUTS(m.rnd({2, 3})), OP_FN(return tanh(x[0]);));
  t.add("sigmoid", "", OP_INPUTS(m.rnd({2, 3})), OP_FN(return sigmoid(x[0]);));
  t.add("relu", "", OP_INPUTS(m.rnd({8})), OP_FN(return relu(x[0]);));
  t.add("gelu_erf", "", OP_INPUTS(m.rnd({2, 4})), OP_FN(return gelu(x[0]);))
      .bench("gelu", "1M", OP_INPUTS(m.rnd({kEltN}, -4, 4)), 2.0 * kEltN * 4, false);
  t.add("gelu_erf", "wide domain (67, 129)", OP_INPUTS(m.rnd({67, 129}, -5, 5)),
        OP_FN(return gelu(x[0]);))
      .no_gradcheck();
  t.add("gelu_tanh", "", OP_INPUTS(m.rnd({2, 4})), OP_FN(return gelu(x[0], "tanh");))
      .bench("gelu_tanh", "1M", OP_INPUTS(m.rnd({kEltN}, -4, 4)), 2.0 * kEltN * 4, false);
  t.add("gelu_tanh", "wide domain (67, 129)", OP_INPUTS(m.rnd({67, 129}, -12, 12)),
        OP_FN(return gelu(x[0], "tanh");))
      .no_gradcheck();
  t.add("tanh", "wide domain (67, 129)", OP_INPUTS(m.rnd({67, 129}, -12, 12)),
        OP_FN(return tanh(x[0]);))
      .no_gradcheck();
  t.add("silu", "", OP_INPUTS(m.rnd({2, 4})), OP_FN(return silu(x[0]);));
  t.add("sin", "", OP_INPUTS(m.rnd({5})), OP_FN(return sin(x[0]);));
  t.add("cos", "", OP_INPUTS(m.rnd({5})), OP_FN(return cos(x[0]);));
  t.add("reciprocal", "", OP_INPUTS(m.rnd_pos({5})), OP_FN(return reciprocal(x[0]);));
  t.add("square", "", OP_INPUTS(m.rnd({5})), OP_FN(return square(x[0]);));
  t.add("log1p", "", OP_INPUTS(m.rnd_pos({5})), OP_FN(return log1p(x[0]);));
  t.add("expm1", "", OP_INPUTS(m.rnd({5})), OP_FN(return expm1(x[0]);));
  t.add("erf", "", OP_INPUTS(m.rnd({5})), OP_FN(return erf(x[0]);));
  t.add("clamp", "both bounds", OP_INPUTS(m.rnd({8})), OP_FN(return clamp(x[0], -0.5, 0.5);));
  t.add("where", "broadcast cond", OP_INPUTS(m.rnd({2, 3}), m.rnd({3}), m.mask({1, 0, 1}, {3})),
        OP_FN(return where(x[2], x[0], x[1]);));
  t.add("masked_fill", "row mask", OP_INPUTS(m.rnd({2, 3}), m.mask({1, 0, 1}, {3})),
        OP_FN(return masked_fill(x[0], x[1], 0.25);));

  // ---- not differentiable: sign, comparisons, logical ops (every float dtype) ----
  t.add("sign", "", OP_INPUTS(m.rnd({33, 17}, -3, 3)), OP_FN(return sign(x[0]);))
      .not_differentiable();
  t.add("logical_not", "", OP_INPUTS(m.rnd_int({40}, -1, 1)), OP_FN(return logical_not(x[0]);))
      .not_differentiable();
  // Small non-negative integers: equal elements occur, and every dtype (uint8, bool) holds them.
  t.add("eq", "small integers, broadcast", OP_INPUTS(m.rnd_int({9, 7}, 0, 3), m.rnd_int({7}, 0, 3)),
        OP_FN(return eq(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);
  t.add("ne", "small integers", OP_INPUTS(m.rnd_int({9, 7}, 0, 3), m.rnd_int({9, 7}, 0, 3)),
        OP_FN(return ne(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);
  t.add("lt", "", OP_INPUTS(m.rnd({9, 7}), m.rnd({9, 1})), OP_FN(return lt(x[0], x[1]);))
      .not_differentiable();
  t.add("le", "small integers", OP_INPUTS(m.rnd_int({9, 7}, 0, 3), m.rnd_int({7}, 0, 3)),
        OP_FN(return le(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);
  t.add("gt", "", OP_INPUTS(m.rnd({9, 7}), m.rnd({7})), OP_FN(return gt(x[0], x[1]);))
      .not_differentiable();
  t.add("ge", "small integers", OP_INPUTS(m.rnd_int({9, 7}, 0, 3), m.rnd_int({9, 7}, 0, 3)),
        OP_FN(return ge(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);
  t.add("logical_and", "", OP_INPUTS(m.rnd_int({9, 7}, -1, 1), m.rnd_int({9, 7}, -1, 1)),
        OP_FN(return logical_and(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);
  t.add("logical_or", "", OP_INPUTS(m.rnd_int({9, 7}, -1, 1), m.rnd_int({7}, -1, 1)),
        OP_FN(return logical_or(x[0], x[1]);))
      .not_differentiable()
      .only(kAll);

  // ---- integer arithmetic: exact on every device ----
  t.add("int arithmetic", "neg abs square relu sign", OP_INPUTS(m.rnd_int({33, 65}, -50, 50)),
        OP_FN(
            return add(add(neg(x[0]), abs(x[0])), add(square(x[0]), add(relu(x[0]), sign(x[0]))));))
      .not_differentiable()
      .only({kInt32, kInt64});
  t.add("int arithmetic", "scalars and clamp", OP_INPUTS(m.rnd_int({33, 65}, 0, 9)),
        OP_FN(return add(clamp(add(mul(x[0], 3), 7), 4, 25), pow(x[0], 2));))
      .not_differentiable()
      .only(kInts);
  t.add("int arithmetic", "binary, broadcast",
        OP_INPUTS(m.rnd_int({31, 57}, 0, 12), m.rnd_int({1, 57}, 0, 12)),
        OP_FN(return add(mul(x[0], x[1]), add(maximum(x[0], x[1]), minimum(x[0], x[1])));))
      .not_differentiable()
      .only(kInts);
  t.add("where", "every dtype",
        OP_INPUTS(m.mask({1, 0, 0, 1, 1, 0, 1, 0, 1}, {9, 1, 1}), m.rnd_int({9, 17, 33}, 0, 9),
                  m.rnd_int({17, 1}, 0, 9)),
        OP_FN(return where(x[0], x[1], x[2]);))
      .not_differentiable()
      .only(kAll);
  // where with python-number scalars: the tensor's dtype when floating, else as torch promotes.
  t.add("where", "scalar, tensor", OP_INPUTS(m.rnd({2, 3}), m.mask({1, 0, 1}, {3})),
        OP_FN(return where(x[1], 0.5, x[0]);));
  t.add("where", "two scalars, integer and float results",
        OP_INPUTS(m.mask({1, 0, 0, 1, 1, 0}, {2, 3}), m.rnd_int({2, 3}, 0, 9)),
        OP_FN(return add(add(where(x[0], 1.5, -2), where(x[0], 3, 4)), where(x[0], x[1], 0.5));))
      .not_differentiable()
      .only({kFloat32, kInt32, kInt64});

  // ---- conversions (copy between dtypes, strided and broadcast) and fill ----
  for (DType to : kAll) {
    const std::string label = "to " + std::string(dtype_name(to)) + ", strided";
    t.add("copy", label, OP_INPUTS(m.rnd_int({23, 41}, 0, 200)),
          [to](const In& x) { return x[0].t().to(to); })
        .not_differentiable()
        .only(kAll);
  }
  t.add("copy", "broadcast expand", OP_INPUTS(m.rnd({23, 41})),
        OP_FN(return x[0].expand({5, 23, 41}).contiguous();))
      .not_differentiable()
      .only(kAll);
  t.add("fill", "contiguous and strided", OP_INPUTS(m.rnd({7, 9})), OP_FN({
          Tensor y = x[0].detach().clone();
          y.fill_(2.0);
          Tensor yt = y.t();
          yt.narrow(0, 1, 3).fill_(7.0);
          return y;
        }))
      .not_differentiable()
      .only(kAll);
}

}  // namespace accel::optable::detail
