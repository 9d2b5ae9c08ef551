// Op cases of the image-model ops: conv_transpose2d, conv1d, conv_transpose1d,
// group_norm, instance_norm, adaptive pools, dropout1d/2d/3d, pixel (un)shuffle, pad, interpolate,
// leaky_relu, elu, hardtanh / relu6, selu, celu, threshold, hardswish, hardsigmoid.
#include <cmath>

#include "op_table.h"

namespace accel::optable::detail {

void add_image_cases(Table& t) {
  // ---- transposed and 1-D convolutions ----
  OpCase& ct = t.add("conv_transpose2d", "3x3 stride 2 padding 1 output_padding 1, bias",
                     OP_INPUTS(m.rnd({2, 3, 4, 4}), m.rnd({3, 2, 3, 3}), m.rnd({2})),
                     OP_FN(return conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 1});))
                   .tol_scale(4);
  // Bench rows conv_transpose2d/ours/<name>_NxCxHxW_Cout: DCGAN generator layers (batch 64, 4x4
  // kernel, stride 2, padding 1: each doubles H and W). FLOPs: every input pixel scatters to
  // C_out k^2 outputs.
  struct DeconvShape {
    const char* name;
    int64_t n, cin, h, w, cout;
  };
  const DeconvShape deconv_shapes[] = {{"dcgan2", 64, 256, 8, 8, 128},
                                       {"dcgan4", 64, 64, 32, 32, 3}};
  for (const DeconvShape& s : deconv_shapes) {
    ct.bench(
        "conv_transpose2d",
        std::string(s.name) + "_" + dims_str({s.n, s.cin, s.h, s.w}) + "_" + std::to_string(s.cout),
        [s](Maker& m) {
          return In{m.rnd({s.n, s.cin, s.h, s.w}), m.rnd({s.cin, s.cout, 4, 4}), m.rnd({s.cout})};
        },
        2.0 * double(s.n * s.cin * s.h * s.w) * double(s.cout * 16), true, Tol{1e-4, 1e-4});
  }
  // Reaches the bench's (stride 2, padding 1, output_padding 0) geometry in the table too.
  t.add("conv_transpose2d", "4x4 stride 2 padding 1 (DCGAN), no bias",
        OP_INPUTS(m.rnd({2, 4, 3, 3}), m.rnd({4, 3, 4, 4})),
        OP_FN(return conv_transpose2d(x[0], x[1], Tensor(), {2, 2}, {1, 1});))
      .tol_scale(4);
  t.add("conv_transpose2d", "groups 2, dilation (2, 1), rectangular, output_padding (0, 1)",
        OP_INPUTS(m.rnd({1, 4, 3, 4}), m.rnd({4, 3, 2, 3}), m.rnd({6})),
        OP_FN(return conv_transpose2d(x[0], x[1], x[2], {1, 2}, {0, 1}, {0, 1}, 2, {2, 1});))
      .tol_scale(4);
  // output_padding of the stride or more: zero rows and columns plus the bias.
  t.add("conv_transpose2d", "output_padding (2, 1) below dilation 3, stride (1, 2), bias",
        OP_INPUTS(m.rnd({1, 2, 3, 3}), m.rnd({2, 2, 2, 2}), m.rnd({2})),
        OP_FN(return conv_transpose2d(x[0], x[1], x[2], {1, 2}, {0, 0}, {2, 1}, 1, {3, 3});))
      .tol_scale(4);
  t.add("conv_transpose2d", "3-D input, 1x1 kernel",
        OP_INPUTS(m.rnd({3, 3, 2}), m.rnd({3, 2, 1, 1}), m.rnd({2})),
        OP_FN(return conv_transpose2d(x[0], x[1], x[2]);))
      .tol_scale(4);
  t.add("conv_transpose2d", "4x4 s2 (4, 16, 7, 6) -> 8 channels",
        OP_INPUTS(m.rnd({4, 16, 7, 6}), m.rnd({16, 8, 4, 4}), m.rnd({8})),
        OP_FN(return conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1});))
      .no_gradcheck()
      .tol_scale(8)
      // dx sums C_out 4x4 = 128 terms, dw and db the 4x14x12 output positions.
      .grad_scales({std::sqrt(128.0 / 16), 2 * std::sqrt(4.0 * 14 * 12 / 16),
                    2 * std::sqrt(4.0 * 14 * 12 / 16)});
  t.add("conv1d", "k3 stride 2 padding 1, bias",
        OP_INPUTS(m.rnd({2, 3, 7}), m.rnd({4, 3, 3}), m.rnd({4})),
        OP_FN(return conv1d(x[0], x[1], x[2], 2, 1);))
      .tol_scale(4);
  t.add("conv1d", "2-D input, groups 2, dilation 2", OP_INPUTS(m.rnd({4, 6}), m.rnd({2, 2, 2})),
        OP_FN(return conv1d(x[0], x[1], Tensor(), 1, 0, 2, 2);))
      .tol_scale(4);
  t.add("conv_transpose1d", "k3 stride 2 padding 1 output_padding 1, bias",
        OP_INPUTS(m.rnd({2, 3, 5}), m.rnd({3, 2, 3}), m.rnd({2})),
        OP_FN(return conv_transpose1d(x[0], x[1], x[2], 2, 1, 1);))
      .tol_scale(4);

  // ---- group / instance norm ----
  OpCase& gn = t.add("group_norm", "2 groups, affine",
                     OP_INPUTS(m.rnd({2, 4, 3, 3}), m.rnd({4}), m.rnd({4})),
                     OP_FN(return group_norm(x[0], 2, x[1], x[2]);));
  // Bench rows group_norm/ours/NxCxHxW_G: a U-Net / diffusion block's activation (32 groups).
  // Reads x, writes y: 2 x 4n bytes.
  for (const Shape& s : {Shape{32, 128, 32, 32}, Shape{8, 256, 64, 64}}) {
    gn.bench(
        "group_norm", dims_str(s) + "_32",
        [s](Maker& m) {
          return In{m.rnd(s, -3, 3), m.rnd({s[1]}), m.rnd({s[1]})};
        },
        2.0 * double(s[0] * s[1] * s[2] * s[3]) * 4, false, Tol{1e-5, 1e-4});
  }
  t.add("group_norm", "(N, C, L), 3 groups, no affine", OP_INPUTS(m.rnd({3, 6, 5})),
        OP_FN(return group_norm(x[0], 3);));
  t.add("group_norm", "2-D (N, C), weight only, eps 0.1", OP_INPUTS(m.rnd({4, 6}), m.rnd({6})),
        OP_FN(return group_norm(x[0], 2, x[1], Tensor(), 0.1);));
  t.add("group_norm", "one group, bias only, large mean",
        OP_INPUTS(m.rnd({2, 3, 2, 5}, 9, 11), m.rnd({3})),
        OP_FN(return group_norm(x[0], 1, Tensor(), x[1]);));
  t.add("group_norm", "(300, 64, 3, 3), 8 groups, affine",
        OP_INPUTS(m.rnd({30, 64, 3, 3}), m.rnd({64}), m.rnd({64})),
        OP_FN(return group_norm(x[0], 8, x[1], x[2]);))
      .no_gradcheck()
      .grad_scales({4, 8, 8});  // dweight / dbias sum 30x9 positions each
  t.add("instance_norm", "affine (N, C, H, W)",
        OP_INPUTS(m.rnd({2, 3, 4, 3}), m.rnd({3}), m.rnd({3})),
        OP_FN(return instance_norm(x[0], Tensor(), Tensor(), x[1], x[2]);));
  t.add("instance_norm", "running statistics (use_input_stats false)",
        OP_INPUTS(m.rnd({2, 3, 4}), m.rnd_const({3}), m.rnd_const({3}, 0.5, 1.5), m.rnd({3}),
                  m.rnd({3})),
        OP_FN(return instance_norm(x[0], x[1], x[2], x[3], x[4], false);));

  // ---- adaptive pooling ----
  t.add("adaptive_avg_pool2d", "uneven windows 5x7 -> 3x4", OP_INPUTS(m.rnd({2, 2, 5, 7})),
        OP_FN(return adaptive_avg_pool2d(x[0], {3, 4});));
  t.add("adaptive_avg_pool2d", "even windows 6x4 -> 3x2 (pooling kernel)",
        OP_INPUTS(m.rnd({1, 3, 6, 4})), OP_FN(return adaptive_avg_pool2d(x[0], {3, 2});));
  t.add("adaptive_avg_pool2d", "3-D input -> 1x1 and upsampling 2x3 -> 3x5",
        OP_INPUTS(m.rnd({2, 2, 3})),
        OP_FN(return adaptive_avg_pool2d(x[0], {1}) + sum(adaptive_avg_pool2d(x[0], {3, 5}));));
  // Distinct values: no ties, the same maximum on every device.
  t.add("adaptive_max_pool2d", "uneven windows 5x7 -> 3x4", OP_INPUTS(m.perm(70, {1, 2, 5, 7})),
        OP_FN(return adaptive_max_pool2d(x[0], {3, 4});));
  t.add("adaptive_max_pool2d", "even windows 4x6 -> 2x3 (pooling kernel)",
        OP_INPUTS(m.perm(48, {2, 4, 6})), OP_FN(return adaptive_max_pool2d(x[0], {2, 3});));
  t.add("adaptive_max_pool2d_indices", "uneven 5x7 -> 3x4, flat indices",
        OP_INPUTS(m.perm(70, {1, 2, 5, 7})),
        OP_FN(return std::get<1>(adaptive_max_pool2d_with_indices(x[0], {3, 4}));))
      .not_differentiable();

  // ---- dropout2d, pixel shuffle ----
  t.add("dropout2d", "p 0.5, whole channels", OP_INPUTS(m.rnd({3, 4, 2, 2})), OP_FN({
          Generator g(11);
          return dropout2d(x[0], 0.5, true, &g);
        }))
      .cpu(
          "the mask comes from the generator on the CPU; the same on every device, but one case "
          "suffices");
  // dropout2d on 3-D input: (N, C, L) as torch, one draw per (n, c) (it warns once).
  t.add("dropout2d", "3-D input as (N, C, L)", OP_INPUTS(m.rnd({3, 4, 5})), OP_FN({
          Generator g(11);
          return dropout2d(x[0], 0.5, true, &g);
        }))
      .cpu("the mask comes from the generator on the CPU; one device suffices");
  t.add("dropout1d", "p 0.3, (N, C, L) and unbatched (C, L)", OP_INPUTS(m.rnd({2, 3, 4})), OP_FN({
          Generator g(5);
          return dropout1d(x[0], 0.3, true, &g) + sum(dropout1d(x[0].select(0, 1), 0.3, true, &g));
        }))
      .cpu("the mask comes from the generator on the CPU; one device suffices");
  t.add("dropout3d", "p 0.5, (N, C, D, H, W)", OP_INPUTS(m.rnd({2, 3, 2, 2, 2})), OP_FN({
          Generator g(3);
          return dropout3d(x[0], 0.5, true, &g);
        }))
      .cpu("the mask comes from the generator on the CPU; one device suffices");
  t.add("pixel_shuffle", "r 2", OP_INPUTS(m.rnd({2, 8, 3, 2})),
        OP_FN(return pixel_shuffle(x[0], 2);));
  t.add("pixel_unshuffle", "r 2, 3-D", OP_INPUTS(m.rnd({2, 4, 6})),
        OP_FN(return pixel_unshuffle(x[0], 2);));

  // ---- pad ----
  t.add("pad", "constant 0.5, a negative (cropping) pad", OP_INPUTS(m.rnd({2, 3, 4, 5})),
        OP_FN(return pad(x[0], {1, 2, -1, 1}, "constant", 0.5);));
  t.add("pad", "reflect (2, 1, 1, 3)", OP_INPUTS(m.rnd({1, 2, 4, 5})),
        OP_FN(return pad(x[0], {2, 1, 1, 3}, "reflect");));
  t.add("pad", "replicate (2, 3, 1, 0)", OP_INPUTS(m.rnd({1, 2, 3, 4})),
        OP_FN(return pad(x[0], {2, 3, 1, 0}, "replicate");));
  t.add("pad", "circular (1, 2, 2, 1), 3-D", OP_INPUTS(m.rnd({2, 3, 4})),
        OP_FN(return pad(x[0], {1, 2, 2, 1}, "circular");));

  // ---- interpolate ----
  t.add("interpolate", "nearest, size 4x5 -> 7x3", OP_INPUTS(m.rnd({2, 2, 4, 5})),
        OP_FN(return interpolate(x[0], {7, 3});));
  t.add("interpolate", "nearest, scale 2, (N, C, L)", OP_INPUTS(m.rnd({2, 3, 4})),
        OP_FN(return interpolate(x[0], {}, {2.0});));
  t.add("interpolate", "bilinear, size 4x3 -> 5x7", OP_INPUTS(m.rnd({1, 2, 4, 3})),
        OP_FN(return interpolate(x[0], {5, 7}, {}, "bilinear", false);));
  t.add("interpolate", "bilinear, align_corners, scale 1.5 and 0.5", OP_INPUTS(m.rnd({1, 2, 4, 6})),
        OP_FN(return interpolate(x[0], {}, {1.5, 0.5}, "bilinear", true);));
  t.add("interpolate", "linear, size 3 -> 8", OP_INPUTS(m.rnd({2, 2, 3})),
        OP_FN(return interpolate(x[0], {8}, {}, "linear");));

  // ---- activations ----
  t.add("leaky_relu", "slope 0.2", OP_INPUTS(m.rnd({3, 4})), OP_FN(return leaky_relu(x[0], 0.2);));
  t.add("elu", "alpha 1.5, large positive inputs", OP_INPUTS(m.rnd({3, 4}, -2, 2)),
        OP_FN(return elu(x[0], 1.5) + sum(elu(mul(x[0], 500.0)));));
  // Random inputs stay off the kinks (the ends of hardtanh, the threshold) almost surely.
  t.add("hardtanh", "[-0.5, 0.7] and relu6", OP_INPUTS(m.rnd({3, 4}, -2, 2)),
        OP_FN(return hardtanh(x[0], -0.5, 0.7) + relu6(mul(x[0], 4.0));));
  t.add("selu", "both sides", OP_INPUTS(m.rnd({3, 4}, -2, 2)), OP_FN(return selu(x[0]);));
  t.add("celu", "alpha 0.7", OP_INPUTS(m.rnd({3, 4}, -2, 2)), OP_FN(return celu(x[0], 0.7);));
  t.add("threshold", "0.1 -> -2", OP_INPUTS(m.rnd({3, 4})),
        OP_FN(return threshold(x[0], 0.1, -2.0);));
  t.add("hardswish", "both ends", OP_INPUTS(m.rnd({3, 4}, -5, 5)), OP_FN(return hardswish(x[0]);));
  t.add("hardsigmoid", "both ends", OP_INPUTS(m.rnd({3, 4}, -5, 5)),
        OP_FN(return hardsigmoid(x[0]);));
}

}  // namespace accel::optable::detail
