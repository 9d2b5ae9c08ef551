// fashion_folder: writes Fashion-MNIST as an image folder, a stand-in for the ImageNet folders
// and the cats-and-dogs folder that examples/imagenet and examples/transfer_learning read:
//
//   OUT/train/<class>/<i>.png   from the training images (the first --train-per-class of each)
//   OUT/val/<class>/<i>.png     from the test images     (the first --val-per-class of each)
//
// Each 28x28 grey image is resized to --size x --size (bilinear, antialias: torchvision's tensor
// Resize) and written as a grey PNG (ImageFolder decodes it to RGB, as torchvision's loader
// does). --classes picks classes by index (0 T-shirt_top ... 9 Ankle_boot), e.g. "8,9".
//
//   build/examples/fashion_folder OUT [--size 64] [--train-per-class 100] [--val-per-class 20]
//       [--classes 0,1,...]
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "examples/common.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  // Fashion-MNIST's class names, as folder names.
  const std::vector<std::string> names = {"T-shirt_top", "Trouser",   "Pullover", "Dress",
                                          "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                          "Bag",         "Ankle_boot"};
  std::string out, data_dir = data::kFashionMnistDir;
  int64_t size = 64, train_per_class = 100, val_per_class = 20;
  std::vector<int64_t> classes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  CLI::App app("Writes Fashion-MNIST as an image folder of PNGs (train/ and val/)",
               "fashion_folder");
  app.add_option("out", out, "output folder (created)")->required();
  app.add_option("--size", size, "side of the written images")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  app.add_option("--train-per-class", train_per_class, "training images per class (at most 6000)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(6000)));
  app.add_option("--val-per-class", val_per_class, "validation images per class (at most 1000)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1000)));
  app.add_option("--classes", classes, "class indices 0-9")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(0), int64_t(9)));
  app.add_option("--data-dir", data_dir, "Fashion-MNIST idx files")->capture_default_str();

  return run_example(app, argc, argv, [&] {
    data::MnistOptions mo;
    mo.dtype = kUInt8;
    int64_t written = 0;
    for (const char* split : {"train", "val"}) {
      const bool train = std::string(split) == "train";
      mo.train = train;
      const auto ds = data::load_mnist(data_dir, mo);
      const Tensor images = ds->tensors()[0];  // (N, 28, 28) uint8
      const std::vector<int64_t> labels = ds->tensors()[1].to_vector<int64_t>();
      for (int64_t k : classes) {
        const auto dir = std::filesystem::path(out) / split / names[size_t(k)];
        std::filesystem::create_directories(dir);
        const int64_t want = train ? train_per_class : val_per_class;
        int64_t n = 0;
        for (size_t i = 0; i < labels.size() && n < want; ++i) {
          if (labels[i] != k) continue;
          Tensor img = images[int64_t(i)];  // (28, 28)
          if (size != 28)
            img = data::transforms::resize(img, size, size,
                                           data::transforms::InterpolationMode::kBilinear, true);
          data::write_png(img, (dir / (std::to_string(n) + ".png")).string());
          ++n;
        }
        written += n;
      }
    }
    std::printf("wrote %lld images of %lldx%lld in %zu classes to %s/{train,val}\n",
                static_cast<long long>(written), static_cast<long long>(size),
                static_cast<long long>(size), classes.size(), out.c_str());
    return 0;
  });
}
