#!/usr/bin/python3
"""PyTorch twin of examples/mnist.cc (pytorch/examples mnist/main.py): writes
tests/examples/mnist_fixture.safetensors for tests/examples/test_mnist.cc.

    /usr/bin/python3 tests/examples/torch_mnist.py             # the fixture
    /usr/bin/python3 tests/examples/torch_mnist.py --time      # seconds per step, the real config

The check: the Net of main.py in float64 with twin.det_init weights and dropout off, STEPS
Adadelta(lr 1.0) steps on batches of B Fashion-MNIST training images (the first STEPS * B, raw
bytes stored in the fixture), StepLR(step_size=1, gamma=0.7) stepped after every EPOCH_STEPS
steps. Stored: the images and labels, the loss of every step, the checksum of the initial and
final weights.
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
STEPS, B, EPOCH_STEPS = 4, 8, 2


class Net(nn.Module):  # main.py's, verbatim
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def read_idx(name, offset):
    with gzip.open(os.path.join(DATA, name)) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def normalize(u8, dtype):
    return (u8.to(dtype) / 255.0 - MEAN) / STD


def train_step(model, optimizer, data, target):
    optimizer.zero_grad()
    output = model(data)
    loss = F.nll_loss(output, target)
    loss.backward()
    optimizer.step()
    return loss.item()


def fixture():
    torch.set_default_dtype(torch.float64)
    n = STEPS * B
    images = torch.from_numpy(read_idx("train-images-idx3-ubyte.gz", 16)[: n * 784].copy())
    images = images.reshape(n, 1, 28, 28)
    labels = torch.from_numpy(read_idx("train-labels-idx1-ubyte.gz", 8)[:n].astype(np.int64))
    model = Net()
    twin.det_init(model)
    model.dropout1.p = model.dropout2.p = 0.0
    init = twin.checksum(model)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    losses = []
    for s in range(STEPS):
        x = normalize(images[s * B:(s + 1) * B], torch.float64)
        losses.append(train_step(model, optimizer, x, labels[s * B:(s + 1) * B]))
        if (s + 1) % EPOCH_STEPS == 0:
            scheduler.step()
    print("losses", losses)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist_fixture.safetensors"),
        {"images": images, "labels": labels, "losses": torch.tensor(losses)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(model)),
         "steps": str(STEPS), "batch": str(B), "epoch_steps": str(EPOCH_STEPS)})


def time_steps(steps=50):
    """Seconds per training step of the real configuration (float32, batch 64, dropout on)."""
    torch.manual_seed(1)
    images = torch.from_numpy(read_idx("train-images-idx3-ubyte.gz", 16).copy())
    images = normalize(images.reshape(-1, 1, 28, 28), torch.float32)
    labels = torch.from_numpy(read_idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for s in range(steps + 5):
        if s == 5:
            t0 = time.perf_counter()
        idx = torch.randint(0, images.shape[0], (64,))
        train_step(model, optimizer, images[idx], labels[idx])
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads: {1000 * dt:.1f} ms/step")


if __name__ == "__main__":
    time_steps() if "--time" in sys.argv else fixture()
