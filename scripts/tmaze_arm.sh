#!/usr/bin/env bash
# One run of experiments/dt_tmaze.json: for each corridor length, a T-maze
# dataset (1000 episodes, half by a random policy, half by the expert;
# written once to out/rl/tmaze_c<N>.traj), configs/dt_tmaze.json trained on
# it with the arm's settings by `tapeformer rl train` into RUN_DIR/c<N>, then
# `rl eval --target-return 1` on 100 new episodes. Prints one JSON line:
# {"success": {"c<N>": fraction of episodes that took the cued turn}, "val_loss": {"c<N>": ...}}.
#
#   bash scripts/tmaze_arm.sh BUILD RUN_DIR SEED THREADS [--set key=value ...]
set -euo pipefail
build=$1 run=$2 seed=$3 threads=$4
shift 4
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/out/rl" "$run"
for corridor in 2 4 8 16 32; do
  data=$root/out/rl/tmaze_c$corridor.traj
  (
    flock 9
    [ -s "$data" ] || "$build/cli/tapeformer" rl collect --env tmaze --option corridor=$corridor \
      --policy random:0.5,expert:0.5 --episodes 1000 --seed 1 --out "$data" > "$data.json"
  ) 9> "$data.lock"
  rm -rf "$run/c$corridor"
  "$build/cli/tapeformer" rl train --config "$root/configs/dt_tmaze.json" --data "$data" --out "$run/c$corridor" \
    --set train.seed="$seed" --set train.threads="$threads" "$@" > "$run/train_c$corridor.json" 2> "$run/train_c$corridor.err"
  "$build/cli/tapeformer" --threads "$threads" rl eval --checkpoint "$run/c$corridor" --target-return 1 --episodes 100 \
    --seed "$seed" 2> /dev/null > "$run/eval_c$corridor.json"
done
python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
last = lambda path: json.loads(open(path).read().strip().splitlines()[-1])
out = {"success": {}, "val_loss": {}}
for c in (2, 4, 8, 16, 32):
    out["success"][f"c{c}"] = last(f"{run}/eval_c{c}.json")["return_mean"]
    out["val_loss"][f"c{c}"] = last(f"{run}/train_c{c}.json")["val_loss"]
print(json.dumps(out))
PY
