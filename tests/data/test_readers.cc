// IDX, token-file, CSV and fortunes readers, on fixtures in a temp dir and on the real data.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>

#include "helpers.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;

namespace {

// Runs f, expecting an IoError whose message contains every fragment.
template <typename F>
void check_io_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    const std::string msg = e.what();
    for (const auto& frag : fragments) {
      CAPTURE(msg);
      CHECK(msg.find(frag) != std::string::npos);
    }
  }
}

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = uint8_t((i * 37) % 256);
  return p;
}

}  // namespace

TEST_CASE("IDX: plain and gzip images and labels load with the right values") {
  TempDir d;
  const auto img = idx_bytes(0x08, {3, 2, 2}, pixels(12));
  write_bytes(d.file("img"), img);
  write_bytes(d.file("img.gz"), gzip_bytes(img));
  for (const char* name : {"img", "img.gz"}) {
    Tensor u8 = read_idx_images(d.file(name), kUInt8);
    CHECK(u8.sizes() == Shape{3, 2, 2});
    CHECK(u8.dtype() == kUInt8);
    CHECK(u8.to_vector<int64_t>()[5] == (5 * 37) % 256);
    Tensor f = read_idx_images(d.file(name));
    CHECK(f.dtype() == kFloat32);
    CHECK(f.tolist()[5] == doctest::Approx(double((5 * 37) % 256) / 255.0));
  }
  write_bytes(d.file("lab"), idx_bytes(0x08, {4}, {9, 0, 3, 7}));
  Tensor l = read_idx_labels(d.file("lab"));
  CHECK(l.dtype() == kInt64);
  CHECK(ints(l) == std::vector<int64_t>{9, 0, 3, 7});
  // Generic reader: big-endian int16 and float32.
  write_bytes(d.file("s16"), idx_bytes(0x0B, {2}, {0xff, 0xfe, 0x01, 0x00}));
  CHECK(ints(read_idx(d.file("s16"))) == std::vector<int64_t>{-2, 256});
  write_bytes(d.file("f32"), idx_bytes(0x0D, {1}, {0x3f, 0xc0, 0x00, 0x00}));
  CHECK(read_idx(d.file("f32")).tolist() == std::vector<double>{1.5});
  // Concatenated gzip members are one stream.
  auto a = gzip_bytes(std::vector<uint8_t>(img.begin(), img.begin() + 7));
  auto b = gzip_bytes(std::vector<uint8_t>(img.begin() + 7, img.end()));
  a.insert(a.end(), b.begin(), b.end());
  write_bytes(d.file("multi.gz"), a);
  CHECK(read_idx_images(d.file("multi.gz"), kUInt8).tolist() ==
        read_idx_images(d.file("img"), kUInt8).tolist());
}

TEST_CASE("IDX: malformed files are rejected with the file and the problem named") {
  TempDir d;
  const auto good = idx_bytes(0x08, {3, 2, 2}, pixels(12));
  auto write = [&](const std::string& n, const std::vector<uint8_t>& b) {
    write_bytes(d.file(n), b);
    return d.file(n);
  };
  const auto truncated = write("truncated", std::vector<uint8_t>(good.begin(), good.end() - 1));
  check_io_error([&] { read_idx_images(truncated); }, {"truncated", "file has 11"});
  auto trailing = good;
  trailing.push_back(0);
  const auto tr = write("trailing", trailing);
  check_io_error([&] { read_idx_images(tr); }, {"trailing", "trailing bytes"});
  auto magic = good;
  magic[0] = 0x12;
  const auto bm = write("badmagic", magic);
  check_io_error([&] { read_idx(bm); }, {"badmagic", "bad magic 0x12000803"});
  auto type = good;
  type[2] = 0x07;
  const auto bt = write("badtype", type);
  check_io_error([&] { read_idx(bt); }, {"badtype", "unknown element type 0x07"});
  const auto hdr = write("shorthdr", std::vector<uint8_t>(good.begin(), good.begin() + 9));
  check_io_error([&] { read_idx(hdr); }, {"shorthdr", "truncated header"});
  const auto tiny = write("tiny", {0, 0});
  check_io_error([&] { read_idx(tiny); }, {"tiny", "too short"});
  const auto empty_f = write("empty", {});
  check_io_error([&] { read_idx(empty_f); }, {"empty", "0 bytes"});
  // Images with the wrong rank or type.
  const auto lab = write("labels_as_images", idx_bytes(0x08, {4}, {1, 2, 3, 4}));
  check_io_error([&] { read_idx_images(lab); }, {"labels_as_images", "3 dimensions"});
  const auto fl = write("float_labels", idx_bytes(0x0D, {1}, {0, 0, 0, 0}));
  check_io_error([&] { read_idx_labels(fl); }, {"float_labels", "ubyte"});
  // gzip: garbage after a valid magic, a cut-off stream, trailing garbage.
  const auto gz = gzip_bytes(good);
  std::vector<uint8_t> garbage{0x1f, 0x8b, 0x08, 0x00};
  for (int i = 0; i < 60; ++i) garbage.push_back(uint8_t(i * 91 + 7));
  const auto gg = write("garbage.gz", garbage);
  check_io_error([&] { read_idx(gg); }, {"garbage.gz", "gzip"});
  const auto gt =
      write("cut.gz", std::vector<uint8_t>(gz.begin(), gz.begin() + long(gz.size() / 2)));
  check_io_error([&] { read_idx(gt); }, {"cut.gz", "truncated gzip"});
  auto gtr = gz;
  gtr.push_back('x');
  const auto gtp = write("trail.gz", gtr);
  check_io_error([&] { read_idx(gtp); }, {"trail.gz", "trailing garbage"});
  check_io_error([&] { read_idx(d.file("missing")); }, {"missing", "cannot open"});
  check_io_error([&] { read_idx(d.str()); }, {"not a regular file"});
}

TEST_CASE("load_mnist: layout options and count mismatch") {
  TempDir d;
  write_bytes(d.file("train-images-idx3-ubyte.gz"),
              gzip_bytes(idx_bytes(0x08, {3, 2, 2}, pixels(12))));
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {3}, {1, 2, 3}));
  MnistOptions o;
  o.flatten = true;
  auto ds = load_mnist(d.str(), o);
  CHECK(ds->size() == 3);
  CHECK(ds->get(0)["image"].sizes() == Shape{4});
  o.flatten = false;
  o.channel = true;
  CHECK(load_mnist(d.str(), o)->get(0)["image"].sizes() == Shape{1, 2, 2});
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {2}, {1, 2}));
  check_io_error([&] { load_mnist(d.str()); }, {"3 images", "2 labels"});
  o.train = false;
  check_io_error([&] { load_mnist(d.str(), o); }, {"t10k-images-idx3-ubyte"});
}

TEST_CASE("real Fashion-MNIST loads with the right shapes and labels") {
  const std::string dir = kFashionMnistDir;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << dir << " not installed (Debian package dataset-fashion-mnist)");
    return;
  }
  auto train = load_mnist(dir);
  const Tensor& x = train->tensors()[0];
  const Tensor& y = train->tensors()[1];
  CHECK(x.sizes() == Shape{60000, 28, 28});
  CHECK(y.sizes() == Shape{60000});
  const float* px = x.data<float>();
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  std::vector<int64_t> hist(10, 0);
  for (int64_t v : ints(y)) {
    REQUIRE((v >= 0 && v <= 9));
    ++hist[size_t(v)];
  }
  for (int64_t h : hist) CHECK(h == 6000);  // Fashion-MNIST is balanced
  MnistOptions o;
  o.train = false;
  o.dtype = kUInt8;
  auto test = load_mnist(dir, o);
  CHECK(test->tensors()[0].sizes() == Shape{10000, 28, 28});
  CHECK(test->tensors()[0].dtype() == kUInt8);
}

TEST_CASE("token files: widths, windows, and malformed files") {
  TempDir d;
  std::vector<int64_t> toks(50);
  std::iota(toks.begin(), toks.end(), 1000);
  write_token_file(d.file("t16.bin"), toks, TokenType::UInt16);
  auto f = TokenFile::open(d.file("t16.bin"), {TokenType::UInt16, 0, 0});
  CHECK(f->size() == 50);
  CHECK((*f)[49] == 1049);
  CHECK(f->max_token() == 1049);
  TokenWindowDataset w(f, 8);
  CHECK(w.size() == (50 - 9) / 8 + 1);
  Example e = w.get(2);
  CHECK(ints(e["x"]) == std::vector<int64_t>{1016, 1017, 1018, 1019, 1020, 1021, 1022, 1023});
  CHECK(ints(e["y"])[7] == 1024);
  Example b;
  REQUIRE(w.get_batch(std::vector<int64_t>{2, 0}, nullptr, b));
  CHECK(b["x"].sizes() == Shape{2, 8});
  CHECK(ints(b["y"])[0] == 1017);
  CHECK(ints(b["y"])[8] == 1001);
  TokenWindowDataset overlap(f, 8, 1);
  CHECK(overlap.size() == 42);
  CHECK(ints(overlap.get(41)["y"])[7] == 1049);

  write_token_file(d.file("t32.bin"), {70000, 1}, TokenType::UInt32);
  CHECK((*TokenFile::open(d.file("t32.bin"), {TokenType::UInt32, 0, 0}))[0] == 70000);
  CHECK_THROWS_AS(write_token_file(d.file("x"), {70000}, TokenType::UInt16), ValueError);

  write_token_file(d.file("three.bin"), {1, 2, 3}, TokenType::UInt16);  // 6 bytes
  check_io_error(
      [&] {
        TokenFile::open(d.file("three.bin"), {TokenType::UInt32, 0, 0});
      },
      {"three.bin", "2 stray bytes"});
  write_bytes(d.file("odd.bin"), {1, 2, 3});
  check_io_error([&] { TokenFile::open(d.file("odd.bin")); }, {"odd.bin", "not a whole number"});
  write_bytes(d.file("empty.bin"), {});
  check_io_error([&] { TokenFile::open(d.file("empty.bin")); }, {"empty.bin", "no tokens"});
  check_io_error(
      [&] {
        TokenFile::open(d.file("t16.bin"), {TokenType::UInt16, 0, 1024});
      },
      {"t16.bin", "token 1024 at position 24", "vocabulary of 1024"});
  check_io_error([&] { TokenWindowDataset(f, 50); }, {"t16.bin", "needs at least 51"});
  check_io_error([&] { TokenFile::open(d.file("nope.bin")); }, {"nope.bin", "cannot open"});
  CHECK_THROWS_AS(TokenFile::open(d.file("t16.bin"), {TokenType::UInt16, 3, 0}), ValueError);
  // Header skipped.
  auto h = TokenFile::open(d.file("t16.bin"), {TokenType::UInt16, 4, 0});
  CHECK((*h)[0] == 1002);
}

TEST_CASE("CSV: header detection, values, and malformed files") {
  TempDir d;
  write_file(d.file("a.csv"), "a, b ,c\n1,2.5,-3\n\n4, 5e1 ,\"6\"\r\n");
  CsvTable t = read_csv(d.file("a.csv"));
  CHECK(t.columns == std::vector<std::string>{"a", "b", "c"});
  CHECK(t.values.sizes() == Shape{2, 3});
  CHECK(t.values.tolist() == std::vector<double>{1, 2.5, -3, 4, 50, 6});
  write_file(d.file("nohdr.csv"), "1;2\n+3;4\n");
  CsvOptions semi;
  semi.delimiter = ';';
  semi.dtype = kFloat64;
  CsvTable n = read_csv(d.file("nohdr.csv"), semi);
  CHECK(n.columns.empty());
  CHECK(n.values.dtype() == kFloat64);
  CHECK(n.values.tolist() == std::vector<double>{1, 2, 3, 4});
  write_file(d.file("gz.csv.gz"), "");
  write_bytes(d.file("gz.csv.gz"), gzip_bytes({'7', ',', '8', '\n'}));
  CHECK(read_csv(d.file("gz.csv.gz")).values.tolist() == std::vector<double>{7, 8});

  write_file(d.file("ragged.csv"), "1,2,3\n4,5\n");
  check_io_error([&] { read_csv(d.file("ragged.csv")); },
                 {"ragged.csv", "line 2 has 2 fields, expected 3"});
  write_file(d.file("word.csv"), "x,y\n1,2\n3,abc\n");
  check_io_error([&] { read_csv(d.file("word.csv")); }, {"word.csv", "line 3, column 2", "'abc'"});
  write_file(d.file("hole.csv"), "1,2,3\n4,,6\n");
  check_io_error([&] { read_csv(d.file("hole.csv")); },
                 {"hole.csv", "line 2, column 2: empty field"});
  write_file(d.file("onlyhdr.csv"), "a,b\n");
  check_io_error([&] { read_csv(d.file("onlyhdr.csv")); }, {"onlyhdr.csv", "no data rows"});
  write_file(d.file("blank.csv"), "\n\n");
  check_io_error([&] { read_csv(d.file("blank.csv")); }, {"blank.csv", "no data rows"});
  CsvOptions forced;
  forced.header = false;
  write_file(d.file("h.csv"), "a,b\n1,2\n");
  check_io_error([&] { read_csv(d.file("h.csv"), forced); }, {"line 1, column 1", "'a'"});

  write_file(d.file("ds.csv"), "f1,f2,label\n0.5,1,2\n1.5,2,0\n");
  auto ds = csv_dataset(d.file("ds.csv"));
  CHECK(ds->size() == 2);
  CHECK(ds->get(0)["features"].tolist() == std::vector<double>{0.5, 1});
  CHECK(ds->get(1)["target"].item<int64_t>() == 0);
  CHECK(ds->get(1)["target"].dtype() == kInt64);
  check_io_error([&] { csv_dataset(d.file("ds.csv"), 0); },
                 {"ds.csv", "0.5 is not a whole number"});
  CHECK_THROWS_AS(csv_dataset(d.file("ds.csv"), 3), IndexError);
}

TEST_CASE("fortunes corpus: plain files in sorted order, skipping .dat, .u8 and directories") {
  TempDir d;
  write_file(d.file("b"), "BBB");
  write_file(d.file("a"), "A");
  write_file(d.file("a.dat"), "index");
  REQUIRE(symlink("a", d.file("a.u8").c_str()) == 0);
  REQUIRE(symlink("b", d.file("c-link").c_str()) == 0);  // a link to a file is read
  std::filesystem::create_directory(d.file("dir"));
  write_file(d.file("dir/inner"), "nope");
  REQUIRE(symlink("dir", d.file("dirlink").c_str()) == 0);
  REQUIRE(symlink("gone", d.file("dangling").c_str()) == 0);
  auto corpus = read_fortunes_corpus(d.str());
  CHECK(std::string(corpus.begin(), corpus.end()) == "ABBBBBB");
  auto files = fortunes_files(d.str());
  REQUIRE(files.size() == 3);
  CHECK(std::filesystem::path(files[2]).filename() == "c-link");
  TempDir empty_dir;
  check_io_error([&] { read_fortunes_corpus(empty_dir.str()); }, {"no fortune files"});
  check_io_error([&] { read_fortunes_corpus(d.file("missing")); }, {"not a directory"});

  if (!std::filesystem::is_directory(kFortunesDir)) {
    MESSAGE("skipped the real corpus: " << kFortunesDir << " not installed (package fortunes)");
    return;
  }
  auto real = read_fortunes_corpus();
  size_t total = 0;
  for (const auto& f : fortunes_files()) {
    CHECK(f.find(".dat") == std::string::npos);
    total += std::filesystem::file_size(f);
  }
  CHECK(real.size() == total);
  CHECK(real.size() > 1000000);
  auto tf = TokenFile::from_bytes(real, TokenType::UInt8, "fortunes");
  TokenWindowDataset w(tf, 128);
  CHECK(w.size() == (int64_t(real.size()) - 129) / 128 + 1);
  CHECK(tf->max_token() < 256);
}
