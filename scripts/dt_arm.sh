#!/usr/bin/env bash
# One run of experiments/dt_grid.json: the keys_doors dataset (2000 episodes,
# 70% random, 30% noisy expert; written once to out/rl/keys_doors.traj),
# configs/dt_grid.json trained on it with the arm's settings by `tapeformer
# rl train` into RUN_DIR/model, then `rl eval` at each target return (100 unseen layouts each).
# Prints one JSON line: the final val loss and accuracy, and "achieved":
# {"t<target>": mean return}.
#
#   bash scripts/dt_arm.sh BUILD RUN_DIR SEED THREADS [--set key=value ...]
set -euo pipefail
build=$1 run=$2 seed=$3 threads=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
data=$root/out/rl/keys_doors.traj
mkdir -p "$root/out/rl"
(
  flock 9
  [ -s "$data" ] || "$build/cli/tapeformer" rl collect --env keys_doors --policy random:0.7,noisy:0.3 --episodes 2000 \
    --seed 1 --out "$data" > "$data.json"
) 9> "$data.lock"
mkdir -p "$run"
rm -rf "$run/model"
"$build/cli/tapeformer" rl train --config "$root/configs/dt_grid.json" --data "$data" --out "$run/model" \
  --set train.seed="$seed" --set train.threads="$threads" "$@" > "$run/train.json" 2> "$run/train.err"
for target in -30 -20 -10 -5 0 5 10; do
  "$build/cli/tapeformer" --threads "$threads" rl eval --checkpoint "$run/model" --target-return "$target" --episodes 100 \
    --seed "$seed" 2> /dev/null
done > "$run/eval.jsonl"
python3 - "$run" "$data.json" <<'PY'
import json, sys
run = sys.argv[1]
train = json.loads(open(run + "/train.json").read().strip().splitlines()[-1])
data = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
rows = [json.loads(l) for l in open(run + "/eval.jsonl") if l.startswith("{")]
out = {"val_loss": train["val_loss"], "achieved": {f"t{int(r['target_return'])}": r["return_mean"] for r in rows},
       "best_return_mean": rows[0]["best_return_mean"], "noisy_return_mean": data["by_policy"]["noisy"]["return_mean"],
       "data_return_mean": data["return_mean"], "data_return_max": data["return_max"]}
print(json.dumps(out))
PY
