// PNG/JPEG decoding and encoding, make_grid and save_image.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/file_io.h"
#include "data/image.h"
#include "helpers.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;

namespace {

// A deterministic (H, W, C) uint8 pattern with every channel different.
Tensor pattern(int64_t h, int64_t w, int64_t c) {
  Tensor t = empty({h, w, c}, kUInt8);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) p[(y * w + x) * c + k] = uint8_t(y * 37 + x * 11 + k * 90);
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("image: PNG round trip for 1 to 4 channels, kAny keeps the channels") {
  for (int64_t c = 1; c <= 4; ++c) {
    CAPTURE(c);
    Tensor img = pattern(5, 7, c);
    const std::string png = encode_png(img);
    ImageOptions any;
    any.mode = ImageMode::kAny;
    Tensor back =
        decode_image(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "mem", any);
    REQUIRE(back.sizes() == Shape{5, 7, c});
    CHECK(bytes_of(back) == bytes_of(img));
  }
}

TEST_CASE("image: mode conversion like PIL's convert") {
  Tensor rgba = pattern(2, 3, 4);
  const std::string png = encode_png(rgba);
  const auto* d = reinterpret_cast<const uint8_t*>(png.data());
  ImageOptions o;  // kRGB: alpha dropped
  Tensor rgb = decode_image(d, png.size(), "mem", o);
  REQUIRE(rgb.sizes() == Shape{2, 3, 3});
  const uint8_t* src = rgba.data<uint8_t>();
  const uint8_t* out = rgb.data<uint8_t>();
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 3; ++k) CHECK(out[i * 3 + k] == src[i * 4 + k]);
  o.mode = ImageMode::kGray;
  Tensor gray = decode_image(d, png.size(), "mem", o);
  REQUIRE(gray.sizes() == Shape{2, 3, 1});
  for (int i = 0; i < 6; ++i) {
    const int r = src[i * 4], g = src[i * 4 + 1], b = src[i * 4 + 2];
    CHECK(int(gray.data<uint8_t>()[i]) == (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
  }
  // Gray -> RGB repeats the value.
  Tensor g1 = pattern(3, 2, 1);
  const std::string gpng = encode_png(g1);
  o.mode = ImageMode::kRGB;
  Tensor g3 = decode_image(reinterpret_cast<const uint8_t*>(gpng.data()), gpng.size(), "mem", o);
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 3; ++k) CHECK(g3.data<uint8_t>()[i * 3 + k] == g1.data<uint8_t>()[i]);
}

TEST_CASE("image: JPEG round trip is close at high quality") {
  // A smooth image (JPEG is lossy; a smooth one survives quality 100 within a few levels).
  Tensor img = empty({16, 24, 3}, kUInt8);
  uint8_t* p = img.data<uint8_t>();
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 24; ++x) {
      p[(y * 24 + x) * 3 + 0] = uint8_t(x * 10);
      p[(y * 24 + x) * 3 + 1] = uint8_t(y * 15);
      p[(y * 24 + x) * 3 + 2] = 128;
    }
  const std::string jpg = encode_jpeg(img, 100);
  Tensor back = decode_image(reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size(), "mem");
  REQUIRE(back.sizes() == Shape{16, 24, 3});
  int worst = 0;
  for (int64_t i = 0; i < img.numel(); ++i)
    worst = std::max(worst, std::abs(int(back.data<uint8_t>()[i]) - int(p[i])));
  CHECK(worst <= 12);  // 4:2:0 chroma subsampling at the colour edges
}

TEST_CASE("image: write_png + read_image through the file system") {
  TempDir dir;
  Tensor img = pattern(9, 4, 3);
  write_png(img, dir.file("a.png"));
  Tensor back = read_image(dir.file("a.png"));
  CHECK(bytes_of(back) == bytes_of(img));
  write_jpeg(img, dir.file("b.jpg"), 95);
  CHECK(read_image(dir.file("b.jpg")).sizes() == Shape{9, 4, 3});
}

TEST_CASE("image: encoders reject wrong dtypes and shapes") {
  CHECK_THROWS_AS(encode_png(zeros({4, 4, 3})), DTypeError);
  CHECK_THROWS_AS(encode_png(zeros({4, 4, 5}, kUInt8)), ShapeError);
  CHECK_THROWS_AS(encode_jpeg(zeros({4, 4, 2}, kUInt8)), ShapeError);
  CHECK_THROWS_AS(encode_png(zeros({2, 4, 4, 3}, kUInt8)), ShapeError);
}

TEST_CASE("make_grid: layout, padding and single image like torchvision") {
  // 3 images of (1, 2, 2), nrow 2: (3, 2 * (2 + 1) + 1, 2 * (2 + 1) + 1) = (3, 7, 7).
  Tensor x = empty({3, 1, 2, 2}, kFloat32);
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 4; ++i) x.data<float>()[k * 4 + i] = float(k + 1) * 0.1f + float(i) * 0.01f;
  GridOptions o;
  o.nrow = 2;
  o.padding = 1;
  o.pad_value = -1;
  Tensor g = make_grid(x, o);
  REQUIRE(g.sizes() == Shape{3, 7, 7});
  auto at = [&](int c, int y, int xx) { return g.data<float>()[(c * 7 + y) * 7 + xx]; };
  CHECK(at(0, 0, 0) == -1.0f);
  CHECK(at(1, 1, 1) == doctest::Approx(0.10));  // image 0 at (1, 1)
  CHECK(at(2, 2, 2) == doctest::Approx(0.13));  // its bottom-right
  CHECK(at(0, 1, 4) == doctest::Approx(0.20));  // image 1 at (1, 4)
  CHECK(at(0, 4, 1) == doctest::Approx(0.30));  // image 2 at (4, 1)
  CHECK(at(0, 4, 4) == -1.0f);                  // no fourth image
  CHECK(at(0, 3, 3) == -1.0f);                  // padding between
  // A single image: no padding, three channels.
  Tensor one = make_grid(x.narrow(0, 0, 1), o);
  CHECK(one.sizes() == Shape{3, 2, 2});
  // normalize by min/max and by a value range.
  o.normalize = true;
  Tensor n = make_grid(x, o);
  CHECK(n.data<float>()[(0 * 7 + 1) * 7 + 1] == doctest::Approx(0.0));
  CHECK(n.data<float>()[(0 * 7 + 5) * 7 + 2] == doctest::Approx(1.0));
  o.value_range = std::make_pair(0.0, 0.2);
  Tensor r = make_grid(x, o);
  CHECK(r.data<float>()[(0 * 7 + 1) * 7 + 1] == doctest::Approx(0.5));
  CHECK(r.data<float>()[(0 * 7 + 4) * 7 + 1] == doctest::Approx(1.0));  // 0.3 clamped
}

TEST_CASE("save_image: grid PNG round trip gives torchvision's bytes") {
  TempDir dir;
  // Values whose x * 255 + 0.5 truncation is known: 0 -> 0, 1 -> 255, 0.5 -> 128, -3 -> 0, 7 ->
  // 255.
  Tensor x = empty({2, 3, 1, 2}, kFloat32);
  const float v[12] = {0, 1, 0.5f, -3, 7, 0.25f, 1, 0, 0.1f, 0.2f, 0.3f, 0.4f};
  std::memcpy(x.data_ptr(), v, sizeof v);
  save_image(x, dir.file("grid.png"), /*nrow=*/8, /*padding=*/1);
  Tensor back = read_image(dir.file("grid.png"));
  // (3, 1 + 2, 2 * 3 + 1) -> (3, 7) HWC.
  REQUIRE(back.sizes() == Shape{3, 7, 3});
  auto px = [&](int y, int xx, int c) { return int(back.data<uint8_t>()[(y * 7 + xx) * 3 + c]); };
  auto expect = [](float f) { return int(std::min(255.0f, std::max(0.0f, f * 255.0f + 0.5f))); };
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 3; ++c)
      for (int xx = 0; xx < 2; ++xx) {
        INFO("k ", k, " c ", c, " x ", xx);
        CHECK(px(1, 1 + k * 3 + xx, c) == expect(v[(k * 3 + c) * 2 + xx]));
      }
  CHECK(px(0, 0, 0) == 0);  // padding
  // Writing is atomic: no temporaries are left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.str())) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK_THROWS_AS(save_image(zeros({2, 2}, kUInt8), dir.file("u8.png")), DTypeError);
}
