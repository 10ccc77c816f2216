#!/usr/bin/env bash
# Bad input gets one error line and a non-zero exit from the real binary, and
# never leaves a half-written file. Usage: bad_input.sh path/to/tapeformer
set -u
bin=${1:?usage: bad_input.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
checks=0

# expect_error NAME EXPECTED_SUBSTRING -- command...        (an error: exit status 1)
# expect_error NAME EXPECTED_SUBSTRING --usage command...   (a command-line mistake: 2)
expect_error() {
  local name=$1 want=$2 want_status=1
  [ "$3" = "--usage" ] && want_status=2
  shift 3
  checks=$((checks + 1))
  local out err status
  out=$("$@" 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  if [ $status -ne $want_status ]; then
    echo "FAIL [$name]: exit status $status (want $want_status)"; failures=$((failures + 1)); return
  fi
  if [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [ -z "$err" ]; then
    echo "FAIL [$name]: want exactly one error line, got:"; printf '%s\n' "$err" | sed 's/^/    /'
    failures=$((failures + 1)); return
  fi
  if ! printf '%s' "$err" | grep -qF -- "$want"; then
    echo "FAIL [$name]: error '$err' does not contain '$want'"; failures=$((failures + 1)); return
  fi
  if [ -n "$out" ]; then
    echo "FAIL [$name]: unexpected stdout: $out"; failures=$((failures + 1)); return
  fi
  echo "ok   [$name] $err"
}

# A tiny config so the successful run below takes a second.
cat > "$work/tiny.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "train": {"batch_size": 4, "max_iters": 20}, "schedule": {"warmup_iters": 2, "decay_iters": 20},
 "eval": {"interval": 10, "iters": 2, "final_iters": 2}, "checkpoint": {"interval": 10}, "log": {"interval": 5}}
JSON
for i in $(seq 40); do echo "The quick brown fox jumps over the lazy dog, line $i."; done > "$work/text.txt"
tf() { "$bin" "$@"; }

# Data files.
expect_error "missing data file" "'$work/nope.txt': cannot open" -- tf train --config "$work/tiny.json" --data "$work/nope.txt" --out "$work/o1"
: > "$work/empty.txt"
expect_error "empty data file" "is empty" -- tf train --config "$work/tiny.json" --data "$work/empty.txt" --out "$work/o2"
head -c 3000 /dev/urandom > "$work/binary.bin"; printf '\0' >> "$work/binary.bin"
expect_error "binary data file" "binary" -- tf train --config "$work/tiny.json" --data "$work/binary.bin" --out "$work/o3"
printf 'caf\xe9 au lait\n' > "$work/latin1.txt"
expect_error "non-UTF-8 data file" "UTF-8" -- tf train --config "$work/tiny.json" --data "$work/latin1.txt" --out "$work/o4"
expect_error "data is a directory" "$work" -- tf train --config "$work/tiny.json" --data "$work" --out "$work/o5"

# Configs.
echo '{"model": {"n_layers": 2}}' > "$work/unknown.json"
expect_error "unknown config key" "unknown key 'model.n_layers' (did you mean 'model.n_layer'?)" -- tf train --config "$work/unknown.json" --data "$work/text.txt" --out "$work/o6"
echo '{"train": {"batch_size": "twelve"}}' > "$work/type.json"
expect_error "wrong value type" "'train.batch_size' must be an integer" -- tf train --config "$work/type.json" --data "$work/text.txt" --out "$work/o7"
expect_error "bad --set" "--set: unknown key 'train.iters'" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o8" --set train.iters=3
expect_error "invalid JSON" "invalid JSON" -- tf train --config "$work/text.txt" --data "$work/text.txt" --out "$work/o9"
expect_error "block size larger than the data" "block size 4096" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o10" --set model.block_size=4096
# Sizes whose tensors would not fit anywhere: refused before allocating (2^58
# used to wrap the element count to a small buffer and crash).
expect_error "block size beyond any memory" "model.block_size=1073741824" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o11" --set model.block_size=1073741824
expect_error "width beyond any memory" "of memory (model.n_layer=1, model.n_embd=2147483647" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o12" --set model.n_embd=2147483647 --set model.n_head=1
expect_error "evaluation batches beyond any memory" "eval.iters=2000000000" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o13" --set eval.iters=2000000000
expect_error "count beyond 32 bits" "'train.grad_accum' must be at most 2147483647" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o18" --set train.grad_accum=1000000000000000000
# Attention kinds and positional schemes: names, combinations, kind-specific keys.
expect_error "unknown attention kind" "model.attention: unknown kind \"flash\" (known: softmax, linear, " -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o19" --set model.attention=flash
expect_error "ALiBi with linear attention" "model.positional \"alibi\" does not combine with model.attention \"linear\"" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o20" --set model.attention=linear --set model.positional=alibi
expect_error "a feature map with softmax attention" "model.feature_map = \"cos\" applies to model.attention \"linear\" only" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o21" --set model.feature_map=cos
expect_error "a kind-specific key of the wrong type" "model.rel_clip' must be an integer" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o22" --set model.positional=shaw --set model.rel_clip=wide

# A real run to get a checkpoint, then damaged copies of it.
if ! "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run" > "$work/run.json" 2> "$work/run.log"; then
  echo "FAIL: the tiny training run did not succeed:"; cat "$work/run.log"; exit 1
fi
ckpt="$work/run/checkpoint.bin"
mkdir -p "$work/trunc" "$work/corrupt"
head -c $(( $(stat -c %s "$ckpt") / 2 )) "$ckpt" > "$work/trunc/checkpoint.bin"
expect_error "truncated checkpoint" "truncated" -- tf sample --checkpoint "$work/trunc" --tokens 5
cp "$ckpt" "$work/corrupt/checkpoint.bin"
printf '\xff\xff\xff\xff' | dd of="$work/corrupt/checkpoint.bin" bs=1 seek=200 conv=notrunc status=none
expect_error "corrupted checkpoint" "corrupted" -- tf sample --checkpoint "$work/corrupt" --tokens 5
expect_error "missing checkpoint" "cannot open" -- tf sample --checkpoint "$work/nothing" --tokens 5
expect_error "a text file as checkpoint" "not a tapeformer checkpoint" -- tf sample --checkpoint "$work/text.txt" --tokens 5
expect_error "--resume without a checkpoint" "--resume: no checkpoint at" -- tf train --out "$work/nothing" --resume
expect_error "no data file" "no data file" -- tf train --config "$work/tiny.json" --out "$work/o16"
expect_error "endless binary data" "'/dev/zero' looks binary (NUL byte at offset 0)" -- tf train --config "$work/tiny.json" --data /dev/zero --out "$work/o17"
printf 'a' > "$work/one.txt"
expect_error "eval on a one-character file" "fewer than 2 tokens" -- tf eval --checkpoint "$work/run" --data "$work/one.txt"
cp -r "$work/run" "$work/resume"
expect_error "checkpoint from an incompatible config" "model.n_embd" -- tf train --config "$work/tiny.json" --set model.n_embd=32 --data "$work/text.txt" --out "$work/resume" --resume
expect_error "prompt outside the vocabulary" "not in the vocabulary" -- tf sample --checkpoint "$work/run" --prompt "Zebra§" --tokens 5
echo "Zebras § unknown" > "$work/other.txt"
expect_error "eval on text outside the vocabulary" "not in the vocabulary" -- tf eval --checkpoint "$work/run" --data "$work/other.txt"
expect_error "eval on non-UTF-8 text" "not valid UTF-8" -- tf eval --checkpoint "$work/run" --data "$work/latin1.txt"
expect_error "eval past a learned table" "eval: context 17 exceeds the 16 positions of model.positional \"learned\"" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --context 17
expect_error "sample past a learned table" "sample: context 17 exceeds the 16 positions" -- tf sample --checkpoint "$work/run" --prompt "The" --tokens 5 --context 17
expect_error "negative --context" "--context" --usage tf eval --checkpoint "$work/run" --data "$work/text.txt" --context -1

# A scheme without a table evaluates and samples past the block size.
checks=$((checks + 1))
if ! "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/rope" --set model.positional=rope > /dev/null 2>&1 ||
   ! "$bin" eval --checkpoint "$work/rope" --data "$work/text.txt" --context 64 2>/dev/null | grep -q '"tokens": ' ||
   [ "$("$bin" sample --checkpoint "$work/rope" --prompt "The" --tokens 40 --context 64 2>/dev/null | head -c 43 | wc -c)" -ne 43 ]; then
  echo "FAIL: a rope model did not evaluate and sample with a context of 64 past its block size of 16"; failures=$((failures + 1))
fi
expect_error "train over an existing run without --resume" "already holds a checkpoint" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run"
expect_error "unknown subcommand" "frobnicate" --usage tf frobnicate
expect_error "no subcommand" "subcommand" --usage tf
expect_error "bad flag value" "--tokens" --usage tf sample --checkpoint "$work/run" --tokens many
expect_error "unknown flag" "--confg" --usage tf train --confg "$work/tiny.json"
expect_error "flag without its value" "--config" --usage tf train --config
expect_error "negative --threads" "--threads" --usage tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o14" --threads -5
expect_error "negative --seed" "--seed" --usage tf sample --checkpoint "$work/run" --seed -1
expect_error "negative --tokens" "--tokens" --usage tf sample --checkpoint "$work/run" --tokens -3
expect_error "negative temperature" "--temperature: must be a number >= 0, got -1" --usage tf sample --checkpoint "$work/run" --temperature -1
expect_error "negative top-k" "--top-k: must be a number >= 0" --usage tf sample --checkpoint "$work/run" --top-k -1
expect_error "top-p above 1" "--top-p: must be a number in (0, 1], got 2" --usage tf sample --checkpoint "$work/run" --top-p 2
expect_error "bad TAPEFORMER_THREADS" "TAPEFORMER_THREADS" -- env TAPEFORMER_THREADS=abc "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o15"

# TAPEFORMER_THREADS sets the default thread count of a run.
checks=$((checks + 1))
if ! TAPEFORMER_THREADS=1 "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/threads1" 2>/dev/null |
    grep -q '"threads": 1,'; then
  echo "FAIL: TAPEFORMER_THREADS=1 did not give a 1-thread run"; failures=$((failures + 1))
fi

# --version names the release and the checkpoint format this build reads.
checks=$((checks + 1))
if ! "$bin" --version | grep -Eq '^tapeformer [0-9]+\.[0-9]+\.[0-9]+ \(checkpoint format [0-9]+\)$'; then
  echo "FAIL: --version printed '$("$bin" --version 2>&1)'"; failures=$((failures + 1))
fi

# Nothing half-written: no temp files are left, and failed runs leave no directory.
checks=$((checks + 1))
if find "$work" -name '.checkpoint.bin.tmp*' | grep -q .; then
  echo "FAIL: temporary checkpoint files left behind"; failures=$((failures + 1))
fi
for d in o1 o2 o3 o4 o5 o6 o7 o8 o9 o10 o11 o12 o13 o14 o15 o16 o17 o18 o19 o20 o21 o22; do
  if [ -e "$work/$d" ]; then echo "FAIL: failed run $d left a directory behind"; failures=$((failures + 1)); fi
done

echo "$((checks - failures)) passed, $failures failed"
[ $failures -eq 0 ]
