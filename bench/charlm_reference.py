"""PyTorch reference of tapeformer's char-LM recipe, the peer of every bench that
compares with PyTorch (scale.py, charlm_vs_pytorch.sh, val_loss_seeds.sh, paired_run).

Same config file, same architecture and init (nanoGPT's GPT: pre-LN blocks, fused
qkv, tanh-GELU MLP, tied head), same AdamW groups, nanoGPT's warmup+cosine
schedule, gradient clipping, data split and random-window batches, and the same
evaluation protocol (eval.iters val batches at each eval, eval.final_iters at the
end). Prints one JSON line on stdout (its "torch" is the PyTorch version that
ran); progress goes to stderr.

The benches run it on the newest PyTorch on PyPI, in a virtual environment out
of tapeformer's dependencies (`python3 bench/benchlib.py torch-python` prints
its interpreter, making out/torch-venv on first use); it runs as well on
Debian's python3-torch (PyTorch 1.13, /usr/bin/python3):

  PY=$(python3 bench/benchlib.py torch-python)        # or PY=/usr/bin/python3
  $PY bench/charlm_reference.py --config configs/shakespeare_char_cpu.json \
      --data input.txt [--threads N] [--set train.max_iters=200 ...] [--precision bf16]

--precision bf16 runs every forward (training and evaluation) under
torch.autocast("cpu", dtype=torch.bfloat16), as nanoGPT does with
dtype='bfloat16': float32 weights and optimizer, bf16 products.
"""
import contextlib
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_config(path, overrides):
    with open(path) as f:
        cfg = json.load(f)
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in cfg or name not in cfg[section]:
            sys.exit("charlm_reference.py: unknown key '%s'" % key)
        try:
            cfg[section][name] = json.loads(value)
        except json.JSONDecodeError:
            cfg[section][name] = value
    return cfg


GELU_FORM = "tanh"  # F.gelu's `approximate`; --gelu exact sets "none"
# nanoGPT's attention: F.scaled_dot_product_attention where PyTorch has it
# (2.0 and later: fused kernels, dropout inside), else the explicit softmax.
FLASH = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, bias = m["n_embd"], m["bias"]
        self.n_head = m["n_head"]
        self.ln_1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C, bias=bias)
        self.proj = nn.Linear(C, C, bias=bias)
        self.ln_2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C, bias=bias)
        self.fc_proj = nn.Linear(4 * C, C, bias=bias)
        self.act = m["activation"]
        self.dropout = m.get("dropout", 0.0)
        self.attn_dropout = nn.Dropout(self.dropout)
        self.resid_dropout = nn.Dropout(self.dropout)
        self.mlp_dropout = nn.Dropout(self.dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        H = self.n_head
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        if FLASH:  # PyTorch >= 2.0: nanoGPT's fused path
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = self.attn_dropout(F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.resid_dropout(self.proj(y))
        h = self.fc(self.ln_2(x))
        h = F.gelu(h, approximate=GELU_FORM) if self.act == "gelu" else F.relu(h)
        return x + self.mlp_dropout(self.fc_proj(h))


class GPT(nn.Module):
    def __init__(self, m, vocab):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, m["n_embd"])
        self.pos_emb = nn.Embedding(m["block_size"], m["n_embd"])
        self.blocks = nn.ModuleList([Block(m) for _ in range(m["n_layer"])])
        self.ln_f = nn.LayerNorm(m["n_embd"])
        self.drop = nn.Dropout(m.get("dropout", 0.0))
        self.lm_head = None if m["tie_weights"] else nn.Linear(m["n_embd"], vocab, bias=False)
        for mod in self.modules():  # GPT-2 init, as tapeformer's layers/transformer.cpp
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, 0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)
        for blk in self.blocks:
            for lin in (blk.proj, blk.fc_proj):
                nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * m["n_layer"]))
        if not m["bias"]:  # LayerNorm without bias (torch 1.13 has no bias flag)
            for mod in self.modules():
                if isinstance(mod, nn.LayerNorm):
                    mod.bias.requires_grad_(False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(T)))
        for blk in self.blocks:
            x = blk(x)
        x = self.ln_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else x @ self.tok_emb.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def tapeformer_parameters(model):
    """(tapeformer name, torch parameter, transposed?) for every trained parameter,
    in tapeformer's order. tapeformer stores Linear weights as [in, out], torch as
    [out, in]; a LayerNorm without bias has no bias parameter in tapeformer."""
    out = [("tok_emb.weight", model.tok_emb.weight, False), ("pos_emb.weight", model.pos_emb.weight, False)]

    def norm(name, ln):
        out.append((name + ".weight", ln.weight, False))
        if ln.bias.requires_grad:
            out.append((name + ".bias", ln.bias, False))

    def linear(name, lin):
        out.append((name + ".weight", lin.weight, True))
        if lin.bias is not None:
            out.append((name + ".bias", lin.bias, False))

    for i, blk in enumerate(model.blocks):
        norm(f"{i}.ln_1", blk.ln_1)
        linear(f"{i}.attn.qkv", blk.qkv)
        linear(f"{i}.attn.proj", blk.proj)
        norm(f"{i}.ln_2", blk.ln_2)
        linear(f"{i}.mlp.fc", blk.fc)
        linear(f"{i}.mlp.proj", blk.fc_proj)
    norm("ln_f", model.ln_f)
    if model.lm_head is not None:
        linear("lm_head", model.lm_head)
    assert len(out) == sum(p.requires_grad for p in model.parameters()), "every trained parameter is mapped"
    return out


def load_data(cfg, path):
    """The file's characters as ids (sorted vocabulary), split 90/10 like
    nanoGPT's prepare.py: (train ids, val ids, vocabulary size)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(len(data) * (1 - cfg["data"]["val_fraction"]))
    return data[:n], data[n:], len(chars)


def make_optimizer(params, o):
    """nanoGPT's two AdamW (or Adam) groups: decay on rank >= 2 only."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt_cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[o["name"]]
    return opt_cls([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                   lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])


def get_lr(it, o, s):  # nanoGPT train.py
    if s["name"] == "constant":
        return o["lr"]
    if it < s["warmup_iters"]:
        return o["lr"] * (it + 1) / (s["warmup_iters"] + 1)
    if it > s["decay_iters"]:
        return s["min_lr"]
    span = s["decay_iters"] - s["warmup_iters"]
    ratio = (it - s["warmup_iters"]) / span if span > 0 else 1.0
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if s["name"] == "cosine" else 1.0 - ratio
    return s["min_lr"] + coeff * (o["lr"] - s["min_lr"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward passes under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--gelu", choices=["tanh", "exact"], default="tanh",
                    help="GELU form: tanh (GPT-2's approximation, as tapeformer and nanoGPT's old new_gelu) "
                         "or exact (erf, nn.GELU() in later nanoGPT)")
    args = ap.parse_args()
    global GELU_FORM
    GELU_FORM = "none" if args.gelu == "exact" else "tanh"
    cfg = load_config(args.config, args.set)
    m, t, o, s, e = cfg["model"], cfg["train"], cfg["optimizer"], cfg["schedule"], cfg["eval"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(t["seed"])

    train, val, vocab = load_data(cfg, args.data)
    B, T = t["batch_size"], m["block_size"]

    def batch(d, gen):
        ix = torch.randint(len(d) - T, (B,), generator=gen)
        return torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix])

    g_train = torch.Generator().manual_seed(t["seed"] + 1)
    gv = torch.Generator().manual_seed(t["seed"] + 2)
    val_batches = [batch(val, gv) for _ in range(e["iters"])]
    gf = torch.Generator().manual_seed(t["seed"] + 3)
    final_batches = [batch(val, gf) for _ in range(e["final_iters"])]

    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext
    model = GPT(m, vocab)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, o)

    @torch.no_grad()
    def evaluate(batches):
        model.eval()
        with autocast():
            loss = sum(model(x, y).item() for x, y in batches) / len(batches)
        model.train()
        return loss

    train_seconds = 0.0
    for it in range(t["max_iters"]):
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = get_lr(it, o, s)
        for _ in range(t["grad_accum"]):
            x, y = batch(train, g_train)
            with autocast():
                loss = model(x, y)
            (loss / t["grad_accum"]).backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        train_seconds += time.perf_counter() - t0
        step = it + 1
        if step % e["interval"] == 0 or step == t["max_iters"]:
            print("step %d: train loss %.4f, val loss %.4f, %.0f tok/s" % (
                step, loss.item(), evaluate(val_batches), B * T * t["grad_accum"] * step / train_seconds),
                file=sys.stderr, flush=True)
    result = {
        "impl": "pytorch", "torch": torch.__version__, "steps": t["max_iters"], "train_loss": loss.item(),
        "val_loss": evaluate(final_batches), "train_seconds": round(train_seconds, 3),
        "tokens_per_s": round(B * T * t["grad_accum"] * t["max_iters"] / train_seconds, 1),
        "threads": torch.get_num_threads(), "flash_attention": FLASH, "precision": args.precision, "params": sum(p.numel() for p in params),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
