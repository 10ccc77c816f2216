#!/usr/bin/env bash
# import-hf end to end on a fixture GPT-2 (tests/fixtures/hf_gpt2/small_a):
# the imported run samples, evaluates and fine-tunes with an optimizer and
# schedule of the user's choice (`train --resume` from step 0), resumes
# again only under the usual rules, and exports a directory that imports
# again. Refusals: a second import over a run, a model key changed on the
# first resume, a model GPT-2 cannot express at export.
# Usage: import_hf.sh TAPEFORMER FIXTURES_DIR DOCS_DIR (its pages are the text)
set -u
tf=${1:?usage: import_hf.sh TAPEFORMER FIXTURES_DIR DOCS_DIR}
fixtures=${2:?usage: import_hf.sh TAPEFORMER FIXTURES_DIR DOCS_DIR}
docs=${3:?usage: import_hf.sh TAPEFORMER FIXTURES_DIR DOCS_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# ok CMD...: exits 0; refused PATTERN CMD...: exits 1 with stderr matching PATTERN.
ok() { "$@" > "$work/out" 2> "$work/err" || { fail "$*: exit status $?"; cat "$work/err"; }; }
refused() {
  local pattern=$1
  shift
  "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$*: exit status $rc, not 1"
  grep -Eq "$pattern" "$work/err" || { fail "$*: stderr does not match '$pattern'"; cat "$work/err"; }
}
cat "$docs"/*.md > "$work/text.txt"

ok "$tf" import-hf "$fixtures/hf_gpt2/small_a" --out "$work/run"
grep -q "40320 parameters" "$work/out" || fail "import-hf does not report the parameter count"
refused "already holds a checkpoint" "$tf" import-hf "$fixtures/hf_gpt2/small_a" --out "$work/run"
ok "$tf" sample --checkpoint "$work/run" --prompt "The" --tokens 5
ok "$tf" eval --checkpoint "$work/run" --data "$work/text.txt"
refused "model and tokenizer are fixed \(model.n_layer" \
  "$tf" train --resume --out "$work/run" --data "$work/text.txt" --set model.n_layer=3
# Any optimizer and schedule on the first resume: nothing was trained with the imported defaults.
ok "$tf" train --resume --out "$work/run" --data "$work/text.txt" --set train.max_iters=6 --set train.batch_size=4 \
  --set optimizer.name=sgd --set optimizer.lr=0.01 --set schedule.name=constant --set model.dropout=0
grep -q '"steps": 6' "$work/out" || { fail "the fine-tune did not run 6 steps"; cat "$work/out"; }
# From then on, the usual rules.
refused "only train.max_iters" "$tf" train --resume --out "$work/run" --data "$work/text.txt" --set train.max_iters=8 \
  --set optimizer.lr=0.02
ok "$tf" train --resume --out "$work/run" --data "$work/text.txt" --set train.max_iters=8
ok "$tf" export --format hf --checkpoint "$work/run" -o "$work/hf"
for f in config.json model.safetensors vocab.json merges.txt tokenizer.json tokenizer_config.json; do
  [ -f "$work/hf/$f" ] || fail "export --format hf wrote no $f"
done
ok "$tf" import-hf "$work/hf" --out "$work/again"
refused "is a file" "$tf" export --format hf --checkpoint "$work/run" -o "$work/text.txt"
# A char-level run exports its vocabulary as tokenizers' WordLevel, one token per character.
ok "$tf" train --config "$fixtures/../../configs/quickstart.json" --data "$work/text.txt" --out "$work/char" \
  --set train.max_iters=2 --set model.n_layer=1
ok "$tf" export --format hf --checkpoint "$work/char" -o "$work/char-hf"
grep -q '"WordLevel"' "$work/char-hf/tokenizer.json" || fail "the char export wrote no WordLevel tokenizer.json"
# A memory is nothing GPT-2 has.
ok "$tf" train --config "$fixtures/../../configs/quickstart.json" --data "$work/text.txt" --out "$work/xl" \
  --set train.max_iters=2 --set model.n_layer=1 --set model.mem_len=8 --set model.positional=txl
refused "model.positional \"txl\"" "$tf" export --format hf --checkpoint "$work/xl" -o "$work/xl-hf"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "import_hf: all checks passed"
