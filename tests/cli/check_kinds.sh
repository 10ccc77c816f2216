#!/usr/bin/env bash
# `check` on broken attention and memory kinds (tests/cli/broken_kinds.cpp)
# fails, naming the kind and the check each breaks, with exit status 1; on a
# correct kind it passes; and training a miscounted kind is refused when its
# model is built, naming the kind.
# Usage: check_kinds.sh BROKEN_KINDS_BINARY
set -u
bin=${1:?usage: check_kinds.sh BROKEN_KINDS_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_failed KIND CHECK [FAMILY]: check fails on KIND, naming it and CHECK.
expect_failed() {
  local kind=$1 check=$2 family=${3:-model.attention}
  if "$bin" check --kind "$family=$kind" > "$work/out" 2> "$work/err"; then
    fail "check passed on $family \"$kind\""; cat "$work/out"; return
  fi
  grep -q "^$family \"$kind\": $check FAILED" "$work/out" ||
    { fail "no '$check FAILED' line for \"$kind\""; cat "$work/out" "$work/err"; }
  grep -q "^check: 1 kinds, 1 failed$" "$work/out" || fail "no summary line for \"$kind\""
}
expect_failed miscounted parameters
expect_failed leaky causality
expect_failed forgetful generation
# A memory that moves on only while a gradient is recorded: sampling reads with it empty.
expect_failed pooled_when_training generation memory
grep -q 'segment 2 of 3' "$work/out" || fail "the generation failure does not say which segment: $(cat "$work/out")"
# A memory kind's wrong count names the memory entry, not only the model.
expect_failed pooled_miscounted parameters memory
grep -q 'memory "pooled_miscounted": its entry counts 4 parameters (MemoryKind::parameters) but it adds 0' "$work/out" ||
  fail "the miscount does not name the memory entry: $(cat "$work/out")"
# The same memory, right: every check passes, generation over three segments.
if ! "$bin" check --kind memory=pooled > "$work/out" 2>&1; then
  fail "check failed on the right pooled memory"; cat "$work/out"
fi
grep -q '^memory "pooled": generation ok (over 3 segments' "$work/out" ||
  fail "pooled: generation did not cross segments: $(cat "$work/out")"

if ! "$bin" check --kind model.attention=softmax > "$work/out" 2>&1; then
  fail "check failed on the library's softmax attention"; cat "$work/out"
fi
for c in parameters causality generation resume gradient; do
  grep -q "^model.attention \"softmax\": $c ok$" "$work/out" || fail "softmax: no '$c ok' line"
done
"$bin" check --kind model.attention > "$work/out" 2>&1 && fail "check took --kind without a NAME"
grep -q "FAMILY=NAME" "$work/out" || fail "no hint for a --kind without a NAME: $(cat "$work/out")"
"$bin" check --kind model.attention=nosuch > "$work/out" 2>&1 && fail "check took an unknown kind"
grep -q 'unknown kind "nosuch"' "$work/out" || fail "an unknown kind is not named: $(cat "$work/out")"

# A wrong parameter count no longer trains without complaint.
for i in $(seq 200); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done > "$work/text.txt"
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "attention": "miscounted"},
 "train": {"batch_size": 2, "max_iters": 2}}
JSON
if "$bin" train --data "$work/text.txt" --out "$work/run" --config "$work/cfg.json" > /dev/null 2> "$work/err"; then
  fail "a model with a miscounted kind trained"
fi
grep -q 'model.attention "miscounted": its entry counts' "$work/err" || { fail "the refusal does not name the kind"; cat "$work/err"; }
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "positional": "txl", "mem_len": 8,
           "pooled_miscounted_len": 1},
 "train": {"batch_size": 2, "max_iters": 2}}
JSON
if "$bin" train --data "$work/text.txt" --out "$work/run2" --config "$work/cfg.json" > /dev/null 2> "$work/err"; then
  fail "a model with a miscounted memory kind trained"
fi
grep -q 'memory "pooled_miscounted": its entry counts' "$work/err" ||
  { fail "the refusal does not name the memory kind"; cat "$work/err"; }

if [ "$failures" -gt 0 ]; then echo "check_kinds: $failures failure(s)"; exit 1; fi
echo "check_kinds: five broken kinds each failed their check by name; softmax and pooled passed"
