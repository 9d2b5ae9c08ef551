#!/usr/bin/python3
"""PyTorch twin of examples/transfer_learning.cc (pytorch/examples cpp/transfer-learning): writes
tests/examples/transfer_learning_resnet18.pth (a torchvision resnet18 state dict, torch.save) and
tests/examples/transfer_learning_fixture.safetensors for tests/examples/test_transfer_learning.cc.

    /usr/bin/python3 tests/examples/torch_transfer_learning.py          # the .pth and the fixture
    /usr/bin/python3 tests/examples/torch_transfer_learning.py --time   # ms/step, 4 x 224x224

The .pth: every key, shape and dtype (float32, num_batches_tracked int64) of torchvision's
resnet18().state_dict(), with random values. torchvision's 11.7M parameters would take 45 MB, so
each tensor is a strided view of a few shared random storages (one per fan-in, He-uniform; a
convolution's output channels are windows 7 values apart of one storage, its BatchNorm tensors
slices of storages around 1 and 0): torch.save writes each storage once, the file is ~300 KB, and
torch.load / load_state_dict read it as any other state dict.

The check (the original's main.cpp and convert.py): resnet18 loaded from the .pth, fc removed
(Identity: the 512 features), frozen (requires_grad False, eval mode, under no_grad), a new
Linear(512, 2) head with twin.det_init weights trained with Adam(lr 1e-3) on nll_loss(log_softmax)
for EPOCHS epochs of batches of B, then the original's test() over the same images, all in
float64. Images: tests/examples/imagenet_folder/train (torch_imagenet.py writes it), 2 classes x 4
images of 40x40, resized to SIZE x SIZE (bilinear, antialias) and normalised with ImageNet's
statistics. The shuffle order of every epoch is stored. Then --finetune-all: the same from the
.pth with every parameter trained (backbone in train mode), STEPS_ALL steps. Stored: the orders,
every step's loss, every epoch's accuracy and test figures, the final head, the checksums.
"""
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms.functional as TF
from torchvision.io import ImageReadMode, read_image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "imagenet_folder", "train")
PTH = os.path.join(HERE, "transfer_learning_resnet18.pth")
SIZE, B, EPOCHS, LR, STEPS_ALL = 32, 4, 2, 1e-3, 2
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
WINDOW = 7  # stride between a weight's rows in its shared storage


def write_pth():
    g = torch.Generator().manual_seed(1)
    ref = torchvision.models.resnet18().state_dict()
    fans = {}  # fan_in -> the shapes of the weights drawing from its storage
    for name, t in ref.items():
        if t.dim() >= 2:
            fans.setdefault(t[0].numel(), []).append(t.shape)
    bases = {}
    for fan, shapes in fans.items():
        n = max((s[0] - 1) * WINDOW + fan for s in shapes)
        bound = (6.0 / fan) ** 0.5
        bases[fan] = (torch.rand(n, generator=g) * 2 - 1) * bound
    ones = 1 + 0.2 * (torch.rand(1024, generator=g) - 0.5)   # BatchNorm weight, running_var
    zeros = 0.2 * (torch.rand(1024, generator=g) - 0.5)      # BatchNorm bias, running_mean, fc bias
    sd = {}
    for k, (name, t) in enumerate(ref.items()):
        if t.dim() >= 2:
            fan = t[0].numel()
            stride = [WINDOW] + list(t[0].stride())
            sd[name] = bases[fan].as_strided(t.shape, stride, 0)
        elif name.endswith("num_batches_tracked"):
            sd[name] = torch.tensor(k, dtype=torch.int64)
        else:
            base = ones if name.endswith("weight") or name.endswith("running_var") else zeros
            sd[name] = base.as_strided(t.shape, (1,), (37 * k) % (1024 - t.numel() + 1))
    torch.save(sd, PTH)
    model = torchvision.models.resnet18()
    model.load_state_dict(torch.load(PTH), strict=True)
    print(f"wrote {PTH}: {os.path.getsize(PTH)} bytes, {len(sd)} tensors")


def load_images():
    ds = torchvision.datasets.ImageFolder(FOLDER)
    xs = [TF.normalize(TF.resize(read_image(p, ImageReadMode.RGB), [SIZE, SIZE], antialias=True)
                       .float().div(255).double(), MEAN, STD) for p, _ in ds.samples]
    return torch.stack(xs), torch.tensor([y for _, y in ds.samples])


def backbone():
    """convert.py's resnet18 without its fc, from the .pth, in float64."""
    net = torchvision.models.resnet18()
    net.load_state_dict(torch.load(PTH))
    net.fc = nn.Identity()
    return net.double()


def test(net, lin, images, labels):
    """The original's test() over the training images: mean loss per image, accuracy."""
    net.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(labels), B):
            out = lin(net(images[s:s + B]))
            loss_sum += F.nll_loss(F.log_softmax(out, 1), labels[s:s + B], reduction="sum").item()
            correct += int(out.argmax(1).eq(labels[s:s + B]).sum())
    return loss_sum / len(labels), correct / len(labels)


def frozen(images, labels):
    net = backbone()
    for p in net.parameters():
        p.requires_grad = False
    net.eval()
    lin = nn.Linear(512, 2).double()
    twin.det_init(lin)
    opt = torch.optim.Adam(lin.parameters(), lr=LR)
    orders, losses, accs, tests = [], [], [], []
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(labels))
        orders.append(perm)
        correct = 0
        for s in range(0, len(labels), B):
            idx = perm[s:s + B]
            with torch.no_grad():
                features = net(images[idx])
            opt.zero_grad()
            output = lin(features)
            loss = F.nll_loss(F.log_softmax(output, 1), labels[idx])
            loss.backward()
            opt.step()
            correct += int(output.argmax(1).eq(labels[idx]).sum())
            losses.append(loss.item())
        accs.append(correct / len(labels))
        tests.append(test(net, lin, images, labels))
    return torch.stack(orders), losses, accs, tests, lin, net


def finetune_all(images, labels):
    net = backbone()
    lin = nn.Linear(512, 2).double()
    twin.det_init(lin)
    net.train()
    opt = torch.optim.Adam(list(net.parameters()) + list(lin.parameters()), lr=LR)
    perm = torch.randperm(len(labels))
    losses = []
    for s in range(STEPS_ALL):
        idx = perm[s * B:(s + 1) * B]
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(lin(net(images[idx])), 1), labels[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return perm, losses, twin.checksum(net) + twin.checksum(lin)


def f64(v):
    return torch.tensor(v, dtype=torch.float64)


def fixture():
    write_pth()
    images, labels = load_images()
    torch.manual_seed(0)
    orders, losses, accs, tests, lin, net = frozen(images, labels)
    perm_all, losses_all, checksum_all = finetune_all(images, labels)
    print("frozen losses", losses, "accuracy", accs, "test", tests)
    print("finetune-all losses", losses_all)
    twin.write_safetensors(
        os.path.join(HERE, "transfer_learning_fixture.safetensors"),
        {"orders": orders, "losses": f64(losses), "accuracy": f64(accs), "test": f64(tests),
         "lin_weight": lin.weight.detach(), "lin_bias": lin.bias.detach(),
         "order_all": perm_all, "losses_all": f64(losses_all)},
        {"epochs": str(EPOCHS), "batch": str(B), "size": str(SIZE), "lr": repr(LR),
         "steps_all": str(STEPS_ALL), "backbone_checksum": repr(twin.checksum(net)),
         "checksum_all": repr(checksum_all)})


def time_steps(steps=10, batch=4, size=224):
    """ms per training step of the original (frozen resnet18 features + Linear, float32)."""
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    net.fc = nn.Identity()
    net.eval()
    lin = nn.Linear(512, 2)
    opt = torch.optim.Adam(lin.parameters(), lr=LR)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 2, (batch,))
    for s in range(steps + 2):
        if s == 2:
            t0 = time.perf_counter()
        with torch.no_grad():
            f = net(x)
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(lin(f), 1), y)
        loss.backward()
        opt.step()
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {batch} x "
          f"{size}x{size}: {1000 * dt:.1f} ms/step")


if __name__ == "__main__":
    time_steps() if "--time" in sys.argv else fixture()
