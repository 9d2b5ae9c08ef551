"""A reference GPT-2 byte-level BPE tokenizer (the published encoder.py algorithm of openai/gpt-2,
as transformers' GPT2Tokenizer runs it), for the fixtures of tests/hf/test_hf_tokenizer.cc and
tests/examples/test_gpt2_finetune.cc. Plain Python 3 (no torch, no regex module).

GPT-2 splits text with the `regex` module's pattern

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

The `regex` module is not installed here, and Python's `re` knows neither \\p{L} nor \\p{N}, and
its \\s also matches U+001C..U+001F, which the `regex` module's \\s (Unicode's White_Space
property) does not. So the same pattern is compiled with `re` after spelling out the classes:
\\p{L} and \\p{N} as character classes of every code point whose unicodedata general category
starts with L or N (Python's Unicode database, 14.0 for Python 3.11), \\s as White_Space. The
engine (leftmost alternative first, greedy with backtracking, the lookahead) is `re`'s: this is
an independent check of accel's hand-written scanner, not a copy of it.
"""
import json
import re
import sys
import unicodedata

ENDOFTEXT = "<|endoftext|>"

# Unicode's White_Space property (PropList.txt): what the regex module's \s matches.
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]


def category_ranges(prefix):
    """The code point ranges whose general category starts with `prefix` ("L", "N")."""
    out, start = [], None
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c)).startswith(prefix):
            if start is None:
                start = c
        elif start is not None:
            out.append((start, c - 1))
            start = None
    if start is not None:
        out.append((start, sys.maxunicode))
    return out


def _class_body(ranges):
    def esc(c):
        return "\\U%08x" % c
    return "".join(esc(a) if a == b else esc(a) + "-" + esc(b) for a, b in ranges)


_L = _class_body(category_ranges("L"))
_N = _class_body(category_ranges("N"))
_S = _class_body(WHITE_SPACE)
PATTERN = re.compile(
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?[" + _L + "]+"
    "| ?[" + _N + "]+"
    "| ?[^" + _S + _L + _N + "]+"
    "|[" + _S + "]+(?![^" + _S + "])"
    "|[" + _S + "]+")


def bytes_to_unicode():
    """encoder.py's table: every byte to a printable character (printable Latin-1 bytes to
    themselves, the others to U+0100 upwards in byte order)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {v: k for k, v in BYTE_ENCODER.items()}


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class Tokenizer:
    """encoder.py's Encoder with transformers' GPT2Tokenizer around it: <|endoftext|> (and any
    other added token) is split out before the pattern runs, unknown pieces map to the unk id
    (<|endoftext|>), decode replaces invalid UTF-8 with U+FFFD (errors="replace")."""

    def __init__(self, vocab, merges, added=(ENDOFTEXT,)):
        self.encoder = dict(vocab)
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.bpe_ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.added = [t for t in added if t in self.encoder]
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return [token]
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        self.cache[token] = list(word)
        return list(word)

    def pieces(self, text):
        """The pre-tokenizer's pieces of a text without added tokens."""
        return PATTERN.findall(text)

    def encode_plain(self, text):
        ids = []
        unk = self.encoder.get(ENDOFTEXT)
        for piece in self.pieces(text):
            chars = "".join(BYTE_ENCODER[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder.get(t, unk) for t in self.bpe(chars))
        return ids

    def encode(self, text):
        if not self.added:
            return self.encode_plain(text)
        split = re.compile("(" + "|".join(re.escape(t) for t in self.added) + ")")
        ids = []
        for i, part in enumerate(split.split(text)):
            if i % 2 == 1:
                ids.append(self.encoder[part])
            elif part:
                ids.extend(self.encode_plain(part))
        return ids

    def decode_bytes(self, ids):
        text = "".join(self.decoder[i] for i in ids)
        return bytes(BYTE_DECODER[c] for c in text)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def train(texts, num_merges):
    """A small byte-level BPE learned from `texts` the usual way: words are the pattern's pieces
    as byte characters; each round merges the most frequent adjacent pair (ties: the smallest
    pair). Returns (vocab, merges): the 256 byte characters in encoder.py's order, then one token
    per merge, then <|endoftext|>."""
    counts = {}
    for text in texts:
        for piece in PATTERN.findall(text):
            w = tuple(BYTE_ENCODER[b] for b in piece.encode("utf-8"))
            counts[w] = counts.get(w, 0) + 1
    words = dict(counts)
    merges = []
    for _ in range(num_merges):
        freq = {}
        for w, n in words.items():
            for i in range(len(w) - 1):
                freq[(w[i], w[i + 1])] = freq.get((w[i], w[i + 1]), 0) + n
        if not freq:
            break
        best = min(freq, key=lambda p: (-freq[p], p))
        merges.append(best)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i < len(w) - 1 and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    vocab = {}
    for b in BYTE_ENCODER:  # insertion order: encoder.py's bs order
        vocab[BYTE_ENCODER[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    vocab[ENDOFTEXT] = len(vocab)
    return vocab, merges


def write_vocab(path, vocab):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
        f.write("\n")


def write_merges(path, merges):
    with open(path, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(a + " " + b + "\n")
