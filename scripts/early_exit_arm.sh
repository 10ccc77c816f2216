#!/usr/bin/env bash
# One run of experiments/early_exit.json: the char-LM recipe trained as an
# early-exit model (model.arch early_exit; one model per seed, shared by the
# arms, trained by the first arm that needs it), copied into RUN_DIR and
# calibrated there with the arm's confidence measure: CALM's Learn-then-Test
# at delta 0.1, epsilon 0.05, the whole threshold sweep in RUN_DIR/sweep.jsonl.
# Prints calibrate's JSON line with the model's final val loss added.
#
#   bash scripts/early_exit_arm.sh BUILD DATA RUN_DIR SEED THREADS MEASURE [--set key=value ...]
set -euo pipefail
build=$1 data=$2 run=$3 seed=$4 threads=$5 measure=$6
shift 6
root=$(cd "$(dirname "$0")/.." && pwd)
models=$(dirname "$(dirname "$run")")/models
model=$models/seed$seed
mkdir -p "$models" "$run"
(
  flock 9  # the arms of one seed share its model
  if [ ! -s "$model/train.json" ]; then
    rm -rf "$model"
    "$build/cli/tapeformer" train --config "$root/configs/shakespeare_char_cpu.json" --data "$data" --out "$model" \
      --set model.arch=early_exit --set train.seed="$seed" --set train.threads="$threads" --set train.shards=2 "$@" \
      > "$model.json.tmp" 2> "$model.stderr"
    mv "$model.json.tmp" "$model/train.json"
  fi
) 9> "$model.lock"
cp "$model/checkpoint.bin" "$run/checkpoint.bin"
"$build/cli/tapeformer" --threads "$threads" calibrate --checkpoint "$run" --data "$data" --confidence "$measure" \
  --method ltt --delta 0.1 --epsilon 0.05 --splits 100 --sweep "$run/sweep.jsonl" > "$run/calibrate.json"
python3 - "$model/train.json" "$run/calibrate.json" <<'PY'
import json, sys
train = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
result = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
result["val_loss"] = train["val_loss"]
print(json.dumps(result))
PY
