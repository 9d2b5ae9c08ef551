#!/usr/bin/python3
"""torch.save fixtures for tests/io/test_torch_*.cc, made and checked with Debian's python3-torch
(1.13). The tests never run Python; they read the committed files under tests/io/fixtures/.

  /usr/bin/python3 tests/io/make_torch_fixtures.py [--writer PATH]            # make and verify
  /usr/bin/python3 tests/io/make_torch_fixtures.py --verify [--writer PATH]   # re-verify only
  /usr/bin/python3 tests/io/make_torch_fixtures.py --big DIR [--writer PATH]  # a > 4 GiB file
  (--writer: build/tests/io/io_write_pt_fixtures by default)

Made by torch (read by accel's tests, values built again there with pt_content.h's formulas):
  torch_state.pt      every dtype (f32 f64 f16 bf16 i32 i64 u8 bool): a matrix, its transpose (the
                      same storage), rows 1-3 of a 5x4 matrix (a view at a storage offset), a 0-dim
                      and an empty tensor; an expanded vector (stride 0)
  torch_legacy.pt     the same, _use_new_zipfile_serialization=False
  torch_tree.pt       nested dicts, lists, tuples, ints of every width, floats, str, None, bool, an
                      OrderedDict with attributes, int keys, batches over 1000 items, > 256 memo
                      entries (pt_content::tree)
  torch_legacy_tree.pt  the same tree in the legacy layout
  torch_module.pt     Sequential(Linear(3, 2), BatchNorm1d(2)).double().state_dict() (_metadata)
  torch_ckpt.pt       {'model': that state dict, 'params': list(model.parameters()) (Parameters
                      over the same storages), 'grad_leaf': a leaf tensor requiring grad, 'epoch':
                      3, 'lr': 0.5, 'names': ('a', 'b')}
  torch_adam.pt, torch_adamw.pt, torch_sgd.pt
                      {'optimizer': opt.state_dict() after two steps, 'params': the parameters
                      then, 'params3': after a third step} for pt_content.h's optimizer runs

Made by accel (io_write_pt_fixtures, from pt_content.h) and checked here in torch:
  accel_state.pt, accel_tree.pt: torch.load returns the same values, dtypes, shapes, strides,
      storage offsets and storage sharing as the same content built in torch, and the file is
      byte for byte what torch.save writes for that content (saved under the same file name);
  accel_zip64.pt: accel_state's content with every size and offset in zip64 fields; torch.load
      reads it and Python's zipfile checks every CRC;
  accel_adam.pt, accel_adamw.pt, accel_sgd.pt: torch's optimizer of the same class and options
      loads the 'optimizer' state (param_groups equal to torch's own after the same two steps,
      state within 1e-12), and its third step matches torch's own run within 1e-12.
--big DIR (13 GB of disk in DIR, 9 GB of memory, minutes): torch.save of a 4.3 GB uint8 tensor and a
small one after it (real zip64 sizes and offsets), read and written again by accel
(io_write_pt_fixtures --resave): accel's file must be torch's byte for byte, and torch.load must
read it back. Not part of the fixtures; run by hand after changing the zip code.
The tests check that save_pt still writes the committed accel_*.pt bytes. What this script printed
when it made them is kept in fixtures/torch_verify.txt. It also writes the seed corpus of the fuzz
target, tests/fuzz/corpus/fuzz_torch/seed-*.
"""
import argparse
import collections
import copy
import io
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")

DTYPES = [("f32", torch.float32), ("f64", torch.float64), ("f16", torch.float16),
          ("bf16", torch.bfloat16), ("i32", torch.int32), ("i64", torch.int64),
          ("u8", torch.uint8), ("bool", torch.bool)]
f32, f64, i64 = torch.float32, torch.float64, torch.int64


# ---- content: the formulas of pt_content.h ----
def value(i, d, salt):
    k = i + salt
    if d == torch.bool:
        return 1.0 if k % 3 == 0 else 0.0
    if d == torch.uint8:
        return float((k * 7) % 256)
    if d == torch.int32:
        return float((k % 17 - 8) * 100003)
    if d == torch.int64:
        return float((k % 17 - 8) * (1 << 40))
    return float(k % 17 - 8) + 0.25 * float(k % 4)


def make(shape, d, salt=0):
    n = math.prod(shape)
    return torch.tensor([value(i, d, salt) for i in range(n)], dtype=f64).reshape(shape).to(d)


def state():
    sd = {}
    salt = 0
    for n, d in DTYPES:
        base = make((3, 4), d, salt)
        sd[n] = base
        sd[n + ".t"] = base.t()
        sd[n + ".narrow"] = make((5, 4), d, salt + 1).narrow(0, 1, 3)
        sd[n + ".scalar"] = make((), d, salt + 2)
        sd[n + ".empty"] = make((0, 3), d)
        salt += 5
    sd["expand"] = make((3,), f32, 1).expand(4, 3)
    # accel's TensorDict is sorted by name; save_pt writes it as an OrderedDict.
    return collections.OrderedDict(sorted(sd.items()))


def tree():
    inf = float("inf")
    m = make((2, 3), f32, 7)
    od = collections.OrderedDict([("weight", make((2, 2), f64, 3)), ("steps", make((), i64, 4))])
    od._metadata = collections.OrderedDict([("", {"version": 1})])
    return {
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, -2**31 - 1, 1 << 40,
                 -(1 << 40), 2**63 - 1, -2**63],
        "floats": [0.0, -0.0, 1.5, -2.25, 1e-300, 1e300, inf, -inf],
        "strings": ["", "a", "h\u00e9llo w\u00f6rld", "\u65e5\u672c"],
        "bools": [True, False],
        "none": None,
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5)],
        "nested": {"a": {"b": [1, [2, [3]]]}},
        "int_keys": {0: "zero", 1: "one", -7: "minus seven"},
        "od": od,
        "matrix": m,
        "matrix_t": m.t(),
        "counting": list(range(2001)),
        "strs": ["s%d" % i for i in range(300)],
        "big_dict": {"k%d" % i: i for i in range(1001)},
        "dict_1000": {"d%d" % i: -i for i in range(1000)},
        "one": [{"x": [7]}],
    }


def module():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    with torch.no_grad():
        model[0].weight.copy_(make((2, 3), f64, 11))
        model[0].bias.copy_(make((2,), f64, 12))
        model[1].weight.copy_(make((2,), f64, 13))
        model[1].bias.copy_(make((2,), f64, 14))
        model[1].running_mean.copy_(make((2,), f64, 15))
        model[1].running_var.copy_(make((2,), f64, 16).abs() + 1)
        model[1].num_batches_tracked.fill_(5)
    return model


def grad(shape, step, which):
    return make(shape, f64, 10 * step + which) * 0.1


OPTIMIZERS = {
    "adam": lambda w, b: torch.optim.Adam(
        [{"params": [w], "lr": 0.01, "weight_decay": 0.1},
         {"params": [b], "lr": 0.02, "weight_decay": 0.0}],
        lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1),
    "sgd": lambda w, b: torch.optim.SGD([w, b], lr=0.1, momentum=0.9, dampening=0.1,
                                        weight_decay=0.01),
    "adamw": lambda w, b: torch.optim.AdamW([w, b], lr=0.01, betas=(0.8, 0.9), eps=1e-7,
                                            weight_decay=0.05),
}


def set_grads(w, b, step):
    w.grad = grad((2, 3), step, 0)
    b.grad = grad((2,), step, 1)


def optimizer_run(name):
    w = (make((2, 3), f64, 1) * 0.5).requires_grad_()
    b = (make((2,), f64, 2) * 0.5).requires_grad_()
    opt = OPTIMIZERS[name](w, b)
    for step in (1, 2):
        set_grads(w, b, step)
        opt.step()
    out = {"optimizer": copy.deepcopy(opt.state_dict()),
           "params": {"weight": w.detach().clone(), "bias": b.detach().clone()}}
    set_grads(w, b, 3)
    opt.step()
    out["params3"] = {"weight": w.detach().clone(), "bias": b.detach().clone()}
    return out


# ---- comparison ----
class Mismatch(Exception):
    pass


def same(a, b, where, shared):
    """Exact equality of two loaded trees: types, order, values (floats by bits), tensors by dtype,
    shape, stride, storage offset and bytes; `shared` collects (storage of a, storage of b) so
    storage sharing is compared too."""
    if type(a) is not type(b):
        raise Mismatch("%s: %s vs %s" % (where, type(a).__name__, type(b).__name__))
    if isinstance(a, torch.Tensor):
        for attr in ("dtype", "shape", "requires_grad"):
            if getattr(a, attr) != getattr(b, attr):
                raise Mismatch("%s: %s %s vs %s" % (where, attr, getattr(a, attr), getattr(b, attr)))
        if a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
            raise Mismatch("%s: geometry %s@%d vs %s@%d" % (where, a.stride(), a.storage_offset(),
                                                           b.stride(), b.storage_offset()))
        if a.storage().size() != b.storage().size():
            raise Mismatch("%s: storage of %d vs %d elements" % (where, a.storage().size(),
                                                                  b.storage().size()))
        if not torch.equal(a.detach(), b.detach()):
            raise Mismatch("%s: values differ" % where)
        shared.setdefault(a.storage().data_ptr(), set()).add(b.storage().data_ptr())
        return
    if isinstance(a, float):
        if a.hex() != b.hex() or math.copysign(1, a) != math.copysign(1, b):
            raise Mismatch("%s: %r vs %r" % (where, a, b))
        return
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise Mismatch("%s: %d vs %d items" % (where, len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i), shared)
        return
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise Mismatch("%s: keys %s vs %s" % (where, list(a.keys())[:8], list(b.keys())[:8]))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (where, k), shared)
        if isinstance(a, collections.OrderedDict):
            same(getattr(a, "_metadata", None), getattr(b, "_metadata", None),
                 where + "._metadata", shared)
        return
    if a != b:
        raise Mismatch("%s: %r vs %r" % (where, a, b))


def same_tree(a, b):
    shared = {}
    same(a, b, "", shared)
    for k, v in shared.items():
        if len(v) != 1:
            raise Mismatch("one storage of one file is %d storages of the other" % len(v))


def close(a, b, where, tol=1e-12):
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            raise Mismatch("%s: %s %s vs %s %s" % (where, a.dtype, tuple(a.shape), b.dtype,
                                                   tuple(b.shape)))
        err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        if err > tol:
            raise Mismatch("%s: differs by %g" % (where, err))
        return err
    if isinstance(a, dict):
        if set(a) != set(b):
            raise Mismatch("%s: keys %s vs %s" % (where, sorted(a), sorted(b)))
        return max([close(a[k], b[k], "%s[%r]" % (where, k), tol) for k in a] + [0.0])
    if isinstance(a, (list, tuple)):
        return max([close(x, y, "%s[%d]" % (where, i), tol)
                    for i, (x, y) in enumerate(zip(a, b))] + [0.0])
    if a != b:
        raise Mismatch("%s: %r vs %r" % (where, a, b))
    return 0.0


def torch_bytes(obj, name):
    """What torch.save writes for obj at a file of this name (the archive folder is its stem)."""
    d = tempfile.mkdtemp()
    try:
        p = os.path.join(d, name)
        torch.save(obj, p)
        with open(p, "rb") as f:
            return f.read()
    finally:
        shutil.rmtree(d)


# ---- making and checking ----
def make_torch_fixtures(out):
    torch.save(state(), os.path.join(out, "torch_state.pt"))
    torch.save(state(), os.path.join(out, "torch_legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save(tree(), os.path.join(out, "torch_tree.pt"))
    torch.save(tree(), os.path.join(out, "torch_legacy_tree.pt"),
               _use_new_zipfile_serialization=False)
    model = module()
    torch.save(model.state_dict(), os.path.join(out, "torch_module.pt"))
    leaf = make((2,), f32, 13).requires_grad_()
    torch.save({"model": model.state_dict(), "params": list(model.parameters()), "grad_leaf": leaf,
                "epoch": 3, "lr": 0.5, "names": ("a", "b")}, os.path.join(out, "torch_ckpt.pt"))
    for name in OPTIMIZERS:
        torch.save(optimizer_run(name), os.path.join(out, "torch_%s.pt" % name))


def make_fuzz_seeds(out):
    """Seeds of tests/fuzz/corpus/fuzz_torch/ (the replay mutates inputs of up to 8 KiB). Byte 0
    picks what fuzz_torch.cc does with the rest: 'F' (even) a whole file, 'P' (odd) a data.pkl
    alone. Files: a state dict with views, both layouts; a tree of every kind of value; a module's
    state dict with _metadata; an optimizer state."""
    os.makedirs(out, exist_ok=True)
    base = make((2, 3), f32)
    sd = collections.OrderedDict([("w", base), ("w.t", base.t()), ("b", make((2,), torch.bfloat16)),
                                  ("m", make((4,), torch.bool)[1:])])
    od = collections.OrderedDict([("x", make((), i64))])
    od._metadata = collections.OrderedDict([("", {"version": 1})])
    seeds = {
        "state": (sd, True),
        "legacy": (sd, False),
        "tree": ({"a": [1, -3, 2**40, 2.5, None, True, "x", (1, 2)], "od": od, 7: {"n": [[]]}},
                 True),
        "module": (module().state_dict(), True),
        "optimizer": (optimizer_run("sgd")["optimizer"], True),
    }
    for name, (obj, zip_layout) in seeds.items():
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=zip_layout)
        data = buf.getvalue()
        with open(os.path.join(out, "seed-" + name), "wb") as f:
            f.write(b"F" + data)
        if zip_layout:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
            with open(os.path.join(out, "seed-" + name + "-pickle"), "wb") as f:
                f.write(b"P" + pkl)


def check_optimizer(name, path, log):
    ck = torch.load(path)
    own = optimizer_run(name)
    # The state as accel wrote it against torch's own after the same two steps.
    got, want = ck["optimizer"], own["optimizer"]
    for g, (x, y) in enumerate(zip(got["param_groups"], want["param_groups"])):
        if sorted(x.keys()) != sorted(y.keys()):
            raise Mismatch("param_groups[%d] keys %s vs torch's %s" % (g, list(x), list(y)))
        for k in x:
            if x[k] != y[k]:
                raise Mismatch("param_groups[%d][%r]: %r vs torch's %r" % (g, k, x[k], y[k]))
    if len(got["param_groups"]) != len(want["param_groups"]):
        raise Mismatch("param group count")
    err = close(got["state"], want["state"], "state")
    err = max(err, close(ck["params"], own["params"], "params"))
    # torch's optimizer continues from accel's state.
    w = ck["params"]["weight"].clone().requires_grad_()
    b = ck["params"]["bias"].clone().requires_grad_()
    opt = OPTIMIZERS[name](w, b)
    opt.load_state_dict(ck["optimizer"])
    set_grads(w, b, 3)
    opt.step()
    err3 = close({"weight": w.detach(), "bias": b.detach()}, own["params3"], "params3")
    log("%s: torch.optim loads it (param_groups equal to torch's own: keys %s); state and params "
        "within %.3g of torch's run, the third step from it within %.3g"
        % (os.path.basename(path), list(got["param_groups"][0].keys()), err, err3))


def verify_accel_files(d, log):
    """Checks the accel_*.pt files in folder d in torch; raises Mismatch on any difference."""
    p = os.path.join(d, "accel_state.pt")
    same_tree(torch.load(p, weights_only=True), state())
    ident = open(p, "rb").read() == torch_bytes(state(), "accel_state.pt")
    log("accel_state.pt: torch.load(weights_only=True) returns the same %d tensors (dtype, shape, "
        "strides, storage offset, bytes, storage sharing); byte for byte torch.save's file: %s"
        % (len(state()), ident))
    p = os.path.join(d, "accel_tree.pt")
    same_tree(torch.load(p), tree())
    ident = open(p, "rb").read() == torch_bytes(tree(), "accel_tree.pt")
    log("accel_tree.pt: torch.load returns the same tree (types, order, float bits, tensors, "
        "OrderedDict attributes); byte for byte torch.save's file: %s" % ident)
    p = os.path.join(d, "accel_zip64.pt")
    with zipfile.ZipFile(p) as z:
        bad = z.testzip()
        if bad is not None:
            raise Mismatch("accel_zip64.pt: CRC of %s" % bad)
        n64 = sum(1 for i in z.infolist() if i.extra[:2] == b"\x01\x00")
        with zipfile.ZipFile(os.path.join(d, "accel_state.pt")) as s:
            for a, b in zip(z.infolist(), s.infolist()):
                if (a.filename.split("/", 1)[1] != b.filename.split("/", 1)[1]
                        or z.read(a) != s.read(b)):
                    raise Mismatch("accel_zip64.pt: record %s differs from accel_state.pt's"
                                   % a.filename)
    same_tree(torch.load(p, weights_only=True), state())
    log("accel_zip64.pt: zipfile finds every CRC right, %d of %d entries with zip64 fields, the "
        "records equal accel_state.pt's; torch.load returns the same tensors"
        % (n64, len(z.infolist())))
    for name in OPTIMIZERS:
        check_optimizer(name, os.path.join(d, "accel_%s.pt" % name), log)


def check_big(d, writer, log):
    k = (1 << 32) // 251 + 100
    t = torch.arange(251, dtype=torch.uint8).repeat(k)
    sd = collections.OrderedDict([("big", t), ("small", torch.arange(10, dtype=f32))])
    src, out = os.path.join(d, "torch", "big.pt"), os.path.join(d, "accel", "big.pt")
    os.makedirs(os.path.dirname(src), exist_ok=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        torch.save(sd, src)
        subprocess.run([writer, "--resave", src, out], check=True)
        ident = subprocess.run(["cmp", "-s", src, out]).returncode == 0
        os.remove(src)
        back = torch.load(out)
        ok = torch.equal(back["big"], t) and torch.equal(back["small"], sd["small"])
    finally:
        for p in (src, out):
            if os.path.exists(p):
                os.remove(p)
    if not (ident and ok):
        raise Mismatch("the > 4 GiB file: byte for byte %s, torch.load equal %s" % (ident, ok))
    log("a %d-byte tensor and one after it (zip64 sizes and offsets): accel read torch.save's "
        "file and wrote it back byte for byte; torch.load reads accel's file" % t.numel())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", default=os.path.join(ROOT, "build", "tests", "io",
                                                     "io_write_pt_fixtures"))
    ap.add_argument("--big", metavar="DIR",
                    help="only the > 4 GiB round trip, in DIR (see above)")
    ap.add_argument("--verify", action="store_true",
                    help="only check that the writer still writes the committed accel_*.pt files "
                         "and that torch reads them (rewrites torch_verify.txt)")
    args = ap.parse_args()
    lines = []

    def log(s):
        print(s)
        lines.append(s)

    log("torch %s" % torch.__version__)
    if args.big:
        check_big(args.big, args.writer, log)
        with open(os.path.join(FIXTURES, "torch_verify.txt"), "a") as f:
            f.write("# make_torch_fixtures.py --big printed:\n" + "\n".join(lines) + "\n")
        return
    os.makedirs(FIXTURES, exist_ok=True)
    if not args.verify:
        make_torch_fixtures(FIXTURES)
        # The torch files hold what the accel tests expect.
        same_tree(torch.load(os.path.join(FIXTURES, "torch_legacy.pt")), state())
        same_tree(torch.load(os.path.join(FIXTURES, "torch_tree.pt")), tree())
        log("wrote the torch_*.pt fixtures")
        make_fuzz_seeds(os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_torch"))
        log("wrote the seeds of tests/fuzz/corpus/fuzz_torch")
    tmp = tempfile.mkdtemp()
    try:
        subprocess.run([args.writer, tmp], check=True)
        names = sorted(f for f in os.listdir(tmp) if f.startswith("accel_"))
        verify_accel_files(tmp, log)
        if args.verify:
            for f in names:
                committed = open(os.path.join(FIXTURES, f), "rb").read()
                if open(os.path.join(tmp, f), "rb").read() != committed:
                    raise Mismatch("%s: the writer no longer writes the committed bytes" % f)
            log("the writer still writes the committed %s" % ", ".join(names))
        else:
            for f in names:
                shutil.copy(os.path.join(tmp, f), os.path.join(FIXTURES, f))
            log("wrote the accel_*.pt fixtures")
        with open(os.path.join(FIXTURES, "torch_verify.txt"), "w") as f:
            f.write("# What make_torch_fixtures.py%s printed when it last %s these files.\n"
                    % (" --verify" if args.verify else "",
                       "checked" if args.verify else "made"))
            f.write("\n".join(lines) + "\n")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    try:
        main()
    except Mismatch as e:
        print("MISMATCH: %s" % e)
        sys.exit(1)
