#!/usr/bin/env bash
# kill -9 during training, --resume, and the run ends exactly like an
# uninterrupted one (same thread count); then SIGTERM and SIGINT, which stop
# the run cleanly with a checkpoint of the step they arrived at (exit status
# 128 + signal), and --resume again ends exactly like the uninterrupted run.
# Usage: resume_kill.sh path/to/tapeformer
set -u
bin=${1:?usage: resume_kill.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null; rm -rf "$work"' EXIT
pid=

cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
 "train": {"batch_size": 8, "max_iters": 1500, "threads": 2}, "schedule": {"warmup_iters": 20, "decay_iters": 1500},
 "eval": {"interval": 50, "iters": 4, "final_iters": 8}, "checkpoint": {"interval": 100}, "log": {"interval": 10}}
JSON
for i in $(seq 300); do echo "Verse $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101))."; done > "$work/text.txt"

"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/straight" > "$work/straight.json" 2>/dev/null \
  || { echo "FAIL: the uninterrupted run failed"; exit 1; }

# Timing fields differ between any two runs; everything else must not.
strip() { sed -E 's/, ?"(train_seconds|tokens_per_s|elapsed_s)": ?[^,}]*//g' "$1"; }
# same_as STRAIGHT DIR: DIR.json and DIR/metrics.jsonl equal STRAIGHT's, timing aside.
same_as() { [ "$(strip "$1.json")" = "$(strip "$2.json")" ] && diff -q <(strip "$1/metrics.jsonl") <(strip "$2/metrics.jsonl") > /dev/null; }
# stop_at CONFIG DIR STEP SIGNAL [DELAY]: a run of CONFIG into DIR (stderr in
# DIR.log), sent SIGNAL once its metrics reached STEP and DELAY seconds
# passed; `status` is its exit status.
stop_at() {
  "$bin" train --config "$1" --data "$work/text.txt" --out "$2" > /dev/null 2> "$2.log" &
  pid=$!
  for _ in $(seq 600); do
    grep -q "\"step\":$3" "$2/metrics.jsonl" 2>/dev/null && break
    sleep 0.05
  done
  sleep "${5:-0}"
  kill -"$4" $pid 2>/dev/null
  wait $pid 2>/dev/null
  status=$?
}

# Start the same run, wait until it has passed its first checkpoint (step 100),
# then kill -9 mid-training.
stop_at "$work/cfg.json" "$work/killed" 120 9
if ! grep -q '"step":120' "$work/killed/metrics.jsonl" 2>/dev/null; then
  echo "FAIL: the run to be killed never reached step 120"; exit 1
fi
if grep -q '"step":1500' "$work/killed/metrics.jsonl"; then
  echo "FAIL: the run finished before it could be killed; the test proves nothing"; exit 1
fi

"$bin" train --out "$work/killed" --resume > "$work/resumed.json" 2> "$work/resumed.log" \
  || { echo "FAIL: resume failed:"; cat "$work/resumed.log"; exit 1; }

fails=0
if [ "$(strip "$work/straight.json")" != "$(strip "$work/resumed.json")" ]; then
  echo "FAIL: final line differs"; echo "  straight: $(cat "$work/straight.json")"; echo "  resumed:  $(cat "$work/resumed.json")"
  fails=1
fi
if ! diff <(strip "$work/straight/metrics.jsonl") <(strip "$work/killed/metrics.jsonl") > "$work/diff"; then
  echo "FAIL: metrics.jsonl differs:"; head -5 "$work/diff"; fails=1
fi
# It must have resumed from a mid-run checkpoint (100, 200, ...), not started over.
grep -qE "resuming at step [1-9][0-9]*00 " "$work/resumed.log" || { echo "FAIL: did not resume from a mid-run checkpoint"; fails=1; }
checks=3

# SIGTERM and SIGINT: the step in progress completes, its checkpoint is
# written, the exit status is 128 + the signal. Job control on, so that the
# background run does not start with SIGINT ignored.
set -m
for sig in TERM INT; do
  checks=$((checks + 2))
  dir="$work/stopped_$sig"
  stop_at "$work/cfg.json" "$dir" 130 $sig
  want=$((128 + $(kill -l $sig)))
  step=$(sed -nE 's/.* at step ([0-9]+): checkpoint saved to .*/\1/p' "$dir.log")
  if [ $status -ne $want ] || [ -z "$step" ]; then
    echo "FAIL: SIG$sig: exit status $status (want $want), stderr: $(tail -1 "$dir.log")"; fails=$((fails + 1)); continue
  fi
  "$bin" train --out "$dir" --resume > "$dir.json" 2> "$dir.resume.log" \
    || { echo "FAIL: resume after SIG$sig failed: $(tail -1 "$dir.resume.log")"; fails=$((fails + 1)); continue; }
  if ! grep -q "resuming at step $step " "$dir.resume.log"; then
    echo "FAIL: SIG$sig stopped at step $step but the run resumed elsewhere"; fails=$((fails + 1))
  fi
  if ! same_as "$work/straight" "$dir"; then
    echo "FAIL: after SIG$sig at step $step and --resume, the run differs from the uninterrupted one"; fails=$((fails + 1))
  else
    echo "SIG$sig at step $step: exit status $status, resumed to the same final line and metrics"
  fi
done

# SIGTERM during an evaluation step's evaluation (a long one): the step's
# checkpoint is saved with its evaluation pending, and --resume evaluates it
# first, so the metrics are still those of the uninterrupted run.
checks=$((checks + 1))
sed -e 's/"max_iters": 1500/"max_iters": 60/; s/"decay_iters": 1500/"decay_iters": 60/; s/"iters": 4,/"iters": 15000,/' \
  "$work/cfg.json" > "$work/eval_cfg.json"
"$bin" train --config "$work/eval_cfg.json" --data "$work/text.txt" --out "$work/eval_straight" > "$work/eval_straight.json" \
  2>/dev/null || { echo "FAIL: the uninterrupted long-evaluation run failed"; exit 1; }
dir="$work/eval_stopped"
stop_at "$work/eval_cfg.json" "$dir" 40 TERM 0.8  # steps 41-50 take milliseconds, step 50's evaluation seconds
if [ $status -ne 143 ] || ! grep -q " at step 50: checkpoint saved" "$dir.log"; then
  echo "FAIL: SIGTERM during step 50's evaluation: exit status $status, stderr: $(tail -1 "$dir.log")"; fails=$((fails + 1))
elif ! "$bin" train --out "$dir" --resume > "$dir.json" 2> "$dir.resume.log"; then
  echo "FAIL: resume after SIGTERM during evaluation failed: $(tail -1 "$dir.resume.log")"; fails=$((fails + 1))
elif ! same_as "$work/eval_straight" "$dir"; then
  echo "FAIL: after SIGTERM during step 50's evaluation and --resume, the run differs from the uninterrupted one"
  diff <(strip "$work/eval_straight/metrics.jsonl") <(strip "$dir/metrics.jsonl") | head -4; fails=$((fails + 1))
else
  echo "SIGTERM during step 50's evaluation: resumed, evaluated step 50, same final line and metrics"
fi
set +m

[ $fails -eq 0 ] && echo "straight: $(cat "$work/straight.json")" && echo "resumed:  $(cat "$work/resumed.json")"
echo "$((checks - fails)) passed, $fails failed"
exit $fails
