#include "data/idx.h"

#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/idx_parse.h"
#include "data/io.h"

namespace accel::data {

namespace {

constexpr uint8_t kUByte = kIdxUByte, kSByte = kIdxSByte, kShort = kIdxShort, kInt = kIdxInt,
                  kFloat = kIdxFloat, kDouble = kIdxDouble;

std::string hex(uint32_t v, int digits) { return idx_hex(v, digits); }

// Compressed bytes in (a file larger than any IDX file within the limit is refused before it is
// read); parse_idx_bytes inflates only what the header declares, within the limit.
IdxData parse_idx(const std::string& path, const IdxOptions& o) {
  constexpr size_t kMaxHeader = 4 + 4 * 255;
  const size_t cap = o.max_bytes > kNoSizeLimit - kMaxHeader
                         ? kNoSizeLimit
                         : gzip_file_cap(o.max_bytes + kMaxHeader);
  return parse_idx_bytes(read_file_bytes(path, /*decompress_gzip=*/false, cap), path, o.max_bytes);
}

template <typename T, typename Raw>
void decode_be(const uint8_t* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint8_t tmp[sizeof(Raw)];
    for (size_t k = 0; k < sizeof(Raw); ++k)
      tmp[k] = src[size_t(i) * sizeof(Raw) + sizeof(Raw) - 1 - k];
    Raw r;
    std::memcpy(&r, tmp, sizeof(Raw));
    dst[i] = T(r);
  }
}

}  // namespace

Tensor read_idx(const std::string& path, IdxOptions options) {
  IdxData f = parse_idx(path, options);
  const uint8_t* src = f.data();
  const int64_t n = f.numel;
  Tensor t;
  switch (f.type) {
    case kUByte:
      t = empty(f.dims, kUInt8);
      if (n) std::memcpy(t.data_ptr(), src, size_t(n));
      break;
    case kSByte:
      t = empty(f.dims, kInt32);
      decode_be<int32_t, int8_t>(src, n, t.data<int32_t>());
      break;
    case kShort:
      t = empty(f.dims, kInt32);
      decode_be<int32_t, int16_t>(src, n, t.data<int32_t>());
      break;
    case kInt:
      t = empty(f.dims, kInt32);
      decode_be<int32_t, int32_t>(src, n, t.data<int32_t>());
      break;
    case kFloat:
      t = empty(f.dims, kFloat32);
      decode_be<float, float>(src, n, t.data<float>());
      break;
    case kDouble:
      t = empty(f.dims, kFloat64);
      decode_be<double, double>(src, n, t.data<double>());
      break;
  }
  return t;
}

Tensor read_idx_images(const std::string& path, DType dtype, IdxOptions options) {
  ACCEL_CHECK(dtype == kUInt8 || dtype == kFloat32, DTypeError, "idx",
              "images load as uint8 or float32, not ", dtype);
  IdxData f = parse_idx(path, options);
  ACCEL_CHECK(f.type == kUByte, IoError, "idx", "'", path, "': images must be ubyte (type 0x08), ",
              "file has ", idx_type_name(f.type), " (", hex(f.type, 2), ")");
  ACCEL_CHECK(f.dims.size() == 3, IoError, "idx", "'", path,
              "': images must have 3 dimensions (N, H, W), header has ", f.dims);
  Tensor t = empty(f.dims, dtype);
  const uint8_t* src = f.data();
  if (dtype == kUInt8) {
    if (f.numel) std::memcpy(t.data_ptr(), src, size_t(f.numel));
  } else {
    float* dst = t.data<float>();
    constexpr float kScale = 1.0f / 255.0f;
    for (int64_t i = 0; i < f.numel; ++i) dst[i] = float(src[i]) * kScale;
  }
  return t;
}

Tensor read_idx_labels(const std::string& path, IdxOptions options) {
  IdxData f = parse_idx(path, options);
  ACCEL_CHECK(f.type == kUByte, IoError, "idx", "'", path, "': labels must be ubyte (type 0x08), ",
              "file has ", idx_type_name(f.type), " (", hex(f.type, 2), ")");
  ACCEL_CHECK(f.dims.size() == 1, IoError, "idx", "'", path,
              "': labels must have 1 dimension (N), header has ", f.dims);
  Tensor t = empty(f.dims, kInt64);
  int64_t* dst = t.data<int64_t>();
  const uint8_t* src = f.data();
  for (int64_t i = 0; i < f.numel; ++i) dst[i] = src[i];
  return t;
}

namespace {
// "<dir>/<stem>.gz" when present, else "<dir>/<stem>"; IoError listing both when neither is.
std::string find_idx_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  ACCEL_THROW(IoError, "mnist", "neither '", gz.string(), "' nor '", plain.string(),
              "' exists (Fashion-MNIST comes from the Debian package dataset-fashion-mnist)");
}
}  // namespace

std::shared_ptr<TensorDataset> load_mnist(const std::string& dir, MnistOptions o) {
  const std::string split = o.train ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, split + "-labels-idx1-ubyte");
  Tensor images = read_idx_images(images_path, o.dtype, {o.max_bytes});
  Tensor labels = read_idx_labels(labels_path, {o.max_bytes});
  ACCEL_CHECK(images.size(0) == labels.size(0), IoError, "mnist", "'", images_path, "' has ",
              images.size(0), " images but '", labels_path, "' has ", labels.size(0), " labels");
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2);
  if (o.flatten) {
    images = images.view({n, h * w});
  } else if (o.channel) {
    images = images.view({n, 1, h, w});
  }
  return std::make_shared<TensorDataset>(std::vector<Tensor>{images, labels},
                                         std::vector<std::string>{"image", "label"});
}

}  // namespace accel::data
