#!/usr/bin/env bash
# Paired run: tapeformer and the PyTorch reference (float32, and float64 as the
# yardstick) trained from the same initial weights on the same batches, compared
# step by step. Seed-to-seed spread hides small systematic differences in a
# comparison of final losses; here the only difference left is float rounding,
# so tapeformer should stay as close to the float64 run as PyTorch's own
# float32 run does.
#
#   bash bench/paired_run.sh DATA [--set key=value ...]
#   CONFIG=configs/quickstart.json OUT=out/paired bash bench/paired_run.sh input.txt --set train.max_iters=300
#   TORCH_PYTHON=/usr/bin/python3 bash bench/paired_run.sh input.txt           # Debian's PyTorch 1.13 instead
#
# PyTorch is the newest on PyPI, in a virtual environment made on first use
# (out/torch-venv: `python3 bench/benchlib.py torch-python`), never a
# dependency of tapeformer; TORCH_PYTHON names another interpreter with torch.
# The comparison names its version.
#
# One thread each (the three runs go one after the other); model.dropout must
# be 0. About 15 minutes for the nanoGPT CPU recipe on this project's 2-core
# machine, most of it the two PyTorch runs. Results: OUT/paired.json (default out/paired).
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:?usage: bench/paired_run.sh DATA [--set key=value ...]}
shift
[ -f "$data" ] || { echo "paired_run.sh: data file '$data' not found" >&2; exit 2; }
config=${CONFIG:-configs/shakespeare_char_cpu.json}
out=${OUT:-out/paired}
sets=()
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --set) sets+=(--set "$2"); overrides+=("$2"); shift 2 ;;
    *) echo "paired_run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

# The PyTorch peer's interpreter (Debian's needs python3-torch on OpenBLAS).
torch_python=$(python3 bench/benchlib.py torch-python)
torch_packages=$(python3 bench/benchlib.py torch-packages "$torch_python")
# shellcheck disable=SC2086  # the package names, one word each
bash scripts/setup.sh $torch_packages
echo "paired_run.sh: PyTorch $("$torch_python" -c 'import torch; print(torch.__version__)') ($torch_python)" >&2
echo "paired_run.sh: building (Release)..." >&2
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target paired_run >/dev/null
mkdir -p "$out"
rm -f "$out"/*.jsonl

py=("$torch_python" bench/paired_run.py --config "$config" --data "$data" --out "$out" ${sets[@]+"${sets[@]}"})
echo "paired_run.sh: initial weights and batches..." >&2
"${py[@]}" prepare
echo "paired_run.sh: tapeformer..." >&2
build/bench/paired_run "$config" "$data" "$out" train.threads=1 ${overrides[@]+"${overrides[@]}"}
echo "paired_run.sh: PyTorch float32..." >&2
"${py[@]}" train --dtype float32
echo "paired_run.sh: PyTorch float64..." >&2
"${py[@]}" train --dtype float64
"$torch_python" bench/paired_run.py compare --out "$out"
