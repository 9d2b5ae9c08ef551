#!/usr/bin/python3
"""PyTorch twin of examples/imagenet.cc (pytorch/examples imagenet/main.py): writes the image
folder tests/examples/imagenet_folder/ and tests/examples/imagenet_fixture.safetensors for
tests/examples/test_imagenet.cc.

    /usr/bin/python3 tests/examples/torch_imagenet.py             # the folder and the fixture
    /usr/bin/python3 tests/examples/torch_imagenet.py --time      # ms/step, resnet18, 32 x 56x56

The folder: train/ and val/ with two classes (`blobs`, `stripes`), 4 + 2 RGB images of 40x40 each,
drawn from a fixed numpy seed and written as PNG (lossless: both sides decode the same pixels).

The check: torchvision's resnet18 (1000 classes, as main.py builds it) in float64 with
twin.det_init weights, main.py's train() and validate() for EPOCHS epochs of batches of B:
SGD(lr 0.1, momentum 0.9, weight decay 1e-4), CrossEntropyLoss, top-1 / top-5 accuracy, StepLR
stepped after every epoch (step_size 1 here instead of main.py's 30, so that the fixture sees the
decay). Images go through main.py's transforms with the crop sizes scaled down (train:
RandomResizedCrop(CROP) + RandomHorizontalFlip; val: Resize(RESIZE) + CenterCrop(CROP); then
ToTensor and Normalize), on uint8 tensors (torchvision's tensor path) with antialias=True, the
float32 ToTensor result converted to float64 before Normalize. The random choices torch made
(each epoch's shuffle, each image's crop box and flip) are stored and replayed by the C++ test.
Stored: those choices, every step's loss, Acc@1, Acc@5 and lr, each epoch's validation loss,
Acc@1 and Acc@5, and the checksums of the initial and final weights and of the final BatchNorm
running statistics.
"""
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as F
from torchvision.io import ImageReadMode, read_image, write_png

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "imagenet_folder")
CLASSES = ["blobs", "stripes"]
SIZE, TRAIN_PER_CLASS, VAL_PER_CLASS = 40, 4, 2
CROP, RESIZE, B, EPOCHS = 32, 36, 4, 2
LR, MOMENTUM, WD, STEP_SIZE, GAMMA = 0.1, 0.9, 1e-4, 1, 0.1
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def draw(rng, k):
    """A 40x40 RGB uint8 image of class k: Gaussian blobs (0) or oriented stripes (1), noise."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    img = np.zeros((3, SIZE, SIZE))
    if k == 0:
        for _ in range(3):
            cy, cx, r = rng.uniform(5, 35), rng.uniform(5, 35), rng.uniform(4, 10)
            img += rng.uniform(0.3, 1.0, (3, 1, 1)) * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / r**2)
    else:
        a, f = rng.uniform(0, np.pi), rng.uniform(0.2, 0.6)
        img += rng.uniform(0.3, 1.0, (3, 1, 1)) * (0.5 + 0.5 * np.sin(f * (x * np.cos(a) + y * np.sin(a))))
    img += rng.normal(0, 0.05, img.shape)
    return torch.from_numpy(np.clip(img * 255, 0, 255).round().astype(np.uint8))


def write_folder():
    rng = np.random.default_rng(39)
    for split, n in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for k, name in enumerate(CLASSES):
            os.makedirs(os.path.join(FOLDER, split, name), exist_ok=True)
            for i in range(n):
                write_png(draw(rng, k), os.path.join(FOLDER, split, name, f"{i}.png"))


def load_folder(split):
    """ImageFolder's samples (sorted classes, sorted files), decoded as uint8 (3, H, W)."""
    ds = torchvision.datasets.ImageFolder(os.path.join(FOLDER, split))
    assert ds.classes == CLASSES
    return [(read_image(p, ImageReadMode.RGB), y) for p, y in ds.samples]


def to_input(u8):
    """ToTensor (float32 / 255) then float64, then Normalize."""
    return F.normalize(u8.float().div(255).double(), MEAN, STD)


def accuracy(output, target, topk=(1,)):  # main.py's
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def validate(model, criterion, val):
    """main.py's validate(): sample-weighted means of the loss, Acc@1 and Acc@5."""
    model.eval()
    loss_sum = top1 = top5 = n = 0.0
    with torch.no_grad():
        for s in range(0, len(val), B):
            items = val[s:s + B]
            x = torch.stack([to_input(F.center_crop(F.resize(u8, [RESIZE], antialias=True), [CROP]))
                             for u8, _ in items])
            target = torch.tensor([y for _, y in items])
            output = model(x)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            loss_sum += loss.item() * len(items)
            top1 += acc1.item() * len(items)
            top5 += acc5.item() * len(items)
            n += len(items)
    model.train()
    return loss_sum / n, top1 / n, top5 / n


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def running_checksum(model):
    s = 0.0
    for name, b in sorted(model.named_buffers()):
        if name.endswith("running_mean") or name.endswith("running_var"):
            s += float(b.sum()) + float((b ** 2).sum())
    return s


def fixture():
    write_folder()
    train, val = load_folder("train"), load_folder("val")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().double()
    twin.det_init(model)
    init = twin.checksum(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), LR, momentum=MOMENTUM, weight_decay=WD)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    order, boxes, flips, losses, acc1s, acc5s, lrs, val_stats = [], [], [], [], [], [], [], []
    model.train()
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(train))  # the loader's shuffle
        for s in range(0, len(train), B):
            xs, ys = [], []
            for idx in perm[s:s + B].tolist():
                u8, y = train[idx]
                top, left, h, w = T.RandomResizedCrop.get_params(u8, (0.08, 1.0), (3 / 4, 4 / 3))
                flip = bool(torch.rand(1) < 0.5)
                x = F.resized_crop(u8, top, left, h, w, [CROP, CROP], antialias=True)
                if flip:
                    x = F.hflip(x)
                xs.append(to_input(x))
                ys.append(y)
                order.append(idx)
                boxes.append([top, left, h, w])
                flips.append(int(flip))
            images, target = torch.stack(xs), torch.tensor(ys)
            lrs.append(optimizer.param_groups[0]["lr"])
            # main.py's train() body
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            acc1s.append(acc1.item())
            acc5s.append(acc5.item())
        val_stats.append(validate(model, criterion, val))
        scheduler.step()
    print("losses", losses, "acc1", acc1s, "acc5", acc5s)
    print("val (loss, acc1, acc5)", val_stats)
    twin.write_safetensors(
        os.path.join(HERE, "imagenet_fixture.safetensors"),
        {"order": torch.tensor(order), "boxes": torch.tensor(boxes), "flips": torch.tensor(flips),
         "losses": f64(losses), "acc1": f64(acc1s), "acc5": f64(acc5s), "lrs": f64(lrs),
         "val": f64(val_stats)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(model)),
         "running_checksum": repr(running_checksum(model)), "epochs": str(EPOCHS),
         "batch": str(B), "crop": str(CROP), "resize": str(RESIZE), "lr": repr(LR),
         "momentum": repr(MOMENTUM), "weight_decay": repr(WD), "step_size": str(STEP_SIZE),
         "gamma": repr(GAMMA)})


def time_steps(steps=10, batch=32, size=56, classes=8):
    """ms per training step of resnet18 in float32 (main.py's step), random batches."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))
    for s in range(steps + 2):
        if s == 2:
            t0 = time.perf_counter()
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {batch} x "
          f"{size}x{size}: {1000 * dt:.1f} ms/step")


if __name__ == "__main__":
    time_steps() if "--time" in sys.argv else fixture()
