#!/usr/bin/env python3
"""Two builds of tapeformer on the same work, alternating, as ratios: is a
change any slower?

    python3 bench/compare_builds.py OLD_BUILD NEW_BUILD ../shared/data/tinyshakespeare.txt
    python3 bench/compare_builds.py OLD NEW input.txt --rounds 4 --kinds window,lsh --no-recipes
    python3 bench/compare_builds.py OLD NEW input.txt --rounds 8 --kinds ''    # the recipes only

Each build directory holds cli/tapeformer and bench/attention_scaling (a
CMake build tree, or a copy of those two files kept before the change);
with --kinds '' only cli/tapeformer. Two
measures, each a ratio new / old of means over --rounds rounds, the builds
alternating which runs first (a slow spell of a shared machine falls on both):

- the two char-LM recipes (configs/shakespeare_char_cpu.json, 0.8M, and
  configs/shakespeare_char.json, 10.7M) trained for --small-steps and
  --large-steps steps: the final line's tokens/s (training time only);
- one attention layer's forward + backward at N = --n (default 8192) for
  each of --kinds (bench/attention_scaling, batch 1): ms per call.

A ratio above 1 is faster for tokens/s and slower for ms. Writes nothing
but OUT/compare.json (default out/compare_builds).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import benchlib  # noqa: E402

KIND_OPTIONS = {  # the options attention_scaling's docs use for each kind at long N
    "window": ["window=256"], "strided": ["stride=128"], "fixed": ["sparse_block=128", "summary=16"],
    "longformer": ["window=256", "global_tokens=16"], "bigbird": ["window=192", "global_tokens=16"],
    "lsh": ["lsh_chunk=64"], "adaptive_span": ["span_max=256"],
}


def train_tokens_per_s(build, recipe, steps, data, work):
    out = os.path.join(work, "run")
    subprocess.run(["rm", "-rf", out], check=True)
    cmd = [os.path.join(build, "cli", "tapeformer"), "train", "--config", os.path.join(ROOT, recipe["config"]),
           "--data", data, "--out", out, *benchlib.overrides(steps), "--set", "checkpoint.interval=100000",
           "--set", "eval.final_iters=1"]  # tokens/s counts training time only; a short final eval
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_builds.py: {' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"]


def attention_ms(build, kind, n, repeats):
    cmd = [os.path.join(build, "bench", "attention_scaling"), "--kind", kind, "--min-n", str(n), "--max-n", str(n),
           "--tokens", str(n), "--repeats", str(repeats)]
    for o in KIND_OPTIONS.get(kind, []):
        cmd += ["--option", o]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_builds.py: {' '.join(cmd)} failed:\n{r.stderr}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])  # its last line; batch 1, so per sample = per call
    key = f"ms_per_sample_at_{n}"
    if key not in summary:
        sys.exit(f"compare_builds.py: {' '.join(cmd)} printed no {key}: {summary}")
    return summary[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="the build before the change")
    ap.add_argument("new", help="the build after it")
    ap.add_argument("data", help="a UTF-8 text file (tiny shakespeare)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--small-steps", type=int, default=300)
    ap.add_argument("--large-steps", type=int, default=12)
    ap.add_argument("--no-recipes", action="store_true", help="attention kinds only")
    ap.add_argument("--kinds", default="window,strided,fixed,longformer,bigbird,lsh,adaptive_span,softmax")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per attention run (median)")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "compare_builds"))
    a = ap.parse_args()
    builds = {"old": a.old, "new": a.new}
    kinds = [k for k in a.kinds.split(",") if k]
    for name, b in builds.items():
        for f in ("cli/tapeformer",) + (("bench/attention_scaling",) if kinds else ()):
            if not os.access(os.path.join(b, f), os.X_OK):
                sys.exit(f"compare_builds.py: the {name} build '{b}' has no {f}")

    work = tempfile.mkdtemp(prefix="compare_builds.")
    rows = []
    measures = []
    if not a.no_recipes:
        for key, steps in (("small", a.small_steps), ("large", a.large_steps)):
            recipe = benchlib.RECIPES[key]
            measures.append((f"{recipe['label']}, tokens/s", "higher",
                             lambda b, r=recipe, s=steps: train_tokens_per_s(b, r, s, a.data, work)))
    for kind in kinds:
        measures.append((f"{kind} attention, N = {a.n}, ms per call", "lower",
                         lambda b, k=kind: attention_ms(b, k, a.n, a.repeats)))
    for label, better, measure in measures:
        got = {"old": [], "new": []}
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                got[name].append(measure(builds[name]))
        old, new = statistics.mean(got["old"]), statistics.mean(got["new"])
        row = {"measure": label, "better": better, "old": got["old"], "new": got["new"], "old_mean": old,
               "new_mean": new, "new_over_old": new / old}
        rows.append(row)
        print(f"{label}: old {old:.4g}, new {new:.4g}, new / old {new / old:.4f} ({better} is better)", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"old": a.old, "new": a.new, "rounds": a.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
