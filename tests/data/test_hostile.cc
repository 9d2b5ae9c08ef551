// Readers on hostile input: sizes that overflow, gzip bombs, values out of range, positions that
// overflow. Each case here crashed, allocated without bound, or loaded garbage before the fix.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <sys/stat.h>

#include <climits>
#include <cstring>
#include <filesystem>

#include "helpers.h"
#include "tests/common/child_process.h"
#include "tests/common/check.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;
using accel::test::expect_error;
using accel::test::expect_error_child;
using accel::test::run_in_child;

namespace {

// gzip of `prefix` followed by `zeros` zero bytes, deflated in a stream (the input is never
// held in memory whole: 1 GB of zeros compresses to ~1 MB).
std::vector<uint8_t> gzip_zeros(const std::vector<uint8_t>& prefix, size_t zeros) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(size_t(1) << 20, 0), buf(size_t(1) << 16);
  auto pump = [&](const uint8_t* in, size_t n, int flush) {
    zs.next_in = const_cast<Bytef*>(in);
    zs.avail_in = uInt(n);
    do {
      zs.next_out = buf.data();
      zs.avail_out = uInt(buf.size());
      deflate(&zs, flush);
      out.insert(out.end(), buf.data(), buf.data() + (buf.size() - zs.avail_out));
    } while (zs.avail_out == 0);
  };
  pump(prefix.data(), prefix.size(), Z_NO_FLUSH);
  for (size_t left = zeros; left > 0;) {
    const size_t n = std::min(left, chunk.size());
    pump(chunk.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  pump(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

// Peak resident set of this process in MiB.
long peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

// Runs f in a child process and returns how much its peak RSS grew (MiB) while f ran, or -1
// when f did not throw an IoError containing `fragment`. In a child, the parent's earlier peaks
// do not hide the growth.
template <typename F>
long child_rss_growth(F&& f, const std::string& fragment) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const long before = peak_rss_mib();
    int code = 100;
    try {
      f();
    } catch (const IoError& e) {
      code = std::string(e.what()).find(fragment) != std::string::npos ? 0 : 101;
    } catch (...) {
      code = 102;
    }
    const long grew = peak_rss_mib() - before;
    _exit(code != 0 ? code : int(std::min<long>(grew, 99)));
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  const int code = WEXITSTATUS(status);
  return code >= 100 ? -1 : code;
}

}  // namespace

TEST_CASE("IDX: dimensions whose product overflows are an IoError, not a tensor over 0 bytes") {
  TempDir d;
  // 65536^4 = 2^64 elements: the unchecked product wrapped to 0, matching a 0-byte payload.
  write_bytes(d.file("wrap"), idx_bytes(0x08, {65536, 65536, 65536, 65536}, {}));
  const std::string msg = expect_error<IoError>([&] { read_idx(d.file("wrap")); });
  CHECK(msg.find("[idx]") == 0);
  CHECK(msg.find(d.file("wrap")) != std::string::npos);
  CHECK(msg.find("(65536, 65536, 65536, 65536)") != std::string::npos);
  // Also when the payload is gzip-compressed, and for wider types.
  write_bytes(d.file("wrap.gz"), gzip_bytes(idx_bytes(0x0E, {0xffffffff, 0xffffffff}, {})));
  CHECK(expect_error<IoError>([&] { read_idx(d.file("wrap.gz")); }).find("2^48") !=
        std::string::npos);
  // A zero dimension is an empty tensor however large the others.
  write_bytes(d.file("zero"), idx_bytes(0x08, {0, 65536, 65536, 65536, 65536}, {}));
  CHECK(read_idx(d.file("zero")).numel() == 0);
}

TEST_CASE("IDX: a gzip bomb is rejected after inflating only the declared size") {
  TempDir d;
  // The header declares 1000 bytes; the stream holds 256 MiB more. Before, all of it was
  // inflated into memory before the size check.
  constexpr size_t kBomb = size_t(256) << 20;
  write_bytes(d.file("bomb.gz"), gzip_zeros(idx_bytes(0x08, {1000}, {}), kBomb));
  const long grew = child_rss_growth([&] { read_idx_labels(d.file("bomb.gz")); }, "trailing bytes");
  CHECK(grew >= 0);
  CHECK(grew < 64);  // MiB; the compressed file is ~1 MiB and the payload 1000 bytes
  // Truncated (declared more than the stream holds) and exact sizes still behave.
  write_bytes(d.file("short.gz"), gzip_zeros(idx_bytes(0x08, {1000}, {}), 999));
  CHECK(expect_error<IoError>([&] { read_idx(d.file("short.gz")); }).find("truncated") !=
        std::string::npos);
  write_bytes(d.file("exact.gz"), gzip_zeros(idx_bytes(0x08, {1000}, {}), 1000));
  CHECK(read_idx_labels(d.file("exact.gz")).numel() == 1000);
}

TEST_CASE("CSV: inflation stops at max_bytes; integral targets must fit their dtype") {
  TempDir d;
  std::vector<uint8_t> rows;
  for (int i = 0; i < 1000; ++i) rows.insert(rows.end(), {'1', ',', '2', '\n'});
  write_bytes(d.file("rows.csv.gz"), gzip_zeros(rows, 0));
  CsvOptions o;
  o.max_bytes = 100;
  CHECK(expect_error<IoError>([&] {
          read_csv(d.file("rows.csv.gz"), o);
        }).find("more than 100 bytes") != std::string::npos);
  o.max_bytes = 4000;
  CHECK(read_csv(d.file("rows.csv.gz"), o).values.size(0) == 1000);
  // Raw files obey the same limit.
  write_file(d.file("rows.csv"), "1,2\n3,4\n");
  o.max_bytes = 4;
  CHECK_THROWS_AS(read_csv(d.file("rows.csv"), o), IoError);

  // A whole number beyond int64 converted with a plain cast is undefined (it gave INT64_MIN).
  write_file(d.file("big.csv"), "1,5\n2,1e30\n");
  const std::string msg = expect_error<IoError>([&] { csv_dataset(d.file("big.csv"), -1); });
  CHECK(msg.find("out of range for int64") != std::string::npos);
  CHECK(msg.find("data row 2") != std::string::npos);
  write_file(d.file("int32.csv"), "1,2147483648\n");
  CHECK_THROWS_AS(csv_dataset(d.file("int32.csv"), -1, {}, kInt32), IoError);
  write_file(d.file("ok.csv"), "1,-2147483648\n");
  CHECK(csv_dataset(d.file("ok.csv"), -1, {}, kInt32)->get(0)["target"].item<int32_t>() ==
        INT32_MIN);
}

TEST_CASE("token files: positions and windows that overflow are errors, not wild reads") {
  auto f = TokenFile::from_bytes(std::vector<uint8_t>(16, 7), TokenType::UInt8, "mem");
  std::vector<int64_t> out(4);
  // start + n overflowed to a negative number that passed the bounds check.
  CHECK_THROWS_AS(f->read(INT64_MAX, 2, out.data()), IndexError);
  CHECK_THROWS_AS(f->read(15, INT64_MAX, out.data()), IndexError);
  f->read(12, 4, out.data());
  CHECK(out == std::vector<int64_t>{7, 7, 7, 7});
  // context + 1 overflowed for context = INT64_MAX.
  CHECK_THROWS_AS(TokenWindowDataset(f, INT64_MAX), IoError);
  CHECK(token_window_count(16, 15, 1, "mem") == 1);
  CHECK_THROWS_AS(token_window_count(16, 16, 1, "mem"), IoError);
  CHECK(token_window_count(17, 4, INT64_MAX, "mem") == 1);
  // The options overload checks the header and the vocabulary like open().
  TokenFileOptions o;
  o.type = TokenType::UInt16;
  o.header_bytes = 2;
  o.vocab_size = 5;
  CHECK(TokenFile::from_bytes({9, 9, 4, 0, 1, 0}, o, "mem")->size() == 2);
  CHECK_THROWS_AS(TokenFile::from_bytes({9, 9, 5, 0}, o, "mem"), IoError);
}

TEST_CASE("IDX: a header declaring more than the reader may hold fails before inflating") {
  TempDir d;
  // 4 GB of labels declared, 256 MiB of zeros in the stream: before, the stream was inflated up
  // to its end (the report saw 1.2 GB) before "truncated". Now the header alone is refused.
  constexpr size_t kStream = size_t(256) << 20;
  write_bytes(d.file("4g.gz"), gzip_zeros(idx_bytes(0x08, {4000000000u}, {}), kStream));
  const long grew =
      child_rss_growth([&] { read_idx_labels(d.file("4g.gz")); }, "more than the limit of");
  CHECK(grew >= 0);
  CHECK(grew < 64);  // MiB
  // Below the limit but beyond what the compressed bytes can hold (~1032:1; these 128 MiB of
  // zeros compress ~230:1 to ~0.6 MB): refused as truncated at once, not after inflating them.
  write_bytes(d.file("900m.gz"), gzip_zeros(idx_bytes(0x08, {900000000u}, {}), kStream / 2));
  const long grew2 = child_rss_growth([&] { read_idx_labels(d.file("900m.gz")); }, "truncated");
  CHECK(grew2 >= 0);
  CHECK(grew2 < 64);
  // The limit is the caller's: IdxOptions::max_bytes, for raw and gzip files alike.
  write_bytes(d.file("lab.gz"), gzip_bytes(idx_bytes(0x08, {1000}, std::vector<uint8_t>(1000, 3))));
  write_bytes(d.file("lab"), idx_bytes(0x08, {1000}, std::vector<uint8_t>(1000, 3)));
  for (const char* f : {"lab.gz", "lab"}) {
    CAPTURE(f);
    const std::string msg =
        expect_error<IoError>([&] { read_idx_labels(d.file(f), IdxOptions{999}); });
    CHECK(msg.find("1000 data bytes, more than the limit of 999 bytes") != std::string::npos);
    CHECK(read_idx_labels(d.file(f), IdxOptions{1000}).numel() == 1000);
  }
  // load_mnist passes its limit on.
  write_bytes(d.file("train-images-idx3-ubyte"),
              idx_bytes(0x08, {2, 3, 3}, std::vector<uint8_t>(18)));
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {2}, {1, 2}));
  MnistOptions mo;
  CHECK(load_mnist(d.str(), mo)->size() == 2);
  mo.max_bytes = 10;
  CHECK(expect_error<IoError>([&] { load_mnist(d.str(), mo); }).find("more than the limit of 10") !=
        std::string::npos);
}

TEST_CASE("hostile files: a FIFO or a device in place of a data file is an IoError, no hang") {
  TempDir d;
  for (const char* name : {"fifo.idx", "fifo.bin", "fifo.csv"})
    REQUIRE(mkfifo(d.file(name).c_str(), 0600) == 0);
  // Before, open() blocked until a writer came: the suite hung. The reads run in children with
  // a deadline, so a regression fails these checks instead.
  auto r = expect_error_child<IoError>([&] { read_idx(d.file("fifo.idx")); }, "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "read_idx blocked on a FIFO");
  CHECK(r.ok());
  r = expect_error_child<IoError>([&] { TokenFile::open(d.file("fifo.bin")); }, "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "TokenFile::open blocked on a FIFO");
  CHECK(r.ok());
  r = expect_error_child<IoError>([&] { read_csv(d.file("fifo.csv")); }, "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "read_csv blocked on a FIFO");
  CHECK(r.ok());
  // A link to a device: followed (data files may be links) and refused for what it is.
  std::filesystem::create_symlink("/dev/zero", d.file("zero.bin"));
  CHECK(expect_error<IoError>([&] {
          TokenFile::open(d.file("zero.bin"));
        }).find("is a character device") != std::string::npos);
  CHECK(expect_error<IoError>([&] {
          read_idx(d.file("zero.bin"));
        }).find("is a character device") != std::string::npos);
  // A link to a regular file is a legitimate data file.
  write_bytes(d.file("real.bin"), {1, 0, 2, 0, 3, 0});
  std::filesystem::create_symlink(d.file("real.bin"), d.file("link.bin"));
  CHECK(TokenFile::open(d.file("link.bin"))->size() == 3);
}

TEST_CASE("token files: a file truncated while in use is an IoError, not SIGBUS") {
  TempDir d;
  std::vector<int64_t> tokens(200000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int64_t(i % 50000);
  write_token_file(d.file("t.bin"), tokens, TokenType::UInt16);
  // Opened, read, then cut to 4 KiB by another writer (a second descriptor): reading a window
  // past the cut killed the process with SIGBUS when the file was mapped.
  const auto r = run_in_child([&] {
    auto f = TokenFile::open(d.file("t.bin"));
    TokenWindowDataset ds(f, 64);
    if (ds.get(3000)["x"].tolist()[0] != double(3000 * 64 % 50000)) return 10;
    const int fd = ::open(d.file("t.bin").c_str(), O_WRONLY);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) return 11;
    ::close(fd);
    try {
      ds.get(3000);
    } catch (const IoError& e) {
      const std::string m = e.what();
      return m.find("is now 4096 bytes, 400000 when it was opened") != std::string::npos ? 0 : 12;
    }
    return 13;
  });
  CHECK_MESSAGE(r.signal == 0, "killed by signal ", r.signal);
  CHECK(r.code == 0);
  // The widening reads agree with the tokens, at every width.
  write_token_file(d.file("t.bin"), tokens, TokenType::UInt16);
  auto f = TokenFile::open(d.file("t.bin"));
  std::vector<int64_t> out(5);
  f->read(199995, 5, out.data());
  CHECK(out == std::vector<int64_t>{49995, 49996, 49997, 49998, 49999});
  CHECK((*f)[123457] == 123457 % 50000);
  CHECK(f->max_token() == 49999);
  write_token_file(d.file("t8.bin"), {1, 2, 3, 255, 0}, TokenType::UInt8);
  write_token_file(d.file("t32.bin"), {70000, 1, 4000000000}, TokenType::UInt32);
  std::vector<int64_t> three(3);
  TokenFile::open(d.file("t8.bin"), {TokenType::UInt8, 0, 0})->read(2, 3, three.data());
  CHECK(three == std::vector<int64_t>{3, 255, 0});
  TokenFile::open(d.file("t32.bin"), {TokenType::UInt32, 0, 0})->read(0, 3, three.data());
  CHECK(three == std::vector<int64_t>{70000, 1, 4000000000});
}
