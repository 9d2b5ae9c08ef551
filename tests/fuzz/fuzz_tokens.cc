// Fuzz target: token files. The first 4 bytes choose the token type, header size, vocabulary
// and window; the rest is the file. IoError, ValueError and IndexError are documented.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "data/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace accel::data;
  if (size < 4) return 0;
  static constexpr TokenType kTypes[] = {TokenType::UInt8, TokenType::UInt16, TokenType::UInt32,
                                         TokenType(3)};
  TokenFileOptions o;
  o.type = kTypes[data[0] & 3];
  o.header_bytes = size_t(data[0] >> 2);
  o.vocab_size = (int64_t(data[1]) << 8) | data[2];
  const int64_t context = data[3] & 31;
  const int64_t stride = (data[3] >> 5) + (data[3] & 0x80 ? -8 : 0);
  try {
    auto f = TokenFile::from_bytes(std::vector<uint8_t>(data + 4, data + size), o, "<fuzz>");
    const int64_t n = f->size();
    if (n <= 0) std::abort();
    const int64_t mx = f->max_token();
    if (o.vocab_size > 0 && mx >= o.vocab_size) std::abort();
    if ((*f)[n - 1] > mx || (*f)[0] > mx) std::abort();
    // The windows TokenWindowDataset would serve: the last one must be readable.
    const int64_t windows = token_window_count(n, context, stride, f->name());
    if (windows < 1) std::abort();
    std::vector<int64_t> buf(size_t(context + 1));
    f->read((windows - 1) * stride, context + 1, buf.data());
    // Out-of-range reads must be IndexError, not memory errors.
    try {
      f->read(n - context, context + 1, buf.data());
      std::abort();
    } catch (const accel::IndexError&) {
    }
  } catch (const accel::IoError&) {
  } catch (const accel::ValueError&) {
  }
  return 0;
}
