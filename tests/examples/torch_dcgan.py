#!/usr/bin/python3
"""PyTorch twin of examples/dcgan.cc (pytorch/examples dcgan/main.py): writes
tests/examples/dcgan_fixture.safetensors for tests/examples/test_dcgan.cc.

    /usr/bin/python3 tests/examples/torch_dcgan.py                    # the fixture
    /usr/bin/python3 tests/examples/torch_dcgan.py --time [ngf]       # ms/iteration, batch 64

The check: main.py's Generator and Discriminator (nz 8, ngf = ndf = 4, nc 1) in float64 with
twin.det_init weights, STEPS iterations of main.py's loop on batches of B Fashion-MNIST training
images (the first STEPS * B, raw bytes stored) resized to 64x64 by F.interpolate (bilinear) and
normalised to [-1, 1], the noise of every iteration stored. Stored: images, noise, every
iteration's errD, errG, D(x), D(G(z)) before and after D's step, and the checksums of the initial
and final weights of both networks.
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
STEPS, B, NZ, NGF, NDF, NC = 3, 4, 8, 4, 4, 1


class Generator(nn.Module):  # main.py's (ngpu dropped)
    def __init__(self, nz, ngf, nc):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh()
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):  # main.py's (ngpu dropped)
    def __init__(self, ndf, nc):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


criterion = nn.BCELoss()
real_label, fake_label = 1, 0


def train_step(netG, netD, optimizerG, optimizerD, real_cpu, noise):
    netD.zero_grad()
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)
    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()
    netG.zero_grad()
    label.fill_(real_label)
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()
    return [errD.item(), errG.item(), D_x, D_G_z1, D_G_z2]


def to_dcgan_images(images):  # (N, 1, 28, 28) in [0, 1] -> (N, 1, 64, 64) in [-1, 1]
    x = F.interpolate(images, size=(64, 64), mode="bilinear", align_corners=False)
    return (x - 0.5) / 0.5


def read_images():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        return torch.from_numpy(np.frombuffer(f.read(), dtype=np.uint8, offset=16).copy())


def fixture():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(999)
    images = read_images()[: STEPS * B * 784].reshape(STEPS * B, 1, 28, 28)
    netG, netD = Generator(NZ, NGF, NC), Discriminator(NDF, NC)
    twin.det_init(netG)
    twin.det_init(netD)
    init_g, init_d = twin.checksum(netG), twin.checksum(netD)
    optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
    noise = torch.randn(STEPS, B, NZ, 1, 1)
    results = []
    for s in range(STEPS):
        real = to_dcgan_images(images[s * B:(s + 1) * B].to(torch.float64) / 255.0)
        results.append(train_step(netG, netD, optimizerG, optimizerD, real, noise[s]))
    print("results", results)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "dcgan_fixture.safetensors"),
        {"images": images, "noise": noise, "results": torch.tensor(results)},
        {"init_checksum_g": repr(init_g), "init_checksum_d": repr(init_d),
         "final_checksum_g": repr(twin.checksum(netG)),
         "final_checksum_d": repr(twin.checksum(netD)), "steps": str(STEPS), "batch": str(B),
         "nz": str(NZ), "ngf": str(NGF), "ndf": str(NDF)})


def time_steps(ngf, steps=5):
    """ms per iteration at batch 64, nz 100, ngf = ndf = `ngf`, float32."""
    torch.manual_seed(999)
    images = read_images().reshape(-1, 1, 28, 28).to(torch.float32) / 255.0
    netG, netD = Generator(100, ngf, 1), Discriminator(ngf, 1)
    optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        real = to_dcgan_images(images[torch.randint(0, images.shape[0], (64,))])
        train_step(netG, netD, optimizerG, optimizerD, real, torch.randn(64, 100, 1, 1))
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ngf=ndf={ngf}: "
          f"{1000 * dt:.0f} ms/iteration")


if __name__ == "__main__":
    if "--time" in sys.argv:
        time_steps(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 64)
    else:
        fixture()
