#!/usr/bin/env bash
# `eval` reads a run with data.align (fixed-length records) as training
# validated it: the windows starting at multiples of data.align, each once.
# The corpus's validation split is two equal records, so every window training
# can draw is the same one and its final val loss is that window's loss
# exactly; reading the split as consecutive windows of block_size would
# straddle the two records and give another figure.
# Usage: eval_records.sh TAPEFORMER_BINARY
set -u
bin=${1:?usage: eval_records.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# 18 training records of "\n" and 8 letters, then the validation split: two equal records.
for i in $(seq 18); do printf '\n%s' "$(echo "hgfedcbaabcdefgh" | cut -c$((i % 8 + 1))-$((i % 8 + 8)))"; done > "$work/records.txt"
printf '\nabcdabcd\nabcdabcd' >> "$work/records.txt"
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
 "data": {"val_fraction": 0.0999, "align": 9},
 "train": {"batch_size": 4, "max_iters": 60},
 "optimizer": {"lr": 0.01},
 "eval": {"interval": 30, "iters": 1, "final_iters": 1}}
JSON
"$bin" train --config "$work/cfg.json" --data "$work/records.txt" --out "$work/run" > "$work/train.json" 2> "$work/err" ||
  { fail "training the records run failed"; cat "$work/err"; }
trained=$(sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p' "$work/train.json")
"$bin" eval --checkpoint "$work/run" --data "$work/records.txt" --split val > "$work/eval.json" 2> "$work/err" ||
  { fail "eval failed"; cat "$work/err"; }
read -r loss tokens < <(sed -n 's/.*"loss": \([0-9.]*\),.*"tokens": \([0-9]*\).*/\1 \2/p' "$work/eval.json")
[ -n "$trained" ] && [ -n "$loss" ] || fail "no val loss in training's line or eval's: $(cat "$work/train.json" "$work/eval.json")"
[ "$loss" = "$trained" ] || fail "eval --split val gives $loss, training's own validation $trained"
[ "$tokens" = 16 ] || fail "eval predicted $tokens tokens, not the 2 records' 8 each"
if [ "$failures" -gt 0 ]; then echo "eval_records: $failures failure(s)"; exit 1; fi
echo "eval_records: eval reads the val split's records as training did (loss $loss = $trained)"
