#include "io/torch_zip.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace accel::io::detail {

// Note [torch zip archives]
// torch.save writes a zip archive (caffe2's PyTorchStreamWriter over miniz): every record is
// stored (not compressed) under "<archive>/", its data aligned to 64 bytes by an "FB" extra field
// in its local header, and the archive ends with zip64 end records. We read the subset a torch
// file needs with our own reader rather than libzip or minizip because what matters here is what
// a hostile file can make the reader do, and the subset is small:
//   * nothing is mapped or read whole: the central directory (bounded by kZipMaxDirectoryBytes)
//     and then each record, with pread, straight into the tensor storage it fills; the size of
//     every read is checked against the file size before anything is allocated;
//   * only stored, unencrypted records are accepted (torch never writes others), so there is no
//     inflation to bound and a record's bytes in the file are exactly its bytes in memory;
//   * every record is checked against its CRC-32 as it is read (as torch's miniz does), so a
//     flipped bit in tensor data is an error, not a silently different weight.
// The checks, each an IoError naming the file:
//   1. the end of central directory record is found in the last 64 KiB + 22 bytes, its comment
//      ending exactly at the end of the file; with a zip64 locator just before it, the zip64
//      record it points to is read (inside the file, before the locator) and wins over the 16-
//      and 32-bit fields, which must be equal to it or saturated;
//   2. one disk only; the directory is at most kZipMaxDirectoryBytes and ends exactly where the
//      end records begin; its entry count fits its size (46 bytes at least per entry);
//   3. every central entry is complete inside the directory, its extra fields tile its extra
//      area, zip64 values are present where its 32-bit fields say so, it is stored
//      (compressed size = size) and not encrypted, its local header starts before the directory,
//      and no two entries have the same name;
//   4. (for each record read) its local header has the signature and the same name, and the
//      record's data ends before the central directory;
//   5. the records read do not overlap one another (else a small file could name its one large
//      record many times and make the loader allocate many copies of it).
// Local header fields other than the name are not used (torch leaves sizes and CRC to the data
// descriptor); the central directory is the authority, as in miniz and Python's zipfile.

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr size_t kLocalHeaderBytes = 30;
constexpr size_t kCentralHeaderBytes = 46;
constexpr size_t kEndBytes = 22;
constexpr size_t kZip64EndBytes = 56;
constexpr size_t kZip64LocatorBytes = 20;
constexpr size_t kMaxCommentBytes = 0xffff;
constexpr uint16_t kFlagEncrypted = 0x0001;
constexpr uint16_t kFlagStrongEncryption = 0x0040;
constexpr uint16_t kFlagDescriptor = 0x0008;
constexpr uint16_t kFlagUtf8 = 0x0800;
constexpr uint16_t kZip64VersionMadeBy = 0x031e;  // what miniz writes
constexpr uint16_t kZip64VersionNeeded = 0x002d;

uint16_t le16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t le32(const unsigned char* p) { return uint32_t(le16(p)) | (uint32_t(le16(p + 2)) << 16); }
uint64_t le64(const unsigned char* p) { return uint64_t(le32(p)) | (uint64_t(le32(p + 4)) << 32); }

void put16(std::string& s, uint16_t v) {
  s.push_back(char(v & 0xff));
  s.push_back(char(v >> 8));
}
void put32(std::string& s, uint32_t v) {
  put16(s, uint16_t(v & 0xffff));
  put16(s, uint16_t(v >> 16));
}
void put64(std::string& s, uint64_t v) {
  put32(s, uint32_t(v & 0xffffffffu));
  put32(s, uint32_t(v >> 32));
}

std::string read_error() {
  return errno ? std::strerror(errno) : "unexpected end of file (did it change while read?)";
}

void read_exact(const ByteSource& src, void* dst, size_t n, uint64_t offset,
                const std::string& path, const char* op, const char* what) {
  ACCEL_CHECK(offset <= src.size && n <= src.size - offset, IoError, op, "'", path, "': ", what,
              " (", n, " bytes at offset ", offset, ") lies beyond the end of the ", src.size,
              "-byte file: truncated or corrupt zip archive");
  ACCEL_CHECK(src.read(dst, n, offset), IoError, op, "'", path, "': cannot read ", what, ": ",
              read_error());
}

}  // namespace

ByteSource memory_source(const void* data, size_t n) {
  const auto* base = static_cast<const unsigned char*>(data);
  ByteSource s;
  s.size = n;
  s.read = [base, n](void* dst, size_t k, uint64_t off) {
    if (off > n || k > n - off) {
      errno = 0;
      return false;
    }
    if (k) std::memcpy(dst, base + off, k);
    return true;
  };
  return s;
}

const ZipEntry* ZipDirectory::find(std::string_view name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &entries[it->second];
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return uint32_t(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

ZipDirectory read_zip_directory(const ByteSource& src, const std::string& path, const char* op) {
  // 1. The end record: the last signature whose comment ends exactly at the end of the file.
  ACCEL_CHECK(src.size >= kEndBytes, IoError, op, "'", path, "': ", src.size,
              " bytes is too short for a zip archive (truncated?)");
  const uint64_t tail_len = std::min<uint64_t>(src.size, kEndBytes + kMaxCommentBytes);
  const uint64_t tail_start = src.size - tail_len;
  std::string tail(size_t(tail_len), '\0');
  read_exact(src, tail.data(), tail.size(), tail_start, path, op, "the end of the archive");
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  int64_t end_at = -1;
  for (int64_t i = int64_t(tail_len) - int64_t(kEndBytes); i >= 0; --i) {
    if (le32(t + i) == kEndSig && uint64_t(i) + kEndBytes + le16(t + i + 20) == tail_len) {
      end_at = i;
      break;
    }
  }
  ACCEL_CHECK(end_at >= 0, IoError, op, "'", path,
              "': no zip end of central directory record (truncated, or not a zip archive)");
  const unsigned char* e = t + end_at;
  const uint64_t end_pos = tail_start + uint64_t(end_at);
  uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
  ACCEL_CHECK(le16(e + 4) == 0 && le16(e + 6) == 0 && le16(e + 8) == le16(e + 10), IoError, op, "'",
              path, "': a multi-disk zip archive; torch files are one file");
  uint64_t cd_end = end_pos;  // where the directory must end
  if (end_pos >= kZip64LocatorBytes) {
    unsigned char loc[kZip64LocatorBytes];
    const uint64_t loc_pos = end_pos - kZip64LocatorBytes;
    read_exact(src, loc, sizeof loc, loc_pos, path, op, "the zip64 locator");
    if (le32(loc) == kZip64LocatorSig) {
      const uint64_t z_pos = le64(loc + 8);
      ACCEL_CHECK(le32(loc + 4) == 0 && le32(loc + 16) <= 1, IoError, op, "'", path,
                  "': a multi-disk zip64 archive; torch files are one file");
      ACCEL_CHECK(z_pos <= loc_pos && loc_pos - z_pos >= kZip64EndBytes, IoError, op, "'", path,
                  "': the zip64 locator points at offset ", z_pos,
                  ", which leaves no room for the zip64 end record before it");
      unsigned char z[kZip64EndBytes];
      read_exact(src, z, sizeof z, z_pos, path, op, "the zip64 end record");
      ACCEL_CHECK(le32(z) == kZip64EndSig && le64(z + 4) >= kZip64EndBytes - 12 &&
                      le64(z + 4) == loc_pos - z_pos - 12,
                  IoError, op, "'", path, "': no valid zip64 end record at offset ", z_pos);
      ACCEL_CHECK(le32(z + 16) == 0 && le32(z + 20) == 0 && le64(z + 24) == le64(z + 32), IoError,
                  op, "'", path, "': a multi-disk zip64 archive; torch files are one file");
      const uint64_t z_entries = le64(z + 32), z_size = le64(z + 40), z_offset = le64(z + 48);
      ACCEL_CHECK((entries == 0xffff || entries == z_entries) &&
                      (cd_size == 0xffffffffu || cd_size == z_size) &&
                      (cd_offset == 0xffffffffu || cd_offset == z_offset),
                  IoError, op, "'", path,
                  "': the zip end record and the zip64 end record disagree on the directory");
      entries = z_entries;
      cd_size = z_size;
      cd_offset = z_offset;
      cd_end = z_pos;
    }
  }
  // 2. The directory: bounded, ending where the end records begin, its count fitting its size.
  ACCEL_CHECK(cd_size <= kZipMaxDirectoryBytes, IoError, op, "'", path, "': a ", cd_size,
              "-byte zip central directory, more than the ", kZipMaxDirectoryBytes,
              " bytes accepted");
  ACCEL_CHECK(cd_offset <= cd_end && cd_end - cd_offset == cd_size, IoError, op, "'", path,
              "': the zip central directory (", cd_size, " bytes at offset ", cd_offset,
              ") does not end where the end records begin (offset ", cd_end,
              "): truncated or corrupt archive");
  ACCEL_CHECK(entries <= cd_size / kCentralHeaderBytes, IoError, op, "'", path, "': ", entries,
              " zip entries cannot fit a ", cd_size, "-byte central directory");
  std::string cd(size_t(cd_size), '\0');
  read_exact(src, cd.data(), cd.size(), cd_offset, path, op, "the zip central directory");
  const auto* c = reinterpret_cast<const unsigned char*>(cd.data());

  // 3. The entries.
  ZipDirectory dir;
  dir.central_offset = cd_offset;
  dir.entries.reserve(size_t(entries));
  size_t at = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    ACCEL_CHECK(cd.size() - at >= kCentralHeaderBytes && le32(c + at) == kCentralSig, IoError, op,
                "'", path, "': zip central directory entry ", k, " of ", entries,
                " is missing or corrupt");
    const unsigned char* h = c + at;
    const uint16_t flags = le16(h + 8), method = le16(h + 10);
    const size_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
    ACCEL_CHECK(cd.size() - at - kCentralHeaderBytes >= name_len + extra_len + comment_len, IoError,
                op, "'", path, "': zip central directory entry ", k,
                " runs past the end of the directory");
    ZipEntry z;
    z.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderBytes), name_len);
    z.crc32 = le32(h + 16);
    uint64_t csize = le32(h + 20), usize = le32(h + 24), lho = le32(h + 42);
    uint32_t disk = le16(h + 34);
    // Zip64 values, in this order, for each 32-bit field that is saturated.
    const unsigned char* x = h + kCentralHeaderBytes + name_len;
    size_t xleft = extra_len;
    bool zip64_seen = false;
    while (xleft > 0) {
      ACCEL_CHECK(xleft >= 4 && size_t(le16(x + 2)) <= xleft - 4, IoError, op, "'", path,
                  "': the extra fields of zip entry '", z.name, "' are corrupt");
      const uint16_t id = le16(x);
      const size_t len = le16(x + 2);
      if (id == kZip64ExtraId && !zip64_seen) {
        zip64_seen = true;
        const unsigned char* v = x + 4;
        size_t vleft = len;
        auto take64 = [&](uint64_t& field) {
          ACCEL_CHECK(vleft >= 8, IoError, op, "'", path, "': zip entry '", z.name,
                      "' lacks a zip64 value its header announces");
          field = le64(v);
          v += 8;
          vleft -= 8;
        };
        if (usize == 0xffffffffu) take64(usize);
        if (csize == 0xffffffffu) take64(csize);
        if (lho == 0xffffffffu) take64(lho);
        if (disk == 0xffff) {
          ACCEL_CHECK(vleft >= 4, IoError, op, "'", path, "': zip entry '", z.name,
                      "' lacks a zip64 value its header announces");
          disk = le32(v);
        }
      }
      x += 4 + len;
      xleft -= 4 + len;
    }
    ACCEL_CHECK(!(flags & (kFlagEncrypted | kFlagStrongEncryption)), IoError, op, "'", path,
                "': zip entry '", z.name, "' is encrypted");
    ACCEL_CHECK(method == 0, IoError, op, "'", path, "': zip entry '", z.name,
                "' is compressed (method ", method,
                "); torch.save stores records uncompressed and accel reads only those");
    ACCEL_CHECK(csize == usize, IoError, op, "'", path, "': stored zip entry '", z.name,
                "' has a compressed size (", csize, ") other than its size (", usize, ")");
    ACCEL_CHECK(disk == 0, IoError, op, "'", path, "': zip entry '", z.name,
                "' is on another disk");
    ACCEL_CHECK(lho < cd_offset && cd_offset - lho >= kLocalHeaderBytes, IoError, op, "'", path,
                "': zip entry '", z.name, "' has its local header at offset ", lho,
                ", not before the central directory at ", cd_offset);
    ACCEL_CHECK(!z.name.empty(), IoError, op, "'", path, "': zip entry ", k, " has no name");
    z.header_offset = lho;
    z.size = usize;
    ACCEL_CHECK(dir.by_name.emplace(z.name, dir.entries.size()).second, IoError, op, "'", path,
                "': two zip entries are named '", z.name, "'");
    dir.entries.push_back(std::move(z));
    at += kCentralHeaderBytes + name_len + extra_len + comment_len;
  }
  ACCEL_CHECK(at == cd.size(), IoError, op, "'", path, "': ", cd.size() - at,
              " stray bytes after the ", entries, " entries of the zip central directory");
  return dir;
}

uint64_t zip_data_offset(const ByteSource& src, const ZipDirectory& dir, const ZipEntry& e,
                         const std::string& path, const char* op) {
  // 4. The local header: signature, the same name, the data before the central directory.
  unsigned char h[kLocalHeaderBytes];
  read_exact(src, h, sizeof h, e.header_offset, path, op, "a zip local header");
  ACCEL_CHECK(le32(h) == kLocalSig, IoError, op, "'", path, "': no zip local header for '", e.name,
              "' at offset ", e.header_offset);
  const uint64_t name_len = le16(h + 26), extra_len = le16(h + 28);
  ACCEL_CHECK(name_len == e.name.size(), IoError, op, "'", path, "': the local header of '", e.name,
              "' names another record");
  std::string name(size_t(name_len), '\0');
  read_exact(src, name.data(), name.size(), e.header_offset + kLocalHeaderBytes, path, op,
             "a zip local header");
  ACCEL_CHECK(name == e.name, IoError, op, "'", path, "': the local header of '", e.name,
              "' names '", name, "'");
  ACCEL_CHECK(le16(h + 8) == 0 && !(le16(h + 6) & (kFlagEncrypted | kFlagStrongEncryption)),
              IoError, op, "'", path, "': the local header of '", e.name,
              "' says compressed or encrypted");
  const uint64_t data = e.header_offset + kLocalHeaderBytes + name_len + extra_len;
  ACCEL_CHECK(data <= dir.central_offset && e.size <= dir.central_offset - data, IoError, op, "'",
              path, "': zip record '", e.name, "' (", e.size, " bytes at offset ", data,
              ") runs into the central directory at ", dir.central_offset);
  return data;
}

void check_disjoint(std::vector<std::pair<uint64_t, uint64_t>> ranges, const std::string& path,
                    const char* op) {
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    ACCEL_CHECK(ranges[i].first >= ranges[i - 1].second, IoError, op, "'", path,
                "': zip records overlap (bytes ", ranges[i].first, " to ", ranges[i - 1].second,
                " belong to two records): a corrupt or hostile archive");
  }
}

// Note [writing torch zip archives]
// ZipWriter writes the bytes torch 1.13's writer (PyTorchStreamWriter over miniz 2.1 with
// MZ_ZIP_FLAG_WRITE_ZIP64, no timestamps) writes for the same records, so a file accel saves is
// the file torch would have saved:
//   local header: version needed 0, flags 0x0808 (data descriptor, UTF-8 name), method 0, time,
//     date, CRC and sizes 0; the name; a zip64 extra field (the size and 0 for the compressed size
//     when size >= 2^32 - 1, then the header offset when that is >= 2^32 - 1) when either is; then
//     "FB" + 16-bit length + 'Z' padding so that the data starts at a multiple of 64;
//   the data, then a data descriptor (signature, CRC, sizes: 32-bit, or 64-bit after a zip64
//     extra field); an empty record has flags 0x0800 and no descriptor (miniz's rule);
//   central directory entries with the real CRC and sizes (saturated to 0xFFFFFFFF where a zip64
//     extra field holds them), no "FB" field;
//   the zip64 end record and locator (always), then the end record.
// tests/io's fixture script checks that torch 1.13 and Python's zipfile read what it writes,
// zip64 fields included (written for small values through the zip64_threshold hook). Checked once
// by hand on a real zip64 file (a 4.3 GB tensor and one after it, beyond 4 GiB): accel's file was
// torch.save's byte for byte, and each read the other's (docs/nn.md).

ZipWriter::ZipWriter(Sink sink, uint64_t zip64_threshold)
    : sink_(std::move(sink)), zip64_threshold_(zip64_threshold) {}

void ZipWriter::put(const void* data, size_t n) {
  if (n == 0) return;
  sink_(data, n);
  pos_ += n;
}

void ZipWriter::begin_record(const std::string& name, uint64_t size) {
  ACCEL_CHECK(!open_ && !finished_, ValueError, "zip", "record '", name,
              "' begun while another is open or after the end");
  ACCEL_CHECK(!name.empty() && name.size() <= 0xffff, ValueError, "zip", "bad record name '", name,
              "'");
  cur_ = Written{name, pos_, size, 0};
  cur_written_ = 0;
  open_ = true;
  const bool big_size = size >= zip64_threshold_, big_ofs = pos_ >= zip64_threshold_;
  std::string zip64;
  if (big_size || big_ofs) {
    put16(zip64, kZip64ExtraId);
    put16(zip64, uint16_t((big_size ? 16 : 0) + (big_ofs ? 8 : 0)));
    if (big_size) {
      put64(zip64, size);
      put64(zip64, 0);  // miniz writes the compressed size before it has compressed anything
    }
    if (big_ofs) put64(zip64, pos_);
  }
  // getPadding of inline_container.cc: the data after the header, the name, the zip64 field and
  // the 4-byte "FB" field header starts at a multiple of kZipAlignment.
  const uint64_t start = pos_ + kLocalHeaderBytes + name.size() + zip64.size() + 4;
  const uint64_t pad = (kZipAlignment - start % kZipAlignment) % kZipAlignment;
  std::string h;
  h.reserve(kLocalHeaderBytes + name.size() + zip64.size() + 4 + pad);
  put32(h, kLocalSig);
  put16(h, 0);                                                   // version needed
  put16(h, uint16_t(kFlagUtf8 | (size ? kFlagDescriptor : 0)));  // flags
  put16(h, 0);                                                   // method: stored
  put16(h, 0);                                                   // time
  put16(h, 0);                                                   // date
  put32(h, 0);                                                   // CRC (in the descriptor)
  put32(h, 0);                                                   // compressed size
  put32(h, 0);                                                   // size
  put16(h, uint16_t(name.size()));
  put16(h, uint16_t(zip64.size() + 4 + pad));
  h += name;
  h += zip64;
  h += "FB";
  put16(h, uint16_t(pad));
  h.append(size_t(pad), 'Z');
  put(h.data(), h.size());
}

void ZipWriter::write(const void* data, size_t n) {
  ACCEL_CHECK(open_ && n <= cur_.size - cur_written_, ValueError, "zip", "record '", cur_.name,
              "': more bytes than the ", cur_.size, " announced");
  cur_.crc = crc32_update(cur_.crc, data, n);
  cur_written_ += n;
  put(data, n);
}

void ZipWriter::end_record() {
  ACCEL_CHECK(open_ && cur_written_ == cur_.size, ValueError, "zip", "record '", cur_.name,
              "': ", cur_written_, " of ", cur_.size, " bytes written");
  open_ = false;
  if (cur_.size) {
    std::string d;
    put32(d, kDescriptorSig);
    put32(d, cur_.crc);
    if (cur_.size >= zip64_threshold_ || cur_.header_offset >= zip64_threshold_) {
      put64(d, cur_.size);
      put64(d, cur_.size);
    } else {
      put32(d, uint32_t(cur_.size));
      put32(d, uint32_t(cur_.size));
    }
    put(d.data(), d.size());
  }
  done_.push_back(std::move(cur_));
}

void ZipWriter::add_record(const std::string& name, std::string_view data) {
  begin_record(name, data.size());
  write(data.data(), data.size());
  end_record();
}

void ZipWriter::finish() {
  ACCEL_CHECK(!open_ && !finished_, ValueError, "zip", "finish() with a record open or twice");
  finished_ = true;
  const uint64_t cd_offset = pos_;
  std::string cd;
  for (const Written& w : done_) {
    const bool big_size = w.size >= zip64_threshold_, big_ofs = w.header_offset >= zip64_threshold_;
    std::string zip64;
    if (big_size || big_ofs) {
      put16(zip64, kZip64ExtraId);
      put16(zip64, uint16_t((big_size ? 16 : 0) + (big_ofs ? 8 : 0)));
      if (big_size) {
        put64(zip64, w.size);
        put64(zip64, w.size);
      }
      if (big_ofs) put64(zip64, w.header_offset);
    }
    const uint32_t size32 = big_size ? 0xffffffffu : uint32_t(w.size);
    put32(cd, kCentralSig);
    put16(cd, 0);  // version made by
    put16(cd, 0);  // version needed
    put16(cd, uint16_t(kFlagUtf8 | (w.size ? kFlagDescriptor : 0)));
    put16(cd, 0);  // method
    put16(cd, 0);  // time
    put16(cd, 0);  // date
    put32(cd, w.crc);
    put32(cd, size32);
    put32(cd, size32);
    put16(cd, uint16_t(w.name.size()));
    put16(cd, uint16_t(zip64.size()));
    put16(cd, 0);  // comment
    put16(cd, 0);  // disk
    put16(cd, 0);  // internal attributes
    put32(cd, 0);  // external attributes
    put32(cd, big_ofs ? 0xffffffffu : uint32_t(w.header_offset));
    cd += w.name;
    cd += zip64;
  }
  put(cd.data(), cd.size());
  const uint64_t z_pos = pos_;
  const uint64_t n = done_.size();
  std::string end;
  put32(end, kZip64EndSig);
  put64(end, kZip64EndBytes - 12);
  put16(end, kZip64VersionMadeBy);
  put16(end, kZip64VersionNeeded);
  put32(end, 0);
  put32(end, 0);
  put64(end, n);
  put64(end, n);
  put64(end, cd.size());
  put64(end, cd_offset);
  put32(end, kZip64LocatorSig);
  put32(end, 0);
  put64(end, z_pos);
  put32(end, 1);
  put32(end, kEndSig);
  put16(end, 0);
  put16(end, 0);
  put16(end, uint16_t(std::min<uint64_t>(n, 0xffff)));
  put16(end, uint16_t(std::min<uint64_t>(n, 0xffff)));
  put32(end, cd.size() >= zip64_threshold_ ? 0xffffffffu : uint32_t(cd.size()));
  put32(end, cd_offset >= zip64_threshold_ ? 0xffffffffu : uint32_t(cd_offset));
  put16(end, 0);  // comment
  put(end.data(), end.size());
}

}  // namespace accel::io::detail
