"""Early exit and ACT in wall-clock time: tokens/s of `tapeformer sample`
with and without the work they skip, on the char-LM recipe (4 layers of
width 128, block 64) trained as an early-exit model (calibrated by
Learn-then-Test on the cosine measure) and as a Universal Transformer with
ACT (4 steps).

    python3 bench/adaptive_depth.py DATA [--threads 2] [--tokens 1000] [--seeds 1,2,3] [--repeats 3] [--no-results]

One model of each kind per seed. Arms, alternating within each repeat (a
sampling seed per repeat, the same for every arm):
  early exit: all layers (`--exit-threshold 2`: no exits), exits at full
  depth (`--full-depth`: every later layer still runs for a position that
  left, the same text as skipping), exits skipping (the default: a layer
  after a position's exit computes only its keys and values);
  UT with ACT: every step (`--full-depth`), halting skipping (the default).
tokens/s is sample's own figure (`--report-layers`: from the prompt's read
to the last token, the checkpoint's load excluded), a seed's figure the mean
of its repeats, and the table gives mean ± sd over the seeds (the speed
ratio taken per seed). The models are trained once into --work (default
out/bench/adaptive_depth) and reused. Writes the section
"adaptive-depth" of docs/results.md.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

TAPEFORMER = os.path.join(benchlib.ROOT, "build", "cli", "tapeformer")
RECIPE = os.path.join(benchlib.ROOT, "configs", "shakespeare_char_cpu.json")


def fail(message):
    sys.exit(f"adaptive_depth.py: {message}")


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def trained(args, name, seed, sets, calibrate=False):
    """The run directory of the recipe trained with `sets` and `seed` (made once under --work)."""
    run_dir = os.path.join(args.work, f"{name}_seed{seed}")
    if os.path.isfile(os.path.join(run_dir, "done.json")):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # what an interrupted bench left
    cmd = [TAPEFORMER, "train", "--config", RECIPE, "--data", args.data, "--out", run_dir,
           "--set", f"train.seed={seed}", "--set", f"train.threads={args.threads}", "--set", "train.shards=2"]
    for s in sets:
        cmd += ["--set", s]
    result = benchlib.last_json(run(cmd).stdout)
    if calibrate:  # CALM's Learn-then-Test on the cosine measure, as experiments/early_exit.json's cosine arm
        cal = run([TAPEFORMER, "--threads", str(args.threads), "calibrate", "--checkpoint", run_dir, "--data",
                   args.data, "--confidence", "cosine", "--method", "ltt", "--delta", "0.1", "--epsilon", "0.05"])
        result["calibrate"] = benchlib.last_json(cal.stdout)
    with open(os.path.join(run_dir, "done.json"), "w") as f:
        json.dump(result, f)
    return run_dir


def sample(args, run_dir, seed, flags):
    """sample's figures (--report-layers) as a dict: tokens_per_s, exit_layers_mean, ..."""
    proc = run([TAPEFORMER, "--threads", str(args.threads), "sample", "--checkpoint", run_dir, "--tokens",
                str(args.tokens), "--seed", str(seed), "--report-layers"] + flags)
    figures = {"text": proc.stdout}
    for line in proc.stderr.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "sample:":
            try:
                figures[parts[1]] = float(parts[2])
            except ValueError:
                pass
    if "tokens_per_s" not in figures:
        fail(f"sample printed no tokens_per_s:\n{proc.stderr}")
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1000, help="tokens each sample run generates (default 1000)")
    ap.add_argument("--seeds", default="1,2,3", help="models trained per kind, one per seed (default 1,2,3)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm per seed, alternating (default 3)")
    ap.add_argument("--work", default=os.path.join(benchlib.ROOT, "out", "bench", "adaptive_depth"))
    args = benchlib.parse_data_bench(ap, fail)
    os.makedirs(args.work, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [("early exit", "all layers", ["--exit-threshold", "2"]),
            ("early exit", "exits, full depth", ["--full-depth"]),
            ("early exit", "exits, skipping", []),
            ("UT with ACT", "every step", ["--full-depth"]),
            ("UT with ACT", "halting, skipping", [])]
    base = {"early exit": "all layers", "UT with ACT": "every step"}
    pairs = {"exits, full depth": "exits, skipping", "every step": "halting, skipping"}
    # Per seed and arm: mean tokens/s over the repeats, the depth figure, whether the texts matched.
    speed, depth, same, thresholds = {a[1]: [] for a in arms}, {a[1]: [] for a in arms}, {}, []
    paired = {a[1]: [] for a in arms}  # per seed: the median over repeats of the arm's tokens/s over its baseline's
    for seed in seeds:
        runs_of = {"early exit": trained(args, "early_exit", seed, ["model.arch=early_exit"], calibrate=True),
                   "UT with ACT": trained(args, "ut_act", seed, ["model.block=universal", "model.act=true"])}
        with open(os.path.join(runs_of["early exit"], "done.json")) as f:
            thresholds.append(json.load(f)["calibrate"]["threshold"])
        figures = {a[1]: [] for a in arms}
        for r in range(args.repeats):
            for model, name, flags in arms:
                figures[name].append(sample(args, runs_of[model], 1000 * seed + r, flags))
                print(f"seed {seed} repeat {r}: {name}: {figures[name][-1]['tokens_per_s']:.0f} tokens/s",
                      file=sys.stderr)
        for model, name, _ in arms:
            speed[name].append(statistics.mean(f["tokens_per_s"] for f in figures[name]))
            paired[name].append(statistics.median(
                f["tokens_per_s"] / g["tokens_per_s"] for f, g in zip(figures[name], figures[base[model]])))
            key = "ponder_reading_mean" if model == "UT with ACT" else "exit_layers_mean"
            if name == "all layers":
                depth[name].append(4.0)
                continue
            missing = [f for f in figures[name] if key not in f]
            if missing:
                fail(f"sample --report-layers printed no {key} for the arm '{name}'")
            depth[name].append(statistics.mean(f[key] for f in figures[name]))
        for full, skip in pairs.items():
            same[full] = same.get(full, True) and all(
                a["text"] == b["text"] for a, b in zip(figures[full], figures[skip]))
    lines = ["| model | arm | exit layer (halting step) per position | tokens/s | ms per token | speed vs all "
             "layers (every step), of the means | median of the paired ratios | same text as skipping |",
             "|---|---|---|---|---|---|---|---|"]
    for model, name, _ in arms:
        ratios = [v / b for v, b in zip(speed[name], speed[base[model]])]
        bold = "**" if name.endswith("skipping") else ""
        text = ("yes" if same[name] else "**no**") if name in same else ""
        lines.append(f"| {model} | {name} | {benchlib.mean_sd(depth[name], 2)} | {benchlib.mean_sd(speed[name])} | "
                     f"{1e3 / statistics.mean(speed[name]):.3f} | {bold}{benchlib.mean_sd(ratios, 2)}{bold} | "
                     f"{bold}{benchlib.mean_sd(paired[name], 2)}{bold} | {text} |")
    # Work per position and layer in C^2 multiply-adds: 12 for a layer that runs (qkv 3, output 1, MLP 8), 2 for
    # one that only takes a position's keys and values (attention and heads left out: a few percent).
    n = statistics.mean(depth["halting, skipping"])
    predicted = 12 * 4 / (12 * n + 2 * (4 - n))
    intro = (
        f"`tapeformer sample --tokens {args.tokens} --report-layers` at {args.threads} threads on "
        "configs/shakespeare_char_cpu.json (4 layers of width 128, block 64, 2000 steps, train.shards 2) trained "
        f"with seeds {args.seeds} as `model.arch = early_exit`, each calibrated by `tapeformer calibrate "
        "--confidence cosine --method ltt --delta 0.1 --epsilon 0.05` (thresholds "
        f"{', '.join(str(t) for t in thresholds)}), and as `model.block = universal` with ACT (4 steps). Per seed, "
        f"each arm runs once per repeat, alternating, {args.repeats} repeats; a seed's figure is the mean of its "
        "repeats, the table mean ± sd over the seeds, the speed ratio taken per seed: of the arm's mean over its "
        "baseline's, and the median over the repeats of the ratio within each repeat (the two runs next to each "
        "other in time: this shared machine's speed moves by up to 30% from minute to minute, and a slow moment "
        "only ever slows a run down). tokens/s is sample's own "
        "figure (the load excluded). The depth column is where positions leave or halt; at full depth every "
        "layer still runs for them. Skipping: after a position leaves (early exit) or halts (ACT), each later "
        "layer computes only its keys and values for the positions after it; full depth (`--full-depth`) runs "
        "every layer for it and discards the result, the same numbers (the last column compares the texts). With "
        "the learned position table of 64, every token after the 64th reads its whole window again, so most "
        "tokens cost a 64-position forward in which some positions leave and others run on. The UT's depth is "
        "its mean steps per position read (`ponder_reading_mean`); skipped steps costing only the keys and "
        f"values (2 of 12 C² multiply-adds per position) predict {predicted:.2f}x for it, 4 / {n:.2f} = "
        f"{4 / n:.2f}x if they cost nothing.")
    benchlib.publish(ap, args, "adaptive_depth.py", "adaptive-depth", "Early exit and ACT: generation speed",
                     intro, "\n".join(lines))


if __name__ == "__main__":
    main()
