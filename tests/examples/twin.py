"""What the PyTorch twins of the ported examples share (tests/examples/torch_<name>.py).

Run the twins with Debian's python3-torch (1.13): /usr/bin/python3 tests/examples/torch_<name>.py
The tests never run Python; they read the committed fixtures.

det_init() gives every parameter values both sides compute bit for bit (tests/examples/twin.h has
the C++ side), so the fixtures need not hold the initial weights (a model's first layer alone can
be megabytes in float64): the k-th parameter in name order, element j (row-major), gets
    z = splitmix64(j + (k + 1) * 2^32),  u = (z >> 11) * 2^-53 - 0.5,  value = u * (2 / sqrt(fan_in))
with fan_in = numel / shape[0] (numel for a vector). Integer arithmetic, one exact conversion,
one exact subtraction and one rounded product: the same double in C++ and numpy.
"""
import json
import math
import struct

import numpy as np
import torch

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    """x: uint64 array. splitmix64's output function (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def det_values(k, shape):
    n = int(np.prod(shape)) if len(shape) else 1
    fan_in = n // shape[0] if len(shape) >= 2 else n
    j = np.arange(n, dtype=np.uint64) + np.uint64((k + 1) << 32)
    u = (splitmix64(j) >> np.uint64(11)).astype(np.float64) * (2.0 ** -53) - 0.5
    return (u * (2.0 / math.sqrt(fan_in))).reshape(shape)


def det_init(model):
    """Overwrites model's parameters (float64) with det_values, in sorted name order."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, name in enumerate(sorted(params)):
            p = params[name]
            p.copy_(torch.from_numpy(det_values(k, tuple(p.shape))))


def checksum(model):
    """Sum over parameters of sum(p) + sum(p^2), to compare final weights."""
    s = 0.0
    for _, p in sorted(model.named_parameters()):
        s += float(p.detach().sum()) + float((p.detach() ** 2).sum())
    return s


def write_safetensors(path, tensors, metadata):
    """tensors: name -> torch tensor (float64 / float32 / int64 / uint8); metadata: str -> str."""
    dtypes = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = dict(metadata, torch=torch.__version__)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    print(f"wrote {path}: {len(tensors)} tensors, {8 + len(hj) + offset} bytes")
