#!/usr/bin/python3
"""Writes tests/nn/spellings_fixture.safetensors: PyTorch's values and gradients for the torch
spellings of issue 36 that tests/nn/test_spellings.cc replays in float64 (to 1e-12): nll_loss
with class weights, Embedding's padding_idx and max_norm, the losses that broadcast a target of
another shape, the activations beside relu (hardtanh at its ends, relu6, selu, celu, threshold)
and the convolutions' padding_mode.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/nn/make_spellings_fixture.py
The test never runs Python; it reads the committed file.

Each case `name` stores its inputs (`name.x`, `name.t`, `name.w`, ...), its output `name.out`,
the cotangent `name.g` of the loss sum(out * g) and the gradients `name.grad.x`, ... The test
makes the same call for each name (the calls are written next to the names below).
"""
import json
import os
import struct
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
torch.manual_seed(36)
warnings.simplefilter("ignore")  # the broadcasting cases warn by design

tensors = {}


def put(name, t):
    tensors[name] = t.detach().contiguous().clone()


def grads(name, out, **leaves):
    """Backward of sum(out * g) with a random g; stores out, g and each leaf's gradient."""
    g = torch.randn_like(out)
    (out * g).sum().backward()
    put(name + ".out", out)
    put(name + ".g", g)
    for k, v in leaves.items():
        put(name + ".grad." + k, v.grad)


# ---- nll_loss with class weights (F.nll_loss(x, t, weight, ignore_index, reduction)) ----
def nll_case(name, shape, t, w, **kw):
    x = F.log_softmax(torch.randn(*shape), dim=1).detach().requires_grad_(True)
    put(name + ".x", x)
    put(name + ".t", t)
    put(name + ".w", w)
    grads(name, F.nll_loss(x, t, weight=w, **kw), x=x)


w4 = torch.rand(4) * 1.5 + 0.25
nll_case("nll_w_mean", (6, 4), torch.tensor([3, 0, -100, 3, 1, 2]), w4)  # ignore_index -100
nll_case("nll_w_sum", (6, 4), torch.tensor([3, 0, -100, 3, 1, 2]), w4, reduction="sum")
nll_case("nll_w_none", (6, 4), torch.tensor([3, 0, -100, 3, 1, 2]), w4, reduction="none")
# (N, C, d) with ignore_index 1: the ignored class's weight is in no denominator.
nll_case("nll_w_ncd_ignore1", (2, 4, 3), torch.tensor([[0, 1, 2], [3, 1, 0]]), w4, ignore_index=1)
# cross_entropy with the same weights equals nll_loss(log_softmax) (torch's identity).
x = torch.randn(5, 4, requires_grad=True)
t = torch.tensor([1, 1, 0, 3, 2])
put("ce_w.x", x)
put("ce_w.t", t)
put("ce_w.w", w4)
grads("ce_w", F.cross_entropy(x, t, weight=w4), x=x)

# ---- Embedding: padding_idx (positive and negative) and max_norm ----
emb = nn.Embedding(7, 3, padding_idx=2)
idx = torch.tensor([[2, 0, 2, 5], [1, 2, 5, 6]])
put("emb_pad.weight0", emb.weight)  # row 2 zero, as torch initialises it
with torch.no_grad():
    emb.weight.copy_(torch.randn(7, 3))  # a nonzero padding row: its gradient must still be 0
put("emb_pad.weight", emb.weight)
put("emb_pad.idx", idx)
grads("emb_pad", emb(idx), weight=emb.weight)

emb = nn.Embedding(5, 4, padding_idx=-1)  # row 4
with torch.no_grad():
    emb.weight.copy_(torch.randn(5, 4))
idx = torch.tensor([4, 0, 4, 3])
put("emb_negpad.weight", emb.weight)
put("emb_negpad.idx", idx)
grads("emb_negpad", emb(idx), weight=emb.weight)

emb = nn.Embedding(6, 3, max_norm=1.5, norm_type=2.0)
with torch.no_grad():
    emb.weight.copy_(torch.randn(6, 3) * 2)
idx = torch.tensor([[0, 1, 1], [4, 0, 5]])
put("emb_maxnorm.weight", emb.weight)
put("emb_maxnorm.idx", idx)
grads("emb_maxnorm", emb(idx), weight=emb.weight)
put("emb_maxnorm.weight_after", emb.weight)  # rows 0, 1, 4, 5 renormalised in place

# ---- losses broadcasting a target of another shape ----
def bcast_case(name, fn, xs, ts):
    x = torch.randn(*xs, requires_grad=True)
    t = torch.randn(*ts, requires_grad=True)
    put(name + ".x", x)
    put(name + ".t", t)
    grads(name, fn(x, t), x=x, t=t)


bcast_case("mse_bcast_mean", lambda x, t: F.mse_loss(x, t), (4, 1), (4,))
bcast_case("mse_bcast_none", lambda x, t: F.mse_loss(x, t, reduction="none"), (4,), (3, 1))
bcast_case("l1_bcast_sum", lambda x, t: F.l1_loss(x, t, reduction="sum"), (2, 3), (3,))
bcast_case("smooth_l1_bcast_mean", lambda x, t: F.smooth_l1_loss(x, t, beta=0.5), (3, 1), (1, 4))
bcast_case("huber_bcast_none", lambda x, t: F.huber_loss(x, t, reduction="none", delta=0.7),
           (2, 1, 3), (4, 1))
x = torch.randn(3, 4).log_softmax(1).detach().requires_grad_(True)
t = torch.rand(4).softmax(0).detach().requires_grad_(True)
put("kl_bcast_batchmean.x", x)
put("kl_bcast_batchmean.t", t)
grads("kl_bcast_batchmean", F.kl_div(x, t, reduction="batchmean"), x=x, t=t)

# ---- activations: values and gradients, the interval ends of hardtanh exactly ----
def act_case(name, fn, x):
    x = x.clone().requires_grad_(True)
    put(name + ".x", x)
    grads(name, fn(x), x=x)


ends = torch.tensor([-0.5, 0.7, -0.6, 0.8, 0.0, 0.3, -2.0, 2.0])
act_case("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.7), ends)
act_case("relu6", F.relu6, torch.tensor([-1.0, 0.0, 3.0, 6.0, 7.5, 5.99]))
act_case("selu", F.selu, torch.randn(3, 4) * 2)
act_case("celu", lambda x: F.celu(x, 0.7), torch.randn(3, 4) * 2)
act_case("threshold", lambda x: F.threshold(x, 0.1, -2.0),
         torch.tensor([0.1, 0.2, -1.0, 0.05, 3.0]))
act_case("leaky_relu", lambda x: F.leaky_relu(x, 0.2), torch.randn(2, 5))
act_case("elu", lambda x: F.elu(x, 1.3), torch.randn(2, 5))
act_case("silu", F.silu, torch.randn(2, 5))

# ---- convolution padding_mode ----
def conv_case(name, module, shape):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(*shape, requires_grad=True)
    put(name + ".x", x)
    put(name + ".weight", module.weight)
    put(name + ".bias", module.bias)
    grads(name, module(x), x=x, weight=module.weight, bias=module.bias)


conv_case("conv2d_reflect", nn.Conv2d(2, 3, (3, 2), padding=(1, 2), padding_mode="reflect"),
          (2, 2, 4, 5))
conv_case("conv2d_replicate", nn.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="replicate"),
          (1, 2, 5, 5))
conv_case("conv2d_circular", nn.Conv2d(2, 4, 3, padding=(2, 1), dilation=(2, 1), groups=2,
                                       padding_mode="circular"), (1, 2, 4, 4))
conv_case("conv1d_reflect", nn.Conv1d(2, 3, 3, padding=2, padding_mode="reflect"), (2, 2, 6))

# safetensors: u64 header length, JSON header, raw little-endian data.
header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name]
    dt = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
    data = t.numpy().tobytes()
    header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header["__metadata__"] = {"torch": torch.__version__}
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spellings_fixture.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)
print(f"wrote {path}: {len(tensors)} tensors, {8 + len(hj) + offset} bytes")
