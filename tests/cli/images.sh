#!/usr/bin/env bash
# Images as records of pixel letters (scripts/digits.py's format, here a
# synthetic set so that no package is needed): data.align reads one image
# per window and refuses a val split that starts inside one; image_2d
# attention trains; sample --png draws a grid of sampled images as PNG and
# refuses bad shapes.
# Usage: images.sh path/to/tapeformer
set -u
bin=${1:?usage: images.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 200 images of 4 x 4: a bar whose row depends on the image, letters a (blank) to e (ink).
for i in $(seq 0 199); do
  r=$((i % 4)); img=""
  for p in $(seq 0 15); do if [ $((p / 4)) = $r ]; then img+="e"; else img+="a"; fi; done
  printf '\n%s' "$img"
done > "$work/images.txt"
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "positional": "learned",
           "attention": "image_2d", "image_width": 4, "image_block_rows": 2, "image_block_cols": 2,
           "image_memory_rows": 1, "image_memory_cols": 1},
 "data": {"align": 17, "val_fraction": 0.1},
 "train": {"batch_size": 8, "max_iters": 60, "threads": 1}, "eval": {"interval": 60, "iters": 2, "final_iters": 4}}
JSON
# 3400 characters, 10% = 340 = 20 images of 17: the split falls between two.
"$bin" train --config "$work/cfg.json" --data "$work/images.txt" --out "$work/run" > "$work/run.json" 2> "$work/run.log" \
  || fail "training on images: $(tail -1 "$work/run.log")"
"$bin" sample --checkpoint "$work/run" --tokens 16 --png "$work/grid.png" --image-width 4 --images 6 --seed 3 \
  > "$work/sample.txt" 2> "$work/sample.log" || fail "sample --png: $(tail -1 "$work/sample.log")"
[ "$(wc -l < "$work/sample.txt")" = 6 ] || fail "sample --png printed $(wc -l < "$work/sample.txt") lines, not 6 images"
# A PNG of 3 x 2 images of 4 x 4 pixels, 8 screen pixels each with 2-pixel gaps: 104 x 70.
head -c 8 "$work/grid.png" | od -An -tx1 | tr -d ' \n' | grep -q '^89504e470d0a1a0a$' || fail "grid.png is no PNG"
size=$(od -An -tu1 -j16 -N8 "$work/grid.png" | tr -s ' ' | sed 's/^ //')
[ "$size" = "0 0 0 104 0 0 0 70" ] || fail "grid.png is not 104 x 70 (IHDR width, height bytes: $size)"
grep -q "sample: 6 images written to $work/grid.png" "$work/sample.log" || fail "sample --png said: $(cat "$work/sample.log")"

refused() {  # refused EXPECTED_TEXT command...
  local want=$1; shift
  if "$@" > /dev/null 2> "$work/err"; then fail "accepted: $*"; return; fi
  grep -qF "$want" "$work/err" || fail "'$*' said: $(cat "$work/err")"
}
refused "must be a multiple of --image-width (5)" \
  "$bin" sample --checkpoint "$work/run" --tokens 16 --png "$work/bad.png" --image-width 5
refused "the train split has 3070 tokens, not whole records of 17" \
  "$bin" train --config "$work/cfg.json" --data "$work/images.txt" --out "$work/misaligned" --set data.val_fraction=0.097
echo '{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "positional": "txl", "mem_len": 8},
       "data": {"align": 17}}' > "$work/memory.json"
refused "does not combine with a segment memory" \
  "$bin" train --config "$work/memory.json" --data "$work/images.txt" --out "$work/memory"
[ -e "$work/bad.png" ] && fail "a refused sample wrote its PNG"

[ $fails -eq 0 ] && echo "images: aligned training, image_2d, sample --png and its refusals: OK"
exit $fails
