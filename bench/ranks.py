"""Processes x threads: the same training run as 1 process on every core and
as several MPI ranks sharing them, with the time the gradient exchange takes.

    python3 bench/ranks.py DATA                    # every (ranks, threads) with ranks x threads = cores
    python3 bench/ranks.py DATA --layouts 1x2,2x1 --small-steps 300 --large-steps 12
    python3 bench/ranks.py DATA --no-results

Each layout trains nanoGPT's CPU recipe and the 10.7M shakespeare_char model
with `tapeformer train --profile` (one shard per thread, so every layout runs
the same total shard count and gives the same losses), under `mpirun -np
RANKS --oversubscribe`, and reports tokens/s, the all-reduce's milliseconds
per step (rank 0's profile: the exchange of the ranks' partial gradient
sums) and its share of the step. The table goes to docs/results.md (section "ranks").
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import ROOT  # noqa: E402


def fail(message):
    print(f"ranks.py: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_arguments(ap, "ranks")
    ap.add_argument("--layouts", help="RANKSxTHREADS,... (default: every split of the cores)")
    args = ap.parse_args()
    chosen = benchlib.selected(args, fail)
    cores = os.cpu_count() or 1
    try:
        layouts = ([tuple(int(x) for x in l.split("x")) for l in args.layouts.split(",")] if args.layouts else
                   [(r, cores // r) for r in range(1, cores + 1) if cores % r == 0])
    except ValueError:
        fail(f"--layouts must look like 1x2,2x1, got '{args.layouts}'")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        fail("mpirun not found (bash scripts/setup.sh installs openmpi-bin)")
    benchlib.build("tapeformer_command")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, recipe, steps in chosen:
        label, config = recipe["label"], recipe["config"]
        for ranks, threads in layouts:
            run_dir = os.path.join(args.out, f"{name}-{ranks}x{threads}")
            shutil.rmtree(run_dir, ignore_errors=True)
            cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "build/cli/tapeformer", "train",
                   "--config", config, "--data", args.data, "--out", run_dir, "--threads", str(threads), "--profile",
                   "--set", f"train.shards={threads}"] + benchlib.overrides(steps)
            print(f"ranks.py: {name} recipe, {ranks} ranks x {threads} threads...", file=sys.stderr)
            with open(run_dir + ".log", "w") as log:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
            if proc.returncode != 0:
                fail(f"the {ranks}x{threads} run failed; see {run_dir}.log")
            result = json.loads([l for l in proc.stdout.splitlines() if l.startswith("{")][-1])
            with open(os.path.join(run_dir, "profile.json")) as f:
                prof = json.load(f)
            comm = next((p["ms_per_step"] for p in prof["phases"] if p["name"] == "all-reduce"), 0.0)
            wait = next((p["ms_per_step"] for p in prof["phases"] if p["name"] == "waiting for ranks"), 0.0)
            rows.append({"recipe": label, "ranks": ranks, "threads": threads, "shards": result["shards"],
                         "tokens_per_s": result["tokens_per_s"], "val_loss": result["val_loss"],
                         "ms_per_step": prof["ms_per_step"], "allreduce_ms": comm, "wait_ms": wait})
            print(f"  {result['tokens_per_s']:.0f} tok/s, all-reduce {comm:.1f} ms (after {wait:.1f} ms waiting for "
                  f"the slowest rank) of {prof['ms_per_step']:.0f} ms "
                  f"per step, val loss {result['val_loss']:.6f}", file=sys.stderr)

    lines = ["| recipe | ranks x threads | tokens/s | ms per step | all-reduce ms per step (share) | "
             "waiting for the slowest rank, ms per step | val loss |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['ranks']} x {r['threads']} | {r['tokens_per_s']:,.0f} | "
                     f"{r['ms_per_step']:.1f} | {r['allreduce_ms']:.1f} ({r['allreduce_ms'] / r['ms_per_step']:.1%}) | "
                     f"{r['wait_ms']:.1f} | {r['val_loss']:.6f} |")
    table = "\n".join(lines)
    print(table)
    if args.no_results:
        return
    cmd = benchlib.reproduce("ranks.py", args, f" --layouts {args.layouts}" if args.layouts else "")
    intro = (
        f"The two recipes ({args.small_steps} and {args.large_steps} steps) trained as one process on every core and "
        "as MPI ranks (Open MPI, `mpirun -np RANKS`) splitting the cores, one shard per thread, so every layout "
        "has the same total shard count: the val losses are the same bits. The all-reduce is the gradient "
        "exchange (each rank sums its shards, then the ranks' partial sums are combined by chunk in the same "
        "fixed tree over the shards a single process uses), timed by rank 0's `--profile` after a barrier, "
        "whose time (ranks finishing their shards at different moments) is the column beside it. Ranks on one "
        "machine exchange through MPI-3 shared memory windows, ranks on several machines through MPI's "
        "collectives over the network Open MPI picks.")
    benchlib.write_section(args.results, "ranks", "Processes x threads: training over MPI ranks on one machine",
                           intro, cmd, [table])


if __name__ == "__main__":
    main()
