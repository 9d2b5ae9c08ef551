// Problem geometry the CPU and CUDA hosts derive from shapes and strides, written once. Plain
// arithmetic on size/stride lists (any container with size() and operator[], e.g. Shape): no
// Tensor, no error types. The op layer has validated the shapes (kernels/stubs/*.h); what these
// helpers report back (a bool) is a kernel limit the caller asserts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace accel::common {

// ---- rows along one dim ----
// A tensor seen as (outer, n, inner) around `dim`: the rows of softmax, norms, losses, index ops
// and dim reductions. A 0-dim tensor is one row of one element.
struct RowGeometry {
  int64_t outer = 1, n = 1, inner = 1;
};
template <typename Sizes>
RowGeometry row_geometry(const Sizes& sizes, int64_t dim) {
  RowGeometry g;
  const int64_t nd = int64_t(sizes.size());
  if (nd == 0) return g;
  for (int64_t d = 0; d < dim; ++d) g.outer *= sizes[size_t(d)];
  g.n = sizes[size_t(dim)];
  for (int64_t d = dim + 1; d < nd; ++d) g.inner *= sizes[size_t(d)];
  return g;
}

// ---- batched matmul (Note [matmul geometry] in kernels/cpu/linalg.cc) ----
struct MatrixLayout {
  int64_t rows, cols, row_stride, col_stride;
};

// True when (rows, cols) with these strides is row- or column-major; normalises size-1 strides.
inline bool canonical_matrix(MatrixLayout& m) {
  const bool row_major =
      (m.cols == 1 || m.col_stride == 1) && (m.rows == 1 || m.row_stride >= m.cols);
  if (row_major) {
    m.col_stride = 1;
    if (m.rows == 1) m.row_stride = m.cols;
    return true;
  }
  const bool col_major =
      (m.rows == 1 || m.row_stride == 1) && (m.cols == 1 || m.col_stride >= m.rows);
  if (col_major) {
    m.row_stride = 1;
    if (m.cols == 1) m.col_stride = m.rows;
    return true;
  }
  return false;
}

// Elements one matrix spans.
inline int64_t matrix_extent(const MatrixLayout& m) {
  return m.col_stride == 1 ? m.row_stride * m.rows : m.col_stride * m.cols;
}

// Batch dims where out has size 1 dropped, operands' broadcast dims (size 1 or stride 0) given
// size 1 and stride 0, adjacent dims contiguous in a, b and out merged.
struct MatmulGeometry {
  static constexpr int kMaxBatch = 64;                 // batch dims before any merging
  int nb = 0;                                          // batch dims left
  int64_t out_size[kMaxBatch], out_stride[kMaxBatch];  // elements
  int64_t a_size[kMaxBatch], a_stride[kMaxBatch];      // a_size 1 and a_stride 0: broadcast
  int64_t b_size[kMaxBatch], b_stride[kMaxBatch];
  MatrixLayout a, b;
  int64_t m, n, k;
};

// out = a @ b with a (..., M, K), b (..., K, N), out (..., M, N) of one rank r >= 2 (the
// contract of kernels/stubs/linalg.h). Returns false when the batch dims exceed kMaxBatch or a
// matrix is neither row- nor column-major (the caller copies or asserts).
template <typename Sizes>
bool matmul_geometry(const Sizes& a_sizes, const Sizes& a_strides, const Sizes& b_sizes,
                     const Sizes& b_strides, const Sizes& out_sizes, const Sizes& out_strides,
                     MatmulGeometry& g) {
  const int r = int(out_sizes.size());
  if (r - 2 > MatmulGeometry::kMaxBatch) return false;
  const size_t rm = size_t(r - 2), rn = size_t(r - 1);
  g.nb = 0;
  g.m = out_sizes[rm];
  g.n = out_sizes[rn];
  g.k = a_sizes[rn];
  g.a = {g.m, g.k, a_strides[rm], a_strides[rn]};
  g.b = {g.k, g.n, b_strides[rm], b_strides[rn]};
  if (!canonical_matrix(g.a) || !canonical_matrix(g.b)) return false;
  // Merge into the previous dim when every operand is contiguous across the pair.
  auto mergeable = [](int64_t ps, int64_t pst, int64_t s, int64_t st, int64_t os) {
    if (ps == 1 && s == 1) return true;
    return ps != 1 && s != 1 && pst == st * os;
  };
  for (int d = 0; d < r - 2; ++d) {
    const size_t ud = size_t(d);
    const int64_t os = out_sizes[ud];
    if (os == 1) continue;
    const bool a_bc = a_sizes[ud] == 1 || a_strides[ud] == 0;
    const bool b_bc = b_sizes[ud] == 1 || b_strides[ud] == 0;
    const int64_t as = a_bc ? 1 : os, ast = a_bc ? 0 : a_strides[ud];
    const int64_t bs = b_bc ? 1 : os, bst = b_bc ? 0 : b_strides[ud];
    const int64_t ost = out_strides[ud];
    if (g.nb > 0) {
      const int p = g.nb - 1;
      if (mergeable(g.a_size[p], g.a_stride[p], as, ast, os) &&
          mergeable(g.b_size[p], g.b_stride[p], bs, bst, os) && g.out_stride[p] == ost * os) {
        g.out_size[p] *= os;
        if (g.a_size[p] != 1) g.a_size[p] *= os;
        if (g.b_size[p] != 1) g.b_size[p] *= os;
        g.a_stride[p] = ast;
        g.b_stride[p] = bst;
        g.out_stride[p] = ost;
        continue;
      }
    }
    g.out_size[g.nb] = os;
    g.a_size[g.nb] = as;
    g.a_stride[g.nb] = ast;
    g.b_size[g.nb] = bs;
    g.b_stride[g.nb] = bst;
    g.out_stride[g.nb] = ost;
    ++g.nb;
  }
  return true;
}

}  // namespace accel::common
