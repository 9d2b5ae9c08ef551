// Internal pieces of the GPT-2 tokenizer shared by hf/tokenizer.cc and hf/tokenizer_text.cc (not
// installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace accel::hf::detail {

// next_char's code point for bytes that do not start a well-formed UTF-8 sequence.
inline constexpr uint32_t kInvalidByte = 0xFFFFFFFFu;

// The classes of GPT-2's pattern (Note [gpt2 pattern] in tokenizer_text.cc).
enum class CharClass : uint8_t { Letter, Number, Space, Other };
CharClass char_class(uint32_t c);

// The character at byte i of s (i < s.size()): sets cp and returns its length in bytes. A byte
// that starts no well-formed sequence, or a sequence cut short, sets cp = kInvalidByte and
// returns the bytes of the maximal ill-formed subpart (the start byte and the continuation bytes
// that still fit it; at least 1).
size_t next_char(std::string_view s, size_t i, uint32_t& cp);
void append_utf8(std::string& out, uint32_t c);
// s with every maximal ill-formed subpart replaced by U+FFFD (Python's errors="replace").
std::string replace_invalid_utf8(std::string_view s);

}  // namespace accel::hf::detail
