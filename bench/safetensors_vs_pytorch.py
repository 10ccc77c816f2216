#!/usr/bin/env python3
"""tapeformer's safetensors export against PyTorch: the exported file loaded
into a GPT with nanoGPT's module names gives the logits tapeformer gives.

    /usr/bin/python3 bench/safetensors_vs_pytorch.py out/shakespeare [--build build]   # Debian's python3-torch

It exports the run's checkpoint (tapeformer export), reads the file with no
library but json and numpy (the format is an 8-byte header length, a JSON
header, raw little-endian data), loads it with load_state_dict(strict=True)
into the GPT below (nanoGPT's model.py structure and names: transformer.wte,
.wpe, .h[i].ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj,
.ln_f, lm_head), and compares its logits for a fixed prompt with those of
build/bench/export_logits on the same run and the same file. The GELU is
the tanh form, as tapeformer's "gelu" (nanoGPT's own class uses the exact
erf form). Prints one JSON line; exits 1 when the largest difference exceeds
1e-5 of the largest logit. Needs Debian's python3-torch.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Block(nn.Module):
    def __init__(self, c, n_head, bias):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(c, elementwise_affine=True)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c, bias=bias)
        self.attn.c_proj = nn.Linear(c, c, bias=bias)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c, bias=bias)
        self.mlp.c_proj = nn.Linear(4 * c, c, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
        att = F.softmax(att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), dim=-1)
        x = x + self.attn.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, c, bias):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, c), wpe=nn.Embedding(block_size, c),
            h=nn.ModuleList([Block(c, n_head, bias) for _ in range(n_layer)]), ln_f=nn.LayerNorm(c)))
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", name
        b, end = e["data_offsets"]
        tensors[name] = torch.from_numpy(np.frombuffer(data[8 + n + b:8 + n + end], dtype="<f4").copy()).view(e["shape"])
    return tensors, meta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory of a GPT (standard blocks, softmax, learned positions)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        subprocess.run([os.path.join(args.build, "cli", "tapeformer"), "export", "--checkpoint", args.run, "-o", path],
                       check=True, stdout=subprocess.DEVNULL)
        tensors, meta = read_safetensors(path)
        cfg = json.loads(meta["tapeformer_config"])
        ids = [(7 * i + 3) % cfg["vocab_size"] for i in range(min(cfg["block_size"], 48))]
        model = GPT(cfg["vocab_size"], cfg["block_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["bias"])
        model.load_state_dict(tensors, strict=True)
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).numpy()
        out = subprocess.run([os.path.join(args.build, "bench", "export_logits"), "--checkpoint", args.run,
                              "--weights", path, "--ids", ",".join(map(str, ids))],
                             check=True, capture_output=True, text=True).stdout
        mine = np.array(json.loads(out)["logits"], dtype=np.float64).reshape(theirs.shape)
    diff = float(np.abs(mine - theirs).max())
    scale = float(np.abs(theirs).max())
    ok = diff <= 1e-5 * max(1.0, scale)
    print(json.dumps({"tensors": len(tensors), "positions": len(ids), "max_abs_diff": diff, "max_abs_logit": scale,
                      "relative": diff / max(1.0, scale), "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
