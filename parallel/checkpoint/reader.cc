#include "parallel/checkpoint/reader.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "io/safetensors.h"
#include "parallel/checkpoint/crc.h"
#include "parallel/checkpoint/read_pieces.h"

namespace accel::dist::ckpt {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "checkpoint";

class Format2Source final : public CheckpointSource {
 public:
  explicit Format2Source(std::string dir) : dir_(std::move(dir)) {
    // Note [format-2 checkpoints]: nothing in the folder is a folder or a link (a link could point
    // a reader anywhere; format 2 writes neither).
    file_io::Fd d = file_io::open_dir(dir_, /*create=*/false, kOp);
    for (const std::string& name : file_io::list_dir(d.get(), dir_, kOp)) {
      struct stat st {};
      ACCEL_CHECK(::fstatat(d.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0, IoError, kOp,
                  "cannot inspect '", path_of(name), "': ", std::strerror(errno));
      ACCEL_CHECK(!S_ISLNK(st.st_mode), IoError, kOp, "'", path_of(name),
                  "' is a symbolic link; a checkpoint holds none (refusing to follow it)");
      ACCEL_CHECK(!S_ISDIR(st.st_mode), IoError, kOp, "'", path_of(name),
                  "' is a folder; a format-2 checkpoint holds none");
    }
    const std::string index_path = path_of(kIndexFile);
    ACCEL_CHECK(std::filesystem::exists(std::filesystem::symlink_status(index_path)), IoError, kOp,
                "'", dir_, "' holds no ", kIndexFile, ": not a format-2 checkpoint");
    const std::string text =
        file_io::read_file(index_path, kOp, kMaxIndexBytes, file_io::Links::kRefuse);
    index_ = parse_index(text, "'" + index_path + "'");
    files_.resize(index_.files.size());
  }

  const json& meta() const override { return index_.meta; }
  bool contains(const std::string& name) const override { return index_.tensors.count(name) != 0; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [n, t] : index_.tensors) out.push_back(n);
    return out;
  }
  const TensorRecord& tensor(const std::string& name) const override {
    auto it = index_.tensors.find(name);
    ACCEL_CHECK(it != index_.tensors.end(), IoError, kOp, "checkpoint '", dir_,
                "' holds no tensor '", name, "'");
    return it->second;
  }
  void read(const std::string& name, const Region& want, const Tensor& dst) override;

 private:
  std::string path_of(const std::string& name) const {
    return (std::filesystem::path(dir_) / name).string();
  }
  // The data file, opened on first use (never through a link) and checked against its record.
  const io::SafetensorsFile& file(int64_t i) {
    auto& f = files_[size_t(i)];
    if (!f) {
      const FileRecord& rec = index_.files[size_t(i)];
      f = std::make_unique<io::SafetensorsFile>(path_of(rec.name), file_io::Links::kRefuse);
      ACCEL_CHECK(f->file_size() == rec.bytes, IoError, kOp, "'", f->path(), "' is ",
                  f->file_size(), " bytes, the index says ", rec.bytes,
                  " (truncated or replaced after saving)");
    }
    return *f;
  }

  // The piece's entry in its data file is what the index says it is.
  void check_entry(const std::string& name, const TensorRecord& rec, const PieceRecord& p) {
    const io::SafetensorsFile& f = file(p.file);
    const io::SafetensorsFile::Info& info = f.info(p.entry);
    ACCEL_CHECK(info.dtype == rec.dtype && info.shape == p.region.local_shape(), IoError, kOp, "'",
                f.path(), "': tensor '", name, "' piece '", p.entry, "' is ", info.dtype, " ",
                shape_str(info.shape), ", the index says ", rec.dtype, " ",
                shape_str(p.region.local_shape()));
  }

  std::string dir_;
  Index index_;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
};

// Note [reading a region of a checkpoint] in read_pieces.h; format 2 reads whole CRC blocks and
// checks each against the index (the CRC seeded with the piece's identity: Note [format-2
// checksums]).
void Format2Source::read(const std::string& name, const Region& want, const Tensor& dst) {
  const TensorRecord& rec = tensor(name);
  const PieceRecord* seeded = nullptr;  // the piece `seed` belongs to
  uint32_t seed = 0;
  detail::PieceAccess access;
  access.file = [&](const PieceRecord& p) -> const io::SafetensorsFile& {
    check_entry(name, rec, p);
    return file(p.file);
  };
  access.describe = [&](const PieceRecord& p) {
    return "'" + p.entry + "' in '" + index_.files[size_t(p.file)].name + "'";
  };
  access.window_bytes = index_.crc_block_bytes;
  access.check_window = [&](const PieceRecord& p, const io::SafetensorsFile& f, uint64_t b,
                            uint64_t b0, const unsigned char* bytes, uint64_t len) {
    if (seeded != &p) {
      seed = piece_seed(name, rec.dtype, p.region);
      seeded = &p;
    }
    const uint32_t got = block_crc(seed, bytes, size_t(len));
    ACCEL_CHECK(got == p.crc[size_t(b)], IoError, kOp, "'", f.path(), "': tensor '", name,
                "' piece '", p.entry, "' (", p.region.str(), "): block ", b, " (bytes [", b0, ", ",
                b0 + len, ")) fails its CRC-32 (index ", p.crc[size_t(b)], ", data ", got,
                "): the piece's bytes, or its name, dtype or region in the index, changed after "
                "saving");
  };
  detail::read_pieces(dir_, name, rec, want, dst, access);
}

}  // namespace

std::unique_ptr<CheckpointSource> open_checkpoint(const std::string& dir) {
  return std::make_unique<Format2Source>(dir);
}

}  // namespace accel::dist::ckpt
