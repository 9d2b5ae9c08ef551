#!/usr/bin/python3
"""PyTorch twin of examples/gpt2_finetune (transformers' run_clm_no_trainer.py): a small random
GPT-2 written as a Hugging Face folder, fine-tuned for a few AdamW steps on blocks of a fixed
fortunes text in float64, then greedy generation; tests/examples/test_gpt2_finetune.cc replays it.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/examples/torch_gpt2_finetune.py
The test never runs Python; it reads the committed files.

transformers is not installed: the model is tests/hf/make_hf_fixture.py's GPT-2 reference forward
(transformers' names and math, imported), the tokenizer tests/hf/gpt2_bpe.py's reference on the
small BPE of tests/hf/fixtures/gpt2_tokenizer, and run_clm's pieces are written out below:
  data      the text's lines (keeping "\\n"), the first 10 % for validation (datasets' split
            train[:10%]), each line tokenized, concatenated, cut into blocks of 16 tokens (the
            remainder dropped: group_texts); the training blocks in the order of a seeded
            randperm (the shuffled DataLoader), 2 per micro-batch, recorded for the test
  loss      GPT2LMHeadModel's: cross_entropy(logits[:, :-1], input_ids[:, 1:])
  optimizer AdamW(lr 2e-3, betas (0.9, 0.999), eps 1e-8), weight decay 0.1 except biases and
            LayerNorm weights; get_linear_schedule_with_warmup(2 warm-up steps, 5 steps)
  step      gradient accumulation 2 (each micro-batch's loss / 2, backward), then
            clip_grad_norm_(1.0), optimizer.step(), scheduler.step(), zero_grad()
  after     the validation loss (each batch of 2 blocks' mean counted per block), and 8 greedy
            tokens after the prompt "The " (each by a full recompute)

Written:
  tests/examples/gpt2_finetune_fixture/config.json, model.safetensors   the model as
      save_pretrained writes it (F32 weights, no lm_head.weight: tied), dropout 0
  tests/examples/gpt2_finetune_fixture.safetensors   text (U8), train_blocks / val_blocks, order,
      losses, lrs, grad_norms, eval_loss, prompt, greedy; metadata: the settings and checksums
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
import gpt2_bpe  # noqa: E402
import make_hf_fixture as hfx  # noqa: E402  (float64 default dtype, its generator seeded)
import twin  # noqa: E402

FOLDER = os.path.join(HERE, "gpt2_finetune_fixture")
TOKENIZER = os.path.join(HERE, "..", "hf", "fixtures", "gpt2_tokenizer")
TEXT_FILE = "/usr/share/games/fortunes/wisdom"

BLOCK, BATCH, ACCUM, STEPS, WARMUP = 16, 2, 2, 5, 2
LR, WD, MAX_NORM, VAL_PCT, EVAL_BATCH = 2e-3, 0.1, 1.0, 10, 2
PROMPT, NEW_TOKENS = "The ", 8

CONFIG = dict(hfx.GPT2, vocab_size=557, n_positions=16, n_embd=8, n_layer=2, n_head=2,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=556,
              eos_token_id=556)


def text_lines():
    with open(TEXT_FILE, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    return lines[200:290]


def group_texts(tok, lines):
    ids = [i for line in lines for i in tok.encode(line)]
    n = len(ids) // BLOCK
    return torch.tensor(ids[:n * BLOCK], dtype=torch.int64).view(n, BLOCK)


def clm_loss(state, ids):
    logits = hfx.gpt2_logits(state, CONFIG, ids)
    V = logits.size(-1)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))


def linear_with_warmup(step):
    """transformers' get_linear_schedule_with_warmup lr_lambda."""
    if step < WARMUP:
        return step / max(1, WARMUP)
    return max(0.0, (STEPS - step) / max(1, STEPS - WARMUP))


def main():
    with open(os.path.join(TOKENIZER, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(TOKENIZER, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(m.split()) for m in f.read().split("\n")[1:-1]]
    tok = gpt2_bpe.Tokenizer(vocab, merges)

    lines = text_lines()
    k = round(len(lines) * VAL_PCT / 100)
    train_blocks, val_blocks = group_texts(tok, lines[k:]), group_texts(tok, lines[:k])
    gen = torch.Generator().manual_seed(5)
    order = torch.randperm(train_blocks.size(0), generator=gen)[:STEPS * ACCUM * BATCH]

    # The model folder, as save_pretrained writes it: F32 weights (the test loads them in
    # float64, as here).
    os.makedirs(FOLDER, exist_ok=True)
    state = {name: t.float() for name, t in hfx.gpt2_state(CONFIG).items()}
    with open(os.path.join(FOLDER, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2, sort_keys=True)
        f.write("\n")
    hfx.save_safetensors(os.path.join(FOLDER, "model.safetensors"), state, {"format": "pt"})
    state = {name: t.double().requires_grad_() for name, t in state.items()}
    names = sorted(state)

    def checksum():
        return sum(float(state[n].detach().sum()) + float((state[n].detach() ** 2).sum())
                   for n in names)

    init_checksum = checksum()
    no_decay = [n for n in names if n.endswith(".bias") or ".ln_" in n]
    decay = [n for n in names if n not in no_decay]
    opt = torch.optim.AdamW([{"params": [state[n] for n in decay], "weight_decay": WD},
                             {"params": [state[n] for n in no_decay], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_with_warmup)
    losses, lrs, norms = [], [], []
    for micro in range(STEPS * ACCUM):
        ids = train_blocks[order[micro * BATCH:(micro + 1) * BATCH]]
        loss = clm_loss(state, ids)
        (loss / ACCUM).backward()
        losses.append(loss.item())
        if (micro + 1) % ACCUM == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_([state[n] for n in names],
                                                               MAX_NORM)))
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad()
    assert max(norms) > MAX_NORM, "clipping never acts: the check would not see it"

    with torch.no_grad():
        total, count = 0.0, 0
        for i in range(0, val_blocks.size(0), EVAL_BATCH):
            ids = val_blocks[i:i + EVAL_BATCH]
            total += clm_loss(state, ids).item() * ids.size(0)
            count += ids.size(0)
        eval_loss = total / count
        prompt = torch.tensor([tok.encode(PROMPT)], dtype=torch.int64)
        detached = {n: t.detach() for n, t in state.items()}
        greedy = hfx.greedy(lambda x: hfx.gpt2_logits(detached, CONFIG, x), prompt, NEW_TOKENS)

    text = "".join(lines).encode("utf-8")
    twin.write_safetensors(
        os.path.join(HERE, "gpt2_finetune_fixture.safetensors"),
        {"text": torch.tensor(list(text), dtype=torch.uint8),
         "train_blocks": train_blocks, "val_blocks": val_blocks, "order": order,
         "losses": torch.tensor(losses), "lrs": torch.tensor(lrs),
         "grad_norms": torch.tensor(norms), "eval_loss": torch.tensor([eval_loss]),
         "prompt": prompt, "greedy": greedy},
        {"block_size": str(BLOCK), "batch_size": str(BATCH), "accum": str(ACCUM),
         "steps": str(STEPS), "warmup": str(WARMUP), "lr": repr(LR), "weight_decay": repr(WD),
         "max_grad_norm": repr(MAX_NORM), "validation_split_percentage": str(VAL_PCT),
         "eval_batch_size": str(EVAL_BATCH), "prompt_text": PROMPT,
         "init_checksum": repr(init_checksum), "final_checksum": repr(checksum())})
    print("losses", [round(x, 4) for x in losses])
    print("grad norms", [round(x, 3) for x in norms], "eval loss", round(eval_loss, 4))
    print("greedy", greedy.tolist())


if __name__ == "__main__":
    main()
