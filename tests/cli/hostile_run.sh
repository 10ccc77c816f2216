#!/usr/bin/env bash
# Training under hostile use loses nothing and accepts nothing it should
# refuse, through the real binary:
#   1. two runs into one directory: exactly one is refused (naming the
#      holder's PID), and so is a --resume while it trains; the other's
#      files are intact and consistent;
#   2. divergence: the run ends with its last good checkpoint, names its
#      step, and that checkpoint evaluates to a finite loss;
#   3. SIGHUP stops like SIGTERM: a checkpoint, exit status 129;
#   4. a 100-block `ulimit -f`: a clear error, the previous checkpoint
#      untouched, no temp file left (train), no token file left (prepare);
#   5. resume bookkeeping: the final loss comes from the checkpoint (not
#      from metrics.jsonl, deleted here), and train.max_iters below the
#      checkpoint's step is refused with both numbers.
# Usage: hostile_run.sh TAPEFORMER
set -u
bin=${1:?usage: hostile_run.sh TAPEFORMER}
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16},
 "train": {"batch_size": 8, "max_iters": 20, "threads": 1, "seed": 5},
 "optimizer": {"lr": 0.01, "weight_decay": 0.0}, "schedule": {"name": "constant"},
 "eval": {"interval": 10, "iters": 2, "final_iters": 4}, "checkpoint": {"interval": 10}, "log": {"interval": 5}}
JSON
for i in $(seq 200); do echo "Verse $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101))."; done > "$work/text.txt"
run() { "$bin" train --config "$work/cfg.json" --data "$work/text.txt" "$@"; }

# 1. Two writers. The first trains long enough to be running through the checks, then is stopped.
"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/shared" --set train.max_iters=1000000 \
  --set checkpoint.interval=2000 > /dev/null 2> "$work/a.err" &
first=$!; pids+=($first)
for _ in $(seq 600); do [ -s "$work/shared/metrics.jsonl" ] && break; sleep 0.05; done
[ -s "$work/shared/metrics.jsonl" ] || fail "the first run never started writing"
if run --out "$work/shared" > /dev/null 2> "$work/b.err"; then fail "a second run into a directory in use was accepted"; fi
grep -q "is in use by process $first" "$work/b.err" || { fail "the second run's message does not name the holder $first:"; cat "$work/b.err"; }
for _ in $(seq 600); do [ -f "$work/shared/checkpoint.bin" ] && break; sleep 0.05; done
if "$bin" train --out "$work/shared" --resume > /dev/null 2> "$work/c.err"; then fail "--resume while another process trains was accepted"; fi
grep -q "is in use by process $first" "$work/c.err" || { fail "--resume's message does not name the holder:"; cat "$work/c.err"; }
kill -TERM "$first"
wait "$first"; status=$?
[ "$status" = 143 ] || { fail "the first run ended with $status, not 143 (SIGTERM)"; cat "$work/a.err"; }
stopped=$(grep -o "stopped (SIGTERM) at step [0-9]*" "$work/a.err" | grep -o "[0-9]*$")
# Its files are its own and consistent: metrics end at or before the checkpoint's step, and it resumes.
python3 - "$work/shared/metrics.jsonl" "$stopped" <<'PY' || fail "the first run's metrics.jsonl is not one run's"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == sorted(set(steps)) and steps[-1] <= int(sys.argv[2]), (steps[-3:], sys.argv[2])
PY
"$bin" train --out "$work/shared" --resume --set train.max_iters=$((stopped + 10)) > "$work/a.json" 2>/dev/null \
  || fail "the first run does not resume"

# 2. Divergence: SGD at lr 100 with no clipping grows, then overflows after a finite loss.
run --out "$work/div" --set optimizer.name=sgd --set optimizer.lr=100 --set optimizer.grad_clip=0 \
  --set checkpoint.interval=1 > /dev/null 2> "$work/div.err"
status=$?
[ "$status" = 3 ] || fail "a diverging run exited $status, not 3"
grep -q "training diverged" "$work/div.err" || { fail "no divergence message:"; cat "$work/div.err"; }
kept=$(grep -o "the checkpoint of step [0-9]*" "$work/div.err" | grep -o "[0-9]*$")
[ -n "$kept" ] || { fail "the message does not name the kept checkpoint's step:"; cat "$work/div.err"; }
"$bin" eval --checkpoint "$work/div" --data "$work/text.txt" > "$work/div.eval" 2>&1 || { fail "eval of the kept checkpoint failed:"; cat "$work/div.eval"; }
python3 -c 'import math,re,sys; m=re.search(r"\"loss\": ([^,]*),", open(sys.argv[1]).read()); sys.exit(0 if m and math.isfinite(float(m.group(1))) else 1)' "$work/div.eval" \
  || fail "the kept checkpoint does not evaluate to a finite loss: $(cat "$work/div.eval")"

# 3. SIGHUP, like SIGTERM (job control on, so the background run keeps its signals).
set -m
"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/hup" --set train.max_iters=4000 \
  --set checkpoint.interval=1000 > /dev/null 2> "$work/hup.err" &
hup=$!; pids+=($hup)
for _ in $(seq 600); do [ -s "$work/hup/metrics.jsonl" ] && break; sleep 0.05; done
kill -HUP "$hup"
wait "$hup"; status=$?
set +m
[ "$status" = 129 ] || fail "SIGHUP: exit status $status, not 129"
grep -q "stopped (SIGHUP)" "$work/hup.err" || { fail "SIGHUP: no message:"; cat "$work/hup.err"; }
[ -f "$work/hup/checkpoint.bin" ] || fail "SIGHUP: no checkpoint saved"

# 4. ulimit -f 100 (blocks of 1 KiB): a model whose checkpoint is larger cannot save it.
run --out "$work/big" --set model.n_embd=128 --set train.max_iters=10 > /dev/null 2>&1 || fail "the unlimited run failed"
size=$(stat -c %s "$work/big/checkpoint.bin")
[ "$size" -gt 102400 ] || fail "the checkpoint ($size bytes) is not larger than the limit: the test proves nothing"
cp "$work/big/checkpoint.bin" "$work/big.before"
( ulimit -f 100; exec "$bin" train --out "$work/big" --resume --set train.max_iters=20 ) > /dev/null 2> "$work/big.err"
status=$?
[ "$status" = 1 ] || fail "ulimit -f: exit status $status, not 1 (153 is death by SIGXFSZ)"
grep -q "cannot save the checkpoint of step 20: .*File too large.*the checkpoint of step 10 is untouched" "$work/big.err" \
  || { fail "ulimit -f: unclear message:"; cat "$work/big.err"; }
cmp -s "$work/big.before" "$work/big/checkpoint.bin" || fail "ulimit -f: the previous checkpoint changed"
ls -a "$work/big" | grep -q "tmp" && fail "ulimit -f: a temp file was left: $(ls -a "$work/big")"
# prepare under the same limit: a clear error, and no token file left half-written.
for i in $(seq 3000); do echo "Line $i of a corpus larger than the limit, to be written as token files."; done > "$work/large.txt"
( ulimit -f 100; exec "$bin" prepare --data "$work/large.txt" --out "$work/tokens" ) > /dev/null 2> "$work/prep.err"
status=$?
[ "$status" = 1 ] || fail "prepare under ulimit -f: exit status $status, not 1"
grep -q "writing the token files in '$work/tokens' failed: File too large (no token file is left)" "$work/prep.err" \
  || { fail "prepare under ulimit -f: unclear message:"; cat "$work/prep.err"; }
[ -z "$(ls -A "$work/tokens" 2>/dev/null)" ] || fail "prepare under ulimit -f left files: $(ls "$work/tokens")"

# 5. Resume bookkeeping, on the first run's directory (its checkpoint at step stopped + 10).
rm "$work/shared/metrics.jsonl"
"$bin" train --out "$work/shared" --resume --set train.max_iters=$((stopped + 10)) > "$work/nometrics.json" 2>/dev/null \
  || fail "resume without metrics.jsonl failed"
python3 - "$work/a.json" "$work/nometrics.json" <<'PY' || fail "without metrics.jsonl the final train loss is not the checkpoint's"
import json, sys
a, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:])
assert a["train_loss"] == b["train_loss"] and b["train_loss"] != 0, (a, b)
PY
if "$bin" train --out "$work/shared" --resume --set train.max_iters=3 > /dev/null 2> "$work/back.err"; then
  fail "train.max_iters below the checkpoint's step was accepted"
fi
grep -q "train.max_iters = 3 is below the checkpoint's step $((stopped + 10))" "$work/back.err" || { fail "max_iters message:"; cat "$work/back.err"; }

[ "$fails" = 0 ] || exit 1
echo "hostile_run: two writers, divergence, SIGHUP, ulimit -f and resume bookkeeping all hold"
