#!/usr/bin/python3
"""PyTorch twin of examples/vae.cc (pytorch/examples vae/main.py): writes
tests/examples/vae_fixture.safetensors for tests/examples/test_vae.cc.

    /usr/bin/python3 tests/examples/torch_vae.py             # the fixture
    /usr/bin/python3 tests/examples/torch_vae.py --time      # seconds per step, the real config

The check: main.py's VAE in float64 with twin.det_init weights, STEPS Adam(lr 1e-3) steps on
batches of B Fashion-MNIST training images (the first STEPS * B, raw bytes stored), the
reparameterisation noise eps of every step drawn here and stored. Stored: images, eps, the loss of
every step, the checksum of the initial and final weights.
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
STEPS, B = 3, 8


class VAE(nn.Module):  # main.py's, with the noise optionally given
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar, eps=None):
        std = torch.exp(0.5 * logvar)
        if eps is None:
            eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x, eps=None):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar, eps)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def train_step(model, optimizer, data, eps=None):
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data, eps)
    loss = loss_function(recon_batch, data, mu, logvar)
    loss.backward()
    optimizer.step()
    return loss.item()


def read_images():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        return torch.from_numpy(np.frombuffer(f.read(), dtype=np.uint8, offset=16).copy())


def fixture():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1)
    images = read_images()[: STEPS * B * 784].reshape(STEPS * B, 1, 28, 28)
    model = VAE()
    twin.det_init(model)
    init = twin.checksum(model)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    eps = torch.randn(STEPS, B, 20)
    losses = []
    for s in range(STEPS):
        data = images[s * B:(s + 1) * B].to(torch.float64) / 255.0  # ToTensor()
        losses.append(train_step(model, optimizer, data, eps[s]))
    print("losses", losses)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "vae_fixture.safetensors"),
        {"images": images, "eps": eps, "losses": torch.tensor(losses)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(model)),
         "steps": str(STEPS), "batch": str(B)})


def time_steps(steps=100):
    """Seconds per training step of the real configuration (float32, batch 128)."""
    torch.manual_seed(1)
    images = read_images().reshape(-1, 1, 28, 28).to(torch.float32) / 255.0
    model = VAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    for s in range(steps + 5):
        if s == 5:
            t0 = time.perf_counter()
        train_step(model, optimizer, images[torch.randint(0, images.shape[0], (128,))])
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads: {1000 * dt:.2f} ms/step")


if __name__ == "__main__":
    time_steps() if "--time" in sys.argv else fixture()
