#!/usr/bin/env bash
# tapeformer calibrate on a tiny early-exit run: --dry-run leaves the run as
# it was; a grid search writes a threshold that eval and sample then exit
# with (--report-layers shows the mean layers used and the speed; --full-depth
# gives the same text, --exit-threshold another threshold); a run without exits, a
# directory without a checkpoint and a sweep over the checkpoint are refused
# with one error line.
# Usage: calibrate.sh path/to/tapeformer
set -u
bin=${1:?usage: calibrate.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 3, "n_head": 2, "n_embd": 32, "block_size": 16, "arch": "early_exit"},
 "train": {"batch_size": 8, "max_iters": 120, "threads": 1},
 "eval": {"interval": 60, "iters": 2, "final_iters": 2}, "log": {"interval": 20}}
JSON
for i in $(seq 400); do echo "line $((i % 7)): the cat sat on the mat, $((i % 13)) times."; done > "$work/text.txt"
"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/run" > /dev/null 2>&1 \
  || { echo "FAIL: training the early-exit run"; exit 1; }
cp "$work/run/checkpoint.bin" "$work/before.bin"

out=$("$bin" calibrate --checkpoint "$work/run" --dry-run --splits 10 2>&1) || { echo "FAIL: dry run: $out"; exit 1; }
case "$out" in *'"written": false}'*) ;; *) echo "FAIL: dry run output: $out"; exit 1 ;; esac
cmp -s "$work/run/checkpoint.bin" "$work/before.bin" || { echo "FAIL: --dry-run changed the checkpoint"; exit 1; }

out=$("$bin" calibrate --checkpoint "$work/run" --method grid --delta 0.5 --splits 10 --sweep "$work/sweep.jsonl" 2>&1) \
  || { echo "FAIL: grid: $out"; exit 1; }
case "$out" in *'"threshold": null'*|*'"written": false'*) echo "FAIL: grid chose nothing or wrote nothing: $out"; exit 1 ;; esac
[ "$(wc -l < "$work/sweep.jsonl")" -gt 10 ] || { echo "FAIL: the sweep has a line per threshold"; exit 1; }
! cmp -s "$work/run/checkpoint.bin" "$work/before.bin" || { echo "FAIL: the threshold was not written"; exit 1; }
out=$("$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --report-layers 2>&1) || { echo "FAIL: eval: $out"; exit 1; }
mean=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["layers"]["exit_layers_mean"][0])' "$out") \
  || { echo "FAIL: eval reports no exit_layers_mean: $out"; exit 1; }
python3 -c "import sys; sys.exit(0 if float('$mean') < 3 else 1)" || { echo "FAIL: no position left early ($mean)"; exit 1; }
err=$("$bin" sample --checkpoint "$work/run" --tokens 20 --report-layers 2>&1 > /dev/null)
case "$err" in *"sample: exit_layers_mean "*) ;; *) echo "FAIL: sample --report-layers: $err"; exit 1 ;; esac
case "$err" in *"sample: tokens_per_s "*"sample: ms_per_token "*) ;; *) echo "FAIL: sample's speed: $err"; exit 1 ;; esac
# Skipping the layers after an exit, or running them (--full-depth): the same text.
skip=$("$bin" sample --checkpoint "$work/run" --tokens 40 --seed 3 2>/dev/null) || { echo "FAIL: sample"; exit 1; }
full=$("$bin" sample --checkpoint "$work/run" --tokens 40 --seed 3 --full-depth 2>/dev/null) || { echo "FAIL: --full-depth"; exit 1; }
[ "$skip" = "$full" ] || { echo "FAIL: --full-depth changed the text: '$skip' against '$full'"; exit 1; }
# --exit-threshold 2: no exits, so no figures; -1: every position leaves after layer 1.
err=$("$bin" sample --checkpoint "$work/run" --tokens 5 --report-layers --exit-threshold 2 2>&1 > /dev/null)
case "$err" in *"logged no figures"*) ;; *) echo "FAIL: --exit-threshold 2: $err"; exit 1 ;; esac
err=$("$bin" sample --checkpoint "$work/run" --tokens 5 --report-layers --exit-threshold -1 2>&1 > /dev/null)
case "$err" in *"sample: exit_layers_mean 1"*) ;; *) echo "FAIL: --exit-threshold -1: $err"; exit 1 ;; esac
err=$("$bin" sample --checkpoint "$work/run" --tokens 5 --exit-threshold nan 2>&1); rc=$?
[ $rc -eq 2 ] || { echo "FAIL: --exit-threshold nan: rc $rc, '$err'"; exit 1; }

sed 's/"arch": "early_exit"/"arch": "transformer"/' "$work/cfg.json" > "$work/plain.json"
"$bin" train --config "$work/plain.json" --data "$work/text.txt" --out "$work/plain" > /dev/null 2>&1 \
  || { echo "FAIL: training the plain run"; exit 1; }
err=$("$bin" sample --checkpoint "$work/plain" --tokens 5 --exit-threshold 0.5 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = 'tapeformer: error: sample --exit-threshold: the checkpoint'"'"'s model is model.arch "transformer", not "early_exit"' ] \
  || { echo "FAIL: --exit-threshold on a plain run: rc $rc, '$err'"; exit 1; }
err=$("$bin" sample --checkpoint "$work/plain" --tokens 5 --full-depth 2>&1); rc=$?
[ $rc -eq 1 ] && case "$err" in *'sample --full-depth: model.arch "transformer" with model.block "standard" stops no position early'*) true ;; *) false ;; esac \
  || { echo "FAIL: --full-depth on a plain run: rc $rc, '$err'"; exit 1; }
err=$("$bin" calibrate --checkpoint "$work/plain" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = 'tapeformer: error: calibrate: the run'"'"'s model.arch is "transformer", which has no exits (train one with model.arch early_exit)' ] \
  || { echo "FAIL: a run without exits: rc $rc, '$err'"; exit 1; }
err=$("$bin" calibrate --checkpoint "$work/nothing" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: calibrate: '$work/nothing' is not a run directory with a checkpoint.bin (calibrate writes the threshold into it)" ] \
  || { echo "FAIL: no run: rc $rc, '$err'"; exit 1; }
err=$("$bin" calibrate --checkpoint "$work/run" --sweep "$work/run/checkpoint.bin" 2>&1); rc=$?
[ $rc -eq 1 ] || { echo "FAIL: a sweep over the checkpoint: rc $rc, '$err'"; exit 1; }
echo "calibrate: OK"
