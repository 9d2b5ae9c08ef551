// hf::GPT2Tokenizer against the reference tokenizer of tests/hf/gpt2_bpe.py (encoder.py's
// algorithm, GPT-2's pattern run by Python's `re` with the classes spelled out), on the small
// byte-level BPE that make_tokenizer_fixture.py learned from fortunes text
// (tests/hf/fixtures/gpt2_tokenizer): the pieces, ids and decoded text of every case, from
// vocab.json + merges.txt and from tokenizer.json; then the merge order, the byte table, saving,
// and the errors hostile files and bad ids give.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hf/tokenizer.h"
#include "tests/hf/common.h"

using namespace accel;
using nlohmann::json;

namespace {

std::string tok_dir() { return accel::test::hf_fixtures() + "/gpt2_tokenizer"; }

const json& cases() {
  static const json j = [] {
    std::ifstream f(tok_dir() + "/cases.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

std::vector<int64_t> ids_of(const json& a) { return a.get<std::vector<int64_t>>(); }

// GPT2Tokenizer's pieces: the text split on <|endoftext|>, each part pre-tokenized.
std::vector<std::string> pieces(const std::string& text) {
  const std::string eot = "<|endoftext|>";
  std::vector<std::string> out;
  size_t start = 0;
  auto plain = [&](size_t a, size_t b) {
    for (std::string_view p : hf::gpt2_pre_tokenize(std::string_view(text).substr(a, b - a)))
      out.emplace_back(p);
  };
  for (size_t at; (at = text.find(eot, start)) != std::string::npos; start = at + eot.size()) {
    plain(start, at);
    out.push_back(eot);
  }
  plain(start, text.size());
  return out;
}

// A vocabulary of the 256 byte characters (ids 0..255 by byte) and `extra`.
std::string byte_vocab(const std::vector<std::string>& extra) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[hf::bytes_to_unicode()[size_t(b)]] = b;
  for (size_t i = 0; i < extra.size(); ++i) v[extra[i]] = 256 + int64_t(i);
  return v.dump();
}

void check_all_cases(const hf::GPT2Tokenizer& tok) {
  int64_t checked = 0;
  for (const json& c : cases()["encode"]) {
    const std::string text = c["text"].get<std::string>();
    CAPTURE(text);
    const std::vector<int64_t> ids = tok.encode(text);
    CHECK(ids == ids_of(c["ids"]));
    CHECK(tok.decode(ids) == text);
    checked += int64_t(ids.size());
  }
  CHECK(checked > 3000);
  for (const json& c : cases()["decode"]) {
    const std::vector<int64_t> ids = ids_of(c["ids"]);
    CAPTURE(c["ids"].dump());
    CHECK(tok.decode(ids) == c["text"].get<std::string>());
  }
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// fn() throws an E whose message holds every one of `parts`.
template <typename E, typename F>
void check_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    FAIL("no exception");
  } catch (const E& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) CHECK_MESSAGE(m.find(p) != std::string::npos, m);
  }
}

}  // namespace

TEST_CASE("GPT-2 pre-tokenisation: the pattern's pieces as Python's re engine finds them") {
  int64_t n = 0;
  for (const json& c : cases()["encode"]) {
    const std::string text = c["text"].get<std::string>();
    CAPTURE(text);
    CHECK(pieces(text) == c["pieces"].get<std::vector<std::string>>());
    n += int64_t(c["pieces"].size());
  }
  CHECK(n > 1000);
  // Hand-checked corners: contractions only where a piece starts, runs of spaces leave their
  // last space to the next word, a single space before a newline stays alone.
  using V = std::vector<std::string_view>;
  CHECK(hf::gpt2_pre_tokenize("x's ?'s") == V{"x", "'s", " ?'", "s"});
  CHECK(hf::gpt2_pre_tokenize("a   b") == V{"a", "  ", " b"});
  CHECK(hf::gpt2_pre_tokenize("a \nb ") == V{"a", " ", "\n", "b", " "});
  CHECK(hf::gpt2_pre_tokenize("don'T 12ab") == V{"don", "'", "T", " 12", "ab"});
  CHECK(hf::gpt2_pre_tokenize("").empty());
  // Bytes that are not UTF-8 are "other" characters, one each, and the pieces cover the input.
  const std::string bad = "ab\xff\xfe c\xe2\x82 d\xc3";
  const auto p = hf::gpt2_pre_tokenize(bad);
  CHECK(p == V{"ab", "\xff\xfe", " c", "\xe2\x82", " d", "\xc3"});
  std::string joined;
  for (auto s : p) joined += s;
  CHECK(joined == bad);
  CHECK(std::string(hf::unicode_version()) == "14.0.0");
}

TEST_CASE("GPT2Tokenizer from vocab.json + merges.txt equals the reference") {
  const auto tok =
      hf::GPT2Tokenizer::from_files(tok_dir() + "/vocab.json", tok_dir() + "/merges.txt");
  CHECK(tok.vocab_size() == 557);
  CHECK(tok.num_merges() == 300);
  CHECK(tok.eos_token_id() == 556);
  CHECK(tok.special_tokens() == std::vector<std::string>{"<|endoftext|>"});
  check_all_cases(tok);
  CHECK(tok.tokenize("Hello world") == std::vector<std::string>{"H", "ell", "o", "Ġwor", "ld"});
  CHECK(tok.decode(tok.encode("a<|endoftext|>b"), /*skip_special_tokens=*/true) == "ab");
  // Not UTF-8: tokenized byte by byte, and decoded back unchanged by decode_bytes (decode
  // replaces what is not UTF-8).
  const std::string bad = "caf\xc3 \xff\xfe ok";
  CHECK(tok.decode_bytes(tok.encode(bad)) == bad);
  CHECK(tok.decode(tok.encode(bad)) == "caf\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd ok");
  CHECK(hf::decode_utf8_replace(bad) == tok.decode(tok.encode(bad)));
}

TEST_CASE("GPT2Tokenizer from tokenizer.json equals the reference; from_pretrained picks it") {
  check_all_cases(hf::GPT2Tokenizer::from_tokenizer_json(tok_dir() + "/tokenizer.json"));
  const auto tok = hf::GPT2Tokenizer::from_pretrained(tok_dir());
  check_all_cases(tok);
  // Merges as pairs (tokenizers >= 0.20) read the same.
  json j = json::parse(std::ifstream(tok_dir() + "/tokenizer.json"));
  json pairs = json::array();
  for (const json& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  const auto again = hf::GPT2Tokenizer::parse_tokenizer_json(j.dump(), "pairs.json");
  for (const json& c : cases()["encode"])
    CHECK(again.encode(c["text"].get<std::string>()) == ids_of(c["ids"]));
}

TEST_CASE("GPT2Tokenizer: merges by rank, all occurrences of the best pair per pass") {
  // "aa a" ranks before "a a": encoder.py merges every "a a" first, then looks again, so "aaaa"
  // is "aa aa" (a tokenizer merging one pair at a time would make "aaa a").
  const auto tok = hf::GPT2Tokenizer::parse(byte_vocab({"aa", "aaa", "<|endoftext|>"}),
                                            "#version: 0.2\naa a\na a\n", "v", "m");
  using S = std::vector<std::string>;
  CHECK(tok.tokenize("aaaa") == S{"aa", "aa"});
  CHECK(tok.tokenize("aaa") == S{"aaa"});
  CHECK(tok.tokenize("aaaaa") == S{"aa", "aaa"});
  CHECK(tok.encode("aaaaa") == std::vector<int64_t>{256, 257});
  // A merge result the vocabulary lacks is the unknown token (<|endoftext|>, id 256 here) ...
  const auto unk =
      hf::GPT2Tokenizer::parse(byte_vocab({"<|endoftext|>"}), "a a\n", "v.json", "m.txt");
  CHECK(unk.encode("aa b") == std::vector<int64_t>{256, ' ', 'b'});
  // ... and a ValueError when the vocabulary has no <|endoftext|>.
  const auto no_unk = hf::GPT2Tokenizer::parse(byte_vocab({}), "a a\n", "v.json", "m.txt");
  CHECK(!no_unk.eos_token_id());
  CHECK(no_unk.encode("ab") == std::vector<int64_t>{'a', 'b'});
  CHECK_THROWS_WITH_AS(no_unk.encode("aa"), doctest::Contains("'aa' is not in the vocabulary"),
                       ValueError);
  CHECK_THROWS_WITH_AS(no_unk.decode(std::vector<int64_t>{300}),
                       doctest::Contains("id 300 is not in the vocabulary"), ValueError);
  CHECK_THROWS_AS(no_unk.decode(std::vector<int64_t>{-1}), ValueError);
}

TEST_CASE("GPT2Tokenizer::save_pretrained writes files that read back the same") {
  const auto tok = hf::GPT2Tokenizer::from_tokenizer_json(tok_dir() + "/tokenizer.json");
  const std::string dir = accel::test::hf_scratch("tokenizer-save");
  tok.save_pretrained(dir, 64);
  CHECK(std::filesystem::exists(dir + "/vocab.json"));
  CHECK(!std::filesystem::exists(dir + "/tokenizer.json"));
  const json config = json::parse(std::ifstream(dir + "/tokenizer_config.json"));
  CHECK(config["tokenizer_class"] == "GPT2Tokenizer");
  CHECK(config["eos_token"] == "<|endoftext|>");
  CHECK(config["model_max_length"] == 64);
  check_all_cases(hf::GPT2Tokenizer::from_pretrained(dir));  // vocab.json + merges.txt now
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPT2Tokenizer: hostile files are an IoError naming the file") {
  const std::string v = byte_vocab({"ab", "<|endoftext|>"}), m = "#version: 0.2\na b\n";
  CHECK(hf::GPT2Tokenizer::parse(v, m, "v.json", "m.txt").encode("ab") ==
        std::vector<int64_t>{256});
  auto bad_vocab = [&](const std::string& text, const char* what) {
    CAPTURE(text);
    check_error<IoError>([&] { hf::GPT2Tokenizer::parse(text, m, "hostile/vocab.json", "m.txt"); },
                         {"'hostile/vocab.json'", what});
  };
  bad_vocab("{\"a\": 1", "is not JSON");
  bad_vocab("[1, 2]", "must be a JSON object");
  bad_vocab("{\"a\": \"1\"}", "must be an integer");
  bad_vocab("{\"a\": 1.5}", "must be an integer");
  bad_vocab("{\"a\": -1}", "outside [0, 2^31)");
  bad_vocab("{\"a\": 4294967296}", "outside [0, 2^31)");
  bad_vocab("{\"a\": 18446744073709551615}", "outside [0, 2^31)");
  bad_vocab("{\"a\": 3, \"b\": 3}", "id 3 is given to both");
  bad_vocab("{\"\": 3}", "empty token");
  bad_vocab("{\"a b\": 3}", "outside GPT-2's byte alphabet");        // a raw space
  bad_vocab("{\"\u2581the\": 3}", "outside GPT-2's byte alphabet");  // SentencePiece
  auto bad_merges = [&](const std::string& text, const char* what) {
    CAPTURE(text);
    check_error<IoError>([&] { hf::GPT2Tokenizer::parse(v, text, "v.json", "hostile/merges.txt"); },
                         {"'hostile/merges.txt'", what});
  };
  bad_merges("#version: 0.2\na b c\n", "line 2: expected two tokens");
  bad_merges("ab\n", "line 1: expected two tokens");
  bad_merges("a  b\n", "line 1: expected two tokens");
  bad_merges("a \n", "line 1");
  // tokenizer.json
  const json good = json::parse(std::ifstream(tok_dir() + "/tokenizer.json"));
  auto bad_json = [&](const std::function<void(json&)>& edit, const char* what) {
    json j = good;
    edit(j);
    CAPTURE(what);
    check_error<IoError>([&] { hf::GPT2Tokenizer::parse_tokenizer_json(j.dump(), "hostile.json"); },
                         {"'hostile.json'", what});
  };
  bad_json([](json& j) { j = json::array(); }, "not an object");
  bad_json([](json& j) { j["model"]["type"] = "WordPiece"; }, "must be a BPE model");
  bad_json([](json& j) { j.erase("model"); }, "must be a BPE model");
  bad_json([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, "not supported");
  bad_json([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  bad_json([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer");
  bad_json([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "ByteLevel");
  bad_json([](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "add_prefix_space");
  bad_json([](json& j) { j["model"]["merges"] = 3; }, "model.merges must be an array");
  bad_json([](json& j) { j["model"]["merges"][4] = "abc"; }, "merge 4");
  bad_json([](json& j) { j["model"]["merges"][4] = json::array({"a"}); }, "merge 4");
  bad_json([](json& j) { j["model"]["merges"][4] = json::array({"a b", "c"}); }, "merge 4");
  bad_json([](json& j) { j["model"]["vocab"] = "x"; }, "must be a JSON object");
  bad_json([](json& j) { j["added_tokens"] = 1; }, "added_tokens must be an array");
  bad_json([](json& j) { j["added_tokens"][0]["content"] = ""; }, "non-empty");
  bad_json([](json& j) { j["added_tokens"][0]["id"] = 5; }, "has id 5 but the vocabulary");
  bad_json([](json& j) { j["added_tokens"][0]["id"] = -5; }, "outside [0, 2^31)");
  // Folders and files.
  const std::string dir = accel::test::hf_scratch("tokenizer-missing");
  CHECK_THROWS_WITH_AS(hf::GPT2Tokenizer::from_pretrained(dir),
                       doctest::Contains("needs tokenizer.json, or vocab.json and merges.txt"),
                       IoError);
  write(dir + "/vocab.json", v);
  CHECK_THROWS_WITH_AS(hf::GPT2Tokenizer::from_pretrained(dir),
                       doctest::Contains("(merges.txt is missing)"), IoError);
  write(dir + "/merges.txt", "a b c\n");
  check_error<IoError>([&] { hf::GPT2Tokenizer::from_pretrained(dir); },
                       {dir + "/merges.txt' line 1"});
  CHECK_THROWS_WITH_AS(hf::GPT2Tokenizer::from_pretrained(dir + "/nope"),
                       doctest::Contains("is not a directory"), IoError);
  CHECK_THROWS_AS(hf::GPT2Tokenizer::from_files(dir + "/nope.json", dir + "/merges.txt"), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bytes_to_unicode is encoder.py's table") {
  const auto& t = hf::bytes_to_unicode();
  CHECK(t['!'] == "!");
  CHECK(t['~'] == "~");
  CHECK(t[' '] == "\xc4\xa0");   // U+0120 'Ġ'
  CHECK(t[0] == "\xc4\x80");     // U+0100 'Ā'
  CHECK(t[127] == "\xc4\xa1");   // U+0121
  CHECK(t[0xA0] == "\xc5\x82");  // U+0142
  CHECK(t[0xAD] == "\xc5\x83");  // U+0143, the last
  CHECK(t[0xE9] == "\xc3\xa9");  // 'é' stands for itself
}
