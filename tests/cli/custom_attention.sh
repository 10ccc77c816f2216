#!/usr/bin/env bash
# examples/custom_attention as a user builds it: against the installed
# package, with no C++ standard of its own (CMAKE_CXX_STANDARD=14 on the
# command line, which the package's cxx_std_17 must override), headers as
# <tapeformer/...>. Its program registers two attention kinds (one a score
# modifier in the library's kernel), an MLP kind, an optimizer and a model
# kind and hands over to tapeformer::cli_main: train, resume (equal to one
# straight run), sample and eval must work on those kinds, and the
# stock command must refuse the checkpoint with the hint to use that program.
# Usage: custom_attention.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=${1:?usage: custom_attention.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: custom_attention.sh BUILD_DIR SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # a step's output only when it fails
  "$@" > "$work/log" 2>&1 || { cat "$work/log"; fail "$*"; }
}
run cmake --install "$build" --prefix "$work/prefix"
[ -e "$work/prefix/include/tapeformer/cli/cli.h" ] || fail "tapeformer/cli/cli.h not installed"
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
run cmake -S "$src/examples/custom_attention" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_STANDARD=14 -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}"
run cmake --build "$work/build"
mine="$work/build/my_tapeformer"
stock="$work/prefix/bin/tapeformer"

for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done > "$work/text.txt"
config="$src/examples/custom_attention/config.json"
common=(--config "$config" --data "$work/text.txt" --threads 2 --set log.interval=20 --set eval.interval=20)

# train_resume NAME [ARGS...]: one straight run of 60 steps into $work/NAME_straight, and 40 + resume
# to 60 into $work/NAME; the final lines must agree, and the model must learn.
train_resume() {
  local name=$1
  shift
  "$mine" train "${common[@]}" "$@" --out "$work/${name}_straight" --set train.max_iters=60 \
    > "$work/${name}_straight.json" 2> "$work/log" || { cat "$work/log"; fail "train $name"; }
  "$mine" train "${common[@]}" "$@" --out "$work/$name" --set train.max_iters=40 > /dev/null 2> "$work/log" ||
    { cat "$work/log"; fail "train $name 40"; }
  "$mine" train --out "$work/$name" --resume --set train.max_iters=60 --threads 2 > "$work/${name}_resumed.json" \
    2> "$work/log" || { cat "$work/log"; fail "resume $name"; }
  python3 - "$name" "$work/${name}_straight.json" "$work/${name}_resumed.json" <<'PY'
import json, sys
name = sys.argv[1]
a, b = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[2:4])
for key in ("train_loss", "val_loss"):
    assert a[key] == b[key], f"{name}: resume differs from a straight run: {key} {a[key]} vs {b[key]}"
# Uniform over the ~25 characters is ln 25 = 3.2 nats; the text is very regular.
assert a["val_loss"] < 1.5, f"{name} did not learn: val_loss {a['val_loss']}"
print(f"custom_attention: {name} trained and resumed identically, val_loss {a['val_loss']:.4f}")
PY
  out=$("$mine" sample --checkpoint "$work/$name" --prompt "the " --tokens 40 --seed 1 2> "$work/log") ||
    { cat "$work/log"; fail "sample $name"; }
  [ "${#out}" -ge 40 ] || fail "$name: sample printed ${#out} characters: $out"
}

train_resume run  # sigmoid attention, relu2 MLP, Lion (the config's kinds)
# A score modifier of its own in the library's attention kernel (softcap.h), with ALiBi's terms before it
# (the config's sigmoid_bias belongs to the sigmoid kind: a config of its own without it).
python3 - "$config" "$work/softcap.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["model"]["sigmoid_bias"]
c["model"].update({"attention": "softcap", "softcap": 5.0, "positional": "alibi"})
json.dump(c, open(sys.argv[2], "w"))
PY
common=(--config "$work/softcap.json" "${common[@]:2}")
train_resume softcap
common=(--config "$config" "${common[@]:2}")
# A model that is not a Transformer (model.arch "char_mlp") through the same Trainer.
train_resume mlp --set model.arch=char_mlp --set model.char_mlp_context=6

# Messages name the running program, not the stock binary that would refuse these kinds.
"$mine" train "${common[@]}" --out "$work/stopped" --set train.max_iters=100000 > /dev/null 2> "$work/stopped.log" &
pid=$!
for _ in $(seq 1 100); do [ -e "$work/stopped/checkpoint.bin" ] || [ -s "$work/stopped/metrics.jsonl" ] && break; sleep 0.1; done
kill -TERM "$pid"
wait "$pid" && fail "a SIGTERM'd run exited with 0"
grep -q "continue with: my_tapeformer train --out $work/stopped --resume" "$work/stopped.log" ||
  { cat "$work/stopped.log"; fail "the interruption message does not name my_tapeformer"; }

# The library's conformance checks on the program's own kinds: parameters, causality, generation, resume, gradient.
"$mine" check --kind model.attention=softcap --kind model.attention=sigmoid --kind model.mlp=relu2 \
  --kind model.arch=char_mlp > "$work/check.txt" 2>&1 || { cat "$work/check.txt"; fail "check on the program's kinds"; }
grep -q '^model.attention "softcap": gradient ok$' "$work/check.txt" || { cat "$work/check.txt"; fail "softcap's gradient"; }
grep -q '^check: 4 kinds, 0 failed$' "$work/check.txt" || { cat "$work/check.txt"; fail "check's summary"; }

"$mine" eval --checkpoint "$work/run" --data "$work/text.txt" > "$work/eval.json" 2> "$work/log" ||
  { cat "$work/log"; fail "eval"; }
grep -q '"loss"' "$work/eval.json" || fail "eval printed no loss: $(cat "$work/eval.json")"

# The stock command does not know the kinds: one error line with the hint.
if "$stock" sample --checkpoint "$work/run" --tokens 5 > /dev/null 2> "$work/stock.err"; then
  fail "the stock command sampled a checkpoint of kinds it does not have"
fi
grep -q "known only to a program that registers" "$work/stock.err" || { cat "$work/stock.err"; fail "no hint"; }
# Its `kinds` lists its four; against the stock docs/kinds.md that is drift.
"$mine" kinds --markdown > "$work/kinds.md"
for k in '`sigmoid`' '`softcap`' '`relu2`' '`lion`' '`char_mlp`' '`optimizer.lion_beta2`' '`model.sigmoid_bias`'; do
  grep -qF "$k" "$work/kinds.md" || fail "kinds --markdown lists no $k"
done
if diff -q "$src/docs/kinds.md" "$work/kinds.md" > /dev/null; then fail "docs/kinds.md matches a listing with more kinds"; fi
echo "custom_attention: sample, eval, kinds and the stock command's refusal as expected"
