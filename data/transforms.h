// Image transforms like torchvision.transforms, on tensors. They run where the dataset's get()
// runs: in the DataLoader's worker threads.
//
//   using namespace accel::data::transforms;
//   auto tf = Compose({RandomResizedCrop(64), RandomHorizontalFlip(), ToTensor(),
//                      Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
//   auto ds = std::make_shared<ImageFolder>("shapes/train", tf);
//
// Layouts (data/image.h): uint8 images are (H, W, C) or (H, W), as decoded (torchvision's PIL
// images); floating images are (..., C, H, W) or (H, W), as after ToTensor (torchvision's
// tensors). Resize, CenterCrop, RandomResizedCrop and RandomHorizontalFlip take either; ToTensor
// takes uint8; Normalize takes floating.
//
// Note [transform randomness]: a random transform draws from the Generator it is given. Called
// without one, it uses sample_generator() (data/dataset.h): seeded from the loader seed, the epoch
// and the index of the example being fetched, so a run with the same seed sees the same crops and
// flips whatever the number of workers, and a resumed run continues exactly. (torch seeds each
// worker instead, so its augmentations change with num_workers.) Compose passes one generator
// through its transforms in order; ImageFolder makes one per example.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// torchvision Resize(size, interpolation=BILINEAR, antialias=False) on tensors: one int resizes
// the shorter side to `size` and the longer to int(size * long / short); (h, w) resizes to
// exactly that. Bilinear with align_corners=False and no antialiasing, i.e. exactly
// torch.nn.functional.interpolate(mode="bilinear", align_corners=False), computed in float32
// (float64 for float64 images); uint8 images are rounded half to even, as torchvision's tensor
// resize does. (torchvision's PIL path antialiases when downscaling; this one does not.)
class Resize final : public Transform {
 public:
  explicit Resize(int64_t size);
  Resize(int64_t height, int64_t width);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

 private:
  int64_t size_ = 0, height_ = 0, width_ = 0;  // size_ > 0: shorter side
};

// torchvision CenterCrop: top = round((H - h) / 2), left = round((W - w) / 2) (Python rounding,
// half to even); a crop larger than the image pads it with zeros as torchvision does.
class CenterCrop final : public Transform {
 public:
  explicit CenterCrop(int64_t size) : CenterCrop(size, size) {}
  CenterCrop(int64_t height, int64_t width);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

 private:
  int64_t height_, width_;
};

// torchvision RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3/4, 4/3)): up to 10 tries of an
// area fraction uniform in `scale` and a log-uniform aspect ratio in `ratio`, else the central
// crop clamped to the ratio; then bilinear resize (as Resize) to (size, size) or (height, width).
class RandomResizedCrop final : public Transform {
 public:
  explicit RandomResizedCrop(int64_t size, std::pair<double, double> scale = {0.08, 1.0},
                             std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
  RandomResizedCrop(std::pair<int64_t, int64_t> size, std::pair<double, double> scale = {0.08, 1.0},
                    std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;
  struct Box {
    int64_t top, left, height, width;
  };
  // The crop for an image of (h, w): torchvision's get_params with draws from `gen`.
  Box get_params(int64_t h, int64_t w, Generator& gen) const;

 private:
  int64_t height_, width_;
  std::pair<double, double> scale_, ratio_;
};

// Flips left-right with probability p (one draw from the generator per image).
class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor apply(const Tensor& image, Generator& gen) const override;
  std::string repr() const override;

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

// The functional forms (torchvision.transforms.functional), same layouts.
Tensor resize(const Tensor& image, int64_t height, int64_t width);
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
Tensor center_crop(const Tensor& image, int64_t height, int64_t width);
Tensor hflip(const Tensor& image);

}  // namespace accel::data::transforms
