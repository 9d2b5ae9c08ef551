#!/usr/bin/python3
"""PyTorch twin of examples/word_language_model.cc (pytorch/examples word_language_model, LSTM):
writes tests/examples/word_language_model_fixture.safetensors for
tests/examples/test_word_language_model.cc.

    /usr/bin/python3 tests/examples/torch_word_language_model.py          # the fixture
    /usr/bin/python3 tests/examples/torch_word_language_model.py --time   # ms/batch, real config

The check: model.py's RNNModel('LSTM', NTOKEN, 16, 16, 2, dropout=0, tied) in float64 with
twin.det_init weights, EPOCHS epochs of BATCHES truncated-BPTT batches (bptt 5, batch 4, hidden
carried over and detached, clip 0.25, p -= lr * grad from lr 20) on a random token stream, then
evaluate() on a random validation stream (eval batch 3) and main.py's lr rule. Stored: both
streams, every batch's loss, every epoch's validation loss and next lr, the checksum of the
initial and final weights. The same for the Transformer variant (model.py's encoder-only
TransformerModel, nhead 2, nhid 32, dropout 0, lr 5) in
word_language_model_transformer_fixture.safetensors.
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twin  # noqa: E402

NTOKEN, EMSIZE, NLAYERS, BSZ, EVAL_BSZ, BPTT = 50, 16, 2, 4, 3, 5
EPOCHS, BATCHES, LR, CLIP = 3, 2, 20.0, 0.25
NHEAD, NHID_T, LR_T = 2, 32, 5.0  # the Transformer check


class RNNModel(nn.Module):  # model.py's, LSTM only
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class PositionalEncoding(nn.Module):  # model.py's, the table in the default dtype (float64 here)
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        dtype = torch.get_default_dtype()  # the original: torch.float
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=dtype).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).to(dtype) * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer('pe', pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Module):  # model.py's (the encoder-only version)
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__()
        from torch.nn import TransformerEncoder, TransformerEncoderLayer
        self.model_type = 'Transformer'
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        # the original: mask.float(); 0 and -inf are the same in the model's dtype
        mask = mask.to(torch.get_default_dtype())
        return mask.masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, float(0.0))

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


criterion = nn.NLLLoss()


def train_step(model, data, targets, hidden, lr):
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss.item(), hidden


def train_step_transformer(model, data, targets, lr):
    model.zero_grad()
    output = model(data)
    output = output.view(-1, NTOKEN)
    loss = criterion(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss.item()


def evaluate_transformer(model, data_source):
    model.eval()
    total_loss = 0.
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, BPTT):
            data, targets = get_batch(data_source, i)
            output = model(data)
            output = output.view(-1, NTOKEN)
            total_loss += len(data) * criterion(output, targets).item()
    model.train()
    return total_loss / (len(data_source) - 1)


def evaluate(model, data_source):
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(data_source.size(1))
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, BPTT):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    model.train()
    return total_loss / (len(data_source) - 1)


def fixture():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1111)
    train = torch.randint(0, NTOKEN, (BSZ * BATCHES * BPTT + BSZ + 3,))
    valid = torch.randint(0, NTOKEN, (EVAL_BSZ * 8 + 2,))
    train_data, val_data = batchify(train, BSZ), batchify(valid, EVAL_BSZ)
    model = RNNModel('LSTM', NTOKEN, EMSIZE, EMSIZE, NLAYERS, 0.0, True)
    twin.det_init(model)
    init = twin.checksum(model)
    lr, best_val_loss = LR, None
    losses, val_losses, lrs = [], [], []
    for epoch in range(EPOCHS):
        model.train()
        hidden = model.init_hidden(BSZ)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
            if batch >= BATCHES:
                break
            data, targets = get_batch(train_data, i)
            loss, hidden = train_step(model, data, targets, hidden, lr)
            losses.append(loss)
        val_loss = evaluate(model, val_data)
        if not best_val_loss or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
        val_losses.append(val_loss)
        lrs.append(lr)
    print("losses", losses, "val", val_losses, "lrs", lrs)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "word_language_model_fixture.safetensors"),
        {"train": train, "valid": valid, "losses": torch.tensor(losses),
         "val_losses": torch.tensor(val_losses), "lrs": torch.tensor(lrs)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(model)),
         "ntoken": str(NTOKEN), "emsize": str(EMSIZE), "nlayers": str(NLAYERS), "bsz": str(BSZ),
         "eval_bsz": str(EVAL_BSZ), "bptt": str(BPTT), "epochs": str(EPOCHS),
         "batches": str(BATCHES), "lr": repr(LR), "clip": repr(CLIP)})


def fixture_transformer():
    """The Transformer variant: TransformerModel(NTOKEN, 16, NHEAD, 32, 2, dropout=0) on the same
    kind of streams, the same loop; word_language_model_transformer_fixture.safetensors."""
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(2222)
    train = torch.randint(0, NTOKEN, (BSZ * BATCHES * BPTT + BSZ + 3,))
    valid = torch.randint(0, NTOKEN, (EVAL_BSZ * 8 + 2,))
    train_data, val_data = batchify(train, BSZ), batchify(valid, EVAL_BSZ)
    model = TransformerModel(NTOKEN, EMSIZE, NHEAD, NHID_T, NLAYERS, 0.0)
    twin.det_init(model)
    init = twin.checksum(model)
    lr, best_val_loss = LR_T, None
    losses, val_losses, lrs = [], [], []
    for epoch in range(EPOCHS):
        model.train()
        for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
            if batch >= BATCHES:
                break
            data, targets = get_batch(train_data, i)
            losses.append(train_step_transformer(model, data, targets, lr))
        val_loss = evaluate_transformer(model, val_data)
        if not best_val_loss or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
        val_losses.append(val_loss)
        lrs.append(lr)
    print("transformer losses", losses, "val", val_losses, "lrs", lrs)
    twin.write_safetensors(
        os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "word_language_model_transformer_fixture.safetensors"),
        {"train": train, "valid": valid, "losses": torch.tensor(losses),
         "val_losses": torch.tensor(val_losses), "lrs": torch.tensor(lrs)},
        {"init_checksum": repr(init), "final_checksum": repr(twin.checksum(model)),
         "ntoken": str(NTOKEN), "emsize": str(EMSIZE), "nhead": str(NHEAD), "nhid": str(NHID_T),
         "nlayers": str(NLAYERS), "bsz": str(BSZ), "eval_bsz": str(EVAL_BSZ), "bptt": str(BPTT),
         "epochs": str(EPOCHS), "batches": str(BATCHES), "lr": repr(LR_T), "clip": repr(CLIP)})


def time_steps(ntoken=65567, batches=5):
    """ms per batch of main.py's default config with --tied (float32, 2x200 LSTM, batch 20,
    bptt 35, dropout 0.2) at the fortunes corpus's vocabulary size, on random tokens."""
    global BPTT
    BPTT = 35
    torch.manual_seed(1111)
    train_data = batchify(torch.randint(0, ntoken, (20 * 35 * (batches + 2) + 1,)), 20)
    model = RNNModel('LSTM', ntoken, 200, 200, 2, 0.2, True)
    hidden = model.init_hidden(20)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
        if batch == 1:
            t0 = time.perf_counter()
        if batch == batches + 1:
            break
        data, targets = get_batch(train_data, i)
        _, hidden = train_step(model, data, targets, hidden, 20.0)
    dt = (time.perf_counter() - t0) / batches
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads: {1000 * dt:.0f} ms/batch")


if __name__ == "__main__":
    if "--time" in sys.argv:
        time_steps()
    else:
        fixture()
        fixture_transformer()
