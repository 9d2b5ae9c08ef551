#!/usr/bin/python3
"""Writes tests/nn/rnn_fixture.safetensors: PyTorch's RNN / LSTM / GRU and cell results that
tests/nn/test_rnn.cc replays (weights, inputs, initial states, lengths, outputs, final states and
the gradient of every parameter, input and initial state).

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/nn/make_rnn_fixture.py
The test never runs Python; it reads the committed file.

Each case `name` stores `name.<param>` (PyTorch's parameter names), `name.input`, `name.h0`,
`name.c0`, `name.lengths` (when used), `name.out`, `name.h_n`, `name.c_n`, the cotangents
`name.w_out` / `name.w_h` / `name.w_c` of the loss sum(out * w_out) + sum(h_n * w_h) +
sum(c_n * w_c), and `name.grad.<param|input|h0|c0>`. The metadata entry `cases` lists
`name kind num_layers bidirectional batch_first bias has_state has_lengths` per case, `;`-separated.
With lengths, the input is packed (pack_padded_sequence, enforce_sorted=False) and the output
unpacked with pad_packed_sequence(total_length=T), so positions past a length are zero.
"""
import json
import os
import struct

import torch

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)

IN, H, T, B = 2, 3, 4, 3
LENGTHS = [3, 4, 2]  # unsorted on purpose: enforce_sorted=False

tensors = {}
cases = []


def put(name, t):
    tensors[name] = t.detach().contiguous().clone()


def run_case(name, kind, layers, bidir, batch_first, bias, has_state, has_lengths):
    D = 2 if bidir else 1
    if kind == "LSTM":
        m = torch.nn.LSTM(IN, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidir)
    elif kind == "GRU":
        m = torch.nn.GRU(IN, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidir)
    else:
        m = torch.nn.RNN(IN, H, layers, nonlinearity=kind, bias=bias, batch_first=batch_first,
                         bidirectional=bidir)
    x = torch.randn((B, T, IN) if batch_first else (T, B, IN), requires_grad=True)
    h0 = torch.randn(layers * D, B, H, requires_grad=True)
    c0 = torch.randn(layers * D, B, H, requires_grad=True)
    state = None
    if has_state:
        state = (h0, c0) if kind == "LSTM" else h0
    inp = x
    if has_lengths:
        inp = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first,
                                                      enforce_sorted=False)
    out, hn = m(inp, state)
    if has_lengths:
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first, total_length=T)
    cn = None
    if kind == "LSTM":
        hn, cn = hn
    w_out, w_h = torch.randn_like(out), torch.randn_like(hn)
    loss = (out * w_out).sum() + (hn * w_h).sum()
    if cn is not None:
        w_c = torch.randn_like(cn)
        loss = loss + (cn * w_c).sum()
        put(name + ".c_n", cn)
        put(name + ".w_c", w_c)
    loss.backward()
    for pname, p in m.named_parameters():
        put(name + "." + pname, p)
        put(name + ".grad." + pname, p.grad)
    put(name + ".input", x)
    put(name + ".grad.input", x.grad)
    if has_state:
        put(name + ".h0", h0)
        put(name + ".grad.h0", h0.grad)
        if kind == "LSTM":
            put(name + ".c0", c0)
            put(name + ".grad.c0", c0.grad)
    if has_lengths:
        put(name + ".lengths", torch.tensor(LENGTHS, dtype=torch.int64))
    put(name + ".out", out)
    put(name + ".h_n", hn)
    put(name + ".w_out", w_out)
    put(name + ".w_h", w_h)
    cases.append(" ".join(str(v) for v in [name, kind, layers, int(bidir), int(batch_first),
                                            int(bias), int(has_state), int(has_lengths)]))


def run_cell(name, kind):
    if kind == "LSTMCell":
        m = torch.nn.LSTMCell(IN, H)
    elif kind == "GRUCell":
        m = torch.nn.GRUCell(IN, H)
    else:
        m = torch.nn.RNNCell(IN, H, nonlinearity="relu" if kind == "RNNCell_relu" else "tanh")
    x = torch.randn(B, IN, requires_grad=True)
    h0 = torch.randn(B, H, requires_grad=True)
    c0 = torch.randn(B, H, requires_grad=True)
    if kind == "LSTMCell":
        hn, cn = m(x, (h0, c0))
    else:
        hn, cn = m(x, h0), None
    w_h = torch.randn_like(hn)
    loss = (hn * w_h).sum()
    if cn is not None:
        w_c = torch.randn_like(cn)
        loss = loss + (cn * w_c).sum()
        put(name + ".c_n", cn)
        put(name + ".w_c", w_c)
        put(name + ".c0", c0)
    loss.backward()
    for pname, p in m.named_parameters():
        put(name + "." + pname, p)
        put(name + ".grad." + pname, p.grad)
    put(name + ".input", x)
    put(name + ".grad.input", x.grad)
    put(name + ".h0", h0)
    put(name + ".grad.h0", h0.grad)
    if cn is not None:
        put(name + ".grad.c0", c0.grad)
    put(name + ".h_n", hn)
    put(name + ".w_h", w_h)
    cases.append(f"{name} {kind} 1 0 0 1 1 0")


for kind in ["LSTM", "GRU", "tanh", "relu"]:
    k = kind.lower()
    # 2 layers, bidirectional, time-major, initial state
    run_case(k + "_bi_state", kind, 2, True, False, True, True, False)
    # 2 layers, bidirectional, batch_first, no state, lengths
    run_case(k + "_bi_bf_len", kind, 2, True, True, True, False, True)
    # 2 layers, one direction, batch_first, initial state and lengths
    run_case(k + "_bf_state_len", kind, 2, False, True, True, True, True)
    # 1 layer, time-major, no bias, no state
    run_case(k + "_nobias", kind, 1, False, False, False, False, False)
for kind in ["LSTMCell", "GRUCell", "RNNCell", "RNNCell_relu"]:
    run_cell(kind.lower(), kind)

# safetensors: u64 header length, JSON header, raw little-endian data.
header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    t = tensors[name]
    dt = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
    data = t.numpy().tobytes()
    header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
header["__metadata__"] = {"cases": ";".join(cases), "torch": torch.__version__}
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rnn_fixture.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for b in blobs:
        f.write(b)
print(f"wrote {path}: {len(tensors)} tensors, {len(cases)} cases")
