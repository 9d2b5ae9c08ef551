// resize / resized_crop of data/transforms.h: torchvision 0.14's tensor resize, which is torch
// 1.13's F.interpolate between casts.
//
// Note [resize like torch 1.13]
// torchvision resizes a tensor image with F.interpolate(align_corners=False) on (1, C, H, W):
// uint8 images are cast to float32 first and rounded half to even after (bicubic clamped to
// [0, 255] before), so a uint8 result is exact only if every float32 operation is the one torch
// performs. We reproduce Debian's torch 1.13.1 CPU kernels (its AVX2 build, what any x86-64 CPU
// of the last decade runs) operation by operation; the weights and the sums below were found by
// reading the kernels and confirmed bit for bit on images of random integers and on photos
// (tests/data/test_transforms_torchvision.cc):
//
// - Scales are float32 in / out. Source positions are double: src = scale * (i + 0.5) - 0.5.
// - bilinear: i0 = int(max(src, 0)), i1 = min(i0 + 1, in - 1), l1 = float(src - i0),
//   l0 = 1 - l1; out = fma(t0, l0, t1 * l1), first along x, then the row results along y (the
//   kernel nests the x sum inside the y sum; a separable pass computes the same values).
//   A one-channel image (C == 1, or H == W == 1) is "channels last" to torch, which sends it to
//   another kernel: weights w_yx = float(l_y * l_x), summed in double in one 2-D step.
//   Whether a crop (a view in torchvision) counts is decided as torch does (is_contiguous for
//   channels last): a one-channel crop as wide as the image does, a narrower one does not.
// - bicubic (A = -0.75): ii = floor(float(src)), t = float(src - ii), taps ii-1..ii+2 clamped to
//   the image; coefficients with the fused multiply-adds GCC made of torch's expressions
//   (cubic_weights below); out = fma(t3, w3, fma(t2, w2, fma(t0, w0, t1 * w1))), x then y.
// - antialias (bilinear: triangle filter, bicubic: PIL's cubic with a = -0.5): support =
//   (taps / 2) * max(scale, 1), the window [center - support + 0.5, center + support + 0.5)
//   with weights filter((j - center + 0.5) / max(scale, 1)) normalised by their float32 sum;
//   a horizontal pass (when the width changes) then a vertical pass (when the height changes),
//   each output t0 * w0 and then the others added in order: the first 4 * floor((n - 1) / 4)
//   unfused (GCC vectorised those products), the rest fused.
// - nearest: src = min(floor(i * scale), in - 1) in float32 (identity for in == out, i / 2 for
//   out == 2 in); nearest-exact: min(floor(float((i + 0.5) * scale)), in - 1).
// float64 images follow the same formulas in double (to 1e-10 rather than bit for bit: torch's
// double kernels fuse and vectorise differently). This file is compiled once per instruction set
// (kernels/cpu/isa_foreach.h): the fused operations are std::fma, one instruction where the pass
// has FMA, and the data layer is compiled with -ffp-contract=off so that nothing else is fused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "data/resample.h"
#include "data/transforms.h"
#include "data/transforms_detail.h"
#include "kernels/cpu/cpu_isa.h"

#if !defined(ACCEL_ISA_NS)
#define ACCEL_ISA_SELF "data/resample.cc"
#include "kernels/cpu/isa_foreach.h"
#else
namespace accel::data::resample::ACCEL_ISA_NS {
namespace {

template <typename A>
inline A fused(A a, A b, A c) {
  return std::fma(a, b, c);
}

// Output value of one output position from n taps read through `at(j)` (the sums of
// Note [resize like torch 1.13]).
template <SumKind K, typename A, typename F>
inline A sum_taps(const A* w, int32_t n, F&& at) {
  if constexpr (K == SumKind::kLinear) {
    return fused(at(0), w[0], at(1) * w[1]);
  } else if constexpr (K == SumKind::kCubic) {
    A o = fused(at(0), w[0], at(1) * w[1]);
    o = fused(at(2), w[2], o);
    return fused(at(3), w[3], o);
  } else {
    A o = at(0) * w[0];
    const int32_t m = n - 1, blk = m & ~3;
    for (int32_t j = 1; j <= blk; ++j) o = o + at(j) * w[j];
    for (int32_t j = blk + 1; j <= m; ++j) o = fused(at(j), w[j], o);
    return o;
  }
}

template <typename O, typename A>
inline O store_value(A v) {
  if constexpr (std::is_same_v<O, uint8_t>) {
    // torchvision: clamp (bicubic; a no-op for the others), round half to even, cast.
    return uint8_t(std::nearbyint(std::min(std::max(v, A(0)), A(255))));
  } else {
    return O(v);
  }
}

// rows x taps along x: out[k][y][x] for the rows y with need[y] (all when need is null).
template <SumKind K, typename T, typename A>
void horizontal(const Region<T>& in, const Taps<A>& tx, const uint8_t* need, A* out) {
  const int64_t ow = tx.out, wd = tx.width;
  for (int64_t k = 0; k < in.planes; ++k)
    for (int64_t y = 0; y < in.h; ++y) {
      if (need != nullptr && need[y] == 0) continue;
      const T* s = in.data + k * in.plane + y * in.row;
      A* d = out + (k * in.h + y) * ow;
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t* ix = tx.index.data() + x * wd;
        const int64_t pix = in.pix;
        d[x] = sum_taps<K, A>(tx.weight.data() + x * wd, tx.count[size_t(x)],
                              [&](int32_t j) { return A(s[ix[j] * pix]); });
      }
    }
}

// Rows along y, the inner loop over x (vectorised): in is [planes][h][w].
template <SumKind K, typename A, typename O>
void vertical(const A* in, int64_t planes, int64_t h, int64_t w, const Taps<A>& ty,
              const OutRegion<O>& out, A* acc) {
  const int64_t wd = ty.width;
  for (int64_t k = 0; k < planes; ++k)
    for (int64_t oy = 0; oy < ty.out; ++oy) {
      const int64_t* iy = ty.index.data() + oy * wd;
      const A* wt = ty.weight.data() + oy * wd;
      const A* plane = in + k * h * w;
      const int32_t n = ty.count[size_t(oy)];
      if constexpr (K == SumKind::kLinear) {
        const A *r0 = plane + iy[0] * w, *r1 = plane + iy[1] * w;
        for (int64_t x = 0; x < w; ++x) acc[x] = fused(r0[x], wt[0], r1[x] * wt[1]);
      } else if constexpr (K == SumKind::kCubic) {
        const A *r0 = plane + iy[0] * w, *r1 = plane + iy[1] * w;
        const A *r2 = plane + iy[2] * w, *r3 = plane + iy[3] * w;
        for (int64_t x = 0; x < w; ++x) {
          A o = fused(r0[x], wt[0], r1[x] * wt[1]);
          o = fused(r2[x], wt[2], o);
          acc[x] = fused(r3[x], wt[3], o);
        }
      } else {
        const A* r0 = plane + iy[0] * w;
        for (int64_t x = 0; x < w; ++x) acc[x] = r0[x] * wt[0];
        const int32_t m = n - 1, blk = m & ~3;
        for (int32_t j = 1; j <= m; ++j) {
          const A* r = plane + iy[j] * w;
          const A wj = wt[j];
          if (j <= blk) {
            for (int64_t x = 0; x < w; ++x) acc[x] = acc[x] + r[x] * wj;
          } else {
            for (int64_t x = 0; x < w; ++x) acc[x] = fused(r[x], wj, acc[x]);
          }
        }
      }
      O* d = out.data + k * out.plane + oy * out.row;
      for (int64_t x = 0; x < w; ++x) d[x * out.pix] = store_value<O>(acc[x]);
    }
}

}  // namespace

// The entry points (overloads per type), dispatched from the non-pass part below.
#define ACCEL_RESAMPLE_PASSES(T, A, O)                                                           \
  void run_horizontal(const Region<T>& in, const Taps<A>& tx, SumKind kind, const uint8_t* need, \
                      A* out) {                                                                  \
    switch (kind) {                                                                              \
      case SumKind::kLinear: return horizontal<SumKind::kLinear>(in, tx, need, out);             \
      case SumKind::kCubic: return horizontal<SumKind::kCubic>(in, tx, need, out);               \
      default: return horizontal<SumKind::kAntialias>(in, tx, need, out);                        \
    }                                                                                            \
  }                                                                                              \
  void run_vertical(const A* in, int64_t planes, int64_t h, int64_t w, const Taps<A>& ty,        \
                    SumKind kind, const OutRegion<O>& out, A* acc) {                             \
    switch (kind) {                                                                              \
      case SumKind::kLinear: return vertical<SumKind::kLinear>(in, planes, h, w, ty, out, acc);  \
      case SumKind::kCubic: return vertical<SumKind::kCubic>(in, planes, h, w, ty, out, acc);    \
      default: return vertical<SumKind::kAntialias>(in, planes, h, w, ty, out, acc);             \
    }                                                                                            \
  }                                                                                              \
  void run_to_planar(const Region<T>& in, A* out) {                                              \
    for (int64_t k = 0; k < in.planes; ++k)                                                      \
      for (int64_t y = 0; y < in.h; ++y) {                                                       \
        const T* s = in.data + k * in.plane + y * in.row;                                        \
        A* d = out + (k * in.h + y) * in.w;                                                      \
        for (int64_t x = 0; x < in.w; ++x) d[x] = A(s[x * in.pix]);                              \
      }                                                                                          \
  }                                                                                              \
  void run_store(const A* in, const OutRegion<O>& out) {                                         \
    for (int64_t k = 0; k < out.planes; ++k)                                                     \
      for (int64_t y = 0; y < out.h; ++y) {                                                      \
        const A* s = in + (k * out.h + y) * out.w;                                               \
        O* d = out.data + k * out.plane + y * out.row;                                           \
        for (int64_t x = 0; x < out.w; ++x) d[x * out.pix] = store_value<O>(s[x]);               \
      }                                                                                          \
  }                                                                                              \
  void run_bilinear_cl(const Region<T>& in, const Taps<A>& ty, const Taps<A>& tx,                \
                       const OutRegion<O>& out) {                                                \
    for (int64_t k = 0; k < in.planes; ++k)                                                      \
      for (int64_t oy = 0; oy < out.h; ++oy) {                                                   \
        const A h0 = ty.weight[size_t(2 * oy)], h1 = ty.weight[size_t(2 * oy + 1)];              \
        const T* r0 = in.data + k * in.plane + ty.index[size_t(2 * oy)] * in.row;                \
        const T* r1 = in.data + k * in.plane + ty.index[size_t(2 * oy + 1)] * in.row;            \
        O* d = out.data + k * out.plane + oy * out.row;                                          \
        for (int64_t ox = 0; ox < out.w; ++ox) {                                                 \
          const A w0 = tx.weight[size_t(2 * ox)], w1 = tx.weight[size_t(2 * ox + 1)];            \
          const int64_t x0 = tx.index[size_t(2 * ox)] * in.pix;                                  \
          const int64_t x1 = tx.index[size_t(2 * ox + 1)] * in.pix;                              \
          const A w00 = h0 * w0, w01 = h0 * w1, w10 = h1 * w0, w11 = h1 * w1;                    \
          const double s = double(r0[x0]) * double(w00) + double(r0[x1]) * double(w01) +         \
                           double(r1[x0]) * double(w10) + double(r1[x1]) * double(w11);          \
          d[ox * out.pix] = store_value<O>(A(s));                                                \
        }                                                                                        \
      }                                                                                          \
  }
ACCEL_RESAMPLE_PASSES(uint8_t, float, uint8_t)
ACCEL_RESAMPLE_PASSES(float, float, float)
ACCEL_RESAMPLE_PASSES(double, double, double)
#undef ACCEL_RESAMPLE_PASSES

}  // namespace accel::data::resample::ACCEL_ISA_NS
#endif  // ACCEL_ISA_NS

#if !defined(ACCEL_ISA_NS)
namespace accel::data::transforms {

using resample::OutRegion;
using resample::Region;
using resample::SumKind;
using resample::Taps;

namespace {

#if defined(ACCEL_CPU_NATIVE)
#define ACCEL_RESAMPLE_DISPATCH(fn, ...) resample::native::fn(__VA_ARGS__)
#else
#define ACCEL_RESAMPLE_DISPATCH(fn, ...)                                \
  switch (cpu::current_isa()) {                                         \
    case cpu::CpuIsa::Avx512: resample::avx512::fn(__VA_ARGS__); break; \
    case cpu::CpuIsa::Avx2: resample::avx2::fn(__VA_ARGS__); break;     \
    default: resample::baseline::fn(__VA_ARGS__);                       \
  }
#endif

// ---- weights (Note [resize like torch 1.13]) ----

template <typename A>
A fused_weight(A a, A b, A c) {
  return std::fma(a, b, c);
}

template <typename A>
Taps<A> make_taps(int64_t in, int64_t out, int64_t width) {
  Taps<A> t;
  t.in = in;
  t.out = out;
  t.width = width;
  t.index.assign(size_t(out * width), 0);
  t.count.assign(size_t(out), int32_t(width));
  t.weight.assign(size_t(out * width), A(0));
  return t;
}

template <typename A>
Taps<A> linear_taps(int64_t in, int64_t out) {
  Taps<A> t = make_taps<A>(in, out, 2);
  const A scale = A(in) / A(out);
  for (int64_t i = 0; i < out; ++i) {
    int64_t i0 = i, i1 = i;
    A l0 = 1, l1 = 0;
    if (in != out) {
      double src = double(scale) * (double(i) + 0.5) - 0.5;
      if (src < 0) src = 0;
      i0 = int64_t(src);
      i1 = i0 < in - 1 ? i0 + 1 : i0;
      l1 = A(src - double(i0));
      l0 = A(1) - l1;
    }
    t.index[size_t(2 * i)] = i0;
    t.index[size_t(2 * i + 1)] = i1;
    t.weight[size_t(2 * i)] = l0;
    t.weight[size_t(2 * i + 1)] = l1;
  }
  return t;
}

// torch's cubic_convolution1 / 2 with A = -0.75 as compiled: ((A + 2) x - (A + 3)) x x + 1 and
// ((A x - 5A) x + 8A) x - 4A, the inner multiply-adds fused, the last step not.
template <typename A>
void cubic_weights(A t, A* w) {
  const A a = A(-0.75);
  auto c1 = [&](A x) { return (fused_weight(a + 2, x, -(a + 3)) * x) * x + A(1); };
  auto c2 = [&](A x) { return fused_weight(fused_weight(a, x, -5 * a), x, 8 * a) * x - 4 * a; };
  w[0] = c2(A(double(t) + 1.0));
  w[1] = c1(t);
  const A x2 = A(1.0 - double(t));
  w[2] = c1(x2);
  w[3] = c2(A(double(x2) + 1.0));
}

template <typename A>
Taps<A> cubic_taps(int64_t in, int64_t out) {
  Taps<A> t = make_taps<A>(in, out, 4);
  const A scale = A(in) / A(out);
  for (int64_t i = 0; i < out; ++i) {
    const double src = double(scale) * (double(i) + 0.5) - 0.5;
    const int64_t ii = int64_t(std::floor(float(src)));
    cubic_weights<A>(A(src - double(ii)), t.weight.data() + 4 * i);
    for (int64_t j = 0; j < 4; ++j)
      t.index[size_t(4 * i + j)] = std::clamp<int64_t>(ii - 1 + j, 0, in - 1);
  }
  return t;
}

template <typename A>
A aa_filter(A x, bool cubic) {
  if (x < 0) x = -x;
  if (!cubic) return x < 1.0 ? A(1.0 - double(x)) : A(0);
  // PIL's bicubic (a = -0.5), as torch computes it: the first branch in double.
  const double a = -0.5;
  if (x < 1.0) return A(((a + 2.0) * double(x) - (a + 3.0)) * double(x) * double(x) + 1);
  if (x < 2.0) return A(double(fused_weight(fused_weight(x - A(5), x, A(8)), x, A(-4))) * a);
  return A(0);
}

template <typename A>
Taps<A> aa_taps(int64_t in, int64_t out, bool cubic) {
  const A scale = A(in) / A(out);
  const double half = cubic ? 2.0 : 1.0;  // interp_size / 2
  const A support = scale >= 1.0 ? A(half * double(scale)) : A(half);
  const int64_t width = int64_t(std::ceil(support)) * 2 + 1;
  Taps<A> t = make_taps<A>(in, out, width);
  const A invscale = scale >= 1.0 ? A(1.0 / double(scale)) : A(1);
  for (int64_t i = 0; i < out; ++i) {
    const A center = A(double(scale) * (double(i) + 0.5));
    const int64_t xmin = std::max<int64_t>(int64_t(double(center - support) + 0.5), 0);
    const int64_t xsize = std::min<int64_t>(int64_t(double(center + support) + 0.5), in) - xmin;
    A* w = t.weight.data() + i * width;
    A total = 0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = aa_filter<A>(A((double(A(j + xmin) - center) + 0.5) * double(invscale)), cubic);
      total += w[j];
      t.index[size_t(i * width + j)] = xmin + j;
    }
    if (total != 0)
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    t.count[size_t(i)] = int32_t(std::max<int64_t>(xsize, 1));
    if (xsize < 1) t.index[size_t(i * width)] = std::min(xmin, in - 1);
  }
  return t;
}

// torch's nearest_idx / nearest_neighbor_exact_compute_source_index.
std::vector<int64_t> nearest_index(int64_t in, int64_t out, bool exact) {
  std::vector<int64_t> idx(static_cast<size_t>(out));
  const float scale = float(in) / float(out);
  for (int64_t i = 0; i < out; ++i) {
    int64_t s;
    if (exact) {
      s = int64_t(std::floor(float((double(i) + 0.5) * double(scale))));
    } else if (out == in) {
      s = i;
    } else if (out == 2 * in) {
      s = i >> 1;
    } else {
      s = int64_t(std::floor(float(i) * scale));
    }
    idx[size_t(i)] = std::min(s, in - 1);
  }
  return idx;
}

template <typename T>
void nearest_copy(const Region<T>& in, const std::vector<int64_t>& iy,
                  const std::vector<int64_t>& ix, const OutRegion<T>& out) {
  for (int64_t k = 0; k < out.planes; ++k)
    for (int64_t y = 0; y < out.h; ++y) {
      const T* s = in.data + k * in.plane + iy[size_t(y)] * in.row;
      T* d = out.data + k * out.plane + y * out.row;
      for (int64_t x = 0; x < out.w; ++x) d[x * out.pix] = s[ix[size_t(x)] * in.pix];
    }
}

// One resize of a region into a region (same number of planes). `channels_last`: torch would
// take its channels-last bilinear kernel for this input (Note [resize like torch 1.13]).
template <typename T, typename A, typename O>
void resample_region(const Region<T>& in, const OutRegion<O>& out, InterpolationMode mode,
                     bool antialias, bool channels_last) {
  if (mode == InterpolationMode::kNearest || mode == InterpolationMode::kNearestExact) {
    if constexpr (std::is_same_v<T, O>) {
      const bool exact = mode == InterpolationMode::kNearestExact;
      nearest_copy(in, nearest_index(in.h, out.h, exact), nearest_index(in.w, out.w, exact), out);
    }
    return;
  }
  const bool cubic = mode == InterpolationMode::kBicubic;
  if (!antialias && !cubic && channels_last) {
    const Taps<A> ty = linear_taps<A>(in.h, out.h), tx = linear_taps<A>(in.w, out.w);
    ACCEL_RESAMPLE_DISPATCH(run_bilinear_cl, in, ty, tx, out);
    return;
  }
  const SumKind kind = antialias ? SumKind::kAntialias : cubic ? SumKind::kCubic : SumKind::kLinear;
  auto taps = [&](int64_t n_in, int64_t n_out) {
    return antialias ? aa_taps<A>(n_in, n_out, cubic)
           : cubic   ? cubic_taps<A>(n_in, n_out)
                     : linear_taps<A>(n_in, n_out);
  };
  // Pass 1 (along x, or a conversion when the width stays): [planes][in.h][out.w] in A, only
  // for the rows that pass 2 reads.
  std::vector<A> mid(size_t(in.planes * in.h * out.w));
  std::optional<Taps<A>> ty;
  std::vector<uint8_t> need;
  if (out.h != in.h) {
    ty = taps(in.h, out.h);
    need.assign(size_t(in.h), 0);
    for (int64_t i = 0; i < out.h; ++i)
      for (int32_t j = 0; j < ty->count[size_t(i)]; ++j)
        need[size_t(ty->index[size_t(i * ty->width + j)])] = 1;
  }
  if (out.w != in.w) {
    const Taps<A> tx = taps(in.w, out.w);
    const uint8_t* need_ptr = need.empty() ? nullptr : need.data();
    ACCEL_RESAMPLE_DISPATCH(run_horizontal, in, tx, kind, need_ptr, mid.data());
  } else {
    ACCEL_RESAMPLE_DISPATCH(run_to_planar, in, mid.data());
  }
  // Pass 2 (along y, or the store when the height stays).
  if (ty) {
    std::vector<A> acc(size_t(out.w));
    ACCEL_RESAMPLE_DISPATCH(run_vertical, mid.data(), in.planes, in.h, out.w, *ty, kind, out,
                            acc.data());
  } else {
    ACCEL_RESAMPLE_DISPATCH(run_store, mid.data(), out);
  }
}

void check_mode(InterpolationMode mode, bool antialias, const char* op) {
  ACCEL_CHECK(
      !antialias || mode == InterpolationMode::kBilinear || mode == InterpolationMode::kBicubic,
      ValueError, op, "antialias is supported for bilinear and bicubic only, not ",
      interpolation_name(mode));
}

// torch's MemoryFormat::ChannelsLast contiguity of an (N, C, h, w) view with these strides (in
// elements): the dims C, W, H, N of size > 1 must have strides 1, C, C * W, C * W * H.
bool channels_last_view(int64_t n, int64_t c, int64_t h, int64_t w, int64_t sn, int64_t sc,
                        int64_t sh, int64_t sw) {
  int64_t expected = 1;
  const int64_t sizes[4] = {c, w, h, n}, strides[4] = {sc, sw, sh, sn};
  for (int d = 0; d < 4; ++d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// Resizes the box (top, left, bh, bw), which lies inside the image, to (oh, ow). The box is
// torchvision's crop view of a contiguous (C, H, W) tensor, which decides channels_last.
Tensor resize_box(const Tensor& image, int64_t top, int64_t left, int64_t bh, int64_t bw,
                  int64_t oh, int64_t ow, InterpolationMode mode, bool antialias, const char* op) {
  check_mode(mode, antialias, op);
  return detail::by_dtype(image, op, [&](const detail::Img& m) {
    Tensor out = detail::make_out(m, oh, ow, m.t.dtype());
    // The torch view: (N, channels, bh, bw) of a contiguous (N, channels, H, W) tensor, N the
    // product of the dims before the channels (1 for (C, H, W): torchvision adds it).
    const int64_t n = m.c / m.channels;
    const bool cl =
        channels_last_view(n, m.channels, bh, bw, m.channels * m.h * m.w, m.h * m.w, m.w, 1);
    auto run = [&](auto tag_t, auto tag_a) {
      using T = decltype(tag_t);
      using A = decltype(tag_a);
      const T* base = m.t.data<T>();
      Region<T> in;
      OutRegion<T> o;
      in.planes = o.planes = m.c;
      in.h = bh;
      in.w = bw;
      o.h = oh;
      o.w = ow;
      o.data = out.data<T>();
      if (m.hwc) {
        in.plane = o.plane = 1;
        in.pix = o.pix = m.c;
        in.row = m.w * m.c;
        o.row = ow * m.c;
      } else {
        in.plane = m.h * m.w;
        o.plane = oh * ow;
        in.pix = o.pix = 1;
        in.row = m.w;
        o.row = ow;
      }
      in.data = base + top * in.row + left * in.pix;
      resample_region<T, A, T>(in, o, mode, antialias, cl);
    };
    switch (m.t.dtype()) {
      case kUInt8: run(uint8_t{}, float{}); break;
      case kFloat64: run(double{}, double{}); break;
      default: run(float{}, float{});
    }
    return out;
  });
}

void check_out_size(int64_t h, int64_t w, const char* op) {
  ACCEL_CHECK(h >= 1 && w >= 1, ValueError, op, "output size must be positive, got (", h, ", ", w,
              ")");
}

}  // namespace

const char* interpolation_name(InterpolationMode mode) {
  switch (mode) {
    case InterpolationMode::kNearest: return "nearest";
    case InterpolationMode::kNearestExact: return "nearest-exact";
    case InterpolationMode::kBilinear: return "bilinear";
    case InterpolationMode::kBicubic: return "bicubic";
  }
  return "?";
}

std::pair<int64_t, int64_t> resized_output_size(int64_t height, int64_t width, int64_t size,
                                                std::optional<int64_t> max_size) {
  const char* op = "resize";
  ACCEL_CHECK(size >= 1, ValueError, op, "size must be positive, got ", size);
  ACCEL_CHECK(height >= 1 && width >= 1, ShapeError, op, "empty image (", height, ", ", width, ")");
  // torchvision's _compute_resized_output_size: Python float division, truncated.
  const int64_t s = std::min(height, width), l = std::max(height, width);
  int64_t new_short = size, new_long = int64_t(double(size) * double(l) / double(s));
  if (max_size) {
    ACCEL_CHECK(
        *max_size > size, ValueError, op, "max_size = ", *max_size,
        " must be strictly greater than the requested size for the smaller edge size = ", size);
    if (new_long > *max_size) {
      new_short = int64_t(double(*max_size) * double(new_short) / double(new_long));
      new_long = *max_size;
    }
  }
  ACCEL_CHECK(new_short >= 1, ValueError, op, "an image of (", height, ", ", width,
              ") resized to shorter side ", size, " with max_size ", max_size.value_or(0),
              " would have an empty side");
  return width <= height ? std::make_pair(new_long, new_short)
                         : std::make_pair(new_short, new_long);
}

Tensor resize(const Tensor& image, int64_t height, int64_t width, InterpolationMode interpolation,
              bool antialias) {
  check_out_size(height, width, "resize");
  const auto [h, w] = detail::image_hw(image, "resize");
  check_mode(interpolation, antialias, "resize");
  if (h == height && w == width) return image;  // torchvision returns the image itself
  return resize_box(image, 0, 0, h, w, height, width, interpolation, antialias, "resize");
}

Tensor resize(const Tensor& image, const std::vector<int64_t>& size,
              InterpolationMode interpolation, std::optional<int64_t> max_size, bool antialias) {
  ACCEL_CHECK(size.size() == 1 || size.size() == 2, ValueError, "resize",
              "size must have 1 (shorter side) or 2 (height, width) values, got ", size.size());
  ACCEL_CHECK(size.size() == 1 || !max_size, ValueError, "resize",
              "max_size is only supported with one size (the shorter side)");
  if (size.size() == 2) return resize(image, size[0], size[1], interpolation, antialias);
  const auto [h, w] = detail::image_hw(image, "resize");
  const auto [oh, ow] = resized_output_size(h, w, size[0], max_size);
  return resize(image, oh, ow, interpolation, antialias);
}

Tensor resized_crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
                    int64_t out_height, int64_t out_width, InterpolationMode interpolation,
                    bool antialias) {
  const char* op = "resized_crop";
  check_out_size(out_height, out_width, op);
  check_out_size(height, width, op);
  check_mode(interpolation, antialias, op);
  const auto [h, w] = detail::image_hw(image, op);
  if (top < 0 || left < 0 || top + height > h || left + width > w) {
    // A box reaching out of the image: torchvision pads the crop with zeros (a new tensor).
    return resize(crop(image, top, left, height, width), out_height, out_width, interpolation,
                  antialias);
  }
  if (height == out_height && width == out_width) return crop(image, top, left, height, width);
  return resize_box(image, top, left, height, width, out_height, out_width, interpolation,
                    antialias, op);
}

}  // namespace accel::data::transforms
#endif  // !ACCEL_ISA_NS
