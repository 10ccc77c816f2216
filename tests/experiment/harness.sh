#!/usr/bin/env bash
# scripts/experiment.py on a fake experiment whose runs print known numbers:
# the table's mean ± sd and paired differences, resuming (finished runs are
# skipped), a per-layer figure from the last metrics line that logs one,
# a failing run (reported, exit status 1, results page untouched),
# and the results section written once every run has finished.
set -euo pipefail
harness="$1"
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fails=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}

# A run: value = seed * scale; metrics lines at steps 1..3; fails when told to.
cat > "$tmp/run.py" <<'PY'
import json, os, sys
run_dir, seed, scale, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if mode == "fail" and not os.path.exists(os.path.join(os.path.dirname(run_dir), "..", "..", "fixed")):
    print("something broke", file=sys.stderr); sys.exit(3)
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "picture.png"), "w") as f:
    f.write(f"seed {seed} scale {scale}")
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    for step in (1, 2, 3):
        f.write(json.dumps({"step": step, "loss": seed * scale / step, "layers": {"steps": [seed * step]}}) + "\n")
print("progress on stdout that is not JSON")
print(json.dumps({"value": seed * scale, "time": 2.0 * seed * scale}))
PY
cat > "$tmp/spec.json" <<EOF2
{"name": "fake", "title": "A fake experiment", "about": "Numbers known in advance.",
 "command": ["python3", "$tmp/run.py", "{run_dir}", "{seed}"],
 "seeds": [1, 2, 3], "threads_per_run": 1,
 "arms": [{"name": "base", "args": ["1", "ok"]}, {"name": "double", "args": ["2", "ok"]},
          {"name": "flaky", "args": ["10", "fail"]}],
 "table": [{"field": "value", "label": "value", "digits": 4}, {"field": "layers.steps", "label": "steps", "digits": 1}],
 "compare": [{"field": "value", "baseline": "base", "kind": "difference", "label": "diff", "digits": 2},
             {"field": "time", "baseline": "base", "kind": "speedup", "label": "speed-up", "digits": 1},
             {"field": "time", "baseline": "base", "kind": "ratio", "label": "time ratio", "digits": 1}],
 "curves": [{"x": "step", "y": "loss", "file": "loss.png"}],
 "pictures": [{"arm": "double", "seed": 2, "file": "picture.png"}]}
EOF2
printf '# Results\n\nBefore.\n' > "$tmp/results.md"
args=(--out "$tmp/out" --results "$tmp/results.md" --no-plot --jobs 2)

status=0
python3 "$harness" "$tmp/spec.json" "${args[@]}" > "$tmp/first.out" 2> "$tmp/first.err" || status=$?
check "a failing run makes the exit status 1" test "$status" -eq 1
check "the failure is reported with its stderr line" grep -q "flaky / seed 1: exit status 3: something broke" "$tmp/first.err"
check "mean ± sd over seeds (1, 2, 3)" grep -q "| base | 3/3 | 2.0000 ± 1.0000 | 6.0 ± 3.0 | 0.00 ± 0.00 | 1.0x | 1.0x |" "$tmp/out/fake/table.md"
check "paired differences, speed-ups and ratios against the baseline arm" \
  grep -q "| double | 3/3 | 4.0000 ± 2.0000 | 6.0 ± 3.0 | +2.00 ± 1.00 | 0.5x | 2.0x |" "$tmp/out/fake/table.md"
check "unfinished arms show their count" grep -q "| flaky | 0/3 | — | — | — | — | — |" "$tmp/out/fake/table.md"
check "the CSV has the means and sds" grep -q "^double,3,4.0,2.0,6.0,3.0,2.0,1.0,0.5,,2.0,$" "$tmp/out/fake/table.csv"
check "an incomplete experiment leaves the results page alone" grep -qx "Before." "$tmp/results.md"
check "... and says so" grep -q "some runs are unfinished" "$tmp/first.err"

touch "$tmp/out/fixed"
python3 "$harness" "$tmp/spec.json" "${args[@]}" > "$tmp/second.out" 2> "$tmp/second.err"
check "finished runs are skipped on the next call" grep -q "6 of 9 runs finished, 3 to run" "$tmp/second.err"
check "the results page gets the section, with the command that reproduces it" \
  grep -q "Reproduce: \`python3 scripts/experiment.py .*spec.json\`" "$tmp/results.md"
check "... between markers, after what was there" \
  bash -c "grep -qx 'Before.' '$tmp/results.md' && grep -q '<!-- results:fake -->' '$tmp/results.md' && grep -q '| flaky | 3/3 | 20.0000 ± 10.0000 |' '$tmp/results.md'"

check "a picture a run drew is shown as it is" \
  bash -c "grep -q '!\[double_picture.png\](img/fake_double_picture.png)' '$tmp/results.md' && grep -qx 'seed 2 scale 2.0' '$tmp/img/fake_double_picture.png'"

python3 "$harness" "$tmp/spec.json" "${args[@]}" > /dev/null 2> "$tmp/third.err"
check "a third call runs nothing and rewrites the section in place" \
  bash -c "grep -q '9 of 9 runs finished, 0 to run' '$tmp/third.err' && test \$(grep -c '<!-- results:fake -->' '$tmp/results.md') -eq 1"

status=0
python3 "$harness" "$tmp/missing.json" > /dev/null 2> "$tmp/missing.err" || status=$?
check "a missing spec is refused with status 2 and its path" \
  bash -c "test $status -eq 2 && grep -q \"cannot read spec '$tmp/missing.json'\" '$tmp/missing.err'"

[ "$fails" -eq 0 ] && echo "harness: all checks passed" || { echo "harness: $fails check(s) failed"; exit 1; }
