#include "data/idx.h"

#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/io.h"

namespace accel::data {

namespace {

constexpr uint8_t kUByte = 0x08, kSByte = 0x09, kShort = 0x0B, kInt = 0x0C, kFloat = 0x0D,
                  kDouble = 0x0E;

size_t idx_elem_size(uint8_t type) {
  switch (type) {
    case kUByte:
    case kSByte:
      return 1;
    case kShort:
      return 2;
    case kInt:
    case kFloat:
      return 4;
    case kDouble:
      return 8;
    default:
      return 0;
  }
}

const char* idx_type_name(uint8_t type) {
  switch (type) {
    case kUByte:
      return "ubyte";
    case kSByte:
      return "byte";
    case kShort:
      return "short";
    case kInt:
      return "int";
    case kFloat:
      return "float";
    case kDouble:
      return "double";
    default:
      return "unknown";
  }
}

std::string hex(uint32_t v, int digits) {
  std::ostringstream os;
  os << "0x" << std::hex;
  os.width(digits);
  os.fill('0');
  os << v;
  return os.str();
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

struct IdxFile {
  std::vector<uint8_t> bytes;
  uint8_t type = 0;
  Shape dims;
  size_t data_offset = 0;
  int64_t numel = 0;
  const uint8_t* data() const { return bytes.data() + data_offset; }
};

IdxFile parse_idx(const std::string& path) {
  IdxFile f;
  f.bytes = read_file_bytes(path);
  const size_t size = f.bytes.size();
  const uint8_t* b = f.bytes.data();
  ACCEL_CHECK(size >= 4, IoError, "idx", "'", path, "' is ", size,
              " bytes, too short for the 4-byte IDX magic");
  ACCEL_CHECK(b[0] == 0 && b[1] == 0, IoError, "idx", "'", path, "': bad magic ",
              hex(load_be32(b), 8), " (IDX files start with two zero bytes)");
  f.type = b[2];
  ACCEL_CHECK(idx_elem_size(f.type) != 0, IoError, "idx", "'", path, "': unknown element type ",
              hex(f.type, 2), " in magic ", hex(load_be32(b), 8));
  const int ndim = b[3];
  ACCEL_CHECK(ndim >= 1, IoError, "idx", "'", path, "': magic ", hex(load_be32(b), 8),
              " declares 0 dimensions");
  f.data_offset = 4 + 4 * size_t(ndim);
  ACCEL_CHECK(size >= f.data_offset, IoError, "idx", "'", path, "': truncated header: ", ndim,
              " dimensions need ", f.data_offset, " header bytes, file has ", size);
  // Limit the element count so a corrupt header cannot overflow the size arithmetic.
  constexpr int64_t kMaxElements = int64_t(1) << 48;
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    const int64_t n = int64_t(load_be32(b + 4 + 4 * d));
    f.dims.push_back(n);
    numel = (n == 0 || numel == 0) ? 0 : numel * n;
    ACCEL_CHECK(numel <= kMaxElements, IoError, "idx", "'", path, "': header dimensions ", f.dims,
                "... are implausibly large (corrupt header?)");
  }
  f.numel = numel;
  const size_t expected = size_t(numel) * idx_elem_size(f.type);
  const size_t payload = size - f.data_offset;
  ACCEL_CHECK(payload == expected, IoError, "idx", "'", path, "': header says ", f.dims, " ",
              idx_type_name(f.type), " = ", expected, " data bytes, file has ", payload,
              payload < expected ? " (truncated)" : " (trailing bytes)");
  return f;
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

Tensor read_idx(const std::string& path) {
  IdxFile f = parse_idx(path);
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

Tensor read_idx_images(const std::string& path, DType dtype) {
  ACCEL_CHECK(dtype == kUInt8 || dtype == kFloat32, DTypeError, "idx",
              "images load as uint8 or float32, not ", dtype);
  IdxFile f = parse_idx(path);
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

Tensor read_idx_labels(const std::string& path) {
  IdxFile f = parse_idx(path);
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
  Tensor images = read_idx_images(images_path, o.dtype);
  Tensor labels = read_idx_labels(labels_path);
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
