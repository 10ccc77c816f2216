"""Paired run, PyTorch side: the recipe from fixed initial weights on fixed batches.

bench/paired_run.sh drives it. `prepare` builds the reference model
(bench/charlm_reference.py) with the config's seed and writes, into DIR:
  init.txt, init.bin   every trained parameter under tapeformer's name and
                       layout: one line "NAME d0 d1 ..." per tensor in init.txt,
                       the values as little-endian float32 in init.bin, in order
  batches.txt          one line per batch, "train O1 ... OB" (train.max_iters *
                       train.grad_accum of them, in order) then "final O1 ... OB"
                       (eval.final_iters): window start offsets into the train
                       and val split, drawn like nanoGPT's get_batch
`train --dtype float32|float64` then trains the reference from init.bin on
those batches and writes DIR/pytorch-DTYPE.jsonl: one line per step
{"step", "lr", "train_loss", "grad_norm"} (grad_norm before clipping) and a
last line {"final_val_loss", "torch"} (torch: the PyTorch version that ran).
bench/paired_run.cpp writes the same for tapeformer, and `compare` prints them
side by side.

Run it with the interpreter of the PyTorch peer, the newest PyTorch on PyPI in
a virtual environment (`python3 bench/benchlib.py torch-python` prints it,
making it on first use; $TORCH_PYTHON picks another, e.g. /usr/bin/python3):

  PY=$(python3 bench/benchlib.py torch-python)
  $PY bench/paired_run.py prepare --config C --data FILE --out DIR [--set k=v ...]
  $PY bench/paired_run.py train --config C --data FILE --out DIR --dtype float64
  $PY bench/paired_run.py compare --out DIR
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charlm_reference as ref  # noqa: E402


def prepare(cfg, args):
    m, t, e = cfg["model"], cfg["train"], cfg["eval"]
    train, val, vocab = ref.load_data(cfg, args.data)
    torch.manual_seed(t["seed"])
    model = ref.GPT(m, vocab)
    with open(os.path.join(args.out, "init.txt"), "w") as names, open(os.path.join(args.out, "init.bin"), "wb") as values:
        for name, p, transpose in ref.tapeformer_parameters(model):
            w = p.detach().t() if transpose else p.detach()
            names.write("%s %s\n" % (name, " ".join(str(d) for d in w.shape)))
            values.write(w.contiguous().to(torch.float32).numpy().astype("<f4").tobytes())
    B, T = t["batch_size"], m["block_size"]
    gen = torch.Generator().manual_seed(t["seed"] + 1)
    with open(os.path.join(args.out, "batches.txt"), "w") as f:
        for _ in range(t["max_iters"] * t["grad_accum"]):
            f.write("train " + " ".join(str(i) for i in torch.randint(len(train) - T, (B,), generator=gen).tolist()) + "\n")
        for _ in range(e["final_iters"]):
            f.write("final " + " ".join(str(i) for i in torch.randint(len(val) - T, (B,), generator=gen).tolist()) + "\n")


def read_batches(path):
    batches = {"train": [], "final": []}
    with open(path) as f:
        for line in f:
            kind, *offsets = line.split()
            batches[kind].append([int(o) for o in offsets])
    return batches


def train(cfg, args):
    m, t, o, s = cfg["model"], cfg["train"], cfg["optimizer"], cfg["schedule"]
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    torch.set_num_threads(args.threads)
    train_data, val_data, vocab = ref.load_data(cfg, args.data)
    model = ref.GPT(m, vocab).to(dtype)
    params = ref.tapeformer_parameters(model)
    raw = open(os.path.join(args.out, "init.bin"), "rb").read()
    at = 0
    with torch.no_grad():
        for _, p, transpose in params:
            n = p.numel()
            w = torch.frombuffer(bytearray(raw[4 * at:4 * (at + n)]), dtype=torch.float32)
            w = w.view(p.t().shape if transpose else p.shape)
            p.copy_(w.t() if transpose else w)
            at += n
    assert 4 * at == len(raw), "init.bin holds exactly the model's parameters"
    batches = read_batches(os.path.join(args.out, "batches.txt"))
    T = m["block_size"]

    def batch(d, offsets):
        return torch.stack([d[i:i + T] for i in offsets]), torch.stack([d[i + 1:i + 1 + T] for i in offsets])

    trained = [p for _, p, _ in params]
    opt = ref.make_optimizer(trained, o)
    out = open(os.path.join(args.out, "pytorch-%s.jsonl" % args.dtype), "w")
    for it in range(t["max_iters"]):
        lr = ref.get_lr(it, o, s)
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for k in range(t["grad_accum"]):
            x, y = batch(train_data, batches["train"][it * t["grad_accum"] + k])
            loss = model(x, y)
            (loss / t["grad_accum"]).backward()
            loss_sum += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(trained, o["grad_clip"] if o["grad_clip"] > 0 else math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.write(json.dumps({"step": it + 1, "lr": lr, "train_loss": loss_sum / t["grad_accum"],
                              "grad_norm": norm.item()}) + "\n")
        if (it + 1) % 250 == 0:
            print("paired_run.py %s: step %d, loss %.4f" % (args.dtype, it + 1, loss_sum / t["grad_accum"]),
                  file=sys.stderr, flush=True)
    model.eval()
    with torch.no_grad():
        val = sum(model(*batch(val_data, b)).item() for b in batches["final"]) / len(batches["final"])
    out.write(json.dumps({"final_val_loss": val, "torch": torch.__version__}) + "\n")


def compare(args):
    versions = {}

    def load(name):
        lines = [json.loads(l) for l in open(os.path.join(args.out, name + ".jsonl"))]
        versions[name] = lines[-1].get("torch", "?")  # "?" in files written before the version was recorded
        return lines[:-1], lines[-1]["final_val_loss"]

    (tf, tf_val), (pt, pt_val), (pd, pd_val) = load("tapeformer"), load("pytorch-float32"), load("pytorch-float64")
    assert len(tf) == len(pt) == len(pd), "the three runs have the same number of steps"
    torch_version = versions["pytorch-float32"]
    if versions["pytorch-float64"] != torch_version:
        torch_version += " (float32), " + versions["pytorch-float64"] + " (float64)"
    print("Train loss of the same batches, from the same initial weights (torch: PyTorch %s):" % torch_version)
    print("%6s %11s %11s %11s %15s %15s" % ("step", "tapeformer", "torch f32", "torch f64", "|tf - f64|", "|torch f32 - f64|"))
    marks = [s for s in (1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000) if s <= len(tf)]
    if len(tf) not in marks:
        marks.append(len(tf))
    for s in marks:
        a, b, c = tf[s - 1]["train_loss"], pt[s - 1]["train_loss"], pd[s - 1]["train_loss"]
        print("%6d %11.6f %11.6f %11.6f %15.2e %15.2e" % (s, a, b, c, abs(a - c), abs(b - c)))
    print("%6s %11.6f %11.6f %11.6f %15.2e %15.2e" % ("val", tf_val, pt_val, pd_val, abs(tf_val - pd_val), abs(pt_val - pd_val)))

    def worst(run, key):
        return max(abs(r[key] - d[key]) / max(1.0, abs(d[key])) for r, d in zip(run, pd))

    for key in ("train_loss", "grad_norm"):
        print("largest difference from float64 over all %d steps, %s (relative): tapeformer %.2e, torch float32 %.2e" % (
            len(tf), key, worst(tf, key), worst(pt, key)))

    def first_step_off(run, tol):
        return next((r["step"] for r, d in zip(run, pd) if abs(r["train_loss"] - d["train_loss"]) > tol), None)

    for tol in (1e-4, 1e-3, 1e-2):
        print("first step whose train loss is more than %g from float64: tapeformer %s, torch float32 %s" % (
            tol, first_step_off(tf, tol) or "never", first_step_off(pt, tol) or "never"))
    summary = {"steps": len(tf), "torch": torch_version,
               "final_val_loss": {"tapeformer": tf_val, "pytorch_float32": pt_val, "pytorch_float64": pd_val},
               "max_rel_diff_from_float64": {
                   "tapeformer": {k: worst(tf, k) for k in ("train_loss", "grad_norm")},
                   "pytorch_float32": {k: worst(pt, k) for k in ("train_loss", "grad_norm")}}}
    json.dump(summary, open(os.path.join(args.out, "paired.json"), "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["prepare", "train", "compare"])
    ap.add_argument("--config")
    ap.add_argument("--data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    if args.command == "compare":
        return compare(args)
    if not args.config or not args.data:
        sys.exit("paired_run.py %s: --config and --data are required" % args.command)
    cfg = ref.load_config(args.config, args.set)
    os.makedirs(args.out, exist_ok=True)
    if cfg["model"]["dropout"] != 0:
        sys.exit("paired_run.py: model.dropout must be 0 (the two implementations draw different dropout masks)")
    (prepare if args.command == "prepare" else train)(cfg, args)


if __name__ == "__main__":
    main()
