// Token streams for language models: a file of raw little-endian uint8/uint16/uint32 tokens (the
// nanoGPT .bin layout), read where it lies, or bytes held in memory, and a dataset of (x, y)
// windows where y is x shifted by one token.
//
// Note [token files are read, not mapped]
// TokenFile::open() keeps the file open and reads each range with pread(2) straight into the
// caller's int64 buffer (widened in place), instead of mapping it: a file truncated while a mapping
// of it is in use kills the process with SIGBUS at the next access of a lost page, and no check
// before the access closes that window (another process may truncate between the check and the
// read). pread of a shrunken file returns short, which becomes an IoError naming the file and
// its new size. The page cache serves both the same way; the cost of one system call per window
// is in docs/data.md (measured with bench/loader).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "data/dataset.h"
#include "data/io.h"

namespace accel::data {

enum class TokenType : uint8_t { UInt8 = 1, UInt16 = 2, UInt32 = 4 };  // value = byte width
const char* token_type_name(TokenType t);

struct TokenFileOptions {
  TokenType type = TokenType::UInt16;
  size_t header_bytes = 0;  // skipped at the start (a multiple of the token width)
  int64_t vocab_size = 0;   // > 0: every token is checked to be < vocab_size at open
};

class TokenFile {
 public:
  // Opens `path` (Note [token files are read, not mapped]; a link to a regular file is followed, a
  // FIFO or device is an IoError). IoError naming the file when it is empty, shorter than the
  // header, not a whole number of tokens, or (with vocab_size) holds a token out of range; later,
  // when a read finds it shorter than it was.
  static std::shared_ptr<const TokenFile> open(const std::string& path, TokenFileOptions o = {});
  // Tokens held in memory (e.g. the fortunes corpus as bytes).
  static std::shared_ptr<const TokenFile> from_bytes(std::vector<uint8_t> bytes,
                                                     TokenType type = TokenType::UInt8,
                                                     std::string name = "<memory>");
  // Tokens held in memory, checked with every option of open() (header, vocabulary).
  static std::shared_ptr<const TokenFile> from_bytes(std::vector<uint8_t> bytes, TokenFileOptions o,
                                                     std::string name);

  int64_t size() const { return n_; }
  TokenType type() const { return type_; }
  const std::string& name() const { return name_; }
  int64_t operator[](int64_t i) const;  // bounds-checked
  // tokens[start, start + n) widened to int64 into out.
  void read(int64_t start, int64_t n, int64_t* out) const;
  // Largest token (scans the stream once).
  int64_t max_token() const;

 private:
  TokenFile() = default;
  void init(size_t nbytes, TokenFileOptions o);
  // count tokens from position `first` as stored (width(type) bytes each) into dst.
  void read_raw(int64_t first, int64_t count, void* dst) const;
  // fn(const T* tokens, int64_t count, int64_t first) over the whole stream, in chunks.
  template <typename T, typename F>
  void scan(F&& fn) const;
  file_io::Fd fd_;              // open(): the file
  uint64_t file_bytes_ = 0;     // its size at open
  std::vector<uint8_t> owned_;  // from_bytes(): the bytes
  size_t header_bytes_ = 0;
  int64_t n_ = 0;
  TokenType type_ = TokenType::UInt8;
  std::string name_;
};

// Writes tokens as a raw little-endian token file; ValueError when a token does not fit.
void write_token_file(const std::string& path, const std::vector<int64_t>& tokens,
                      TokenType type = TokenType::UInt16);

// Windows of `context` tokens (plus the one after, for y) at `stride` in n tokens: the count
// TokenWindowDataset has. ValueError for context or stride < 1; IoError naming `name` when n
// tokens cannot hold one window.
int64_t token_window_count(int64_t n, int64_t context, int64_t stride, const std::string& name);

// Windows of `context` tokens: example i is x = tokens[s, s+T), y = tokens[s+1, s+T+1) with
// s = i * stride, both int64 (T). stride defaults to T (non-overlapping windows).
class TokenWindowDataset final : public Dataset {
 public:
  TokenWindowDataset(std::shared_ptr<const TokenFile> tokens, int64_t context, int64_t stride = -1);
  int64_t size() const override { return num_windows_; }
  Example get(int64_t index) const override;
  bool get_batch(std::span<const int64_t> indices, Allocator* alloc, Example& out) const override;
  int64_t context() const { return context_; }
  const TokenFile& tokens() const { return *tokens_; }

 private:
  std::shared_ptr<const TokenFile> tokens_;
  int64_t context_;
  int64_t stride_;
  int64_t num_windows_ = 0;
};

// Where Debian's fortunes package installs its files.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortunes text corpus: every plain file in `dir` (symlinks to files followed; *.dat, *.u8,
// directories and links to them skipped), concatenated in sorted name order, as bytes.
std::vector<uint8_t> read_fortunes_corpus(const std::string& dir = kFortunesDir);
// The files read_fortunes_corpus() concatenates, in order.
std::vector<std::string> fortunes_files(const std::string& dir = kFortunesDir);

}  // namespace accel::data
