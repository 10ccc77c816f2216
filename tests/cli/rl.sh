#!/usr/bin/env bash
# tapeformer rl: a T-maze dataset collected, a Decision Transformer trained
# on it and evaluated in the environment; a run stopped and resumed ends
# with the straight run's losses and metrics, also with a segment memory
# (GTrXL, whole episodes in order: the stream's position and the memory are
# in the checkpoint); rl eval --log lines drawn by plot --achieved; a
# dataset changed under a run is refused on resume, and text training of
# the model kind is refused.
# Usage: rl.sh path/to/tapeformer
set -u
bin=${1:?usage: rl.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<'JSON'
{"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 8, "dropout": 0.1},
 "train": {"batch_size": 8, "max_iters": 30, "threads": 1},
 "eval": {"interval": 10, "iters": 1, "final_iters": 1}, "log": {"interval": 5}, "checkpoint": {"interval": 10}}
JSON
out=$("$bin" rl collect --env tmaze --option corridor=4 --policy random:0.5,expert:0.5 --episodes 60 --out "$work/maze.traj" 2>&1) \
  || { echo "FAIL: collect: $out"; exit 1; }
case "$out" in *'"episodes": 60'*'"checksum"'*) ;; *) echo "FAIL: collect's line: $out"; exit 1 ;; esac
"$bin" rl train --config "$work/cfg.json" --data "$work/maze.traj" --out "$work/straight" > "$work/straight.json" 2> /dev/null \
  || { echo "FAIL: rl train"; exit 1; }
"$bin" rl train --config "$work/cfg.json" --data "$work/maze.traj" --out "$work/split" --set train.max_iters=20 > /dev/null 2>&1 \
  || { echo "FAIL: rl train (first part)"; exit 1; }
"$bin" rl train --out "$work/split" --resume --set train.max_iters=30 > "$work/split.json" 2> /dev/null \
  || { echo "FAIL: rl train --resume"; exit 1; }
python3 - "$work" <<'PY' || exit 1
import json, re, sys
w = sys.argv[1]
def last(p): return json.loads(open(p).read().strip().splitlines()[-1])
a, b = last(w + "/straight.json"), last(w + "/split.json")
if (a["train_loss"], a["val_loss"]) != (b["train_loss"], b["val_loss"]):
    sys.exit(f"FAIL: resumed run ends at {b['train_loss']}, {b['val_loss']}, straight at {a['train_loss']}, {a['val_loss']}")
def rows(p): return [{k: v for k, v in json.loads(l).items() if not re.search(r"(seconds|_s|per_s)$", k)} for l in open(p)]
if rows(w + "/straight/metrics.jsonl") != rows(w + "/split/metrics.jsonl"):
    sys.exit("FAIL: the resumed run's metrics differ from the straight run's")
PY
"$bin" rl train --config "$work/cfg.json" --data "$work/maze.traj" --out "$work/bc" --set model.dt_returns=false \
  --set train.max_iters=2 > /dev/null 2>&1 || { echo "FAIL: rl train --set model.dt_returns=false on a config without model.arch"; exit 1; }
mem=(--set model.block=gtrxl --set model.positional=txl --set model.mem_len=8 --set model.block_size=2)
"$bin" rl train --config "$work/cfg.json" --data "$work/maze.traj" --out "$work/mem" "${mem[@]}" > "$work/mem.json" 2> /dev/null \
  || { echo "FAIL: rl train with a memory"; exit 1; }
"$bin" rl train --config "$work/cfg.json" --data "$work/maze.traj" --out "$work/mem_split" "${mem[@]}" \
  --set train.max_iters=17 > /dev/null 2>&1 || { echo "FAIL: rl train with a memory (first part)"; exit 1; }
"$bin" rl train --out "$work/mem_split" --resume --set train.max_iters=30 > "$work/mem_split.json" 2> /dev/null \
  || { echo "FAIL: rl train --resume with a memory"; exit 1; }
python3 - "$work" <<'PY' || exit 1
import json, re, sys
w = sys.argv[1]
def last(p): return json.loads(open(p).read().strip().splitlines()[-1])
a, b = last(w + "/mem.json"), last(w + "/mem_split.json")
if (a["train_loss"], a["val_loss"]) != (b["train_loss"], b["val_loss"]):
    sys.exit(f"FAIL: resumed memory run ends at {b['train_loss']}, {b['val_loss']}, straight at {a['train_loss']}, {a['val_loss']}")
def rows(p): return [{k: v for k, v in json.loads(l).items() if not re.search(r"(seconds|_s|per_s)$", k)} for l in open(p)]
# the first part's own final line (step 17, between log intervals) aside, the same lines
if rows(w + "/mem/metrics.jsonl") != [r for r in rows(w + "/mem_split/metrics.jsonl") if r["step"] != 17]:
    sys.exit("FAIL: the resumed memory run's metrics differ from the straight run's")
PY
out=$("$bin" rl eval --checkpoint "$work/mem" --target-return 1 --episodes 5 --log "$work/no/such/dir.jsonl" 2> "$work/err"); rc=$?
[ $rc -eq 1 ] && [ -z "$out" ] && grep -q "rl eval --log: cannot write '$work/no/such/dir.jsonl': its directory '$work/no/such' does not exist" "$work/err" \
  || { echo "FAIL: an unwritable --log: rc $rc, '$out', '$(cat "$work/err")'"; exit 1; }
for target in 0 1; do
  out=$("$bin" rl eval --checkpoint "$work/mem" --target-return $target --episodes 5 --log "$work/achieved.jsonl" 2> /dev/null) \
    || { echo "FAIL: rl eval: $out"; exit 1; }
  case "$out" in *'"episodes": 5, "return_mean"'*) ;; *) echo "FAIL: rl eval's line: $out"; exit 1 ;; esac
  [ "$(tail -n 1 "$work/achieved.jsonl")" = "$out" ] || { echo "FAIL: --log holds '$(tail -n 1 "$work/achieved.jsonl")'"; exit 1; }
done
[ "$(wc -l < "$work/achieved.jsonl")" -eq 2 ] || { echo "FAIL: --log did not append"; exit 1; }
if command -v gnuplot > /dev/null; then
  out=$("$bin" plot --achieved "$work/achieved.jsonl" -o "$work/achieved.png" 2>&1) || { echo "FAIL: plot --achieved: $out"; exit 1; }
  [ "$(stat -c %s "$work/achieved.png")" -gt 5000 ] || { echo "FAIL: achieved.png too small"; exit 1; }
  err=$("$bin" plot --achieved "$work/cfg.json" -o "$work/x.png" 2>&1); rc=$?
  [ $rc -eq 1 ] && case "$err" in *"is not a line of rl eval"*) true ;; *) false ;; esac \
    || { echo "FAIL: plot --achieved of a config: rc $rc, '$err'"; exit 1; }
fi
out=$("$bin" rl eval --checkpoint "$work/straight" --target-return 1 --episodes 5 2> /dev/null) || { echo "FAIL: rl eval: $out"; exit 1; }
case "$out" in *'"episodes": 5, "return_mean"'*) ;; *) echo "FAIL: rl eval's line: $out"; exit 1 ;; esac

"$bin" rl collect --env tmaze --option corridor=4 --policy random --episodes 60 --seed 2 --out "$work/maze.traj" > /dev/null 2>&1
err=$("$bin" rl train --out "$work/split" --resume --set train.max_iters=40 2>&1); rc=$?
[ $rc -eq 1 ] && case "$err" in *"the run trained on"*"it changed since"*) true ;; *) false ;; esac \
  || { echo "FAIL: a changed dataset on resume: rc $rc, '$err'"; exit 1; }
err=$("$bin" rl eval --checkpoint "$work/straight" --target-return 1 2>&1); rc=$?
[ $rc -eq 1 ] && case "$err" in *"changed since the run trained on it"*) true ;; *) false ;; esac \
  || { echo "FAIL: rl eval on a changed dataset: rc $rc, '$err'"; exit 1; }
for i in $(seq 100); do echo "line $i: the cat sat on the mat."; done > "$work/text.txt"
err=$("$bin" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/text" --set model.arch=decision_transformer 2>&1); rc=$?
[ $rc -eq 1 ] && case "$err" in *"trains on episodes of an environment"*) true ;; *) false ;; esac \
  || { echo "FAIL: text training: rc $rc, '$err'"; exit 1; }
printf 'TFRLTRJ1 truncated' > "$work/bad.traj"
err=$("$bin" rl train --config "$work/cfg.json" --data "$work/bad.traj" --out "$work/bad" 2>&1); rc=$?
[ $rc -eq 1 ] && case "$err" in *"dataset '$work/bad.traj'"*) true ;; *) false ;; esac \
  || { echo "FAIL: a damaged dataset: rc $rc, '$err'"; exit 1; }
echo "rl: OK"
