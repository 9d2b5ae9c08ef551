#include "parallel/checkpoint/index.h"

#include <algorithm>
#include <limits>
#include <set>

#include "core/error.h"
#include "parallel/checkpoint/crc.h"

namespace accel::dist::ckpt {

namespace {

using json = nlohmann::json;

constexpr const char* kOp = "checkpoint";
// Top-level keys the index owns; the facade's meta may use any other.
constexpr const char* kReserved[] = {"format", "crc_block_bytes", "files", "tensors",
                                     "index_crc32"};

bool dtype_from_name(const std::string& s, DType* out) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    if (dtype_safetensors_name(t) == s) {
      *out = t;
      return true;
    }
  }
  return false;
}

// A non-negative integer of the JSON, IoError naming `what` otherwise.
uint64_t as_count(const json& v, const std::string& where, const std::string& what) {
  ACCEL_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), IoError,
              kOp, where, ": ", what, " is not a non-negative integer");
  return v.get<uint64_t>();
}

std::string piece_where(const std::string& where, const std::string& name, size_t i, const json& p,
                        const std::vector<FileRecord>& files) {
  std::string s = where + ": tensor '" + name + "' piece " + std::to_string(i);
  if (p.is_object() && p.contains("entry") && p["entry"].is_string())
    s += " ('" + p["entry"].get<std::string>() + "'";
  else
    s += " (no entry";
  if (p.is_object() && p.contains("file") && p["file"].is_number_unsigned() &&
      p["file"].get<uint64_t>() < files.size())
    s += " in '" + files[p["file"].get<size_t>()].name + "'";
  return s + ")";
}

}  // namespace

std::string data_file_name(int rank) { return "data_rank" + std::to_string(rank) + ".safetensors"; }

std::string piece_entry_name(const std::string& name, int rank) {
  return name + "@r" + std::to_string(rank);
}

json tensor_to_json(const TensorRecord& t) {
  json shape = json::array();
  for (int64_t s : t.shape) shape.push_back(s);
  json pieces = json::array();
  for (const PieceRecord& p : t.pieces)
    pieces.push_back(
        {{"file", p.file}, {"entry", p.entry}, {"region", p.region.to_json()}, {"crc", p.crc}});
  json j = {{"dtype", std::string(dtype_safetensors_name(t.dtype))},
            {"shape", std::move(shape)},
            {"pieces", std::move(pieces)}};
  if (!t.layout.empty()) j["layout"] = t.layout;
  return j;
}

// Note [format-2 index validation]
// The index comes from disk, so everything a reader sizes, indexes or divides by is checked
// before use, and each failure is an IoError naming the index, the tensor and the piece:
//   * the text is at most kMaxIndexBytes, a JSON object with format 2, index_crc32 equal to the
//     CRC of its compact text without that field (a truncated or hand-edited index), a
//     crc_block_bytes in [1, kMaxCrcBlockBytes];
//   * files: plain names (no '/', not "." / ".." / index.json), each once, with their sizes;
//   * per tensor: a known dtype, a shape of at most kMaxRank dimensions whose element and byte
//     counts fit in 62 bits; per piece an existing file index, an entry name (each (file, entry)
//     once in the index), a region inside the shape (Region::from_json) and exactly one CRC per
//     block of its bytes;
//   * the pieces' element counts add up to the tensor's (a missing or extra piece). Which
//     elements each piece holds is checked exactly when a region is read (reader.cc): an element
//     in no piece or in two is an IoError there.
TensorRecord tensor_from_json(const json& j, const std::string& name,
                              const std::vector<FileRecord>& files, uint64_t block_bytes,
                              const std::string& where) {
  const size_t nfiles = files.size();
  const std::string tw = where + ": tensor '" + name + "'";
  ACCEL_CHECK(!name.empty(), IoError, kOp, where, ": a tensor with an empty name");
  ACCEL_CHECK(j.is_object(), IoError, kOp, tw, " is not an object");
  TensorRecord t;
  ACCEL_CHECK(j.contains("dtype") && j["dtype"].is_string() &&
                  dtype_from_name(j["dtype"].get<std::string>(), &t.dtype),
              IoError, kOp, tw,
              " has no known \"dtype\" (F32, F64, F16, BF16, I32, I64, U8, BOOL)");
  ACCEL_CHECK(j.contains("shape") && j["shape"].is_array() && j["shape"].size() <= kMaxRank,
              IoError, kOp, tw, " has no \"shape\" list of at most ", kMaxRank, " sizes");
  constexpr uint64_t kMaxBytes = uint64_t(1) << 62;
  uint64_t numel = 1;
  for (const json& s : j["shape"]) {
    const uint64_t d = as_count(s, tw, "a size of \"shape\"");
    ACCEL_CHECK(d == 0 || numel <= kMaxBytes / d, IoError, kOp, tw, " has a shape too large");
    numel *= d;
    t.shape.push_back(int64_t(d));
  }
  ACCEL_CHECK(numel <= kMaxBytes / dtype_size(t.dtype), IoError, kOp, tw, " has a shape too large");
  if (j.contains("layout")) {
    ACCEL_CHECK(j["layout"].is_string(), IoError, kOp, tw, ": \"layout\" is not a string");
    t.layout = j["layout"].get<std::string>();
  }
  ACCEL_CHECK(j.contains("pieces") && j["pieces"].is_array(), IoError, kOp, tw,
              " has no \"pieces\" list");
  const auto& pieces = j["pieces"];
  for (size_t i = 0; i < pieces.size(); ++i) {
    const json& p = pieces[i];
    const std::string pw = piece_where(where, name, i, p, files);
    ACCEL_CHECK(p.is_object(), IoError, kOp, pw, " is not an object");
    PieceRecord r;
    ACCEL_CHECK(p.contains("file"), IoError, kOp, pw, " has no \"file\"");
    const uint64_t file = as_count(p["file"], pw, "\"file\"");
    ACCEL_CHECK(file < nfiles, IoError, kOp, pw, " names file ", file, " of ", nfiles);
    r.file = int64_t(file);
    ACCEL_CHECK(
        p.contains("entry") && p["entry"].is_string() && !p["entry"].get<std::string>().empty(),
        IoError, kOp, pw, " has no \"entry\" name");
    r.entry = p["entry"].get<std::string>();
    ACCEL_CHECK(p.contains("region"), IoError, kOp, pw, " has no \"region\"");
    r.region = Region::from_json(p["region"], t.shape, pw);
    ACCEL_CHECK(p.contains("crc") && p["crc"].is_array(), IoError, kOp, pw, " has no \"crc\" list");
    const uint64_t bytes = uint64_t(r.region.numel()) * dtype_size(t.dtype);
    const uint64_t blocks = block_count(bytes, block_bytes);
    ACCEL_CHECK(p["crc"].size() == blocks, IoError, kOp, pw, " has ", p["crc"].size(), " CRCs for ",
                bytes, " bytes in blocks of ", block_bytes, " (", blocks, " expected)");
    r.crc.reserve(size_t(blocks));
    for (const json& c : p["crc"]) {
      const uint64_t v = as_count(c, pw, "a CRC");
      ACCEL_CHECK(v <= std::numeric_limits<uint32_t>::max(), IoError, kOp, pw,
                  ": a CRC does not fit in 32 bits");
      r.crc.push_back(uint32_t(v));
    }
    t.pieces.push_back(std::move(r));
  }
  return t;
}

void validate_index(const Index& index, const std::string& where) {
  ACCEL_CHECK(index.crc_block_bytes >= 1 && index.crc_block_bytes <= kMaxCrcBlockBytes, IoError,
              kOp, where, ": crc_block_bytes ", index.crc_block_bytes, " is outside [1, ",
              kMaxCrcBlockBytes, "]");
  std::set<std::string> names;
  for (const FileRecord& f : index.files) {
    ACCEL_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos && f.name != "." &&
                    f.name != ".." && f.name != kIndexFile,
                IoError, kOp, where, ": file name '", f.name,
                "' is not a plain data file name in the checkpoint folder");
    ACCEL_CHECK(names.insert(f.name).second, IoError, kOp, where, ": file '", f.name,
                "' is listed twice");
  }
  std::set<std::pair<int64_t, std::string>> entries;
  for (const auto& [name, t] : index.tensors) {
    const int64_t numel = shape_numel(t.shape);
    int64_t held = 0;
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      const PieceRecord& p = t.pieces[i];
      const std::string pw = where + ": tensor '" + name + "' piece " + std::to_string(i) + " ('" +
                             p.entry + "'" +
                             (p.file >= 0 && size_t(p.file) < index.files.size()
                                  ? " in '" + index.files[size_t(p.file)].name + "'"
                                  : std::string()) +
                             ")";
      ACCEL_CHECK(p.file >= 0 && size_t(p.file) < index.files.size(), IoError, kOp, pw,
                  " names file ", p.file, " of ", index.files.size());
      ACCEL_CHECK(p.region.global_shape() == t.shape, IoError, kOp, pw, " lies in a tensor of ",
                  shape_str(p.region.global_shape()), ", the tensor is ", shape_str(t.shape));
      ACCEL_CHECK(entries.emplace(p.file, p.entry).second, IoError, kOp, pw, ": entry '", p.entry,
                  "' of '", index.files[size_t(p.file)].name, "' holds another piece too");
      held += p.region.numel();  // each <= numel: regions lie inside the shape
      ACCEL_CHECK(held <= numel, IoError, kOp, where, ": tensor '", name, "' of ", numel,
                  " elements: its pieces hold more elements than it has (", held, " after piece ",
                  i, ")");
    }
    ACCEL_CHECK(held == numel, IoError, kOp, where, ": tensor '", name, "' of ", numel,
                " elements ", shape_str(t.shape), ": its ", t.pieces.size(), " pieces hold ", held,
                " (a piece is missing)");
  }
}

std::string index_to_text(const Index& index) {
  json j = index.meta.is_object() ? index.meta : json::object();
  for (const char* k : kReserved)
    ACCEL_CHECK(!j.contains(k), ValueError, kOp, "the meta key \"", k, "\" is the index's own");
  j["format"] = kFormat;
  j["crc_block_bytes"] = index.crc_block_bytes;
  json files = json::array();
  for (const FileRecord& f : index.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = std::move(files);
  json tensors = json::object();
  for (const auto& [name, t] : index.tensors) tensors[name] = tensor_to_json(t);
  j["tensors"] = std::move(tensors);
  try {
    j["index_crc32"] = text_crc(j.dump());
    return j.dump();
  } catch (const json::exception& e) {
    ACCEL_THROW(ValueError, kOp, "a tensor name or meta string is not valid UTF-8: ", e.what());
  }
}

Index parse_index(std::string_view text, const std::string& where) {
  ACCEL_CHECK(text.size() <= kMaxIndexBytes, IoError, kOp, where, " is ", text.size(),
              " bytes, more than the ", kMaxIndexBytes, " an index may have");
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  ACCEL_CHECK(!j.is_discarded() && j.is_object(), IoError, kOp, where,
              " is not a JSON object (truncated?)");
  ACCEL_CHECK(j.contains("format") && j["format"].is_number_integer() &&
                  j["format"].get<int64_t>() == kFormat,
              IoError, kOp, where, " is not a format-", kFormat, " checkpoint index (\"format\" ",
              j.contains("format") ? j["format"].dump() : std::string("missing"), ")");
  ACCEL_CHECK(j.contains("index_crc32"), IoError, kOp, where, " has no \"index_crc32\"");
  const uint64_t stored = as_count(j["index_crc32"], where, "\"index_crc32\"");
  j.erase("index_crc32");
  uint32_t computed = 0;
  try {
    computed = text_crc(j.dump());
  } catch (const json::exception& e) {
    ACCEL_THROW(IoError, kOp, where, ": ", e.what());
  }
  ACCEL_CHECK(stored == computed, IoError, kOp, where, ": index_crc32 is ", stored,
              " but the index's text gives ", computed,
              ": the index was truncated or edited after it was written");
  Index index;
  ACCEL_CHECK(j.contains("crc_block_bytes"), IoError, kOp, where, " has no \"crc_block_bytes\"");
  index.crc_block_bytes = as_count(j["crc_block_bytes"], where, "\"crc_block_bytes\"");
  ACCEL_CHECK(index.crc_block_bytes >= 1 && index.crc_block_bytes <= kMaxCrcBlockBytes, IoError,
              kOp, where, ": crc_block_bytes ", index.crc_block_bytes, " is outside [1, ",
              kMaxCrcBlockBytes, "]");
  ACCEL_CHECK(j.contains("files") && j["files"].is_array(), IoError, kOp, where,
              " has no \"files\" list");
  for (const json& f : j["files"]) {
    ACCEL_CHECK(f.is_object() && f.contains("name") && f["name"].is_string() && f.contains("bytes"),
                IoError, kOp, where, ": a \"files\" item is not {\"name\": ..., \"bytes\": ...}");
    index.files.push_back(
        {f["name"].get<std::string>(), as_count(f["bytes"], where, "a file's \"bytes\"")});
  }
  ACCEL_CHECK(j.contains("tensors") && j["tensors"].is_object(), IoError, kOp, where,
              " has no \"tensors\" object");
  for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it)
    index.tensors.emplace(it.key(), tensor_from_json(it.value(), it.key(), index.files,
                                                     index.crc_block_bytes, where));
  validate_index(index, where);
  for (const char* k : kReserved) j.erase(k);
  index.meta = std::move(j);
  return index;
}

}  // namespace accel::dist::ckpt
