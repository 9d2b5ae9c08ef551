// Decoding against PIL and Resize against torch (tests/data/images_fixture.txt and images/,
// written by make_image_fixtures.py; no Python at test time), and the other transforms against
// hand-computed values.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "data/image.h"
#include "data/transforms.h"
#include "tests/common/tensors.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::transforms;
using accel::test::max_abs_diff;
using accel::test::value_at;

namespace {

const std::string kDir = std::string(ACCEL_SOURCE_ROOT) + "/tests/data/";

struct Ref {
  Shape shape;
  std::vector<double> values;
};

const std::map<std::string, Ref>& fixtures() {
  static const std::map<std::string, Ref> refs = [] {
    std::map<std::string, Ref> m;
    std::ifstream f(kDir + "images_fixture.txt");
    REQUIRE(f.good());
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::stringstream ss(line);
      std::string name, shape, vals, tok;
      std::getline(ss, name, '|');
      std::getline(ss, shape, '|');
      std::getline(ss, vals, '|');
      Ref r;
      std::stringstream sh(shape);
      while (std::getline(sh, tok, ',')) r.shape.push_back(std::stoll(tok));
      std::stringstream vs(vals);
      while (std::getline(vs, tok, ',')) r.values.push_back(std::stod(tok));
      m[name] = std::move(r);
    }
    return m;
  }();
  return refs;
}

const Ref& ref(const std::string& name) {
  auto it = fixtures().find(name);
  REQUIRE_MESSAGE(it != fixtures().end(), "no fixture line " << name);
  return it->second;
}

Tensor ref_tensor(const std::string& name, DType dt) {
  const Ref& r = ref(name);
  return tensor(r.values, r.shape, TensorOptions(kFloat64)).to(dt);
}

Tensor u8(const std::vector<int>& v, const Shape& s) {
  std::vector<int32_t> w(v.begin(), v.end());
  return tensor(w, s, TensorOptions(kInt32)).to(kUInt8);
}

}  // namespace

TEST_CASE("image fixtures: PNG and JPEG decode like PIL") {
  // PNG is lossless: exact. JPEG: the same IDCT as PIL's libjpeg here, so exact too; the
  // tolerance allows another libjpeg build's IDCT to differ by a level.
  const std::vector<std::pair<std::string, int>> files = {
      {"rgb.png", 0},     {"gray.png", 0},        {"rgba.png", 0},
      {"palette.png", 0}, {"gray16.png", 0},      {"rgb.jpg", 2},
      {"gray.jpg", 2},    {"progressive.jpg", 2}, {"cmyk.jpg", 2}};
  for (const auto& [file, tol] : files) {
    for (const auto& [mode_name, mode] : {std::make_pair(std::string("RGB"), ImageMode::kRGB),
                                          std::make_pair(std::string("L"), ImageMode::kGray)}) {
      INFO(file, " as ", mode_name);
      ImageOptions o;
      o.mode = mode;
      Tensor img = read_image(kDir + "images/" + file, o);
      Tensor expect = ref_tensor(file + ":" + mode_name, kFloat64);
      REQUIRE(img.sizes() == expect.sizes());
      CHECK(max_abs_diff(img, expect) <= tol);
    }
  }
}

TEST_CASE("Resize: bilinear equals torch interpolate(align_corners=False) on float CHW") {
  Tensor x = ref_tensor("resize_input", kFloat32);  // (3, 5, 7)
  for (auto [h, w] : {std::make_pair(3, 4), std::make_pair(9, 11), std::make_pair(5, 2),
                      std::make_pair(1, 1), std::make_pair(5, 7)}) {
    INFO(h, "x", w);
    Tensor expect = ref_tensor("resize_" + std::to_string(h) + "x" + std::to_string(w), kFloat32);
    Tensor got = Resize(h, w)(x);
    CHECK(got.dtype() == kFloat32);
    CHECK(max_abs_diff(got, expect) < 2e-6);
    // float64 gives the same to float32 precision; a batch dim is carried.
    CHECK(max_abs_diff(Resize(h, w)(x.to(kFloat64)), expect) < 2e-6);
    CHECK(Resize(h, w)(x.unsqueeze(0)).sizes() == Shape{1, 3, h, w});
  }
  // One int: the shorter side. (5, 7) -> (3, int(3 * 7 / 5)) = (3, 4), as torchvision.
  Tensor s = Resize(3)(x);
  CHECK(max_abs_diff(s, ref_tensor("resize_3x4", kFloat32)) < 2e-6);
  CHECK(Resize(10)(x.transpose(1, 2)).sizes() == Shape{3, 14, 10});
}

TEST_CASE("Resize: uint8 HWC rounds like torchvision's tensor resize") {
  Tensor chw = ref_tensor("resize_u8_input", kFloat64);  // (3, 6, 5) of integers
  Tensor hwc = chw.permute({1, 2, 0}).contiguous().to(kUInt8);
  for (auto [h, w] : {std::make_pair(4, 3), std::make_pair(11, 9)}) {
    INFO(h, "x", w);
    Tensor expect = ref_tensor("resize_u8_" + std::to_string(h) + "x" + std::to_string(w), kFloat64)
                        .permute({1, 2, 0});
    Tensor got = Resize(h, w)(hwc);
    CHECK(got.dtype() == kUInt8);
    // Exact, ties included: resize reproduces the float32 roundings of torch's AVX2 kernel
    // (Note [resize like torch 1.13]), which can put a real k + 0.5 2e-5 to either side.
    CHECK(got.to_vector<int>() == expect.contiguous().to_vector<int>());
  }
}

TEST_CASE("CenterCrop: offsets round half to even, larger crops pad with zeros") {
  // (H, W) = (5, 7) uint8 with value 10 * y + x.
  std::vector<int> v;
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x) v.push_back(10 * y + x);
  Tensor img = u8(v, {5, 7});
  // top = round((5 - 2) / 2) = round(1.5) = 2, left = round((7 - 3) / 2) = 2.
  CHECK(CenterCrop(2, 3)(img).to_vector<int>() == std::vector<int>{22, 23, 24, 32, 33, 34});
  // top = round(0.5) = 0 (half to even), left = round(2.5) = 2.
  CHECK(CenterCrop(4, 2)(img).to_vector<int>() == std::vector<int>{2, 3, 12, 13, 22, 23, 32, 33});
  // Larger than the image: torchvision pads (left 1, top 1, right 1, bottom 2) then crops at 0.
  Tensor big = CenterCrop(8, 9)(img);
  REQUIRE(big.sizes() == Shape{8, 9});
  CHECK(value_at(big, {0, 0}) == 0);
  CHECK(value_at(big, {1, 1}) == 0);   // image (0, 0) is value 0 too
  CHECK(value_at(big, {2, 3}) == 12);  // image (1, 2)
  CHECK(value_at(big, {5, 7}) == 46);  // image (4, 6), its last pixel
  CHECK(value_at(big, {6, 7}) == 0);   // bottom padding
  CHECK(value_at(big, {5, 8}) == 0);   // right padding
  // Float CHW: the same crop on each plane.
  Tensor f = img.to(kFloat32).unsqueeze(0).expand({2, 5, 7}).contiguous();
  CHECK(CenterCrop(2, 3)(f).to_vector<int>() ==
        std::vector<int>{22, 23, 24, 32, 33, 34, 22, 23, 24, 32, 33, 34});
}

TEST_CASE("RandomHorizontalFlip and ToTensor and Normalize by hand") {
  Tensor img = u8({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});  // (H, W, C)
  Generator g(1);
  CHECK(RandomHorizontalFlip(1.0)(img, g).to_vector<int>() ==
        std::vector<int>{5, 6, 3, 4, 1, 2, 11, 12, 9, 10, 7, 8});
  CHECK(RandomHorizontalFlip(0.0)(img, g).to_vector<int>() == img.to_vector<int>());
  // p = 0.5 flips about half the time, and the same seed flips the same way.
  int flips = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    Generator a(s), b(s);
    Tensor x = RandomHorizontalFlip()(img, a), y = RandomHorizontalFlip()(img, b);
    CHECK(x.equal(y));
    flips += x.equal(img) ? 0 : 1;
  }
  CHECK(flips > 60);
  CHECK(flips < 140);
  // ToTensor: (H, W, C) uint8 -> (C, H, W) float / 255.
  Tensor t = ToTensor()(img, g);
  REQUIRE(t.sizes() == Shape{2, 2, 3});
  CHECK(t.dtype() == kFloat32);
  CHECK(value_at(t, {0, 1, 2}) == doctest::Approx(11.0 / 255.0));
  CHECK(value_at(t, {1, 0, 1}) == doctest::Approx(4.0 / 255.0));
  CHECK(ToTensor()(u8({0, 255}, {1, 2}), g).sizes() == Shape{1, 1, 2});
  CHECK_THROWS_AS(ToTensor()(t, g), DTypeError);
  // Normalize: (x - mean[c]) / std[c].
  Tensor n = Normalize({0.5, 0.1}, {0.5, 2.0})(t, g);
  CHECK(value_at(n, {0, 1, 2}) == doctest::Approx((11.0 / 255.0 - 0.5) / 0.5));
  CHECK(value_at(n, {1, 0, 1}) == doctest::Approx((4.0 / 255.0 - 0.1) / 2.0));
  CHECK_THROWS_AS(Normalize({0.5, 0.5, 0.5}, {1, 1, 1})(t, g), ValueError);  // 2 channels
  CHECK_THROWS_AS(Normalize({0.5}, {0.0}), ValueError);
  CHECK_THROWS_AS(Normalize({0.5}, {1.0})(img, g), DTypeError);
}

TEST_CASE("RandomResizedCrop: boxes within torchvision's bounds, fallback, reproducible") {
  RandomResizedCrop rrc(8, {0.25, 0.5}, {0.5, 2.0});
  for (uint64_t s = 0; s < 100; ++s) {
    Generator g(s);
    const auto b = rrc.get_params(40, 60, g);
    INFO("seed ", s, " box ", b.top, " ", b.left, " ", b.height, " ", b.width);
    CHECK(b.top >= 0);
    CHECK(b.left >= 0);
    CHECK(b.top + b.height <= 40);
    CHECK(b.left + b.width <= 60);
    const double area = double(b.height * b.width) / (40.0 * 60.0);
    CHECK(area > 0.2);  // 0.25..0.5 before rounding the sides
    CHECK(area < 0.56);
    const double ratio = double(b.width) / double(b.height);
    CHECK(ratio > 0.45);
    CHECK(ratio < 2.2);
  }
  // Every attempt fails (area > image): the central crop, clamped to the ratio range.
  RandomResizedCrop never(4, {2.0, 3.0}, {1.0, 1.0});
  Generator g(0);
  const auto b = never.get_params(4, 8, g);
  CHECK(b.top == 0);
  CHECK(b.left == 2);
  CHECK(b.height == 4);
  CHECK(b.width == 4);
  // Output size and layout; the same generator seed gives the same crop.
  Tensor img = empty({20, 30, 3}, kUInt8);
  for (int64_t i = 0; i < img.numel(); ++i) img.data<uint8_t>()[i] = uint8_t(i * 7);
  Generator a(5), c(5);
  Tensor x = RandomResizedCrop(std::make_pair(int64_t(6), int64_t(9)))(img, a);
  CHECK(x.sizes() == Shape{6, 9, 3});
  CHECK(x.equal(RandomResizedCrop(std::make_pair(int64_t(6), int64_t(9)))(img, c)));
  // A crop of the whole image is a plain resize.
  RandomResizedCrop whole(7, {1.0, 1.0}, {1.0, 1.0});
  Tensor sq = empty({12, 12, 3}, kUInt8);
  for (int64_t i = 0; i < sq.numel(); ++i) sq.data<uint8_t>()[i] = uint8_t(i * 3);
  CHECK(whole(sq, a).equal(resize(sq, 7, 7)));
}

TEST_CASE("Compose: transforms in order with one generator; repr") {
  auto tf = Compose({RandomResizedCrop(8), RandomHorizontalFlip(), ToTensor(),
                     Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
  Tensor img = empty({16, 20, 3}, kUInt8);
  for (int64_t i = 0; i < img.numel(); ++i) img.data<uint8_t>()[i] = uint8_t(i * 13);
  Generator a(42), b(42);
  Tensor x = tf(img, a);
  CHECK(x.sizes() == Shape{3, 8, 8});
  CHECK(x.equal(tf(img, b)));
  CHECK(x.min().item<float>() >= -1.0f);
  CHECK(x.max().item<float>() <= 1.0f);
  CHECK(tf.repr().find("RandomResizedCrop(size=(8, 8)") != std::string::npos);
  CHECK_THROWS_AS(Compose({TransformPtr{}}), ValueError);
}
