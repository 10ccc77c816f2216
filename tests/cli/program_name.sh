#!/usr/bin/env bash
# A program built on tapeformer::cli_main is named in every message by the
# name it was run as: the stock binary run as `mylm`, and broken_kinds (a
# program of its own kinds, tests/cli/broken_kinds.cpp) run as `ownlm`. Their
# error lines say "mylm: error:", --help and --version name them, an
# interrupted run says "mylm: ... continue with: mylm train". A kind unknown
# to a program of the user's own says that program does not register it,
# never to run another program instead of itself; the stock command, under
# any name, sends the user to the program that registers the kind.
# Usage: program_name.sh TAPEFORMER BROKEN_KINDS
set -u
stock=${1:?usage: program_name.sh TAPEFORMER BROKEN_KINDS}
own=${2:?usage: program_name.sh TAPEFORMER BROKEN_KINDS}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ln -s "$(realpath "$stock")" "$work/mylm"
ln -s "$(realpath "$own")" "$work/ownlm"

# expect STATUS PATTERN NAME ARGS...: `NAME ARGS` exits with STATUS and its stderr matches PATTERN (grep -E).
expect() {
  local status=$1 pattern=$2 name=$3
  shift 3
  "$work/$name" "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  [ "$rc" -eq "$status" ] || fail "$name $*: exit status $rc, not $status"
  grep -Eq "$pattern" "$work/err" || { fail "$name $*: stderr does not match '$pattern'"; cat "$work/err"; }
  if grep -q "tapeformer: " "$work/err"; then fail "$name $*: names the stock tapeformer"; cat "$work/err"; fi
}

for name in mylm ownlm; do
  expect 2 "^$name: error: unknown command 'nosuch' \(expected train, " "$name" nosuch
  expect 2 "^$name: error: The following argument was not expected: --bogus \(see --help\)$" "$name" train --bogus
  expect 1 "^$name: error: .*$work/none.json" "$name" train --config "$work/none.json" --data /dev/null --out "$work/x"
  "$work/$name" --help > "$work/help" 2>&1 || fail "$name --help"
  head -1 "$work/help" | grep -q "^$name: train small Transformer language models on a CPU$" ||
    { fail "$name --help's title does not name $name"; head -3 "$work/help"; }
  grep -q "^Usage: $name \[OPTIONS\] SUBCOMMAND$" "$work/help" || fail "$name --help's usage does not name $name"
  if grep -q "tapeformer:" "$work/help"; then fail "$name --help names tapeformer as the program"; fi
  "$work/$name" train --help 2>&1 | grep -q "^Usage: $name train \[OPTIONS\]" || fail "$name train --help's usage"
  "$work/$name" --version | grep -Eq "^$name \(tapeformer [0-9]+\.[0-9]+\.[0-9]+; checkpoint format [0-9]+; " ||
    fail "$name --version printed '$("$work/$name" --version 2>&1)'"
done

# A kind the user's own program does not register: it names itself and how kinds are registered.
expect 1 "^ownlm: error: model.attention: unknown kind \"nosuch\" \(known: .*\); ownlm does not register this kind \('ownlm kinds' lists the ones it has\): .*tapeformer::cli_main" \
  ownlm check --kind model.attention=nosuch
if grep -q "instead of\|run that program" "$work/err"; then fail "ownlm is told to run another program"; cat "$work/err"; fi

# A kind only ownlm registers: the stock command, under any name, sends the user to the program that
# registers it; so for a checkpoint of ownlm's (refused for that kind or for a key of one of ownlm's kinds).
expect 1 "^mylm: error: model.attention: unknown kind \"leaky\" .*: run that program instead of the stock command$" \
  mylm check --kind model.attention=leaky
for i in $(seq 200); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done > "$work/text.txt"
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "attention": "leaky"},
 "train": {"batch_size": 2, "max_iters": 2}}
JSON
"$work/ownlm" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/leaky" --threads 2 \
  > /dev/null 2> "$work/err" || { fail "ownlm trained no model of its kind"; cat "$work/err"; }
expect 1 "^mylm: error: .*known only to a program that registers" mylm sample --checkpoint "$work/leaky" --tokens 5

# An interrupted run names the program in its last line and in the command that continues it.
sed 's/"max_iters": 2/"max_iters": 1000000/; s/"leaky"/"softmax"/' "$work/cfg.json" > "$work/long.json"
"$work/mylm" train --config "$work/long.json" --data "$work/text.txt" --out "$work/stopped" --threads 2 \
  > /dev/null 2> "$work/stopped.log" &
pid=$!
for _ in $(seq 1 200); do [ -s "$work/stopped/metrics.jsonl" ] && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid" && fail "a SIGTERM'd run exited with 0"
grep -q "^mylm: .*continue with: mylm train --out $work/stopped --resume" "$work/stopped.log" ||
  { fail "the interruption does not name mylm"; cat "$work/stopped.log"; }

# The stock command under its own name is unchanged.
"$stock" nosuch 2>&1 | grep -q "^tapeformer: error: unknown command 'nosuch'" || fail "the stock command's error line"
"$stock" --help | head -1 | grep -q "^tapeformer: train small" || fail "the stock command's --help"

if [ "$failures" -gt 0 ]; then echo "program_name: $failures failure(s)"; exit 1; fi
echo "program_name: mylm and ownlm were named in every message; the kind hints fit each program"
