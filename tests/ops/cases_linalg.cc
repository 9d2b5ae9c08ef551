// Op cases: matmul (1-D, 2-D, batched with broadcast, transposed views), mm, bmm, linear.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

void add_linalg_cases(Table& t) {
  OpCase& gemm = t.add("matmul", "2-D", OP_INPUTS(m.rnd({3, 4}), m.rnd({4, 2})),
                       OP_FN(return matmul(x[0], x[1]);));
  // Bench rows gemm/ours/MxKxN: C (M, N) = A (M, K) @ B (K, N): the reference square, a small
  // square, a skinny N, the mlp's first layer, one row (a GEMV).
  const Shape gemm_shapes[] = {
      {1024, 1024, 1024}, {256, 256, 256}, {4096, 1024, 64}, {256, 784, 1024}, {1, 1024, 1024}};
  for (const Shape& g : gemm_shapes) {
    const int64_t M = g[0], K = g[1], N = g[2];
    gemm.bench(
        "gemm", dims_str(g),
        [M, K, N](Maker& m) {
          return In{m.rnd({M, K}), m.rnd({K, N})};
        },
        2.0 * double(M) * double(K) * double(N), true, Tol{1e-4, 1e-4});
  }
  t.add("matmul", "1-D dot", OP_INPUTS(m.rnd({4}), m.rnd({4})), OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "1-D @ 2-D", OP_INPUTS(m.rnd({3}), m.rnd({3, 2})),
        OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "3-D @ 1-D", OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({4})),
        OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "1-D @ 3-D", OP_INPUTS(m.rnd({3}), m.rnd({2, 3, 2})),
        OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "batched broadcast (2,1,3,4) @ (3,4,2)",
        OP_INPUTS(m.rnd({2, 1, 3, 4}), m.rnd({3, 4, 2})), OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "3-D @ 2-D (weight shared over batch)",
        OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({4, 5})), OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "2-D @ 3-D", OP_INPUTS(m.rnd({3, 4}), m.rnd({2, 4, 2})),
        OP_FN(return matmul(x[0], x[1]);));
  t.add("matmul", "transposed operands", OP_INPUTS(m.rnd({4, 3}), m.rnd({2, 4})),
        OP_FN(return matmul(x[0].t(), x[1].t());));
  t.add("mm", "", OP_INPUTS(m.rnd({3, 5}), m.rnd({5, 2})), OP_FN(return mm(x[0], x[1]);));
  t.add("bmm", "", OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({2, 4, 3})), OP_FN(return bmm(x[0], x[1]);));
  t.add("bmm", "transposed rhs", OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({2, 3, 4})),
        OP_FN(return bmm(x[0], x[1].transpose(1, 2));));
  t.add("linear", "with bias", OP_INPUTS(m.rnd({4, 3}), m.rnd({5, 3}), m.rnd({5})),
        OP_FN(return linear(x[0], x[1], x[2]);));
  OpCase& nt = t.add("linear", "no bias, 3-D input", OP_INPUTS(m.rnd({2, 3, 4}), m.rnd({2, 4})),
                     OP_FN(return linear(x[0], x[1]);));
  // Bench rows gemm_nt/ours/MxKxN, the nn.Linear form y = x @ W^T: the mlp's three layers.
  const Shape nt_shapes[] = {{256, 784, 1024}, {256, 1024, 1024}, {256, 1024, 10}};
  for (const Shape& g : nt_shapes) {
    const int64_t M = g[0], K = g[1], N = g[2];
    nt.bench(
        "gemm_nt", dims_str(g),
        [M, K, N](Maker& m) {
          return In{m.rnd({M, K}), m.rnd({N, K})};
        },
        2.0 * double(M) * double(K) * double(N), true, Tol{1e-4, 1e-4});
  }
  t.add("linear", "1-D input", OP_INPUTS(m.rnd({3}), m.rnd({2, 3}), m.rnd({2})),
        OP_FN(return linear(x[0], x[1], x[2]);));
  // Under float16 autocast the CPU takes the fused float32 route (Note [autocast linear in
  // float32]: matmul_lowp_preferred_stub, round_to_lowp_stub for the cached weight image,
  // matmul_lowp_stub), CUDA its float16 GEMM; the result carries float16 rounding either way.
  Tolerances f16_rounded;
  f16_rounded.f32 = f16_rounded.f16;
  t.add("linear", "float32 under float16 autocast",
        OP_INPUTS(m.rnd({6, 20}), m.rnd({5, 20}), m.rnd({5})), OP_FN({
          AutocastGuard ac(true, kFloat16);
          return linear(x[0], x[1], x[2]).to(x[0].dtype());  // float64 (gradcheck) passes through
        }))
      .only({kFloat32})
      .tolerances(f16_rounded);

  // Under bfloat16 autocast the CPU takes its native bf16 GEMM as one node with float32
  // gradients for the float32 inputs (Note [autocast linear, native 16-bit]), or the float32
  // route where bf16 does not pay; CUDA casts. The output carries bfloat16 rounding.
  Tolerances bf16_rounded;
  bf16_rounded.f32 = bf16_rounded.bf16;
  t.add("linear", "float32 under bfloat16 autocast",
        OP_INPUTS(m.rnd({6, 20}), m.rnd({5, 20}), m.rnd({5})), OP_FN({
          AutocastGuard ac(true, kBFloat16);
          return linear(x[0], x[1], x[2]).to(x[0].dtype());  // float64 (gradcheck) passes through
        }))
      .only({kFloat32})
      .tolerances(bf16_rounded);

  // Larger layouts for the cross-device runner (error grows like sqrt(k)).
  t.add("matmul", "(64, 48) @ (48, 80)", OP_INPUTS(m.rnd({64, 48}), m.rnd({48, 80})),
        OP_FN(return matmul(x[0], x[1]);))
      .no_gradcheck()
      .tol_scale(std::sqrt(48.0));
  t.add("matmul", "a^T b^T (33, 17) @ (17, 9)", OP_INPUTS(m.rnd({17, 33}), m.rnd({9, 17})),
        OP_FN(return matmul(x[0].t(), x[1].t());))
      .no_gradcheck()
      .tol_scale(std::sqrt(17.0));
  t.add("linear", "bias (70, 40) x (30, 40)",
        OP_INPUTS(m.rnd({70, 40}), m.rnd({30, 40}), m.rnd({30})),
        OP_FN(return linear(x[0], x[1], x[2]);))
      .no_gradcheck()
      .tol_scale(std::sqrt(40.0));
  t.add("matmul", "batched b^T (4, 16, 32) @ (4, 32, 24)",
        OP_INPUTS(m.rnd({4, 16, 32}), m.rnd({4, 24, 32})),
        OP_FN(return matmul(x[0], x[1].transpose(1, 2));))
      .no_gradcheck()
      .tol_scale(std::sqrt(32.0));
  t.add("matmul", "broadcast a (1, 17, 33) @ (3, 33, 9)",
        OP_INPUTS(m.rnd({1, 17, 33}), m.rnd({3, 33, 9})), OP_FN(return matmul(x[0], x[1]);))
      .no_gradcheck()
      .tol_scale(std::sqrt(33.0));
  t.add("matmul", "4-D (2, 3, 8, 16) @ (2, 3, 16, 8)",
        OP_INPUTS(m.rnd({2, 3, 8, 16}), m.rnd({2, 3, 16, 8})), OP_FN(return matmul(x[0], x[1]);))
      .no_gradcheck()
      .tol_scale(4);
}

}  // namespace accel::optable::detail
