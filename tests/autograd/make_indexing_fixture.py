#!/usr/bin/python3
"""Writes tests/autograd/indexing_fixture.txt: PyTorch's (or numpy's) results for the indexing,
index_put, cross_entropy and norm cases that tests/autograd/test_indexing.cc replays.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/autograd/make_indexing_fixture.py
The test never runs Python; it reads the committed text file.

Index lists are written in a small spec language that the C++ test parses too, entries separated
by spaces:  `:` `1:` `:3` `::2` `1:-1:2` (slices), `N` (None), `...`, `T` / `F` (bools), `-1`
(an int), `i64(2,2)=0,1,1,0` / `i32(3)=...` (index tensors), `b(2,3)=1,0,...` / `u8(..)=..`
(masks), `i64()=1` / `b()=1` (0-dim tensors).

torch 1.13 mishandles a multi-dim mask followed by more entries (x[m, None] raises); those cases
are computed with numpy, whose rules are the ones torch documents, and carry no int entries
(numpy would treat ints next to index tensors as index tensors, torch selects first).
"""
import math
import os

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def parse_spec(spec):
    out = []
    for tok in spec.split():
        if tok == "N":
            out.append(None)
        elif tok == "...":
            out.append(Ellipsis)
        elif tok == "T":
            out.append(True)
        elif tok == "F":
            out.append(False)
        elif "(" in tok:
            kind, rest = tok.split("(", 1)
            shape_s, vals_s = rest.split(")=")
            shape = [int(v) for v in shape_s.split(",") if v]
            vals = [int(v) for v in vals_s.split(",") if v]
            # torch 1.13 indexes with int64 only; int32 indices (newer torch, and accel) mean the
            # same, so the reference uses int64 for both.
            dt = {"i64": torch.int64, "i32": torch.int64, "b": torch.bool, "u8": torch.uint8}[kind]
            out.append(torch.tensor(vals, dtype=torch.int64).to(dt).reshape(shape))
        elif ":" in tok:
            parts = [int(p) if p else None for p in tok.split(":")]
            out.append(slice(*parts))
        else:
            out.append(int(tok))
    return tuple(out)


def to_numpy_index(idx):
    return tuple(e.numpy() if isinstance(e, torch.Tensor) else e for e in idx)


def ints(t):
    return ",".join(str(int(v)) for v in t.reshape(-1).tolist())


def floats(t):
    return ",".join(repr(float(v)) for v in t.reshape(-1).tolist())


def shape_s(s):
    return ",".join(str(v) for v in s)


# (name, x shape, spec, engine)
READS = [
    ("int", [3, 4], "1", "t"),
    ("negative int", [3, 4], "-1", "t"),
    ("slices", [5, 6], "1:4 ::2", "t"),
    ("slice clamps", [5, 6], "-10:100 4:", "t"),
    ("None and ellipsis", [2, 3, 4], "N ... N 1", "t"),
    ("ellipsis in the middle", [2, 3, 4], "0 ... 2", "t"),
    ("index tensor", [4, 3], "i64(5)=2,0,2,-1,-4", "t"),
    ("int32 index", [4, 3], ": i32(2)=2,-3", "t"),
    ("rows and labels", [3, 4], "i64(3)=0,2,2 i64(3)=1,3,0", "t"),
    ("separated by a slice", [2, 3, 4], "i64(2,2)=0,1,1,0 : i64(2,2)=3,0,2,1", "t"),
    ("separated by None", [2, 3, 4], "i64(2)=0,1 N i64(2)=2,1", "t"),
    ("int then index tensors (torch selects first)", [2, 3, 4], "0 : i64(2)=0,3", "t"),
    ("int between index tensors", [2, 3, 4], "i64(2)=1,0 1 i64(2)=3,2", "t"),
    ("broadcast (3,1) (1,4)", [5, 6], "i64(3,1)=4,0,2 i64(1,4)=5,1,1,3", "t"),
    ("broadcast with a slice first", [2, 5, 6], ": i64(3,1)=4,0,2 i64(4)=5,1,1,3", "t"),
    ("mask over all dims", [2, 3], "b(2,3)=1,0,1,0,0,1", "t"),
    ("mask over leading dims", [2, 3, 4], "b(2,3)=1,0,1,0,1,1", "t"),
    ("mask on a middle dim", [2, 4, 3], ": b(4)=0,1,1,0", "t"),
    ("uint8 mask", [4, 2], "u8(4)=1,0,0,1", "t"),
    ("mask and index tensor", [2, 4, 3], ": b(4)=0,1,1,0 i64(2)=2,0", "t"),
    ("mask with None after", [2, 3, 4], "b(2,3)=1,0,1,0,1,1 N", "n"),
    ("mask with slice after", [2, 3, 4], "b(2,3)=1,0,1,0,1,1 1:3", "n"),
    ("slice then 2-d mask", [2, 3, 4], ": b(3,4)=1,0,0,1,0,1,1,0,0,0,0,1", "n"),
    ("all-false mask", [3, 2], "b(3)=0,0,0", "t"),
    ("empty index tensor", [3, 4], "i64(0)=", "t"),
    ("empty index after slice", [3, 4], ": i64(0)=", "t"),
    ("True", [2, 3], "T", "t"),
    ("False", [2, 3], "F", "t"),
    ("True then int", [2, 3], "T 1", "t"),
    ("0-dim int tensor selects", [2, 3, 4], "i64()=1 : i64(2)=0,3", "t"),
    ("0-dim bool tensor", [2, 3], "b()=1", "t"),
    ("index tensor on dim 2 of 4", [2, 3, 4, 5], ": : i64(2,3)=0,3,1,1,2,0", "t"),
    ("two index tensors around ellipsis", [2, 3, 4, 5], "i64(2)=1,0 ... i64(2)=4,0", "t"),
    ("separated after a leading slice", [2, 3, 4, 5], ": i64(3)=0,2,1 : i64(3)=1,4,0", "t"),
    ("adjacent after a leading slice", [2, 3, 4, 5], ": i64(3)=0,2,1 i64(3)=1,3,0", "t"),
]

# (name, x shape, spec, values shape, values, accumulate)
PUTS = [
    ("accumulate duplicates", [4, 3], "i64(4)=1,3,1,1", [4, 3], None, True),
    ("assign rows", [4, 3], "i64(2)=3,0", [2, 3], None, False),
    ("assign broadcast scalar", [3, 4], "i64(2)=0,2 i64(2)=1,3", [], None, False),
    ("assign broadcast row", [3, 4], "i64(2)=0,2", [4], None, False),
    ("accumulate rows and labels", [3, 4], "i64(4)=0,2,0,0 i64(4)=1,3,1,1", [4], None, True),
    ("assign after a slice", [3, 4], "1: i64(2)=0,-2", [2, 2], None, False),
    ("accumulate separated", [2, 3, 4], "i64(2)=0,1 : i64(2)=3,3", [2, 3], None, True),
    ("assign mask", [3, 4], "b(3,4)=1,0,0,1,0,1,1,0,0,0,0,1", [5], None, False),
    ("accumulate mask rows", [3, 4], "b(3)=1,0,1", [2, 4], None, True),
    ("basic only assign", [3, 4], ": 1", [3], None, False),
    ("basic only accumulate with None", [3, 4], "N 1:3 2", [1, 2], None, True),
    ("int then tensor", [2, 3, 4], "1 : i64(2)=0,2", [3, 2], None, False),
    ("assign separated after a leading slice", [2, 3, 4, 5], ": i64(3)=0,2,1 : i64(3)=1,4,0",
     [3, 2, 4], None, False),
]

# (name, logits shape, target kind, target shape, target, weight, ignore, reduction, smoothing)
CE = [
    ("probs mean", [3, 4], "p", [3, 4], None, None, -100, "mean", 0.0),
    ("probs weights smoothing mean", [3, 4], "p", [3, 4], None, [0.5, 1.0, 2.0, 1.5], -100,
     "mean", 0.2),
    ("probs (N,C,d) none", [2, 3, 2], "p", [2, 3, 2], None, None, -100, "none", 0.0),
    ("probs sum smoothing", [2, 3], "p", [2, 3], None, None, -100, "sum", 0.3),
    ("probs unbatched", [5], "p", [5], None, [1, 2, 3, 4, 5], -100, "mean", 0.0),
    ("indices weights mean", [4, 3], "i", [4], [0, 2, 1, 2], [0.5, 1.0, 2.0], -100, "mean", 0.0),
    ("indices weights ignore smoothing mean", [4, 3], "i", [4], [0, 2, -100, 1],
     [0.5, 1.0, 2.0], -100, "mean", 0.2),
    ("indices weights ignore smoothing sum", [4, 3], "i", [4], [0, 2, 7, 1], [0.5, 1.0, 2.0], 7,
     "sum", 0.1),
    ("indices weights (N,C,d) none smoothing", [2, 3, 2], "i", [2, 2], [0, 2, 1, 1],
     [0.5, 1.0, 2.0], -100, "none", 0.1),
    ("indices no weights smoothing mean (fused kernel)", [4, 3], "i", [4], [0, 2, 1, 2], None,
     -100, "mean", 0.2),
]

# (name, x values, shape, p, dims, keepdim)
NORMS = [
    ("p2 dim1", [0.5, -1.0, 2.0, 0.0, 0.0, 0.0], [2, 3], 2.0, [1], False),
    ("p1 dim1", [0.5, -1.0, 2.0, 0.0, 0.0, 0.0], [2, 3], 1.0, [1], False),
    ("inf dim1 ties", [0.5, -2.0, 2.0, 0.0, 1.0, -1.0], [2, 3], math.inf, [1], True),
    ("-inf dim0", [0.5, -2.0, 2.0, -0.25, 1.0, -1.0], [2, 3], -math.inf, [0], False),
    ("p3 all", [0.5, -1.0, 2.0, 0.25, 0.0, 0.0], [2, 3], 3.0, [], False),
    ("p0.5 dim1", [0.5, -1.0, 2.0, 0.25, 0.75, 1.5], [2, 3], 0.5, [1], False),
    ("p1.5 dim1 zero row", [0.5, -1.0, 2.0, 0.0, 0.0, 0.0], [2, 3], 1.5, [1], False),
    ("p0 dim1", [0.5, 0.0, 2.0, 0.0, 0.0, 1.0], [2, 3], 0.0, [1], False),
    ("fro dims 0 1 keepdim", [0.5, -1.0, 2.0, 0.25, 1.0, 3.0], [2, 3], "fro", [0, 1], True),
]


def main():
    lines = ["# Generated by tests/autograd/make_indexing_fixture.py (torch %s, numpy %s)."
             % (torch.__version__, np.__version__),
             "# read|name|x shape|spec|out shape|out (x = arange as float64)",
             "# put|name|x shape|spec|values shape|values|accumulate|out",
             "# ce|name|logits shape|logits|kind|target shape|target|weight|ignore|reduction|"
             "smoothing|loss shape|loss|dlogits|dtarget (of loss.sum())",
             "# norm|name|shape|x|p|dims|keepdim|out shape|out|dx (of out.sum())"]
    for name, shape, spec, engine in READS:
        x = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
        idx = parse_spec(spec)
        if engine == "t":
            out = x[idx]
        else:
            out = torch.from_numpy(np.ascontiguousarray(x.numpy()[to_numpy_index(idx)]))
        lines.append("read|%s|%s|%s|%s|%s" % (name, shape_s(shape), spec, shape_s(out.shape),
                                             ints(out)))
    for name, shape, spec, vshape, vals, acc in PUTS:
        x = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
        n = int(np.prod(vshape))
        v = torch.tensor(vals if vals else [1000.0 + 10 * k for k in range(n)]).reshape(vshape)
        idx = parse_spec(spec)
        if acc:
            if all(isinstance(e, torch.Tensor) for e in idx):
                out = x.clone().index_put_(idx, v, accumulate=True)
            else:
                # index_put_ takes tensors only: accumulate through the flat positions x[idx]
                # reads (the same places, duplicates summed).
                flat = torch.arange(x.numel()).reshape(shape)[idx]
                out = x.clone().reshape(-1).index_put_(
                    (flat.reshape(-1),), v.expand(flat.shape).reshape(-1),
                    accumulate=True).reshape(shape)
        else:
            out = x.clone()
            out[idx] = v
        lines.append("put|%s|%s|%s|%s|%s|%d|%s" % (name, shape_s(shape), spec, shape_s(vshape),
                                                   floats(v), int(acc), floats(out)))
    gen = torch.Generator().manual_seed(23)
    for name, lshape, kind, tshape, tvals, weight, ignore, red, ls in CE:
        logits = (torch.rand(lshape, generator=gen) * 4 - 2).requires_grad_(True)
        if kind == "p":
            target = torch.rand(tshape, generator=gen).requires_grad_(True)
        else:
            target = torch.tensor(tvals, dtype=torch.int64).reshape(tshape)
        w = torch.tensor(weight) if weight else None
        loss = torch.nn.functional.cross_entropy(logits, target, weight=w, ignore_index=ignore,
                                                 reduction=red, label_smoothing=ls)
        loss.sum().backward()
        dtarget = floats(target.grad) if kind == "p" else "-"
        lines.append("ce|%s|%s|%s|%s|%s|%s|%s|%d|%s|%r|%s|%s|%s|%s" % (
            name, shape_s(lshape), floats(logits.detach()), kind, shape_s(tshape),
            floats(target.detach()) if kind == "p" else ints(target),
            floats(w) if w is not None else "-", ignore, red, ls, shape_s(loss.shape),
            floats(loss.detach()), floats(logits.grad), dtarget))
    for name, vals, shape, p, dims, keep in NORMS:
        x = torch.tensor(vals).reshape(shape).requires_grad_(True)
        if p == "fro":
            out = torch.norm(x, p="fro", dim=dims, keepdim=keep)
        else:
            out = torch.linalg.vector_norm(x, ord=p, dim=dims if dims else None, keepdim=keep)
        if out.requires_grad:
            out.sum().backward()
        dx = x.grad if x.grad is not None else torch.zeros_like(x)  # p = 0: no graph in torch
        lines.append("norm|%s|%s|%s|%s|%s|%d|%s|%s|%s" % (
            name, shape_s(shape), floats(x.detach()), p, shape_s(dims), int(keep),
            shape_s(out.shape), floats(out.detach()), floats(dx)))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "indexing_fixture.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", path, len(lines), "lines")


if __name__ == "__main__":
    main()
