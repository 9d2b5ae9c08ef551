// GPT-2's byte-level BPE tokenizer, read from the files of a Hugging Face model folder
// (docs/hf.md, "Tokenizer"):
//
//   auto tok = hf::GPT2Tokenizer::from_pretrained("gpt2/");   // vocab.json + merges.txt, or
//                                                             // tokenizer.json
//   std::vector<int64_t> ids = tok.encode("Hello world");     // {15496, 995} with GPT-2's files
//   std::string text = tok.decode(ids);                       // "Hello world"
//
// The algorithm of openai/gpt-2's encoder.py as transformers' GPT2Tokenizer runs it: the text is
// split on the special tokens (<|endoftext|>, and the added tokens of a tokenizer.json), each
// other part is cut into pieces by GPT-2's pre-tokenisation pattern (Note [gpt2 pattern] in
// tokenizer.cc), each piece's UTF-8 bytes become characters through bytes_to_unicode(), and the
// merges of merges.txt join adjacent symbols, the lowest rank first, until none applies; the
// symbols are looked up in vocab.json.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel::hf {

// encoder.py's bytes_to_unicode(): each byte's stand-in character, as UTF-8. The printable
// Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the others
// (controls, space, U+00A0, U+00AD) map to U+0100 upwards in byte order, so ' ' is "Ġ" (U+0120).
const std::array<std::string, 256>& bytes_to_unicode();

// GPT-2's pre-tokenisation: the pieces that the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds in `text` (regex.findall), as views into it; their concatenation is `text`. Letters,
// numbers and spaces as Note [gpt2 pattern] in tokenizer.cc classifies them (Unicode's general
// categories L* and N*, the White_Space property); bytes that are not UTF-8 count as one
// "other" character each.
std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text);

// Python's bytes.decode("utf-8", errors="replace"): `bytes` with each maximal invalid subsequence
// replaced by U+FFFD (what GPT2Tokenizer::decode applies to the tokens' bytes).
std::string decode_utf8_replace(std::string_view bytes);

// The Unicode version of the letter / number tables ("14.0.0"; scripts/make-unicode-tables).
const char* unicode_version();

class GPT2Tokenizer {
 public:
  // The tokenizer of a model folder: tokenizer.json when there is one (what transformers'
  // AutoTokenizer prefers), else vocab.json and merges.txt. IoError naming the folder when it
  // holds neither, naming the file when one is unreadable or malformed.
  static GPT2Tokenizer from_pretrained(const std::string& dir);
  // GPT2Tokenizer(vocab_file, merges_file): vocab.json ({"token": id}) and merges.txt (an
  // optional "#version" first line, then one "left right" pair per line, in rank order). The
  // special token is <|endoftext|> when the vocabulary holds it.
  static GPT2Tokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);
  // A `tokenizers` library file (tokenizer.json): a BPE model with a ByteLevel pre-tokenizer (no
  // normalizer, no subword prefix or suffix); its added_tokens are the special tokens.
  static GPT2Tokenizer from_tokenizer_json(const std::string& path);
  // The same from the files' text; `vocab_name` / `merges_name` / `name` say what to call them
  // in errors (the fuzz target fuzz_gpt2_tokenizer runs these).
  static GPT2Tokenizer parse(const std::string& vocab_text, const std::string& merges_text,
                             const std::string& vocab_name = "vocab.json",
                             const std::string& merges_name = "merges.txt");
  static GPT2Tokenizer parse_tokenizer_json(const std::string& text,
                                            const std::string& name = "tokenizer.json");

  // The ids of `text` (any bytes; not UTF-8 is tokenized byte by byte). A special token written
  // in the text is its id; a symbol the vocabulary lacks is the unknown token's id
  // (<|endoftext|>, GPT2Tokenizer's unk_token); ValueError when there is none.
  std::vector<int64_t> encode(std::string_view text) const;
  // The BPE tokens of `text` as strings (transformers' tokenize(): "Ġworld" for " world").
  std::vector<std::string> tokenize(std::string_view text) const;
  // The text of `ids`: the tokens' bytes, with invalid UTF-8 (a multi-byte character cut at the
  // end, say) replaced by U+FFFD as Python's bytes.decode("utf-8", errors="replace") does, one
  // per maximal invalid subsequence. No clean-up of spaces (clean_up_tokenization_spaces =
  // false). ValueError for an id outside the vocabulary.
  std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = false) const;
  // The tokens' bytes unchanged (for streaming output byte by byte; no replacement).
  std::string decode_bytes(std::span<const int64_t> ids, bool skip_special_tokens = false) const;

  // len(tokenizer): one more than the largest id (the vocabulary and the added tokens).
  int64_t vocab_size() const { return size_; }
  std::optional<int64_t> token_to_id(const std::string& token) const;
  // ValueError for an unknown id.
  const std::string& id_to_token(int64_t id) const;
  // <|endoftext|>'s id (GPT-2's bos, eos and unk token), when the vocabulary has it.
  std::optional<int64_t> eos_token_id() const;
  const std::vector<std::string>& special_tokens() const { return special_; }
  size_t num_merges() const { return merges_.size(); }
  // Writes vocab.json, merges.txt and a tokenizer_config.json naming GPT2Tokenizer (with
  // model_max_length when given) into `dir` (created if needed), as GPT2Tokenizer's
  // save_pretrained does.
  void save_pretrained(const std::string& dir,
                       std::optional<int64_t> model_max_length = std::nullopt) const;

 private:
  GPT2Tokenizer() = default;
  // Interns the merges as pairs of symbol ids; the symbols' vocabulary ids.
  void build(const std::string& merges_name);
  void encode_piece(std::string_view piece, std::vector<int64_t>& out,
                    std::vector<std::string>* tokens) const;
  // piece -> (where its ids start in the output, how many)
  using PieceCache = std::unordered_map<std::string_view, std::pair<size_t, size_t>>;
  void encode_plain(std::string_view text, std::vector<int64_t>& out,
                    std::vector<std::string>* tokens, PieceCache& seen) const;
  void encode_all(std::string_view text, std::vector<int64_t>* ids,
                  std::vector<std::string>* tokens) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> id_to_token_;
  std::vector<std::pair<std::string, std::string>> merges_;  // in rank order
  std::vector<std::string> special_;                         // longest first
  int64_t size_ = 0;

  // Symbols: the 256 byte characters (ids 0..255, by byte) and every merge result.
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id
  };
  std::vector<std::string> symbols_;
  std::vector<int64_t> symbol_vocab_;               // symbol -> vocabulary id, -1 when absent
  std::unordered_map<uint64_t, Merge> pair_merge_;  // (left << 32 | right) -> merge
};

}  // namespace accel::hf
