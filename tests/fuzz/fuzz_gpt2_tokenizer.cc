// Fuzz target: GPT-2's tokenizer files as hf::GPT2Tokenizer reads them (hf/tokenizer.h), and
// encoding with what they define. Byte 0 even: vocab.json text, a NUL byte, merges.txt text;
// odd: a tokenizer.json. IoError (a malformed file) and ValueError (encoding a symbol the
// vocabulary lacks when it has no <|endoftext|>) are the documented failures. Checked: the
// pre-tokenizer's pieces of any bytes (the input itself) cover them exactly; every id is below
// vocab_size(); encode and tokenize agree in length; when every token is in the vocabulary
// (no unknown-token stand-in) decode_bytes(encode(text)) == text, and decode's output is UTF-8.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "hf/tokenizer.h"
#include "hf/tokenizer_detail.h"

namespace {

void check_text(const accel::hf::GPT2Tokenizer& tok, std::string_view text) {
  const std::vector<int64_t> ids = tok.encode(text);
  const std::vector<std::string> tokens = tok.tokenize(text);
  if (ids.size() != tokens.size()) std::abort();
  bool all_known = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tok.vocab_size()) std::abort();
    all_known = all_known && tok.token_to_id(tokens[i]) == ids[i];
  }
  if (all_known && tok.decode_bytes(ids) != text) std::abort();
  const std::string shown = tok.decode(ids);
  for (size_t i = 0; i < shown.size();) {
    uint32_t cp = 0;
    i += accel::hf::detail::next_char(shown, i, cp);
    if (cp == accel::hf::detail::kInvalidByte) std::abort();
  }
}

void check(const std::string& data) {
  std::string joined;
  for (std::string_view p : accel::hf::gpt2_pre_tokenize(data)) {
    if (p.empty()) std::abort();
    joined += p;
  }
  if (joined != data) std::abort();
  if (data.empty()) return;
  const std::string body = data.substr(1);
  const auto tok = [&] {
    if (data[0] & 1) return accel::hf::GPT2Tokenizer::parse_tokenizer_json(body, "<fuzz>");
    const size_t nul = body.find('\0');
    const std::string vocab = body.substr(0, nul);
    const std::string merges = nul == std::string::npos ? "" : body.substr(nul + 1);
    return accel::hf::GPT2Tokenizer::parse(vocab, merges, "<fuzz vocab>", "<fuzz merges>");
  }();
  check_text(tok, "Hello world, it's 12 <|endoftext|> caf\xc3\xa9  \n\n x\xff");
  check_text(tok, data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const accel::IoError&) {
  } catch (const accel::ValueError&) {
  }
  return 0;
}
