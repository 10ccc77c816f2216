#!/usr/bin/env bash
# tapeformer vs PyTorch on the same char-LM recipe, in one run.
#
#   bash bench/charlm_vs_pytorch.sh DATA [--set key=value ...]
#   CONFIG=configs/shakespeare_char_cpu.json OUT=out/bench bash bench/charlm_vs_pytorch.sh input.txt
#
# Both read the same JSON config and data file, build the same model (same init,
# AdamW groups, schedule, clipping, split, batch sampling, evaluation), use all
# cores, and exclude evaluation from the timed training loop. tokens/s means
# batch * block * grad_accum * iterations / training-loop seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:?usage: bench/charlm_vs_pytorch.sh DATA [--set key=value ...]}
shift
[ -f "$data" ] || { echo "charlm_vs_pytorch.sh: data file '$data' not found" >&2; exit 2; }
config=${CONFIG:-configs/shakespeare_char_cpu.json}
out=${OUT:-out/bench}
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
cmake --build build -j "$threads" --target tapeformer >/dev/null

rm -rf "$out"
mkdir -p "$out"
run() {  # name command...
  local name=$1; shift
  echo "charlm_vs_pytorch.sh: running $name..." >&2
  /usr/bin/time -v -o "$out/$name.time" "$@" > "$out/$name.json" 2> "$out/$name.log" || {
    echo "charlm_vs_pytorch.sh: $name failed; see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}
run tapeformer build/cli/tapeformer train --config "$config" --data "$data" --out "$out/tapeformer-run" \
  --threads "$threads" "${sets[@]}"
run pytorch /usr/bin/python3 bench/charlm_reference.py --config "$config" --data "$data" --threads "$threads" \
  "${sets[@]}"

/usr/bin/python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
rows = {}
for name in ("tapeformer", "pytorch"):
    r = json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{out}/{name}.time").read())
    r["peak_rss_mb"] = int(rss.group(1)) / 1024 if rss else float("nan")
    rows[name] = r
t, p = rows["tapeformer"], rows["pytorch"]
ratio = {"tokens_per_s": t["tokens_per_s"] / p["tokens_per_s"], "train_seconds": p["train_seconds"] / t["train_seconds"],
         "peak_rss": t["peak_rss_mb"] / p["peak_rss_mb"], "val_loss_diff": t["val_loss"] - p["val_loss"]}
print(f"{'':12} {'train s':>9} {'tokens/s':>10} {'val loss':>9} {'peak RSS MB':>12} {'threads':>8}")
for name, r in rows.items():
    print(f"{name:12} {r['train_seconds']:9.1f} {r['tokens_per_s']:10.0f} {r['val_loss']:9.4f} {r['peak_rss_mb']:12.1f} {r['threads']:8d}")
print(f"{'ratio':12} {'':9} {ratio['tokens_per_s']:9.2f}x {ratio['val_loss_diff']:+9.4f} {ratio['peak_rss']:11.2f}x"
      f"   (tapeformer / pytorch; val loss as a difference)")
json.dump({"tapeformer": t, "pytorch": p, "ratio": ratio}, open(f"{out}/bench.json", "w"), indent=2)
PY
echo "charlm_vs_pytorch.sh: results in $out/bench.json" >&2
