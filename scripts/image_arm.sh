#!/usr/bin/env bash
# One run of experiments/image_digits.json: scikit-learn's 8 x 8 digits as
# pixel letters (scripts/digits.py, written once to out/digits/digits.txt),
# configs/digits.json trained with the arm's settings, then 16 digits
# sampled from it into RUN/samples.png. Prints the run's final JSON line.
#
#   bash scripts/image_arm.sh BUILD RUN_DIR SEED THREADS [--set key=value ...]
set -euo pipefail
build=$1 run=$2 seed=$3 threads=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/out/digits/digits.txt
[ -s "$data" ] || /usr/bin/python3 "$root/scripts/digits.py" "$data" >&2
mkdir -p "$run"
"$build/cli/tapeformer" train --config "$root/configs/digits.json" --data "$data" --out "$run" \
  --set train.seed="$seed" --set train.threads="$threads" "$@" > "$run/train.json"
"$build/cli/tapeformer" sample --checkpoint "$run" --tokens 64 --png "$run/samples.png" --image-width 8 \
  --images 16 --seed "$seed" > "$run/samples.txt"
tail -1 "$run/train.json"
