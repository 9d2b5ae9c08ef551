#!/usr/bin/python3
"""Writes the Hugging Face model fixtures of tests/hf/test_hf.cc: three small random models as
transformers would save them, and what PyTorch computes with them.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/hf/make_hf_fixture.py
The tests never run Python; they read the committed files.

transformers is not installed here, so the reference forwards below are written out with exactly
Hugging Face's parameter names and math (transformers 4.40's modeling_gpt2.py and
modeling_llama.py, eager attention):
  GPT-2 (GPT2LMHeadModel): Conv1D weights stored (in, out) and applied as addmm(b, x, W); gelu_new
    (the tanh GELU); attention scores divided by sqrt(head_dim), the causal mask as
    where(tril, scores, finfo.min); pre-LayerNorm blocks; lm_head tied to transformer.wte.
  Llama (LlamaForCausalLM): RMSNorm as weight * (x * rsqrt(mean(x^2) + eps)); rotary embeddings
    with rotate_half and rope_theta; grouped-query attention by repeat_kv; SwiGLU MLP
    down(silu(gate(x)) * up(x)); lm_head separate, or tied (tie_word_embeddings).
Everything is float64. Two places where transformers computes in float32 even in a float64 model
(Llama's RMSNorm and softmax upcast "to float32", and its rotary table in float32) are computed in
float64 here and in accel (docs/hf.md says so): the point is the same math at 1e-10.

Weights are drawn in float64 and rounded to float32, stored as F32 (half the bytes; the C++ test
loads them into a float64 model, as from_pretrained(dtype=float64) converts them), so both sides
compute in float64 from the same values.

Written (tests/hf/fixtures/):
  gpt2/config.json, gpt2/model.safetensors        one file; lm_head.weight absent (tied), as
                                                   save_pretrained writes it
  llama/config.json, llama/model-0000{1,2}-of-00002.safetensors, model.safetensors.index.json
                                                   sharded with HF's index (weight_map); GQA
                                                   (4 heads, 2 kv heads), untied lm_head
  llama_tied/config.json, llama_tied/model.safetensors   tie_word_embeddings, no GQA,
                                                   rope_theta 500000, head_dim 8 of hidden 16
  expected.safetensors: for each model m, m.input_ids (2, 7) int64, m.logits (2, 7, vocab)
    float64, m.greedy (2, 15) int64 (the prompt and 8 greedy tokens, each by a full recompute)
"""
import json
import math
import os
import struct

import torch

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
gen = torch.Generator().manual_seed(39)


def rand(*shape, std=1.0, mean=0.0):
    """float64 values that float32 holds exactly."""
    return (torch.randn(*shape, generator=gen) * std + mean).float().double()


# ---------------- safetensors, written by hand (the safetensors package is absent) ----------
DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}


def save_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_model(folder, config, state, shards=1):
    """config.json and the weights as save_pretrained writes them (F32), in `shards` files."""
    d = os.path.join(OUT, folder)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    stored = {k: v.float() for k, v in state.items()}
    if shards == 1:
        save_safetensors(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
        return
    names = sorted(stored)
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: stored[n] for n in names[s * per:(s + 1) * per]}
        save_safetensors(os.path.join(d, file), part, {"format": "pt"})
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * 4
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
        f.write("\n")


# ---------------- GPT-2 (modeling_gpt2.py) ----------------
def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.size(-1),), w, b, eps)


def conv1d(x, w, b):
    """transformers.pytorch_utils.Conv1D: weight (nx, nf), y = addmm(bias, x, weight)."""
    size_out = x.size()[:-1] + (w.size(1),)
    return torch.addmm(b, x.reshape(-1, x.size(-1)), w).view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_state(c):
    E, V, P, L = c["n_embd"], c["vocab_size"], c["n_positions"], c["n_layer"]
    s = {"transformer.wte.weight": rand(V, E, std=0.5), "transformer.wpe.weight": rand(P, E, std=0.2)}
    for i in range(L):
        p = "transformer.h.%d." % i
        for ln in ("ln_1", "ln_2"):
            s[p + ln + ".weight"] = rand(E, std=0.1, mean=1.0)
            s[p + ln + ".bias"] = rand(E, std=0.1)
        for name, nx, nf in (("attn.c_attn", E, 3 * E), ("attn.c_proj", E, E),
                             ("mlp.c_fc", E, 4 * E), ("mlp.c_proj", 4 * E, E)):
            s[p + name + ".weight"] = rand(nx, nf, std=1.0 / math.sqrt(nx))
            s[p + name + ".bias"] = rand(nf, std=0.1)
    s["transformer.ln_f.weight"] = rand(E, std=0.1, mean=1.0)
    s["transformer.ln_f.bias"] = rand(E, std=0.1)
    return s


def gpt2_logits(s, c, ids):
    E, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    B, T = ids.shape
    D = E // H
    h = s["transformer.wte.weight"][ids] + s["transformer.wpe.weight"][torch.arange(T)]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(c["n_layer"]):
        p = "transformer.h.%d." % i
        a = layer_norm(h, s[p + "ln_1.weight"], s[p + "ln_1.bias"], eps)
        q, k, v = conv1d(a, s[p + "attn.c_attn.weight"], s[p + "attn.c_attn.bias"]).split(E, dim=2)
        q, k, v = (t.view(B, T, H, D).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5)
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min))
        w = torch.softmax(w, dim=-1)
        o = torch.matmul(w, v).permute(0, 2, 1, 3).reshape(B, T, E)
        h = h + conv1d(o, s[p + "attn.c_proj.weight"], s[p + "attn.c_proj.bias"])
        m = layer_norm(h, s[p + "ln_2.weight"], s[p + "ln_2.bias"], eps)
        m = gelu_new(conv1d(m, s[p + "mlp.c_fc.weight"], s[p + "mlp.c_fc.bias"]))
        h = h + conv1d(m, s[p + "mlp.c_proj.weight"], s[p + "mlp.c_proj.bias"])
    h = layer_norm(h, s["transformer.ln_f.weight"], s["transformer.ln_f.bias"], eps)
    return torch.matmul(h, s["transformer.wte.weight"].t())  # lm_head tied to wte


# ---------------- Llama (modeling_llama.py) ----------------
def rms_norm(x, w, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary(positions, dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    freqs = positions[:, None].double() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    B, KV, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


def llama_state(c):
    E, V, L, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or E // H
    s = {"model.embed_tokens.weight": rand(V, E, std=0.5)}
    lin = lambda o, i: rand(o, i, std=1.0 / math.sqrt(i))  # nn.Linear: (out, in)
    for l in range(L):
        p = "model.layers.%d." % l
        s[p + "self_attn.q_proj.weight"] = lin(H * D, E)
        s[p + "self_attn.k_proj.weight"] = lin(KV * D, E)
        s[p + "self_attn.v_proj.weight"] = lin(KV * D, E)
        s[p + "self_attn.o_proj.weight"] = lin(E, H * D)
        s[p + "mlp.gate_proj.weight"] = lin(I, E)
        s[p + "mlp.up_proj.weight"] = lin(I, E)
        s[p + "mlp.down_proj.weight"] = lin(E, I)
        s[p + "input_layernorm.weight"] = rand(E, std=0.1, mean=1.0)
        s[p + "post_attention_layernorm.weight"] = rand(E, std=0.1, mean=1.0)
    s["model.norm.weight"] = rand(E, std=0.1, mean=1.0)
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = lin(V, E)
    return s


def llama_logits(s, c, ids):
    E, H, KV, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    D = c.get("head_dim") or E // H
    B, T = ids.shape
    cos, sin = rotary(torch.arange(T), D, c["rope_theta"])
    mask = torch.triu(torch.full((T, T), torch.finfo(torch.float64).min), diagonal=1)
    h = s["model.embed_tokens.weight"][ids]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = rms_norm(h, s[p + "input_layernorm.weight"], eps)
        q = (x @ s[p + "self_attn.q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
        k = (x @ s[p + "self_attn.k_proj.weight"].t()).view(B, T, KV, D).transpose(1, 2)
        v = (x @ s[p + "self_attn.v_proj.weight"].t()).view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D) + mask
        w = torch.softmax(w, dim=-1)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * D)
        h = h + o @ s[p + "self_attn.o_proj.weight"].t()
        x = rms_norm(h, s[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(x @ s[p + "mlp.gate_proj.weight"].t())
        h = h + (g * (x @ s[p + "mlp.up_proj.weight"].t())) @ s[p + "mlp.down_proj.weight"].t()
    h = rms_norm(h, s["model.norm.weight"], eps)
    head = s["model.embed_tokens.weight"] if c["tie_word_embeddings"] else s["lm_head.weight"]
    return h @ head.t()


# ---------------- generation: greedy, each step a full recompute ----------------
def greedy(logits_fn, ids, new_tokens):
    for _ in range(new_tokens):
        last = logits_fn(ids)[:, -1, :]
        top2 = torch.topk(last, 2, dim=-1).values
        # A near tie could go either way between two correct implementations.
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-6, "greedy step too close to call"
        ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
    return ids


GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 97,
    "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": None,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-05, "initializer_range": 0.02, "scale_attn_weights": True,
    "bos_token_id": 96, "eos_token_id": 96, "use_cache": True, "torch_dtype": "float32",
    "transformers_version": "4.40.0",
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 101,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
    "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "tie_word_embeddings": False, "initializer_range": 0.02, "bos_token_id": 1,
    "eos_token_id": 2, "use_cache": True, "torch_dtype": "float32",
    "transformers_version": "4.40.0",
}
LLAMA_TIED = dict(LLAMA, vocab_size=53, hidden_size=16, intermediate_size=40,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, rope_theta=500000.0,
                  rms_norm_eps=1e-05, tie_word_embeddings=True)


def main():
    expected = {}
    models = (("gpt2", GPT2, gpt2_state, gpt2_logits, 1),
              ("llama", LLAMA, llama_state, llama_logits, 2),
              ("llama_tied", LLAMA_TIED, llama_state, llama_logits, 1))
    for name, cfg, make, fwd, shards in models:
        state = make(cfg)
        write_model(name, cfg, state, shards)
        state = {k: v.float().double() for k, v in state.items()}  # what the files hold
        ids = torch.randint(0, cfg["vocab_size"], (2, 7), generator=gen)
        fn = lambda x: fwd(state, cfg, x)
        expected[name + ".input_ids"] = ids
        expected[name + ".logits"] = fn(ids)
        expected[name + ".greedy"] = greedy(fn, ids, 8)
    save_safetensors(os.path.join(OUT, "expected.safetensors"), expected)


if __name__ == "__main__":
    main()
