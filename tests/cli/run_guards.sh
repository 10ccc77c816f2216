#!/usr/bin/env bash
# What a run keeps survives the commands around it, through the real binary:
#   1. a command never writes over one of its own inputs or a run's files:
#      knn build, export and plot aimed at R/checkpoint.bin, knn build's
#      --out naming its --data, and train's --data naming its own metrics,
#      are refused naming both, and the run still resumes;
#   2. the lock guards the run, not a file: with R/train.lock deleted, a
#      --resume beside the running process is refused; with R deleted and
#      made again by a new run, the old process stops at its next write
#      instead of replacing the new run's checkpoint or metrics;
#   3. SIGINT, SIGTERM and SIGHUP stop the final evaluation, a periodic one
#      (the step's checkpoint saved, the run resumes), eval, knn build and
#      sample within 2 s;
#   4. smaller: a killed knn build's temp file is removed by the next build;
#      --profile with one step prints no "nan" and a --resume --profile that
#      times nothing keeps profile.json; a truncated tokenizer.bin is named
#      in words, not the serialisation library's.
# Usage: run_guards.sh TAPEFORMER
set -u
bin=${1:?usage: run_guards.sh TAPEFORMER}
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
for i in $(seq 300); do echo "Verse $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101))."; done > "$work/text.txt"
run() { "$bin" train --config "$work/cfg.json" --data "$work/text.txt" "$@"; }
# The step a run directory's checkpoint holds (a resume at that step runs no step and prints it).
saved_step() { "$bin" train --out "$1" --resume --set train.max_iters="$2" 2>/dev/null | python3 -c \
  'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["steps"])' 2>/dev/null || echo none; }
# Waits up to 30 s for a file.
wait_for() { for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.05; done; return 1; }

# ---- 1. no writer overwrites a run or its own input ----------------------------------------
run --out "$work/r" > /dev/null 2>&1 || fail "the first run failed"
cp "$work/r/checkpoint.bin" "$work/ckpt.before"
refused() {  # refused NAME WANT... -- COMMAND...: exits non-zero, names every WANT, leaves the checkpoint alone
  local name=$1 wants=() ; shift
  while [ "$1" != "--" ]; do wants+=("$1"); shift; done; shift
  if "$@" > /dev/null 2> "$work/$name.err"; then fail "$name: accepted"; fi
  for w in "${wants[@]}"; do grep -qF -- "$w" "$work/$name.err" || { fail "$name: the message does not name '$w':"; cat "$work/$name.err"; }; done
  cmp -s "$work/r/checkpoint.bin" "$work/ckpt.before" || { fail "$name: the run's checkpoint changed"; cp "$work/ckpt.before" "$work/r/checkpoint.bin"; }
}
refused knn_over_run "$work/r/checkpoint.bin" "is the input" -- \
  "$bin" knn build --checkpoint "$work/r" --data "$work/text.txt" --out "$work/r/checkpoint.bin"
refused export_over_run "$work/r/metrics.jsonl" "run directory" -- \
  "$bin" export --checkpoint "$work/r" -o "$work/r/metrics.jsonl"
refused export_over_input "$work/r/../r/checkpoint.bin" "$work/r/checkpoint.bin" -- \
  "$bin" export --checkpoint "$work/r/checkpoint.bin" -o "$work/r/../r/checkpoint.bin"
if command -v gnuplot > /dev/null; then
  refused plot_over_run "$work/r/checkpoint.bin" "run directory" -- "$bin" plot "$work/r" -o "$work/r/checkpoint.bin"
  refused plot_over_metrics "$work/r/metrics.jsonl" -- "$bin" plot "$work/r" -o "$work/r/metrics.jsonl"
fi
cp "$work/text.txt" "$work/text.copy"
refused knn_over_data "$work/text.txt" "is the input" -- \
  "$bin" knn build --checkpoint "$work/r" --data "$work/text.txt" --out "$work/text.txt"
cmp -s "$work/text.txt" "$work/text.copy" || { fail "knn build wrote over its own --data"; cp "$work/text.copy" "$work/text.txt"; }
cp "$work/r/metrics.jsonl" "$work/metrics.before"
refused train_data_is_metrics "$work/r/metrics.jsonl" "is the input" -- \
  "$bin" train --out "$work/r" --resume --data "$work/r/metrics.jsonl"
cmp -s "$work/r/metrics.jsonl" "$work/metrics.before" || { fail "train rewrote the metrics it was told to read"; cp "$work/metrics.before" "$work/r/metrics.jsonl"; }
[ "$(saved_step "$work/r" 20)" = 20 ] || fail "the run does not resume after the refused writes"

# ---- 2. the lock guards the run --------------------------------------------------------------
long() { exec "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --set train.max_iters=1000000 \
  --set checkpoint.interval=20 --set eval.interval=1000 --set log.interval=5 "$@"; }
# (long runs in the background only: it execs, so $! is the trainer's PID.)
# a. the lock file deleted: a --resume beside the running process is refused.
long --out "$work/a" > /dev/null 2> "$work/a.err" &
first=$!; pids+=($first)
wait_for "$work/a/checkpoint.bin" || fail "2a: the first run saved no checkpoint"
rm -f "$work/a/train.lock"
"$bin" train --out "$work/a" --resume > /dev/null 2> "$work/a2.err" &
second=$!; pids+=($second)
for _ in $(seq 100); do kill -0 "$second" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$second" 2>/dev/null; then
  fail "2a: a --resume into a run whose lock file was deleted runs beside it"; kill -9 "$second"
else
  wait "$second" && fail "2a: the second writer exited 0"
  grep -q "is in use by another process" "$work/a2.err" || { fail "2a: the second writer's message:"; cat "$work/a2.err"; }
fi
kill -TERM "$first"; wait "$first"; status=$?
[ "$status" = 143 ] || { fail "2a: the first run ended with $status, not 143"; cat "$work/a.err"; }
stopped=$(grep -o "stopped (SIGTERM) at step [0-9]*" "$work/a.err" | grep -o "[0-9]*$")
python3 - "$work/a/metrics.jsonl" "${stopped:-0}" <<'PY' || { fail "2a: metrics.jsonl is not one run's"; tail -3 "$work/a.err"; }
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == sorted(set(steps)) and steps[-1] <= int(sys.argv[2]), (steps[-3:], sys.argv[2])
PY
[ "$(saved_step "$work/a" "${stopped:-0}")" = "${stopped:-x}" ] || fail "2a: the checkpoint is not the one of step $stopped"

# b. the directory deleted and made again by a new run: the old process must not write into it.
long --out "$work/b" > /dev/null 2> "$work/b.err" &
old=$!; pids+=($old)
wait_for "$work/b/checkpoint.bin" || fail "2b: the old run saved no checkpoint"
# (a write of the old run landing meanwhile makes rm fail: again until the directory is gone)
for _ in $(seq 50); do rm -rf "$work/b" 2> /dev/null; [ -e "$work/b" ] || break; sleep 0.1; done
[ ! -e "$work/b" ] || fail "2b: the old run's directory could not be removed"
run --out "$work/b" --set train.max_iters=20 > /dev/null 2> "$work/b2.err" || { fail "2b: the new run failed"; cat "$work/b2.err"; }
for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$old" 2>/dev/null; then
  sleep 2  # (the old binary keeps training: give it time to do its damage)
  fail "2b: the old process still trains into the replaced directory"; kill -9 "$old"; wait "$old" 2>/dev/null
else
  wait "$old"; status=$?
  [ "$status" = 1 ] || fail "2b: the old process ended with $status"
  # (rm -rf may delete the old run's temp file before the directory: then its rename fails, also named)
  grep -q "was removed\|was replaced\|cannot save the checkpoint" "$work/b.err" || { fail "2b: the old process's message:"; cat "$work/b.err"; }
fi
python3 - "$work/b/metrics.jsonl" <<'PY' || fail "2b: the new run's metrics.jsonl was written by another process"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == [5, 10, 15, 20], steps
PY
[ "$(saved_step "$work/b" 20)" = 20 ] || fail "2b: the new run's checkpoint was replaced"

# ---- 3. a signal stops every long phase within 2 s -------------------------------------------
# A background job of a script starts with SIGINT ignored, unless job control is on.
set -m
# A wider model whose evaluations take tens of seconds.
slow=(--set model.n_embd=128 --set model.block_size=64 --set train.batch_size=16)
stops_within() {  # stops_within NAME SIGNAL PID STATUS: the process ends within 2 s with STATUS
  local name=$1 sig=$2 pid=$3 want=$4 t0 t1
  t0=$(date +%s.%N); kill -"$sig" "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  t1=$(date +%s.%N)
  if kill -0 "$pid" 2>/dev/null; then fail "$name: still running 5 s after SIG$sig"; kill -9 "$pid"; wait "$pid" 2>/dev/null; return; fi
  wait "$pid"; local status=$?
  [ "$status" = "$want" ] || fail "$name: exit status $status, not $want"
  python3 -c "import sys; sys.exit(0 if $t1 - $t0 <= 2.0 else 1)" || fail "$name: took $(python3 -c "print(round($t1 - $t0, 2))") s after SIG$sig"
}
"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/final" "${slow[@]}" --set train.max_iters=4 --set checkpoint.interval=4 --set eval.interval=100 \
  --set eval.final_iters=20000 > /dev/null 2> "$work/final.err" &
pid=$!; pids+=($pid)
wait_for "$work/final/checkpoint.bin" || fail "3: no checkpoint before the final evaluation"
sleep 0.5
stops_within final_eval INT "$pid" 130
grep -q "during the evaluation" "$work/final.err" || { fail "3: the final evaluation's message:"; cat "$work/final.err"; }

"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/periodic" "${slow[@]}" --set train.max_iters=8 --set checkpoint.interval=100 --set eval.interval=4 \
  --set eval.iters=20000 --set eval.final_iters=2 --set log.interval=1 > /dev/null 2> "$work/periodic.err" &
pid=$!; pids+=($pid)
for _ in $(seq 600); do grep -q '"step": 3' "$work/periodic/metrics.jsonl" 2>/dev/null && break; sleep 0.05; done
sleep 1  # step 4 is trained in milliseconds: this is inside its evaluation
stops_within periodic_eval TERM "$pid" 143
[ "$(saved_step "$work/periodic" 4)" = 4 ] || fail "3: the periodic evaluation's stop saved no checkpoint of step 4"

for i in $(seq 40); do cat "$work/text.txt"; done > "$work/long.txt"
"$bin" eval --checkpoint "$work/final" --data "$work/long.txt" > /dev/null 2>&1 &
pid=$!; pids+=($pid); sleep 1
kill -0 "$pid" 2>/dev/null && stops_within eval HUP "$pid" 129
"$bin" knn build --checkpoint "$work/final" --data "$work/long.txt" --out "$work/long.store" > /dev/null 2>&1 &
pid=$!; pids+=($pid); sleep 1
kill -0 "$pid" 2>/dev/null && stops_within knn_build INT "$pid" 130

"$bin" sample --checkpoint "$work/final" --tokens 100000000 > /dev/null 2>&1 &
pid=$!; pids+=($pid); sleep 1
kill -0 "$pid" 2>/dev/null && stops_within sample TERM "$pid" 143
set +m

# ---- 4. smaller ------------------------------------------------------------------------------
# A killed build's temp file (the suffix is a PID that runs no more) goes with the next build.
: > "$work/.small.store.tmp.999999999"
"$bin" knn build --checkpoint "$work/r" --data "$work/text.txt" --out "$work/small.store" > /dev/null 2>&1 \
  || fail "4: knn build failed"
[ -e "$work/.small.store.tmp.999999999" ] && fail "4: a killed knn build's temp file stays after the next build"

run --out "$work/one" --set train.max_iters=1 --profile > /dev/null 2> "$work/one.err" || fail "4: --profile with one step failed"
grep -qi "nan" "$work/one.err" && { fail "4: --profile with one step prints nan:"; grep -i nan "$work/one.err"; }
run --out "$work/prof" --set train.max_iters=6 --profile > /dev/null 2>&1 || fail "4: --profile failed"
cp "$work/prof/profile.json" "$work/profile.before"
"$bin" train --out "$work/prof" --resume --profile > /dev/null 2>&1 || fail "4: --resume --profile of a finished run failed"
cmp -s "$work/prof/profile.json" "$work/profile.before" || fail "4: --resume --profile of a finished run replaced profile.json"

"$bin" prepare --data "$work/text.txt" --out "$work/tok" > /dev/null 2>&1 || fail "4: prepare failed"
head -c 20 "$work/tok/tokenizer.bin" > "$work/tok/t" && mv "$work/tok/t" "$work/tok/tokenizer.bin"
if "$bin" train --config "$work/cfg.json" --data "$work/tok" --out "$work/tokrun" > /dev/null 2> "$work/tok.err"; then fail "4: a truncated tokenizer.bin was accepted"; fi
grep -q "tokenizer.bin" "$work/tok.err" || { fail "4: the message does not name tokenizer.bin:"; cat "$work/tok.err"; }
grep -q "Failed to read" "$work/tok.err" && { fail "4: the message is the serialisation library's:"; cat "$work/tok.err"; }

[ "$fails" = 0 ] && echo "run guards: all passed"
exit "$fails"
