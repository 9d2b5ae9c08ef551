#!/usr/bin/python3
"""Writes tests/nn/image_layers_fixture.safetensors: PyTorch's results for the image-model layers
that tests/nn/test_image_layers.cc replays in float64 (to 1e-10).

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/nn/make_image_layers_fixture.py
The test never runs Python; it reads the committed file.

Each case `name` stores `name.input`, the module's parameters under PyTorch's names
(`name.weight`, `name.bias`), `name.out`, the cotangent `name.w_out` of the loss
sum(out * w_out), and the gradients `name.grad.input`, `name.grad.<param>`. Extra entries:
`name.indices` (adaptive max pool), `name.running_mean` / `name.running_var` after the training
step and `name.input2` / `name.out_eval` (an evaluation step with the running statistics).
The metadata entry `cases` lists the case names, `;`-separated; the test builds each module with
the arguments written next to its name below.
"""
import json
import os
import struct

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)

tensors = {}
cases = []


def put(name, t):
    tensors[name] = t.detach().contiguous().clone()


def run(name, module, shape, fwd=None, randomize_params=True):
    """Forward on a random input of `shape`, backward of sum(out * w_out), store everything."""
    if randomize_params:
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p))
    x = torch.randn(*shape, requires_grad=True)
    out = fwd(module, x) if fwd else module(x)
    indices = None
    if isinstance(out, tuple):
        out, indices = out
    w_out = torch.randn_like(out)
    (out * w_out).sum().backward()
    put(name + ".input", x)
    put(name + ".out", out)
    put(name + ".w_out", w_out)
    put(name + ".grad.input", x.grad)
    if indices is not None:
        put(name + ".indices", indices)
    for pname, p in module.named_parameters():
        put(name + "." + pname, p)
        put(name + ".grad." + pname, p.grad)
    cases.append(name)
    return module


nn = torch.nn
# ConvTranspose2d(in, out, kernel, stride, padding, output_padding, groups, bias, dilation)
run("ct_s2_p1_op1", nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
    (2, 3, 4, 5))
run("ct_g2_d21", nn.ConvTranspose2d(4, 6, (2, 3), stride=(1, 2), padding=(0, 1),
                                    output_padding=(0, 1), groups=2, dilation=(2, 1)),
    (2, 4, 3, 4))
run("ct_s3_p2_op2_nobias", nn.ConvTranspose2d(2, 3, 4, stride=3, padding=2, output_padding=2,
                                              bias=False), (1, 2, 3, 3))
run("ct_dcgan", nn.ConvTranspose2d(5, 3, 4, 2, 1, bias=False), (2, 5, 4, 4))
run("ct_output_size", nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), (1, 3, 4, 5),
    fwd=lambda m, x: m(x, output_size=[8, 10]))
run("ct_op2_dil3", nn.ConvTranspose2d(2, 3, 2, output_padding=(2, 1), dilation=3), (2, 2, 3, 4))
run("ct_unbatched", nn.ConvTranspose2d(2, 2, 2, stride=2), (2, 3, 3))
# Conv1d(in, out, kernel, stride, padding, dilation, groups, bias)
run("c1_s2_p1", nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9))
run("c1_g2_d2_nobias", nn.Conv1d(4, 6, 2, dilation=2, groups=2, bias=False), (2, 4, 7))
# ConvTranspose1d(in, out, kernel, stride, padding, output_padding)
run("ct1_s2_p1_op1", nn.ConvTranspose1d(3, 2, 3, stride=2, padding=1, output_padding=1),
    (2, 3, 5))
# GroupNorm(groups, channels, eps, affine)
run("gn_2_4", nn.GroupNorm(2, 4), (2, 4, 3, 5))
run("gn_3_6_noaffine", nn.GroupNorm(3, 6, eps=1e-3, affine=False), (2, 6, 4))
run("gn_1_3_large_mean", nn.GroupNorm(1, 3), (2, 3, 2, 3),
    fwd=lambda m, x: m(x + 10.0))
# InstanceNorm2d(features, eps, momentum, affine, track_running_stats)
run("in_affine", nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5))
m = run("in_track", nn.InstanceNorm2d(3, momentum=0.2, track_running_stats=True), (2, 3, 4, 5))
put("in_track.running_mean", m.running_mean)
put("in_track.running_var", m.running_var)
m.eval()
x2 = torch.randn(2, 3, 4, 5)
put("in_track.input2", x2)
put("in_track.out_eval", m(x2))
# Adaptive pools
run("aap_3x4", nn.AdaptiveAvgPool2d((3, 4)), (2, 2, 5, 7))
run("aap_2x3_even", nn.AdaptiveAvgPool2d((2, 3)), (1, 2, 6, 9))
run("amp_3x4", nn.AdaptiveMaxPool2d((3, 4), return_indices=True), (2, 2, 5, 7))
run("amp_1x1", nn.AdaptiveMaxPool2d(1, return_indices=True), (2, 3, 4, 3))
# interpolate / Upsample
run("up_bilinear_size", nn.Upsample(size=(5, 7), mode="bilinear", align_corners=False),
    (1, 2, 4, 3))
run("up_bilinear_ac_scale", nn.Upsample(scale_factor=(1.5, 0.5), mode="bilinear",
                                        align_corners=True), (1, 2, 4, 6))
run("up_bilinear_scale2", nn.Upsample(scale_factor=2, mode="bilinear"), (2, 1, 3, 4))
run("up_bilinear_down", nn.Upsample(size=(3, 2), mode="bilinear"), (1, 2, 7, 5))
run("up_nearest_size", nn.Upsample(size=(7, 3)), (2, 2, 4, 5))
run("up_nearest_scale", nn.Upsample(scale_factor=1.7), (1, 2, 3, 5))
# Padding
run("pad_reflect", nn.ReflectionPad2d((2, 1, 1, 3)), (1, 2, 4, 5))
run("pad_replicate", nn.ReplicationPad2d((2, 3, 1, 0)), (1, 2, 3, 4))
run("pad_zero", nn.ZeroPad2d((1, 0, 2, 1)), (1, 2, 3, 3))
run("pad_constant_crop", nn.ConstantPad2d((1, 2, -1, 1), 0.5), (2, 3, 4, 5))
run("pad_circular", nn.Identity(), (1, 2, 4, 5),
    fwd=lambda m, x: F.pad(x, (1, 2, 2, 1), mode="circular"))
# Pixel shuffle, activations
run("pixel_shuffle", nn.PixelShuffle(2), (1, 8, 3, 2))
run("pixel_unshuffle", nn.PixelUnshuffle(2), (1, 2, 4, 6))
run("leaky_relu", nn.LeakyReLU(0.2), (2, 3, 4))
run("elu", nn.ELU(1.5), (2, 3, 4))
run("softmax", nn.Softmax(dim=1), (2, 3, 4))
run("log_softmax", nn.LogSoftmax(dim=-1), (2, 3, 4))

# safetensors: u64 header length, JSON header, raw little-endian data.
header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name]
    dt = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
    data = t.numpy().tobytes()
    header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header["__metadata__"] = {"cases": ";".join(cases), "torch": torch.__version__}
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_layers_fixture.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)
print(f"wrote {path}: {len(tensors)} tensors, {len(cases)} cases, {8 + len(hj) + offset} bytes")
