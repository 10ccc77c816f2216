#!/usr/bin/env bash
# Resume on a full recipe: one run straight through, and one killed with
# kill -9 after its step-1000 checkpoint and continued with --resume; the final
# JSON line and every metrics.jsonl line must match (timing fields aside).
# The ctest entry cli_resume_after_kill does the same on a tiny model in
# seconds; this is the full-size check (about two minutes of training).
#
#   bash bench/resume_check.sh DATA            # e.g. ../shared/data/tinyshakespeare.txt
#   CONFIG=configs/shakespeare_char_cpu.json KILL_AFTER=1100 bash bench/resume_check.sh DATA
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:?usage: bench/resume_check.sh DATA}
[ -f "$data" ] || { echo "resume_check.sh: data file '$data' not found" >&2; exit 2; }
config=${CONFIG:-configs/shakespeare_char_cpu.json}
kill_after=${KILL_AFTER:-1100}  # a logged step after the step-1000 checkpoint
out=${OUT:-out/resume-check}

bash scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target tapeformer_command >/dev/null
tf=build/cli/tapeformer
rm -rf "$out"
mkdir -p "$out"

echo "resume_check.sh: straight run..." >&2
"$tf" train --config "$config" --data "$data" --out "$out/straight" > "$out/straight.json" 2> "$out/straight.log"

echo "resume_check.sh: run to be killed after step $kill_after..." >&2
"$tf" train --config "$config" --data "$data" --out "$out/split" > /dev/null 2> "$out/split-1.log" &
pid=$!
last_step() {  # the step of the last metrics line, or nothing before the first one
  [ -f "$out/split/metrics.jsonl" ] || return 0
  tail -n 1 "$out/split/metrics.jsonl" | sed -n 's/^{"step":\([0-9]*\),.*/\1/p'
}
while kill -0 "$pid" 2>/dev/null; do
  step=$(last_step)
  [ -n "$step" ] && [ "$step" -ge "$kill_after" ] && break
  sleep 0.2
done
kill -9 "$pid" 2>/dev/null || { echo "resume_check.sh: the run ended before step $kill_after" >&2; exit 1; }
wait "$pid" 2>/dev/null || true
echo "resume_check.sh: killed at logged step $(last_step); resuming..." >&2
"$tf" train --out "$out/split" --resume > "$out/split.json" 2> "$out/split-2.log"
grep -o "resuming at step [0-9]*" "$out/split-2.log" >&2

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
timing = {"train_seconds", "tokens_per_s", "elapsed_s"}
def strip(d): return {k: v for k, v in d.items() if k not in timing}
final = [json.loads(open(f"{out}/{n}.json").read().strip().splitlines()[-1]) for n in ("straight", "split")]
lines = [[strip(json.loads(l)) for l in open(f"{out}/{n}/metrics.jsonl")] for n in ("straight", "split")]
print("straight:", json.dumps(final[0]))
print("resumed: ", json.dumps(final[1]))
same_final, same_lines = strip(final[0]) == strip(final[1]), lines[0] == lines[1]
print(f"final lines equal (timing aside): {same_final}; metrics.jsonl: {len(lines[0])} vs {len(lines[1])} lines, "
      f"equal (timing aside): {same_lines}")
sys.exit(0 if same_final and same_lines else 1)
PY
