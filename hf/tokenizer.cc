// GPT-2's byte-level BPE tokenizer (hf/tokenizer.h): reading vocab.json + merges.txt or
// tokenizer.json, the merges, encode / decode, save_pretrained.
#include "hf/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <queue>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "hf/tokenizer_detail.h"

namespace accel::hf {

using nlohmann::json;

namespace {

constexpr const char* kOp = "hf.GPT2Tokenizer";
constexpr const char* kEndOfText = "<|endoftext|>";
// A vocabulary file is a few MB (GPT-2's vocab.json 1 MB, tokenizer.json 1.4 MB); the cap keeps
// a wrong path (a huge file) from being read whole.
constexpr uint64_t kMaxFileBytes = uint64_t(256) << 20;
constexpr int64_t kMaxId = (int64_t(1) << 31) - 1;

std::string shown(const std::string& s, size_t max = 40) {
  return "'" + (s.size() > max ? s.substr(0, max) + "..." : s) + "'";
}

json parse_json(const std::string& text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ACCEL_THROW(IoError, kOp, "'", name, "' is not JSON: ", e.what());
  }
}

// An id of a vocabulary entry or an added token: an integer in [0, 2^31).
int64_t read_id(const json& v, const std::string& name, const std::string& token) {
  ACCEL_CHECK(v.is_number_integer(), IoError, kOp, "'", name, "': the id of token ", shown(token),
              " must be an integer, got ", v.dump());
  const bool negative = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  ACCEL_CHECK(!negative && v.get<uint64_t>() <= uint64_t(kMaxId), IoError, kOp, "'", name,
              "': the id of token ", shown(token), " is ", v.dump(), ", outside [0, 2^31)");
  return v.get<int64_t>();
}

// vocab.json's object (or tokenizer.json's model.vocab) into vocab.
void read_vocab(const json& j, const std::string& name,
                std::unordered_map<std::string, int64_t>& vocab) {
  ACCEL_CHECK(j.is_object(), IoError, kOp, "'", name, "': the vocabulary must be a JSON object {",
              "\"token\": id}, got a ", j.type_name());
  for (const auto& [token, v] : j.items()) {
    ACCEL_CHECK(!token.empty(), IoError, kOp, "'", name, "': the vocabulary has an empty token");
    vocab[token] = read_id(v, name, token);
  }
}

// `where`: "line 7" of merges.txt, "merge 6" of tokenizer.json.
void add_merge(std::vector<std::pair<std::string, std::string>>& merges, std::string a,
               std::string b, const std::string& name, const std::string& where) {
  auto bad = [](const std::string& s) {
    return s.empty() || s.find_first_of(" \n") != std::string::npos;
  };
  ACCEL_CHECK(!bad(a) && !bad(b), IoError, kOp, "'", name, "' ", where,
              ": each side must be a non-empty token without spaces, got ", shown(a), " and ",
              shown(b));
  merges.emplace_back(std::move(a), std::move(b));
}

// merges.txt: an optional "#version" first line, then "left right" per line; blank lines are
// skipped, a trailing \r is dropped.
std::vector<std::pair<std::string, std::string>> read_merges(const std::string& text,
                                                             const std::string& name) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    ACCEL_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, IoError,
                kOp, "'", name, "' line ", line_no,
                ": expected two tokens separated by one space, got ", shown(line));
    add_merge(merges, line.substr(0, sp), line.substr(sp + 1), name,
              "line " + std::to_string(line_no));
  }
  return merges;
}

std::string read_text(const std::string& path) {
  return file_io::read_file(path, kOp, kMaxFileBytes);
}

// The byte each stand-in character of bytes_to_unicode() is for.
const std::unordered_map<std::string, uint8_t>& byte_decoder() {
  static const std::unordered_map<std::string, uint8_t> m = [] {
    std::unordered_map<std::string, uint8_t> d;
    for (int b = 0; b < 256; ++b) d[bytes_to_unicode()[size_t(b)]] = uint8_t(b);
    return d;
  }();
  return m;
}

// The bytes a vocabulary token stands for; false when it holds a character outside the byte
// alphabet (not a byte-level vocabulary).
bool token_bytes(const std::string& token, std::string& out) {
  out.clear();
  const auto& dec = byte_decoder();
  for (size_t i = 0; i < token.size();) {
    uint32_t cp = 0;
    const size_t n = detail::next_char(token, i, cp);
    auto it = dec.find(token.substr(i, n));
    if (cp == detail::kInvalidByte || it == dec.end()) return false;
    out.push_back(char(it->second));
    i += n;
  }
  return true;
}

}  // namespace

GPT2Tokenizer GPT2Tokenizer::from_pretrained(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ACCEL_CHECK(fs::is_directory(dir, ec), IoError, kOp, "'", dir, "' is not a directory");
  const fs::path d(dir);
  if (fs::exists(d / "tokenizer.json", ec))
    return from_tokenizer_json((d / "tokenizer.json").string());
  const bool vocab = fs::exists(d / "vocab.json", ec), merges = fs::exists(d / "merges.txt", ec);
  ACCEL_CHECK(vocab && merges, IoError, kOp, "'", dir,
              "' holds no GPT-2 tokenizer: it needs tokenizer.json, or vocab.json and merges.txt",
              vocab    ? " (merges.txt is missing)"
              : merges ? " (vocab.json is missing)"
                       : "");
  return from_files((d / "vocab.json").string(), (d / "merges.txt").string());
}

GPT2Tokenizer GPT2Tokenizer::from_files(const std::string& vocab_json,
                                        const std::string& merges_txt) {
  return parse(read_text(vocab_json), read_text(merges_txt), vocab_json, merges_txt);
}

GPT2Tokenizer GPT2Tokenizer::from_tokenizer_json(const std::string& path) {
  return parse_tokenizer_json(read_text(path), path);
}

GPT2Tokenizer GPT2Tokenizer::parse(const std::string& vocab_text, const std::string& merges_text,
                                   const std::string& vocab_name, const std::string& merges_name) {
  GPT2Tokenizer t;
  read_vocab(parse_json(vocab_text, vocab_name), vocab_name, t.vocab_);
  t.merges_ = read_merges(merges_text, merges_name);
  if (t.vocab_.count(kEndOfText)) t.special_.push_back(kEndOfText);
  t.build(vocab_name);
  return t;
}

GPT2Tokenizer GPT2Tokenizer::parse_tokenizer_json(const std::string& text,
                                                  const std::string& name) {
  const json j = parse_json(text, name);
  ACCEL_CHECK(j.is_object(), IoError, kOp, "'", name, "' holds a JSON ", j.type_name(),
              ", not an object");
  auto field = [&](const json& o, const char* key) -> const json& {
    static const json null;
    return o.is_object() && o.contains(key) ? o[key] : null;
  };
  const json& model = field(j, "model");
  const json& type = field(model, "type");
  ACCEL_CHECK(model.is_object() && (type.is_null() || type == "BPE"), IoError, kOp, "'", name,
              "': \"model\" must be a BPE model, got ",
              type.is_null() ? model.dump() : type.dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = field(model, key);
    ACCEL_CHECK(v.is_null() || v == "", IoError, kOp, "'", name, "': model.", key, " ", v.dump(),
                " is not supported (GPT-2's byte-level BPE has none)");
  }
  ACCEL_CHECK(!(field(model, "byte_fallback") == true), IoError, kOp, "'", name,
              "': model.byte_fallback is not supported (a SentencePiece-style BPE, not GPT-2's)");
  ACCEL_CHECK(field(j, "normalizer").is_null(), IoError, kOp, "'", name, "': a normalizer (",
              field(j, "normalizer").dump(), ") is not supported: GPT-2's tokenizer has none");
  const json& pre = field(j, "pre_tokenizer");
  ACCEL_CHECK(field(pre, "type") == "ByteLevel", IoError, kOp, "'", name,
              "': the pre_tokenizer must be GPT-2's ByteLevel, got ", pre.dump());
  ACCEL_CHECK(!(field(pre, "add_prefix_space") == true) && !(field(pre, "use_regex") == false),
              IoError, kOp, "'", name,
              "': ByteLevel with add_prefix_space = true or use_regex = false is not supported");

  GPT2Tokenizer t;
  read_vocab(field(model, "vocab"), name, t.vocab_);
  const json& merges = field(model, "merges");
  ACCEL_CHECK(merges.is_array(), IoError, kOp, "'", name, "': model.merges must be an array, got ",
              merges.is_null() ? "none" : merges.type_name());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // "left right" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      ACCEL_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, IoError, kOp,
                  "'", name, "' merge ", i, ": expected \"left right\", got ", shown(s));
      add_merge(t.merges_, s.substr(0, sp), s.substr(sp + 1), name, "merge " + std::to_string(i));
    } else {  // ["left", "right"]
      ACCEL_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), IoError,
                  kOp, "'", name, "' merge ", i,
                  ": expected \"left right\" or [\"left\", \"right\"], got ", m.dump());
      add_merge(t.merges_, m[0].get<std::string>(), m[1].get<std::string>(), name,
                "merge " + std::to_string(i));
    }
  }
  const json& added = field(j, "added_tokens");
  ACCEL_CHECK(added.is_null() || added.is_array(), IoError, kOp, "'", name,
              "': added_tokens must be an array");
  if (added.is_array()) {
    for (const json& a : added) {
      const json& content = field(a, "content");
      ACCEL_CHECK(content.is_string() && !content.get<std::string>().empty(), IoError, kOp, "'",
                  name, "': an added token needs a non-empty \"content\" string, got ", a.dump());
      const std::string s = content.get<std::string>();
      const int64_t id = read_id(field(a, "id"), name, s);
      auto it = t.vocab_.find(s);
      ACCEL_CHECK(it == t.vocab_.end() || it->second == id, IoError, kOp, "'", name,
                  "': added token ", shown(s), " has id ", id, " but the vocabulary gives it ",
                  it == t.vocab_.end() ? 0 : it->second);
      if (std::find(t.special_.begin(), t.special_.end(), s) == t.special_.end())
        t.special_.push_back(s);
      t.vocab_[s] = id;
    }
  }
  t.build(name);
  return t;
}

void GPT2Tokenizer::build(const std::string& name) {
  // Ids: unique, and each vocabulary token made of byte characters (special tokens are text).
  std::string bytes;
  for (const auto& [token, id] : vocab_) {
    auto [it, fresh] = id_to_token_.emplace(id, token);
    ACCEL_CHECK(fresh, IoError, kOp, "'", name, "': id ", id, " is given to both ",
                shown(it->second), " and ", shown(token));
    const bool special = std::find(special_.begin(), special_.end(), token) != special_.end();
    ACCEL_CHECK(special || token_bytes(token, bytes), IoError, kOp, "'", name, "': token ",
                shown(token), " (id ", id,
                ") has a character outside GPT-2's byte alphabet: not a byte-level BPE vocabulary");
    size_ = std::max(size_, id + 1);
  }
  // Longest first, so that the longest special token wins where two start at one place.
  std::stable_sort(special_.begin(), special_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });

  // Symbols: the 256 byte characters, then every string a merge uses or makes.
  std::unordered_map<std::string, int32_t> intern;
  symbols_.clear();
  auto symbol = [&](const std::string& s) {
    auto [it, fresh] = intern.emplace(s, int32_t(symbols_.size()));
    if (fresh) symbols_.push_back(s);
    return it->second;
  };
  for (const std::string& c : bytes_to_unicode()) symbol(c);
  pair_merge_.clear();
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto& [a, b] = merges_[r];
    const int32_t l = symbol(a), rr = symbol(b), res = symbol(a + b);
    // A repeated merge keeps its last rank, as GPT2Tokenizer's dict(zip(merges, range(n))).
    pair_merge_[(uint64_t(uint32_t(l)) << 32) | uint32_t(rr)] = Merge{int32_t(r), res};
  }
  symbol_vocab_.assign(symbols_.size(), -1);
  for (size_t s = 0; s < symbols_.size(); ++s) {
    auto it = vocab_.find(symbols_[s]);
    if (it != vocab_.end()) symbol_vocab_[s] = it->second;
  }
}

// encoder.py's bpe(): the lowest-ranked adjacent pair is merged everywhere it occurs (left to
// right, not overlapping), and again, until no pair has a merge. Done with a heap of candidate
// pairs and a linked list of symbols in O(n log n): all entries of the lowest rank are taken
// together and merged in position order, which is the same pass (a pair a merge creates can never
// be the pair just merged, so no new entry joins that rank's batch).
void GPT2Tokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& out,
                                 std::vector<std::string>* tokens) const {
  const size_t n = piece.size();
  std::vector<int32_t> sym(n), prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = int32_t(uint8_t(piece[i]));
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, left, lsym, rsym;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto find = [&](int32_t l, int32_t r) -> const Merge* {
    auto it = pair_merge_.find((uint64_t(uint32_t(l)) << 32) | uint32_t(r));
    return it == pair_merge_.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t left) {
    if (left < 0 || next[size_t(left)] < 0) return;
    const int32_t right = next[size_t(left)];
    if (const Merge* m = find(sym[size_t(left)], sym[size_t(right)]))
      heap.push({m->rank, left, sym[size_t(left)], sym[size_t(right)]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  std::vector<Cand> batch;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    batch.clear();
    while (!heap.empty() && heap.top().rank == rank) {  // in position order
      batch.push_back(heap.top());
      heap.pop();
    }
    for (const Cand& c : batch) {
      const size_t l = size_t(c.left);
      const int32_t r = next[l];
      // Stale: the left symbol was merged into its neighbour, or either side changed.
      if (sym[l] < 0 || r < 0 || sym[l] != c.lsym || sym[size_t(r)] != c.rsym) continue;
      sym[l] = find(c.lsym, c.rsym)->result;
      sym[size_t(r)] = -1;
      next[l] = next[size_t(r)];
      if (next[l] >= 0) prev[size_t(next[l])] = int32_t(l);
      push(prev[l]);
      push(int32_t(l));
    }
  }
  const std::optional<int64_t> unk = eos_token_id();
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) {
    const int32_t s = sym[size_t(i)];
    if (tokens) tokens->push_back(symbols_[size_t(s)]);
    const int64_t id = symbol_vocab_[size_t(s)];
    ACCEL_CHECK(id >= 0 || unk, ValueError, kOp, "token ", shown(symbols_[size_t(s)]),
                " is not in the vocabulary, which has no <|endoftext|> to stand for unknown "
                "tokens");
    out.push_back(id >= 0 ? id : *unk);
  }
}

void GPT2Tokenizer::encode_plain(std::string_view text, std::vector<int64_t>& out,
                                 std::vector<std::string>* tokens, PieceCache& seen) const {
  for (std::string_view piece : gpt2_pre_tokenize(text)) {
    auto it = tokens ? seen.end() : seen.find(piece);
    if (it != seen.end()) {
      const auto [at, len] = it->second;
      for (size_t k = 0; k < len; ++k) {
        const int64_t id = out[at + k];
        out.push_back(id);
      }
      continue;
    }
    const size_t at = out.size();
    encode_piece(piece, out, tokens);
    if (!tokens) seen.emplace(piece, std::make_pair(at, out.size() - at));
  }
}

void GPT2Tokenizer::encode_all(std::string_view text, std::vector<int64_t>* ids,
                               std::vector<std::string>* tokens) const {
  std::vector<int64_t> local;
  std::vector<int64_t>& out = ids ? *ids : local;
  // Pieces repeat ("Ġthe"): each is merged once per call (a cache per call keeps encode const and
  // thread-safe).
  PieceCache seen;
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const std::string* hit = nullptr;
    for (const std::string& s : special_)  // longest first
      if (s[0] == text[pos] && text.compare(pos, s.size(), s) == 0) {
        hit = &s;
        break;
      }
    if (!hit) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(start, pos - start), out, tokens, seen);
    out.push_back(vocab_.at(*hit));
    if (tokens) tokens->push_back(*hit);
    pos += hit->size();
    start = pos;
  }
  encode_plain(text.substr(start), out, tokens, seen);
}

std::vector<int64_t> GPT2Tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  encode_all(text, &ids, nullptr);
  return ids;
}

std::vector<std::string> GPT2Tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  encode_all(text, nullptr, &tokens);
  return tokens;
}

std::string GPT2Tokenizer::decode_bytes(std::span<const int64_t> ids,
                                        bool skip_special_tokens) const {
  std::string out, bytes;
  for (int64_t id : ids) {
    const std::string& token = id_to_token(id);
    const bool special = std::find(special_.begin(), special_.end(), token) != special_.end();
    if (special) {
      if (!skip_special_tokens) out += token;  // added tokens are text, not byte characters
      continue;
    }
    token_bytes(token, bytes);  // checked when the vocabulary was read
    out += bytes;
  }
  return out;
}

std::string GPT2Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  return detail::replace_invalid_utf8(decode_bytes(ids, skip_special_tokens));
}

std::optional<int64_t> GPT2Tokenizer::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& GPT2Tokenizer::id_to_token(int64_t id) const {
  auto it = id_to_token_.find(id);
  ACCEL_CHECK(it != id_to_token_.end(), ValueError, kOp, "id ", id, " is not in the vocabulary (",
              vocab_.size(), " tokens, ids below ", size_, ")");
  return it->second;
}

std::optional<int64_t> GPT2Tokenizer::eos_token_id() const { return token_to_id(kEndOfText); }

void GPT2Tokenizer::save_pretrained(const std::string& dir,
                                    std::optional<int64_t> model_max_length) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  ACCEL_CHECK(!ec, IoError, kOp, "cannot create '", dir, "': ", ec.message());
  const fs::path d(dir);
  json vocab = json::object();
  for (const auto& [token, id] : vocab_) vocab[token] = id;
  file_io::write_file_atomic((d / "vocab.json").string(), vocab.dump(2) + "\n", kOp);
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : merges_) merges += a + " " + b + "\n";
  file_io::write_file_atomic((d / "merges.txt").string(), merges, kOp);
  json config = {{"tokenizer_class", "GPT2Tokenizer"}, {"add_prefix_space", false}};
  if (eos_token_id())
    for (const char* key : {"bos_token", "eos_token", "unk_token"}) config[key] = kEndOfText;
  if (model_max_length) config["model_max_length"] = *model_max_length;
  file_io::write_file_atomic((d / "tokenizer_config.json").string(), config.dump(2) + "\n", kOp);
}

}  // namespace accel::hf
