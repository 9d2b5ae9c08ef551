#include "data/tokens.h"

#include <algorithm>
#include <cstdio>
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

void TokenFile::init(const uint8_t* data, size_t nbytes, TokenFileOptions o) {
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
  data_ = data + o.header_bytes;
  n_ = int64_t(payload / w);
  if (o.vocab_size > 0) {
    dispatch_token(type_, [&]<typename T>() {
      const T* p = reinterpret_cast<const T*>(data_);
      for (int64_t i = 0; i < n_; ++i) {
        ACCEL_CHECK(int64_t(p[i]) < o.vocab_size, IoError, "tokens", "'", name_, "': token ",
                    int64_t(p[i]), " at position ", i, " is outside the vocabulary of ",
                    o.vocab_size);
      }
    });
  }
}

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenFileOptions o) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->name_ = path;
  f->map_ = MappedFile(path);
  f->init(f->map_.data(), f->map_.size(), o);
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
  f->init(f->owned_.data(), f->owned_.size(), o);
  return f;
}

int64_t TokenFile::operator[](int64_t i) const {
  ACCEL_CHECK(i >= 0 && i < n_, IndexError, "tokens", "position ", i, " out of range for '", name_,
              "' with ", n_, " tokens");
  return dispatch_token(
      type_, [&]<typename T>() { return int64_t(reinterpret_cast<const T*>(data_)[i]); });
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  // n <= n_ - start rather than start + n <= n_, which can overflow.
  ACCEL_CHECK(start >= 0 && n >= 0 && start <= n_ && n <= n_ - start, IndexError, "tokens",
              "range of ", n, " tokens at ", start, " out of range for '", name_, "' with ", n_,
              " tokens");
  dispatch_token(type_, [&]<typename T>() {
    const T* p = reinterpret_cast<const T*>(data_) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = int64_t(p[i]);
  });
}

int64_t TokenFile::max_token() const {
  return dispatch_token(type_, [&]<typename T>() {
    const T* p = reinterpret_cast<const T*>(data_);
    return n_ ? int64_t(*std::max_element(p, p + n_)) : int64_t(-1);
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
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ACCEL_CHECK(f != nullptr, IoError, "write_token_file", "cannot create '", path, "'");
  const size_t wrote = buf.empty() ? 0 : std::fwrite(buf.data(), 1, buf.size(), f);
  const bool ok = std::fclose(f) == 0 && wrote == buf.size();
  ACCEL_CHECK(ok, IoError, "write_token_file", "short write to '", path, "'");
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
