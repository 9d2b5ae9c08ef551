#!/usr/bin/python3
# Writes tests/data/transforms_fixture.bin.gz: what torchvision 0.14's tensor transforms (Debian's
# python3-torchvision, torch 1.13) give on the photos in tests/data/images/, replayed by
# tests/data/test_transforms_torchvision.cc (no Python at test time).
#
#   /usr/bin/python3 tests/data/make_transform_fixtures.py [--photos SKIMAGE_DATA_DIR]
#
# The photos are crops of scikit-image's sample images, which Debian ships in python3-skimage
# (skimage/data/): chelsea.png (CC0, photographer Stefan van der Walt), coffee.png (CC0, Rachel
# Michetti) and camera.png (CC0, Lav Varshney). --photos rewrites them from that folder
# (`apt-get download python3-skimage && dpkg-deb -x python3-skimage_*.deb x`, then
# x/usr/lib/python3/dist-packages/skimage/data); without it the committed files are used.
#
# Every image goes to torchvision as the tensor torchvision.io.read_image would give: uint8
# (C, H, W), contiguous; float images are that / 255 (ConvertImageDtype, = ToTensor). accel's
# uint8 images are (H, W, C): the uint8 results are stored (H, W, C), the float ones (C, H, W).
#
# File format (read by the test, gzip-compressed): the line "accel-fixture 1", then records, each one line
# "name dtype ndim d0 d1 ..." (dtype u8, i32, i64, f32 or f64) followed by the raw little-endian
# values, C order.
import argparse
import gzip
import math
import os
import struct
import zlib

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode as IM

here = os.path.dirname(os.path.abspath(__file__))
img_dir = os.path.join(here, "images")

ap = argparse.ArgumentParser()
ap.add_argument("--photos", help="scikit-image's data folder, to rewrite the photo files")
args = ap.parse_args()

if args.photos:
    src = lambda n: Image.open(os.path.join(args.photos, n))
    # (left, upper, right, lower) boxes: an eye of the cat, the spoon on the saucer, the camera.
    src("chelsea.png").crop((150, 90, 190, 122)).save(os.path.join(img_dir, "photo_cat.png"))
    src("coffee.png").crop((335, 225, 367, 265)).save(os.path.join(img_dir, "photo_coffee.png"))
    src("camera.png").crop((250, 140, 286, 170)).save(os.path.join(img_dir, "photo_camera.png"))
    # 500 x 375, the size of a typical ImageNet photo: the transform benchmark and the
    # end-to-end check below.
    src("coffee.png").crop((50, 12, 550, 387)).save(
        os.path.join(img_dir, "photo_coffee_500x375.jpg"), quality=85)

records = []


def put(name, arr):
    a = np.ascontiguousarray(arr.detach().cpu().numpy() if torch.is_tensor(arr) else arr)
    code = {np.dtype("uint8"): "u8", np.dtype("int32"): "i32", np.dtype("int64"): "i64",
            np.dtype("float32"): "f32",
            np.dtype("float64"): "f64"}[a.dtype]
    records.append((name, code, a))


def load(name):
    pil = Image.open(os.path.join(img_dir, name))
    a = np.array(pil)
    if a.ndim == 2:
        a = a[:, :, None]
    return torch.from_numpy(a).permute(2, 0, 1).contiguous()  # uint8 (C, H, W)


def hwc(t):
    return t.permute(1, 2, 0).contiguous() if t.dtype == torch.uint8 else t


photos = {"cat": load("photo_cat.png"), "coffee": load("photo_coffee.png"),
          "camera": load("photo_camera.png")}
for k, t in photos.items():
    put(k + ".input", hwc(t))

# ---- Resize: every mode, uint8 and float, three kinds of size ----
# nearest-exact is not one of torchvision 0.14's InterpolationModes (0.15 adds it); its tensor
# path would be this: interpolate(mode="nearest-exact") between the same casts.
def tv_resize(img, size, mode, antialias=False, max_size=None):
    if mode == "nearest-exact":
        _, h, w = TF.get_dimensions(img)
        out_size = TF._compute_resized_output_size((h, w), size, max_size)
        x = img.unsqueeze(0)
        x = x if x.is_floating_point() else x.float()
        y = F.interpolate(x, size=out_size, mode="nearest-exact").squeeze(0)
        return y if img.is_floating_point() else y.round().to(img.dtype)
    return TF.resize(img, size, interpolation=IM(mode), max_size=max_size, antialias=antialias)


modes = [("nearest", False), ("nearest-exact", False), ("bilinear", False), ("bilinear", True),
         ("bicubic", False), ("bicubic", True)]
sizes = {"short": ([23], None), "hw": ([29, 17], None), "max": ([24], 28)}
for k, img in photos.items():
    f = img.float() / 255
    for mode, aa in modes:
        mname = mode + ("-aa" if aa else "")
        for sname, (size, max_size) in sizes.items():
            if sname == "max" and k != "cat":
                continue
            put("resize.%s.%s.%s.u8" % (k, mname, sname),
                hwc(tv_resize(img, size, mode, aa, max_size)))
        if k == "cat" or mname in ("bilinear", "bicubic-aa"):
            put("resize.%s.%s.hw.f32" % (k, mname), tv_resize(f, [29, 17], mode, aa))
for mode, aa in [("bilinear", False), ("bicubic", True)]:
    put("resize.camera.%s.short.f64" % (mode + ("-aa" if aa else "")),
        tv_resize(photos["camera"].double() / 255, [23], mode, aa))
# Upscaling both sides.
for mode, aa in modes:
    mname = mode + ("-aa" if aa else "")
    put("resize.coffee.%s.up.u8" % mname, hwc(tv_resize(photos["coffee"], [47, 37], mode, aa)))

# ---- resized_crop: the deterministic part of RandomResizedCrop ----
# The camera (one channel) boxes: torch runs a one-channel bilinear resize through its
# channels-last kernel only when the crop (a view) is channels-last contiguous: a full-width box.
crop_cases = [("cat", (3, 5, 20, 30), [24, 24], "bilinear", False),
              ("cat", (3, 5, 20, 30), [24, 24], "bilinear", True),
              ("cat", (0, 9, 32, 27), [24, 24], "bicubic", False),
              ("cat", (10, 12, 15, 11), [24, 20], "bicubic", True),
              ("coffee", (4, 2, 30, 25), [16, 16], "nearest", False),
              ("camera", (4, 0, 20, 36), [17, 25], "bilinear", False),
              ("camera", (4, 3, 20, 30), [17, 25], "bilinear", False),
              ("camera", (0, 0, 30, 36), [20, 21], "bilinear", False)]
for i, (k, (top, left, h, w), size, mode, aa) in enumerate(crop_cases):
    img = photos[k]
    put("resized_crop.%d.box" % i, np.array([top, left, h, w] + size + [1 if aa else 0], np.int64))
    put("resized_crop.%d.u8" % i,
        hwc(TF.resized_crop(img, top, left, h, w, size, IM(mode), antialias=aa)))
    if i in (1, 2, 5, 6):
        put("resized_crop.%d.f32" % i,
            TF.resized_crop(img.float() / 255, top, left, h, w, size, IM(mode), antialias=aa))

# ---- CenterCrop (with padding), hflip, Normalize ----
cat = photos["cat"]
for (h, w) in [(20, 24), (45, 37), (50, 50), (31, 40), (30, 52), (19, 36)]:
    put("center_crop.%dx%d.u8" % (h, w), hwc(TF.center_crop(photos["camera"], [h, w])))
put("center_crop.camera.45x37.f32", TF.center_crop(photos["camera"].float() / 255, [45, 37]))
put("hflip.cat.u8", hwc(TF.hflip(cat)))
# ToTensor takes a PIL image or an (H, W, C) array: the decoded photo as numpy gives.
put("to_tensor.cat.f32", TF.to_tensor(np.array(Image.open(os.path.join(img_dir, "photo_cat.png")))))

# ---- Random parameters: torch's generator, seeded ----
# The test replays each seed's mt19937 words (std::mt19937(seed) is torch's CPU generator) through
# accel's get_params and must find the same numbers.
seeds = range(200)
rrc_cases = [((375, 500), (0.08, 1.0), (3 / 4, 4 / 3)), ((32, 40), (0.08, 1.0), (3 / 4, 4 / 3)),
             ((40, 32), (0.5, 1.0), (0.5, 2.0)), ((10, 200), (0.9, 1.0), (1.0, 1.0)),
             ((200, 10), (0.2, 0.3), (2.0, 3.0))]
for i, (hw, scale, ratio) in enumerate(rrc_cases):
    boxes = []
    dummy = torch.empty(1, *hw)
    for s in seeds:
        torch.manual_seed(s)
        boxes.append(T.RandomResizedCrop.get_params(dummy, list(scale), list(ratio)))
    put("rrc_params.%d.case" % i, np.array(list(hw) + list(scale) + list(ratio), np.float64))
    put("rrc_params.%d.boxes" % i, np.array(boxes, np.int32))
flips = []
for s in seeds:
    row = []
    for p in (0.5, 0.7, 0.1):
        torch.manual_seed(s)
        row.append(1 if bool(torch.rand(1) < p) else 0)
    flips.append(row)
put("flip_params", np.array(flips, np.uint8))
jitter_cases = [(0.4, 0.4, 0.4, 0.1), ((0.5, 1.5), 0, (0.7, 0.7), 0.3), (0, 0.2, 0, 0),
                ((1.0, 1.0), (0.0, 3.0), 2.5, (-0.5, 0.5))]
for i, (b, c, s_, h) in enumerate(jitter_cases):
    cj = T.ColorJitter(b, c, s_, h)
    orders, factors = [], []
    for s in seeds:
        torch.manual_seed(s)
        idx, fb, fc, fs, fh = cj.get_params(cj.brightness, cj.contrast, cj.saturation, cj.hue)
        orders.append(idx.tolist())
        factors.append([math.nan if v is None else v for v in (fb, fc, fs, fh)])
    put("jitter_params.%d.orders" % i, np.array(orders, np.uint8))
    # The factors are float32 values (uniform_ on a float32 tensor): exact as float32.
    put("jitter_params.%d.factors" % i, np.array(factors, np.float32))

# ---- Colour: the functional forms (a 20 x 24 crop of the cat, and the camera) ----
small = cat[:, 4:24, 6:30].contiguous()
put("color.input.u8", hwc(small))
put("normalize.f32", TF.normalize(small.float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]))
f32_colors = {("brightness", 1.3), ("contrast", 1.7), ("saturation", 1.6), ("hue", -0.3),
              ("gray", 0)}
color_cases = [("brightness", 0.6), ("brightness", 1.3), ("contrast", 0.5), ("contrast", 1.7),
               ("saturation", 0.0), ("saturation", 1.6), ("hue", -0.3), ("hue", 0.17),
               ("hue", 0.5), ("gray", 0)]
fns = {"brightness": TF.adjust_brightness, "contrast": TF.adjust_contrast,
       "saturation": TF.adjust_saturation, "hue": TF.adjust_hue,
       "gray": lambda x, _: TF.rgb_to_grayscale(x)}
for name, v in color_cases:
    put("color.%s.%g.u8" % (name, v), hwc(fns[name](small, v)))
    if (name, v) in f32_colors:
        put("color.%s.%g.f32" % (name, v), fns[name](small.float() / 255, v))
camera = photos["camera"]
for name, v in [("brightness", 0.7), ("contrast", 1.5), ("saturation", 0.3), ("hue", 0.2)]:
    put("color.camera.%s.%g.u8" % (name, v), hwc(fns[name](camera, v)))
    if name == "contrast":
        put("color.camera.%s.%g.f32" % (name, v), fns[name](camera.float() / 255, v))
# ColorJitter's fixed part: the four adjustments in a given order with given factors.
def jitter(img, order, factors):
    for fn_id in order:
        fv = factors[fn_id]
        if fv is None:
            continue
        img = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation,
               TF.adjust_hue][fn_id](img, fv)
    return img


for i, (order, factors) in enumerate([((2, 0, 3, 1), (1.2, 0.8, 1.3, -0.05)),
                                      ((3, 1, 0, 2), (0.7, None, 0.4, 0.21))]):
    put("jitter.%d.order" % i, np.array(order, np.int64))
    put("jitter.%d.factors" % i, np.array([math.nan if v is None else v for v in factors], np.float64))
    put("jitter.%d.u8" % i, hwc(jitter(small, order, factors)))
    put("jitter.%d.f32" % i, jitter(small.float() / 255, order, factors))

# ---- End to end on the 500 x 375 JPEG: the box of seed 7, crop + resize to 224, flip,
# float, Normalize. The output is 224 x 224 x 3: stored are its sum and 2048 values at positions
# (i * 2654435761) % numel, which the test computes the same way, and the CRC-32 of the uint8
# crop before the float steps; the decoded image is checked against PIL's first (the CRC-32 of
# all its (H, W, C) bytes, its sum and the same kind of samples). ----
def crc32(t):
    return np.array([zlib.crc32(np.ascontiguousarray(t.numpy()).tobytes())], np.int64)


jpeg = load("photo_coffee_500x375.jpg")
put("jpeg.decoded.crc32", crc32(hwc(jpeg)))
put("jpeg.decoded.sum", np.array([float(jpeg.double().sum())]))
n = jpeg.numel()
hwc_j = hwc(jpeg).flatten()
put("jpeg.decoded.samples", hwc_j[[(i * 2654435761) % n for i in range(2048)]])
torch.manual_seed(7)
box = T.RandomResizedCrop.get_params(jpeg, [0.08, 1.0], [3 / 4, 4 / 3])
out = TF.resized_crop(jpeg, *box, [224, 224], IM.BILINEAR, antialias=True)
put("jpeg.pipeline.crop_crc32", crc32(hwc(out)))
out = TF.normalize(TF.hflip(out).float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
put("jpeg.pipeline.box", np.array(box, np.int64))
put("jpeg.pipeline.sum", np.array([float(out.double().sum())]))
flat = out.flatten()
put("jpeg.pipeline.samples", flat[[(i * 2654435761) % flat.numel() for i in range(2048)]])

with gzip.GzipFile(os.path.join(here, "transforms_fixture.bin.gz"), "wb", mtime=0) as fh:
    fh.write(b"accel-fixture 1\n")
    for name, code, a in records:
        head = "%s %s %d %s\n" % (name, code, a.ndim, " ".join(str(d) for d in a.shape))
        fh.write(head.encode())
        fh.write(a.astype(a.dtype.newbyteorder("<")).tobytes())
print("wrote %d records (torch %s, torchvision %s)" % (len(records), torch.__version__,
                                                         torchvision.__version__))
