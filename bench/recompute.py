"""Activation recompute: peak RSS and speed of training with and without
train.recompute=blocks, on nanoGPT's shakespeare_char model (10.7M
parameters, 6 layers of width 384, block 256) and on the same width at 24
layers, each run by `tapeformer train` under /usr/bin/time -v.

    python3 bench/recompute.py DATA [--steps 4] [--batch 32] [--no-results]

Each pair runs on the same build and machine, one after the other; tokens/s
is the run's own figure (its training steps only) and peak RSS the
process's. The final train losses of a pair are compared too: recompute
must not change a bit. Writes the section "recompute" of docs/results.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import ROOT  # noqa: E402


def fail(message):
    sys.exit(f"recompute.py: {message}")


def run(args, layers, recompute):
    """The result line of one training run, with "peak_rss_mb"."""
    return benchlib.train_timed(
        "configs/shakespeare_char.json", args.data,
        [f"model.n_layer={layers}", f"train.batch_size={args.batch}", f"train.max_iters={args.steps}",
         "schedule.warmup_iters=0", f"schedule.decay_iters={args.steps}", "eval.iters=1", "eval.final_iters=1",
         f"eval.interval={args.steps}", f"checkpoint.interval={args.steps}", f"train.recompute={recompute}"],
        fail, prefix="recompute-")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    if not os.path.isfile(args.data):
        fail(f"data file '{args.data}' not found")
    benchlib.build("tapeformer_command")
    lines = ["| layers | parameters | peak RSS MB, none | peak RSS MB, blocks | RSS blocks / none | tokens/s, none | "
             "tokens/s, blocks | speed blocks / none | same train loss |", "|---|---|---|---|---|---|---|---|---|"]
    for layers in (6, 24):
        plain = run(args, layers, "none")
        again = run(args, layers, "blocks")
        same = "yes" if plain["train_loss"] == again["train_loss"] else "**no**"
        lines.append(f"| {layers} | {plain['params'] / 1e6:.1f}M | {plain['peak_rss_mb']:.0f} | "
                     f"{again['peak_rss_mb']:.0f} | **{again['peak_rss_mb'] / plain['peak_rss_mb']:.2f}** | "
                     f"{plain['tokens_per_s']:.0f} | {again['tokens_per_s']:.0f} | "
                     f"**{again['tokens_per_s'] / plain['tokens_per_s']:.2f}** | {same} |")
        print(lines[-1], file=sys.stderr)
    table = "\n".join(lines)
    print(table)
    if args.no_results:
        return
    cmd = f"python3 bench/recompute.py {os.path.relpath(args.data, ROOT)}"
    if args.steps != 4:
        cmd += f" --steps {args.steps}"
    if args.batch != 32:
        cmd += f" --batch {args.batch}"
    intro = (
        f"`tapeformer train` on nanoGPT's shakespeare_char model (width 384, 6 heads, block 256, dropout 0.2) at 6 "
        f"layers (10.7M parameters) and 24 layers, batch {args.batch}, {args.steps} steps, fp32, without and with "
        "`train.recompute=blocks` (each block keeps only its input and runs again in the backward); peak RSS of the "
        "process from `/usr/bin/time -v`, tokens/s over the training steps. The last column compares the final "
        "train losses bit for bit.")
    benchlib.write_section(args.results, "recompute", "Activation recompute: memory and speed", intro, cmd, [table])


if __name__ == "__main__":
    main()
