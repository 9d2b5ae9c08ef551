// Image decoding on hostile files (Note [hostile images] in data/image_codec.h): truncated
// files, bad headers, corrupt bytes, huge declared dimensions, FIFOs and devices. Each must be an
// IoError naming the file, never a crash, an abort, a hang or an unbounded allocation. The cases
// that could crash or hang run in a forked child (tests/common/child_process.h).
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "data/image.h"
#include "tests/common/child_process.h"

using namespace accel;
using namespace accel::data;
using accel::test::expect_error_child;
using accel::test::run_in_child;

namespace {

const std::string kImages = std::string(ACCEL_SOURCE_ROOT) + "/tests/data/images/";

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string tmp_path(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base && *base ? base : "/tmp") + "/accel-img-" + std::to_string(getpid()) +
         "-" + name;
}

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

// A copy of a PNG with IHDR's width and height replaced (CRC recomputed, so libpng accepts the
// chunk and the size check is ours).
std::vector<uint8_t> png_with_size(std::vector<uint8_t> png, uint32_t w, uint32_t h) {
  // Signature (8), IHDR length (4), "IHDR" (4), width at 16, height at 20, CRC at 29.
  REQUIRE(std::memcmp(png.data() + 12, "IHDR", 4) == 0);
  put_be32(png.data() + 16, w);
  put_be32(png.data() + 20, h);
  const uint32_t crc = uint32_t(crc32(0, png.data() + 12, 17));
  put_be32(png.data() + 29, crc);
  return png;
}

// A copy of a baseline JPEG with its SOF0 frame size replaced.
std::vector<uint8_t> jpeg_with_size(std::vector<uint8_t> jpg, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < jpg.size(); ++i) {
    if (jpg[i] == 0xff && (jpg[i + 1] == 0xc0 || jpg[i + 1] == 0xc2)) {
      // FF C0, length (2), precision (1), height (2), width (2).
      jpg[i + 5] = uint8_t(h >> 8);
      jpg[i + 6] = uint8_t(h);
      jpg[i + 7] = uint8_t(w >> 8);
      jpg[i + 8] = uint8_t(w);
      return jpg;
    }
  }
  FAIL("no SOF marker");
  return jpg;
}

std::string decode_error(const std::vector<uint8_t>& b, const std::string& what,
                         const ImageOptions& o = {}) {
  try {
    decode_image(b.data(), b.size(), what, o);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hostile images: every truncation of a PNG and a JPEG is an IoError naming the file") {
  // Runs in a child: before the fix a longjmp/abort in the C library would kill the suite.
  for (const char* file : {"rgb.png", "palette.png", "rgb.jpg", "progressive.jpg", "cmyk.jpg"}) {
    INFO(file);
    const std::vector<uint8_t> full = slurp(kImages + file);
    auto r = run_in_child([&]() -> int {
      for (size_t n = 0; n < full.size(); ++n) {
        std::vector<uint8_t> part(full.begin(), full.begin() + ptrdiff_t(n));
        const std::string msg = decode_error(part, "cut.img");
        if (msg.find("cut.img") == std::string::npos) {
          std::fprintf(stderr, "prefix of %zu bytes: no IoError naming the file ('%s')\n", n,
                       msg.c_str());
          return 1;
        }
      }
      return 0;
    });
    CHECK(r.ok());
  }
}

TEST_CASE("hostile images: truncated file on disk through read_image") {
  const std::string path = tmp_path("trunc.jpg");
  const std::vector<uint8_t> full = slurp(kImages + "rgb.jpg");
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(full.data()), std::streamsize(full.size() * 2 / 3));
  }
  try {
    read_image(path);
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    const std::string m = e.what();
    CHECK(m.find(path) != std::string::npos);
    CHECK(m.find("decode_jpeg") != std::string::npos);
  }
  ::unlink(path.c_str());
}

TEST_CASE("hostile images: bad signatures and corrupt headers") {
  CHECK(decode_error({}, "empty.png").find("neither PNG nor JPEG") != std::string::npos);
  CHECK(decode_error({'G', 'I', 'F', '8', '9', 'a'}, "x.gif").find("x.gif") != std::string::npos);
  std::vector<uint8_t> png = slurp(kImages + "rgb.png");
  png[18] ^= 0x40;  // width changed, CRC not: libpng's CRC error
  CHECK(decode_error(png, "crc.png").find("crc.png") != std::string::npos);
  std::vector<uint8_t> bad_depth = png_with_size(slurp(kImages + "rgb.png"), 7, 5);
  bad_depth[24] = 7;  // bit depth 7 (CRC now wrong too; either error is fine)
  CHECK(decode_error(bad_depth, "depth.png").find("depth.png") != std::string::npos);
  // Zero size, with a valid CRC.
  CHECK(
      decode_error(png_with_size(slurp(kImages + "rgb.png"), 0, 5), "zero.png").find("zero.png") !=
      std::string::npos);
  std::vector<uint8_t> jpg = slurp(kImages + "rgb.jpg");
  for (size_t i = 2; i < 40; ++i) jpg[i] = 0x00;  // wreck the markers after SOI
  CHECK(decode_error(jpg, "bad.jpg").find("bad.jpg") != std::string::npos);
  // libjpeg's hard errors (ERREXIT, whose default handler calls exit()): no image at all, and an
  // unsupported sample precision. In a child, so a regression cannot end the suite.
  CHECK(expect_error_child<IoError>(
            [] {
              decode_image(std::vector<uint8_t>{0xff, 0xd8, 0xff, 0xd9}.data(), 4, "soi.jpg");
            },
            "soi.jpg")
            .ok());
  std::vector<uint8_t> prec = slurp(kImages + "rgb.jpg");
  for (size_t i = 2; i + 4 < prec.size(); ++i)
    if (prec[i] == 0xff && prec[i + 1] == 0xc0) {
      prec[i + 4] = 13;  // FF C0, length (2), precision
      break;
    }
  CHECK(expect_error_child<IoError>([&] { decode_image(prec.data(), prec.size(), "p13.jpg"); },
                                    "p13.jpg")
            .ok());
}

TEST_CASE("hostile images: huge declared dimensions are refused before any allocation") {
  // 60000 x 60000 = 3.6e9 pixels (10.8 GB as RGB) declared by a 84-byte PNG: refused from the
  // header. The child has a 4 GB address-space limit, so an allocation would fail there instead.
  const auto png = png_with_size(slurp(kImages + "rgb.png"), 60000, 60000);
  auto r = expect_error_child<IoError>(
      [&] {
        struct rlimit lim {
          size_t(4) << 30, size_t(4) << 30
        };
        setrlimit(RLIMIT_AS, &lim);
        decode_image(png.data(), png.size(), "bomb.png");
      },
      "max_pixels");
  CHECK(r.ok());
  const auto jpg = jpeg_with_size(slurp(kImages + "rgb.jpg"), 65000, 65000);
  auto rj = expect_error_child<IoError>(
      [&] {
        struct rlimit lim {
          size_t(4) << 30, size_t(4) << 30
        };
        setrlimit(RLIMIT_AS, &lim);
        decode_image(jpg.data(), jpg.size(), "bomb.jpg");
      },
      "max_pixels");
  CHECK(rj.ok());
  // The cap is an option: a 7 x 5 image over a cap of 34 pixels.
  ImageOptions o;
  o.max_pixels = 34;
  CHECK(decode_error(slurp(kImages + "rgb.png"), "small.png", o).find("35 pixels exceeds") !=
        std::string::npos);
  o.max_pixels = 35;
  CHECK(decode_error(slurp(kImages + "rgb.png"), "small.png", o).empty());
  // A JPEG whose declared frame is larger than its data: truncated scan, an error not grey.
  const auto big = jpeg_with_size(slurp(kImages + "rgb.jpg"), 240, 160);
  CHECK(decode_error(big, "short.jpg").find("short.jpg") != std::string::npos);
}

TEST_CASE("hostile images: every single-byte corruption decodes or throws IoError") {
  // A bounded sweep (the fuzz targets go further): flip each byte of small files.
  for (const char* file : {"rgb.png", "gray.jpg"}) {
    INFO(file);
    const std::vector<uint8_t> full = slurp(kImages + file);
    auto r = run_in_child([&]() -> int {
      for (size_t i = 0; i < full.size(); ++i) {
        std::vector<uint8_t> b = full;
        b[i] ^= 0xa5;
        try {
          Tensor t = decode_image(b.data(), b.size(), "flip");
          if (t.dim() != 3 || t.size(2) != 3) return 2;
        } catch (const IoError&) {
        }
      }
      return 0;
    });
    CHECK(r.ok());
  }
}

TEST_CASE("hostile images: FIFOs, devices and folders are IoErrors, never a hang") {
  const std::string fifo = tmp_path("fifo.png");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto r = expect_error_child<IoError>([&] { read_image(fifo); }, "FIFO", 60.0);
  CHECK(r.ok());
  ::unlink(fifo.c_str());
  CHECK(expect_error_child<IoError>([&] { read_image("/dev/zero"); }, "/dev/zero").ok());
  CHECK(expect_error_child<IoError>([&] { read_image(kImages); }, "director").ok());
  CHECK_THROWS_AS(read_image(kImages + "missing.png"), IoError);
  // A file over the byte cap is refused before it is read.
  ImageOptions o;
  o.max_file_bytes = 50;
  CHECK_THROWS_AS(read_image(kImages + "rgb.jpg", o), IoError);
}

namespace {

// A PNG chunk: length, type, data, CRC of type and data.
void put_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  uint8_t len[4];
  put_be32(len, uint32_t(data.size()));
  out.insert(out.end(), len, len + 4);
  const size_t at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  uint8_t crc[4];
  put_be32(crc, uint32_t(crc32(0, out.data() + at, uInt(4 + data.size()))));
  out.insert(out.end(), crc, crc + 4);
}

// A palette PNG of `w` x `h` pixels of `depth` bits (8 or 4), `entries` palette colours
// (entry i = (40 i, 40 i + 1, 40 i + 2)), the pixels' indices row by row.
std::vector<uint8_t> palette_png(uint32_t w, uint32_t h, int depth, int entries,
                                 const std::vector<uint8_t>& indices,
                                 const std::vector<uint8_t>& trns = {}) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  std::vector<uint8_t> ihdr(13, 0);
  put_be32(ihdr.data(), w);
  put_be32(ihdr.data() + 4, h);
  ihdr[8] = uint8_t(depth);
  ihdr[9] = 3;  // colour type: palette
  put_chunk(png, "IHDR", ihdr);
  std::vector<uint8_t> plte;
  for (int i = 0; i < entries; ++i)
    for (int c = 0; c < 3; ++c) plte.push_back(uint8_t(40 * i + c));
  put_chunk(png, "PLTE", plte);
  if (!trns.empty()) put_chunk(png, "tRNS", trns);  // alpha of the first entries
  std::vector<uint8_t> raw;  // filter byte 0 per row, then the packed indices
  for (uint32_t y = 0; y < h; ++y) {
    raw.push_back(0);
    if (depth == 8) {
      for (uint32_t x = 0; x < w; ++x) raw.push_back(indices[y * w + x]);
    } else {
      for (uint32_t x = 0; x < w; x += 2) {
        const uint8_t hi = indices[y * w + x], lo = x + 1 < w ? indices[y * w + x + 1] : 0;
        raw.push_back(uint8_t(hi << 4 | lo));
      }
    }
  }
  uLongf n = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(n);
  REQUIRE(compress(z.data(), &n, raw.data(), uLong(raw.size())) == Z_OK);
  z.resize(n);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", {});
  return png;
}

}  // namespace

TEST_CASE("hostile images: a palette index past the end of PLTE is an IoError, not black") {
  for (int depth : {8, 4}) {
    CAPTURE(depth);
    // Valid: indices 0..2 of 3 entries decode to the palette's colours.
    const std::vector<uint8_t> ok = palette_png(4, 2, depth, 3, {0, 1, 2, 1, 2, 1, 0, 0});
    Tensor img = decode_image(ok.data(), ok.size(), "ok.png");
    REQUIRE(img.sizes() == Shape{2, 4, 3});  // (H, W, C) uint8
    // Row 0's red channel; row 1's blue one.
    CHECK(img.to(kFloat64).select(0, 0).select(1, 0).tolist() ==
          std::vector<double>{0, 40, 80, 40});
    CHECK(img.to(kFloat64).select(0, 1).select(1, 2).tolist() == std::vector<double>{82, 42, 2, 2});
    // tRNS: alpha of entries 0 and 1; entry 2 is opaque.
    const std::vector<uint8_t> t = palette_png(4, 2, depth, 3, {0, 1, 2, 1, 2, 1, 0, 0}, {7, 9});
    ImageOptions any;
    any.mode = ImageMode::kAny;
    Tensor rgba = decode_image(t.data(), t.size(), "trns.png", any);
    REQUIRE(rgba.sizes() == Shape{2, 4, 4});
    CHECK(rgba.to(kFloat64).select(0, 0).select(1, 3).tolist() ==
          std::vector<double>{7, 9, 255, 9});
    CHECK(rgba.to(kFloat64).select(0, 0).select(1, 1).tolist() ==
          std::vector<double>{1, 41, 81, 41});
    // Index 7 (and 5) with 3 entries: libpng expands them to black without a word.
    const std::vector<uint8_t> bad = palette_png(4, 2, depth, 3, {0, 1, 7, 1, 2, 5, 0, 0});
    const std::string msg = decode_error(bad, "palette.png");
    INFO(msg);
    CHECK(msg.find("palette.png") != std::string::npos);
    CHECK(msg.find("palette index 7") != std::string::npos);
    CHECK(msg.find("3 entries") != std::string::npos);
  }
}
