"""Peak RSS of whole training runs against depth: standard and reversible
blocks at 2 and 12 layers (width 128, 4 heads, T = 512, batch 8), so what the
process holds, not only the tensors it counts, is seen to stay flat for
reversible blocks.

    python3 bench/rss_depth.py DATA [--steps 20] [--no-results]

Each run is `tapeformer train` (with its evaluations and checkpoints) under
/usr/bin/time -v. Parameters, their gradients and AdamW's moments grow with
depth (about 3.5 MB per layer here, one gradient per shard); the table gives
them, and the RSS growth beyond them, apart. Writes the section "rss_depth"
of docs/results.md.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def fail(message):
    sys.exit(f"rss_depth.py: {message}")


def run(args, block, layers):
    """(peak RSS in MB, final result line) of one training run."""
    result = benchlib.train_timed(
        "configs/shakespeare_char_cpu.json", args.data,
        [f"model.block={block}", f"model.n_layer={layers}", "model.block_size=512", "train.batch_size=8",
         f"train.max_iters={args.steps}", "eval.iters=2", "eval.final_iters=2",
         f"checkpoint.interval={args.steps // 2}"], fail, prefix="rss-depth-")
    return result["peak_rss_mb"], result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=20)
    args = benchlib.parse_data_bench(ap, fail)
    lines = ["| block | peak RSS MB, 2 layers | peak RSS MB, 12 layers | 12 / 2 | parameter state added, MB | "
             "12 / 2 without it |", "|---|---|---|---|---|---|"]
    for block in ("standard", "reversible"):
        rss2, r2 = run(args, block, 2)
        rss12, r12 = run(args, block, 12)
        # Parameters, AdamW's two moments, one gradient per shard: 4 bytes each.
        state = (r12["params"] - r2["params"]) * 4 * (3 + r12["shards"]) / 2**20
        lines.append(f"| {block} | {rss2:.0f} | {rss12:.0f} | **{rss12 / rss2:.2f}** | {state:.0f} | "
                     f"{(rss12 - state) / rss2:.2f} |")
        print(lines[-1], file=sys.stderr)
    intro = (
        f"`tapeformer train` for {args.steps} steps (with its evaluations and checkpoints) on nanoGPT's CPU recipe at "
        "width 128, 4 heads, T = 512, batch 8, with standard and reversible blocks at 2 and 12 layers; peak RSS of "
        "the process from `/usr/bin/time -v`. The parameter state (weights, AdamW's two moments, a gradient per "
        "shard) grows with depth for both kinds; reversible blocks keep no activations per layer, so beyond that "
        "state their RSS does not grow.")
    benchlib.publish(ap, args, "rss_depth.py", "rss_depth", "Peak RSS of training runs against depth", intro,
                     "\n".join(lines))


if __name__ == "__main__":
    main()
