// CPU conv2d: oneDNN primitives for f32/bf16 (f16, any dtype oneDNN cannot run on this CPU, and
// bf16 convolutions where float32 is faster go through f32), direct loops for f64 (oneDNN has no
// f64 convolution; these are the reference kernels gradcheck runs against). 2-D pooling is in
// pool.cc.
//
// Note [conv layouts]: accel tensors are plain NCHW, but oneDNN's fast convolution kernels work on
// blocked layouts (nChw16c, OIhw16i16o, ...): on the `cnn` workload the blocked kernels are about
// twice as fast as the plain-layout (im2col + GEMM) ones, while a reorder of an activation costs a
// few percent of the convolution. So every convolution primitive is created with format `any`,
// and each argument whose chosen layout differs from plain gets a cached reorder primitive into
// (or out of) a scratch buffer from the caching allocator. When oneDNN picks the plain layout
// itself, the tensor's memory is used directly. (Pooling, pool.cc, is memory-bound and runs on the
// plain layout directly: a reorder would cost as much as the pooling.)
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/stubs/conv.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/onednn.h"

namespace accel::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// ---------------- geometry ----------------

struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
  int64_t sh, sw, ph, pw, dh, dw, groups, cg, og;
};

ConvGeom conv_geom(const Tensor& x, const Tensor& w, const Shape& out_sizes,
                   const Conv2dParams& p) {
  ConvGeom g;
  g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.o = w.size(0), g.kh = w.size(2), g.kw = w.size(3);
  g.ho = out_sizes[2], g.wo = out_sizes[3];
  g.sh = p.stride[0], g.sw = p.stride[1], g.ph = p.padding[0], g.pw = p.padding[1];
  g.dh = p.dilation[0], g.dw = p.dilation[1];
  g.groups = p.groups, g.cg = g.c / p.groups, g.og = g.o / p.groups;
  return g;
}

// ---------------- reference kernels (f64) ----------------

template <typename T>
void conv_fwd_ref(const T* x, const T* w, const T* bias, T* y, const ConvGeom& g) {
  parallel_for(g.n * g.o, 1, [&](int64_t b, int64_t e) {
    for (int64_t no = b; no < e; ++no) {
      const int64_t n = no / g.o, o = no % g.o, grp = o / g.og;
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          T acc = bias ? bias[o] : T(0);
          for (int64_t c = 0; c < g.cg; ++c) {
            const T* xp = x + (n * g.c + grp * g.cg + c) * g.h * g.w;
            const T* wp = w + (o * g.cg + c) * g.kh * g.kw;
            for (int64_t i = 0; i < g.kh; ++i) {
              const int64_t ih = oh * g.sh - g.ph + i * g.dh;
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iw = ow * g.sw - g.pw + j * g.dw;
                if (iw < 0 || iw >= g.w) continue;
                acc += xp[ih * g.w + iw] * wp[i * g.kw + j];
              }
            }
          }
          y[(no * g.ho + oh) * g.wo + ow] = acc;
        }
      }
    }
  });
}

// gx = sum over the output cells each input cell feeds (scatter, one image per task).
template <typename T>
void conv_bwd_data_ref(const T* gy, const T* w, T* gx, const ConvGeom& g) {
  parallel_for(g.n, 1, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      T* gxn = gx + n * g.c * g.h * g.w;
      std::fill(gxn, gxn + g.c * g.h * g.w, T(0));
      for (int64_t o = 0; o < g.o; ++o) {
        const int64_t grp = o / g.og;
        const T* gyp = gy + (n * g.o + o) * g.ho * g.wo;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            const T gv = gyp[oh * g.wo + ow];
            for (int64_t c = 0; c < g.cg; ++c) {
              T* gxp = gxn + (grp * g.cg + c) * g.h * g.w;
              const T* wp = w + (o * g.cg + c) * g.kh * g.kw;
              for (int64_t i = 0; i < g.kh; ++i) {
                const int64_t ih = oh * g.sh - g.ph + i * g.dh;
                if (ih < 0 || ih >= g.h) continue;
                for (int64_t j = 0; j < g.kw; ++j) {
                  const int64_t iw = ow * g.sw - g.pw + j * g.dw;
                  if (iw < 0 || iw >= g.w) continue;
                  gxp[ih * g.w + iw] += gv * wp[i * g.kw + j];
                }
              }
            }
          }
        }
      }
    }
  });
}

// gw[o, c, i, j] = sum_{n, oh, ow} gy[n, o, oh, ow] x[n, c', ih, iw]; gb[o] = sum gy[:, o].
template <typename T>
void conv_bwd_weights_ref(const T* x, const T* gy, T* gw, T* gb, const ConvGeom& g) {
  parallel_for(g.o, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const int64_t grp = o / g.og;
      if (gb) {
        T s = T(0);
        for (int64_t n = 0; n < g.n; ++n) {
          const T* gyp = gy + (n * g.o + o) * g.ho * g.wo;
          for (int64_t k = 0; k < g.ho * g.wo; ++k) s += gyp[k];
        }
        gb[o] = s;
      }
      if (!gw) continue;
      for (int64_t c = 0; c < g.cg; ++c) {
        for (int64_t i = 0; i < g.kh; ++i) {
          for (int64_t j = 0; j < g.kw; ++j) {
            T s = T(0);
            for (int64_t n = 0; n < g.n; ++n) {
              const T* gyp = gy + (n * g.o + o) * g.ho * g.wo;
              const T* xp = x + (n * g.c + grp * g.cg + c) * g.h * g.w;
              for (int64_t oh = 0; oh < g.ho; ++oh) {
                const int64_t ih = oh * g.sh - g.ph + i * g.dh;
                if (ih < 0 || ih >= g.h) continue;
                for (int64_t ow = 0; ow < g.wo; ++ow) {
                  const int64_t iw = ow * g.sw - g.pw + j * g.dw;
                  if (iw < 0 || iw >= g.w) continue;
                  s += gyp[oh * g.wo + ow] * xp[ih * g.w + iw];
                }
              }
            }
            gw[((o * g.cg + c) * g.kh + i) * g.kw + j] = s;
          }
        }
      }
    }
  });
}

// ---------------- oneDNN plumbing ----------------

// A primitive argument in the primitive's layout, with the reorder from (inputs) or to (outputs)
// the plain user layout when the two differ (Note [conv layouts]).
// An input already reordered into some primitive layout, reusable by the next primitive that
// wants the same layout (gout feeds both backward_data and backward_weights).
struct Staged {
  const memory::desc* md = nullptr;
  Tensor scratch;
};

struct Operand {
  memory user, inner;
  memory::desc inner_md;
  dnnl::reorder reorder;
  bool needs_reorder = false;
  int64_t inner_bytes = 0;

  void init(const memory::desc& user_md, const memory::desc& chosen_md, bool is_input) {
    user = onednn::unbound_memory(user_md);
    inner_md = chosen_md;
    needs_reorder = user_md != chosen_md;
    inner = needs_reorder ? onednn::unbound_memory(chosen_md) : user;
    inner_bytes = int64_t(chosen_md.get_size());
    if (needs_reorder) reorder = is_input ? dnnl::reorder(user, inner) : dnnl::reorder(inner, user);
  }
  void run_reorder(bool is_input, const char* op) const {
    onednn::ExecArgs<2> a;
    a.add(DNNL_ARG_FROM, is_input ? user : inner);
    a.add(DNNL_ARG_TO, is_input ? inner : user);
    onednn::execute(reorder, a, op);
  }
  // Inputs: binds `data` and reorders it into `scratch` when the layouts differ. With `staged`,
  // reuses a reorder of the same data into the same layout, or records this one for reuse.
  void bind_input(const void* data, Tensor& scratch, const char* op,
                  Staged* staged = nullptr) const {
    onednn::bind(user, data, op);
    if (!needs_reorder) return;
    if (staged && staged->md && *staged->md == inner_md) {
      scratch = staged->scratch;
      onednn::bind(inner, scratch.data_ptr(), op);
      return;
    }
    scratch = empty({inner_bytes}, TensorOptions(kUInt8));
    onednn::bind(inner, scratch.data_ptr(), op);
    run_reorder(true, op);
    if (staged) {
      staged->md = &inner_md;
      staged->scratch = scratch;
    }
  }
  // Outputs: the primitive writes to `scratch` when the layouts differ; finish() reorders back.
  void bind_output(void* data, Tensor& scratch, const char* op) const {
    onednn::bind(user, data, op);
    if (!needs_reorder) return;
    scratch = empty({inner_bytes}, TensorOptions(kUInt8));
    onednn::bind(inner, scratch.data_ptr(), op);
  }
  void finish(const char* op) const {
    if (needs_reorder) run_reorder(false, op);
  }
};

struct ConvDescs {
  memory::data_type dt;
  memory::desc src, wei, dst, bias;        // plain user layouts
  memory::desc src_any, wei_any, dst_any;  // what the primitive is created with
  memory::dims strides, dilates, pad_l, pad_r;
};

// Note [conv layout heuristics]: measured on the cnn workload's layers (2 cores, AVX-512):
//  - forward with a tiny reduction (C/g * kh * kw < 32, e.g. conv 1->32 3x3) does ~9 MACs per
//    output value, so reordering the blocked output back to NCHW costs as much as the
//    convolution: the plain-layout kernel is as fast and needs no scratch;
//  - backward_data with few input channels (C/g < 16) writes a diff_src padded to 16 channels in
//    the blocked layout: the plain-layout kernel is about 4x faster there;
//  - backward_weights: the blocked kernel wins everywhere (3-10x on conv 1->32).
enum class ConvPrim { Fwd, BwdData, BwdWeights };
bool plain_activations(ConvPrim prim, const ConvGeom& g) {
  switch (prim) {
    case ConvPrim::Fwd: return g.cg * g.kh * g.kw < 32;
    case ConvPrim::BwdData: return g.cg < 16;
    case ConvPrim::BwdWeights: return false;
  }
  return false;
}

ConvDescs conv_descs(const ConvGeom& g, DType dtype, bool has_bias, ConvPrim prim) {
  ConvDescs d;
  d.dt = onednn::to_dnnl(dtype);
  const memory::dims src{g.n, g.c, g.h, g.w}, dst{g.n, g.o, g.ho, g.wo};
  const memory::dims wei = g.groups > 1 ? memory::dims{g.groups, g.og, g.cg, g.kh, g.kw}
                                        : memory::dims{g.o, g.c, g.kh, g.kw};
  d.src = memory::desc(src, d.dt, Tag::nchw);
  d.dst = memory::desc(dst, d.dt, Tag::nchw);
  d.wei = memory::desc(wei, d.dt, g.groups > 1 ? Tag::goihw : Tag::oihw);
  if (has_bias) d.bias = memory::desc({g.o}, d.dt, Tag::x);
  const bool plain = plain_activations(prim, g);
  d.src_any = plain ? d.src : memory::desc(src, d.dt, Tag::any);
  d.dst_any = plain ? d.dst : memory::desc(dst, d.dt, Tag::any);
  d.wei_any = memory::desc(wei, d.dt, Tag::any);
  d.strides = {g.sh, g.sw};
  d.dilates = {g.dh - 1, g.dw - 1};  // oneDNN counts dilation from 0
  d.pad_l = {g.ph, g.pw};
  d.pad_r = {g.ph, g.pw};
  return d;
}

dnnl::convolution_forward::primitive_desc conv_fwd_pd(const ConvDescs& d, bool has_bias) {
  using F = dnnl::convolution_forward;
  const F::desc desc =
      has_bias
          ? F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                    d.src_any, d.wei_any, d.bias, d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r)
          : F::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                    d.src_any, d.wei_any, d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r);
  return F::primitive_desc(desc, onednn::engine());
}

onednn::PrimKey conv_key(int kind, const ConvGeom& g, DType dt, bool has_bias) {
  onednn::PrimKey k;
  for (int64_t v : {int64_t(kind), int64_t(dt), int64_t(has_bias), g.n, g.c, g.h, g.w, g.o, g.kh,
                    g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups})
    k.push(v);
  k.push(omp_get_max_threads());  // a primitive's decomposition is fixed at creation
  return k;
}

struct ConvFwdEntry {
  dnnl::convolution_forward prim;
  Operand src, wei, dst;
  memory bias;
  onednn::ExecArgs<4> args;
  bool supported = false;
};

struct ConvBwdDataEntry {
  dnnl::convolution_backward_data prim;
  Operand diff_dst, wei, diff_src;
  onednn::ExecArgs<3> args;
  bool supported = false;
};

struct ConvBwdWeightsEntry {
  dnnl::convolution_backward_weights prim;
  Operand src, diff_dst, diff_wei;
  memory diff_bias;
  onednn::ExecArgs<4> args;
  bool supported = false;
};

enum CacheKind { kConvFwd = 0, kConvBwdData = 1, kConvBwdWeights = 2 };

bool conv_fwd_onednn(const ConvGeom& g, const Tensor& x, const Tensor& w, const Tensor& bias,
                     Tensor& out) {
  const TeamScope team;  // Note [team under load]: before the primitive lookup
  const bool has_bias = bias.defined();
  thread_local onednn::PrimCache<ConvFwdEntry> cache;
  ConvFwdEntry& e = cache.get(conv_key(kConvFwd, g, out.dtype(), has_bias), [&] {
    ConvFwdEntry n;
    const ConvDescs d = conv_descs(g, out.dtype(), has_bias, ConvPrim::Fwd);
    if (d.dt == memory::data_type::undef) return n;
    n.supported = onednn::try_create("conv2d", [&] {
      const auto pd = conv_fwd_pd(d, has_bias);
      n.prim = dnnl::convolution_forward(pd);
      n.src.init(d.src, pd.src_desc(), true);
      n.wei.init(d.wei, pd.weights_desc(), true);
      n.dst.init(d.dst, pd.dst_desc(), false);
    });
    if (!n.supported) return n;
    n.args.add(DNNL_ARG_SRC, n.src.inner);
    n.args.add(DNNL_ARG_WEIGHTS, n.wei.inner);
    n.args.add(DNNL_ARG_DST, n.dst.inner);
    if (has_bias) {
      n.bias = onednn::unbound_memory(d.bias);
      n.args.add(DNNL_ARG_BIAS, n.bias);
    }
    return n;
  });
  if (!e.supported) return false;
  Tensor s_src, s_wei, s_dst;
  e.src.bind_input(x.data_ptr(), s_src, "conv2d");
  e.wei.bind_input(w.data_ptr(), s_wei, "conv2d");
  if (has_bias) onednn::bind(e.bias, bias.data_ptr(), "conv2d");
  e.dst.bind_output(out.data_ptr(), s_dst, "conv2d");
  onednn::execute(e.prim, e.args, "conv2d");
  e.dst.finish("conv2d");
  return true;
}

bool conv_bwd_data_onednn(const ConvGeom& g, const Tensor& w, const Tensor& gout, Tensor& gx,
                          Staged* staged_gout) {
  const TeamScope team;  // Note [team under load]: before the primitive lookup
  thread_local onednn::PrimCache<ConvBwdDataEntry> cache;
  ConvBwdDataEntry& e = cache.get(conv_key(kConvBwdData, g, gx.dtype(), false), [&] {
    ConvBwdDataEntry n;
    const ConvDescs d = conv_descs(g, gx.dtype(), false, ConvPrim::BwdData);
    if (d.dt == memory::data_type::undef) return n;
    n.supported = onednn::try_create("conv2d_backward", [&] {
      using B = dnnl::convolution_backward_data;
      const auto hint = conv_fwd_pd(d, false);
      const B::primitive_desc pd(B::desc(dnnl::algorithm::convolution_direct, d.src_any, d.wei_any,
                                         d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r),
                                 onednn::engine(), hint);
      n.prim = B(pd);
      n.diff_dst.init(d.dst, pd.diff_dst_desc(), true);
      n.wei.init(d.wei, pd.weights_desc(), true);
      n.diff_src.init(d.src, pd.diff_src_desc(), false);
    });
    if (!n.supported) return n;
    n.args.add(DNNL_ARG_DIFF_DST, n.diff_dst.inner);
    n.args.add(DNNL_ARG_WEIGHTS, n.wei.inner);
    n.args.add(DNNL_ARG_DIFF_SRC, n.diff_src.inner);
    return n;
  });
  if (!e.supported) return false;
  Tensor s_dd, s_w, s_ds;
  e.diff_dst.bind_input(gout.data_ptr(), s_dd, "conv2d_backward", staged_gout);
  e.wei.bind_input(w.data_ptr(), s_w, "conv2d_backward");
  e.diff_src.bind_output(gx.data_ptr(), s_ds, "conv2d_backward");
  onednn::execute(e.prim, e.args, "conv2d_backward");
  e.diff_src.finish("conv2d_backward");
  return true;
}

bool conv_bwd_weights_onednn(const ConvGeom& g, const Tensor& x, const Tensor& gout, Tensor& gw,
                             Tensor* gb, Staged* staged_gout) {
  const TeamScope team;  // Note [team under load]: before the primitive lookup
  const bool has_bias = gb != nullptr;
  thread_local onednn::PrimCache<ConvBwdWeightsEntry> cache;
  ConvBwdWeightsEntry& e = cache.get(conv_key(kConvBwdWeights, g, gw.dtype(), has_bias), [&] {
    ConvBwdWeightsEntry n;
    const ConvDescs d = conv_descs(g, gw.dtype(), has_bias, ConvPrim::BwdWeights);
    if (d.dt == memory::data_type::undef) return n;
    n.supported = onednn::try_create("conv2d_backward", [&] {
      using B = dnnl::convolution_backward_weights;
      const auto hint = conv_fwd_pd(d, has_bias);
      const B::desc desc = has_bias
                               ? B::desc(dnnl::algorithm::convolution_direct, d.src_any, d.wei_any,
                                         d.bias, d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r)
                               : B::desc(dnnl::algorithm::convolution_direct, d.src_any, d.wei_any,
                                         d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r);
      const B::primitive_desc pd(desc, onednn::engine(), hint);
      n.prim = B(pd);
      n.src.init(d.src, pd.src_desc(), true);
      n.diff_dst.init(d.dst, pd.diff_dst_desc(), true);
      n.diff_wei.init(d.wei, pd.diff_weights_desc(), false);
    });
    if (!n.supported) return n;
    n.args.add(DNNL_ARG_SRC, n.src.inner);
    n.args.add(DNNL_ARG_DIFF_DST, n.diff_dst.inner);
    n.args.add(DNNL_ARG_DIFF_WEIGHTS, n.diff_wei.inner);
    if (has_bias) {
      n.diff_bias = onednn::unbound_memory(d.bias);
      n.args.add(DNNL_ARG_DIFF_BIAS, n.diff_bias);
    }
    return n;
  });
  if (!e.supported) return false;
  Tensor s_src, s_dd, s_dw;
  e.src.bind_input(x.data_ptr(), s_src, "conv2d_backward");
  e.diff_dst.bind_input(gout.data_ptr(), s_dd, "conv2d_backward", staged_gout);
  if (has_bias) onednn::bind(e.diff_bias, gb->data_ptr(), "conv2d_backward");
  e.diff_wei.bind_output(gw.data_ptr(), s_dw, "conv2d_backward");
  onednn::execute(e.prim, e.args, "conv2d_backward");
  e.diff_wei.finish("conv2d_backward");
  return true;
}

// ---------------- f32 fallback for dtypes oneDNN lacks here ----------------

Tensor to_f32(const Tensor& t) {
  Tensor c = empty(t.sizes(), TensorOptions(kFloat32, t.device()));
  copy_stub(t.device(), c, t);
  return c;
}
Tensor empty_f32(const Tensor& like) {
  return empty(like.sizes(), TensorOptions(kFloat32, like.device()));
}
void copy_back(Tensor& dst, const Tensor& src32) { copy_stub(dst.device(), dst, src32); }

// ---------------- conv entries ----------------

void conv2d_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                   const Conv2dParams& p) {
  if (out.numel() == 0) return;
  const ConvGeom g = conv_geom(x, w, out.sizes(), p);
  if (out.dtype() == kFloat64) {
    return conv_fwd_ref<double>(x.data<double>(), w.data<double>(),
                                bias.defined() ? bias.data<double>() : nullptr, out.data<double>(),
                                g);
  }
  // bf16 takes the float32 kernel where oneDNN's bf16 one is slower (Note [bf16 GEMM where it
  // does not pay] in kernels/cpu/cpu_isa.h).
  if (!bf16_via_f32(out.dtype()) && conv_fwd_onednn(g, x, w, bias, out)) return;
  ACCEL_CHECK(out.dtype() != kFloat32, Error, "conv2d", "oneDNN has no f32 convolution for input ",
              x.sizes(), " and weight ", w.sizes());
  Tensor out32 = empty_f32(out);
  conv2d_kernel(to_f32(x), to_f32(w), bias.defined() ? to_f32(bias) : Tensor(), out32, p);
  copy_back(out, out32);
}

void conv2d_backward_kernel(const Tensor& x, const Tensor& w, const Tensor& gout, Tensor* gx,
                            Tensor* gw, Tensor* gb, const Conv2dParams& p) {
  const ConvGeom g = conv_geom(x, w, gout.sizes(), p);
  const DType dt = gout.dtype();
  if (gout.numel() == 0) {  // nothing flows back
    for (Tensor* t : {gx, gw, gb})
      if (t) fill_stub(t->device(), *t, Scalar(0));
    return;
  }
  if (dt == kFloat64) {
    if (gx) conv_bwd_data_ref<double>(gout.data<double>(), w.data<double>(), gx->data<double>(), g);
    if (gw || gb)
      conv_bwd_weights_ref<double>(x.data<double>(), gout.data<double>(),
                                   gw ? gw->data<double>() : nullptr,
                                   gb ? gb->data<double>() : nullptr, g);
    return;
  }
  bool ok = !bf16_via_f32(dt);
  Staged staged_gout;  // gout reordered once when both primitives want the same layout
  if (ok && gx) ok = conv_bwd_data_onednn(g, w, gout, *gx, &staged_gout);
  if (ok && (gw || gb)) {
    // oneDNN computes the bias gradient together with the weight gradient.
    Tensor gw_local = gw ? *gw : empty(w.sizes(), TensorOptions(dt, w.device()));
    ok = conv_bwd_weights_onednn(g, x, gout, gw_local, gb, &staged_gout);
  }
  if (ok) return;
  ACCEL_CHECK(dt != kFloat32, Error, "conv2d_backward",
              "oneDNN has no f32 convolution backward for ", "input ", x.sizes(), " and weight ",
              w.sizes());
  Tensor gx32 = gx ? empty_f32(*gx) : Tensor(), gw32 = gw ? empty_f32(*gw) : Tensor(),
         gb32 = gb ? empty_f32(*gb) : Tensor();
  conv2d_backward_kernel(to_f32(x), to_f32(w), to_f32(gout), gx ? &gx32 : nullptr,
                         gw ? &gw32 : nullptr, gb ? &gb32 : nullptr, p);
  if (gx) copy_back(*gx, gx32);
  if (gw) copy_back(*gw, gw32);
  if (gb) copy_back(*gb, gb32);
}

}  // namespace

ACCEL_REGISTER_KERNEL(conv2d_stub, CPU, &conv2d_kernel);
ACCEL_REGISTER_KERNEL(conv2d_backward_stub, CPU, &conv2d_backward_kernel);

}  // namespace accel::cpu
