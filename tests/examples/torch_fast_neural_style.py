#!/usr/bin/python3
"""PyTorch twin of examples/fast_neural_style.cc (pytorch/examples fast_neural_style:
neural_style/transformer_net.py, vgg.py, utils.py and the training loop of neural_style.py): writes
tests/examples/fast_neural_style_fixture.safetensors for tests/examples/test_fast_neural_style.cc.

    /usr/bin/python3 tests/examples/torch_fast_neural_style.py              # the fixture
    /usr/bin/python3 tests/examples/torch_fast_neural_style.py --time [size batch]
                                                       # ms/step, float32, random vgg16 weights

The check: transformer_net.py's TransformerNet and vgg.py's Vgg16 (the relu1_2 / relu2_2 /
relu3_3 / relu4_3 slices of torchvision 0.14's vgg16().features, frozen) in float64, both given
twin.det_init weights (VGG16's slices hold 7.6M parameters, 61 MB in float64: too big to store,
so both sides compute them), neural_style.py's train() on N images of random sizes through the
original's dataset transform (Resize(IMAGE_SIZE), CenterCrop, ToTensor, mul(255)) and DataLoader
(batch B, no shuffling: the last batch is smaller), one epoch, Adam(lr 1e-3), content weight 1e5,
style weight 1e10, a style image of its own size (style_size None).

Resize runs on torchvision's tensor path with antialias=True, which is what accel's transforms
follow (docs/data.md); the original resizes PIL images (always antialiased, PIL's own integer
arithmetic): the script prints how far the two are apart for these images.

Stored: the raw images (uint8, (H, W, 3) each, concatenated) and their sizes, the style image,
the transformed batches (float32, as ToTensor gives them), the four Gram-matrix sums of the style
features, every step's content / style / total loss, the checksum of the first step's gradients,
the trained network's output on every batch (sum and sum of squares), and the checksums of the
initial and final TransformerNet weights and of the VGG weights.
"""
import os
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.optim import Adam
from torch.utils.data import DataLoader
from torchvision import models, transforms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

IMAGE_SIZE, B = 24, 2
# (H, W) of the training images: smaller and larger than IMAGE_SIZE, both orientations, one
# already at the size (Resize leaves it alone); 5 images in batches of 2 -> 2, 2, 1.
SIZES = [(30, 36), (20, 26), (34, 23), (24, 24), (38, 28)]
STYLE_SIZE = (20, 28)
CONTENT_WEIGHT, STYLE_WEIGHT, LR = 1e5, 1e10, 1e-3


# ---- transformer_net.py, verbatim ----
class TransformerNet(torch.nn.Module):
    def __init__(self):
        super(TransformerNet, self).__init__()
        # Initial convolution layers
        self.conv1 = ConvLayer(3, 32, kernel_size=9, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(32, affine=True)
        self.conv2 = ConvLayer(32, 64, kernel_size=3, stride=2)
        self.in2 = torch.nn.InstanceNorm2d(64, affine=True)
        self.conv3 = ConvLayer(64, 128, kernel_size=3, stride=2)
        self.in3 = torch.nn.InstanceNorm2d(128, affine=True)
        # Residual layers
        self.res1 = ResidualBlock(128)
        self.res2 = ResidualBlock(128)
        self.res3 = ResidualBlock(128)
        self.res4 = ResidualBlock(128)
        self.res5 = ResidualBlock(128)
        # Upsampling Layers
        self.deconv1 = UpsampleConvLayer(128, 64, kernel_size=3, stride=1, upsample=2)
        self.in4 = torch.nn.InstanceNorm2d(64, affine=True)
        self.deconv2 = UpsampleConvLayer(64, 32, kernel_size=3, stride=1, upsample=2)
        self.in5 = torch.nn.InstanceNorm2d(32, affine=True)
        self.deconv3 = ConvLayer(32, 3, kernel_size=9, stride=1)
        # Non-linearities
        self.relu = torch.nn.ReLU()

    def forward(self, X):
        y = self.relu(self.in1(self.conv1(X)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.relu(self.in3(self.conv3(y)))
        y = self.res1(y)
        y = self.res2(y)
        y = self.res3(y)
        y = self.res4(y)
        y = self.res5(y)
        y = self.relu(self.in4(self.deconv1(y)))
        y = self.relu(self.in5(self.deconv2(y)))
        y = self.deconv3(y)
        return y


class ConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super(ConvLayer, self).__init__()
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        out = self.reflection_pad(x)
        out = self.conv2d(out)
        return out


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels):
        super(ResidualBlock, self).__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        out = out + residual
        return out


class UpsampleConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, upsample=None):
        super(UpsampleConvLayer, self).__init__()
        self.upsample = upsample
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        x_in = x
        if self.upsample:
            x_in = torch.nn.functional.interpolate(x_in, mode='nearest', scale_factor=self.upsample)
        out = self.reflection_pad(x_in)
        out = self.conv2d(out)
        return out


# ---- vgg.py, with the features given (the original downloads IMAGENET1K_V1) ----
class Vgg16(torch.nn.Module):
    def __init__(self, vgg_pretrained_features, requires_grad=False):
        super(Vgg16, self).__init__()
        self.slice1 = torch.nn.Sequential()
        self.slice2 = torch.nn.Sequential()
        self.slice3 = torch.nn.Sequential()
        self.slice4 = torch.nn.Sequential()
        for x in range(4):
            self.slice1.add_module(str(x), vgg_pretrained_features[x])
        for x in range(4, 9):
            self.slice2.add_module(str(x), vgg_pretrained_features[x])
        for x in range(9, 16):
            self.slice3.add_module(str(x), vgg_pretrained_features[x])
        for x in range(16, 23):
            self.slice4.add_module(str(x), vgg_pretrained_features[x])
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, X):
        h = self.slice1(X)
        h_relu1_2 = h
        h = self.slice2(h)
        h_relu2_2 = h
        h = self.slice3(h)
        h_relu3_3 = h
        h = self.slice4(h)
        h_relu4_3 = h
        return (h_relu1_2, h_relu2_2, h_relu3_3, h_relu4_3)


# ---- utils.py, verbatim ----
def gram_matrix(y):
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram


def normalize_batch(batch):
    # normalize using imagenet mean and std
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    batch = batch.div_(255.0)
    return (batch - mean) / std


# ---- the body of neural_style.py's batch loop ----
def train_step(transformer, vgg, optimizer, mse_loss, x, gram_style, content_weight,
               style_weight):
    n_batch = len(x)
    optimizer.zero_grad()

    y = transformer(x)

    y = normalize_batch(y)
    x = normalize_batch(x)

    features_y = vgg(y)
    features_x = vgg(x)

    content_loss = content_weight * mse_loss(features_y[1], features_x[1])

    style_loss = 0.
    for ft_y, gm_s in zip(features_y, gram_style):
        gm_y = gram_matrix(ft_y)
        style_loss += mse_loss(gm_y, gm_s[:n_batch, :, :])
    style_loss *= style_weight

    total_loss = content_loss + style_loss
    total_loss.backward()
    optimizer.step()
    return [content_loss.item(), style_loss.item(), total_loss.item()]


# The original's transform, Resize on the tensor path (antialias=True, as the PIL path always
# antialiases); ToTensor's arithmetic for a uint8 image, in float32 (the default dtype).
def dataset_transform(image_size):
    return transforms.Compose([
        transforms.Resize(image_size, antialias=True),
        transforms.CenterCrop(image_size),
        transforms.Lambda(lambda x: x.to(torch.float32).div(255)),  # ToTensor()
        transforms.Lambda(lambda x: x.mul(255))
    ])


class Images(torch.utils.data.Dataset):  # ImageFolder's role: (C, H, W) uint8 images, label 0
    def __init__(self, images, transform):
        self.images, self.transform = images, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), 0


def smooth_image(h, w):
    """A random (3, h, w) uint8 image that is not pure noise: a coarse random grid upsampled."""
    coarse = torch.rand(1, 3, max(2, h // 6), max(2, w // 6), dtype=torch.float64)
    fine = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear",
                                           align_corners=False)
    noise = 0.15 * torch.rand(1, 3, h, w, dtype=torch.float64)
    return ((fine * 0.85 + noise) * 255).clamp(0, 255).to(torch.uint8)[0]


def pil_path_difference(images):
    """How far the original's PIL Resize (+ CenterCrop) is from the tensor path used here."""
    tensor_tf = transforms.Compose([transforms.Resize(IMAGE_SIZE, antialias=True),
                                    transforms.CenterCrop(IMAGE_SIZE)])
    pil_tf = transforms.Compose([transforms.Resize(IMAGE_SIZE), transforms.CenterCrop(IMAGE_SIZE)])
    diffs = []
    for img in images:
        a = tensor_tf(img).to(torch.int64)
        pil = Image.fromarray(img.permute(1, 2, 0).numpy())
        b = torch.from_numpy(np.array(pil_tf(pil))).permute(2, 0, 1).to(torch.int64)
        diffs.append((a - b).abs())
    d = torch.cat([x.flatten() for x in diffs])
    print(f"PIL path vs tensor path (antialias): max |diff| {int(d.max())}, "
          f"{float((d > 0).double().mean()) * 100:.1f} % of the values differ")


def grad_checksum(model):
    """sum(g) + sum(g^2) over the parameters' gradients."""
    return sum(float(p.grad.sum()) + float((p.grad ** 2).sum())
               for _, p in sorted(model.named_parameters()))


def fixture():
    torch.manual_seed(42)
    images = [smooth_image(h, w) for h, w in SIZES]
    style = smooth_image(*STYLE_SIZE)
    pil_path_difference(images)

    transformer = TransformerNet().double()
    vgg = Vgg16(models.vgg16().features).double()
    twin.det_init(transformer)
    twin.det_init(vgg)
    init_checksum = twin.checksum(transformer)
    optimizer = Adam(transformer.parameters(), LR)
    mse_loss = torch.nn.MSELoss()

    # style_transform: ToTensor, mul(255); the image at its own size (style_size None)
    style_t = style.to(torch.float32).div(255).mul(255).double()
    style_t = style_t.repeat(B, 1, 1, 1)
    features_style = vgg(normalize_batch(style_t))
    gram_style = [gram_matrix(y) for y in features_style]

    train_loader = DataLoader(Images(images, dataset_transform(IMAGE_SIZE)), batch_size=B)
    transformer.train()
    batches, results = [], []
    for batch_id, (x, _) in enumerate(train_loader):
        batches.append(x.clone())
        r = train_step(transformer, vgg, optimizer, mse_loss, x.double(), gram_style,
                       CONTENT_WEIGHT, STYLE_WEIGHT)
        print(f"step {batch_id}: content {r[0]!r} style {r[1]!r} total {r[2]!r}")
        results.append(r)
        if batch_id == 0:
            first_grads = grad_checksum(transformer)
    # The trained network's output on every batch: sum(y) and sum(y^2).
    with torch.no_grad():
        outputs = [[float(y.sum()), float((y ** 2).sum())]
                   for y in (transformer(b.double()) for b in batches)]

    flat = torch.cat([img.permute(1, 2, 0).flatten() for img in images])
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "fast_neural_style_fixture.safetensors"),
        {"images": flat, "sizes": torch.tensor(SIZES, dtype=torch.int64),
         "style": style.permute(1, 2, 0).contiguous(), "batches": torch.cat(batches),
         "gram_sums": torch.tensor([float(g[0].sum()) for g in gram_style], dtype=torch.float64),
         "results": torch.tensor(results, dtype=torch.float64),
         "final_outputs": torch.tensor(outputs, dtype=torch.float64)},
        {"init_checksum": repr(init_checksum), "grad_checksum": repr(first_grads),
         "final_checksum": repr(twin.checksum(transformer)),
         "vgg_checksum": repr(twin.checksum(vgg)), "image_size": str(IMAGE_SIZE),
         "batch": str(B), "content_weight": repr(CONTENT_WEIGHT),
         "style_weight": repr(STYLE_WEIGHT), "lr": repr(LR)})


def time_steps(image_size, batch, steps=3):
    """ms per step in float32 (torchvision's random vgg16 weights), on random images."""
    torch.manual_seed(42)
    transformer = TransformerNet()
    vgg = Vgg16(models.vgg16().features)
    optimizer = Adam(transformer.parameters(), LR)
    mse_loss = torch.nn.MSELoss()
    style = torch.rand(batch, 3, 256, 256) * 255
    gram_style = [gram_matrix(y) for y in vgg(normalize_batch(style))]
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        x = torch.rand(batch, 3, image_size, image_size) * 255
        train_step(transformer, vgg, optimizer, mse_loss, x, gram_style, CONTENT_WEIGHT,
                   STYLE_WEIGHT)
    dt = (time.perf_counter() - t0) / steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, image size "
          f"{image_size}, batch {batch}: {1000 * dt:.0f} ms/step")


if __name__ == "__main__":
    if "--time" in sys.argv:
        args = [int(a) for a in sys.argv[2:4]] if len(sys.argv) >= 4 else [256, 4]
        time_steps(*args)
    else:
        fixture()
