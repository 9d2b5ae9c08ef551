// bench/kernels, the convolution families: conv2d (f32 and bf16) against oneDNN's primitive and
// im2col + Eigen GEMM, and conv_transpose2d / the 1-D convolutions (Note [peaks] and Note [rates]
// in kernels.cc).
#include "bench/kernel_bench.h"

namespace kernel_bench {

// =====================================================================================
// conv2d, the cnn workload's two convolutions (batch 128, 3x3, pad 1, stride 1, with bias):
//   conv1 x (128, 1, 28, 28)  w (32, 1, 3, 3)  -> (128, 32, 28, 28)
//   conv2 x (128, 32, 14, 14) w (64, 32, 3, 3) -> (128, 64, 14, 14)
// dnnl_nchw: the primitive on plain NCHW/OIHW memory, as a framework that keeps NCHW tensors
// would call it. dnnl_blocked: the primitive on the layouts it prefers, reorders excluded (the
// convolution alone; an upper bound). eigen: im2col per image + Eigen GEMM, images over threads.
// =====================================================================================
struct ConvShape {
  const char* name;
  int64_t n, cin, h, w, cout;
};
constexpr int64_t kConvK = 3, kConvPad = 1;

double conv_flops(const ConvShape& c) {
  return 2.0 * double(c.n) * double(c.cout) * double(c.h) * double(c.w) * double(c.cin) *
         double(kConvK * kConvK);
}

// oneDNN forward convolution; `any` lets the primitive pick blocked layouts.
struct DnnlConv {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  DnnlConv(const ConvShape& c, bool any, dt type = dt::f32) {
    const tag t_src = any ? tag::any : tag::nchw, t_w = any ? tag::any : tag::oihw;
    const dnnl::memory::desc src({c.n, c.cin, c.h, c.w}, type, t_src);
    const dnnl::memory::desc wei({c.cout, c.cin, kConvK, kConvK}, type, t_w);
    const dnnl::memory::desc bias({c.cout}, type, tag::a);
    const dnnl::memory::desc dst({c.n, c.cout, c.h, c.w}, type, t_src);
    pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_direct, src, wei, bias, dst,
                                        {1, 1}, {kConvPad, kConvPad}, {kConvPad, kConvPad}),
        dnnl_engine());
    prim = dnnl::convolution_forward(pd);
  }
};

// x (cin, h, w) -> col (cin*9, h*w), zero padding.
void im2col(const float* x, int64_t cin, int64_t h, int64_t w, float* col) {
  for (int64_t c = 0; c < cin; ++c)
    for (int64_t kh = 0; kh < kConvK; ++kh)
      for (int64_t kw = 0; kw < kConvK; ++kw) {
        float* row = col + ((c * kConvK + kh) * kConvK + kw) * h * w;
        for (int64_t oh = 0; oh < h; ++oh) {
          const int64_t ih = oh + kh - kConvPad;
          for (int64_t ow = 0; ow < w; ++ow) {
            const int64_t iw = ow + kw - kConvPad;
            row[oh * w + ow] =
                (ih >= 0 && ih < h && iw >= 0 && iw < w) ? x[(c * h + ih) * w + iw] : 0.f;
          }
        }
      }
}

// The float32 oneDNN primitive on plain NCHW memory: the reference our conv rows are checked
// against.
std::vector<float> conv_reference(const ConvShape& c, const Tensor& x, const Tensor& w,
                                  const Tensor& b, int64_t out_n) {
  std::vector<float> ref(static_cast<size_t>(out_n));
  DnnlConv conv(c, false);
  conv.prim.execute(
      dnnl_stream(),
      {{DNNL_ARG_SRC, dnnl::memory(conv.pd.src_desc(), dnnl_engine(), x.data_ptr())},
       {DNNL_ARG_WEIGHTS, dnnl::memory(conv.pd.weights_desc(), dnnl_engine(), w.data_ptr())},
       {DNNL_ARG_BIAS, dnnl::memory(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr())},
       {DNNL_ARG_DST, dnnl::memory(conv.pd.dst_desc(), dnnl_engine(), ref.data())}});
  dnnl_stream().wait();
  return ref;
}

// =====================================================================================
// maxpool_train: the cnn workload's two training max pools (2 x 2, stride 2, after each conv),
// forward with its argmax workspace + backward through autograd, in float32 and bf16. `ours` is
// pool2d's Auto choice (Note [own 2 x 2 max pool]: accel's kernel for this shape), `dnnl` the
// same API with oneDNN's primitive forced (cpu::set_cpu_pool). GB/s counts x and grad x (read,
// written) and y and grad y (written, read): 2 (n + n / 4) elements.
// =====================================================================================
void register_maxpool_train() {
  const ConvShape shapes[] = {{"pool1", 128, 32, 28, 28, 32}, {"pool2", 128, 64, 14, 14, 64}};
  for (const ConvShape c : shapes) {
    for (const accel::DType d : {accel::kFloat32, accel::kBFloat16}) {
      for (const bool dnnl : {false, true}) {
        const std::string sh = std::string(c.name) + "_" + dims_str({c.n, c.cin, c.h, c.w}) +
                               (d == accel::kBFloat16 ? "_bf16" : "_f32");
        register_bench(std::string("maxpool_train/") + (dnnl ? "dnnl/" : "ours/") + sh,
                       [c, d, dnnl](State& s) {
                         struct Restore {
                           ~Restore() { accel::cpu::set_cpu_pool(accel::cpu::CpuPool::Auto); }
                         } restore;
                         accel::cpu::set_cpu_pool(dnnl ? accel::cpu::CpuPool::OneDnn
                                                       : accel::cpu::CpuPool::Auto);
                         Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}).to(d).requires_grad_();
                         const int64_t n = x.numel();
                         // Checked: the forward against the float64 pool of the same (rounded)
                         // values.
                         const std::vector<float> ref =
                             accel::max_pool2d(x.detach().to(accel::kFloat64), {2, 2})
                                 .to(accel::kFloat32)
                                 .contiguous()
                                 .to_vector<float>();
                         if (!check_close(
                                 s,
                                 [&] {
                                   accel::NoGradGuard ng;
                                   return accel::max_pool2d(x, {2, 2}).to(accel::kFloat32);
                                 },
                                 ref.data(), int64_t(ref.size()), 0, 0))
                           return;
                         const Tensor gy = accel::ones({c.n, c.cin, c.h / 2, c.w / 2}, d);
                         const double bytes =
                             2.0 * double(n + n / 4) * double(accel::dtype_size(d));
                         timed_loop(s, Unit::kByte, bytes, [&] {
                           Tensor y = accel::max_pool2d(x, {2, 2});
                           y.backward(gy);
                           benchmark::DoNotOptimize(x.grad().data_ptr());
                           x.zero_grad();
                         });
                       });
      }
    }
  }
}

void register_conv() {
  const ConvShape shapes[] = {{"conv1", 128, 1, 28, 28, 32}, {"conv2", 128, 32, 14, 14, 64}};
  register_ours("conv2d");  // the same shapes, from the conv2d case's bench entries
  for (const ConvShape c : shapes) {
    const std::string sh =
        std::string(c.name) + "_" + dims_str({c.n, c.cin, c.h, c.w}) + "_" + std::to_string(c.cout);
    const double flops = conv_flops(c);
    const int64_t out_n = c.n * c.cout * c.h * c.w;
    for (bool any : {false, true}) {
      register_bench(
          std::string("conv2d/") + (any ? "dnnl_blocked/" : "dnnl_nchw/") + sh,
          [c, flops, out_n, any](State& s) {
            const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}),
                         w = rand_tensor({c.cout, c.cin, 3, 3}), b = rand_tensor({c.cout});
            DnnlConv conv(c, any);
            // Reorder the plain inputs into the primitive's layouts once, outside the timing.
            auto prepare = [&](const dnnl::memory::desc& want, const dnnl::memory::desc& plain,
                               void* data) {
              dnnl::memory user(plain, dnnl_engine(), data);
              if (want == plain) return user;
              dnnl::memory m(want, dnnl_engine());
              dnnl::reorder(user, m).execute(dnnl_stream(), user, m);
              dnnl_stream().wait();
              return m;
            };
            auto msrc = prepare(conv.pd.src_desc(), {{c.n, c.cin, c.h, c.w}, dt::f32, tag::nchw},
                                x.data_ptr());
            auto mwei = prepare(conv.pd.weights_desc(), {{c.cout, c.cin, 3, 3}, dt::f32, tag::oihw},
                                w.data_ptr());
            dnnl::memory mbias(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr());
            dnnl::memory mdst(conv.pd.dst_desc(), dnnl_engine());
            timed_loop(s, Unit::kFlop, flops, [&] {
              conv.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                                {DNNL_ARG_WEIGHTS, mwei},
                                                {DNNL_ARG_BIAS, mbias},
                                                {DNNL_ARG_DST, mdst}});
              dnnl_stream().wait();
            });
            s.SetLabel(conv.pd.impl_info_str());
            (void)out_n;
          });
    }
    // bf16: ours on bf16 tensors against the primitive on bf16 NCHW memory, checked
    // against the float32 primitive within bf16 tolerance (K = cin * 9 products per output).
    register_bench("conv2d_bf16/ours/" + sh, [c, flops, out_n](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}), w = rand_tensor({c.cout, c.cin, 3, 3}),
                   b = rand_tensor({c.cout});
      const std::vector<float> ref = conv_reference(c, x, w, b, out_n);
      const Tensor x16 = x.to(accel::kBFloat16), w16 = w.to(accel::kBFloat16),
                   b16 = b.to(accel::kBFloat16);
      auto run = [&] {
        return accel::conv2d(x16, w16, b16, {1, 1}, {kConvPad, kConvPad}, {1, 1}, 1);
      };
      const double atol = 1e-2 * std::sqrt(double(c.cin * kConvK * kConvK));
      if (!check_close(
              s, [&] { return run().to(accel::kFloat32); }, ref.data(), out_n, 1e-2, atol))
        return;
      timed_loop(s, Unit::kFlop, flops, [&] {
        Tensor y = run();
        benchmark::DoNotOptimize(y.data_ptr());
      });
    });
    register_bench("conv2d_bf16/dnnl_nchw/" + sh, [c, flops](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}).to(accel::kBFloat16),
                   w = rand_tensor({c.cout, c.cin, 3, 3}).to(accel::kBFloat16),
                   b = rand_tensor({c.cout}).to(accel::kBFloat16);
      const Tensor y = accel::empty({c.n, c.cout, c.h, c.w}, accel::kBFloat16);
      DnnlConv conv(c, false, dt::bf16);
      dnnl::memory msrc(conv.pd.src_desc(), dnnl_engine(), x.data_ptr()),
          mwei(conv.pd.weights_desc(), dnnl_engine(), w.data_ptr()),
          mbias(conv.pd.bias_desc(), dnnl_engine(), b.data_ptr()),
          mdst(conv.pd.dst_desc(), dnnl_engine(), y.data_ptr());
      timed_loop(s, Unit::kFlop, flops, [&] {
        conv.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                          {DNNL_ARG_WEIGHTS, mwei},
                                          {DNNL_ARG_BIAS, mbias},
                                          {DNNL_ARG_DST, mdst}});
        dnnl_stream().wait();
      });
      s.SetLabel(conv.pd.impl_info_str());
    });
    register_bench("conv2d/eigen/" + sh, [c, flops, out_n](State& s) {
      const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}), w = rand_tensor({c.cout, c.cin, 3, 3}),
                   b = rand_tensor({c.cout});
      std::vector<float> y(static_cast<size_t>(out_n));
      const int64_t kk = c.cin * kConvK * kConvK, hw = c.h * c.w;
      const CMapMat W(w.data<float>(), c.cout, kk);
      const Eigen::Map<const Eigen::VectorXf> bias(b.data<float>(), c.cout);
      const float* px = x.data<float>();
      timed_loop(s, Unit::kFlop, flops, [&] {
#pragma omp parallel
        {
          RowMat col(kk, hw);  // per thread
#pragma omp for schedule(static)
          for (int64_t img = 0; img < c.n; ++img) {
            im2col(px + img * c.cin * hw, c.cin, c.h, c.w, col.data());
            MapMat Y(y.data() + img * c.cout * hw, c.cout, hw);
            Y.noalias() = W * col;  // single-threaded inside the parallel region
            Y.colwise() += bias;
          }
        }
        benchmark::DoNotOptimize(y.data());
      });
    });
  }
}

// =====================================================================================
// conv_transpose2d, DCGAN generator layers (batch 64, 4x4 kernel, stride 2, padding 1, with
// bias; each layer doubles H and W):
//   dcgan2 x (64, 256, 8, 8)  w (256, 128, 4, 4) -> (64, 128, 16, 16)
//   dcgan4 x (64, 64, 32, 32) w (64, 3, 4, 4)    -> (64, 3, 64, 64)
// FLOPs: 2 x every input pixel times C_out k^2. ours runs oneDNN's convolution backward-data
// (Note [transposed convolution through the conv kernels]); the peers call oneDNN's deconvolution
// primitive, dnnl_nchw on plain NCHW / IOHW memory (torch's weight layout), dnnl_blocked on the
// layouts it prefers with reorders excluded (an upper bound).
// =====================================================================================
void register_conv_transpose() {
  struct DeconvShape {
    const char* name;
    int64_t n, cin, h, w, cout;
  };
  constexpr int64_t k = 4, stride = 2, padv = 1;
  const DeconvShape shapes[] = {{"dcgan2", 64, 256, 8, 8, 128}, {"dcgan4", 64, 64, 32, 32, 3}};
  register_ours("conv_transpose2d");  // the same shapes, from the conv_transpose2d case
  for (const DeconvShape c : shapes) {
    const std::string sh =
        std::string(c.name) + "_" + dims_str({c.n, c.cin, c.h, c.w}) + "_" + std::to_string(c.cout);
    const double flops = 2.0 * double(c.n * c.cin * c.h * c.w) * double(c.cout * k * k);
    const int64_t ho = (c.h - 1) * stride - 2 * padv + k, wo = (c.w - 1) * stride - 2 * padv + k;
    for (bool any : {false, true}) {
      register_bench(
          std::string("conv_transpose2d/") + (any ? "dnnl_blocked/" : "dnnl_nchw/") + sh,
          [c, flops, any, ho, wo](State& s) {
            const Tensor x = rand_tensor({c.n, c.cin, c.h, c.w}),
                         w = rand_tensor({c.cin, c.cout, k, k}), b = rand_tensor({c.cout});
            const dnnl::memory::desc src_p({c.n, c.cin, c.h, c.w}, dt::f32, tag::nchw),
                wei_p({c.cout, c.cin, k, k}, dt::f32, tag::iohw),
                dst_p({c.n, c.cout, ho, wo}, dt::f32, tag::nchw), bias({c.cout}, dt::f32, tag::a);
            const dnnl::memory::desc src_a({c.n, c.cin, c.h, c.w}, dt::f32, tag::any),
                wei_a({c.cout, c.cin, k, k}, dt::f32, tag::any),
                dst_a({c.n, c.cout, ho, wo}, dt::f32, tag::any);
            dnnl::deconvolution_forward::primitive_desc pd(
                dnnl::deconvolution_forward::desc(
                    dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                    any ? src_a : src_p, any ? wei_a : wei_p, bias, any ? dst_a : dst_p,
                    {stride, stride}, {0, 0}, {padv, padv}, {padv, padv}),
                dnnl_engine());
            dnnl::deconvolution_forward prim(pd);
            auto prepare = [&](const dnnl::memory::desc& want, const dnnl::memory::desc& plain,
                               void* data) {
              dnnl::memory user(plain, dnnl_engine(), data);
              if (want == plain) return user;
              dnnl::memory m(want, dnnl_engine());
              dnnl::reorder(user, m).execute(dnnl_stream(), user, m);
              dnnl_stream().wait();
              return m;
            };
            auto msrc = prepare(pd.src_desc(), src_p, x.data_ptr());
            auto mwei = prepare(pd.weights_desc(), wei_p, w.data_ptr());
            dnnl::memory mbias(bias, dnnl_engine(), b.data_ptr());
            dnnl::memory mdst(pd.dst_desc(), dnnl_engine());
            timed_loop(s, Unit::kFlop, flops, [&] {
              prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, msrc},
                                           {DNNL_ARG_WEIGHTS, mwei},
                                           {DNNL_ARG_BIAS, mbias},
                                           {DNNL_ARG_DST, mdst}});
              dnnl_stream().wait();
            });
            s.SetLabel(pd.impl_info_str());
          });
    }
  }
}

}  // namespace kernel_bench
