#!/usr/bin/env bash
# tapeformer vs PyTorch on the same char-LM recipe, in one run.
#
#   bash bench/charlm_vs_pytorch.sh DATA [--set key=value ...]
#   CONFIG=configs/shakespeare_char_cpu.json OUT=out/bench ROUNDS=3 bash bench/charlm_vs_pytorch.sh input.txt
#   TORCH_PYTHON=/usr/bin/python3 bash bench/charlm_vs_pytorch.sh input.txt    # Debian's PyTorch 1.13 instead
#
# PyTorch is the newest on PyPI, in a virtual environment made on first use
# (out/torch-venv: `python3 bench/benchlib.py torch-python`), never a
# dependency of tapeformer; TORCH_PYTHON names another interpreter with torch.
# Its version heads the printed tables and goes to OUT/bench.json.
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

# The PyTorch peer's interpreter. Debian's torch (TORCH_PYTHON=/usr/bin/python3)
# needs python3-torch on OpenBLAS: it calls the system BLAS, and the default
# reference BLAS would make it ~15x slower than it can be.
torch_python=$(python3 bench/benchlib.py torch-python)
torch_packages=$(python3 bench/benchlib.py torch-packages "$torch_python")
# shellcheck disable=SC2086  # the package names, one word each
bash scripts/setup.sh $torch_packages time
torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)')
echo "charlm_vs_pytorch.sh: PyTorch $torch_version ($torch_python)" >&2

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
  run "pytorch-$1" "$torch_python" bench/charlm_reference.py --config "$config" --data "$data" --threads "$threads" \
    "${sets[@]}"
}
for ((r = 1; r <= rounds; r++)); do
  echo "charlm_vs_pytorch.sh: round $r of $rounds" >&2
  if ((r % 2)); then run_tapeformer "$r"; run_pytorch "$r"; else run_pytorch "$r"; run_tapeformer "$r"; fi
done

/usr/bin/python3 - "$out" "$rounds" "$torch_python" "$torch_version" <<'PY'
import json, re, statistics, sys
out, rounds, torch_python, torch_version = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(name, r):
    res = json.loads(open(f"{out}/{name}-{r}.json").read().strip().splitlines()[-1])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{out}/{name}-{r}.time").read())
    res["peak_rss_mb"] = int(rss.group(1)) / 1024 if rss else float("nan")
    return res
runs = {name: [load(name, r) for r in range(1, rounds + 1)] for name in ("tapeformer", "pytorch")}
assert all(r["torch"] == torch_version for r in runs["pytorch"]), "every PyTorch run reports the version asked"
print(f"tapeformer against PyTorch {torch_version} ({torch_python})")
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
names = (("tapeformer", t), ("pytorch " + torch_version, p))
w = max(12, max(len(n) for n, _ in names))
print(f"{'median of ' + str(rounds):{w}} {'train s':>9} {'tokens/s':>10} {'val loss':>9} {'peak RSS MB':>12} {'threads':>8}")
for name, r in names:
    print(f"{name:{w}} {r['train_seconds']:9.1f} {r['tokens_per_s']:10.0f} {r['val_loss']:9.4f} {r['peak_rss_mb']:12.1f} {r['threads']:8d}")
print(f"{'ratio':{w}} {'':9} {ratio['tokens_per_s']:9.2f}x {ratio['val_loss_diff']:+9.4f} {ratio['peak_rss']:11.2f}x"
      f"   (tapeformer / pytorch; val loss as a difference)")
print(f"per-round ratios: {min(ratios):.2f}x to {max(ratios):.2f}x")
json.dump({"tapeformer": t, "pytorch": p, "ratio": ratio, "torch": torch_version, "torch_python": torch_python,
           "runs": runs}, open(f"{out}/bench.json", "w"), indent=2)
PY
echo "charlm_vs_pytorch.sh: results in $out/bench.json" >&2
