#!/usr/bin/env bash
# kill -9 during training, --resume, and the run ends exactly like an
# uninterrupted one (same thread count). Usage: resume_kill.sh path/to/tapeformer
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

# Start the same run, wait until it has passed its first checkpoint (step 100),
# then kill -9 mid-training.
"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/killed" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q '"step":120' "$work/killed/metrics.jsonl" 2>/dev/null && break
  sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
if ! grep -q '"step":120' "$work/killed/metrics.jsonl" 2>/dev/null; then
  echo "FAIL: the run to be killed never reached step 120"; exit 1
fi
if grep -q '"step":1500' "$work/killed/metrics.jsonl"; then
  echo "FAIL: the run finished before it could be killed; the test proves nothing"; exit 1
fi

"$bin" train --out "$work/killed" --resume > "$work/resumed.json" 2> "$work/resumed.log" \
  || { echo "FAIL: resume failed:"; cat "$work/resumed.log"; exit 1; }

# Timing fields differ between any two runs; everything else must not.
strip() { sed -E 's/, ?"(train_seconds|tokens_per_s|elapsed_s)": ?[^,}]*//g' "$1"; }
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
[ $fails -eq 0 ] && echo "straight: $(cat "$work/straight.json")" && echo "resumed:  $(cat "$work/resumed.json")"
echo "$((3 - fails)) passed, $fails failed"
exit $fails
