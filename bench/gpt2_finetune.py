"""Fine-tuning a GPT-2 small (124M) on this machine: a checkpoint of GPT-2
small's shape with random weights, made with transformers, imported with
`tapeformer import-hf --block-size 256`, fine-tuned 20 steps and sampled,
each step under /usr/bin/time -v.

    python3 bench/gpt2_finetune.py DATA [--steps 20] [--batch 8] [--no-results]

The checkpoint is GPT2Config()'s (12 layers, 12 heads, width 768, 1024
positions, 50257 tokens) with transformers' own initialisation; its
tokenizer is a byte-level BPE learnt from DATA by `tokenizers` (GPT-2's own
vocabulary is not on this machine), filled up to GPT-2's 50257 ids with
added tokens and `<|endoftext|>` last, as GPT-2's. Both are made once under
out/gpt2-124m-random by the virtual environment of
tests/fixtures/make_hf_gpt2.py (transformers is never a dependency of
tapeformer). Writes the section "gpt2-finetune" of docs/results.md.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import ROOT  # noqa: E402

CHECKPOINT = os.path.join(ROOT, "out", "gpt2-124m-random")
VENV_PYTHON = os.path.join(ROOT, "out", "hf-venv", "bin", "python")

MAKE = r'''
import os, sys
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
data, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
tok = ByteLevelBPETokenizer(add_prefix_space=False)
tok.train([data], vocab_size=50256, min_frequency=1, show_progress=False)
extra = 50256 - tok.get_vocab_size()
tok.add_special_tokens([f"<|extra_{i}|>" for i in range(extra)] + ["<|endoftext|>"])
assert tok.get_vocab_size() == 50257, tok.get_vocab_size()
fast = GPT2TokenizerFast(tokenizer_object=tok._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                         unk_token="<|endoftext|>")
fast.save_pretrained(out)
model = GPT2LMHeadModel(GPT2Config())
model.save_pretrained(out, safe_serialization=True)
print(f"{sum(p.numel() for p in model.parameters())} parameters, {extra} filler tokens")
'''


def fail(message):
    sys.exit(f"gpt2_finetune.py: {message}")


def make_checkpoint(data):
    """The random GPT-2 small directory, made once (several minutes: the BPE learns ~50k merges)."""
    if os.path.exists(os.path.join(CHECKPOINT, "model.safetensors")):
        return
    if not os.path.exists(VENV_PYTHON):
        print("gpt2_finetune.py: making the transformers environment (tests/fixtures/make_hf_gpt2.py's)...",
              file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fixtures", "make_hf_gpt2.py"), "--venv-only"],
                       check=True)
    os.makedirs(CHECKPOINT, exist_ok=True)
    print(f"gpt2_finetune.py: writing a random GPT-2 small to {os.path.relpath(CHECKPOINT, ROOT)}...", file=sys.stderr)
    subprocess.run([VENV_PYTHON, "-c", MAKE, data, CHECKPOINT], check=True)


def timed(cmd, log):
    """(seconds, peak RSS MB, stdout) of cmd under /usr/bin/time -v."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing, open(log, "w") as err:
        start = time.monotonic()
        proc = subprocess.run(["/usr/bin/time", "-v", "-o", timing.name] + cmd, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=err, text=True)
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            fail(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}); see {log}")
        rss = [line for line in timing.read().splitlines() if "Maximum resident set size" in line]
    return seconds, int(rss[0].split()[-1]) / 1024, proc.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--sample-tokens", type=int, default=64)
    args = benchlib.parse_data_bench(ap, fail)
    make_checkpoint(os.path.abspath(args.data))
    tf = os.path.join(ROOT, "build", "cli", "tapeformer")
    work = tempfile.mkdtemp(prefix="gpt2-finetune-")
    run = os.path.join(work, "run")
    try:
        import_s, import_rss, _ = timed([tf, "import-hf", CHECKPOINT, "--out", run, "--block-size", str(args.block)],
                                        os.path.join(work, "import.log"))
        _, train_rss, out = timed([tf, "train", "--resume", "--out", run, "--data", os.path.abspath(args.data),
                                   "--set", f"train.max_iters={args.steps}", "--set", f"train.batch_size={args.batch}",
                                   "--set", "optimizer.lr=3e-5", "--set", "schedule.name=constant", "--set", "schedule.min_lr=0",
                                   "--set", f"eval.interval={args.steps}", "--set", "eval.iters=2",
                                   "--set", "eval.final_iters=2", "--set", f"checkpoint.interval={args.steps}"],
                                  os.path.join(work, "train.log"))
        result = benchlib.last_json(out)
        prompt = ["--prompt", "ROMEO:", "--seed", "1"]
        load_s, _, _ = timed([tf, "sample", "--checkpoint", run, "--tokens", "0"] + prompt,
                             os.path.join(work, "load.log"))
        sample_s, sample_rss, _ = timed([tf, "sample", "--checkpoint", run, "--tokens", str(args.sample_tokens)] + prompt,
                                        os.path.join(work, "sample.log"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sample_tps = args.sample_tokens / max(sample_s - load_s, 1e-9)
    lines = ["| model | parameters | block | batch | steps | train tokens/s | train peak RSS MB | import s | "
             "import peak RSS MB | sample tokens/s | sample peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|",
             f"| GPT-2 small shape, random weights | {result['params'] / 1e6:.1f}M | {args.block} | {args.batch} | "
             f"{args.steps} | {result['tokens_per_s']:.0f} | {train_rss:.0f} | {import_s:.1f} | {import_rss:.0f} | "
             f"{sample_tps:.1f} | {sample_rss:.0f} |"]
    intro = (
        f"`tapeformer import-hf --block-size {args.block}` of a GPT-2 small checkpoint (transformers' GPT2Config(), "
        "random weights, model.safetensors of 498 MB) and a byte-level BPE of 50257 ids learnt from the data, then "
        f"`train --resume` for {args.steps} steps of batch {args.batch} x {args.block} tokens (AdamW, lr 3e-5, fp32, "
        f"both cores) and `sample` of {args.sample_tokens} tokens. Train tokens/s is the run's own figure over its "
        "steps; sample tokens/s is the tokens over the command's wall time less that of loading the checkpoint "
        "(`--tokens 0`); peak RSS is each process's.")
    benchlib.publish(ap, args, "gpt2_finetune.py", "gpt2-finetune", "Fine-tuning GPT-2 small (124M) on 2 cores", intro,
                     "\n".join(lines))


if __name__ == "__main__":
    main()
