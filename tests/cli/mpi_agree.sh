#!/usr/bin/env bash
# The ranks of one mpirun job start from one state, or none starts:
# - ranks resuming different checkpoints (steps 20 and 30, same config) are
#   refused by every rank within seconds, naming the steps (no hang);
# - ranks resuming checkpoints of the same step but different contents
#   (two runs of one config: their files differ at least in the time);
# - a rank reading another text behind the same path (here: the same
#   relative path in another working directory) is refused, naming the data.
# Usage: mpi_agree.sh path/to/tapeformer path/to/mpirun
set -u
bin=$(realpath "${1:?usage: mpi_agree.sh TAPEFORMER_BINARY MPIRUN}")
mpirun=${2:?usage: mpi_agree.sh TAPEFORMER_BINARY MPIRUN}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16},
 "train": {"batch_size": 8, "max_iters": 40, "threads": 1, "shards": 1, "seed": 5},
 "eval": {"interval": 10, "iters": 2, "final_iters": 2}, "checkpoint": {"interval": 10}, "log": {"interval": 5}}
JSON
for i in $(seq 300); do echo "Verse $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101))."; done > "$work/text.txt"
train() { "$bin" train --config "$work/cfg.json" --data "$work/text.txt" "$@" > /dev/null 2>&1; }
train --out "$work/A" --set train.max_iters=20 || fail "run A failed"
train --out "$work/B" --set train.max_iters=30 || fail "run B failed"
train --out "$work/C" --set train.max_iters=20 || fail "run C failed"

# refused_within NAME SECONDS WANT -- MPIRUN ARGS: mpirun exits non-zero within SECONDS, its output holding WANT.
refused_within() {
  local name=$1 limit=$2 want=$3; shift 4
  local t0; t0=$(date +%s)
  timeout 60 "$mpirun" --oversubscribe "$@" > "$work/$name.out" 2>&1; local status=$?
  local took=$(( $(date +%s) - t0 ))
  [ "$status" = 124 ] && { fail "$name: still running after 60 s (a hang)"; return; }
  [ "$status" != 0 ] || fail "$name: accepted"
  [ "$took" -le "$limit" ] || fail "$name: took $took s"
  grep -q -- "$want" "$work/$name.out" || { fail "$name: no '$want' in:"; tail -5 "$work/$name.out"; }
}
refused_within steps 20 "resumes step 30 but rank 0 resumes step 20" -- \
  -np 1 "$bin" train --out "$work/A" --resume --set train.max_iters=40 : \
  -np 1 "$bin" train --out "$work/B" --resume --set train.max_iters=40
refused_within contents 20 "resumes another checkpoint of step 20 than rank 0" -- \
  -np 1 "$bin" train --out "$work/A" --resume --set train.max_iters=40 : \
  -np 1 "$bin" train --out "$work/C" --resume --set train.max_iters=40

# The same relative path, another text: each rank runs in its own directory.
mkdir -p "$work/r0" "$work/r1"
cp "$work/text.txt" "$work/r0/text.txt"
sed 's/quick/kciuq/' "$work/text.txt" > "$work/r1/text.txt"
refused_within data 20 "reads other data than rank 0" -- \
  -np 1 --wdir "$work/r0" "$bin" train --config "$work/cfg.json" --data text.txt --out "$work/D" : \
  -np 1 --wdir "$work/r1" "$bin" train --config "$work/cfg.json" --data text.txt --out "$work/D"

[ "$fails" = 0 ] && echo "mpi agreement: all passed"
exit "$fails"
