// Fuzz target: the format-2 checkpoint index parser (parse_index, Note [format-2 index
// validation] in parallel/checkpoint/index.cc), run on arbitrary bytes as open_checkpoint runs it
// on index.json. IoError is the documented failure. Byte 0 odd: the rest is JSON whose
// index_crc32 is first set to its true value, so mutations reach the checks behind the CRC; even:
// the rest as it is. An index that passes must satisfy what the reader indexes and divides by,
// and survive index_to_text -> parse_index unchanged.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/checkpoint/crc.h"
#include "parallel/checkpoint/index.h"

namespace {

using json = nlohmann::json;
using namespace accel::dist::ckpt;

void check(const Index& idx) {
  if (idx.crc_block_bytes < 1 || idx.crc_block_bytes > kMaxCrcBlockBytes) std::abort();
  for (const auto& [name, t] : idx.tensors) {
    int64_t held = 0;
    for (const PieceRecord& p : t.pieces) {
      if (p.file < 0 || size_t(p.file) >= idx.files.size()) std::abort();
      if (p.region.global_shape() != t.shape) std::abort();
      const uint64_t bytes = uint64_t(p.region.numel()) * accel::dtype_size(t.dtype);
      if (p.crc.size() != block_count(bytes, idx.crc_block_bytes)) std::abort();
      held += p.region.numel();
      // Every run of the region lies inside the piece and the tensor (small pieces: the reader
      // first checks a piece against its data file, which bounds the runs it walks).
      if (p.region.numel() > (int64_t(1) << 16)) continue;
      int64_t at = 0;
      const int64_t numel = accel::shape_numel(t.shape);
      p.region.for_each_run([&](const accel::dist::Run& r) {
        if (r.local != at || r.n <= 0 || r.global < 0 || r.global + r.n > numel) std::abort();
        at += r.n;
      });
      if (at != p.region.numel()) std::abort();
    }
    if (held != accel::shape_numel(t.shape)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return 0;
    j.erase("index_crc32");
    try {
      j["index_crc32"] = text_crc(j.dump());
      text = j.dump();
    } catch (const json::exception&) {
      return 0;
    }
  }
  Index idx;
  try {
    idx = parse_index(text, "<fuzz>");
  } catch (const accel::IoError&) {
    return 0;
  }
  check(idx);
  // What parses is written back to the same index.
  const std::string again = index_to_text(idx);
  const Index idx2 = parse_index(again, "<fuzz again>");
  if (index_to_text(idx2) != again || idx2.tensors.size() != idx.tensors.size()) std::abort();
  return 0;
}
