#!/usr/bin/env bash
# kNN-LM through the real binary: train a tiny model for a few steps, build
# a store of each index kind, eval and sample with it. Usage: knn.sh path/to/tapeformer
set -u
bin=${1:?usage: knn.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > "$work/tiny.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "train": {"batch_size": 4, "max_iters": 30}, "schedule": {"warmup_iters": 2, "decay_iters": 30},
 "eval": {"interval": 30, "iters": 2, "final_iters": 2}, "checkpoint": {"interval": 30}, "log": {"interval": 10}}
JSON
for i in $(seq 60); do echo "The quick brown fox jumps over the lazy dog, line $i."; done > "$work/text.txt"
"$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run" > /dev/null 2> "$work/train.log" ||
  { cat "$work/train.log"; echo "FAIL: training"; exit 1; }

# One store per index kind, from the run's train split.
for kind in exact ivf hnsw; do
  if ! "$bin" knn build --checkpoint "$work/run" --data "$work/text.txt" --split train --out "$work/$kind.knn" \
       --index "$kind" > "$work/build_$kind.json" 2> "$work/build_$kind.err"; then
    fail "knn build --index $kind: $(cat "$work/build_$kind.err")"; continue
  fi
  grep -q '"keys": ' "$work/build_$kind.json" && grep -q "\"index\": \"$kind" "$work/build_$kind.json" ||
    fail "knn build --index $kind printed: $(cat "$work/build_$kind.json")"
  [ -s "$work/$kind.knn" ] || fail "knn build --index $kind wrote no store"
  # Piped stderr: no progress bar.
  [ -s "$work/build_$kind.err" ] && fail "knn build --index $kind wrote to a piped stderr: $(cat "$work/build_$kind.err")"
done

# Eval on the val split: the mixture changes the loss, lambda 0 leaves it exactly.
plain=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val) || fail "plain eval"
zero=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val --knn "$work/exact.knn" --knn-lambda 0) ||
  fail "eval --knn-lambda 0"
[ "${zero%%, \"lm_loss\"*}" = "${plain%\}}" ] || fail "lambda 0 gave '$zero', the model alone '$plain'"
for kind in exact ivf hnsw; do
  out=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val --knn "$work/$kind.knn" \
        --knn-k 8 --knn-lambda 0.3 --knn-temperature 2) || { fail "eval --knn $kind.knn"; continue; }
  echo "$out" | grep -q '"knn": {"keys": ' || fail "eval --knn $kind.knn printed: $out"
  loss=$(echo "$out" | sed 's/^{"loss": \([0-9.]*\),.*/\1/')
  lm=$(echo "$out" | sed 's/.*"lm_loss": \([0-9.]*\),.*/\1/')
  [ "$loss" != "$lm" ] || fail "eval --knn $kind.knn: the mixture's loss equals the model's ($out)"
  echo "ok   eval --knn $kind.knn: $out"
done

# Sampling: lambda 0 prints the model's own text; lambda 0.5 prints a continuation.
a=$("$bin" sample --checkpoint "$work/run" --prompt "The" --tokens 40 --seed 3) || fail "plain sample"
b=$("$bin" sample --checkpoint "$work/run" --prompt "The" --tokens 40 --seed 3 --knn "$work/hnsw.knn" --knn-lambda 0) ||
  fail "sample --knn-lambda 0"
[ "$a" = "$b" ] || fail "sample --knn-lambda 0 gave '$b', the model alone '$a'"
c=$("$bin" sample --checkpoint "$work/run" --prompt "The" --tokens 40 --seed 3 --knn "$work/ivf.knn" --knn-lambda 0.5) ||
  fail "sample --knn"
[ "${c:0:3}" = "The" ] && [ ${#c} -ge 40 ] || fail "sample --knn printed '$c'"
echo "ok   sample --knn: $c"

[ $failures -eq 0 ] && echo "knn: all passed"
[ $failures -eq 0 ]
