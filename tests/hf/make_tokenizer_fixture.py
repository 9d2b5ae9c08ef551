#!/usr/bin/python3
"""Writes the GPT-2 tokenizer fixture of tests/hf/test_hf_tokenizer.cc (tests/hf/fixtures/
gpt2_tokenizer/): a small byte-level BPE learned from fortunes text, as the files a Hugging Face
GPT-2 folder holds, and what the reference tokenizer (gpt2_bpe.py: encoder.py's algorithm with
GPT-2's pre-tokenisation pattern) makes of a set of texts.

Run with /usr/bin/python3 (no torch needed):  /usr/bin/python3 tests/hf/make_tokenizer_fixture.py
The tests never run Python; they read the committed files.

Written:
  vocab.json, merges.txt   256 byte characters + 300 merges + <|endoftext|> (557 tokens), as
                           GPT2Tokenizer's files (merges.txt with its "#version: 0.2" line)
  tokenizer.json           the same tokenizer as the `tokenizers` library writes it (BPE model,
                           ByteLevel pre-tokenizer and decoder, <|endoftext|> an added token)
  cases.json               {"encode": [{"text", "ids", "pieces"}], "decode": [{"ids", "text"}]}
"""
import json
import os

import gpt2_bpe

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "gpt2_tokenizer")
FORTUNES = "/usr/share/games/fortunes"

# Training text: fortunes plus a few lines in other scripts, so that merges join multi-byte
# characters too.
UNICODE_LINES = [
    "Café au lait, naïve résumé, déjà vu — «très» “bien” … façade.\n",
    "Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! Українська: дякую.\n",
    "日本語のテキスト、東京。中文：你好，世界。한국어: 안녕하세요.\n",
    "Zahlen: ½ ¾ ² ³ ٣٤٥ ๑๒ Ⅻ १२३; Straße, Øresund, Ærø, İstanbul.\n",
]

CASES = [
    "Hello world",
    "I'm sure they've said we'll go, it's 'quoted', he'd and 'S caps 'T",
    "'s's 'll'd ''re 'rE 've'm",
    "  leading and   multiple spaces   \n\n trailing  ",
    "tabs\tand\r\nCRLF\x0bvt\x0cff\x85nel",
    "numbers 12345 and 3.14, 1,000,000 ² ½ ٣٤ Ⅻ ๑๒ १२३",
    "naïve café — “quotes” «guillemets» … façade, Straße",
    "Ελληνικά Русский 日本語テキスト 한국어 ﷽",
    "emoji 😀👍🏽 and ZWJ 👩\u200d💻 flags 🇩🇪",
    "NBSP\u00a0here and\u2003em space and\u3000ideographic \u2028line\u2029para",
    "\x1cfile sep\x1f unit sep\x1c\x1d",
    "combining e\u0301 marks a\u0308 and \u0915\u093f",
    "a<|endoftext|>b <|endoftext|> c<|endoftext|><|endoftext|>",
    "<|endoftext <|endoftext|",
    "",
    "   ",
    " ",
    "\n",
    "!!!???...''' ---> <-- ==",
    "x\x00y\x7f\x01z",
    "ALL CAPS AND MiXeD cAsE wOrDs",
    "trailing space ",
    "word\n\n\n\nword \n word",
    "\U0001d400\U0001d401 math bold, \U00020000 CJK ext B",
]

DECODE_BYTES = [
    b"\xe2\x82",            # a truncated 3-byte sequence: one U+FFFD
    b"\xe2\x82a",
    b"\xf0\x9f",            # a truncated 4-byte sequence
    b"\xed\xa0\x80",        # a surrogate: three U+FFFD
    b"\xc0\xaf",            # overlong: two
    b"\xf4\x90\x80\x80",    # above U+10FFFF: four
    b"\xe0\x80\xbf",        # overlong 3-byte: three
    b"\xff\xfe",
    b"ok \xc3\xa9\xc3",     # valid then truncated
    b"\x80abc\xbf",
    b"\xf0\x9f\x98\x80\xf0\x9f\x98",
    b"\xe1\x80\x80\xef\xbf\xbf\xf3\xa0\x80\x80",
]


def fortunes_text():
    parts = []
    for name in ("fortunes", "wisdom"):
        with open(os.path.join(FORTUNES, name), encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    return "".join(parts)


def main():
    text = fortunes_text()
    train_text = text[:40000]
    lines = train_text.splitlines(keepends=True) + UNICODE_LINES * 3
    vocab, merges = gpt2_bpe.train(lines, 300)
    tok = gpt2_bpe.Tokenizer(vocab, merges)
    os.makedirs(OUT, exist_ok=True)
    gpt2_bpe.write_vocab(os.path.join(OUT, "vocab.json"), vocab)
    gpt2_bpe.write_merges(os.path.join(OUT, "merges.txt"), merges)
    eot = vocab[gpt2_bpe.ENDOFTEXT]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": eot, "content": gpt2_bpe.ENDOFTEXT, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [a + " " + b for a, b in merges]},
    }
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json, f, ensure_ascii=False)
        f.write("\n")

    # Texts: the hand-made cases, then held-out fortunes text (after the training part) in
    # chunks of lines, and the training lines with Unicode.
    held = text[40000:46000].splitlines(keepends=True)
    texts = CASES + ["".join(held[i:i + 12]) for i in range(0, len(held), 12)] + UNICODE_LINES
    encode = []
    for t in texts:
        pieces = []
        for i, part in enumerate(__import__("re").split("(<\\|endoftext\\|>)", t)):
            pieces.extend([part] if i % 2 else tok.pieces(part))
        encode.append({"text": t, "ids": tok.encode(t), "pieces": pieces})
        assert tok.decode(tok.encode(t)) == t
    decode = []
    byte_id = {b: vocab[gpt2_bpe.BYTE_ENCODER[b]] for b in range(256)}
    for raw in DECODE_BYTES:
        ids = [byte_id[b] for b in raw]
        decode.append({"ids": ids, "text": tok.decode(ids)})
    # A multi-byte character split across tokens, decoded piece by piece.
    ids = tok.encode("é日😀")
    for k in range(1, len(ids) + 1):
        decode.append({"ids": ids[:k], "text": tok.decode(ids[:k])})
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"encode": encode, "decode": decode}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    n = sum(len(c["ids"]) for c in encode)
    print(f"wrote {OUT}: vocab {len(vocab)}, merges {len(merges)}, {len(encode)} encode cases "
          f"({n} tokens), {len(decode)} decode cases")


if __name__ == "__main__":
    main()
