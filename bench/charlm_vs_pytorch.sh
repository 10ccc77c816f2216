#!/usr/bin/env bash
# tapeformer vs PyTorch on the same char-LM recipe, in one run.
#
#   bash bench/charlm_vs_pytorch.sh DATA [--set key=value ...]
#   CONFIG=configs/shakespeare_char_cpu.json OUT=out/bench ROUNDS=3 bash bench/charlm_vs_pytorch.sh input.txt
#
# Both read the same JSON config and data file, build the same model (same init,
# AdamW groups, schedule, clipping, split, batch sampling, evaluation), use all
# cores, and exclude evaluation from the timed training loop. tokens/s means
# batch * block * grad_accum * iterations / training-loop seconds.
#
# ROUNDS (default 3) full runs of each, alternating (tapeformer first in odd
# rounds, PyTorch first in even ones), so a slow spell of the machine hits
# both; the headline ratio is of the two medians, and every round's ratio is
# printed too.
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:?usage: bench/charlm_vs_pytorch.sh DATA [--set key=value ...]}
shift
[ -f "$data" ] || { echo "charlm_vs_pytorch.sh: data file '$data' not found" >&2; exit 2; }
config=${CONFIG:-configs/shakespeare_char_cpu.json}
out=${OUT:-out/bench}
rounds=${ROUNDS:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "charlm_vs_pytorch.sh: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
threads=$(nproc)
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --set) sets+=(--set "${2:?--set needs key=value}"); shift 2 ;;
    *) echo "charlm_vs_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

# PyTorch from Debian, on OpenBLAS: Debian's torch calls the system BLAS, and
# the default reference BLAS would make PyTorch ~15x slower than it can be.
bash scripts/setup.sh python3-torch libopenblas0-openmp time

echo "charlm_vs_pytorch.sh: building tapeformer (Release)..." >&2
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$threads" --target tapeformer_command >/dev/null

rm -rf "$out"
mkdir -p "$out"
run() {  # name command...
  local name=$1; shift
  echo "charlm_vs_pytorch.sh: running $name..." >&2
  /usr/bin/time -v -o "$out/$name.time" "$@" > "$out/$name.json" 2> "$out/$name.log" || {
    echo "charlm_vs_pytorch.sh: $name failed; see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}
run_tapeformer() {  # round
  rm -rf "$out/tapeformer-run"
  run "tapeformer-$1" build/cli/tapeformer train --config "$config" --data "$data" --out "$out/tapeformer-run" \
    --threads "$threads" "${sets[@]}"
}
run_pytorch() {  # round
  run "pytorch-$1" /usr/bin/python3 bench/charlm_reference.py --config "$config" --data "$data" --threads "$threads" \
    "${sets[@]}"
}
for ((r = 1; r <= rounds; r++)); do
  echo "charlm_vs_pytorch.sh: round $r of $rounds" >&2
  if ((r % 2)); then run_tapeformer "$r"; run_pytorch "$r"; else run_pytorch "$r"; run_tapeformer "$r"; fi
done

/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name, r):
    res = json.loads(open(f"{out}/{name}-{r}.json").read().strip().splitlines()[-1])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{out}/{name}-{r}.time").read())
    res["peak_rss_mb"] = int(rss.group(1)) / 1024 if rss else float("nan")
    return res
runs = {name: [load(name, r) for r in range(1, rounds + 1)] for name in ("tapeformer", "pytorch")}
print(f"{'round':6} {'tapeformer tok/s':>17} {'pytorch tok/s':>14} {'ratio':>7}")
ratios = []
for r in range(rounds):
    t, p = runs["tapeformer"][r]["tokens_per_s"], runs["pytorch"][r]["tokens_per_s"]
    ratios.append(t / p)
    print(f"{r + 1:<6} {t:17.0f} {p:14.0f} {t / p:6.2f}x")
def summary(name):  # medians of the timings; loss and RSS from the runs themselves
    rs = runs[name]
    s = dict(rs[0])
    s["tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in rs)
    s["train_seconds"] = statistics.median(x["train_seconds"] for x in rs)
    s["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rs)
    return s
t, p = summary("tapeformer"), summary("pytorch")
ratio = {"tokens_per_s": t["tokens_per_s"] / p["tokens_per_s"], "train_seconds": p["train_seconds"] / t["train_seconds"],
         "peak_rss": t["peak_rss_mb"] / p["peak_rss_mb"], "val_loss_diff": t["val_loss"] - p["val_loss"],
         "rounds": ratios, "rounds_min": min(ratios), "rounds_max": max(ratios)}
print()
print(f"{'median of ' + str(rounds):12} {'train s':>9} {'tokens/s':>10} {'val loss':>9} {'peak RSS MB':>12} {'threads':>8}")
for name, r in (("tapeformer", t), ("pytorch", p)):
    print(f"{name:12} {r['train_seconds']:9.1f} {r['tokens_per_s']:10.0f} {r['val_loss']:9.4f} {r['peak_rss_mb']:12.1f} {r['threads']:8d}")
print(f"{'ratio':12} {'':9} {ratio['tokens_per_s']:9.2f}x {ratio['val_loss_diff']:+9.4f} {ratio['peak_rss']:11.2f}x"
      f"   (tapeformer / pytorch; val loss as a difference)")
print(f"per-round ratios: {min(ratios):.2f}x to {max(ratios):.2f}x")
json.dump({"tapeformer": t, "pytorch": p, "ratio": ratio, "runs": runs}, open(f"{out}/bench.json", "w"), indent=2)
PY
echo "charlm_vs_pytorch.sh: results in $out/bench.json" >&2
