// Op cases: every in-place op (Note [in-place ops] in autograd/function.h), each on a non-leaf
// (`x * 1`: a leaf that requires grad refuses in-place writes) so that gradcheck differentiates
// through the op's recorded backward; writes through views (CopySlices), a view whose base was
// written after it was made (its regenerated history), chains, and a plain buffer made to
// require grad by its operand. Inputs are kept away from the kinks of relu/abs/clamp.
#include "op_table.h"

namespace accel::optable::detail {

namespace {
// A non-leaf copy of x that autograd tracks (x * 1).
Tensor nl(const Tensor& x) { return mul(x, 1.0); }
}  // namespace

void add_inplace_cases(Table& t) {
  // ---- arithmetic (ops/inplace.cc) ----
  t.add("copy_", "broadcast source", OP_INPUTS(m.rnd({2, 3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.copy_(x[1]);
          return mul(y, x[0]);  // x[0] reaches the result only through the product
        }));
  t.add("copy_", "into a plain buffer (operand requires grad)", OP_INPUTS(m.rnd({2, 3})), OP_FN({
          Tensor buf = zeros_like(x[0]);
          buf.copy_(x[0]);
          return mul(buf, buf);
        }));
  t.add("copy_", "through a column view", OP_INPUTS(m.rnd({3, 4}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.select(1, 2).copy_(x[1]);
          return mul(y, y);
        }));
  t.add("fill_", "through a row view", OP_INPUTS(m.rnd({3, 4})), OP_FN({
          Tensor y = nl(x[0]);
          y.select(0, 1).fill_(0.5);
          return mul(y, y);
        }));
  t.add("fill_", "zero_ of the whole tensor", OP_INPUTS(m.rnd({3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.zero_();
          return add(y, x[1]);
        }));
  t.add("add_", "tensor, broadcast, alpha", OP_INPUTS(m.rnd({2, 3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.add_(x[1], 0.5);
          return y;
        }));
  t.add("add_", "scalar; += operator", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.add_(2.0);
          y += x[1];
          return mul(y, y);
        }));
  t.add("sub_", "tensor with alpha; scalar; -=", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 1})), OP_FN({
          Tensor y = nl(x[0]);
          y.sub_(x[1], 2.0);
          y.sub_(0.5);
          y -= x[1];
          return mul(y, y);
        }));
  t.add("mul_", "tensor, both require grad", OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.mul_(x[1]);
          return y;
        }));
  t.add("mul_", "broadcast operand; scalar; *=", OP_INPUTS(m.rnd({2, 3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y *= x[1];
          y.mul_(-1.5);
          return y;
        }));
  t.add("div_", "tensor, both require grad", OP_INPUTS(m.rnd({2, 3}), m.rnd_pos({2, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.div_(x[1]);
          return y;
        }));
  t.add("div_", "scalar; /= broadcast tensor", OP_INPUTS(m.rnd({2, 3}), m.rnd_pos({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.div_(255.0);
          y /= x[1];
          return y;
        }));
  t.add("clamp_", "both bounds", OP_INPUTS(m.values({-0.9, -0.2, 0.1, 0.4, 0.8, -0.6}, {6}, true)),
        OP_FN({
          Tensor y = nl(x[0]);
          y.clamp_(-0.5, 0.5);
          return mul(y, x[0]);
        }));
  t.add("clamp_min_", "", OP_INPUTS(m.values({-0.9, -0.2, 0.1, 0.4, 0.8, -0.6}, {6}, true)), OP_FN({
          Tensor y = nl(x[0]);
          y.clamp_min_(0.0);
          return mul(y, x[0]);
        }));
  t.add("clamp_max_", "", OP_INPUTS(m.values({-0.9, -0.2, 0.1, 0.4, 0.8, -0.6}, {6}, true)), OP_FN({
          Tensor y = nl(x[0]);
          y.clamp_max_(0.3);
          return mul(y, x[0]);
        }));
  t.add("pow_", "scalar exponent", OP_INPUTS(m.rnd({2, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.pow_(3);
          return y;
        }));
  t.add("pow_", "tensor exponent", OP_INPUTS(m.rnd_pos({2, 3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.pow_(x[1]);
          return y;
        }));

  // ---- unary (ops/unary.cc): the output saved (exp_, ...) or a copy of the input (log_, ...) ----
  auto unary = [&t](const char* op, Tensor& (Tensor::*method)(), bool positive) {
    t.add(
        op, positive ? "positive input" : "",
        [positive](Maker& m) {
          return In{positive ? m.rnd_pos({2, 3}) : m.rnd({2, 3})};
        },
        [method](const In& x) {
          Tensor y = nl(x[0]);
          (y.*method)();
          return mul(y, x[0]);  // the op's result and its input both reach the output
        });
  };
  t.add("neg_", "", OP_INPUTS(m.rnd({2, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.neg_();
          return mul(y, x[0]);
        }));
  unary("exp_", &Tensor::exp_, false);
  unary("log_", &Tensor::log_, true);
  unary("sqrt_", &Tensor::sqrt_, true);
  unary("rsqrt_", &Tensor::rsqrt_, true);
  unary("sigmoid_", &Tensor::sigmoid_, false);
  unary("tanh_", &Tensor::tanh_, false);
  unary("sin_", &Tensor::sin_, false);
  unary("cos_", &Tensor::cos_, false);
  unary("reciprocal_", &Tensor::reciprocal_, true);
  unary("square_", &Tensor::square_, false);
  unary("log1p_", &Tensor::log1p_, true);
  unary("expm1_", &Tensor::expm1_, false);
  unary("erf_", &Tensor::erf_, false);
  t.add("abs_", "", OP_INPUTS(m.values({-0.9, -0.2, 0.1, 0.4, 0.8, -0.6}, {2, 3}, true)), OP_FN({
          Tensor y = nl(x[0]);
          y.abs_();
          return mul(y, x[0]);
        }));
  t.add("relu_", "", OP_INPUTS(m.values({-0.9, -0.2, 0.1, 0.4, 0.8, -0.6}, {2, 3}, true)), OP_FN({
          Tensor y = nl(x[0]);
          y.relu_();
          return mul(y, x[0]);
        }));

  // ---- in-place methods (autograd::inplace_method) ----
  t.add("masked_fill_", "row mask", OP_INPUTS(m.rnd({2, 3}), m.mask({1, 0, 1}, {3})), OP_FN({
          Tensor y = nl(x[0]);
          y.masked_fill_(x[1], 0.25);
          return mul(y, x[0]);
        }));
  t.add("index_add_", "dim 0, duplicates",
        OP_INPUTS(m.rnd({4, 3}), m.rnd({3, 3}), m.idx({1, 3, 1}, {3})), OP_FN({
          Tensor y = nl(x[0]);
          y.index_add_(0, x[2], x[1]);
          return mul(y, y);
        }))
      .tol_scale(8);
  t.add("scatter_add_", "dim 1",
        OP_INPUTS(m.rnd({2, 3}), m.rnd({2, 4}), m.idx({2, 2, 0, 1}, {2, 2})), OP_FN({
          Tensor y = nl(x[0]);
          y.scatter_add_(1, x[2], x[1]);
          return mul(y, y);
        }))
      .tol_scale(8);
  t.add("tril_", "through a batch view", OP_INPUTS(m.rnd({2, 3, 3})), OP_FN({
          Tensor y = nl(x[0]);
          y.select(0, 1).tril_(-1);
          return mul(y, x[0]);
        }));
  t.add("triu_", "", OP_INPUTS(m.rnd({3, 4})), OP_FN({
          Tensor y = nl(x[0]);
          y.triu_(1);
          return mul(y, x[0]);
        }));

  // ---- views (Note [views and in-place autograd]) ----
  t.add("mul_", "through a strided slice (y[:, ::2] *= w)", OP_INPUTS(m.rnd({3, 5}), m.rnd({3, 3})),
        OP_FN({
          Tensor y = nl(x[0]);
          y.slice(1, 0, 5, 2).mul_(x[1]);
          return mul(y, x[0]);
        }));
  t.add("add_", "through a transposed view", OP_INPUTS(m.rnd({2, 3}), m.rnd({3, 2})), OP_FN({
          Tensor y = nl(x[0]);
          y.t().add_(x[1]);
          return mul(y, y);
        }));
  t.add("exp_", "view made before its base was written", OP_INPUTS(m.rnd({3, 4}), m.rnd({4})),
        OP_FN({
          Tensor y = nl(x[0]);
          Tensor row = y.select(0, 2);   // history: select of y's old value
          y.mul_(x[1]);                  // row's history is regenerated from y's new one
          Tensor col = y.select(1, 1);   // a sibling view
          col.exp_();                    // writes y again, through another view
          return add(mul(row, 3.0), y);  // row sees both writes
        }));
  // (Not y.sigmoid_().mul_(2): sigmoid_ saves its output, which mul_ overwrites; a version
  // error at backward, as in torch.)
  t.add("tanh_", "chained in place, then through a view of a view",
        OP_INPUTS(m.rnd({4, 3}), m.rnd({3})), OP_FN({
          Tensor y = nl(x[0]);
          y.add_(x[1]).mul_(2.0).neg_();
          y.narrow(0, 1, 2).select(1, 0).tanh_();
          return mul(y, y);
        }));
  t.add("add_", "a chunk plus its sibling chunk", OP_INPUTS(m.rnd({4, 3})), OP_FN({
          Tensor y = nl(x[0]);
          std::vector<Tensor> parts = y.chunk(2, 0);
          parts[0].add_(parts[1]);
          return mul(y, y);
        }));
}

}  // namespace accel::optable::detail
