#include "io/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/shape.h"

namespace accel::io::detail {

namespace {

using json = nlohmann::json;

constexpr const char* kLoad = "load_safetensors";
constexpr const char* kMetadataKey = "__metadata__";

std::optional<DType> dtype_from_name(const std::string& s) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    if (dtype_safetensors_name(t) == s) return t;
  }
  return std::nullopt;
}

// Names of safetensors dtypes accel cannot hold, so the error says "unsupported" rather than
// "unknown" for a valid file from another framework.
bool is_known_foreign_dtype(const std::string& s) {
  static const std::set<std::string> kForeign = {"I8",  "I16",     "U16",     "U32",
                                                 "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                                 "F4",  "F6_E2M3", "F6_E3M2", "C64"};
  return kForeign.count(s) > 0;
}

std::string shape_of(const std::vector<int64_t>& s) {
  Shape sh;
  for (int64_t v : s) sh.push_back(v);
  return shape_str(sh);
}

// Note [safetensors header as events]
// A document tree (json::parse) costs 15-50x the header size, and nested arrays made a 20 MB
// header cost ~1 GB before any check ran. The header is therefore read as SAX events against
// the schema it must follow, keeping only what the loader needs: entry names, dtypes, shapes,
// offsets and metadata strings. Nesting deeper than kSafetensorsMaxDepth and shapes longer than
// kSafetensorsMaxRank are rejected when they start, so memory stays a small multiple of the
// header size whatever its content.
class HeaderSax final : public json::json_sax_t {
 public:
  HeaderSax(const std::string& path, uint64_t buffer_size)
      : path_(path), buffer_size_(buffer_size) {}

  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  bool saw_root = false;

  bool null() override { return scalar("null", "null"); }
  bool boolean(bool v) override { return scalar("boolean", v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (top() == Kind::Shape) fail("' has a negative shape entry ", v);
    if (top() == Kind::Offsets) offsets_error(std::to_string(v));
    return scalar("number", std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (top() == Kind::Shape) {
      ACCEL_CHECK(entry_.shape.size() < kSafetensorsMaxRank, IoError, kLoad, "'", path_,
                  "': tensor '", entry_.name, "' has more than ", kSafetensorsMaxRank,
                  " dimensions");
      ACCEL_CHECK(v <= uint64_t(std::numeric_limits<int64_t>::max()), IoError, kLoad, "'", path_,
                  "': tensor '", entry_.name,
                  "' has a shape whose element count overflows: ", "dimension ", v);
      entry_.shape.push_back(int64_t(v));
      return true;
    }
    if (top() == Kind::Offsets) {
      if (offsets_seen_ >= 2) offsets_error(std::to_string(v));
      offsets_[offsets_seen_++] = v;
      return true;
    }
    return scalar("number", std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& s) override {
    if (top() == Kind::Shape) fail("' has a non-integer shape entry ", s);
    return scalar("number", s);
  }
  bool string(string_t& v) override {
    switch (top()) {
      case Kind::Metadata: metadata[key_] = v; return true;
      case Kind::Entry:
        if (key_ == "dtype") {
          dtype_ = v;
          has_dtype_ = true;
          return true;
        }
        break;
      default: break;
    }
    return scalar("string", json(v).dump());
  }
  bool binary(binary_t&) override { return scalar("binary", "<binary>"); }

  bool start_object(std::size_t) override {
    switch (top()) {
      case Kind::None: saw_root = true; return push(Kind::Root);
      case Kind::Root:
        if (key_ == kMetadataKey) return push(Kind::Metadata);
        entry_ = SafetensorsEntry{};
        entry_.name = key_;
        has_dtype_ = has_shape_ = has_offsets_ = false;
        return push(Kind::Entry);
      case Kind::Entry: entry_field_type_error("object"); return push(Kind::Skip);
      default: scalar("object", "{...}"); return push(Kind::Skip);
    }
  }
  bool start_array(std::size_t) override {
    switch (top()) {
      case Kind::Entry:
        if (key_ == "shape") {
          has_shape_ = true;
          return push(Kind::Shape);
        }
        if (key_ == "data_offsets") {
          has_offsets_ = true;
          offsets_seen_ = 0;
          return push(Kind::Offsets);
        }
        entry_field_type_error("array");  // dtype as an array
        return push(Kind::Skip);
      case Kind::None: ACCEL_THROW(IoError, kLoad, "'", path_, "': header is not a JSON object");
      default: scalar("array", "[...]"); return push(Kind::Skip);
    }
  }
  bool key(string_t& k) override {
    // Duplicate keys at any depth: nlohmann would keep the last silently.
    ACCEL_CHECK(frames_.back().keys.insert(k).second, IoError, kLoad, "'", path_,
                "': duplicate key '", k, "' in header");
    key_ = k;
    return true;
  }
  bool end_object() override {
    const Kind k = pop();
    if (k == Kind::Entry) finish_entry();
    return true;
  }
  bool end_array() override {
    const Kind k = pop();
    if (k == Kind::Offsets && offsets_seen_ != 2) offsets_error("[...]");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    ACCEL_THROW(IoError, kLoad, "'", path_, "': header is not valid JSON: ", e.what());
  }

 private:
  enum class Kind { None, Root, Metadata, Entry, Shape, Offsets, Skip };
  struct Frame {
    Kind kind;
    std::set<std::string> keys;  // objects only
    std::string key;             // the key whose value this frame is (restored on close)
  };

  Kind top() const { return frames_.empty() ? Kind::None : frames_.back().kind; }

  bool push(Kind k) {
    ACCEL_CHECK(int(frames_.size()) < kSafetensorsMaxDepth, IoError, kLoad, "'", path_,
                "': header JSON nests deeper than ", kSafetensorsMaxDepth,
                " levels (a safetensors header is 3 deep)");
    frames_.push_back(Frame{k, {}, key_});
    return true;
  }
  // Closes the innermost container; the current key becomes the one whose value it was.
  Kind pop() {
    const Kind k = frames_.back().kind;
    key_ = std::move(frames_.back().key);
    frames_.pop_back();
    return k;
  }

  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) {
    ACCEL_THROW(IoError, kLoad, "'", path_, "': tensor '", entry_.name,
                std::forward<Args>(args)...);
  }
  [[noreturn]] void offsets_error(const std::string& got) {
    fail("' data_offsets must be two non-negative integers [begin, end], got ", got);
  }
  void entry_field_type_error(const char* type) {
    if (key_ == "dtype") fail("' has no string 'dtype' (got ", type, ")");
    if (key_ == "shape") fail("' has no 'shape' array (got ", type, ")");
    if (key_ == "data_offsets") fail("' needs 'data_offsets' [begin, end] (got ", type, ")");
  }

  // A scalar (or the start of a container, `text` "{...}"/"[...]") in the current context.
  bool scalar(const char* type, const std::string& text) {
    switch (top()) {
      case Kind::None: ACCEL_THROW(IoError, kLoad, "'", path_, "': header is not a JSON object");
      case Kind::Root:
        if (key_ == kMetadataKey) {
          ACCEL_THROW(IoError, kLoad, "'", path_,
                      "': __metadata__ must be an object of strings, got ", type);
        }
        ACCEL_THROW(IoError, kLoad, "'", path_, "': entry '", key_, "' is not an object");
      case Kind::Metadata:
        ACCEL_THROW(IoError, kLoad, "'", path_, "': __metadata__ value of '", key_, "' is a ", type,
                    ", expected a string");
      case Kind::Entry: entry_field_type_error(type); return true;  // an unknown field: ignored
      case Kind::Shape: fail("' has a non-integer shape entry ", text);
      case Kind::Offsets: offsets_error(text);
      case Kind::Skip: return true;
    }
    return true;
  }

  void finish_entry() {
    SafetensorsEntry& e = entry_;
    const std::string& name = e.name;
    ACCEL_CHECK(has_dtype_, IoError, kLoad, "'", path_, "': tensor '", name,
                "' has no string 'dtype'");
    const std::optional<DType> dtype = dtype_from_name(dtype_);
    ACCEL_CHECK(dtype || !is_known_foreign_dtype(dtype_), IoError, kLoad, "'", path_, "': tensor '",
                name, "' has dtype ", dtype_, ", which accel does not support");
    ACCEL_CHECK(dtype.has_value(), IoError, kLoad, "'", path_, "': tensor '", name,
                "' has unknown dtype '", dtype_, "'");
    e.dtype = *dtype;
    ACCEL_CHECK(has_shape_, IoError, kLoad, "'", path_, "': tensor '", name,
                "' has no 'shape' array");
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t s : e.shape) overflow |= __builtin_mul_overflow(numel, uint64_t(s), &numel);
    // A zero dimension makes the tensor empty, however large the others.
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) overflow = false, numel = 0;
    ACCEL_CHECK(!overflow && numel <= uint64_t(std::numeric_limits<int64_t>::max()), IoError, kLoad,
                "'", path_, "': tensor '", name,
                "' has a shape whose element count overflows: ", shape_of(e.shape));
    uint64_t nbytes = 0;
    ACCEL_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes) &&
                    nbytes <= uint64_t(std::numeric_limits<int64_t>::max()),
                IoError, kLoad, "'", path_, "': tensor '", name, "' byte size overflows: shape ",
                shape_of(e.shape), " of ", dtype_);
    ACCEL_CHECK(has_offsets_, IoError, kLoad, "'", path_, "': tensor '", name,
                "' needs 'data_offsets' [begin, end]");
    e.begin = offsets_[0];
    e.end = offsets_[1];
    // Appended piecewise: "[" + std::string&& trips a GCC 12 -Wrestrict false positive.
    std::string offs = "[";
    offs += std::to_string(e.begin);
    offs += ", ";
    offs += std::to_string(e.end);
    offs += "]";
    ACCEL_CHECK(e.begin <= e.end, IoError, kLoad, "'", path_, "': tensor '", name,
                "' data_offsets ", offs, " end before they begin");
    ACCEL_CHECK(e.end <= buffer_size_, IoError, kLoad, "'", path_, "': tensor '", name,
                "' data_offsets ", offs, " point past the end of the file (buffer holds ",
                buffer_size_, " bytes)");
    ACCEL_CHECK(e.end - e.begin == nbytes, IoError, kLoad, "'", path_, "': tensor '", name,
                "' of shape ", shape_of(e.shape), " and dtype ", dtype_, " needs ", nbytes,
                " bytes but data_offsets ", offs, " span ", e.end - e.begin);
    entries.push_back(std::move(e));
  }

  const std::string& path_;
  const uint64_t buffer_size_;
  std::vector<Frame> frames_;
  std::string key_;
  // The entry being read.
  SafetensorsEntry entry_;
  std::string dtype_;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  uint64_t offsets_[2] = {0, 0};
  int offsets_seen_ = 0;
};

}  // namespace

uint64_t safetensors_header_length(const unsigned char* len_bytes, uint64_t file_size,
                                   const std::string& path) {
  uint64_t header_len = 0;
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i) {
    header_len |= uint64_t(len_bytes[i]) << (8 * i);
  }
  ACCEL_CHECK(header_len <= kMaxHeaderBytes, IoError, kLoad, "'", path, "': header length ",
              header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  ACCEL_CHECK(header_len <= file_size - kSafetensorsLengthBytes, IoError, kLoad, "'", path,
              "': header length ", header_len, " exceeds the ", file_size - kSafetensorsLengthBytes,
              " bytes that follow the length field (truncated file?)");
  ACCEL_CHECK(header_len >= 2, IoError, kLoad, "'", path, "': header length ", header_len,
              " is too short for a JSON object");
  return header_len;
}

std::vector<SafetensorsEntry> parse_safetensors_header(
    std::string_view header, uint64_t buffer_size, const std::string& path,
    std::map<std::string, std::string>* metadata) {
  ACCEL_CHECK(!header.empty() && header[0] == '{', IoError, kLoad, "'", path,
              "': header does not start with '{' (not a JSON object)");
  HeaderSax sax(path, buffer_size);
  // nlohmann's lexer rejects ill-formed UTF-8; parse_error() turns that into an IoError.
  const bool ok = json::sax_parse(header.begin(), header.end(), &sax);
  ACCEL_CHECK(ok && sax.saw_root, IoError, kLoad, "'", path, "': header is not valid JSON");
  std::vector<SafetensorsEntry>& entries = sax.entries;

  // The entries must tile the buffer exactly.
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    ACCEL_CHECK(e.begin >= pos, IoError, kLoad, "'", path, "': tensors '", prev ? prev->name : "",
                "' [", prev ? prev->begin : 0, ", ", pos, ") and '", e.name, "' [", e.begin, ", ",
                e.end, ") overlap");
    ACCEL_CHECK(e.begin == pos, IoError, kLoad, "'", path, "': gap of ", e.begin - pos,
                " bytes in the buffer before tensor '", e.name, "' (offset ", pos, ")");
    pos = e.end;
    prev = &e;
  }
  ACCEL_CHECK(pos == buffer_size, IoError, kLoad, "'", path, "': ", buffer_size - pos,
              " bytes after the last tensor are not described by the header (trailing data)");
  if (metadata) {
    for (auto& [k, v] : sax.metadata) (*metadata)[k] = std::move(v);
  }
  return std::move(entries);
}

}  // namespace accel::io::detail
