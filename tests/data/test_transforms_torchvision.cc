// The transforms against torchvision 0.14 (tensor path) on photos: transforms_fixture.bin.gz and
// images/photo_*, written by make_transform_fixtures.py; no Python at test time. uint8 results
// must be equal bit for bit, float32 ones within 1e-6. Random parameters: std::mt19937(seed) is
// torch's CPU generator after torch.manual_seed(seed), so its words fed to get_params must give
// torchvision's numbers (Note [torchvision's random draws]).
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "data/image.h"
#include "data/transforms.h"
#include "tests/common/tensors.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::transforms;
using accel::test::max_abs_diff;

namespace {

const std::string kDir = std::string(ACCEL_SOURCE_ROOT) + "/tests/data/";

const std::map<std::string, Tensor>& fixture() {
  static const std::map<std::string, Tensor> records = [] {
    std::map<std::string, Tensor> m;
    gzFile f = gzopen((kDir + "transforms_fixture.bin.gz").c_str(), "rb");
    REQUIRE(f != nullptr);
    std::string bytes;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) bytes.append(buf, size_t(n));
    gzclose(f);
    size_t pos = bytes.find('\n');
    REQUIRE(bytes.substr(0, pos) == "accel-fixture 1");
    ++pos;
    while (pos < bytes.size()) {
      const size_t eol = bytes.find('\n', pos);
      REQUIRE(eol != std::string::npos);
      std::istringstream head(bytes.substr(pos, eol - pos));
      pos = eol + 1;
      std::string name, code;
      int ndim = 0;
      head >> name >> code >> ndim;
      Shape shape(size_t(ndim), 0);
      for (auto& d : shape) head >> d;
      const DType dt = code == "u8"    ? kUInt8
                       : code == "i32" ? kInt32
                       : code == "i64" ? kInt64
                       : code == "f32" ? kFloat32
                                       : kFloat64;
      Tensor t = empty(shape, dt);
      const size_t nbytes = size_t(t.numel()) * t.element_size();
      REQUIRE(pos + nbytes <= bytes.size());
      std::memcpy(t.data_ptr(), bytes.data() + pos, nbytes);
      pos += nbytes;
      m[name] = t;
    }
    return m;
  }();
  return records;
}

const Tensor& rec(const std::string& name) {
  auto it = fixture().find(name);
  REQUIRE_MESSAGE(it != fixture().end(), "no fixture record " << name);
  return it->second;
}

Tensor photo(const std::string& name) {
  ImageOptions o;
  o.mode = name == "camera" ? ImageMode::kGray : ImageMode::kRGB;
  return read_image(kDir + "images/photo_" + name + ".png", o);
}

// uint8 (H, W, C) -> (C, H, W) / 255 in float64 (torchvision's img.double() / 255).
Tensor as_f64(const Tensor& u8) {
  const Tensor chw = u8.permute({2, 0, 1}).contiguous();
  Tensor out = empty(chw.sizes(), kFloat64);
  const uint8_t* s = chw.data<uint8_t>();
  double* d = out.data<double>();
  for (int64_t i = 0; i < chw.numel(); ++i) d[i] = double(s[i]) / 255.0;
  return out;
}

// A float32 result against torchvision's: within 1e-6 is the contract; resizing is in fact
// reproduced bit for bit (Note [resize like torch 1.13]), which this checks too: a change to any
// one rounding shows here long before it flips a uint8 result.
void check_f32(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == kFloat32);
  const double d = max_abs_diff(got, want);
  CHECK(d <= 1e-6);
  CHECK_MESSAGE(d == 0, "float32 result differs from torchvision's by up to " << d);
}

// Number of differing elements of two uint8 images of the same shape.
int64_t mismatches(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == kUInt8);
  REQUIRE(a.sizes() == b.sizes());
  const auto x = a.to_vector<int>(), y = b.to_vector<int>();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

struct Mode {
  const char* name;
  InterpolationMode mode;
  bool antialias;
};
const Mode kModes[] = {{"nearest", InterpolationMode::kNearest, false},
                       {"nearest-exact", InterpolationMode::kNearestExact, false},
                       {"bilinear", InterpolationMode::kBilinear, false},
                       {"bilinear-aa", InterpolationMode::kBilinear, true},
                       {"bicubic", InterpolationMode::kBicubic, false},
                       {"bicubic-aa", InterpolationMode::kBicubic, true}};

// zlib's CRC-32 of a uint8 image's bytes (Python's zlib.crc32 of the same (H, W, C) array).
int64_t crc32_of(const Tensor& u8) {
  REQUIRE(u8.dtype() == kUInt8);
  const Tensor c = u8.contiguous();
  return int64_t(crc32(0L, c.data<uint8_t>(), uInt(c.numel())));
}

// torch's CPU generator after torch.manual_seed(seed).
struct TorchWords {
  explicit TorchWords(uint64_t seed) : mt(uint32_t(seed)) {}
  std::mt19937 mt;
  RandomWords words() {
    return [this] { return uint32_t(mt()); };
  }
};

}  // namespace

TEST_CASE("torchvision fixtures: the photos decode as PIL decodes them") {
  for (const char* name : {"cat", "coffee", "camera"}) {
    INFO(name);
    const Tensor img = photo(name);
    CHECK(img.equal(rec(std::string(name) + ".input")));
  }
}

TEST_CASE("Resize equals torchvision: every mode, uint8 bit for bit, float32 within 1e-6") {
  for (const char* name : {"cat", "coffee", "camera"}) {
    const Tensor img = photo(name);
    const Tensor f32 = to_tensor(img);
    for (const Mode& m : kModes) {
      const std::string key = std::string("resize.") + name + "." + m.name;
      INFO(key);
      // size as one int (the shorter side), as (h, w), and one int with max_size.
      const Tensor s = Resize(23, m.mode, std::nullopt, m.antialias)(img);
      CHECK(mismatches(s, rec(key + ".short.u8")) == 0);
      const Tensor hw = resize(img, {29, 17}, m.mode, std::nullopt, m.antialias);
      CHECK(mismatches(hw, rec(key + ".hw.u8")) == 0);
      if (std::string(name) == "cat") {
        const Tensor mx = Resize(24, m.mode, 28, m.antialias)(img);
        CHECK(mx.sizes() == Shape{22, 28, 3});  // 32 x 40: 24 x 30, then the long side to 28
        CHECK(mismatches(mx, rec(key + ".max.u8")) == 0);
      }
      if (std::string(name) == "coffee") {
        CHECK(mismatches(Resize(47, 37, m.mode, m.antialias)(img),
                         rec("resize.coffee." + std::string(m.name) + ".up.u8")) == 0);
      }
      auto it = fixture().find(key + ".hw.f32");
      if (it != fixture().end()) {
        check_f32(Resize(29, 17, m.mode, m.antialias)(f32), it->second);
      }
    }
  }
  // float64 images: the same formulas in double.
  const Tensor cam = as_f64(photo("camera"));
  CHECK(max_abs_diff(Resize(23)(cam), rec("resize.camera.bilinear.short.f64")) <= 1e-12);
  CHECK(max_abs_diff(Resize(23, InterpolationMode::kBicubic, std::nullopt, true)(cam),
                     rec("resize.camera.bicubic-aa.short.f64")) <= 1e-12);
}

TEST_CASE(
    "resized_crop equals torchvision's F.resized_crop (the fixed part of RandomResizedCrop)") {
  for (int i = 0; i < 8; ++i) {
    const std::string key = "resized_crop." + std::to_string(i);
    INFO(key);
    const auto b = rec(key + ".box").to_vector<int64_t>();  // top, left, h, w, oh, ow, aa
    const std::string name = i < 4 ? "cat" : i == 4 ? "coffee" : "camera";
    const InterpolationMode mode = i == 4             ? InterpolationMode::kNearest
                                   : i == 2 || i == 3 ? InterpolationMode::kBicubic
                                                      : InterpolationMode::kBilinear;
    const Tensor img = photo(name);
    const Tensor u8 = resized_crop(img, b[0], b[1], b[2], b[3], b[4], b[5], mode, b[6] != 0);
    CHECK(mismatches(u8, rec(key + ".u8")) == 0);
    auto it = fixture().find(key + ".f32");
    if (it != fixture().end()) {
      check_f32(resized_crop(to_tensor(img), b[0], b[1], b[2], b[3], b[4], b[5], mode, b[6] != 0),
                it->second);
    }
  }
}

TEST_CASE("CenterCrop (padding when larger), hflip and Normalize equal torchvision") {
  const Tensor cam = photo("camera");  // 30 x 36
  for (auto [h, w] : {std::pair{20, 24}, {45, 37}, {50, 50}, {31, 40}, {30, 52}, {19, 36}}) {
    INFO(h, "x", w);
    CHECK(CenterCrop(h, w)(cam).equal(
        rec("center_crop." + std::to_string(h) + "x" + std::to_string(w) + ".u8")));
  }
  CHECK(max_abs_diff(CenterCrop(45, 37)(to_tensor(cam)), rec("center_crop.camera.45x37.f32")) == 0);
  CHECK(hflip(photo("cat")).equal(rec("hflip.cat.u8")));
  // ToTensor: torchvision's to_tensor of the (H, W, C) array, exactly (one float32 division).
  CHECK(max_abs_diff(ToTensor()(photo("cat")), rec("to_tensor.cat.f32")) == 0);
  const Tensor small = crop(photo("cat"), 4, 6, 20, 24);
  CHECK(small.equal(rec("color.input.u8")));
  const Tensor n = Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})(to_tensor(small));
  CHECK(max_abs_diff(n, rec("normalize.f32")) <= 1e-6);
}

TEST_CASE("RandomResizedCrop, RandomHorizontalFlip, ColorJitter draw torchvision's parameters") {
  for (int c = 0; c < 5; ++c) {
    const auto cs = rec("rrc_params." + std::to_string(c) + ".case").to_vector<double>();
    const auto boxes = rec("rrc_params." + std::to_string(c) + ".boxes").to_vector<int64_t>();
    RandomResizedCrop rrc(8, {cs[2], cs[3]}, {cs[4], cs[5]});
    int64_t off = 0;
    for (uint64_t s = 0; s < 200; ++s) {
      TorchWords tw(s);
      const auto b = rrc.get_params(int64_t(cs[0]), int64_t(cs[1]), tw.words());
      const size_t i = size_t(4 * s);
      const bool same = b.top == boxes[i] && b.left == boxes[i + 1] && b.height == boxes[i + 2] &&
                        b.width == boxes[i + 3];
      if (!same)
        MESSAGE("case ", c, " seed ", s, ": got (", b.top, ", ", b.left, ", ", b.height, ", ",
                b.width, "), torchvision (", boxes[i], ", ", boxes[i + 1], ", ", boxes[i + 2], ", ",
                boxes[i + 3], ")");
      off += !same;
    }
    CHECK(off == 0);
  }
  const auto flips = rec("flip_params").to_vector<int>();
  for (uint64_t s = 0; s < 200; ++s) {
    const double ps[3] = {0.5, 0.7, 0.1};
    for (int k = 0; k < 3; ++k) {
      TorchWords tw(s);
      CHECK(int(RandomHorizontalFlip(ps[k]).get_params(tw.words())) == flips[size_t(3 * s + k)]);
    }
  }
  const ColorJitter jitters[4] = {
      ColorJitter(0.4, 0.4, 0.4, 0.1), ColorJitter({0.5, 1.5}, 0, {0.7, 0.7}, 0.3),
      ColorJitter(0, 0.2, 0, 0), ColorJitter({1.0, 1.0}, {0.0, 3.0}, 2.5, {-0.5, 0.5})};
  for (int c = 0; c < 4; ++c) {
    INFO("jitter case ", c);
    const auto orders = rec("jitter_params." + std::to_string(c) + ".orders").to_vector<int>();
    const auto factors = rec("jitter_params." + std::to_string(c) + ".factors").to_vector<double>();
    int64_t off = 0;
    for (uint64_t s = 0; s < 200; ++s) {
      TorchWords tw(s);
      const auto p = jitters[c].get_params(tw.words());
      for (size_t k = 0; k < 4; ++k) {
        off += p.order[k] != orders[size_t(4 * s + k)];
        const double f = factors[size_t(4 * s + k)];
        off += std::isnan(f) ? p.factors[k].has_value() : !(p.factors[k] && *p.factors[k] == f);
      }
    }
    CHECK(off == 0);
  }
}

TEST_CASE("colour functions equal torchvision: uint8 bit for bit, float32 within 1e-6") {
  const Tensor small = crop(photo("cat"), 4, 6, 20, 24);
  const Tensor f32 = to_tensor(small);
  struct Case {
    const char* fn;
    const char* v;
    double value;
  };
  const Case cases[] = {{"brightness", "0.6", 0.6}, {"brightness", "1.3", 1.3},
                        {"contrast", "0.5", 0.5},   {"contrast", "1.7", 1.7},
                        {"saturation", "0", 0.0},   {"saturation", "1.6", 1.6},
                        {"hue", "-0.3", -0.3},      {"hue", "0.17", 0.17},
                        {"hue", "0.5", 0.5},        {"gray", "0", 0}};
  auto run = [](const std::string& fn, const Tensor& x, double v) {
    if (fn == "brightness") return adjust_brightness(x, v);
    if (fn == "contrast") return adjust_contrast(x, v);
    if (fn == "saturation") return adjust_saturation(x, v);
    if (fn == "hue") return adjust_hue(x, v);
    return rgb_to_grayscale(x);
  };
  for (const Case& c : cases) {
    const std::string key = std::string("color.") + c.fn + "." + c.v;
    INFO(key);
    CHECK(mismatches(run(c.fn, small, c.value), rec(key + ".u8")) == 0);
    auto it = fixture().find(key + ".f32");
    if (it != fixture().end()) CHECK(max_abs_diff(run(c.fn, f32, c.value), it->second) <= 1e-6);
  }
  // One channel: brightness and contrast act, saturation and hue return the image.
  const Tensor cam = photo("camera");
  for (const Case& c : {Case{"brightness", "0.7", 0.7}, Case{"contrast", "1.5", 1.5},
                        Case{"saturation", "0.3", 0.3}, Case{"hue", "0.2", 0.2}}) {
    const std::string key = std::string("color.camera.") + c.fn + "." + c.v;
    INFO(key);
    CHECK(mismatches(run(c.fn, cam, c.value), rec(key + ".u8")) == 0);
  }
  CHECK(max_abs_diff(adjust_contrast(to_tensor(cam), 1.5), rec("color.camera.contrast.1.5.f32")) <=
        1e-6);
  // ColorJitter's fixed part: the adjustments in a given order with given factors.
  for (int i = 0; i < 2; ++i) {
    const std::string key = "jitter." + std::to_string(i);
    INFO(key);
    const auto order = rec(key + ".order").to_vector<int>();
    const auto factors = rec(key + ".factors").to_vector<double>();
    ColorJitter::Params p;
    for (size_t k = 0; k < 4; ++k) {
      p.order[k] = order[k];
      if (!std::isnan(factors[k])) p.factors[k] = factors[k];
    }
    CHECK(mismatches(ColorJitter::apply_params(small, p), rec(key + ".u8")) == 0);
    CHECK(max_abs_diff(ColorJitter::apply_params(f32, p), rec(key + ".f32")) <= 1e-6);
  }
}

TEST_CASE("a 500 x 375 JPEG through RandomResizedCrop(224, antialias) + flip + Normalize") {
  const Tensor img = read_image(kDir + "images/photo_coffee_500x375.jpg");
  REQUIRE(img.sizes() == Shape{375, 500, 3});
  // Our decoding is PIL's (same libjpeg): checked, every byte, before comparing what follows.
  REQUIRE(crc32_of(img) == rec("jpeg.decoded.crc32").item<int64_t>());
  CHECK(img.to(kFloat64).sum().item<double>() == rec("jpeg.decoded.sum").item<double>());
  const auto flat = img.contiguous().to_vector<int>();
  const auto samples = rec("jpeg.decoded.samples").to_vector<int>();
  for (size_t i = 0; i < samples.size(); ++i)
    REQUIRE(flat[size_t((uint64_t(i) * 2654435761u) % flat.size())] == samples[i]);
  TorchWords tw(7);
  RandomResizedCrop rrc(224, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, InterpolationMode::kBilinear,
                        true);
  const auto b = rrc.get_params(375, 500, tw.words());
  CHECK(std::vector<int64_t>{b.top, b.left, b.height, b.width} ==
        rec("jpeg.pipeline.box").to_vector<int64_t>());
  Tensor out = resized_crop(img, b.top, b.left, b.height, b.width, 224, 224,
                            InterpolationMode::kBilinear, true);
  CHECK(crc32_of(out) == rec("jpeg.pipeline.crop_crc32").item<int64_t>());  // every byte
  out = normalize(to_tensor(hflip(out)), {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  REQUIRE(out.sizes() == Shape{3, 224, 224});
  CHECK(std::abs(out.to(kFloat64).sum().item<double>() - rec("jpeg.pipeline.sum").item<double>()) <
        1e-6 * double(out.numel()));
  const auto got = out.to_vector<double>();
  const auto want = rec("jpeg.pipeline.samples").to_vector<double>();
  double d = 0;
  for (size_t i = 0; i < want.size(); ++i)
    d = std::max(d, std::abs(got[size_t((uint64_t(i) * 2654435761u) % got.size())] - want[i]));
  CHECK(d <= 1e-6);
}

namespace {

// `fn` must throw E whose message starts with "[op]" and contains each of `parts` (the shape,
// the dtype, the bad value).
template <typename E, typename F>
void check_error(F&& fn, const std::string& op, std::initializer_list<std::string> parts) {
  std::string msg;
  try {
    fn();
  } catch (const E& e) {
    msg = e.what();
  }
  INFO("message: ", msg);
  REQUIRE_MESSAGE(!msg.empty(), "no " << op << " error");
  CHECK(msg.rfind("[" + op + "]", 0) == 0);
  for (const auto& p : parts) CHECK(msg.find(p) != std::string::npos);
}

}  // namespace

TEST_CASE("transforms: bad input is an error naming the transform, the shape and the dtype") {
  Generator g(0);
  const Tensor u8 = zeros({4, 5, 3}, kUInt8), batch_u8 = zeros({2, 4, 5, 3}, kUInt8);
  const Tensor i32 = zeros({3, 4, 5}, kInt32), vec = zeros({5}, kFloat32);
  const Tensor two_ch = zeros({2, 4, 5}, kFloat32), empty_img = zeros({0, 5, 3}, kUInt8);
  const auto I = InterpolationMode::kBilinear;
  // Construction: sizes <= 0, bad ranges, antialias with nearest, max_size <= size.
  check_error<ValueError>([] { Resize(0); }, "Resize", {"0"});
  check_error<ValueError>([] { Resize(0, 3); }, "Resize", {"(0, 3)"});
  check_error<ValueError>([&] { Resize(4, I, 4); }, "Resize", {"max_size = 4"});
  check_error<ValueError>([] { Resize(4, InterpolationMode::kNearest, std::nullopt, true); },
                          "Resize", {"nearest"});
  check_error<ValueError>([] { CenterCrop(3, -1); }, "CenterCrop", {"(3, -1)"});
  check_error<ValueError>([] { RandomResizedCrop(0); }, "RandomResizedCrop", {"(0, 0)"});
  check_error<ValueError>(
      [] {
        RandomResizedCrop(8, {0.5, 0.1});
      },
      "RandomResizedCrop", {"scale", "(0.5, 0.1)"});
  check_error<ValueError>(
      [] {
        RandomResizedCrop(8, {0.1, 1.0}, {0.0, 1.0});
      },
      "RandomResizedCrop", {"ratio", "(0, 1)"});
  check_error<ValueError>([] { RandomHorizontalFlip(1.5); }, "RandomHorizontalFlip", {"1.5"});
  check_error<ValueError>([] { Normalize({0.5, 0.5}, {0.5}); }, "Normalize", {"2 and 1"});
  check_error<ValueError>([] { Normalize({0.5}, {0.0}); }, "Normalize", {"zero"});
  check_error<ValueError>([] { ColorJitter(-0.1); }, "ColorJitter", {"brightness", "-0.1"});
  check_error<ValueError>([] { ColorJitter(0, 0, 0, 0.7); }, "ColorJitter", {"hue", "0.7"});
  check_error<ValueError>(
      [] {
        ColorJitter(0, JitterRange{1.5, 0.5});
      },
      "ColorJitter", {"contrast", "(1.5, 0.5)"});
  // Images of the wrong dims, dtype or size, named by the transform that got them.
  const std::vector<std::pair<std::string, AnyTransform>> tfs = {
      {"Resize", Resize(3)},
      {"CenterCrop", CenterCrop(3)},
      {"RandomResizedCrop", RandomResizedCrop(3)},
      {"RandomHorizontalFlip", RandomHorizontalFlip(0.0)},  // checked also when not flipping
      {"ColorJitter", ColorJitter()}};                      // and when nothing is drawn
  for (const auto& [name, tf] : tfs) {
    INFO(name);
    check_error<ShapeError>([&] { tf.ptr()->apply(batch_u8, g); }, name, {"(2, 4, 5, 3)"});
    check_error<ShapeError>([&] { tf.ptr()->apply(vec, g); }, name, {"(5,)"});
    check_error<DTypeError>([&] { tf.ptr()->apply(i32, g); }, name, {"int32", "(3, 4, 5)"});
    check_error<ShapeError>([&] { tf.ptr()->apply(empty_img, g); }, name, {"(0, 5, 3)"});
  }
  check_error<ShapeError>([&] { ColorJitter(0.5)(two_ch, g); }, "ColorJitter", {"2", "(2, 4, 5)"});
  check_error<DTypeError>([&] { ToTensor()(to_tensor(u8), g); }, "ToTensor",
                          {"float32", "(3, 4, 5)"});
  check_error<ShapeError>([&] { ToTensor()(batch_u8, g); }, "ToTensor", {"(2, 4, 5, 3)"});
  check_error<DTypeError>([&] { Normalize({0.5}, {0.5})(u8, g); }, "Normalize",
                          {"uint8", "(4, 5, 3)"});
  check_error<ValueError>(
      [&] {
        Normalize({0.5, 0.5}, {1, 1})(to_tensor(u8), g);
      },
      "Normalize", {"2 mean/std", "3 channels", "(3, 4, 5)"});
  // The functional forms name themselves.
  check_error<ValueError>([&] { resize(u8, 0, 4); }, "resize", {"(0, 4)"});
  check_error<ValueError>(
      [&] {
        resize(u8, std::vector<int64_t>{2, 3}, I, 5);
      },
      "resize", {"max_size"});
  check_error<ValueError>([&] { resize(u8, std::vector<int64_t>{1, 2, 3}); }, "resize", {"3"});
  check_error<ValueError>([&] { resized_crop(u8, 0, 0, 0, 2, 3, 3); }, "resized_crop", {"(0, 2)"});
  check_error<ValueError>([&] { crop(u8, 0, 0, 2, -2); }, "crop", {"(2, -2)"});
  check_error<ShapeError>([&] { center_crop(batch_u8, 2, 2); }, "center_crop", {"(2, 4, 5, 3)"});
  check_error<ShapeError>([&] { hflip(vec); }, "hflip", {"(5,)"});
  check_error<ValueError>([&] { adjust_hue(u8, 0.7); }, "adjust_hue", {"0.7"});
  check_error<ValueError>([&] { adjust_brightness(u8, -1); }, "adjust_brightness", {"-1"});
  check_error<ValueError>([&] { adjust_contrast(u8, -1); }, "adjust_contrast", {"-1"});
  check_error<ValueError>([&] { adjust_saturation(u8, -1); }, "adjust_saturation", {"-1"});
  check_error<ShapeError>([&] { adjust_saturation(two_ch, 1.2); }, "adjust_saturation",
                          {"2", "(2, 4, 5)"});
  check_error<DTypeError>([&] { adjust_contrast(i32, 1.2); }, "adjust_contrast",
                          {"int32", "(3, 4, 5)"});
  check_error<ValueError>([&] { rgb_to_grayscale(u8, 2); }, "rgb_to_grayscale", {"2"});
  // Where torchvision 0.14 pads rather than raises (a crop reaching out of the image), so do we.
  CHECK(crop(u8, -1, -1, 6, 7).sizes() == Shape{6, 7, 3});
  CHECK(resized_crop(u8, 2, 3, 4, 4, 2, 2).sizes() == Shape{2, 2, 3});
}

TEST_CASE("transforms of a CUDA image: computed on the CPU, the result back on the device") {
  bool cuda = false;
  try {
    cuda = get_allocator(Device::cuda(0)) != nullptr;
  } catch (const Error&) {
  }
  if (!cuda) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  const Tensor img = photo("cat");
  const Tensor dev = img.to(Device::cuda(0));
  auto tf =
      Compose({RandomResizedCrop(24, {0.3, 1.0}, {0.75, 1.33}, InterpolationMode::kBicubic, true),
               RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1), ToTensor(),
               Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})});
  for (uint64_t s = 0; s < 8; ++s) {
    Generator a(s), b(s);
    const Tensor want = tf(img, a), got = tf(dev, b);
    CHECK(got.device() == Device::cuda(0));
    CHECK(max_abs_diff(got.cpu(), want) <= 1e-6);  // Normalize runs on the device
  }
  CHECK(resize(dev, 7, 9).device() == Device::cuda(0));
  CHECK(center_crop(dev, 50, 50).device() == Device::cuda(0));
  CHECK(adjust_hue(to_tensor(dev), 0.2).device() == Device::cuda(0));
}
