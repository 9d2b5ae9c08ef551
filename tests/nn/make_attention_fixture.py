#!/usr/bin/python3
"""Writes tests/nn/attention_fixture.safetensors: PyTorch's MultiheadAttention,
TransformerEncoder, TransformerDecoder and Transformer results that tests/nn/test_transformer.cc
replays (weights, inputs, masks, outputs, attention weights and the gradient of every parameter
and input), in float64.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/nn/make_attention_fixture.py
The test never runs Python; it reads the committed file. The module configurations are listed
in the test next to each case name; keep the two in step.

Each case `name` stores `name.<param>` (PyTorch's state_dict names), its inputs (`name.query`,
`name.key`, `name.value` / `name.src` / `name.tgt`, `name.memory`), masks (`name.attn_mask`,
`name.key_padding_mask`, `name.src_mask`, `name.tgt_mask`, `name.memory_mask`,
`name.src_key_padding_mask`, `name.tgt_key_padding_mask`, `name.memory_key_padding_mask`; bool
or float64 as given to torch), the outputs `name.out` (and `name.weights`), the cotangents
`name.w_out` (`name.w_weights`) of the loss sum(out * w_out) (+ sum(weights * w_weights)) and
`name.grad.<param|input>`. Dropout is 0 and the modules are in training mode, so torch takes its
reference (non fast-path) code.
"""
import json
import os
import struct

import torch

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)

E, H, L, S, N = 6, 2, 4, 5, 2  # embed dim, heads, target length, source length, batch
DFF = 10

tensors = {}


def put(name, t):
    tensors[name] = t.detach().contiguous().clone()


def leaf(shape):
    return torch.randn(*shape, requires_grad=True)


def finish(name, m, inputs, out, weights=None):
    """Backpropagates sum(out * w_out) (+ weights) and stores everything under name."""
    w_out = torch.randn_like(out)
    loss = (out * w_out).sum()
    put(name + ".out", out)
    put(name + ".w_out", w_out)
    if weights is not None:
        w_w = torch.randn_like(weights)
        loss = loss + (weights * w_w).sum()
        put(name + ".weights", weights)
        put(name + ".w_weights", w_w)
    loss.backward()
    for pname, p in m.named_parameters():
        put(name + "." + pname, p)
        put(name + ".grad." + pname, p.grad)
    for iname, x in inputs.items():
        put(name + "." + iname, x)
        if x.requires_grad:
            put(name + ".grad." + iname, x.grad)


def bool_mask(shape, p=0.3):
    m = torch.rand(*shape) < p
    m[..., 0] = False  # no fully masked row
    return m


def mha_case(name, kdim=None, vdim=None, batch_first=False, self_attn=False, unbatched=False,
             attn_mask=None, kpm=False, need_weights=True, average=True):
    m = torch.nn.MultiheadAttention(E, H, dropout=0.0, kdim=kdim, vdim=vdim,
                                    batch_first=batch_first)
    m.train()
    kd, vd = kdim or E, vdim or E
    s = L if self_attn else S

    def shape(n, d):
        if unbatched:
            return (n, d)
        return (N, n, d) if batch_first else (n, N, d)

    inputs = {}
    q = leaf(shape(L, E))
    inputs["query"] = q
    if self_attn:
        k = v = q
    else:
        k, v = leaf(shape(s, kd)), leaf(shape(s, vd))
        inputs["key"], inputs["value"] = k, v
    am = None
    if attn_mask == "bool":
        am = bool_mask((L, s))
    elif attn_mask == "float3":
        am = torch.randn(N * H, L, s)
    elif attn_mask == "float":
        am = torch.randn(L, s)
    if am is not None:
        inputs["attn_mask"] = am
    kp = None
    if kpm:
        kp = bool_mask((s,) if unbatched else (N, s))
        inputs["key_padding_mask"] = kp
    out, w = m(q, k, v, key_padding_mask=kp, need_weights=need_weights, attn_mask=am,
               average_attn_weights=average)
    finish(name, m, inputs, out, w)


def causal(n):
    return torch.nn.Transformer.generate_square_subsequent_mask(n)


def encoder_case(name, norm_first, activation, batch_first, src_mask, kpm):
    layer = torch.nn.TransformerEncoderLayer(E, H, DFF, dropout=0.0, activation=activation,
                                             batch_first=batch_first, norm_first=norm_first)
    m = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(E),
                                    enable_nested_tensor=False)
    # Distinct layers (torch's clones start equal) so that a swapped layer order shows.
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.train()
    src = leaf((N, S, E) if batch_first else (S, N, E))
    inputs = {"src": src}
    mask = None
    if src_mask == "causal":
        mask = causal(S)
    elif src_mask == "bool":
        mask = bool_mask((S, S))
    if mask is not None:
        inputs["src_mask"] = mask
    kp = bool_mask((N, S)) if kpm else None
    if kp is not None:
        inputs["src_key_padding_mask"] = kp
    out = m(src, mask=mask, src_key_padding_mask=kp)
    finish(name, m, inputs, out)


def decoder_case(name, norm_first, activation, batch_first, kpm):
    layer = torch.nn.TransformerDecoderLayer(E, H, DFF, dropout=0.0, activation=activation,
                                             batch_first=batch_first, norm_first=norm_first)
    m = torch.nn.TransformerDecoder(layer, 2, norm=torch.nn.LayerNorm(E))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.train()
    tgt = leaf((N, L, E) if batch_first else (L, N, E))
    memory = leaf((N, S, E) if batch_first else (S, N, E))
    inputs = {"tgt": tgt, "memory": memory, "tgt_mask": causal(L)}
    mk = bool_mask((N, S)) if kpm else None
    tk = bool_mask((N, L)) if kpm else None
    if kpm:
        inputs["memory_key_padding_mask"] = mk
        inputs["tgt_key_padding_mask"] = tk
        inputs["memory_mask"] = torch.randn(L, S)
    out = m(tgt, memory, tgt_mask=inputs["tgt_mask"], memory_mask=inputs.get("memory_mask"),
            tgt_key_padding_mask=tk, memory_key_padding_mask=mk)
    finish(name, m, inputs, out)


def transformer_case(name):
    m = torch.nn.Transformer(E, H, 1, 1, DFF, dropout=0.0, activation="gelu", batch_first=True)
    m.train()
    src, tgt = leaf((N, S, E)), leaf((N, L, E))
    inputs = {"src": src, "tgt": tgt, "tgt_mask": causal(L)}
    out = m(src, tgt, tgt_mask=inputs["tgt_mask"])
    finish(name, m, inputs, out)


# MultiheadAttention (the test's table lists the same configurations)
mha_case("mha_self", self_attn=True)
mha_case("mha_self_masks", self_attn=True, attn_mask="bool", kpm=True, need_weights=False)
mha_case("mha_cross_kvdim", kdim=5, vdim=3, batch_first=True, attn_mask="float3", kpm=True,
         average=False)
mha_case("mha_cross", attn_mask="bool", kpm=True)
mha_case("mha_cross_float", attn_mask="float", need_weights=False)
mha_case("mha_unbatched", unbatched=True, kpm=True, attn_mask="float")
# TransformerEncoder / TransformerDecoder, 2 layers with a final norm
encoder_case("enc_post_relu_causal", False, "relu", False, "causal", False)
encoder_case("enc_pre_gelu_causal_kpm", True, "gelu", True, "causal", True)
encoder_case("enc_post_gelu_bool", False, "gelu", False, "bool", True)
encoder_case("enc_pre_relu_none", True, "relu", False, None, False)
decoder_case("dec_post_relu", False, "relu", False, False)
decoder_case("dec_pre_gelu_masks", True, "gelu", True, True)
transformer_case("transformer")

# safetensors: u64 header length, JSON header, raw little-endian data.
header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name]
    dt = {torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL"}[t.dtype]
    data = t.numpy().tobytes()
    header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header["__metadata__"] = {"torch": torch.__version__}
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_fixture.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)
print(f"wrote {path}: {len(tensors)} tensors, {offset + len(hj) + 8} bytes")
