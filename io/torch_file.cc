#include "io/torch_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"

namespace accel::io::detail {

// Note [torch file layouts]
// torch.save writes one of two layouts (torch/serialization.py):
//   zip (the default since torch 1.6): records under "<archive>/" (the file's base name; torch's
//     reader takes the folder of the first record, and so do we): data.pkl (the pickle),
//     data/<key> (one record per storage, its raw bytes in native = little-endian order), version
//     ("3\n"; newer torch also writes .data/version), and since torch 2.1 byteorder ("little") and
//     .data/serialization_id. A TorchScript archive (torch.jit.save) also has constants.pkl and
//     code/; it is not a torch.save file.
//   legacy (_use_new_zipfile_serialization=False): five pickles in a row, then the storages:
//     the magic number 0x1950a86a20f9469cfc6c, the protocol version 1001, a dict of system info
//     (little_endian, type sizes), the object, the list of storage keys; then for each key of
//     that list, an int64 element count and the storage's bytes.
// Both are checked whole before a tensor is allocated: the data pickle is unpickled (Note
// [restricted unpickler]); every storage it references exists (a zip record of exactly numel x
// element size bytes, or a legacy block with that numel), the records read do not overlap, a
// legacy file's key list names each referenced storage once and the blocks end exactly at the end
// of the file. Storages no tensor references are not read (torch ignores them too).

namespace {

constexpr const char* kOp = "load_pt";
constexpr uint64_t kMaxSmallRecord = 64;  // version, byteorder
// The legacy magic pickle: PROTO 2, LONG1 of 10 bytes (0x1950a86a20f9469cfc6c), STOP.
constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
constexpr int64_t kLegacyProtocol = 1001;
constexpr unsigned char kZipMagic[] = {'P', 'K', 0x03, 0x04};

std::string read_error() {
  return errno ? std::strerror(errno) : "unexpected end of file (did it change while read?)";
}

// The value of `key` in an unpickled dict, or null.
const PickleValue* dict_get(const PickleValue& d, const std::string& key) {
  if (d.kind != PickleValue::Kind::kDict) return nullptr;
  const auto& it = d.obj->items;
  for (size_t k = 0; k + 1 < it.size(); k += 2)
    if (it[k].kind == PickleValue::Kind::kString && it[k].obj->text == key) return &it[k + 1];
  return nullptr;
}

std::string read_record(const ByteSource& src, const ZipDirectory& dir, const ZipEntry& e,
                        uint64_t max_bytes, const std::string& path,
                        std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  ACCEL_CHECK(e.size <= max_bytes, IoError, kOp, "'", path, "': record '", e.name, "' is ", e.size,
              " bytes, more than the ", max_bytes, " accepted");
  const uint64_t at = zip_data_offset(src, dir, e, path, kOp);
  ranges.emplace_back(e.header_offset, at + e.size);
  std::string out(size_t(e.size), '\0');
  ACCEL_CHECK(src.read(out.data(), out.size(), at), IoError, kOp, "'", path, "': cannot read '",
              e.name, "': ", read_error());
  ACCEL_CHECK(crc32_update(0, out.data(), out.size()) == e.crc32, IoError, kOp, "'", path,
              "': record '", e.name, "' fails its CRC-32 check (the file is corrupt)");
  return out;
}

TorchFile parse_zip(const ByteSource& src, const std::string& path) {
  const ZipDirectory dir = read_zip_directory(src, path, kOp);
  ACCEL_CHECK(!dir.entries.empty(), IoError, kOp, "'", path, "': an empty zip archive");
  const std::string& first = dir.entries.front().name;
  const size_t slash = first.find('/');
  ACCEL_CHECK(slash != std::string::npos && slash > 0, IoError, kOp, "'", path, "': record '",
              first, "' is not in a folder; a torch.save archive keeps its records in one");
  const std::string prefix = first.substr(0, slash + 1);
  auto find = [&](const std::string& name) { return dir.find(prefix + name); };
  ACCEL_CHECK(!find("constants.pkl"), IoError, kOp, "'", path,
              "' is a TorchScript archive (torch.jit.save), not a torch.save file; save the "
              "model's state_dict() with torch.save instead");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  // The format version torch's reader checks (it supports 1 to 10).
  const ZipEntry* ver = find("version");
  if (!ver) ver = find(".data/version");
  ACCEL_CHECK(ver, IoError, kOp, "'", path, "': no '", prefix,
              "version' record; not a torch.save archive");
  const std::string v = read_record(src, dir, *ver, kMaxSmallRecord, path, ranges);
  int64_t version = 0;
  size_t i = 0;
  for (; i < v.size() && v[i] >= '0' && v[i] <= '9' && version < 1000; ++i)
    version = version * 10 + (v[i] - '0');
  const bool version_ok = i > 0 && (i == v.size() || (v[i] == '\n' && i + 1 == v.size()));
  ACCEL_CHECK(version_ok && version >= 1 && version <= 10, IoError, kOp, "'", path,
              "': unsupported torch.save format version '", v, "' (torch 1.13 reads 1 to 10)");
  if (const ZipEntry* bo = find("byteorder")) {
    const std::string order = read_record(src, dir, *bo, kMaxSmallRecord, path, ranges);
    ACCEL_CHECK(order == "little", IoError, kOp, "'", path, "': storages in byte order '", order,
                "'; accel reads little-endian files");
  }
  const ZipEntry* pkl = find("data.pkl");
  ACCEL_CHECK(pkl, IoError, kOp, "'", path, "': no '", prefix,
              "data.pkl' record; not a torch.save archive");
  const std::string data = read_record(src, dir, *pkl, kMaxPickleBytes, path, ranges);

  TorchFile f;
  f.pickle = std::make_unique<Unpickler>(path, false, PickleLimits::for_size(data.size()));
  f.root = f.pickle->load(memory_source(data.data(), data.size()), 0, data.size(), "data.pkl");
  for (const auto& [key, info] : f.pickle->storages()) {
    const ZipEntry* e = find("data/" + key);
    ACCEL_CHECK(e, IoError, kOp, "'", path, "': storage '", key, "' (record '", prefix, "data/",
                key, "') is missing");
    const uint64_t nbytes = uint64_t(info.numel) * dtype_size(info.dtype);  // checked: no overflow
    ACCEL_CHECK(e->size == nbytes, IoError, kOp, "'", path, "': storage '", key, "' holds ",
                e->size, " bytes, but the data describes ", info.numel, " ", dtype_name(info.dtype),
                " elements (", nbytes, " bytes)");
    StorageData s;
    s.info = info;
    s.offset = zip_data_offset(src, dir, *e, path, kOp);
    s.nbytes = nbytes;
    s.has_crc = true;
    s.crc = e->crc32;
    ranges.emplace_back(e->header_offset, s.offset + nbytes);
    f.storages.emplace(key, s);
  }
  check_disjoint(std::move(ranges), path, kOp);
  return f;
}

TorchFile parse_legacy(const ByteSource& src, const std::string& path) {
  TorchFile f;
  f.legacy = true;
  f.pickle = std::make_unique<Unpickler>(path, true, PickleLimits::for_size(src.size));
  Unpickler& u = *f.pickle;
  uint64_t pos = sizeof kLegacyMagic, n = 0;
  const PickleValue proto = u.load(src, pos, src.size, "the protocol version", &n);
  pos += n;
  ACCEL_CHECK(proto.kind == PickleValue::Kind::kInt && proto.i == kLegacyProtocol, IoError, kOp,
              "'", path, "': legacy torch.save protocol version is not ", kLegacyProtocol);
  const PickleValue sys = u.load(src, pos, src.size, "the system info", &n);
  pos += n;
  ACCEL_CHECK(sys.kind == PickleValue::Kind::kDict, IoError, kOp, "'", path,
              "': the legacy system info is not a dict");
  const PickleValue* little = dict_get(sys, "little_endian");
  ACCEL_CHECK(!little || little->kind != PickleValue::Kind::kBool || little->i, IoError, kOp, "'",
              path, "': written on a big-endian machine; accel reads little-endian files");
  f.root = u.load(src, pos, src.size, "the pickled object", &n);
  pos += n;
  const PickleValue keys = u.load(src, pos, src.size, "the storage keys", &n);
  pos += n;
  ACCEL_CHECK(keys.kind == PickleValue::Kind::kList, IoError, kOp, "'", path,
              "': the legacy storage keys are not a list");
  std::set<std::string> seen;
  for (const PickleValue& k : keys.obj->items) {
    ACCEL_CHECK(k.kind == PickleValue::Kind::kString, IoError, kOp, "'", path,
                "': a legacy storage key that is not a str");
    const std::string& key = k.obj->text;
    auto it = u.storages().find(key);
    ACCEL_CHECK(it != u.storages().end(), IoError, kOp, "'", path, "': storage '", key,
                "' is listed but no tensor uses it");
    ACCEL_CHECK(seen.insert(key).second, IoError, kOp, "'", path, "': storage '", key,
                "' is listed twice");
    unsigned char len[8];
    ACCEL_CHECK(pos <= src.size && src.size - pos >= sizeof len && src.read(len, sizeof len, pos),
                IoError, kOp, "'", path, "': storage '", key,
                "' is missing: the file ends early (truncated?)");
    uint64_t numel = 0;
    for (int b = 7; b >= 0; --b) numel = (numel << 8) | len[b];
    ACCEL_CHECK(numel == uint64_t(it->second.numel), IoError, kOp, "'", path, "': storage '", key,
                "' holds ", int64_t(numel), " elements, but the data describes ", it->second.numel);
    StorageData s;
    s.info = it->second;
    s.offset = pos + sizeof len;
    s.nbytes = uint64_t(s.info.numel) * dtype_size(s.info.dtype);
    ACCEL_CHECK(s.nbytes <= src.size - s.offset, IoError, kOp, "'", path, "': storage '", key,
                "' (", s.nbytes, " bytes) runs past the end of the file (truncated?)");
    pos = s.offset + s.nbytes;
    f.storages.emplace(key, s);
  }
  for (const auto& [key, info] : u.storages()) {
    ACCEL_CHECK(seen.count(key), IoError, kOp, "'", path, "': storage '", key,
                "' is used but not in the file's list of storages");
  }
  ACCEL_CHECK(pos == src.size, IoError, kOp, "'", path, "': ", src.size - pos,
              " stray bytes after the last storage");
  return f;
}

}  // namespace

bool looks_like_torch_file(const unsigned char* head, size_t n) {
  // A safetensors file starts with its header's length (8 bytes, little-endian) and the header's
  // '{': its length spells the zip magic only as 0x04034b50 with four zero bytes after it.
  const bool zip = n >= sizeof kZipMagic && std::memcmp(head, kZipMagic, sizeof kZipMagic) == 0 &&
                   !(n > 8 && head[8] == '{');
  return zip ||
         (n >= sizeof kLegacyMagic && std::memcmp(head, kLegacyMagic, sizeof kLegacyMagic) == 0);
}

TorchFile parse_torch_file(const ByteSource& src, const std::string& path) {
  unsigned char head[sizeof kLegacyMagic] = {};
  const size_t n = size_t(std::min<uint64_t>(src.size, sizeof head));
  ACCEL_CHECK(src.read(head, n, 0), IoError, kOp, "'", path, "': cannot read: ", read_error());
  if (n >= sizeof kZipMagic && std::memcmp(head, kZipMagic, sizeof kZipMagic) == 0)
    return parse_zip(src, path);
  if (n == sizeof kLegacyMagic && std::memcmp(head, kLegacyMagic, sizeof kLegacyMagic) == 0)
    return parse_legacy(src, path);
  ACCEL_THROW(IoError, kOp, "'", path,
              "' is not a torch.save file (neither a zip archive nor the "
              "legacy format: its first bytes are neither 'PK\\x03\\x04' nor the legacy magic "
              "number)");
}

void read_storage(const ByteSource& src, const StorageData& s, void* dst, const std::string& key,
                  const std::string& path) {
  if (s.nbytes == 0) return;
  ACCEL_CHECK(src.read(dst, size_t(s.nbytes), s.offset), IoError, kOp, "'", path,
              "': cannot read storage '", key, "': ", read_error());
  if (s.has_crc) {
    ACCEL_CHECK(crc32_update(0, dst, size_t(s.nbytes)) == s.crc, IoError, kOp, "'", path,
                "': storage '", key, "' fails its CRC-32 check (the file is corrupt)");
  }
  if (s.info.dtype == kBool) {
    const auto* b = static_cast<const unsigned char*>(dst);
    for (uint64_t i = 0; i < s.nbytes; ++i)
      ACCEL_CHECK(b[i] <= 1, IoError, kOp, "'", path, "': bool storage '", key, "' holds byte ",
                  int(b[i]), " at element ", i, " (expected 0 or 1)");
  }
}

}  // namespace accel::io::detail
