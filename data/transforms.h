// Image transforms like torchvision.transforms, on tensors. They run where the dataset's get()
// runs: in the DataLoader's worker threads.
//
//   using namespace accel::data::transforms;
//   auto tf = Compose({RandomResizedCrop(64), RandomHorizontalFlip(), ToTensor(),
//                      Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
//   auto ds = std::make_shared<ImageFolder>("shapes/train", tf);
//
// Layouts (data/image.h): uint8 images are (H, W, C) or (H, W), as decoded; floating images are
// (..., C, H, W) or (H, W), as after ToTensor. Every transform computes what torchvision 0.14's
// *tensor* path computes (a uint8 (H, W, C) image standing for torchvision's uint8 (C, H, W)
// tensor, as torchvision.io.read_image gives it), not its PIL path: docs/data.md says where the
// two differ. Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip and ColorJitter take
// either layout; ToTensor takes uint8; Normalize takes floating.
//
// Note [transform randomness]: a random transform draws from the Generator it is given. Called
// without one, it uses sample_generator() (data/dataset.h): seeded from the loader seed, the epoch
// and the index of the example being fetched, so a run with the same seed sees the same crops and
// flips whatever the number of workers, and a resumed run continues exactly. (torch seeds each
// worker instead, so its augmentations change with num_workers.) Compose passes one generator
// through its transforms in order; ImageFolder makes one per example.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace accel::data::transforms {

class Transform {
 public:
  virtual ~Transform() = default;
  virtual Tensor apply(const Tensor& image, Generator& gen) const = 0;
  virtual std::string repr() const = 0;
  Tensor operator()(const Tensor& image, Generator& gen) const { return apply(image, gen); }
  // With sample_generator() (Note [transform randomness]).
  Tensor operator()(const Tensor& image) const;
};
using TransformPtr = std::shared_ptr<const Transform>;

// Holds any transform, so that Compose({Resize(32), ToTensor()}) reads like Python.
class AnyTransform {
 public:
  template <typename T, std::enable_if_t<std::is_base_of_v<Transform, std::decay_t<T>>, int> = 0>
  AnyTransform(T&& t) : ptr_(std::make_shared<std::decay_t<T>>(std::forward<T>(t))) {}
  AnyTransform(TransformPtr p);
  const TransformPtr& ptr() const { return ptr_; }

 private:
  TransformPtr ptr_;
};

class Compose final : public Transform {
 public:
  Compose(std::vector<AnyTransform> transforms);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;
  // As a shared pointer (what ImageFolder takes).
  operator TransformPtr() const { return std::make_shared<Compose>(*this); }

 private:
  std::vector<TransformPtr> transforms_;
};

// Any function of the image (and the generator).
class Lambda final : public Transform {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> fn);
  explicit Lambda(std::function<Tensor(const Tensor&, Generator&)> fn);
  Tensor apply(const Tensor& image, Generator& gen) const override { return fn_(image, gen); }
  std::string repr() const override { return "Lambda()"; }

 private:
  std::function<Tensor(const Tensor&, Generator&)> fn_;
};

// Note [torchvision's random draws]
// torchvision draws from torch's CPU generator, a 32-bit mt19937: torch.rand(1) and uniform_(a, b)
// on a float32 tensor take one word w and give fma(float((w & 0xFFFFFF) * 2^-24), b - a, a) in
// float32; randint(0, n) is w % n; randperm(n) swaps r[i] with r[i + w % (n - i)] for
// i < n - 1. accel's random transforms make the same draws, in the same order, with the same
// float32 arithmetic, from a RandomWords source; apply() takes its words from the Generator (the
// high 32 bits of each next_u64()). "Equal" therefore means: fed the words torch's generator
// produces (std::mt19937 seeded like torch.manual_seed; tests/data/test_transforms_torchvision.cc
// does this for 200 seeds), get_params returns exactly torchvision's boxes, flips, orders and
// factors; with accel's own Generator the stream, and so the crops, differ from torch's.
using RandomWords = std::function<uint32_t()>;
// The words of `gen` (used by apply(); `gen` must outlive the result).
RandomWords random_words(Generator& gen);
// torch.rand(1) from one word: a float32 multiple of 2^-24 in [0, 1).
float uniform_from_word(uint32_t word);

// torchvision.transforms.InterpolationMode, as far as torchvision's tensor resize goes (BOX,
// HAMMING and LANCZOS are PIL-only). kNearestExact is torch's interpolate(mode="nearest-exact")
// (torchvision 0.15's NEAREST_EXACT).
enum class InterpolationMode { kNearest, kNearestExact, kBilinear, kBicubic };
const char* interpolation_name(InterpolationMode mode);

// torchvision.transforms.Resize on tensors (Note [resize like torch 1.13] in data/resample.cc):
// one int resizes the shorter side to `size` and the longer to int(size * long / short), then,
// with max_size, both down so that the longer is max_size; (h, w) resizes to exactly that.
// Nearest, nearest-exact, bilinear and bicubic (align_corners=False), with antialias for
// bilinear and bicubic. The default antialias=false is torchvision 0.14's for tensors (its PIL
// path always antialiases; torchvision 0.17 made true the default). Computed as torch does, in
// float32 (float64 for float64 images); uint8 images are rounded half to even, bicubic clamped
// first: uint8 results equal torchvision's bit for bit, float32 ones within float32 rounding.
class Resize final : public Transform {
 public:
  explicit Resize(int64_t size, InterpolationMode interpolation = InterpolationMode::kBilinear,
                  std::optional<int64_t> max_size = std::nullopt, bool antialias = false);
  Resize(int64_t height, int64_t width,
         InterpolationMode interpolation = InterpolationMode::kBilinear, bool antialias = false);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

 private:
  int64_t size_ = 0, height_ = 0, width_ = 0;  // size_ > 0: shorter side
  InterpolationMode interpolation_;
  std::optional<int64_t> max_size_;
  bool antialias_;
};

// torchvision CenterCrop: top = round((H - h) / 2), left = round((W - w) / 2) (Python rounding,
// half to even); a crop larger than the image pads it with zeros as torchvision does
// ((h - H) // 2 rows above, the rest below; the same for columns).
class CenterCrop final : public Transform {
 public:
  explicit CenterCrop(int64_t size) : CenterCrop(size, size) {}
  CenterCrop(int64_t height, int64_t width);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

 private:
  int64_t height_, width_;
};

// torchvision RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3/4, 4/3), interpolation,
// antialias): get_params draws up to 10 tries of an area fraction in `scale` and a log-uniform
// aspect ratio in `ratio` (Note [torchvision's random draws]), else takes the central crop
// clamped to the ratio; then resized_crop to (size, size) or (height, width).
class RandomResizedCrop final : public Transform {
 public:
  explicit RandomResizedCrop(int64_t size, std::pair<double, double> scale = {0.08, 1.0},
                             std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0},
                             InterpolationMode interpolation = InterpolationMode::kBilinear,
                             bool antialias = false);
  RandomResizedCrop(std::pair<int64_t, int64_t> size, std::pair<double, double> scale = {0.08, 1.0},
                    std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0},
                    InterpolationMode interpolation = InterpolationMode::kBilinear,
                    bool antialias = false);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;
  struct Box {
    int64_t top, left, height, width;
  };
  // The crop for an image of (h, w): torchvision's get_params.
  Box get_params(int64_t h, int64_t w, const RandomWords& words) const;
  Box get_params(int64_t h, int64_t w, Generator& gen) const;

 private:
  int64_t height_, width_;
  std::pair<double, double> scale_, ratio_;
  InterpolationMode interpolation_;
  bool antialias_;
};

// Flips left-right when torch.rand(1) < p (one word per image, Note [torchvision's random draws];
// p compared in float32 as torch does).
class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;
  // Whether to flip (draws one word).
  bool get_params(const RandomWords& words) const;

 private:
  double p_;
};

// uint8 (H, W, C) or (H, W) -> float32 (C, H, W) or (1, H, W) in [0, 1] (value / 255).
class ToTensor final : public Transform {
 public:
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override { return "ToTensor()"; }
};

// (x - mean[c]) / std[c] per channel of a floating (..., C, H, W) image; one value applies to
// every channel. ValueError for a zero std or a count that matches neither 1 nor C.
class Normalize final : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

 private:
  std::vector<double> mean_, std_;
};

// A ColorJitter argument as torchvision takes it: one number v, meaning [max(0, 1 - v), 1 + v]
// (brightness, contrast, saturation) or [-v, v] (hue), or an explicit (min, max).
struct JitterRange {
  JitterRange(double v = 0) : value(v) {}  // NOLINT: a number converts, as in Python
  JitterRange(double lo, double hi) : range(std::make_pair(lo, hi)) {}
  double value = 0;
  std::optional<std::pair<double, double>> range;
};

// torchvision ColorJitter(brightness, contrast, saturation, hue): each image gets the four
// adjustments in a random order (randperm(4)) with factors uniform in their ranges; a range that
// is the identity ((1, 1), or (0, 0) for hue) is skipped and draws nothing. Ranges: brightness,
// contrast, saturation within [0, inf), hue within [-0.5, 0.5]; ValueError otherwise.
class ColorJitter final : public Transform {
 public:
  explicit ColorJitter(JitterRange brightness = 0, JitterRange contrast = 0,
                       JitterRange saturation = 0, JitterRange hue = 0);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;
  struct Params {
    std::array<int, 4> order{0, 1, 2, 3};  // 0 brightness, 1 contrast, 2 saturation, 3 hue
    std::array<std::optional<double>, 4> factors{};  // absent: that adjustment is skipped
  };
  Params get_params(const RandomWords& words) const;
  Params get_params(Generator& gen) const;
  // The deterministic part: the adjustments in p.order with p.factors.
  static Tensor apply_params(const Tensor& image, const Params& p);

 private:
  std::array<std::optional<std::pair<double, double>>, 4> ranges_;
};

// ---- The functional forms (torchvision.transforms.functional, tensor path), same layouts ----

// resize to exactly (height, width); returns `image` itself when it already has that size.
Tensor resize(const Tensor& image, int64_t height, int64_t width,
              InterpolationMode interpolation = InterpolationMode::kBilinear,
              bool antialias = false);
// F.resize(img, size, interpolation, max_size, antialias): size {s} (shorter side) or {h, w}.
Tensor resize(const Tensor& image, const std::vector<int64_t>& size,
              InterpolationMode interpolation = InterpolationMode::kBilinear,
              std::optional<int64_t> max_size = std::nullopt, bool antialias = false);
// The (height, width) that resize(image, {size}, ..., max_size) gives an (h, w) image.
std::pair<int64_t, int64_t> resized_output_size(int64_t h, int64_t w, int64_t size,
                                                std::optional<int64_t> max_size = std::nullopt);
// crop then resize to (out_height, out_width), without copying the crop when the box is
// inside the image (torchvision crops a view: Note [resize like torch 1.13] says where that
// matters).
Tensor resized_crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width,
                    int64_t out_height, int64_t out_width,
                    InterpolationMode interpolation = InterpolationMode::kBilinear,
                    bool antialias = false);
// A box reaching out of the image is padded with zeros, as torchvision's tensor crop does.
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
Tensor center_crop(const Tensor& image, int64_t height, int64_t width);
Tensor hflip(const Tensor& image);
Tensor vflip(const Tensor& image);
Tensor to_tensor(const Tensor& image);
Tensor normalize(const Tensor& image, const std::vector<double>& mean,
                 const std::vector<double>& std);

// Colour (Note [colour like torchvision] in data/color.cc): uint8 (H, W, C) or floating
// (..., C, H, W) images with C = 1 or 3 (float images in [0, 1]); the result has the input's
// dtype and layout. uint8 results equal torchvision's bit for bit (they truncate, as torch's
// .to(uint8) does), float32 ones within float32 rounding.
// torchvision's ITU-R 601-2 luma 0.2989 R + 0.587 G + 0.114 B; num_output_channels 1 or 3.
Tensor rgb_to_grayscale(const Tensor& image, int64_t num_output_channels = 1);
Tensor adjust_brightness(const Tensor& image, double brightness_factor);
Tensor adjust_contrast(const Tensor& image, double contrast_factor);
Tensor adjust_saturation(const Tensor& image, double saturation_factor);
Tensor adjust_hue(const Tensor& image, double hue_factor);  // hue_factor in [-0.5, 0.5]

}  // namespace accel::data::transforms
