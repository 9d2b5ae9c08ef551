// Malformed and hostile torch.save files (Notes [torch zip archives], [restricted unpickler] and
// [torch file layouts]): each is an IoError that names the file and what is wrong, before anything
// large is allocated; nothing in a file runs. The files are built here from valid ones: zip
// records by detail::ZipWriter, pickles by detail::Pickler or by hand, then patched.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "accel.h"
#include "io/torch_file.h"
#include "io/torch_pickle.h"
#include "io/torch_zip.h"
#include "tests/io/pt_compare.h"

using namespace accel;
using namespace accel::io::detail;
using namespace std::string_literals;
using pt_test::fixture;
using pt_test::read_file;
using pt_test::TempDir;
using pt_test::write_file;

namespace {

using Records = std::vector<std::pair<std::string, std::string>>;

std::string zip_of(const Records& records) {
  std::string out;
  ZipWriter z([&](const void* d, size_t n) { out.append(static_cast<const char*>(d), n); });
  for (const auto& [name, data] : records) z.add_record(name, data);
  z.finish();
  return out;
}

// A torch archive "a/": data.pkl, the storages data/<key>, version.
std::string torch_zip(const std::string& pickle, const Records& storages = {},
                      const std::string& version = "3\n") {
  Records r{{"a/data.pkl", pickle}};
  for (const auto& [key, data] : storages) r.emplace_back("a/data/" + key, data);
  r.emplace_back("a/version", version);
  return zip_of(r);
}

// OrderedDict({'w': tensor over storage '0'}) as torch.save pickles it.
std::string tensor_pickle(DType dtype, int64_t numel, int64_t offset,
                          const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  Pickler p;
  p.begin_dict(true, 1);
  p.string("w");
  p.tensor("0", dtype, numel, offset, sizes, strides, false);
  p.end();
  return p.finish();
}

std::string floats(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    const float f = 0.5f * float(i);
    s.append(reinterpret_cast<const char*>(&f), sizeof f);
  }
  return s;
}

// A valid file: {'w': (2, 3) float32}.
std::string valid_file() {
  return torch_zip(tensor_pickle(kFloat32, 6, 0, {2, 3}, {3, 1}), {{"0", floats(6)}});
}

// A pickle written by hand: protocol 2, the opcodes, STOP.
std::string pickle(const std::string& ops) { return "\x80\x02" + ops + "."; }

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
  return s;
}

void put(std::string& s, size_t at, uint64_t v, int bytes) {
  s.replace(at, size_t(bytes), le(v, bytes));
}

// Offset of the central directory entry of `name`.
size_t central_entry(const std::string& zip, const std::string& name) {
  for (size_t at = zip.find("PK\x01\x02"); at != std::string::npos;
       at = zip.find("PK\x01\x02", at + 1)) {
    const size_t n = uint8_t(zip[at + 28]) | (uint8_t(zip[at + 29]) << 8);
    if (zip.compare(at + 46, n, name) == 0 && n == name.size()) return at;
  }
  FAIL("no central entry ", name);
  return 0;
}

// Where record `name`'s data begins.
uint64_t data_offset(const std::string& zip, const std::string& name) {
  const ByteSource src = memory_source(zip.data(), zip.size());
  const ZipDirectory dir = read_zip_directory(src, "<mem>", "test");
  return zip_data_offset(src, dir, *dir.find(name), "<mem>", "test");
}

// Reads `bytes` as read_pt reads a file (from memory: thousands of files through the file system
// took seconds) and returns the IoError's message, which must name the file (any other outcome
// fails the test).
constexpr const char* kName = "/hostile/bad.pt";

std::string load_error(const std::string& bytes) {
  try {
    io::detail::read_pt_from(memory_source(bytes.data(), bytes.size()), kName);
  } catch (const IoError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[load_pt] '" + std::string(kName) + "'") == 0);
    return msg;
  }
  FAIL("no IoError");
  return "";
}

#define CHECK_LOAD_ERROR(bytes, phrase)            \
  do {                                             \
    const std::string msg_ = load_error(bytes);    \
    INFO(msg_);                                    \
    CHECK(msg_.find(phrase) != std::string::npos); \
  } while (0)

}  // namespace

TEST_CASE("the hand-built files of these tests load when valid; errors name the file") {
  TempDir dir;
  write_file(dir.file("ok.pt"), valid_file());
  const nn::TensorDict sd = io::load_pt(dir.file("ok.pt"));
  CHECK(sd.at("w").to_vector<float>() == std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f});
  // Through a file, as read_pt and load_pt read one.
  std::string bad = valid_file();
  bad[data_offset(bad, "a/data/0") + 5] ^= 1;
  write_file(dir.file("bad.pt"), bad);
  for (auto load : {+[](const std::string& p) { io::read_pt(p); },
                    +[](const std::string& p) { io::load_pt(p); }}) {
    try {
      load(dir.file("bad.pt"));
      FAIL("no IoError");
    } catch (const IoError& e) {
      CHECK(std::string(e.what()) == "[load_pt] '" + dir.file("bad.pt") +
                                         "': storage '0' fails its CRC-32 check (the file is "
                                         "corrupt)");
    }
  }
}

TEST_CASE("every truncation and every flipped byte of a valid file is an IoError or loads") {
  const std::string good = valid_file();
  for (size_t n = 0; n < good.size(); ++n) load_error(good.substr(0, n));
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = char(bad[i] ^ 0xff);
    try {
      io::detail::read_pt_from(memory_source(bad.data(), bad.size()),
                               kName);  // padding, times, ...
    } catch (const IoError& e) {
      CHECK(std::string(e.what()).find(kName) != std::string::npos);
    }
  }
  // The same over torch's legacy layout.
  const std::string legacy = read_file(fixture("torch_legacy.pt"));
  for (size_t n = 0; n < legacy.size(); ++n) load_error(legacy.substr(0, n));
  CHECK_LOAD_ERROR(legacy + "x", "1 stray bytes after the last storage");
}

TEST_CASE("zip structure: checksums, sizes, offsets, methods, names") {
  const std::string good = valid_file();
  CHECK_LOAD_ERROR("", "is not a torch.save file");
  CHECK_LOAD_ERROR(std::string(4096, 'x'), "is not a torch.save file");
  CHECK_LOAD_ERROR("PK\x03\x04" + std::string(100, '\0'), "no zip end of central directory record");
  {  // A flipped bit in tensor data, and in the pickle.
    std::string bad = good;
    bad[data_offset(good, "a/data/0") + 5] ^= 1;
    CHECK_LOAD_ERROR(bad, "storage '0' fails its CRC-32 check (the file is corrupt)");
    bad = good;
    bad[data_offset(good, "a/data.pkl") + 20] ^= 1;
    CHECK_LOAD_ERROR(bad, "record 'a/data.pkl' fails its CRC-32 check");
  }
  {  // Compressed, encrypted.
    std::string bad = good;
    put(bad, central_entry(good, "a/data/0") + 10, 8, 2);
    CHECK_LOAD_ERROR(bad, "zip entry 'a/data/0' is compressed (method 8)");
    bad = good;
    put(bad, central_entry(good, "a/data/0") + 8, 0x0809, 2);
    CHECK_LOAD_ERROR(bad, "zip entry 'a/data/0' is encrypted");
  }
  {  // The directory where it cannot be, too large, or with more entries than fit.
    // The zip64 end record wins over the end record's saturated fields.
    const size_t z64 = good.rfind("PK\x06\x06"), end = good.size() - 22;
    REQUIRE(z64 != std::string::npos);
    std::string bad = good;
    put(bad, z64 + 48, good.size() + 100, 8);  // its offset
    put(bad, end + 16, 0xffffffff, 4);
    CHECK_LOAD_ERROR(bad, "does not end where the end records begin");
    bad = good;
    put(bad, z64 + 40, uint64_t(1) << 40, 8);  // its size
    put(bad, end + 12, 0xffffffff, 4);
    CHECK_LOAD_ERROR(bad, "-byte zip central directory, more than the 67108864 bytes accepted");
    bad = good;
    put(bad, z64 + 24, uint64_t(1) << 60, 8);  // its entry counts
    put(bad, z64 + 32, uint64_t(1) << 60, 8);
    put(bad, end + 8, 0xffff, 2);
    put(bad, end + 10, 0xffff, 2);
    CHECK_LOAD_ERROR(bad, "zip entries cannot fit a");
    bad = good;
    put(bad, z64 + 24, 7, 8);
    put(bad, z64 + 32, 7, 8);
    CHECK_LOAD_ERROR(bad, "the zip end record and the zip64 end record disagree");
    bad = good;  // a local header offset past the directory
    put(bad, central_entry(good, "a/data/0") + 42, good.size(), 4);
    CHECK_LOAD_ERROR(bad, "has its local header at offset");
    bad = good;  // a record size running into the directory
    put(bad, central_entry(good, "a/data.pkl") + 20, 1 << 20, 4);
    put(bad, central_entry(good, "a/data.pkl") + 24, 1 << 20, 4);
    CHECK_LOAD_ERROR(bad, "runs into the central directory");
  }
  CHECK_LOAD_ERROR(zip_of({{"a/data.pkl", "x"}, {"a/data.pkl", "y"}}),
                   "two zip entries are named 'a/data.pkl'");
  CHECK_LOAD_ERROR(zip_of({{"data.pkl", "x"}}), "record 'data.pkl' is not in a folder");
  CHECK_LOAD_ERROR(zip_of({{"a/version", "3\n"}}), "no 'a/data.pkl' record");
  CHECK_LOAD_ERROR(zip_of({{"a/data.pkl", pickle("N")}}), "no 'a/version' record");
  CHECK_LOAD_ERROR(torch_zip(pickle("N"), {}, "99\n"), "unsupported torch.save format version");
  CHECK_LOAD_ERROR(zip_of({{"a/data.pkl", pickle("N")}, {"a/constants.pkl", ""}}),
                   "is a TorchScript archive (torch.jit.save)");
  CHECK_LOAD_ERROR(
      zip_of({{"a/data.pkl", pickle("N")}, {"a/version", "3\n"}, {"a/byteorder", "big"}}),
      "storages in byte order 'big'");
}

TEST_CASE("two records that overlap are refused before either is read") {
  // data/0's 128 bytes hide a local header for data/1, and the directory's data/1 points at it:
  // read naively, one small file could name one large record many times.
  Pickler p;
  p.begin_dict(true, 2);
  p.string("a");
  p.tensor("0", kFloat32, 32, 0, {32}, {1}, false);
  p.string("b");
  p.tensor("1", kFloat32, 4, 0, {4}, {1}, false);
  p.end();
  const std::string pkl = p.finish();
  std::string fake = le(0x04034b50, 4) + std::string(22, '\0') + le(8, 2) + le(0, 2) + "a/data/1";
  fake.resize(128, '\0');
  std::string bad = torch_zip(pkl, {{"0", fake}, {"1", floats(4)}});
  put(bad, central_entry(bad, "a/data/1") + 42, data_offset(bad, "a/data/0"), 4);
  CHECK_LOAD_ERROR(bad, "zip records overlap");
}

TEST_CASE("tensor geometry is checked against its storage, sizes before any allocation") {
  auto file = [](DType d, int64_t numel, int64_t offset, std::vector<int64_t> sizes,
                 std::vector<int64_t> strides, std::string data) {
    return torch_zip(tensor_pickle(d, numel, offset, sizes, strides), {{"0", std::move(data)}});
  };
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {2, 3}, {3, 1}, floats(5)),
                   "storage '0' holds 20 bytes, but the data describes 6 float32 elements (24 "
                   "bytes)");
  // A storage of 2^40 elements in a small file: no allocation, the record's size disagrees.
  CHECK_LOAD_ERROR(file(kFloat32, int64_t(1) << 40, 0, {2}, {1}, floats(2)),
                   "but the data describes 1099511627776 float32 elements");
  CHECK_LOAD_ERROR(file(kFloat32, int64_t(1) << 62, 0, {2}, {1}, floats(2)),
                   "storage '0' of 4611686018427387904 elements");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {3, 3}, {3, 1}, floats(6)),
                   "reaches element 8 of storage '0', which holds 6 elements");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 7, {1}, {1}, floats(6)), "reaches element 7");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 9, {0}, {1}, floats(6)), "an empty tensor at offset 9");
  CHECK_LOAD_ERROR(file(kFloat32, 6, -1, {1}, {1}, floats(6)), "a tensor at storage offset -1");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {-1}, {1}, floats(6)), "a tensor with size -1");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {2}, {-1}, floats(6)), "and stride -1");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {int64_t(1) << 62, 4}, {4, 1}, floats(6)),
                   "a tensor of more than 2^63 elements");
  CHECK_LOAD_ERROR(file(kFloat32, 6, 0, {3, int64_t(1) << 40}, {int64_t(1) << 62, 1}, floats(6)),
                   "whose last element lies beyond 2^63");
  CHECK_LOAD_ERROR(
      file(kFloat32, 6, 0, std::vector<int64_t>(65, 1), std::vector<int64_t>(65, 1), floats(6)),
      "(at most 64 dimensions)");
  CHECK_LOAD_ERROR(file(kBool, 3, 0, {3}, {1}, std::string("\x01\x00\x02", 3)),
                   "bool storage '0' holds byte 2 at element 2");
  // A storage class accel has no dtype for.
  const std::string pkl = tensor_pickle(kUInt8, 2, 0, {2}, {1});
  std::string bad_pkl = pkl;
  bad_pkl.replace(bad_pkl.find("ByteStorage"), 11, "CharStorage");
  CHECK_LOAD_ERROR(torch_zip(bad_pkl, {{"0", "ab"}}),
                   "a tensor of torch.int8 (torch.CharStorage); accel has no such dtype");
}

TEST_CASE("the unpickler runs nothing: globals outside torch's allow-list and code opcodes") {
  for (const char* g : {"os\nsystem\n", "posix\nsystem\n", "builtins\neval\n",
                        "__builtin__\ngetattr\n", "subprocess\nPopen\n", "torch\nload\n"}) {
    const std::string pkl = pickle("c"s + g + "X\x02\x00\x00\x00lsq\x00\x85R"s);
    std::string name = g;
    name[name.find('\n')] = '.';
    name.pop_back();
    CHECK_LOAD_ERROR(torch_zip(pkl), "the global '" + name + "' is not allowed");
  }
  // Opcodes that import or build objects of any class.
  CHECK_LOAD_ERROR(torch_zip(pickle("X\x02\x00\x00\x00osX\x06\x00\x00\x00system\x93"s)),
                   "opcode 0x93 (STACK_GLOBAL (protocol 4 import)) is not allowed");
  CHECK_LOAD_ERROR(torch_zip(pickle("(ios\nsystem\n")), "INST (builds an object of any class)");
  CHECK_LOAD_ERROR(torch_zip(pickle("(o")), "OBJ (builds an object of any class)");
  CHECK_LOAD_ERROR(torch_zip(pickle("\x82\x01")), "EXT (extension registry import)");
  CHECK_LOAD_ERROR(torch_zip(pickle("ccollections\nOrderedDict\n)\x81")), "NEWOBJ");
  CHECK_LOAD_ERROR(torch_zip(pickle("P1\n")), "PERSID");
  CHECK_LOAD_ERROR(torch_zip(pickle("))R")), "REDUCE calls a tuple, not a global");
  CHECK_LOAD_ERROR(torch_zip(pickle("]}b")), "BUILD of a list");
  CHECK_LOAD_ERROR(torch_zip(pickle("ctorch._utils\n_rebuild_tensor_v2\n)R")),
                   "_rebuild_tensor_v2 with 0 arguments");
  CHECK_LOAD_ERROR(torch_zip(pickle("ctorch\nFloatStorage\n")),
                   "the data holds the bare global 'torch.FloatStorage'");
  CHECK_LOAD_ERROR(torch_zip(pickle("X\x06\x00\x00\x00moduleX\x01\x00\x00\x00x\x86Q"s)),
                   "a persistent id that is not a storage");
  CHECK_LOAD_ERROR(torch_zip(pickle("\x8f")), "a set; accel has no value for sets");
}

TEST_CASE("memo abuse, depth, cycles and sizes are bounded") {
  CHECK_LOAD_ERROR(torch_zip(pickle("h\x05")), "memo entry 5 is read before it is written");
  CHECK_LOAD_ERROR(torch_zip(pickle("j\xff\xff\xff\xff")),
                   "memo entry 4294967295 is read before it is written");
  // A billion laughs: list i holds list i-1 twice, and the top list holds lists 1 to 40: a tree
  // of 2^41 values from 600 bytes.
  std::string ops = "]]r"s + le(1, 4) + "a";
  for (int i = 2; i <= 40; ++i)
    ops += "]r" + le(uint64_t(i), 4) + "(j" + le(uint64_t(i - 1), 4) + "j" +
           le(uint64_t(i - 1), 4) + "ea";
  CHECK_LOAD_ERROR(torch_zip(pickle(ops)), "(shared references expanding a small pickle?)");
  // A list that contains itself, and one nested 200 deep.
  CHECK_LOAD_ERROR(torch_zip(pickle("]q\x00h\x00"s + "a")), "nests deeper than 100 levels");
  CHECK_LOAD_ERROR(torch_zip(pickle(std::string(200, ']') + std::string(199, 'a'))),
                   "nests deeper than 100 levels");
  // Lengths beyond the pickle, bad strings and integers, stack and mark misuse.
  CHECK_LOAD_ERROR(torch_zip(pickle("X\xff\xff\xff\x7f")),
                   "the pickle ends in the middle of an opcode");
  CHECK_LOAD_ERROR(torch_zip(pickle(std::string("X\x02\x00\x00\x00\xc3\x28", 7))),
                   "a string that is not valid UTF-8");
  CHECK_LOAD_ERROR(torch_zip(pickle("\x8a\x09" + std::string(8, '\0') + "\x01")),
                   "an integer that does not fit 64 bits");
  CHECK_LOAD_ERROR(torch_zip(pickle("a")), "the pickle stack is empty");
  CHECK_LOAD_ERROR(torch_zip(pickle("]K\x01K\x02s")), "SETITEM(S) on a list");
  CHECK_LOAD_ERROR(torch_zip(pickle("}]K\x01s")), "a dict key of type list");
  CHECK_LOAD_ERROR(torch_zip(pickle("(N")), "marks left over");
  CHECK_LOAD_ERROR(torch_zip("\x80\x06N."), "pickle protocol 6");
  CHECK_LOAD_ERROR(torch_zip(pickle("N") + "junk"), "4 bytes after the end of the pickle");
  // A storage referenced with two sizes.
  Pickler p;
  p.begin_list(2);
  p.tensor("0", kFloat32, 4, 0, {4}, {1}, false);
  p.tensor("0", kFloat32, 2, 0, {2}, {1}, false);
  p.end();
  CHECK_LOAD_ERROR(torch_zip(p.finish(), {{"0", floats(4)}}),
                   "storage '0' is referenced as 2 float32 elements and as 4 float32 elements");
}

TEST_CASE("the legacy layout: counts, sizes, byte order") {
  const std::string legacy = read_file(fixture("torch_legacy.pt"));
  {  // The first storage's element count (little-endian int64 after the key list's pickle).
    std::string bad = legacy;
    const size_t keys_end = legacy.find("e.", legacy.rfind("\x80\x02]")) + 2;
    put(bad, keys_end, 999, 8);
    CHECK_LOAD_ERROR(bad, "holds 999 elements, but the data describes");
  }
  {  // The system info says big-endian.
    std::string bad = legacy;
    const size_t at = legacy.find("little_endian");
    REQUIRE(at != std::string::npos);
    const size_t flag = legacy.find('\x88', at);
    bad[flag] = '\x89';
    CHECK_LOAD_ERROR(bad, "written on a big-endian machine");
  }
}

TEST_CASE("what is not a regular file is refused before it is read") {
  TempDir dir;
  CHECK_THROWS_AS(io::read_pt(dir.file("missing.pt")), IoError);
  CHECK_THROWS_AS(io::read_pt(dir.path.string()), IoError);
  REQUIRE(::mkfifo(dir.file("fifo.pt").c_str(), 0600) == 0);
  CHECK_THROWS_AS(io::read_pt(dir.file("fifo.pt")), IoError);  // without blocking on the FIFO
}
