#!/usr/bin/env bash
# Progress on stderr for the commands that read for long: eval, knn build,
# calibrate and rl eval, each on a tiny run. With TAPEFORMER_PROGRESS_DELAY=0
# (show all work) each says first what it will do and how much, and ends
# with a "done" line, every line its own on a piped stderr; its stdout is the
# same one JSON line it prints when quick work stays quiet (the default,
# stderr then empty). On a terminal (script(1), when installed) the line is
# rewritten in place and stdout is still only the JSON line. A bad
# TAPEFORMER_PROGRESS_DELAY is one error line naming it.
# Usage: progress.sh path/to/tapeformer
set -u
bin=${1:?usage: progress.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > "$work/exit.json" <<'JSON'
{"model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16, "arch": "early_exit"},
 "train": {"batch_size": 4, "max_iters": 6, "threads": 1},
 "eval": {"interval": 6, "iters": 1, "final_iters": 1}, "log": {"interval": 3}}
JSON
cat > "$work/dt.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
 "train": {"batch_size": 4, "max_iters": 4, "threads": 1},
 "eval": {"interval": 4, "iters": 1, "final_iters": 1}, "log": {"interval": 2}}
JSON
for i in $(seq 300); do echo "line $((i % 7)): the cat sat on the mat, $((i % 13)) times."; done > "$work/text.txt"
"$bin" train --config "$work/exit.json" --data "$work/text.txt" --out "$work/exit" > /dev/null 2> "$work/train.err" ||
  { cat "$work/train.err"; echo "FAIL: training the early-exit run"; exit 1; }
"$bin" rl collect --env tmaze --option corridor=4 --policy random:0.5,expert:0.5 --episodes 20 --out "$work/maze.traj" \
  > /dev/null 2>&1 || { echo "FAIL: rl collect"; exit 1; }
"$bin" rl train --config "$work/dt.json" --data "$work/maze.traj" --out "$work/dt" > /dev/null 2> "$work/train.err" ||
  { cat "$work/train.err"; echo "FAIL: rl train"; exit 1; }

# The text's tokens (char tokenizer: its characters) and eval's windows of 16 over them.
count() { python3 -c 'import sys; n = len(open(sys.argv[1], encoding="utf-8").read()); print(format('"$1"', ","))' "$work/text.txt"; }
tokens=$(count n)
windows=$(count '-(-(n - 1) // 16)')

# progress NAME START_REGEX DONE_REGEX -- COMMAND...: stdout one JSON line,
# the same without and with progress ("seconds" aside); stderr empty without,
# and with: the start line first, the done line last, every line NAME's.
progress() {
  local name=$1 start=$2 done=$3 before=$failures
  shift 4
  local quiet shown
  if ! quiet=$("$@" 2> "$work/quiet.err"); then fail "$name (quiet): $(cat "$work/quiet.err")"; return; fi
  [ -s "$work/quiet.err" ] && fail "$name: quick work wrote to stderr: $(cat "$work/quiet.err")"
  if ! shown=$(TAPEFORMER_PROGRESS_DELAY=0 "$@" 2> "$work/shown.err"); then
    fail "$name: $(cat "$work/shown.err")"; return
  fi
  [ "$(printf '%s\n' "$shown" | wc -l)" -eq 1 ] &&
    python3 -c 'import json, sys; assert isinstance(json.loads(sys.argv[1]), dict)' "$shown" 2> /dev/null ||
    fail "$name: stdout is not one JSON line: '$shown'"
  local strip='s/"seconds": [0-9.]*//'
  [ "$(printf '%s' "$shown" | sed "$strip")" = "$(printf '%s' "$quiet" | sed "$strip")" ] ||
    fail "$name: stdout with progress '$shown' differs from stdout without '$quiet'"
  local first last
  first=$(head -n 1 "$work/shown.err")
  last=$(tail -n 1 "$work/shown.err")
  [[ "$first" =~ ^$name:\ $start$ ]] || fail "$name: the first stderr line is '$first', want /^$name: $start\$/"
  [[ "$last" =~ ^$name:\ $done$ ]] || fail "$name: the last stderr line is '$last', want /^$name: $done\$/"
  grep -v "^$name: " "$work/shown.err" && fail "$name: a stderr line above is not $name's"
  grep -q $'\r' "$work/shown.err" && fail "$name: a piped stderr got a line rewritten in place"
  [ $failures -eq "$before" ] && echo "ok   $name:"
  sed 's/^/       /' "$work/shown.err"
}

progress eval "reading $tokens tokens of '$work/text.txt' in $windows windows of 16" \
  "done, $windows windows in [0-9.]+s" -- "$bin" eval --checkpoint "$work/exit" --data "$work/text.txt"
progress "knn build" "reading $tokens tokens of '$work/text.txt' in $windows windows of 16" "done in [0-9.]+s" -- \
  "$bin" knn build --checkpoint "$work/exit" --data "$work/text.txt" --out "$work/store.knn"
# After the reading, the index: its start line follows the reading's done line.
grep -A1 "^knn build: done, $windows windows in " "$work/shown.err" |
  grep -q "^knn build: building an exact index of [0-9,]* keys and writing '$work/store.knn'$" ||
  fail "knn build: no indexing line after the reading's done line"
progress calibrate "reading 30 windows of 16 tokens of '$work/text.txt' \\(val split\\) 24 times \\(the full model and 23 thresholds\\): 720 windows" \
  "done, 720 windows in [0-9.]+s" -- "$bin" calibrate --checkpoint "$work/exit" --dry-run --windows 30 --splits 5
progress "rl eval" "playing 3 episodes of \"tmaze\" conditioned on return 1" \
  "done, 3 episodes in [0-9.]+s, mean return -?[0-9.]+" -- "$bin" rl eval --checkpoint "$work/dt" --target-return 1 --episodes 3

# A terminal: the start line, then one line rewritten in place; stdout (a file) is only the JSON line.
if command -v script > /dev/null; then
  before=$failures
  TAPEFORMER_PROGRESS_DELAY=0 script -qec "'$bin' eval --checkpoint '$work/exit' --data '$work/text.txt' > '$work/tty.json'" \
    "$work/tty.log" > /dev/null 2>&1 || fail "eval on a terminal: $(cat "$work/tty.log")"
  want=$("$bin" eval --checkpoint "$work/exit" --data "$work/text.txt" 2> /dev/null)
  [ "$(cat "$work/tty.json")" = "$want" ] || fail "eval on a terminal printed '$(cat "$work/tty.json")', want '$want'"
  grep -q "eval: reading $tokens tokens" "$work/tty.log" && grep -q $'\r\e\\[Keval: [0-9,]*/'"$windows windows" "$work/tty.log" &&
    grep -q $'\r\e\\[Keval: done, '"$windows windows in" "$work/tty.log" ||
    fail "eval on a terminal: no start line, rewritten line and done line in: $(cat -v "$work/tty.log")"
  [ $failures -eq "$before" ] && echo "ok   eval on a terminal: the line rewritten $(grep -o $'\e\\[K' "$work/tty.log" | wc -l) times"
else
  echo "skip eval on a terminal: script(1) is not installed"
fi

err=$(TAPEFORMER_PROGRESS_DELAY=soon "$bin" eval --checkpoint "$work/exit" --data "$work/text.txt" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: TAPEFORMER_PROGRESS_DELAY: expected seconds in [0, 1e9] (0: show all work's progress), got 'soon'" ] ||
  fail "a bad TAPEFORMER_PROGRESS_DELAY: rc $rc, '$err'"

[ $failures -eq 0 ] && echo "progress: all passed"
[ $failures -eq 0 ]
