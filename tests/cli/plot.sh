#!/usr/bin/env bash
# tapeformer plot: two tiny runs drawn into one PNG; a directory without
# metrics and a missing -o are refused with one error line. --layer draws a
# Universal Transformer's halting figures: the mean against the step, the
# histogram at the last evaluation; a figure no run logs is refused naming
# those it logs.
# Usage: plot.sh path/to/tapeformer
set -u
bin=${1:?usage: plot.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "train": {"batch_size": 4, "max_iters": 30, "threads": 1},
 "eval": {"interval": 10, "iters": 2, "final_iters": 2}, "log": {"interval": 5}}
JSON
for i in $(seq 100); do echo "line $i: the cat sat on the mat."; done > "$work/text.txt"
for run in a b; do
  "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/$run" --set train.seed=$RANDOM \
    > /dev/null 2>&1 || { echo "FAIL: training run $run"; exit 1; }
done
out=$("$bin" plot "$work/a" "$work/b" -o "$work/curves.png" --log-y 2>&1) || { echo "FAIL: plot: $out"; exit 1; }
[ "$out" = "plot: wrote $work/curves.png (2 runs)" ] || { echo "FAIL: unexpected output: $out"; exit 1; }
[ "$(head -c 8 "$work/curves.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "FAIL: not a PNG"; exit 1; }
[ "$(stat -c %s "$work/curves.png")" -gt 5000 ] || { echo "FAIL: PNG too small to hold curves"; exit 1; }

"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/ut" --set model.block=universal \
  --set model.n_layer=3 > /dev/null 2>&1 || { echo "FAIL: training the universal run"; exit 1; }
grep -q '"layers":{"ponder_mean":\[' "$work/ut/metrics.jsonl" || { echo "FAIL: no halting figures logged"; exit 1; }
for figure in ponder_mean ponder_hist; do
  out=$("$bin" plot "$work/ut" -o "$work/$figure.png" --layer $figure 2>&1) || { echo "FAIL: plot --layer $figure: $out"; exit 1; }
  [ "$(stat -c %s "$work/$figure.png")" -gt 5000 ] || { echo "FAIL: $figure.png too small to hold a curve"; exit 1; }
done
err=$("$bin" plot "$work/ut" -o "$work/x.png" --layer spans 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: plot: run '$work/ut' logs no per-layer figure 'spans' (it logs ponder_mean, ponder_hist, ponder_by_position)" ] \
  || { echo "FAIL: unknown figure: rc $rc, '$err'"; exit 1; }
err=$("$bin" plot "$work/a" -o "$work/x.png" --layer ponder_mean 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: plot: run '$work/a' logs no per-layer figure 'ponder_mean' (it logs none)" ] \
  || { echo "FAIL: a run without figures: rc $rc, '$err'"; exit 1; }

err=$("$bin" plot "$work/nothing" -o "$work/x.png" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: plot: run '$work/nothing' has no metrics.jsonl (is it a run directory of tapeformer train?)" ] \
  || { echo "FAIL: missing run: rc $rc, '$err'"; exit 1; }
err=$("$bin" plot "$work/a" 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$err" = "tapeformer: error: --output is required (see --help)" ] \
  || { echo "FAIL: missing -o: rc $rc, '$err'"; exit 1; }
[ ! -e "$work/x.png" ] || { echo "FAIL: a refused plot wrote a file"; exit 1; }
echo "plot: OK"
