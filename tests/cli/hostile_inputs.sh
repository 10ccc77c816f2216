#!/usr/bin/env bash
# Hostile names, writers and numbers, through the real binary. Each case
# prints "ok NAME" or "FAIL NAME: what happened", and the script goes on to
# the next; it exits 1 when any failed.
#
#   names      file and directory names that would be gnuplot commands
#              (a line break, then system("touch PWNED")) reach no script:
#              no PWNED file is ever made; a name that cannot be a label is
#              refused, an output name is only a file name
#   writers    sample --png never writes over the run it samples
#   fifo       plot refuses a FIFO at once and leaves no temp file
#   numbers    values out of their type's range, not numbers or empty are
#              refused naming the flag (exit status 2); a dataset's rewards
#              are checked against its environment's range
#   fast       a block longer than the data is refused in under 2 s
#   smaller    errors that name the right thing
#
# Usage: hostile_inputs.sh path/to/tapeformer
set -u
bin=$(realpath "${1:?usage: hostile_inputs.sh TAPEFORMER_BINARY}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work/tmp"  # what the commands leave in a temp directory is seen here
mkdir -p "$TMPDIR"
failures=0
ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
# check NAME CONDITION-STATUS DETAIL: ok when the status is 0
check() { if [ "$2" -eq 0 ]; then ok "$1"; else bad "$1" "$3"; fi; }
pwned() { find "$work" -name 'PWNED*' | grep -q .; }

# ---- runs the cases read ----
cat > "$work/tiny.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "train": {"batch_size": 4, "max_iters": 10, "threads": 1},
 "eval": {"interval": 5, "iters": 2, "final_iters": 2}, "log": {"interval": 5}, "checkpoint": {"interval": 10}}
JSON
for i in $(seq 200); do echo "line $((i % 7)): a cab, a bad deed, $((i % 13)) faded beads."; done > "$work/text.txt"
"$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run" > /dev/null 2>&1 || { echo "FAIL: training"; exit 1; }
"$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/exit" --set model.arch=early_exit \
  --set model.n_layer=2 > /dev/null 2>&1 || { echo "FAIL: training the early-exit run"; exit 1; }
"$bin" rl collect --env tmaze --option corridor=4 --policy random:0.5,expert:0.5 --episodes 40 --out "$work/maze.traj" \
  > /dev/null 2>&1 || { echo "FAIL: rl collect"; exit 1; }
"$bin" rl train --config "$work/tiny.json" --data "$work/maze.traj" --out "$work/dt" --set model.block_size=4 \
  --set train.max_iters=4 > /dev/null 2>&1 || { echo "FAIL: rl train"; exit 1; }
echo '{"target_return": 1, "episodes": 5, "return_mean": 0.4, "return_sd": 0.5, "best_return_mean": 1, "env": "tmaze"}' \
  > "$work/line.jsonl"

# ---- names: no shell command through gnuplot ----
if command -v gnuplot > /dev/null; then
  inject=$'\nsystem("touch PWNED")\n#'
  mkdir -p "$work/c1" "$work/c2" "$work/c3" "$work/c4"
  cp "$work/line.jsonl" "$work/c1/L${inject}.jsonl"
  err=$(cd "$work/c1" && "$bin" plot --achieved "L${inject}.jsonl" -o x.png 2>&1); rc=$?
  pwned; made=$?
  [ $made -ne 0 ] && [ $rc -eq 1 ] && [[ "$err" == *"holds a control character"* ]] && [ ! -e "$work/c1/x.png" ]
  check names.achieved_file $? "rc $rc, PWNED made: $([ $made -eq 0 ] && echo yes || echo no), '$err'"
  rm -f "$work"/*/PWNED*

  mkdir -p "$work/c2/R${inject}" && cp "$work/run/metrics.jsonl" "$work/c2/R${inject}/"
  err=$(cd "$work/c2" && "$bin" plot "R${inject}" -o x.png 2>&1); rc=$?
  pwned; made=$?
  [ $made -ne 0 ] && [ $rc -eq 1 ] && [[ "$err" == *"holds a control character"* ]]
  check names.run_directory $? "rc $rc, PWNED made: $([ $made -eq 0 ] && echo yes || echo no), '$err'"
  rm -f "$work"/*/PWNED*

  out=$(cd "$work/c3" && "$bin" plot "$work/run" -o "o${inject}.png" 2>&1); rc=$?
  pwned; made=$?
  [ $made -ne 0 ] && [ $rc -eq 0 ] && [ "$(head -c 4 "$work/c3/o${inject}.png" | od -An -c | tr -d ' ')" = '211PNG' ]
  check names.output $? "rc $rc, PWNED made: $([ $made -eq 0 ] && echo yes || echo no), '$out'"
  rm -f "$work"/*/PWNED*

  # Quotes, a backquoted command and a macro are only text in a label.
  odd="it's \`touch PWNED\` @x \"q\" \\"
  mkdir -p "$work/c4/$odd" && cp "$work/run/metrics.jsonl" "$work/c4/$odd/"
  out=$(cd "$work/c4" && "$bin" plot "$odd" -o y.png 2>&1); rc=$?
  pwned; made=$?
  [ $made -ne 0 ] && [ $rc -eq 0 ] && [ -s "$work/c4/y.png" ]
  check names.quotes_and_backquotes $? "rc $rc, PWNED made: $([ $made -eq 0 ] && echo yes || echo no), '$out'"
  rm -f "$work"/*/PWNED*
else
  echo "skip names (no gnuplot)"
fi

# ---- writers: sample --png never over the run it reads ----
for file in checkpoint.bin metrics.jsonl; do
  rm -rf "$work/victim" && cp -r "$work/run" "$work/victim"
  out=$("$bin" sample --checkpoint "$work/victim" --tokens 4 --image-width 2 --images 1 --png "$work/victim/$file" 2> "$work/err"); rc=$?
  cmp -s "$work/victim/$file" "$work/run/$file"; same=$?
  [ $rc -eq 1 ] && [ $same -eq 0 ] && [ -z "$out" ] && grep -Eq "is the input|$file of the run directory" "$work/err"
  check "writers.sample_png_over_$file" $? "rc $rc, $file $([ $same -eq 0 ] && echo kept || echo changed), '$(cat "$work/err")'"
done

# ---- fifo: plot refuses a FIFO at once, and leaves no temp file ----
mkfifo "$work/F.fifo"
err=$(timeout 10 "$bin" plot --achieved "$work/F.fifo" -o "$work/f.png" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$err" == *"is a FIFO, not a regular file"* ]]
check fifo.achieved $? "rc $rc (124: it hung), '$err'"
mkdir -p "$work/fiforun" && mkfifo "$work/fiforun/metrics.jsonl"
err=$(timeout 10 "$bin" plot "$work/fiforun" -o "$work/f.png" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$err" == *"is a FIFO, not a regular file"* ]]
check fifo.metrics $? "rc $rc (124: it hung), '$err'"
if command -v gnuplot > /dev/null; then
  "$bin" plot "$work/run" -o "$work/p.png" > /dev/null 2>&1
  [ -z "$(ls -A "$TMPDIR")" ]
  check fifo.no_temp_files $? "left in \$TMPDIR: $(ls -A "$TMPDIR" | tr '\n' ' ')"
fi

# ---- numbers ----
# refused NAME COMMAND...: exit status 2 and one line naming the flag
refused() {
  local name=$1 flag=$2
  shift 2
  err=$(timeout 20 "$@" 2>&1 < /dev/null); rc=$?
  [ $rc -eq 2 ] && [[ "$err" == "tapeformer: error: $flag: must be "* ]] && [ "$(echo "$err" | wc -l)" -eq 1 ]
  check "$name" $? "rc $rc, '$err'"
}
for seed in 18446744073709551616 1e23 -1; do
  refused "numbers.rl_collect_seed_$seed" --seed "$bin" rl collect --env tmaze --episodes 2 --out "$work/s.traj" --seed "$seed"
  refused "numbers.rl_eval_seed_$seed" --seed "$bin" rl eval --checkpoint "$work/dt" --target-return 1 --episodes 1 --seed "$seed"
  refused "numbers.calibrate_seed_$seed" --seed "$bin" calibrate --checkpoint "$work/exit" --dry-run --seed "$seed"
done
refused numbers.rl_eval_target_empty --target-return "$bin" rl eval --checkpoint "$work/dt" --target-return '' --episodes 1
refused numbers.calibrate_threshold_empty --threshold "$bin" calibrate --checkpoint "$work/exit" --method evaluate --threshold ''
refused numbers.rl_collect_epsilon_inf --epsilon "$bin" rl collect --env tmaze --episodes 2 --out "$work/s.traj" --epsilon 1e999
refused numbers.threads_empty --threads "$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --threads ''
# A target return no episode of the environment can have (a wrapped int32 would act as 5 and -10).
for target in 4294967301 -4294967306; do
  err=$("$bin" rl eval --checkpoint "$work/dt" --target-return $target --episodes 1 2>&1); rc=$?
  [ $rc -eq 1 ] && [[ "$err" == *"--target-return $target is outside the returns environment \"tmaze\" can give: [0, 8]"* ]]
  check "numbers.rl_eval_target_$target" $? "rc $rc, '$err'"
done
# A dataset whose first episode's rewards are 2^31 - 1, behind a valid checksum.
python3 - "$work/maze.traj" "$work/forged.traj" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], 'rb').read())
head, payload = 8 + 4 + 8 + 8, bytearray(data[28:])
at = 0
def take(fmt):
    global at
    v = struct.unpack_from(fmt, payload, at)
    at += struct.calcsize(fmt)
    return v[0]
def skip_string():
    global at
    n = take('<Q')
    at += n
skip_string()                                   # the environment
for _ in range(take('<Q')): skip_string(); at += 8   # the options
features = take('<Q'); at += 4 * features       # feature sizes
at += 4 + 8                                     # actions, step cap
take('<Q')                                      # episodes
steps = take('<Q')                              # the first episode: its length,
skip_string(); at += 8                          # policy and seed
at += 4 * features * steps + 4 * steps          # its observations and actions
for t in range(steps): struct.pack_into('<i', payload, at + 4 * t, 2**31 - 1)
h = 0xcbf29ce484222325
for b in payload: h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
out = data[:20] + struct.pack('<Q', h) + payload
open(sys.argv[2], 'wb').write(out)
PY
err=$("$bin" rl train --config "$work/tiny.json" --data "$work/forged.traj" --out "$work/forged" --set model.block_size=4 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$err" == *"has reward 2147483647 at step 0, outside environment \"tmaze\"'s range [0, 1]"* ]] && [ ! -e "$work/forged" ]
check numbers.dataset_rewards $? "rc $rc, '$err'"

# ---- fast: an impossible config refused in under 2 s ----
yes 'a line of text for a corpus of a megabyte' | head -c 1000000 > "$work/mb.txt"
start=$(date +%s%N)
err=$(timeout 60 "$bin" train --config "$work/tiny.json" --data "$work/mb.txt" --out "$work/huge" --set model.block_size=2000000 2>&1); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 1 ] && [ $ms -lt 2000 ] && [[ "$err" == *"block size 2000000 needs at least 2000001 tokens, but the train split has"* ]]
check fast.block_longer_than_data $? "rc $rc (124: still running after 60 s) after $ms ms, '$err'"
# A block the data holds but no machine's memory could: a floor from two short windows refuses it.
yes 'a line of text for a corpus of twelve megabytes' | head -c 12000000 > "$work/12mb.txt"
start=$(date +%s%N)
err=$(timeout 60 "$bin" train --config "$work/tiny.json" --data "$work/12mb.txt" --out "$work/huge" --set model.block_size=1000000 \
  --set model.n_embd=128 --set model.n_layer=4 --set train.batch_size=12 2>&1); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 1 ] && [ $ms -lt 2000 ] && [[ "$err" == *"GiB of memory (model.n_layer=4, model.n_embd=128, model.block_size=1000000"* ]] \
  && [ ! -e "$work/huge" ]
check fast.block_beyond_memory $? "rc $rc (124: still running after 60 s) after $ms ms, '$err'"
start=$(date +%s%N)
err=$(timeout 60 "$bin" rl train --config "$work/tiny.json" --data "$work/maze.traj" --out "$work/huge_dt" --set model.block_size=2000000 2>&1); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 1 ] && [ $ms -lt 2000 ] && [[ "$err" == *"model.block_size 2000000 steps per window is more than any episode"* ]]
check fast.episode_block_longer_than_episodes $? "rc $rc (124: still running after 60 s) after $ms ms, '$err'"

# ---- smaller ----
out=$("$bin" sample --checkpoint "$work/run" --tokens 4 --image-width 2 --images 2 --png "$work/missing/dir/grid.png" 2> "$work/err"); rc=$?
[ $rc -eq 1 ] && [ -z "$out" ] && grep -q "cannot write '$work/missing/dir/grid.png': its directory '$work/missing/dir' does not exist" "$work/err"
check smaller.png_in_missing_directory $? "rc $rc, stdout '$out', '$(cat "$work/err")'"

err=$(ulimit -v 600000; timeout 60 "$bin" rl collect --env tmaze --option corridor=100000 --episodes 16000000 --policy random \
  --out "$work/oom.traj" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$err" = "tapeformer: error: rl collect: out of memory; collect fewer or shorter episodes (--episodes, --option)" ] \
  && [ ! -e "$work/oom.traj" ]
check smaller.rl_collect_out_of_memory $? "rc $rc, '$err'"

for cmd in "sample --checkpoint $work/dt" "eval --checkpoint $work/dt --data $work/text.txt" \
           "knn build --checkpoint $work/dt --data $work/text.txt --out $work/dt.knn" "calibrate --checkpoint $work/dt"; do
  # shellcheck disable=SC2086
  err=$("$bin" $cmd 2>&1); rc=$?
  [ $rc -eq 1 ] && [[ "$err" != *"program's own task"* ]] && [[ "$err" == *'model.arch "decision_transformer"'*"rl eval"* ]]
  check "smaller.decision_transformer_${cmd%% --*}" $? "rc $rc, '$err'"
done

err=$("$bin" eval --checkpoint "$work/exit" --data "$work/text.txt" --report-layers 2>&1 > /dev/null); rc=$?
[ $rc -eq 0 ] && [[ "$err" == *"logged no figures"*"tapeformer calibrate"* ]]
check smaller.uncalibrated_exit_layers $? "rc $rc, stderr '$err'"

if command -v flock > /dev/null; then
  flock "$work/run" sleep 5 &
  holder=$!
  sleep 0.5
  echo "not a pid" > "$work/run/train.lock"
  err=$("$bin" train --out "$work/run" --resume --set train.max_iters=20 2>&1); rc=$?
  kill $holder 2> /dev/null
  wait 2> /dev/null
  [ $rc -eq 1 ] && [[ "$err" == *"is in use by another process"* ]] && [[ "$err" != *"not a pid"* ]]
  check smaller.lock_file_text $? "rc $rc, '$err'"
fi

if [ $failures -gt 0 ]; then
  echo "hostile_inputs: $failures failed"
  exit 1
fi
echo "hostile_inputs: OK"
