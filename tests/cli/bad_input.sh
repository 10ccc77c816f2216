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
# For inputs that used to hang (a FIFO with no writer): a hang fails the check
# with status 124 instead of hanging ctest.
tft() { timeout 30 "$bin" "$@"; }
mkfifo "$work/fifo"

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
expect_error "block size beyond any data" "block size 1073741824 needs at least 1073741825 tokens, but the train split has" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o11" --set model.block_size=1073741824
expect_error "width beyond any memory" "of memory (model.n_layer=1, model.n_embd=2147483647" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o12" --set model.n_embd=2147483647 --set model.n_head=1
expect_error "evaluation batches beyond any memory" "eval.iters=2000000000" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o13" --set eval.iters=2000000000
expect_error "count beyond 32 bits" "'train.grad_accum' must be at most 2147483647" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o18" --set train.grad_accum=1000000000000000000
# Attention kinds and positional schemes: names, combinations, kind-specific keys.
expect_error "unknown attention kind" "model.attention: unknown kind \"flash\" (known: softmax, linear, " -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o19" --set model.attention=flash
expect_error "ALiBi with linear attention" "model.positional \"alibi\" does not combine with model.attention \"linear\"" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o20" --set model.attention=linear --set model.positional=alibi
expect_error "a feature map with softmax attention" "model.feature_map = \"cos\" applies to model.attention \"linear\" only" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o21" --set model.feature_map=cos
expect_error "a kind-specific key of the wrong type" "model.rel_clip' must be an integer" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o22" --set model.positional=shaw --set model.rel_clip=wide
# Keys that would be ignored, values that cannot train, keys given twice.
expect_error "feature_redraw without favor" "model.feature_redraw = 100 applies to model.feature_map \"favor\" only" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o23" --set model.attention=linear --set model.feature_map=elu1 --set model.feature_redraw=100
expect_error "eval.mem_len without a memory" "'eval.mem_len' = 8 applies only to a model with a memory; this model has none (model.mem_len = 0)" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o24" --set eval.mem_len=8
expect_error "momentum 2" "'optimizer.momentum' must be in [0, 1) (as a float), got 2" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o25" --set optimizer.name=sgd --set optimizer.momentum=2
echo '{"train": {"batch_size": 4, "max_iters": 20, "batch_size": 8}}' > "$work/dupkey.json"
expect_error "duplicate key" "config '$work/dupkey.json': key 'train.batch_size' appears twice" -- tf train --config "$work/dupkey.json" --data "$work/text.txt" --out "$work/o26"
printf '{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},\n "model": {"dropout": 0.1}}\n' > "$work/dupsection.json"
expect_error "a repeated model section" "config '$work/dupsection.json': key 'model' appears twice" -- tf train --config "$work/dupsection.json" --data "$work/text.txt" --out "$work/o27"
latin1_name="$work/caf$(printf '\xe9').txt"
cp "$work/text.txt" "$latin1_name"
expect_error "non-UTF-8 data path" "is not valid UTF-8 (bad byte 0xE9 at offset" -- tf train --config "$work/tiny.json" --data "$latin1_name" --out "$work/o28"
expect_error "non-UTF-8 data path, the advice" "a checkpoint stores it as JSON: rename the file" -- tf train --config "$work/tiny.json" --data "$latin1_name" --out "$work/o28"
expect_error "sentencepiece vocabulary too small" "data.vocab_size = 100 is too small for this text" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o29" --set data.tokenizer=sentencepiece --set data.vocab_size=100
# A text corpus that does not fit in memory (a 200 MB address space for a 40
# MB text held as text and ids): the advice is token files, not a smaller model.
yes "The quick brown fox jumps over the lazy dog." | head -c 40000000 > "$work/big.txt"
expect_error "corpus beyond memory" "write it as token files with 'tapeformer prepare --data $work/big.txt --out DIR'" -- \
  env MALLOC_ARENA_MAX=1 sh -c 'ulimit -v 200000 && exec "$@"' sh "$bin" train --config "$work/tiny.json" --data "$work/big.txt" --out "$work/o37" --threads 1
rm -f "$work/big.txt"
# FIFOs (no writer: opening one blocks) and devices are refused before they are opened.
expect_error "FIFO as data file" "data file '$work/fifo' is a FIFO, not a regular file" -- tft train --config "$work/tiny.json" --data "$work/fifo" --out "$work/o30"
expect_error "FIFO as config" "config '$work/fifo' is a FIFO, not a regular file" -- tft train --config "$work/fifo" --data "$work/text.txt" --out "$work/o31"
# Token directories: a FIFO among the files, a truncated tokenizer.bin.
if ! "$bin" prepare --data "$work/text.txt" --out "$work/tokens" > /dev/null 2>&1; then
  echo "FAIL: prepare did not write token files"; failures=$((failures + 1))
fi
cp -r "$work/tokens" "$work/tokens_fifo"; rm "$work/tokens_fifo/val.bin"; mkfifo "$work/tokens_fifo/val.bin"
expect_error "FIFO in a token directory" "token file '$work/tokens_fifo/val.bin' is a FIFO, not a regular file" -- tft train --config "$work/tiny.json" --data "$work/tokens_fifo" --out "$work/o32"
cp -r "$work/tokens" "$work/tokens_fifo2"; rm "$work/tokens_fifo2/tokenizer.bin"; mkfifo "$work/tokens_fifo2/tokenizer.bin"
expect_error "FIFO as tokenizer.bin" "tokenizer file '$work/tokens_fifo2/tokenizer.bin' is a FIFO, not a regular file" -- tft train --config "$work/tiny.json" --data "$work/tokens_fifo2" --out "$work/o33"
cp -r "$work/tokens" "$work/tokens_trunc"; truncate -s 20 "$work/tokens_trunc/tokenizer.bin"
expect_error "truncated tokenizer.bin" "tokenizer file '$work/tokens_trunc/tokenizer.bin' is truncated or damaged" -- tf train --config "$work/tiny.json" --data "$work/tokens_trunc" --out "$work/o34"

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
expect_error "FIFO as checkpoint" "checkpoint '$work/fifo' is a FIFO, not a regular file" -- tft sample --checkpoint "$work/fifo" --tokens 5
mkdir -p "$work/fiforun"; mkfifo "$work/fiforun/checkpoint.bin"
expect_error "FIFO as a run's checkpoint.bin" "checkpoint '$work/fiforun/checkpoint.bin' is a FIFO" -- tft eval --checkpoint "$work/fiforun" --data "$work/text.txt"
expect_error "FIFO as --weights" "safetensors '$work/fifo' is a FIFO, not a regular file" -- tft sample --checkpoint "$work/run" --weights "$work/fifo" --tokens 5
expect_error "FIFO as --prompt-file" "--prompt-file '$work/fifo' is a FIFO, not a regular file" -- tft sample --checkpoint "$work/run" --prompt-file "$work/fifo" --tokens 5
expect_error "a text file as checkpoint" "not a tapeformer checkpoint" -- tf sample --checkpoint "$work/text.txt" --tokens 5
expect_error "--resume without a checkpoint" "--resume: no checkpoint at" -- tf train --out "$work/nothing" --resume
expect_error "no data file" "no data file" -- tf train --config "$work/tiny.json" --out "$work/o16"
expect_error "endless binary data" "data file '/dev/zero' is a character device, not a regular file" -- tf train --config "$work/tiny.json" --data /dev/zero --out "$work/o17"
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
expect_error "negative temperature" "--temperature: must be a finite number >= 0, got '-1'" --usage tf sample --checkpoint "$work/run" --temperature -1
expect_error "negative top-k" "--top-k: must be an integer in [0, 2147483647], got '-1'" --usage tf sample --checkpoint "$work/run" --top-k -1
expect_error "top-p above 1" "--top-p: must be a number in (0, 1], got '2'" --usage tf sample --checkpoint "$work/run" --top-p 2
# Numbers past a flag's type are refused with the range, not capped.
expect_error "--tokens past int64" "--tokens: must be an integer in [0, 2147483647], got '9223372036854775808'" --usage tft sample --checkpoint "$work/run" --tokens 9223372036854775808
expect_error "--seed past uint64" "--seed: must be an integer in [0, 18446744073709551615], got '18446744073709551616'" --usage tft sample --checkpoint "$work/run" --seed 18446744073709551616
expect_error "--top-k past int32" "--top-k: must be an integer in [0, 2147483647], got '4294967296'" --usage tft sample --checkpoint "$work/run" --top-k 4294967296
expect_error "--context past int64" "--context: must be an integer in [0, 2147483647], got '99999999999999999999'" --usage tf eval --checkpoint "$work/run" --data "$work/text.txt" --context 99999999999999999999
expect_error "--threads past int32" "--threads: must be an integer in [0, 1024], got '4294967297'" --usage tf --threads 4294967297 sample --checkpoint "$work/run"
expect_error "--vocab-size past int64" "--vocab-size: must be an integer in [0, 2147483647], got '9223372036854775808'" --usage tf prepare --data "$work/text.txt" --out "$work/o35" --vocab-size 9223372036854775808
expect_error "--val-fraction 1" "--val-fraction: must be a number in (0, 1), got '1'" --usage tf prepare --data "$work/text.txt" --out "$work/o36" --val-fraction 1
expect_error "infinite temperature" "--temperature: must be a finite number >= 0, got 'inf'" --usage tf sample --checkpoint "$work/run" --temperature inf
# Prompts from a file or stdin, beyond the 128 KiB a command-line argument holds.
for i in $(seq 4000); do echo "The quick brown fox jumps over the lazy dog, line 1."; done > "$work/long_prompt.txt"
checks=$((checks + 1))
if [ "$("$bin" sample --checkpoint "$work/run" --prompt-file "$work/long_prompt.txt" --tokens 5 2>/dev/null | head -c 212000 | cmp - "$work/long_prompt.txt" 2>&1)" != "" ] ||
   ! "$bin" sample --checkpoint "$work/run" --prompt-file "$work/long_prompt.txt" --tokens 5 > /dev/null 2>&1; then
  echo "FAIL: a 212000-byte --prompt-file was not continued"; failures=$((failures + 1))
fi
checks=$((checks + 1))
if [ "$(printf 'The quick' | "$bin" sample --checkpoint "$work/run" --prompt - --tokens 5 2>/dev/null | head -c 9)" != "The quick" ]; then
  echo "FAIL: --prompt - did not read the prompt from stdin"; failures=$((failures + 1))
fi
expect_error "missing --prompt-file" "--prompt-file '$work/nope.txt': cannot open" -- tf sample --checkpoint "$work/run" --prompt-file "$work/nope.txt"
expect_error "binary --prompt-file" "--prompt-file '$work/binary.bin' looks binary" -- tf sample --checkpoint "$work/run" --prompt-file "$work/binary.bin"
expect_error "binary prompt on stdin" "--prompt - (stdin) looks binary (NUL byte at offset 3)" -- sh -c 'printf "abc\0" | "$1" sample --checkpoint "$2" --prompt -' sh "$bin" "$work/run"
# Weights that overflow: every byte after the header 0x7F, each float 3.4e38
# (finite, so the file loads): eval and sample refuse the non-finite result,
# naming the file; nothing on stdout.
if "$bin" export --checkpoint "$work/run" -o "$work/good.safetensors" > /dev/null; then
  header=$(od -An -t u8 -N8 "$work/good.safetensors" | tr -d ' ')
  cp "$work/good.safetensors" "$work/huge.safetensors"
  head -c $(( $(stat -c %s "$work/good.safetensors") - 8 - header )) /dev/zero | tr '\0' '\177' |
    dd of="$work/huge.safetensors" bs=4096 seek=$((8 + header)) oflag=seek_bytes conv=notrunc status=none
  # Inconsistent files the import refuses before loading anything: a NaN weight
  # (every byte 0xFF), a tensor name given twice (JSON would keep the last).
  cp "$work/good.safetensors" "$work/nan.safetensors"
  head -c $(( $(stat -c %s "$work/good.safetensors") - 8 - header )) /dev/zero | tr '\0' '\377' |
    dd of="$work/nan.safetensors" bs=4096 seek=$((8 + header)) oflag=seek_bytes conv=notrunc status=none
  python3 - "$work/good.safetensors" "$work/twice.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
text = b[8:8 + n].decode().rstrip(" ")
h = json.loads(text)
name = "transformer.wte.weight"
text = text[:-1] + ',"' + name + '":' + json.dumps(h[name]) + "}"
t = text.encode() + b" " * (-len(text.encode()) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
fi
expect_error "eval on overflowing weights" "the model's loss on the data is " -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --weights "$work/huge.safetensors"
expect_error "eval on overflowing weights, file named" "the weights in '$work/huge.safetensors' are not usable" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --weights "$work/huge.safetensors"
expect_error "sample on overflowing weights" "the weights in '$work/huge.safetensors' are not usable" -- tf sample --checkpoint "$work/run" --weights "$work/huge.safetensors" --prompt "The" --tokens 5
expect_error "NaN weights in a safetensors file" "safetensors '$work/nan.safetensors': tensor 'transformer.wte.weight' holds a NaN or an infinity at element 0" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --weights "$work/nan.safetensors"
expect_error "a tensor name twice in a safetensors header" "safetensors '$work/twice.safetensors': tensor 'transformer.wte.weight' appears twice in the header" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --weights "$work/twice.safetensors"
# A byte order mark is dropped from a text corpus: it is not in the vocabulary.
{ printf '\xef\xbb\xbf'; cat "$work/text.txt"; } > "$work/bom.txt"
if ! "$bin" train --config "$work/tiny.json" --data "$work/bom.txt" --out "$work/bomrun" > /dev/null 2>&1; then
  echo "FAIL: training on a text with a byte order mark failed"; failures=$((failures + 1))
fi
expect_error "no U+FEFF in the vocabulary" "(U+FEFF) at byte offset 0 is not in the vocabulary" -- tf sample --checkpoint "$work/bomrun" --prompt "$(printf '\xef\xbb\xbf')The" --tokens 5
expect_error "bad TAPEFORMER_THREADS" "TAPEFORMER_THREADS" -- env TAPEFORMER_THREADS=abc "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o15"

# TAPEFORMER_THREADS sets the default thread count of a run.
checks=$((checks + 1))
if ! TAPEFORMER_THREADS=1 "$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/threads1" 2>/dev/null |
    grep -q '"threads": 1,'; then
  echo "FAIL: TAPEFORMER_THREADS=1 did not give a 1-thread run"; failures=$((failures + 1))
fi

# --version names the release, the checkpoint format this build reads and the vector width it was compiled for.
checks=$((checks + 1))
if ! "$bin" --version | grep -Eq '^tapeformer [0-9]+\.[0-9]+\.[0-9]+ \(checkpoint format [0-9]+; 16-float packets in [0-9]+-float registers.*\)$'; then
  echo "FAIL: --version printed '$("$bin" --version 2>&1)'"; failures=$((failures + 1))
fi

# kNN-LM stores: from another model, another vocabulary, damaged, too small for k; flags out of range.
for i in $(seq 40); do echo "Zebras and yaks quarrel over jam, line $i!"; done > "$work/other_text.txt"
"$bin" train --config "$work/tiny.json" --data "$work/other_text.txt" --out "$work/otherrun" > /dev/null 2>&1 ||
  { echo "FAIL: training on another text failed"; failures=$((failures + 1)); }
if ! "$bin" knn build --checkpoint "$work/run" --data "$work/text.txt" --out "$work/run.knn" > /dev/null 2>&1; then
  echo "FAIL: knn build did not write a store"; failures=$((failures + 1))
fi
keys=$(( $(wc -c < "$work/text.txt") - 1 ))
expect_error "kNN store of another model" "kNN store '$work/run.knn' was built from another model or other weights" -- tf eval --checkpoint "$work/rope" --data "$work/text.txt" --knn "$work/run.knn"
expect_error "kNN store of another vocabulary" "kNN store '$work/run.knn' was built with another vocabulary" -- tf sample --checkpoint "$work/otherrun" --knn "$work/run.knn" --tokens 5
head -c $(( $(stat -c %s "$work/run.knn") / 2 )) "$work/run.knn" > "$work/trunc.knn"
expect_error "truncated kNN store" "kNN store '$work/trunc.knn': truncated" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/trunc.knn"
cp "$work/run.knn" "$work/corrupt.knn"
printf '\xff\xff\xff\xff' | dd of="$work/corrupt.knn" bs=1 seek=200 conv=notrunc status=none
expect_error "corrupted kNN store" "kNN store '$work/corrupt.knn': corrupted (checksum mismatch)" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/corrupt.knn"
expect_error "a checkpoint as kNN store" "not a tapeformer kNN store" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$ckpt"
expect_error "missing kNN store" "kNN store '$work/nope.knn': cannot open" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/nope.knn"
expect_error "FIFO as kNN store" "kNN store '$work/fifo' is a FIFO, not a regular file" -- tft sample --checkpoint "$work/run" --knn "$work/fifo" --tokens 5
expect_error "k larger than the store" "--knn-k 100000 exceeds the $keys keys of kNN store '$work/run.knn'" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-k 100000
expect_error "--knn-lambda above 1" "--knn-lambda: must be a number in [0, 1], got '1.5'" --usage tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-lambda 1.5
expect_error "negative --knn-lambda" "--knn-lambda: must be a number in [0, 1], got '-0.1'" --usage tf sample --checkpoint "$work/run" --knn "$work/run.knn" --knn-lambda -0.1
expect_error "--knn-temperature 0" "--knn-temperature: must be a finite number > 0, got '0'" --usage tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-temperature 0
expect_error "--knn-k 0" "--knn-k: must be an integer in [1, 2147483647], got '0'" --usage tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-k 0
expect_error "--knn-nprobe on an exact store" "--knn-nprobe applies to an ivf store" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-nprobe 4
expect_error "lambda 1 and a token no neighbour has" "has probability 0 (none of its 1 neighbours has it)" -- tf eval --checkpoint "$work/run" --data "$work/text.txt" --knn "$work/run.knn" --knn-lambda 1 --knn-k 1
expect_error "knn build on a missing data file" "'$work/nope.txt': cannot open" -- tf knn build --checkpoint "$work/run" --data "$work/nope.txt" --out "$work/o.knn"
expect_error "knn build of an unknown index" "--index" --usage tf knn build --checkpoint "$work/run" --data "$work/text.txt" --out "$work/o.knn" --index annoy
expect_error "knn build of too many ivf cells" "ivf with nlist 1000 learns its cells from at least 39000 rows (39 per cell), but the first add has $keys" -- tf knn build --checkpoint "$work/run" --data "$work/text.txt" --out "$work/o.knn" --index ivf --nlist 1000
expect_error "knn build with text outside the vocabulary" "not in the vocabulary" -- tf knn build --checkpoint "$work/run" --data "$work/other_text.txt" --out "$work/o.knn"
expect_error "knn without build" "subcommand" --usage tf knn
# SPALM (model.arch "spalm"): a Transformer-XL reading a store of its retriever.
spalm=(--set model.arch=spalm --set model.positional=txl --set model.mem_len=8)
expect_error "SPALM without a memory" "set model.mem_len > 0" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o38" --set model.arch=spalm
expect_error "SPALM without a store" "model.spalm_store is required" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o39" "${spalm[@]}"
expect_error "SPALM from a retriever of another architecture" "model.spalm_init: the retriever's model.mem_len is 0, this run's 8" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o40" "${spalm[@]}" --set model.spalm_store="$work/run.knn" --set model.spalm_retriever="$work/run"
expect_error "SPALM with K above the store's keys" "model.spalm_k = $keys needs $((keys + 1)) keys" -- tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/o41" "${spalm[@]}" --set model.spalm_store="$work/run.knn" --set model.spalm_retriever="$work/run" --set model.spalm_k=$keys --set model.spalm_init=false
# A SPALM run samples through its own retriever and store, and takes no --knn.
checks=$((checks + 1))
if ! tf train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/spalm_run" "${spalm[@]}" --set model.spalm_store="$work/run.knn" --set model.spalm_retriever="$work/run" --set model.spalm_k=2 --set model.spalm_init=false --set train.max_iters=2 >/dev/null 2>"$work/stderr" ||
   ! tf sample --checkpoint "$work/spalm_run" --tokens 5 --prompt "ab" >/dev/null 2>>"$work/stderr"; then
  echo "FAIL [SPALM trains and samples]:"; sed 's/^/    /' "$work/stderr"; failures=$((failures + 1))
fi
expect_error "SPALM sampled with --knn" "retrieves from its own store (model.spalm_store)" -- tf sample --checkpoint "$work/spalm_run" --knn "$work/run.knn" --tokens 5
checks=$((checks + 1))
if [ -e "$work/o.knn" ] || find "$work" -name '.o.knn.tmp*' | grep -q .; then
  echo "FAIL: a failed knn build left a store or a temp file"; failures=$((failures + 1))
fi

# Nothing half-written: no temp files are left, and failed runs leave no directory.
checks=$((checks + 1))
if find "$work" -name '.checkpoint.bin.tmp*' | grep -q .; then
  echo "FAIL: temporary checkpoint files left behind"; failures=$((failures + 1))
fi
for d in o1 o2 o3 o4 o5 o6 o7 o8 o9 o10 o11 o12 o13 o14 o15 o16 o17 o18 o19 o20 o21 o22 o23 o24 o25 o26 o27 o28 \
         o29 o30 o31 o32 o33 o34 o35 o36 o37 o38 o39 o40 o41; do
  if [ -e "$work/$d" ]; then echo "FAIL: failed run $d left a directory behind"; failures=$((failures + 1)); fi
done

echo "$((checks - failures)) passed, $failures failed"
[ $failures -eq 0 ]
