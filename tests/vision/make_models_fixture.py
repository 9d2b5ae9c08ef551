#!/usr/bin/python3
"""Writes tests/vision/models_fixture.txt and tests/vision/models_fixture.safetensors: what
tests/vision/test_models.cc checks accel::vision::models against (torchvision 0.14, float64).

Run with Debian's python3-torchvision:  /usr/bin/python3 tests/vision/make_models_fixture.py
The test never runs Python; it reads the committed files.

For each model (built as `torchvision.models.<name>(**kwargs)`), models_fixture.txt lists
  model <case> <builder> <kwargs as k=v,...> input <N,C,H,W> <mode eval|train|names>
  p|b <state_dict key> <dtype> <shape, comma-separated; - for 0-dim> <scale> <offset>
one line per state_dict entry in torchvision's order (p: a parameter, b: a buffer), and every
entry is set to   value[i] = offset + scale * u(i, k)   with k the entry's line number within
the model (0, 1, ...) and
  r(i, k) = (i * 1327217885 + (k + 1) * 1103515245) mod 2147483647   (in [0, 2^31 - 1))
  u(i, k) = (2 r(i, k) - 2147483647) * 2^-31                          (in (-1, 1), exact)
in exact integer arithmetic, so u is the same bits in C++ and value rounds twice (the product,
the sum) in both. The input is u(i, -1). Integer entries (num_batches_tracked) take the offset
(scale 0).

models_fixture.safetensors holds <case>.logits (float64 forward in eval mode, or train; none for
the cases checked by name only), and for train cases the gradients <case>.grad.<key> of
sum(logits * w) with w = u(i, -2) for a few entries, <case>.grad.input (of the first image), and
the running statistics <case>.after.<key> of a few BatchNorm layers after the step.

squeezenet1_1_f16.pth is torch.save(state_dict) of squeezenet1_1 (10 classes) with the formula's
values rounded to float16; squeezenet1_1_pth.logits are the float64 logits of those values.
"""
import json
import math
import os
import struct

import torch
import torchvision

torch.set_grad_enabled(False)

P = 2147483647
W1 = 1327217885
W2 = 1103515245


def u(n, k):
    r = (torch.arange(n, dtype=torch.int64) * W1 + (k + 1) * W2) % P  # Python's mod: >= 0
    return (2 * r - P).double() * 2.0**-31


def fill_value(n, k, scale, offset):
    return u(n, k) * scale + offset


def scale_of(key, t, model_name):
    """(scale, offset) per entry: He-like weights, BN close to the identity."""
    leaf = key.rsplit(".", 1)[-1]
    if t.dtype == torch.int64:
        return 0.0, 7.0
    if leaf == "running_mean":
        return 0.1, 0.0
    if leaf == "running_var":
        return 0.5, 1.0
    if t.dim() == 1:  # norm weights / biases, conv / linear biases
        if leaf == "weight":
            return 0.2, 1.0
        return 0.1, 0.0
    if leaf in ("class_token", "pos_embedding"):
        return 0.5, 0.0
    fan_in = t.numel() // t.shape[0]
    return math.sqrt(6.0 / fan_in), 0.0


CASES = [
    # case, builder, kwargs, input shape, mode
    ("resnet18", "resnet18", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("resnet34", "resnet34", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("resnet50", "resnet50", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("resnet101", "resnet101", {"num_classes": 10}, (1, 3, 32, 32), "eval"),
    # VGG: 120M of its parameters are the classifier whatever the input. Configurations A and D,
    # with and without BatchNorm, each run once; the two other combinations are checked by name.
    ("vgg11", "vgg11", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("vgg11_bn", "vgg11_bn", {"num_classes": 10}, (2, 3, 32, 32), "names"),
    ("vgg16", "vgg16", {"num_classes": 10}, (1, 3, 32, 32), "names"),
    ("vgg16_bn", "vgg16_bn", {"num_classes": 10}, (1, 3, 32, 32), "eval"),
    ("mobilenet_v2", "mobilenet_v2", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("mobilenet_v3_small", "mobilenet_v3_small", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("mobilenet_v3_large", "mobilenet_v3_large", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("efficientnet_b0", "efficientnet_b0", {"num_classes": 10}, (2, 3, 32, 32), "eval"),
    ("vit_b_16", "vit_b_16", {"num_classes": 10, "image_size": 32}, (2, 3, 32, 32), "eval"),
    ("alexnet", "alexnet", {"num_classes": 10}, (2, 3, 64, 64), "eval"),
    ("squeezenet1_0", "squeezenet1_0", {"num_classes": 10}, (2, 3, 64, 64), "eval"),
    ("squeezenet1_1", "squeezenet1_1", {"num_classes": 10}, (2, 3, 66, 66), "eval"),
    # Training mode: BatchNorm's batch statistics and running-statistic updates, gradients. 4 x
    # 64x64 leaves 16 values per channel to the last stage's batch statistics (2 x 32x32 leaves 2:
    # a variance of two nearly equal values amplifies the rounding of both sides to 1e-8).
    ("resnet18_train", "resnet18", {"num_classes": 10}, (4, 3, 64, 64), "train"),
    ("mobilenet_v2_train", "mobilenet_v2", {"num_classes": 10, "dropout": 0.0}, (4, 3, 64, 64),
     "train"),
]
# Entries whose gradients / updated running statistics the train cases store.
TRAIN_GRADS = {
    "resnet18_train": ["conv1.weight", "bn1.weight", "layer3.1.bn2.bias",
                       "layer4.0.downsample.1.weight", "fc.weight", "fc.bias"],
    "mobilenet_v2_train": ["features.0.0.weight", "features.1.conv.0.0.weight",
                           "features.17.conv.1.1.weight", "classifier.1.weight"],
}
TRAIN_STATS = {
    "resnet18_train": ["bn1.running_mean", "bn1.running_var", "layer4.1.bn2.running_var",
                       "layer4.1.bn2.num_batches_tracked"],
    "mobilenet_v2_train": ["features.0.1.running_mean", "features.18.1.running_var"],
}


def fmt_kwargs(kw):
    return ",".join(f"{k}={v}" for k, v in kw.items()) or "-"


def main():
    lines = [f"# written by make_models_fixture.py (torch {torch.__version__}, "
             f"torchvision {torchvision.__version__})"]
    tensors = {}
    for case, builder, kwargs, in_shape, mode in CASES:
        torch.manual_seed(0)
        model = getattr(torchvision.models, builder)(**kwargs)
        model = model.double()
        params = dict(model.named_parameters())
        lines.append(f"model {case} {builder} {fmt_kwargs(kwargs)} input "
                     f"{','.join(map(str, in_shape))} {mode}")
        sd = model.state_dict()
        for k, (key, t) in enumerate(sd.items()):
            scale, offset = scale_of(key, t, builder)
            if t.dtype == torch.int64:
                t.fill_(int(offset))
            else:
                t.copy_(fill_value(t.numel(), k, scale, offset).reshape(t.shape))
            # dtype as torchvision builds it (float32 before .double())
            dt = "int64" if t.dtype == torch.int64 else "float32"
            shape = ",".join(map(str, t.shape)) or "-"
            lines.append(f"{'p' if key in params else 'b'} {key} {dt} {shape} {scale!r} {offset!r}")
        n = math.prod(in_shape)
        x = u(n, -1).reshape(in_shape)
        if mode == "names":
            print(f"{case}: names only", flush=True)
            continue
        if mode == "eval":
            model.eval()
            logits = model(x)
            tensors[case + ".logits"] = logits
        else:
            model.train()
            with torch.enable_grad():
                x.requires_grad_(True)
                logits = model(x)
                w = u(logits.numel(), -2).reshape(logits.shape)
                (logits * w).sum().backward()
            tensors[case + ".logits"] = logits.detach()
            tensors[case + ".grad.input"] = x.grad[:1]  # the first image's: 100 KB, not 400
            for key in TRAIN_GRADS[case]:
                tensors[case + ".grad." + key] = params[key].grad
            for key in TRAIN_STATS[case]:
                tensors[case + ".after." + key] = model.state_dict()[key]
        print(f"{case}: logits |max| {logits.abs().max().item():.4g}, "
              f"std {logits.std().item():.4g}", flush=True)

    here = os.path.dirname(os.path.abspath(__file__))
    # A checkpoint as torchvision users have them: torch.save of a state dict (zip layout), here
    # squeezenet1_1 (10 classes) with the formula's values rounded to float16 (1.5 MB), and the
    # float64 logits of exactly those values.
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1(num_classes=10)
    sd = model.state_dict()
    for k, (key, t) in enumerate(sd.items()):
        scale, offset = scale_of(key, t, "squeezenet1_1")
        t.copy_(fill_value(t.numel(), k, scale, offset).reshape(t.shape))
    half = {key: t.half() for key, t in sd.items()}
    torch.save(half, os.path.join(here, "squeezenet1_1_f16.pth"))
    model = model.double()
    model.load_state_dict(half)  # float16 -> float64 is exact
    model.eval()
    x = u(2 * 3 * 66 * 66, -1).reshape(2, 3, 66, 66)
    tensors["squeezenet1_1_pth.logits"] = model(x)

    with open(os.path.join(here, "models_fixture.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dt = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    path = os.path.join(here, "models_fixture.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    print(f"wrote {path}: {len(tensors)} tensors, {8 + len(hj) + offset} bytes")


if __name__ == "__main__":
    main()
