// IDX files (MNIST, Fashion-MNIST, EMNIST): big-endian header "0 0 <type> <ndim>", ndim uint32
// sizes, then the elements, big-endian. gzip-compressed files are read transparently.
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"
#include "data/dataset.h"
#include "data/idx_parse.h"

namespace accel::data {

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct IdxOptions {
  // The most data bytes a file may declare (and a gzip file inflate to): a header declaring more
  // is an IoError before anything is inflated or allocated.
  size_t max_bytes = kIdxDefaultMaxBytes;
};

// Any IDX file, in its natural dtype: ubyte -> uint8; byte, short, int -> int32; float ->
// float32; double -> float64. IoError naming the file for a bad magic, unknown type, truncated
// header, a data size that does not match the header's shape or exceeds options.max_bytes.
Tensor read_idx(const std::string& path, IdxOptions options = {});

// Unsigned-byte images (N, H, W): dtype uint8 as stored, or float32 scaled to [0, 1].
Tensor read_idx_images(const std::string& path, DType dtype = kFloat32, IdxOptions options = {});
// Unsigned-byte labels (N) as int64.
Tensor read_idx_labels(const std::string& path, IdxOptions options = {});

struct MnistOptions {
  bool train = true;                       // train-* (60000) or t10k-* (10000)
  DType dtype = kFloat32;                  // uint8, or float32 in [0, 1]
  bool flatten = false;                    // images (N, H*W) for an MLP
  bool channel = false;                    // images (N, 1, H, W) for a CNN (ignored when flatten)
  size_t max_bytes = kIdxDefaultMaxBytes;  // per file, as IdxOptions::max_bytes
};

// TensorDataset with fields ("image", "label") from <dir>/{train,t10k}-{images-idx3,labels-idx1}
// -ubyte[.gz]. IoError when files are missing or images and labels disagree in count.
std::shared_ptr<TensorDataset> load_mnist(const std::string& dir = kFashionMnistDir,
                                          MnistOptions options = {});

}  // namespace accel::data
