#!/usr/bin/env python3
"""Writes the seed corpus tests/fuzz/corpus/<target>/: small valid and near-valid inputs.

Run from anywhere; rewrites the files it owns (seed-*) and leaves others alone (crash
reproducers added by hand are kept as they are).
"""
import gzip
import hashlib
import hmac
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def idx(type_code, dims, payload):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def gz(b):
    return gzip.compress(b, mtime=0)


# ---- IDX ----
images = idx(0x08, [3, 2, 2], bytes(range(12)))
write("fuzz_idx", "images", images)
write("fuzz_idx", "images.gz", gz(images))
write("fuzz_idx", "labels", idx(0x08, [4], bytes([1, 2, 3, 4])))
write("fuzz_idx", "float", idx(0x0D, [1], struct.pack(">f", 1.5)))
write("fuzz_idx", "double", idx(0x0E, [2], struct.pack(">dd", 1.5, -2)))
write("fuzz_idx", "short", idx(0x0B, [2, 1], struct.pack(">hh", -3, 7)))
write("fuzz_idx", "int.gz", gz(idx(0x0C, [2], struct.pack(">ii", -3, 7))))
write("fuzz_idx", "truncated", images[:-1])
write("fuzz_idx", "trailing", images + b"\0")
write("fuzz_idx", "empty-dim", idx(0x08, [0, 5], b""))
write("fuzz_idx", "overflow", idx(0x08, [65536, 65536, 65536, 65536], b""))
write("fuzz_idx", "huge-declared.gz", gz(idx(0x08, [1 << 20, 1 << 10], b"\0" * 4096)))
write("fuzz_idx", "multi-member.gz", gz(images[:7]) + gz(images[7:]))

# ---- CSV (first byte: delimiter index | header mode << 3) ----
write("fuzz_csv", "header", b"\x00" + b"a,b,label\n1,2,0\n3.5,-4e3,1\n")
write("fuzz_csv", "no-header", b"\x08" + b"1,2\n3,4\n\n5,6\n")
write("fuzz_csv", "semicolon", b"\x11" + b"x;y\n\"1\";\" 2 \"\r\n")
write("fuzz_csv", "tab", b"\x02" + b"1\t2\tnan\n+3\tinf\t-0\n")
write("fuzz_csv", "ragged", b"\x00" + b"1,2,3\n4,5\n")
write("fuzz_csv", "not-number", b"\x00" + b"1,2\n3,abc\n")

# ---- token files (byte 0: type | header_bytes << 2; bytes 1-2: vocab; byte 3: window) ----
write("fuzz_tokens", "u8", bytes([0, 0, 0, 4]) + b"hello world, tokens!")
write("fuzz_tokens", "u16-vocab", bytes([1, 0x01, 0x00, 0x23]) + struct.pack("<8H", *range(8)))
write("fuzz_tokens", "u32-header", bytes([2 | (8 << 2), 0, 0, 0x42]) + bytes(8) +
      struct.pack("<6I", 1, 2, 3, 4, 5, 6))
write("fuzz_tokens", "odd-bytes", bytes([1, 0, 0, 2]) + b"abc")

# ---- safetensors ----


def st(header, buffer):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + buffer


write("fuzz_safetensors", "two", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [8, 16]},
                                      "__metadata__": {"format": "pt"}}, bytes(16)))
write("fuzz_safetensors", "bool", st({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}},
                                     bytes([0, 1, 1])))
write("fuzz_safetensors", "empty", st({}, b""))
write("fuzz_safetensors", "zero-size", st({"z": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [0, 0]}}, b""))
write("fuzz_safetensors", "foreign-dtype", st({"q": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)))
write("fuzz_safetensors", "overlap", st({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                          "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, bytes(6)))
write("fuzz_safetensors", "nested", struct.pack("<Q", 40) + b"{" + b"[" * 38 + b"}")

# ---- config ----
write("fuzz_config", "full", """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_machines: 2
num_processes: 4
machine_rank: 1
main_process_ip: '10.0.0.1'
main_process_port: 29500
mixed_precision: 'bf16'
use_cpu: true
gpu_ids: all
rdzv_backend: static
same_network: true
main_training_function: 'main'
gradient_accumulation_steps: 2
zero_config:
  zero_stage: 2
max_restarts: 1
monitor_interval: 0.5
num_cpu_threads_per_process: 0
""")
write("fuzz_config", "accelerate", """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
gpu_ids: [0, 1]
machine_rank: 0
main_training_function: main
mixed_precision: fp16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: false
""")
write("fuzz_config", "empty", "")
write("fuzz_config", "flow", "{num_processes: 2, distributed_type: MULTI_CPU, zero_config: {zero_stage: 1}}")
write("fuzz_config", "complex-key", "? [a, b]\n: 1\n")
write("fuzz_config", "map-key", "{a: 1}: 2\n")
write("fuzz_config", "anchors", "x: &a 1\nnum_processes: *a\n")
write("fuzz_config", "typo", "num_procesess: 2\n")
write("fuzz_config", "fsdp", """num_processes: 4
distributed_type: MULTI_CPU
use_cpu: true
zero_config:
  zero_stage: 3
  param_dtype: bf16
  reduce_dtype: fp32
fsdp_config:
  fsdp_wrap_classes: [Block, Layer]
  fsdp_reshard_after_forward: false
  fsdp_prefetch: true
  fsdp_activation_checkpointing: true
""")
write("fuzz_config", "fsdp-accelerate", """fsdp_config:
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 100000
  fsdp_sharding_strategy: FULL_SHARD
zero_config: {zero_stage: 3}
""")

# ---- checkpoint records (state.json of sharded checkpoints; parallel/checkpoint_records.h) ----
zero_state = {"format": 1, "world_size": 2, "zero_stage": 2,
              "zero": [{"buckets": [[49, 50], [16, 16], [512, 512], [128, 128]], "stage": 2}]}
write("fuzz_ckpt_records", "zero", json.dumps(zero_state))
bad = json.loads(json.dumps(zero_state))
bad["zero"][0]["buckets"][0] = [49, 1]  # a bucket smaller than the world size
write("fuzz_ckpt_records", "zero-small-bucket", json.dumps(bad))
write("fuzz_ckpt_records", "zero-two-optimizers", json.dumps(
    {"world_size": 3, "zero": [None, {"buckets": [[7, 9]], "stage": 1}]}))
fsdp_state = {"format": 1, "world_size": 4, "zero_stage": 3, "fsdp": {
    "kind": "fsdp", "world": 4,
    "models": [{"params": [
        {"name": "0.weight", "shape": [32, 4], "spans": [[0, 40], [40, 80], [80, 120], [120, 128]]},
        {"name": "0.bias", "shape": [32], "spans": [[0, 0], [0, 0], [0, 0], [0, 32]]},
        {"name": "4.weight", "shape": [1, 16], "spans": [[0, 5], [5, 10], [10, 15], [15, 16]]},
        {"name": "4.bias", "shape": [1], "spans": [[0, 0], [0, 0], [0, 0], [0, 1]]}]}],
    "optimizers": [{"params": ["0:0.weight", "0:4.weight", "0:0.bias", "0:4.bias"]}]}}
write("fuzz_ckpt_records", "fsdp", json.dumps(fsdp_state))
bad = json.loads(json.dumps(fsdp_state))
bad["fsdp"]["models"][0]["params"][0]["spans"] = [[0, 40], [39, 80], [80, 120], [120, 127]]
write("fuzz_ckpt_records", "fsdp-overlap", json.dumps(bad))  # lengths still add up to 128
bad = json.loads(json.dumps(fsdp_state))
bad["fsdp"]["optimizers"][0]["params"][0] = "7:0.weight"
write("fuzz_ckpt_records", "fsdp-stray-key", json.dumps(bad))

# ---- format-2 checkpoint index (parallel/checkpoint/index.h; byte 0 odd: the target sets the
# true index_crc32 before parsing, even: parsed as it is) ----


def ckpt_index(tensors, files, meta=None, crc=None):
    j = dict(meta or {})
    j.update({"format": 2, "crc_block_bytes": 1048576, "files": files, "tensors": tensors})
    # The CRC-32 of the compact text with sorted keys (nlohmann's dump) without index_crc32.
    text = json.dumps(j, sort_keys=True, separators=(",", ":"))
    j["index_crc32"] = zlib.crc32(text.encode()) if crc is None else crc
    return json.dumps(j, sort_keys=True, separators=(",", ":"))


def qkv_piece(f, rows):  # a piece of a [12, 4] qkv weight: the q, k, v rows it holds
    segs, local = [], 0
    for g in rows:
        segs.append([local, g, 2])
        local += 2
    return {"file": f, "entry": "qkv@r%d" % f, "region": {"dims": [segs, [[0, 0, 4]]]}, "crc": [7]}


ck_files = [{"name": "data_rank0.safetensors", "bytes": 500}, {"name": "data_rank1.safetensors", "bytes": 500}]
ck_tensors = {
    "qkv": {"dtype": "F64", "shape": [12, 4], "layout": "tp: Shard(0, chunks=3)",
            "pieces": [qkv_piece(0, [0, 4, 8]), qkv_piece(1, [2, 6, 10])]},
    "flat": {"dtype": "F32", "shape": [3, 5], "pieces": [
        {"file": 0, "entry": "flat@r0", "region": {"dims": [[[0, 0, 3]], [[0, 0, 5]]], "flat": [0, 8]}, "crc": [1]},
        {"file": 1, "entry": "flat@r1", "region": {"dims": [[[0, 0, 3]], [[0, 0, 5]]], "flat": [8, 15]}, "crc": [2]}]},
    "scalar": {"dtype": "I64", "shape": [], "pieces": [{"file": 0, "entry": "scalar@r0", "region": {"dims": []}, "crc": [3]}]},
    "empty": {"dtype": "BF16", "shape": [0, 3], "pieces": []},
}
ck_meta = {"step": 12, "mesh": {"world": 2}, "aliases": {}}
write("fuzz_ckpt_index", "valid", b"\x00" + ckpt_index(ck_tensors, ck_files, ck_meta).encode())
write("fuzz_ckpt_index", "valid-fix-crc", b"\x01" + ckpt_index(ck_tensors, ck_files, ck_meta).encode())
write("fuzz_ckpt_index", "bad-crc", b"\x00" + ckpt_index(ck_tensors, ck_files, ck_meta, crc=5).encode())
bad = json.loads(json.dumps(ck_tensors))
bad["qkv"]["pieces"][1] = qkv_piece(1, [0, 6, 10])  # rows 0-1 twice, 2-3 never: counts add up
write("fuzz_ckpt_index", "double-cover", b"\x01" + ckpt_index(bad, ck_files, ck_meta).encode())
bad = json.loads(json.dumps(ck_tensors))
del bad["flat"]["pieces"][1]
write("fuzz_ckpt_index", "missing-piece", b"\x01" + ckpt_index(bad, ck_files, ck_meta).encode())

# ---- rendezvous store (comm/store_protocol.h, Note [store protocol], version 2) ----
# Byte 0: 0x80 the server holds the token "tok"; 0x40 the connection starts authenticated (as
# rank 3; a second client, rank 1, is in too); low 6 bits the read size (0: all at once). The
# fuzz server's nonce, generation and job secret are fixed (store_fuzz_one), so these seeds
# carry valid handshakes: the client proof is an HMAC over them.
NC, NS, GEN = b"n" * 32, b"\x5a" * 32, b"\x01" * 16


def u32(v):
    return struct.pack("<I", v)


def sstr(b):
    return u32(len(b)) + b


def frame(body):
    return u32(len(body)) + body


def watch(ranks):
    return u32(len(ranks)) + b"".join(struct.pack("<i", r) for r in ranks)


def hello(token, member=-1, joined=b"\0" * 16, version=2):
    return frame(bytes([0]) + u32(0x54534341) + struct.pack("<H", version) +
                 bytes([1 if token else 0]) + NC + struct.pack("<i", member) + joined)


def auth(token, proof=None):
    if proof is None:
        proof = hmac.new(token, b"accel-store-v2 client" + NC + NS + GEN, hashlib.sha256).digest()
    return frame(bytes([9, 1]) + proof)


def st_set(k, v):
    return frame(bytes([1]) + sstr(k) + sstr(v))


def st_get(k, timeout=0, ranks=()):
    return frame(bytes([2]) + struct.pack("<Q", timeout) + sstr(k) + watch(ranks))


def st_wait(keys, timeout=0, ranks=()):
    return frame(bytes([4]) + struct.pack("<Q", timeout) + u32(len(keys)) +
                 b"".join(sstr(k) for k in keys) + watch(ranks))


def st_add(k, d):
    return frame(bytes([3]) + sstr(k) + struct.pack("<q", d))


def st_cas(k, e, d):
    return frame(bytes([7]) + sstr(k) + sstr(e) + sstr(d))


session = (st_set(b"a", b"1") + st_get(b"a") + st_add(b"n", 5) + st_cas(b"c", b"", b"x") +
           frame(bytes([5]) + u32(2) + sstr(b"a") + sstr(b"n")) + frame(bytes([6]) + sstr(b"a")) +
           frame(bytes([8])) + st_wait([b"n", b"later"], 100, [1]) + st_get(b"absent", 50, [1, 3]) +
           frame(bytes([10])) + frame(bytes([11]) + sstr(b"init failed")))
write("fuzz_store", "token-session", bytes([0x80]) + hello(b"tok", 2) + auth(b"tok") + session)
write("fuzz_store", "open-session", bytes([0x00]) + hello(b"", 0) + auth(b"") + session)
write("fuzz_store", "split-reads", bytes([0x80 | 5]) + hello(b"tok", 4) + auth(b"tok") + session)
write("fuzz_store", "bad-proof", bytes([0x80]) + hello(b"tok") + auth(b"tok", b"x" * 32) + session)
write("fuzz_store", "not-verified", bytes([0x80]) + hello(b"tok") + frame(bytes([9, 0])))
write("fuzz_store", "token-missing", bytes([0x80]) + hello(b"") + auth(b""))
write("fuzz_store", "stale-generation", bytes([0x00]) + hello(b"", 1, b"\x07" * 16) + auth(b""))
write("fuzz_store", "version-1", bytes([0x80]) + frame(bytes([0]) + u32(0x54534341) +
                                                        struct.pack("<H", 1) + sstr(b"tok")))
write("fuzz_store", "preauthed", bytes([0x40]) + session)
write("fuzz_store", "preauthed-blocked", bytes([0x40 | 3]) + st_wait([b"k1", b"k2"], 1 << 40, [3]) +
      st_get(b"k1", 10, [1]) + st_set(b"k2", b"v") + frame(bytes([11]) + sstr(b"")))
write("fuzz_store", "auth-twice", bytes([0x00]) + hello(b"") + auth(b"") + hello(b"") + auth(b""))


# ---- PNG / JPEG: the image fixtures of tests/data (made by PIL, make_image_fixtures.py) ----
IMAGES = os.path.join(HERE, "..", "data", "images")
for name in sorted(os.listdir(IMAGES)):
    with open(os.path.join(IMAGES, name), "rb") as f:
        data = f.read()
    write("fuzz_png" if name.endswith(".png") else "fuzz_jpeg", name, data)


# ---- Hugging Face config.json (hf/config.h): the fixtures of tests/hf, and near-valid ones ----
HF = os.path.join(HERE, "..", "hf", "fixtures")
for name in ("gpt2", "llama", "llama_tied"):
    with open(os.path.join(HF, name, "config.json")) as f:
        cfg = json.load(f)
    write("fuzz_hf_config", name, json.dumps(cfg))
    for key in ("n_head", "num_key_value_heads", "head_dim"):
        if key in cfg:
            write("fuzz_hf_config", name + "-" + key + "-3", json.dumps(dict(cfg, **{key: 3})))
write("fuzz_hf_config", "eos-list", json.dumps({"model_type": "llama", "eos_token_id": [1, 2]}))
write("fuzz_hf_config", "rope-scaling", json.dumps({"model_type": "llama",
                                                    "rope_scaling": {"rope_type": "llama3"}}))
write("fuzz_hf_config", "not-object", "[1, 2]")


# ---- GPT-2 tokenizer files (hf/tokenizer.h): byte 0 even: vocab.json NUL merges.txt; odd:
# tokenizer.json. A 256-byte-character vocabulary with a few merges, and near-valid variants. ----
def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


B2U = bytes_to_unicode()
tok_vocab = {B2U[b]: i for i, b in enumerate(B2U)}
tok_merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("in", "g"), ("'", "s")]
for a, b in tok_merges:
    tok_vocab[a + b] = len(tok_vocab)
tok_vocab["<|endoftext|>"] = len(tok_vocab)
merges_txt = "#version: 0.2\n" + "".join(a + " " + b + "\n" for a, b in tok_merges)
write("fuzz_gpt2_tokenizer", "files", b"\x00" + json.dumps(tok_vocab, ensure_ascii=False).encode() +
      b"\x00" + merges_txt.encode())
write("fuzz_gpt2_tokenizer", "no-eos", b"\x00" + json.dumps({B2U[b]: b for b in range(256)}).encode() +
      b"\x00" + merges_txt.encode())
write("fuzz_gpt2_tokenizer", "tiny", b"\x00" + b'{"a": 0, "b": 1, "ab": 2}\x00a b\n')
tok_json = {"model": {"type": "BPE", "vocab": tok_vocab,
                      "merges": [[a, b] for a, b in tok_merges]},
            "added_tokens": [{"id": tok_vocab["<|endoftext|>"], "content": "<|endoftext|>",
                              "special": True}],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}
write("fuzz_gpt2_tokenizer", "tokenizer.json", b"\x01" + json.dumps(tok_json, ensure_ascii=False).encode())
tok_json["model"]["merges"] = [a + " " + b for a, b in tok_merges]
write("fuzz_gpt2_tokenizer", "tokenizer-strings.json", b"\x01" + json.dumps(tok_json).encode())
write("fuzz_gpt2_tokenizer", "text", b"\x02 it's 'll \xc3\xa9\xe6\x97\xa5 42 \t\n  x\xff")
