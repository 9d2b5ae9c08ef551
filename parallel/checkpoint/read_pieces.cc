#include "parallel/checkpoint/read_pieces.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace accel::dist::ckpt::detail {

namespace {

constexpr const char* kOp = "checkpoint";

// Per dimension, the global bounding intervals of the regions' boxes meet (a flat range lies
// inside its box).
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

}  // namespace

void read_pieces(const std::string& dir, const std::string& name, const TensorRecord& rec,
                 const Region& want, const Tensor& dst, const PieceAccess& access) {
  ACCEL_CHECK(want.global_shape() == rec.shape, ShapeError, kOp, "tensor '", name, "' is ",
              shape_str(rec.shape), " in checkpoint '", dir, "', the region read lies in ",
              shape_str(want.global_shape()));
  ACCEL_CHECK(dst.defined() && dst.is_contiguous() && dst.sizes() == want.local_shape(), ValueError,
              kOp, "reading '", name, "' needs a contiguous destination of ",
              shape_str(want.local_shape()), ", got ",
              dst.defined() ? dst.shape_str() : std::string("undefined"));
  struct Part {
    const PieceRecord* piece;
    const io::SafetensorsFile* file;
    std::vector<Overlap> runs;
  };
  std::vector<Part> parts;
  struct Span {
    int64_t dst, n;
    const PieceRecord* piece;
  };
  std::vector<Span> spans;
  for (const PieceRecord& p : rec.pieces) {
    if (p.region.numel() == 0 || want.numel() == 0 || !boxes_meet(p.region, want)) continue;
    const io::SafetensorsFile& f = access.file(p);  // the entry first: it bounds the runs
    std::vector<Overlap> runs = overlap(p.region, want);
    if (runs.empty()) continue;
    for (const Overlap& o : runs) spans.push_back({o.dst, o.n, &p});
    parts.push_back({&p, &f, std::move(runs)});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.dst < b.dst; });
  int64_t at = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    const Span& s = spans[k];
    ACCEL_CHECK(s.dst >= at, IoError, kOp, "checkpoint '", dir, "': tensor '", name,
                "': elements [", s.dst, ", ", std::min(at, s.dst + s.n), ") of the region read (",
                want.str(), ") are in two pieces (", access.describe(*s.piece), " and ",
                access.describe(*spans[k - 1].piece), ")");
    ACCEL_CHECK(s.dst == at, IoError, kOp, "checkpoint '", dir, "': tensor '", name,
                "': elements [", at, ", ", s.dst, ") of the region read (", want.str(),
                ") are in no piece");
    at = s.dst + s.n;
  }
  ACCEL_CHECK(at == want.numel(), IoError, kOp, "checkpoint '", dir, "': tensor '", name,
              "': elements [", at, ", ", want.numel(), ") of the region read (", want.str(),
              ") are in no piece");

  NoGradGuard ng;
  const uint64_t es = dtype_size(rec.dtype);
  const bool direct = dst.device().is_cpu() && dst.dtype() == rec.dtype;
  Tensor stage = direct ? dst : empty(want.local_shape(), TensorOptions(rec.dtype, kCPU));
  unsigned char* out = static_cast<unsigned char*>(stage.data_ptr());
  const uint64_t window = access.window_bytes;
  std::vector<unsigned char> buf;
  for (const Part& part : parts) {
    const PieceRecord& p = *part.piece;
    const io::SafetensorsFile& f = *part.file;
    const uint64_t piece_bytes = uint64_t(p.region.numel()) * es;
    const uint64_t base = access.entry_offset ? access.entry_offset(p) : 0;
    int64_t loaded = -1;  // the window in buf
    for (const Overlap& o : part.runs) {
      const uint64_t lo = uint64_t(o.src) * es, hi = uint64_t(o.src + o.n) * es;
      for (uint64_t w = lo / window; w * window < hi; ++w) {
        const uint64_t w0 = w * window, len = std::min(window, piece_bytes - w0);
        if (int64_t(w) != loaded) {
          buf.resize(size_t(len));
          f.read_bytes(p.entry, base + w0, len, buf.data());
          if (access.check_window) access.check_window(p, f, w, w0, buf.data(), len);
          if (rec.dtype == kBool)
            for (uint64_t k = 0; k < len; ++k)
              ACCEL_CHECK(buf[size_t(k)] <= 1, IoError, kOp, "'", f.path(), "': BOOL piece '",
                          p.entry, "' holds byte ", int(buf[size_t(k)]));
          loaded = int64_t(w);
        }
        const uint64_t a = std::max(lo, w0), e = std::min(hi, w0 + len);
        std::memcpy(out + uint64_t(o.dst) * es + (a - lo), buf.data() + (a - w0), size_t(e - a));
      }
    }
  }
  if (!direct) {
    Tensor d = dst;  // a handle to the caller's storage
    d.copy_(stage);
  }
}

}  // namespace accel::dist::ckpt::detail
