#include "data/image_codec.h"

// clang-format off
#include <csetjmp>
#include <cstdio>
#include <png.h>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace accel::data {

namespace {

// Note [hostile images]: the functions marked "protected" below call setjmp and hold only plain
// C values, so a longjmp out of libpng/libjpeg into them skips no C++ destructor.

// ------------------------------------------------------------------ PNG

struct PngIo {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;  // reading
  size_t size = 0, pos = 0;
  std::string* out = nullptr;  // writing
  bool out_of_memory = false;
  char msg[256] = {0};
};

extern "C" void png_error_cb(png_structp png, png_const_charp m) {
  auto* io = static_cast<PngIo*>(png_get_error_ptr(png));
  std::snprintf(io->msg, sizeof io->msg, "%s", m ? m : "unknown libpng error");
  png_longjmp(png, 1);
}
extern "C" void png_warning_cb(png_structp, png_const_charp) {}

extern "C" void png_read_cb(png_structp png, png_bytep dst, size_t n) {
  auto* io = static_cast<PngIo*>(png_get_io_ptr(png));
  if (n > io->size - io->pos) png_error(png, "unexpected end of file (truncated)");
  std::memcpy(dst, io->data + io->pos, n);
  io->pos += n;
}

extern "C" void png_write_cb(png_structp png, png_bytep src, size_t n) {
  auto* io = static_cast<PngIo*>(png_get_io_ptr(png));
  try {
    io->out->append(reinterpret_cast<const char*>(src), n);
  } catch (...) {
    io->out_of_memory = true;
  }
  if (io->out_of_memory) png_error(png, "out of memory");
}
extern "C" void png_flush_cb(png_structp) {}

struct PngReadGuard {
  PngIo& io;
  ~PngReadGuard() {
    if (io.png) png_destroy_read_struct(&io.png, io.info ? &io.info : nullptr, nullptr);
  }
};
struct PngWriteGuard {
  PngIo& io;
  ~PngWriteGuard() {
    if (io.png) png_destroy_write_struct(&io.png, io.info ? &io.info : nullptr);
  }
};

// Protected. Reads the header and sets up expansion to 8-bit gray / gray+alpha / RGB / RGBA;
// a palette image is read as one 8-bit index per pixel (`*palette`), which expand_palette maps.
bool png_read_header(PngIo& io, uint32_t* w, uint32_t* h, int* channels, bool* palette) {
  if (setjmp(png_jmpbuf(io.png))) return false;
  png_set_read_fn(io.png, &io, png_read_cb);
  png_read_info(io.png, io.info);
  *palette = png_get_color_type(io.png, io.info) == PNG_COLOR_TYPE_PALETTE;
  if (*palette) {
    png_set_packing(io.png);  // 1, 2, 4-bit indices -> one byte each
  } else {
    png_set_expand(io.png);  // gray < 8 bits -> 8 bits, tRNS -> alpha
  }
  png_set_strip_16(io.png);
  png_set_interlace_handling(io.png);
  png_read_update_info(io.png, io.info);
  *w = png_get_image_width(io.png, io.info);
  *h = png_get_image_height(io.png, io.info);
  *channels = png_get_channels(io.png, io.info);
  return true;
}

// Protected.
bool png_read_pixels(PngIo& io, png_bytepp rows) {
  if (setjmp(png_jmpbuf(io.png))) return false;
  png_read_image(io.png, rows);
  png_read_end(io.png, nullptr);
  return true;
}

// Protected.
bool png_write_all(PngIo& io, uint32_t w, uint32_t h, int color_type, int level, png_bytepp rows) {
  if (setjmp(png_jmpbuf(io.png))) return false;
  png_set_write_fn(io.png, &io, png_write_cb, png_flush_cb);
  png_set_IHDR(io.png, io.info, w, h, 8, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(io.png, level);
  png_write_info(io.png, io.info);
  png_write_image(io.png, rows);
  png_write_end(io.png, io.info);
  return true;
}

// Note [png palette indices]
// libpng's palette expansion maps an index past the end of PLTE to black (its palette is padded
// with zeros to 256 entries) and, in the libpng of Debian 12 (1.6.39), says nothing: its
// invalid-index check runs on write only. Such a file is corrupt, so palette images are read as
// indices, checked against PLTE here, and expanded to RGB (RGBA when a tRNS chunk gives alpha)
// as libpng would.
void expand_palette(PngIo& io, DecodedImage& img, const char* op, const std::string& what) {
  png_colorp plte = nullptr;
  int entries = 0;
  png_get_PLTE(io.png, io.info, &plte, &entries);
  png_bytep trans = nullptr;
  int num_trans = 0;
  png_get_tRNS(io.png, io.info, &trans, &num_trans, nullptr);
  if (trans == nullptr) num_trans = 0;
  const size_t n = size_t(img.width) * size_t(img.height);
  uint8_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, img.pixels[i]);
  ACCEL_CHECK(int(top) < entries, IoError, op, what, ": a pixel uses palette index ", int(top),
              ", but the palette (PLTE) has ", entries,
              " entries (corrupt image; libpng would decode it as black)");
  const int c = num_trans > 0 ? 4 : 3;
  std::vector<uint8_t> out(n * size_t(c));
  for (size_t i = 0; i < n; ++i) {
    const uint8_t k = img.pixels[i];
    uint8_t* o = out.data() + i * size_t(c);
    o[0] = plte[k].red;
    o[1] = plte[k].green;
    o[2] = plte[k].blue;
    if (c == 4) o[3] = k < num_trans ? trans[k] : 255;
  }
  img.pixels = std::move(out);
  img.channels = c;
}

void check_pixels(uint64_t w, uint64_t h, const ImageLimits& limits, const char* op,
                  const std::string& what) {
  ACCEL_CHECK(w > 0 && h > 0, IoError, op, what, ": image has zero size (", w, " x ", h, ")");
  // w, h < 2^32 each, so the product fits in 64 bits.
  ACCEL_CHECK(w * h <= uint64_t(limits.max_pixels), IoError, op, what, ": ", w, " x ", h, " = ",
              w * h, " pixels exceeds the limit of ", limits.max_pixels,
              " (ImageLimits::max_pixels; a decompression bomb?)");
}

// ------------------------------------------------------------------ JPEG

struct JpegErr {
  jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX + 64];
};

extern "C" void jpeg_error_exit_cb(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  std::longjmp(e->jb, 1);
}

// Warnings that mean lost or corrupt data are errors (Note [hostile images]); the benign ones
// (extra bytes between markers, an unknown JFIF revision or Adobe transform) are ignored.
extern "C" void jpeg_emit_message_cb(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  const int code = c->err->msg_code;
  if (code == JWRN_EXTRANEOUS_DATA || code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM ||
      code == JWRN_BOGUS_ICC)
    return;
  jpeg_error_exit_cb(c);
}
extern "C" void jpeg_output_message_cb(j_common_ptr) {}

extern "C" void jpeg_progress_cb(j_common_ptr c) {
  if (!c->is_decompressor) return;
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* e = reinterpret_cast<JpegErr*>(c->err);
    std::snprintf(e->msg, sizeof e->msg, "more than %d scans (a progressive-JPEG CPU bomb?)",
                  kMaxJpegScans);
    std::longjmp(e->jb, 1);
  }
}

void jpeg_install_errors(jpeg_error_mgr* pub) {
  jpeg_std_error(pub);
  pub->error_exit = jpeg_error_exit_cb;
  pub->emit_message = jpeg_emit_message_cb;
  pub->output_message = jpeg_output_message_cb;
}

struct JpegDecompress {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  jpeg_progress_mgr progress;
  bool created = false;
  ~JpegDecompress() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Protected. Header, then output set-up and jpeg_start_decompress once the declared size passed
// the limit (start_decompress allocates the working buffers).
bool jpeg_read_header_checked(JpegDecompress& j, const uint8_t* data, size_t size,
                              const ImageLimits& limits, bool* too_big) {
  if (setjmp(j.err.jb)) return false;
  jpeg_create_decompress(&j.cinfo);
  j.created = true;
  j.cinfo.mem->max_memory_to_use = long(limits.max_memory);
  j.progress.progress_monitor = jpeg_progress_cb;
  j.cinfo.progress = &j.progress;
  jpeg_mem_src(&j.cinfo, data, (unsigned long)size);
  jpeg_read_header(&j.cinfo, TRUE);
  const uint64_t w = j.cinfo.image_width, h = j.cinfo.image_height;
  if (w == 0 || h == 0 || w * h > uint64_t(limits.max_pixels)) {
    *too_big = true;
    return true;
  }
  switch (j.cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE: j.cinfo.out_color_space = JCS_GRAYSCALE; break;
    case JCS_CMYK:
    case JCS_YCCK: j.cinfo.out_color_space = JCS_CMYK; break;
    default: j.cinfo.out_color_space = JCS_RGB;
  }
  jpeg_start_decompress(&j.cinfo);
  return true;
}

// Protected.
bool jpeg_read_pixels(JpegDecompress& j, uint8_t* dst, size_t row_bytes) {
  if (setjmp(j.err.jb)) return false;
  while (j.cinfo.output_scanline < j.cinfo.output_height) {
    JSAMPROW row = dst + size_t(j.cinfo.output_scanline) * row_bytes;
    if (jpeg_read_scanlines(&j.cinfo, &row, 1) != 1) {
      std::snprintf(j.err.msg, sizeof j.err.msg, "no scanline %u (truncated)",
                    j.cinfo.output_scanline);
      return false;
    }
  }
  jpeg_finish_decompress(&j.cinfo);
  return true;
}

struct JpegCompress {
  jpeg_compress_struct cinfo;
  JpegErr err;
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  bool created = false;
  ~JpegCompress() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buf);
  }
};

// Protected.
bool jpeg_write_all(JpegCompress& j, const uint8_t* pixels, uint32_t w, uint32_t h, int channels,
                    int quality) {
  if (setjmp(j.err.jb)) return false;
  jpeg_create_compress(&j.cinfo);
  j.created = true;
  jpeg_mem_dest(&j.cinfo, &j.buf, &j.len);
  j.cinfo.image_width = w;
  j.cinfo.image_height = h;
  j.cinfo.input_components = channels;
  j.cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&j.cinfo);
  jpeg_set_quality(&j.cinfo, quality, TRUE);
  jpeg_start_compress(&j.cinfo, TRUE);
  const size_t row_bytes = size_t(w) * size_t(channels);
  while (j.cinfo.next_scanline < j.cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels) + size_t(j.cinfo.next_scanline) * row_bytes;
    jpeg_write_scanlines(&j.cinfo, &row, 1);
  }
  jpeg_finish_compress(&j.cinfo);
  return true;
}

void check_encode_args(int64_t h, int64_t w, int64_t c, int64_t max_c, const char* op,
                       const std::string& what) {
  ACCEL_CHECK(h > 0 && w > 0 && h <= 0x7fffffff && w <= 0x7fffffff, ValueError, op, what,
              ": image size ", h, " x ", w, " must be positive and below 2^31");
  ACCEL_CHECK(c >= 1 && c <= max_c && (max_c != 3 || c != 2), ValueError, op, what, ": ", c,
              " channels; ", max_c == 4 ? "PNG takes 1 to 4" : "JPEG takes 1 or 3");
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  static const uint8_t kPngSig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  if (size >= 8 && std::memcmp(data, kPngSig, 8) == 0) return ImageFormat::kPng;
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::kJpeg;
  return ImageFormat::kUnknown;
}

DecodedImage decode_png_bytes(const uint8_t* data, size_t size, const std::string& what,
                              const ImageLimits& limits) {
  const char* op = "decode_png";
  ACCEL_CHECK(sniff_image_format(data, size) == ImageFormat::kPng, IoError, op, what,
              ": not a PNG file (no PNG signature; ", size, " bytes)");
  PngIo io;
  io.data = data;
  io.size = size;
  PngReadGuard guard{io};
  io.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &io, png_error_cb, png_warning_cb);
  ACCEL_CHECK(io.png != nullptr, IoError, op, what, ": cannot create a libpng reader");
  io.info = png_create_info_struct(io.png);
  ACCEL_CHECK(io.info != nullptr, IoError, op, what, ": cannot create a libpng info struct");
  uint32_t w = 0, h = 0;
  int channels = 0;
  bool palette = false;
  ACCEL_CHECK(png_read_header(io, &w, &h, &channels, &palette), IoError, op, what, ": ", io.msg);
  check_pixels(w, h, limits, op, what);
  ACCEL_CHECK(channels >= 1 && channels <= 4, IoError, op, what, ": unexpected ", channels,
              " channels after expansion");
  DecodedImage img;
  img.height = h;
  img.width = w;
  img.channels = channels;
  const size_t row_bytes = size_t(w) * size_t(channels);
  ACCEL_CHECK(png_get_rowbytes(io.png, io.info) == row_bytes, IoError, op, what,
              ": unexpected row size ", png_get_rowbytes(io.png, io.info));
  img.pixels.resize(row_bytes * h);
  std::vector<png_bytep> rows(h);
  for (uint32_t y = 0; y < h; ++y) rows[y] = img.pixels.data() + size_t(y) * row_bytes;
  ACCEL_CHECK(png_read_pixels(io, rows.data()), IoError, op, what, ": ", io.msg);
  if (palette) expand_palette(io, img, op, what);  // Note [png palette indices]
  return convert_image(std::move(img), limits.mode);
}

DecodedImage decode_jpeg_bytes(const uint8_t* data, size_t size, const std::string& what,
                               const ImageLimits& limits) {
  const char* op = "decode_jpeg";
  ACCEL_CHECK(sniff_image_format(data, size) == ImageFormat::kJpeg, IoError, op, what,
              ": not a JPEG file (no SOI marker; ", size, " bytes)");
  JpegDecompress j;
  j.cinfo.err = &j.err.pub;
  jpeg_install_errors(&j.err.pub);
  j.err.msg[0] = 0;
  bool too_big = false;
  ACCEL_CHECK(jpeg_read_header_checked(j, data, size, limits, &too_big), IoError, op, what, ": ",
              j.err.msg);
  if (too_big) check_pixels(j.cinfo.image_width, j.cinfo.image_height, limits, op, what);
  const int c = j.cinfo.output_components;
  ACCEL_CHECK(c == 1 || c == 3 || c == 4, IoError, op, what, ": unexpected ", c,
              " output components");
  DecodedImage img;
  img.height = j.cinfo.output_height;
  img.width = j.cinfo.output_width;
  img.channels = c;
  const size_t row_bytes = size_t(img.width) * size_t(c);
  img.pixels.resize(row_bytes * size_t(img.height));
  ACCEL_CHECK(jpeg_read_pixels(j, img.pixels.data(), row_bytes), IoError, op, what, ": ",
              j.err.msg);
  if (c == 4) {
    // CMYK -> RGB exactly as PIL converts it (Adobe files store the ink inverted; PIL reads
    // them as "CMYK;I"): nk = 255 - K, R = nk - round(C * nk / 255), ...
    const bool inverted = j.cinfo.saw_Adobe_marker;
    const size_t n = size_t(img.height * img.width);
    std::vector<uint8_t> rgb(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* q = img.pixels.data() + i * 4;
      const int nk = 255 - (inverted ? 255 - q[3] : q[3]);
      for (int ch = 0; ch < 3; ++ch) {
        const int ink = inverted ? 255 - q[ch] : q[ch];
        const int t = ink * nk + 128;
        rgb[i * 3 + ch] = uint8_t(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
      }
    }
    img.pixels = std::move(rgb);
    img.channels = 3;
  }
  return convert_image(std::move(img), limits.mode);
}

DecodedImage decode_image_bytes(const uint8_t* data, size_t size, const std::string& what,
                                const ImageLimits& limits) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kPng: return decode_png_bytes(data, size, what, limits);
    case ImageFormat::kJpeg: return decode_jpeg_bytes(data, size, what, limits);
    default:
      ACCEL_THROW(IoError, "decode_image", what, ": neither PNG nor JPEG (unknown signature; ",
                  size, " bytes)");
  }
}

DecodedImage convert_image(DecodedImage img, ImageMode mode) {
  const int64_t from = img.channels;
  const int64_t to = mode == ImageMode::kAny    ? from
                     : mode == ImageMode::kGray ? 1
                     : mode == ImageMode::kRGB  ? 3
                                                : 4;
  if (to == from) return img;
  ACCEL_CHECK(from >= 1 && from <= 4, ValueError, "convert_image", "cannot convert ", from,
              " channels");
  const size_t n = size_t(img.height * img.width);
  std::vector<uint8_t> out(n * size_t(to));
  const uint8_t* src = img.pixels.data();
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = src + i * size_t(from);
    const bool color = from >= 3;
    const uint8_t r = p[0], g = color ? p[1] : p[0], b = color ? p[2] : p[0];
    const uint8_t a = (from == 2 || from == 4) ? p[from - 1] : 255;
    uint8_t* q = out.data() + i * size_t(to);
    if (to == 1) {
      q[0] = color ? uint8_t((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) : r;
    } else {
      q[0] = r;
      q[1] = g;
      q[2] = b;
      if (to == 4) q[3] = a;
    }
  }
  img.pixels = std::move(out);
  img.channels = to;
  return img;
}

std::string encode_png_bytes(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels,
                             const std::string& what, int compression) {
  const char* op = "encode_png";
  check_encode_args(height, width, channels, 4, op, what);
  ACCEL_CHECK(compression >= 0 && compression <= 9, ValueError, op,
              "compression level must be in 0..9, got ", compression);
  static const int kColor[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA,
                                PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA};
  std::string out;
  PngIo io;
  io.out = &out;
  PngWriteGuard guard{io};
  io.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &io, png_error_cb, png_warning_cb);
  ACCEL_CHECK(io.png != nullptr, IoError, op, what, ": cannot create a libpng writer");
  io.info = png_create_info_struct(io.png);
  ACCEL_CHECK(io.info != nullptr, IoError, op, what, ": cannot create a libpng info struct");
  const size_t row_bytes = size_t(width) * size_t(channels);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y)
    rows[size_t(y)] = const_cast<uint8_t*>(pixels) + size_t(y) * row_bytes;
  ACCEL_CHECK(png_write_all(io, uint32_t(width), uint32_t(height), kColor[channels], compression,
                            rows.data()),
              IoError, op, what, ": ", io.msg);
  return out;
}

std::string encode_jpeg_bytes(const uint8_t* pixels, int64_t height, int64_t width,
                              int64_t channels, const std::string& what, int quality) {
  const char* op = "encode_jpeg";
  check_encode_args(height, width, channels, 3, op, what);
  ACCEL_CHECK(height <= JPEG_MAX_DIMENSION && width <= JPEG_MAX_DIMENSION, ValueError, op, what,
              ": JPEG images are at most ", JPEG_MAX_DIMENSION, " pixels a side, got ", height,
              " x ", width);
  ACCEL_CHECK(quality >= 1 && quality <= 100, ValueError, op, "quality must be in 1..100, got ",
              quality);
  JpegCompress j;
  j.cinfo.err = &j.err.pub;
  jpeg_install_errors(&j.err.pub);
  j.err.msg[0] = 0;
  ACCEL_CHECK(jpeg_write_all(j, pixels, uint32_t(width), uint32_t(height), int(channels), quality),
              IoError, op, what, ": ", j.err.msg);
  return std::string(reinterpret_cast<const char*>(j.buf), size_t(j.len));
}

}  // namespace accel::data
