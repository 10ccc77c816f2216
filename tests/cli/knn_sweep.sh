#!/usr/bin/env bash
# bench/knn_sweep's grid points equal `tapeformer eval --knn` at the same
# (k, lambda): a tiny model, an ivf store the sweep builds itself, grid
# points at k below the sweep's largest (the k nearest are a prefix of its
# search). Usage: knn_sweep.sh path/to/tapeformer path/to/knn_sweep
set -u
bin=${1:?usage: knn_sweep.sh TAPEFORMER_BINARY KNN_SWEEP_BINARY}
sweep=${2:?usage: knn_sweep.sh TAPEFORMER_BINARY KNN_SWEEP_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > "$work/tiny.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "positional": "txl", "mem_len": 8},
 "train": {"batch_size": 4, "max_iters": 30}, "schedule": {"warmup_iters": 2, "decay_iters": 30},
 "eval": {"interval": 30, "iters": 2, "final_iters": 2}, "checkpoint": {"interval": 30}, "log": {"interval": 10}}
JSON
for i in $(seq 80); do echo "The quick brown fox jumps over the lazy dog, line $i."; done > "$work/text.txt"
"$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run" > /dev/null 2> "$work/train.log" ||
  { cat "$work/train.log"; echo "FAIL: training"; exit 1; }

# The sweep builds the store (missing), then reuses it (present: build_s -1).
for pass in build reuse; do
  "$sweep" --checkpoint "$work/run" --data "$work/text.txt" --store "$work/s.knn" --nlist 8 --nprobe 2 \
    --ks 3,8 --lambdas 0,0.3,0.7 --out "$work/sweep" > "$work/$pass.json" 2> "$work/$pass.err" ||
    { fail "knn_sweep ($pass): $(tail -1 "$work/$pass.err")"; continue; }
done
grep -q '"build_s": -1' "$work/reuse.json" || fail "knn_sweep rebuilt a store that was there: $(cat "$work/reuse.json")"
[ "$(wc -l < "$work/sweep/metrics.jsonl")" -eq 5 ] || fail "metrics.jsonl: $(cat "$work/sweep/metrics.jsonl")"

field() { sed -n "s/.*\"$2\": \([-0-9.e]*\)[,}].*/\1/p" <<< "$1"; }
close() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= tol) }'; }
sweep_out=$(cat "$work/reuse.json")
for point in "3 0.3 0p3" "8 0.7 0p7" "3 0.7 0p7"; do
  set -- $point
  eval_out=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val --knn "$work/s.knn" \
             --knn-k "$1" --knn-lambda "$2") || { fail "eval --knn-k $1 --knn-lambda $2"; continue; }
  a=$(field "$sweep_out" "bpc_k$1_lambda$3"); b=$(field "$eval_out" bpc)
  # eval prints 6 decimals: equal to its rounding.
  close "$a" "$b" 6e-7 && echo "ok   k $1 lambda $2: sweep $a, eval $b" ||
    fail "k $1 lambda $2: sweep bpc '$a', eval '$eval_out'"
done
# lambda 0: the model alone (eval's plain path, the same numbers up to float sums).
plain=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val)
close "$(field "$sweep_out" bpc_k3_lambda0)" "$(field "$plain" bpc)" 1e-5 ||
  fail "lambda 0: sweep '$(field "$sweep_out" bpc_k3_lambda0)', plain eval '$plain'"
close "$(field "$sweep_out" lm_bpc)" "$(field "$sweep_out" bpc_k8_lambda0)" 0 || fail "lm_bpc differs from lambda 0"

# --in-vocabulary-only: characters the tokenizer lacks are dropped and counted.
printf 'The quick \xc3\xa9 brown fox \xff jumps.\n%.0s' $(seq 40) > "$work/foreign.txt"
if "$sweep" --checkpoint "$work/run" --data "$work/foreign.txt" --store "$work/f.knn" --nlist 4 --nprobe 4 \
     --ks 2 --lambdas 0.3 --in-vocabulary-only --out "$work/foreign" > "$work/foreign.json" 2> "$work/foreign.err"; then
  grep -q '"dropped": 80,' "$work/foreign.json" || fail "in-vocabulary-only: $(cat "$work/foreign.json")"
  grep -q $'\xc3' "$work/foreign/foreign.txt.in_vocabulary.txt" && fail "in-vocabulary-only kept a foreign character"
else
  fail "knn_sweep --in-vocabulary-only: $(tail -1 "$work/foreign.err")"
fi

[ $failures -eq 0 ] && echo "knn_sweep: all passed"
[ $failures -eq 0 ]
