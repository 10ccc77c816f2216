"""Activation recompute: peak RSS and speed of training with and without
train.recompute=blocks, on nanoGPT's shakespeare_char model (10.7M
parameters, 6 layers of width 384, block 256) and on the same width at 24
layers, each run by `tapeformer train` under /usr/bin/time -v.

    python3 bench/recompute.py DATA [--steps 4] [--batch 32] [--repeats 3] [--no-results]

The two arms run on the same build and machine, alternating, --repeats
times each; tokens/s is the run's own figure (its training steps only),
given as mean ± sd over the repeats, and peak RSS the process's (the same
to the MB from run to run). The final train losses of a pair are compared too: recompute
must not change a bit. Writes the section "recompute" of docs/results.md.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


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
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternating (default 3)")
    args = benchlib.parse_data_bench(ap, fail)
    lines = ["| layers | parameters | peak RSS MB, none | peak RSS MB, blocks | RSS blocks / none | tokens/s, none | "
             "tokens/s, blocks | speed blocks / none | same train loss |", "|---|---|---|---|---|---|---|---|---|"]
    for layers in (6, 24):
        plain, again = [], []
        for _ in range(args.repeats):
            plain.append(run(args, layers, "none"))
            again.append(run(args, layers, "blocks"))
        same = "yes" if all(a["train_loss"] == plain[0]["train_loss"] for a in plain + again) else "**no**"
        rss_plain = max(r["peak_rss_mb"] for r in plain)
        rss_again = max(r["peak_rss_mb"] for r in again)
        speed_plain = [r["tokens_per_s"] for r in plain]
        speed_again = [r["tokens_per_s"] for r in again]
        lines.append(f"| {layers} | {plain[0]['params'] / 1e6:.1f}M | {rss_plain:.0f} | {rss_again:.0f} | "
                     f"**{rss_again / rss_plain:.2f}** | {benchlib.mean_sd(speed_plain)} | "
                     f"{benchlib.mean_sd(speed_again)} | "
                     f"**{statistics.mean(speed_again) / statistics.mean(speed_plain):.2f}** | {same} |")
        print(lines[-1], file=sys.stderr)
    intro = (
        f"`tapeformer train` on nanoGPT's shakespeare_char model (width 384, 6 heads, block 256, dropout 0.2) at 6 "
        f"layers (10.7M parameters) and 24 layers, batch {args.batch}, {args.steps} steps, fp32, without and with "
        "`train.recompute=blocks` (each block keeps only its input and runs again in the backward); peak RSS of the "
        "process from `/usr/bin/time -v` (the largest over the runs), tokens/s over the training steps as mean ± sd "
        f"over {args.repeats} runs of each arm, alternating; the speed ratio is of the means. The last column "
        "compares the final train losses of every run bit for bit.")
    benchlib.publish(ap, args, "recompute.py", "recompute", "Activation recompute: memory and speed", intro,
                     "\n".join(lines))


if __name__ == "__main__":
    main()
