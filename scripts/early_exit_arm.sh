#!/usr/bin/env bash
# One run of experiments/early_exit.json: the char-LM recipe trained as an
# early-exit model (model.arch early_exit; one model per seed, shared by the
# arms, trained by the first arm that needs it), copied into RUN_DIR and
# calibrated there with the arm's confidence measure: CALM's Learn-then-Test
# at delta 0.1, epsilon 0.05, the whole threshold sweep in RUN_DIR/sweep.jsonl.
# Then times generation at every threshold of the sweep (`sample --tokens 500
# --exit-threshold T --report-layers`, THREADS threads): each sweep line gains
# "ms_per_token", and the result the figure at the calibrated threshold and
# with no exits ("full_ms_per_token", threshold 2).
# Prints calibrate's JSON line with the model's final val loss and the times added.
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
python3 - "$build/cli/tapeformer" "$run" "$threads" "$model/train.json" "$run/calibrate.json" <<'PY'
import json, subprocess, sys
tapeformer, run, threads, train_file, calibrate_file = sys.argv[1:]


def ms_per_token(threshold):
    """sample's ms_per_token with this exit threshold (the calibrated one is in the run)."""
    proc = subprocess.run([tapeformer, "--threads", threads, "sample", "--checkpoint", run, "--tokens", "500",
                           "--seed", "1", "--report-layers", "--exit-threshold", repr(threshold)],
                          capture_output=True, text=True, check=True)
    for line in proc.stderr.splitlines():
        if line.startswith("sample: ms_per_token "):
            return float(line.split()[2])
    sys.exit(f"early_exit_arm.sh: sample printed no ms_per_token:\n{proc.stderr}")


train = json.loads(open(train_file).read().strip().splitlines()[-1])
result = json.loads(open(calibrate_file).read().strip().splitlines()[-1])
result["val_loss"] = train["val_loss"]
sweep = [json.loads(line) for line in open(f"{run}/sweep.jsonl") if line.strip()]
for row in sweep:
    row["ms_per_token"] = ms_per_token(row["threshold"])
with open(f"{run}/sweep.jsonl", "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in sweep)
result["ms_per_token"] = ms_per_token(result["threshold"])
result["full_ms_per_token"] = ms_per_token(2)
result["speedup"] = result["full_ms_per_token"] / result["ms_per_token"]
print(json.dumps(result))
PY
