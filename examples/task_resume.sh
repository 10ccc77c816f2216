#!/usr/bin/env bash
# The task examples train through the library's Trainer (TaskData): a run of
# 30 steps and a run of 20 steps resumed to 30 write the same metrics and
# final figures (copy task; recall task with a segment memory carried), a
# changed model key is refused on resume, and the stock command refuses to
# sample a task's checkpoint (it holds no tokenizer), naming why.
# Usage: task_resume.sh COPY_TASK RECALL_TASK TAPEFORMER SOURCE_DIR
set -euo pipefail
copy=${1:?usage: task_resume.sh COPY_TASK RECALL_TASK TAPEFORMER SOURCE_DIR}
recall=${2:?}; tf=${3:?}; src=${4:?}
cd "$src"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set eval.interval=10 --set log.interval=5 --set eval.iters=2 --set eval.final_iters=2
        --set checkpoint.interval=10 --set train.threads=1)

# Metrics lines and the result line without their timing fields.
strip() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k in ("tokens_per_s", "elapsed_s", "train_seconds"): d.pop(k, None)
    print(json.dumps(d, sort_keys=True))' "$1"; }

check() {  # NAME PROGRAM ARGS...: 30 straight against 20 + resume to 30
  local name=$1 prog=$2; shift 2
  "$prog" "$@" --out "$dir/$name.straight" "${common[@]}" --set train.max_iters=30 > "$dir/$name.straight.json" 2>/dev/null
  "$prog" "$@" --out "$dir/$name.resumed" "${common[@]}" --set train.max_iters=20 > /dev/null 2>&1
  "$prog" "$@" --out "$dir/$name.resumed" "${common[@]}" --set train.max_iters=30 --resume \
    > "$dir/$name.resumed.json" 2>/dev/null
  diff <(strip "$dir/$name.straight/metrics.jsonl") <(strip "$dir/$name.resumed/metrics.jsonl")
  diff <(strip "$dir/$name.straight.json") <(strip "$dir/$name.resumed.json")
  [ "$(wc -l < "$dir/$name.straight/metrics.jsonl")" -eq 6 ] || { echo "$name: expected 6 metrics lines"; exit 1; }
  grep -q '"val_loss"' "$dir/$name.resumed/metrics.jsonl"
  echo "$name: 30 steps straight = 20 steps resumed to 30"
}
check copy "$copy" --config configs/e2a_copy.json --set model.n_layer=1
check recall "$recall" --config configs/e4c_recall.json --distance 2
grep -q '"recall"' "$dir/recall.resumed/metrics.jsonl"

if "$recall" --config configs/e4c_recall.json --distance 2 --out "$dir/recall.resumed" --resume \
     --set model.n_layer=3 2> "$dir/err"; then
  echo "a changed model.n_layer was accepted on resume"; exit 1
fi
grep -q "model.n_layer = 2 but the config asks for 3" "$dir/err" || { cat "$dir/err"; exit 1; }
if "$tf" sample --checkpoint "$dir/copy.resumed" --tokens 5 2> "$dir/err"; then
  echo "the stock command sampled a task's checkpoint"; exit 1
fi
grep -q "holds no tokenizer" "$dir/err" || { cat "$dir/err"; exit 1; }
echo "task_resume: ok"
