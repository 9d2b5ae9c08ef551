// safetensors checkpoints: round trips for every dtype, the exact byte layout, atomic writes,
// and a corpus of malformed files that must each give a clear IoError.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "accel.h"
#include "tests/common/child_process.h"
#include "tests/common/util.h"

using namespace accel;
namespace fs = std::filesystem;
using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;

namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A file with the given header text and `buffer_bytes` bytes of buffer (value 1 each, so BOOL
// tensors are valid).
std::string make_file(const std::string& header, size_t buffer_bytes) {
  return le64(header.size()) + header + std::string(buffer_bytes, '\x01');
}

// Loads `bytes` from a file and returns the IoError message (fails the test when none).
std::string load_error(const TempDir& dir, const std::string& bytes) {
  const std::string p = dir.file("bad.safetensors");
  write_file(p, bytes);
  try {
    io::load_safetensors(p);
  } catch (const IoError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[load_safetensors]") == 0);
    CHECK(msg.find(p) != std::string::npos);  // names the file
    return msg;
  } catch (const std::exception& e) {
    FAIL("expected IoError, got: " << e.what());
    return "";
  }
  FAIL("malformed file loaded without error");
  return "";
}

Tensor make(DType dt, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  Tensor t = empty(shape, dt);
  // Values that survive every dtype exactly: small integers (0/1 for bool).
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = dt == kBool ? double(i % 3 == 0) : double(i % 7) - 3;
  if (dt == kUInt8) {
    for (auto& x : v) x = std::abs(x);
  }
  Tensor src = tensor(v, shape.empty() ? Shape{} : shape, TensorOptions(kFloat64));
  t.copy_(src);
  return t;
}

}  // namespace

TEST_CASE("round trip of every dtype, 0-dim and empty tensors, and metadata") {
  TempDir dir;
  io::TensorDict tensors;
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    const std::string n(dtype_name(dt));
    tensors[n] = make(dt, {2, 3});
    tensors[n + ".scalar"] = make(dt, {});
    tensors[n + ".empty"] = make(dt, {0, 4});
  }
  // A non-contiguous view is written as its logical (contiguous) contents.
  Tensor base = make(kFloat32, {3, 4});
  tensors["transposed"] = base.t();
  const io::Metadata meta{{"format", "pt"}, {"step", "1200"}, {"note", "caf\xc3\xa9"}};
  const std::string p = dir.file("all.safetensors");
  io::save_safetensors(p, tensors, meta);

  io::Metadata got_meta;
  io::TensorDict back = io::load_safetensors(p, &got_meta);
  CHECK(got_meta == meta);
  REQUIRE(back.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(back.count(name));
    const Tensor& b = back.at(name);
    CHECK(b.dtype() == t.dtype());
    CHECK(b.sizes() == t.sizes());
    CHECK(b.device() == kCPU);
    CHECK(b.tolist() == t.tolist());
  }
  CHECK(back.at("float32.scalar").dim() == 0);
  CHECK(back.at("int64.empty").numel() == 0);
  // Bit-exact for the 16-bit floats.
  Tensor h = tensor({0.1f, -65504.f, 3.14159f}).to(kFloat16);
  Tensor bf = tensor({0.1f, -1e30f, 3.14159f}).to(kBFloat16);
  io::save_safetensors(p, {{"h", h}, {"bf", bf}});
  back = io::load_safetensors(p);
  CHECK(std::memcmp(back.at("h").data_ptr(), h.data_ptr(), 6) == 0);
  CHECK(std::memcmp(back.at("bf").data_ptr(), bf.data_ptr(), 6) == 0);
}

TEST_CASE("byte layout follows the HF format") {
  TempDir dir;
  const std::string p = dir.file("layout.safetensors");
  Tensor b = tensor({1.f, 2.f, 3.f});
  Tensor a = tensor(std::vector<int64_t>{7, 8}, Shape{2});
  io::save_safetensors(p, {{"b", b}, {"a", a}}, {{"k", "v"}});
  const std::string bytes = read_file(p);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  CHECK((8 + n) % 8 == 0);  // header padded so the buffer is 8-byte aligned
  const std::string header = bytes.substr(8, n);
  CHECK(header.find(R"("a":{"data_offsets":[0,16],"dtype":"I64","shape":[2]})") !=
        std::string::npos);
  CHECK(header.find(R"("b":{"data_offsets":[16,28],"dtype":"F32","shape":[3]})") !=
        std::string::npos);
  CHECK(header.find(R"("__metadata__":{"k":"v"})") != std::string::npos);
  CHECK(bytes.size() == 8 + n + 28);
  // Names sorted: a's bytes first.
  int64_t a0 = 0;
  std::memcpy(&a0, bytes.data() + 8 + n, 8);
  CHECK(a0 == 7);
  float b2 = 0;
  std::memcpy(&b2, bytes.data() + 8 + n + 16 + 8, 4);
  CHECK(b2 == 3.f);
}

TEST_CASE("a file written by another tool loads (spec example, unaligned header)") {
  TempDir dir;
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})";
  std::string buf(19, '\0');
  const float w[4] = {1.5f, -2.f, 0.25f, 8.f};
  std::memcpy(buf.data(), w, 16);
  buf[16] = 1, buf[17] = 0, buf[18] = 1;
  const std::string p = dir.file("ext.safetensors");
  write_file(p, le64(header.size()) + header + buf);
  io::TensorDict t = io::load_safetensors(p);
  CHECK(t.at("w").sizes() == Shape{2, 2});
  CHECK(t.at("w").tolist() == std::vector<double>{1.5, -2, 0.25, 8});
  CHECK(t.at("m").dtype() == kBool);
  CHECK(t.at("m").tolist() == std::vector<double>{1, 0, 1});
}

TEST_CASE("malformed files each give a clear IoError") {
  TempDir dir;
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;  // a piece of the message
  };
  const std::vector<Case> corpus = {
      {"shorter than the length field", std::string("\x05\x00\x00", 3), "too short"},
      {"truncated header", le64(100) + R"({"a":{"dtype")", "exceeds the"},
      {"huge header length", le64(uint64_t(1) << 40) + "{}", "exceeds the limit"},
      {"header length over 100 MB", le64(100'000'001) + "{}", "exceeds the limit"},
      {"not JSON", make_file("{this is not json}", 0), "not valid JSON"},
      {"not an object", make_file("[1, 2, 3]", 0), "does not start with '{'"},
      {"JSON followed by junk in the header", make_file("{}xyz", 0), "not valid JSON"},
      {"ill-formed UTF-8", make_file("{\"\xff\xfe\":{}}", 0), "not valid JSON"},
      {"duplicate tensor names",
       make_file("{" + ok_entry + "," + R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                 16),
       "duplicate key 'a'"},
      {"duplicate field inside an entry",
       make_file(R"({"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8),
       "duplicate key 'dtype'"},
      {"overlapping offsets",
       make_file("{" + ok_entry + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
       "overlap"},
      {"gap between offsets",
       make_file(
           "{" + ok_entry + "," + R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
       "gap of 4 bytes"},
      {"buffer not starting at 0",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "gap of 4"},
      {"offsets past EOF", make_file("{" + ok_entry + "}", 4), "past the end"},
      {"wrong dtype name",
       make_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
       "unknown dtype 'F33'"},
      {"dtype accel lacks",
       make_file(R"({"a":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", 8),
       "does not support"},
      {"shape / size mismatch",
       make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {"negative shape", make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "negative"},
      {"fractional shape",
       make_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), "non-integer"},
      {"shape product overflows",
       make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                 8),
       "overflows"},
      {"byte size overflows",
       make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
       "overflows"},
      {"offsets end before they begin",
       make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "end before"},
      {"missing data_offsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       "data_offsets"},
      {"entry not an object", make_file(R"({"a":[1,2]})", 0), "not an object"},
      {"metadata non-string", make_file("{" + ok_entry + R"(,"__metadata__":{"epoch":3}})", 8),
       "expected a string"},
      {"metadata not an object", make_file("{" + ok_entry + R"(,"__metadata__":"x"})", 8),
       "__metadata__ must be an object"},
      {"trailing garbage", make_file("{" + ok_entry + "}", 8) + "junk", "trailing data"},
      {"bool byte that is not 0/1",
       make_file(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 1) + "\x02",
       "expected 0 or 1"},
  };
  CHECK(corpus.size() >= 12);
  for (const Case& c : corpus) {
    INFO(c.what);
    const std::string msg = load_error(dir, c.bytes);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
  }
  // Missing file.
  CHECK_THROWS_AS(io::load_safetensors(dir.file("nope.safetensors")), IoError);
}

TEST_CASE("writes are atomic and leave no temporary files") {
  TempDir dir;
  const std::string p = dir.file("ckpt.safetensors");
  io::save_safetensors(p, {{"x", ones({4})}});
  io::save_safetensors(p, {{"x", zeros({5})}});  // replaces the old file in one rename
  CHECK(io::load_safetensors(p).at("x").tolist() == std::vector<double>(5, 0.0));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
  // Writing into a missing directory fails cleanly.
  CHECK_THROWS_AS(io::save_safetensors(dir.file("missing/x.safetensors"), {{"x", ones({1})}}),
                  IoError);
  // Reserved and undefined names are refused before anything is written.
  CHECK_THROWS_AS(io::save_safetensors(p, {{"__metadata__", ones({1})}}), ValueError);
  CHECK_THROWS_AS(io::save_safetensors(p, {{"u", Tensor()}}), ValueError);
  CHECK(io::load_safetensors(p).at("x").numel() == 5);  // untouched
}

TEST_CASE("hostile headers: nesting depth and rank are bounded, memory stays small") {
  TempDir dir;
  // 200000 nested arrays under an unknown key: valid JSON that the document-tree parser built
  // in full (a 20 MB header of them cost ~1 GB) and the loader then ignored.
  const size_t depth = 200000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  std::string msg = load_error(
      dir,
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" + nested + "}}", 8));
  CHECK_MESSAGE(msg.find("nests deeper than 4 levels") != std::string::npos, msg);
  // Nesting right at the root and inside metadata is caught the same way.
  msg = load_error(dir, make_file("{\"a\":" + nested + "}", 0));
  CHECK_MESSAGE(msg.find("not an object") != std::string::npos, msg);
  msg = load_error(dir, make_file(R"({"__metadata__":{"k":)" + nested + "}}", 0));
  CHECK_MESSAGE(msg.find("expected a string") != std::string::npos, msg);
  // One level of slack for an unknown field loads; two do not.
  const std::string entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  CHECK(io::load_safetensors([&] {
          const std::string p = dir.file("slack.safetensors");
          write_file(p, make_file("{\"a\":{" + entry + R"(,"x":[1,{"y":2}]}})", 8));
          return p;
        }())
            .size() == 1);
  msg = load_error(dir, make_file("{\"a\":{" + entry + R"(,"x":[[[1]]]}})", 8));
  CHECK_MESSAGE(msg.find("nests deeper") != std::string::npos, msg);

  // A shape of 1000 zero dimensions is 0 elements in 0 bytes, and loaded as a 1000-d tensor.
  std::string zeros = "0";
  for (int i = 1; i < 1000; ++i) zeros += ",0";
  msg = load_error(
      dir, make_file(R"({"z":{"dtype":"U8","shape":[)" + zeros + R"(],"data_offsets":[0,0]}})", 0));
  CHECK_MESSAGE(msg.find("more than 64 dimensions") != std::string::npos, msg);
  // 64 dimensions are fine.
  std::string ones = "1";
  for (int i = 1; i < 64; ++i) ones += ",1";
  const std::string p = dir.file("rank64.safetensors");
  write_file(
      p, make_file(R"({"o":{"dtype":"U8","shape":[)" + ones + R"(],"data_offsets":[0,1]}})", 1));
  CHECK(io::load_safetensors(p).at("o").dim() == 64);
  // Wrong types inside the schema name the field.
  msg =
      load_error(dir, make_file(R"({"a":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}})", 8));
  CHECK_MESSAGE(msg.find("no string 'dtype'") != std::string::npos, msg);
  msg =
      load_error(dir, make_file(R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8));
  CHECK_MESSAGE(msg.find("non-integer shape entry") != std::string::npos, msg);
  msg =
      load_error(dir, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8));
  CHECK_MESSAGE(msg.find("data_offsets") != std::string::npos, msg);
  // Metadata is only reported for a file that loads.
  io::Metadata md;
  const std::string bad = dir.file("md.safetensors");
  write_file(
      bad,
      make_file(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F33","shape":[],"data_offsets":[0,4]}})",
                4));
  CHECK_THROWS_AS(io::load_safetensors(bad, &md), IoError);
  CHECK(md.empty());
}

TEST_CASE("SafetensorsWriter streams tensors in the announced order, atomically") {
  TempDir dir;
  const std::string p = dir.file("stream.safetensors");
  Tensor a = arange(6, TensorOptions(kFloat32)).view({2, 3});
  Tensor b = full({4}, 2.5, TensorOptions(kFloat64));
  {
    io::SafetensorsWriter w(p, {{"b", kFloat64, {4}}, {"a", kFloat32, {2, 3}}}, {{"k", "v"}});
    w.write(b);
    CHECK_FALSE(fs::exists(p));  // nothing visible before commit
    w.write(a.t().t());          // any layout: written contiguously
    w.commit();
  }
  io::Metadata md;
  io::TensorDict d = io::load_safetensors(p, &md);
  CHECK(d.at("a").tolist() == a.tolist());
  CHECK(d.at("b").tolist() == b.tolist());
  CHECK(md.at("k") == "v");
  // Same bytes as save_safetensors' tensors (the loader is the judge of layout).
  const std::string q = dir.file("whole.safetensors");
  io::save_safetensors(q, {{"a", a}, {"b", b}});
  CHECK(io::load_safetensors(q).at("a").tolist() == d.at("a").tolist());
  {
    io::SafetensorsWriter w(dir.file("bad.safetensors"), {{"x", kFloat32, {2}}});
    CHECK_THROWS_WITH_AS(w.write(ones({3})), doctest::Contains("announced"), ValueError);
    CHECK_THROWS_AS(w.commit(), ValueError);  // 0 of 1 written
  }
  {
    io::SafetensorsWriter w(dir.file("abandoned.safetensors"), {{"x", kFloat32, {2}}});
    w.write(ones({2}));
  }  // destroyed without commit: no file, no temporary
  CHECK_FALSE(fs::exists(dir.file("bad.safetensors")));
  CHECK_FALSE(fs::exists(dir.file("abandoned.safetensors")));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 2);
  CHECK_THROWS_AS(io::SafetensorsWriter(p, {{"x", kFloat32, {1}}, {"x", kFloat32, {1}}}),
                  ValueError);
}

TEST_CASE(
    "hostile files: FIFOs and devices are refused without blocking; links are not followed "
    "by writes") {
  TempDir dir;
  // A FIFO in place of the file: open() blocked until a writer came (the suite hung). The read
  // runs in a child with a deadline, so a regression fails here instead.
  REQUIRE(mkfifo(dir.file("fifo.safetensors").c_str(), 0600) == 0);
  const auto r = test::expect_error_child<IoError>(
      [&] { io::load_safetensors(dir.file("fifo.safetensors")); }, "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "load_safetensors blocked on a FIFO");
  CHECK(r.ok());
  fs::create_symlink("/dev/zero", dir.file("zero.safetensors"));
  CHECK_THROWS_WITH_AS(io::load_safetensors(dir.file("zero.safetensors")),
                       doctest::Contains("is a character device"), IoError);
  // A link to a regular file loads (a Hugging Face cache links into blobs/).
  io::save_safetensors(dir.file("blob"), {{"w", ones({3})}});
  fs::create_symlink(dir.file("blob"), dir.file("model.safetensors"));
  CHECK(io::load_safetensors(dir.file("model.safetensors")).at("w").numel() == 3);
  // Saving over that link replaces the link with a file: the blob it named is untouched.
  io::save_safetensors(dir.file("model.safetensors"), {{"w", zeros({5})}});
  CHECK(!fs::is_symlink(dir.file("model.safetensors")));
  CHECK(io::load_safetensors(dir.file("blob")).at("w").numel() == 3);
  CHECK(io::load_safetensors(dir.file("model.safetensors")).at("w").numel() == 5);
}
