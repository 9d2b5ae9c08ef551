#include "data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/file_io.h"

namespace accel::data {

namespace {

constexpr const char* kOp = "ImageFolder";

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool has_extension(const std::string& name, const std::vector<std::string>& exts) {
  const std::string n = lower(name);
  for (const std::string& e : exts) {
    const std::string le = lower(e);
    if (n.size() > le.size() && n.compare(n.size() - le.size(), le.size(), le) == 0) return true;
  }
  return false;
}

using DirId = std::pair<dev_t, ino_t>;

DirId dir_id(int fd, const std::string& shown) {
  struct stat st;
  ACCEL_CHECK(::fstat(fd, &st) == 0, IoError, kOp, "cannot stat the folder '", shown,
              "': ", std::strerror(errno));
  return {st.st_dev, st.st_ino};
}

// One folder of the walk: its path and its image files, sorted.
struct WalkDir {
  std::string path;
  std::vector<std::string> files;
};

// Note [ImageFolder scan]. `seen` holds the folders already walked (links may lead back).
void walk(const std::string& path, const ImageFolderOptions& o, int depth, std::set<DirId>& seen,
          std::vector<WalkDir>& out) {
  ACCEL_CHECK(depth <= o.max_depth, IoError, kOp, "folder '", path, "' is nested more than ",
              o.max_depth, " levels below its class folder (ImageFolderOptions::max_depth)");
  file_io::Fd dir = file_io::open_dir(path, /*create=*/false, kOp);
  if (!seen.insert(dir_id(dir.get(), path)).second) return;
  std::vector<std::string> names = file_io::list_dir(dir.get(), path, kOp);
  std::sort(names.begin(), names.end());
  WalkDir here{path, {}};
  std::vector<std::string> subdirs;
  for (const std::string& n : names) {
    struct stat st;
    const std::string full = path + "/" + n;
    const bool image = has_extension(n, o.extensions);
    if (::fstatat(dir.get(), n.c_str(), &st, 0) != 0) {
      // A dangling link, or removed since the listing.
      ACCEL_CHECK(!image, IoError, kOp, "cannot stat '", full, "': ", std::strerror(errno));
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      subdirs.push_back(full);
    } else if (image) {
      ACCEL_CHECK(S_ISREG(st.st_mode), IoError, kOp, "'", full, "' is ",
                  file_io::file_kind(st.st_mode), ", not a regular image file");
      here.files.push_back(full);
    }
  }
  out.push_back(std::move(here));
  for (const std::string& s : subdirs) walk(s, o, depth + 1, seen, out);
}

}  // namespace

ImageFolder::ImageFolder(std::string root, transforms::AnyTransform transform,
                         ImageFolderOptions options)
    : root_(std::move(root)), transform_(transform.ptr()), options_(std::move(options)) {
  ACCEL_CHECK(!root_.empty(), ValueError, kOp, "root is empty");
  ACCEL_CHECK(!options_.extensions.empty(), ValueError, kOp, "no extensions given");
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  file_io::Fd dir = file_io::open_dir(root_, /*create=*/false, kOp);
  std::vector<std::string> names = file_io::list_dir(dir.get(), root_, kOp);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    struct stat st;
    if (::fstatat(dir.get(), n.c_str(), &st, 0) == 0 && S_ISDIR(st.st_mode)) classes_.push_back(n);
  }
  ACCEL_CHECK(!classes_.empty(), IoError, kOp, "found no class folder in '", root_, "'");
  std::vector<std::string> empty_classes;
  for (size_t c = 0; c < classes_.size(); ++c) {
    class_to_idx_[classes_[c]] = int64_t(c);
    std::set<DirId> seen;  // per class: two class links to one folder both list it
    std::vector<WalkDir> dirs;
    walk(root_ + "/" + classes_[c], options_, 0, seen, dirs);
    // torchvision: sorted(os.walk(...)) orders the folders by path.
    std::sort(dirs.begin(), dirs.end(),
              [](const WalkDir& a, const WalkDir& b) { return a.path < b.path; });
    const size_t before = samples_.size();
    for (const WalkDir& d : dirs)
      for (const std::string& f : d.files) samples_.emplace_back(f, int64_t(c));
    if (samples_.size() == before) empty_classes.push_back(classes_[c]);
  }
  if (!empty_classes.empty() && !options_.allow_empty) {
    std::string list, exts;
    for (const auto& c : empty_classes) list += (list.empty() ? "" : ", ") + c;
    for (const auto& e : options_.extensions) exts += (exts.empty() ? "" : ", ") + e;
    ACCEL_THROW(IoError, kOp, "found no valid file for the classes ", list, " in '", root_,
                "'; supported extensions are ", exts);
  }
}

Tensor ImageFolder::load(int64_t index) const {
  ACCEL_CHECK(index >= 0 && index < size(), IndexError, kOp, "index ", index, " out of range for ",
              size(), " images");
  return read_image(samples_[size_t(index)].first, options_.image);
}

Example ImageFolder::get(int64_t index) const {
  Tensor img = load(index);
  if (transform_) {
    Generator gen = sample_generator();
    img = transform_->apply(img, gen);
  }
  return Example({img, scalar_tensor(samples_[size_t(index)].second, TensorOptions(kInt64))},
                 {"image", "label"});
}

std::vector<int64_t> ImageFolder::targets() const {
  std::vector<int64_t> t;
  t.reserve(samples_.size());
  for (const auto& s : samples_) t.push_back(s.second);
  return t;
}

// ---- synthetic shapes ----

Tensor draw_shape(int64_t k, int64_t size, Generator& gen) {
  ACCEL_CHECK(k >= 0 && k < 4, ValueError, "draw_shape", "class must be 0..3, got ", k);
  ACCEL_CHECK(size >= 8, ValueError, "draw_shape", "size must be >= 8, got ", size);
  auto u8 = [&] { return uint8_t(gen.next_u64() & 0xff); };
  uint8_t bg[3], fg[3];
  for (auto& v : bg) v = uint8_t(u8() / 4);        // dark background
  for (auto& v : fg) v = uint8_t(128 + u8() / 2);  // bright shape
  const double s = double(size);
  const double r = s * (0.2 + 0.15 * gen.next_double());  // half extent
  const double cx = r + (s - 2 * r) * gen.next_double();
  const double cy = r + (s - 2 * r) * gen.next_double();
  Tensor img = empty({size, size, 3}, kUInt8);
  uint8_t* p = img.data<uint8_t>();
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const double dx = double(x) + 0.5 - cx, dy = double(y) + 0.5 - cy;
      bool in = false;
      switch (k) {
        case 0: in = dx * dx + dy * dy <= r * r; break;
        case 1: in = std::abs(dx) <= r * 0.8 && std::abs(dy) <= r * 0.8; break;
        case 2:  // apex up: |dx| <= (dy + r) / 2 within the box
          in = dy >= -r && dy <= r && std::abs(dx) <= (dy + r) / 2;
          break;
        default:
          in = (std::abs(dx) <= r * 0.25 && std::abs(dy) <= r) ||
               (std::abs(dy) <= r * 0.25 && std::abs(dx) <= r);
      }
      for (int c = 0; c < 3; ++c) p[(y * size + x) * 3 + c] = in ? fg[c] : bg[c];
    }
  return img;
}

std::vector<std::string> write_shapes_folder(const std::string& root, const ShapesOptions& o) {
  ACCEL_CHECK(o.per_class >= 1, ValueError, "write_shapes_folder", "per_class must be >= 1, got ",
              o.per_class);
  const std::vector<std::string> classes{"circle", "square", "triangle", "cross"};
  for (size_t k = 0; k < classes.size(); ++k) {
    const std::string dir = root + "/" + classes[k];
    file_io::open_dir(dir, /*create=*/true, "write_shapes_folder");
    for (int64_t i = 0; i < o.per_class; ++i) {
      Generator gen(mix_seed(mix_seed(o.seed, k), uint64_t(i)));
      Tensor img = draw_shape(int64_t(k), o.size, gen);
      char name[32];
      std::snprintf(name, sizeof name, "%04lld.%s", static_cast<long long>(i),
                    o.jpeg ? "jpg" : "png");
      if (o.jpeg) {
        write_jpeg(img, dir + "/" + name, 95);
      } else {
        write_png(img, dir + "/" + name);
      }
    }
  }
  return classes;
}

}  // namespace accel::data
