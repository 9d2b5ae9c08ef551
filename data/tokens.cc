#include "data/tokens.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace accel::data {

namespace {

template <typename F>
decltype(auto) dispatch_token(TokenType t, F&& fn) {
  switch (t) {
    case TokenType::UInt8: return fn.template operator()<uint8_t>();
    case TokenType::UInt16: return fn.template operator()<uint16_t>();
    case TokenType::UInt32: return fn.template operator()<uint32_t>();
  }
  ACCEL_THROW(ValueError, "tokens", "unknown token type ", int(t));
}

size_t width(TokenType t) { return size_t(t); }

}  // namespace

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::UInt8: return "uint8";
    case TokenType::UInt16: return "uint16";
    case TokenType::UInt32: return "uint32";
  }
  return "unknown";
}

void TokenFile::init(size_t nbytes, TokenFileOptions o) {
  const size_t w = width(o.type);
  ACCEL_CHECK(w == 1 || w == 2 || w == 4, ValueError, "tokens", "unknown token type ", int(o.type));
  ACCEL_CHECK(o.header_bytes % w == 0, ValueError, "tokens", "header_bytes ", o.header_bytes,
              " is not a multiple of the ", w, "-byte ", token_type_name(o.type), " token");
  ACCEL_CHECK(nbytes > o.header_bytes, IoError, "tokens", "'", name_, "' is ", nbytes,
              " bytes: no tokens after the ", o.header_bytes, "-byte header");
  const size_t payload = nbytes - o.header_bytes;
  ACCEL_CHECK(payload % w == 0, IoError, "tokens", "'", name_, "': ", payload,
              " bytes of tokens is not a whole number of ", token_type_name(o.type), " tokens (",
              payload % w, " stray bytes; wrong token type or truncated file?)");
  type_ = o.type;
  header_bytes_ = o.header_bytes;
  n_ = int64_t(payload / w);
  if (o.vocab_size > 0) {
    dispatch_token(type_, [&]<typename T>() {
      scan<T>([&](const T* p, int64_t count, int64_t first) {
        for (int64_t i = 0; i < count; ++i) {
          ACCEL_CHECK(int64_t(p[i]) < o.vocab_size, IoError, "tokens", "'", name_, "': token ",
                      int64_t(p[i]), " at position ", first + i, " is outside the vocabulary of ",
                      o.vocab_size);
        }
      });
    });
  }
}

void TokenFile::read_raw(int64_t first, int64_t count, void* dst) const {
  const size_t w = width(type_);
  const uint64_t offset = header_bytes_ + uint64_t(first) * w;
  const size_t bytes = size_t(count) * w;
  if (!fd_) {
    std::memcpy(dst, owned_.data() + offset, bytes);
    return;
  }
  if (file_io::pread_all(fd_.get(), dst, bytes, offset)) return;
  // Note [token files are read, not mapped]: a shrunken file is an error, not a SIGBUS.
  const int err = errno;
  struct stat st {};
  const bool shrank = err == 0 && ::fstat(fd_.get(), &st) == 0;
  ACCEL_THROW(IoError, "tokens", "'", name_, "': cannot read ", count, " tokens at position ",
              first, ": ",
              shrank ? "the file is now " + std::to_string(st.st_size) + " bytes, " +
                           std::to_string(file_bytes_) +
                           " when it was opened (truncated or replaced while in use?)"
                     : std::string(std::strerror(err)));
}

template <typename T, typename F>
void TokenFile::scan(F&& fn) const {
  constexpr int64_t kChunk = (int64_t(1) << 20) / int64_t(sizeof(T));
  std::vector<T> buf(size_t(std::min(kChunk, n_)));
  for (int64_t first = 0; first < n_; first += kChunk) {
    const int64_t count = std::min(kChunk, n_ - first);
    read_raw(first, count, buf.data());
    fn(buf.data(), count, first);
  }
}

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenFileOptions o) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->name_ = path;
  file_io::ReadableFile file = file_io::open_read(path, "tokens");
  f->fd_ = std::move(file.fd);
  f->file_bytes_ = file.size;
  f->init(size_t(file.size), o);
  return f;
}

std::shared_ptr<const TokenFile> TokenFile::from_bytes(std::vector<uint8_t> bytes, TokenType type,
                                                       std::string name) {
  TokenFileOptions o;
  o.type = type;
  return from_bytes(std::move(bytes), o, std::move(name));
}

std::shared_ptr<const TokenFile> TokenFile::from_bytes(std::vector<uint8_t> bytes,
                                                       TokenFileOptions o, std::string name) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->name_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->init(f->owned_.size(), o);
  return f;
}

int64_t TokenFile::operator[](int64_t i) const {
  ACCEL_CHECK(i >= 0 && i < n_, IndexError, "tokens", "position ", i, " out of range for '", name_,
              "' with ", n_, " tokens");
  return dispatch_token(type_, [&]<typename T>() {
    T v;
    read_raw(i, 1, &v);
    return int64_t(v);
  });
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  // n <= n_ - start rather than start + n <= n_, which can overflow.
  ACCEL_CHECK(start >= 0 && n >= 0 && start <= n_ && n <= n_ - start, IndexError, "tokens",
              "range of ", n, " tokens at ", start, " out of range for '", name_, "' with ", n_,
              " tokens");
  if (n == 0) return;
  dispatch_token(type_, [&]<typename T>() {
    // The n stored tokens go to the tail of out, then widen front to back in place: token i is
    // read (bytes n*(8-w) + i*w on) before out[i] (bytes 8i .. 8i+8) is written, and that write
    // ends at or before where token i+1 starts, since (i+1)*(8-w) <= n*(8-w).
    static_assert(sizeof(T) < sizeof(int64_t));
    uint8_t* raw = reinterpret_cast<uint8_t*>(out) + size_t(n) * (sizeof(int64_t) - sizeof(T));
    read_raw(start, n, raw);
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, raw + size_t(i) * sizeof(T), sizeof(T));
      out[i] = int64_t(v);
    }
  });
}

int64_t TokenFile::max_token() const {
  return dispatch_token(type_, [&]<typename T>() {
    int64_t m = -1;
    scan<T>([&](const T* p, int64_t count, int64_t) {
      m = std::max(m, int64_t(*std::max_element(p, p + count)));
    });
    return m;
  });
}

void write_token_file(const std::string& path, const std::vector<int64_t>& tokens, TokenType type) {
  std::vector<uint8_t> buf(tokens.size() * width(type));
  dispatch_token(type, [&]<typename T>() {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t v = tokens[i];
      ACCEL_CHECK(v >= 0 && uint64_t(v) <= uint64_t(std::numeric_limits<T>::max()), ValueError,
                  "write_token_file", "token ", v, " at position ", i, " does not fit ",
                  token_type_name(type));
      const T t = T(v);
      std::memcpy(buf.data() + i * sizeof(T), &t, sizeof(T));
    }
  });
  // Atomic, never through a link (Note [safe file access]).
  file_io::write_file_atomic(
      path, std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()),
      "write_token_file");
}

// ---- window arithmetic ----

int64_t token_window_count(int64_t n, int64_t context, int64_t stride, const std::string& name) {
  ACCEL_CHECK(context >= 1, ValueError, "TokenWindowDataset", "context must be >= 1, got ",
              context);
  ACCEL_CHECK(stride >= 1, ValueError, "TokenWindowDataset", "stride must be >= 1, got ", stride);
  // context < n rather than n >= context + 1, which overflows for context = INT64_MAX.
  ACCEL_CHECK(n >= 1 && context < n, IoError, "TokenWindowDataset", "'", name, "' has ", n,
              " tokens; a window of context ", context, " needs at least ", uint64_t(context) + 1);
  return (n - context - 1) / stride + 1;
}

// ---- fortunes ----

std::vector<std::string> fortunes_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ACCEL_CHECK(fs::is_directory(dir, ec), IoError, "fortunes", "'", dir,
              "' is not a directory (the corpus comes from the Debian package 'fortunes')");
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    auto ends_with = [&](const char* suf) {
      const size_t n = std::strlen(suf);
      return name.size() >= n && name.compare(name.size() - n, n, suf) == 0;
    };
    if (ends_with(".dat") || ends_with(".u8")) continue;
    // status() follows symlinks: directories, links to directories and dangling links drop out.
    std::error_code sec;
    if (!fs::is_regular_file(fs::status(it->path(), sec)) || sec) continue;
    names.push_back(name);
  }
  ACCEL_CHECK(!ec, IoError, "fortunes", "cannot list '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());  // byte order, as `LC_ALL=C ls`
  std::vector<std::string> paths;
  paths.reserve(names.size());
  for (const auto& n : names) paths.push_back((fs::path(dir) / n).string());
  return paths;
}

std::vector<uint8_t> read_fortunes_corpus(const std::string& dir) {
  const std::vector<std::string> files = fortunes_files(dir);
  ACCEL_CHECK(!files.empty(), IoError, "fortunes", "no fortune files in '", dir, "'");
  std::vector<uint8_t> corpus;
  for (const auto& f : files) {
    // Plain text by definition: a file that happens to start with 1f 8b stays as it is.
    std::vector<uint8_t> b = read_file_bytes(f, /*decompress_gzip=*/false);
    corpus.insert(corpus.end(), b.begin(), b.end());
  }
  return corpus;
}

}  // namespace accel::data
