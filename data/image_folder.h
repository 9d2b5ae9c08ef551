// ImageFolder: torchvision.datasets.ImageFolder over PNG and JPEG files, and a writer of small
// synthetic image folders (coloured shapes) for examples and tests.
//
//   root/cat/001.png, root/cat/sub/x.jpg, root/dog/a.JPEG  ->  classes {"cat", "dog"}
//
//   using namespace accel::data::transforms;
//   auto ds = std::make_shared<ImageFolder>(root, Compose({Resize(64), CenterCrop(64),
//   ToTensor()})); DataLoader loader(ds, o);   // batch["image"]: (B, 3, 64, 64) f32,
//   batch["label"]: (B) int64
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image.h"
#include "data/transforms.h"

namespace accel::data {

struct ImageFolderOptions {
  // Compared case-insensitively with the end of the file name (torchvision's IMG_EXTENSIONS,
  // restricted to what we decode).
  std::vector<std::string> extensions{".png", ".jpg", ".jpeg"};
  ImageOptions image{};      // decoding: RGB by default, pixel and file-size caps
  bool allow_empty = false;  // a class folder without images is an IoError unless set
  int max_depth = 64;        // nesting below a class folder
};

// Note [ImageFolder scan]: classes are the sorted names of root's subfolders (links to folders
// included, as os.scandir's is_dir() follows them); class_to_idx numbers them in that order.
// Each class folder is walked recursively, folders in sorted path order and files sorted inside
// each, as torchvision's make_dataset does with os.walk(followlinks=True). Every folder is opened
// through core/file_io's open_dir (Note [safe file access]: a link planted by another user or a
// world-writable folder is an IoError), a folder reached twice through links is walked once (no
// cycles), and a file with an image extension that is not a regular file (a FIFO, a dangling
// link, a device) is an IoError at construction, never a hang in a worker. Files are read with
// file_io::read_file when fetched.
class ImageFolder final : public Dataset {
 public:
  explicit ImageFolder(std::string root,
                       transforms::AnyTransform transform = transforms::TransformPtr{},
                       ImageFolderOptions options = {});

  int64_t size() const override { return int64_t(samples_.size()); }
  // {"image", "label"}: the decoded image ((H, W, C) uint8) through the transform (with a
  // generator from sample_generator(): Note [transform randomness]), and the class as an int64
  // scalar. Decoding errors are IoErrors naming the file.
  Example get(int64_t index) const override;
  // The decoded image without the transform.
  Tensor load(int64_t index) const;

  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  std::vector<int64_t> targets() const;

 private:
  std::string root_;
  transforms::TransformPtr transform_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<std::pair<std::string, int64_t>> samples_;
};

// A synthetic image folder: root/<class>/<i>.png for the classes circle, square, triangle and
// cross, each image a shape of random colour, size and position on a random background, drawn
// from `seed` (the same seed writes the same bytes). Writes atomically; creates root.
struct ShapesOptions {
  int64_t per_class = 16;
  int64_t size = 32;  // images are size x size, RGB
  uint64_t seed = 0;
  bool jpeg = false;  // .jpg (quality 95) instead of .png
};
// Returns the class names in order.
std::vector<std::string> write_shapes_folder(const std::string& root,
                                             const ShapesOptions& options = {});
// One shapes image ((size, size, 3) uint8) of class k (0 circle, 1 square, 2 triangle, 3 cross).
Tensor draw_shape(int64_t k, int64_t size, Generator& gen);

}  // namespace accel::data
