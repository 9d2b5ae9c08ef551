#!/usr/bin/python3
"""Writes tests/nn/vision_layers_fixture.safetensors: PyTorch's results for the nn pieces the
vision model zoo added (hardswish, hardsigmoid, max_pool2d's ceil_mode), which
tests/nn/test_vision_layers.cc replays in float64.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/nn/make_vision_layers_fixture.py
The test never runs Python; it reads the committed file.

Each case `name` stores `name.x`, `name.out`, the cotangent `name.w` of the loss sum(out * w) and
the input gradient `name.grad`. The pooling cases' arguments are written next to their names in
the test.
"""
import json
import os
import struct

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
tensors = {}


def case(name, fn, x):
    x = x.clone().requires_grad_(True)
    out = fn(x)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    tensors[name + ".x"] = x.detach()
    tensors[name + ".out"] = out.detach()
    tensors[name + ".w"] = w
    tensors[name + ".grad"] = x.grad


# The ends of the pieces exactly (-3, 3), where torch's backward formulas pick a side.
ends = torch.tensor([-4.0, -3.0, -2.5, -1.0, 0.0, 0.5, 2.9, 3.0, 3.5, 5.0])
case("hardswish", F.hardswish, torch.cat([ends, torch.randn(20) * 3]))
case("hardsigmoid", F.hardsigmoid, torch.cat([ends, torch.randn(20) * 3]))
# max_pool2d(x, kernel, stride, padding, ceil_mode=True)
case("pool_k3s2_8x8", lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True), torch.randn(2, 3, 8, 8))
# H: ceil gives 4 windows, the last would start in the right padding: 3 (torch's rule); W: 4.
case("pool_k2s2p1_5x6", lambda x: F.max_pool2d(x, 2, 2, 1, ceil_mode=True), torch.randn(1, 2, 5, 6))
case("pool_k32s21p1_6x9", lambda x: F.max_pool2d(x, (3, 2), (2, 1), 1, ceil_mode=True),
     torch.randn(2, 2, 6, 9))
case("pool_unbatched_k3s2_10x7", lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True),
     torch.randn(3, 10, 7))
# ceil_mode with nothing to round: the floor result.
case("pool_k2s2_6x6", lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), torch.randn(1, 1, 6, 6))

header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name].detach().contiguous()
    data = t.numpy().tobytes()
    header[name] = {"dtype": "F64", "shape": list(t.shape),
                    "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header["__metadata__"] = {"torch": torch.__version__}
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vision_layers_fixture.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)
print(f"wrote {path}: {len(tensors)} tensors, {8 + len(hj) + offset} bytes")
