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

namespace accel::dist::ckpt {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "checkpoint";

// Per dimension, the global bounding interval of a region's box (a flat range lies inside it).
bool boxes_meet(const Region& a, const Region& b) {
  const auto& sa = a.segments();
  const auto& sb = b.segments();
  for (size_t d = 0; d < sa.size(); ++d) {
    if (sa[d].empty() || sb[d].empty()) return false;
    const int64_t alo = sa[d].front().global, ahi = sa[d].back().global + sa[d].back().length;
    const int64_t blo = sb[d].front().global, bhi = sb[d].back().global + sb[d].back().length;
    if (alo >= bhi || blo >= ahi) return false;
  }
  return true;
}

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

// Note [reading a region of a format-2 checkpoint]
// For each piece whose per-dimension bounding intervals meet the wanted region, its entry is
// checked against the data file (dtype, shape: so the runs walked are bounded by bytes that
// exist), then overlap() gives (src, dst, n) runs ascending in both orders. Coverage is checked
// first, on the runs alone: sorted by dst they must tile [0, want.numel()) (an element in no piece
// or in two is an IoError naming the tensor). Then each piece's needed bytes are read block by
// block (whole CRC blocks, each at most once, through one bounded buffer), checked, and copied to
// their place: straight into dst when it is a contiguous CPU tensor of the stored dtype, else into
// a CPU staging tensor of the stored dtype that dst then copies from (conversion and device
// transfer by copy_).
void Format2Source::read(const std::string& name, const Region& want, const Tensor& dst) {
  const TensorRecord& rec = tensor(name);
  ACCEL_CHECK(want.global_shape() == rec.shape, ShapeError, kOp, "tensor '", name, "' is ",
              shape_str(rec.shape), " in checkpoint '", dir_, "', the region read lies in ",
              shape_str(want.global_shape()));
  ACCEL_CHECK(dst.defined() && dst.is_contiguous() && dst.sizes() == want.local_shape(), ValueError,
              kOp, "reading '", name, "' needs a contiguous destination of ",
              shape_str(want.local_shape()), ", got ",
              dst.defined() ? dst.shape_str() : std::string("undefined"));
  struct Part {
    size_t piece;
    std::vector<Overlap> runs;
  };
  std::vector<Part> parts;
  struct Span {
    int64_t dst, n;
    size_t piece;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < rec.pieces.size(); ++i) {
    const PieceRecord& p = rec.pieces[i];
    if (p.region.numel() == 0 || want.numel() == 0 || !boxes_meet(p.region, want)) continue;
    // The entry first: its bytes in the file bound the runs overlap() walks (an index cannot
    // make the reader walk billions of runs of a piece that is not there).
    check_entry(name, rec, p);
    std::vector<Overlap> runs = overlap(p.region, want);
    if (runs.empty()) continue;
    for (const Overlap& o : runs) spans.push_back({o.dst, o.n, i});
    parts.push_back({i, std::move(runs)});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.dst < b.dst; });
  auto entry_of = [&](size_t i) {
    const PieceRecord& p = rec.pieces[i];
    return "'" + p.entry + "' in '" + index_.files[size_t(p.file)].name + "'";
  };
  int64_t at = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    const Span& s = spans[k];
    ACCEL_CHECK(s.dst >= at, IoError, kOp, "checkpoint '", dir_, "': tensor '", name,
                "': elements [", s.dst, ", ", std::min(at, s.dst + s.n), ") of the region read (",
                want.str(), ") are in two pieces (", entry_of(s.piece), " and ",
                entry_of(spans[k - 1].piece), ")");
    ACCEL_CHECK(s.dst == at, IoError, kOp, "checkpoint '", dir_, "': tensor '", name,
                "': elements [", at, ", ", s.dst, ") of the region read (", want.str(),
                ") are in no piece");
    at = s.dst + s.n;
  }
  ACCEL_CHECK(at == want.numel(), IoError, kOp, "checkpoint '", dir_, "': tensor '", name,
              "': elements [", at, ", ", want.numel(), ") of the region read (", want.str(),
              ") are in no piece");

  NoGradGuard ng;
  const uint64_t es = dtype_size(rec.dtype);
  const bool direct = dst.device().is_cpu() && dst.dtype() == rec.dtype;
  Tensor stage = direct ? dst : empty(want.local_shape(), TensorOptions(rec.dtype, kCPU));
  unsigned char* out = static_cast<unsigned char*>(stage.data_ptr());
  const uint64_t block = index_.crc_block_bytes;
  std::vector<unsigned char> buf;
  for (const Part& part : parts) {
    const PieceRecord& p = rec.pieces[part.piece];
    const io::SafetensorsFile& f = file(p.file);
    const uint64_t piece_bytes = uint64_t(p.region.numel()) * es;
    const uint32_t seed = piece_seed(name, rec.dtype, p.region);
    int64_t loaded = -1;  // the block in buf
    for (const Overlap& o : part.runs) {
      const uint64_t lo = uint64_t(o.src) * es, hi = uint64_t(o.src + o.n) * es;
      for (uint64_t b = lo / block; b * block < hi; ++b) {
        const uint64_t b0 = b * block, len = std::min(block, piece_bytes - b0);
        if (int64_t(b) != loaded) {
          buf.resize(size_t(len));
          f.read_bytes(p.entry, b0, len, buf.data());
          const uint32_t got = block_crc(seed, buf.data(), size_t(len));
          ACCEL_CHECK(got == p.crc[size_t(b)], IoError, kOp, "'", f.path(), "': tensor '", name,
                      "' piece '", p.entry, "' (", p.region.str(), "): block ", b, " (bytes [", b0,
                      ", ", b0 + len, ")) fails its CRC-32 (index ", p.crc[size_t(b)], ", data ",
                      got,
                      "): the piece's bytes, or its name, dtype or region in the index, changed "
                      "after saving");
          if (rec.dtype == kBool)
            for (uint64_t k = 0; k < len; ++k)
              ACCEL_CHECK(buf[size_t(k)] <= 1, IoError, kOp, "'", f.path(), "': BOOL piece '",
                          p.entry, "' holds byte ", int(buf[size_t(k)]));
          loaded = int64_t(b);
        }
        const uint64_t a = std::max(lo, b0), e = std::min(hi, b0 + len);
        std::memcpy(out + uint64_t(o.dst) * es + (a - lo), buf.data() + (a - b0), size_t(e - a));
      }
    }
  }
  if (!direct) {
    Tensor d = dst;  // a handle to the caller's storage
    d.copy_(stage);
  }
}

}  // namespace

std::unique_ptr<CheckpointSource> open_checkpoint(const std::string& dir) {
  return std::make_unique<Format2Source>(dir);
}

}  // namespace accel::dist::ckpt
