#!/usr/bin/env bash
# Distributed training over MPI, through the real binary and mpirun:
# - 2 ranks x 1 shard give metrics.jsonl and a final line bit-identical to one
#   process with 2 shards (timing fields aside), with dropout on; so do 2 x 2
#   and 1 x 4 with a Transformer-XL memory and uneven rows per rank, and
#   2 x 1 with gradient accumulation, and 2 x 3 (not a power of two) and 1 x 6,
#   and 2 x 1 in bf16;
# - a rank killed with SIGKILL takes the job down (mpirun exits non-zero and
#   names the rank) without a hang, the last checkpoint stays intact, and a
#   resume with 1 process x 2 shards continues the uninterrupted curve;
# - ranks started with different configs, and more shards than batch rows,
#   are refused with an error naming the problem.
# Usage: mpi.sh path/to/tapeformer path/to/mpirun
set -u
bin=${1:?usage: mpi.sh TAPEFORMER_BINARY MPIRUN}
mpirun=${2:?usage: mpi.sh TAPEFORMER_BINARY MPIRUN}
work=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null; rm -rf "$work"' EXIT
pid=
# Open MPI refuses root unless told (CI runs as root); --oversubscribe lets 2
# ranks share fewer cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { "$mpirun" --oversubscribe "$@"; }

cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.1},
 "train": {"batch_size": 8, "max_iters": 1500, "threads": 1}, "schedule": {"warmup_iters": 20, "decay_iters": 1500},
 "eval": {"interval": 50, "iters": 5, "final_iters": 7}, "checkpoint": {"interval": 50}, "log": {"interval": 10}}
JSON
for i in $(seq 300); do echo "Verse $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101))."; done > "$work/text.txt"
strip() { sed -E 's/, ?"(train_seconds|tokens_per_s|elapsed_s|threads|ranks)": ?[^,}]*//g' "$1"; }
fails=0

"$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/one" --set train.shards=2 \
  > "$work/one.json" 2>/dev/null || { echo "FAIL: the one-process run failed"; exit 1; }
mpi -np 2 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/two" --set train.shards=1 \
  > "$work/two.json" 2> "$work/two.log" || { echo "FAIL: mpirun -np 2 failed:"; tail -5 "$work/two.log"; exit 1; }
grep -q '"ranks": 2, "shards": 2' "$work/two.json" || { echo "FAIL: final line: $(cat "$work/two.json")"; fails=1; }
if [ "$(strip "$work/one.json")" != "$(strip "$work/two.json")" ]; then
  echo "FAIL: final lines differ"; echo "  1 x 2: $(cat "$work/one.json")"; echo "  2 x 1: $(cat "$work/two.json")"; fails=1
fi
if ! diff <(strip "$work/one/metrics.jsonl") <(strip "$work/two/metrics.jsonl") > "$work/diff"; then
  echo "FAIL: metrics.jsonl of 2 ranks x 1 shard differs from 1 process x 2 shards:"; head -4 "$work/diff"; fails=1
fi
[ "$(wc -l < "$work/two.json")" = 1 ] || { echo "FAIL: more than rank 0 printed a final line"; fails=1; }

# same_bits NAME WHAT RANK_SHARDS ARGS...: 2 ranks x RANK_SHARDS shards give
# the metrics of 1 process x 2 RANK_SHARDS shards, bit for bit.
same_bits() {
  local name=$1 what=$2 shards=$3
  shift 3
  "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/${name}1" "$@" \
    --set train.shards=$((2 * shards)) > /dev/null 2>&1 || { echo "FAIL: the one-process run $what failed"; exit 1; }
  mpi -np 2 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/${name}2" "$@" \
    --set train.shards="$shards" > /dev/null 2> "$work/${name}2.log" \
    || { echo "FAIL: mpirun $what failed:"; tail -5 "$work/${name}2.log"; exit 1; }
  if ! diff <(strip "$work/${name}1/metrics.jsonl") <(strip "$work/${name}2/metrics.jsonl") > "$work/diff"; then
    echo "FAIL: $what, 2 ranks x $shards shards differ from 1 process x $((2 * shards)):"; head -4 "$work/diff"
    fails=1
  fi
}

# Transformer-XL's memory crosses the ranks (gathered whole each step): 2 x 2
# with 13 rows (7 and 6 per rank) equals 1 x 4.
same_bits xl "with a segment memory" 2 --set train.max_iters=60 --set model.positional=txl --set model.mem_len=16 \
  --set train.batch_size=13
# Activation recompute changes no bit, across ranks too: the same 2 x 2 run (dropout on) with every
# block recomputed in the backward equals 1 x 4 without.
mpi -np 2 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/xlr2" --set train.max_iters=60 \
  --set model.positional=txl --set model.mem_len=16 --set train.batch_size=13 --set train.shards=2 \
  --set train.recompute=blocks > /dev/null 2> "$work/xlr2.log" || { echo "FAIL: mpirun with recompute failed:"; tail -5 "$work/xlr2.log"; exit 1; }
if ! diff <(strip "$work/xl1/metrics.jsonl") <(strip "$work/xlr2/metrics.jsonl") > "$work/diff"; then
  echo "FAIL: 2 ranks x 2 shards with train.recompute=blocks differ from 1 process x 4 without:"; head -4 "$work/diff"
  fails=1
fi
# Gradient accumulation: the micro-batches' sum is counted once, not once per rank: 2 x 1 equals 1 x 2.
same_bits ga "with train.grad_accum=3" 1 --set train.max_iters=40 --set train.grad_accum=3
# 3 shards per rank are not a subtree of the shard tree (every shard's gradient is sent): 2 x 3 equals 1 x 6.
same_bits odd "with 3 shards per rank" 3 --set train.max_iters=30
# Batch statistics (Routing attention's centroid sums) are summed over every
# shard of every rank before the centroids move: 2 x 3 equals 1 x 6, with
# two micro-batches per step.
same_bits rt "with routing attention's centroids" 3 --set train.max_iters=30 --set model.attention=routing \
  --set model.routing_decay=0.9 --set train.grad_accum=2

# bf16 products: each shard's products are its own, and the shard tree fixes the sums' order, so
# 2 x 1 equals 1 x 2 as in float32; the portable path everywhere, the fast one where the CPU has it.
same_bits bfp "in bf16_portable" 1 --set train.max_iters=30 --set train.precision=bf16_portable
if "$bin" --version | grep -q "bf16 products on"; then
  same_bits bf "in bf16" 1 --set train.max_iters=30 --set train.precision=bf16
fi

# Kill rank 1 after the step-100 checkpoint.
mpi -np 2 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/killed" --set train.shards=1 \
  > /dev/null 2> "$work/killed.log" &
pid=$!
for _ in $(seq 1200); do
  grep -q '"step":120' "$work/killed/metrics.jsonl" 2>/dev/null && break
  sleep 0.05
done
ranks=$(pgrep -P "$pid" -f "train --config" | tr '\n' ' ')
victim=$(echo "$ranks" | awk '{print $2}')
[ -n "$victim" ] || victim=$(pgrep -f "out $work/killed" | grep -v "^$pid$" | tail -1)
kill -9 "$victim" 2>/dev/null
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the job still runs 60 s after a rank was killed (hang)"; fails=1
  kill -9 "$pid"
else
  wait "$pid"; status=$?
  [ "$status" -ne 0 ] || { echo "FAIL: mpirun exited 0 after a rank was killed"; fails=1; }
  grep -q "exited on signal 9" "$work/killed.log" || { echo "FAIL: no error naming the killed rank:"; tail -5 "$work/killed.log"; fails=1; }
fi
pgrep -f "out $work/killed" > /dev/null && { echo "FAIL: ranks left running"; pkill -9 -f "out $work/killed"; fails=1; }
grep -q '"step":1500' "$work/killed/metrics.jsonl" && { echo "FAIL: the run finished before the kill; the test proves nothing"; fails=1; }
"$bin" train --out "$work/killed" --resume --set train.shards=2 > "$work/resumed.json" 2> "$work/resumed.log" \
  || { echo "FAIL: resume after the kill failed:"; cat "$work/resumed.log"; fails=1; }
grep -qE "resuming at step [1-9]" "$work/resumed.log" || { echo "FAIL: did not resume from a checkpoint"; fails=1; }
if ! diff <(strip "$work/one/metrics.jsonl") <(strip "$work/killed/metrics.jsonl") > "$work/diff"; then
  echo "FAIL: the resumed curve differs from the uninterrupted one:"; head -4 "$work/diff"; fails=1
fi

# Ranks that disagree on the config; more shards than rows.
timeout 60 "$mpirun" --oversubscribe -np 1 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" \
  --out "$work/mixed" : -np 1 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/mixed" \
  --set train.seed=2 > /dev/null 2> "$work/mixed.log"
[ $? -ne 0 ] && grep -q "rank 1 of 2 was started with another config" "$work/mixed.log" \
  || { echo "FAIL: ranks with different configs:"; tail -5 "$work/mixed.log"; fails=1; }
timeout 60 "$mpirun" --oversubscribe -np 2 "$bin" train --config "$work/cfg.json" --data "$work/text.txt" \
  --out "$work/many" --set train.shards=5 > /dev/null 2> "$work/many.log"
[ $? -ne 0 ] && grep -q "2 processes x 5 shards = 10 shards, more than the batch's 8 rows" "$work/many.log" \
  || { echo "FAIL: more shards than rows:"; tail -5 "$work/many.log"; fails=1; }

[ "$fails" = 0 ] && echo "mpi: 2 ranks x 1 shard = 1 process x 2 shards; killed rank, resume; refusals: OK"
exit "$fails"
