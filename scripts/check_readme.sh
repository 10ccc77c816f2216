#!/usr/bin/env bash
# Runs the README's command tour (its ```sh block) as written: builds, runs
# the main job (scripts/run.sh, which writes out/quickstart/fortunes.txt), then
# the block line by line in a scratch directory that sees build/, configs/ and
# that text, and fails at the first command that fails. About two minutes.
#
#   bash scripts/check_readme.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ -f out/quickstart/fortunes.txt ] || bash scripts/run.sh > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out/quickstart"
ln -s "$root/build" "$work/build"
ln -s "$root/configs" "$work/configs"
ln -s "$root/tests" "$work/tests"
ln -s "$root/out/quickstart/fortunes.txt" "$work/out/quickstart/fortunes.txt"
# The first ```sh block of the README, continuation lines joined.
python3 - "$root/README.md" > "$work/tour.sh" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
print("set -euo pipefail")
print(block.replace("\\\n", " "))
PY
cd "$work"
n=0
while IFS= read -r line; do
  case "$line" in ''|set\ *) continue ;; esac
  n=$((n + 1))
  echo "check_readme: $line" | cut -c1-120
done < tour.sh
bash tour.sh > tour.log 2>&1 || { tail -20 tour.log; echo "check_readme: FAIL (see the command above the log's last lines)"; exit 1; }
[ -s curves.png ] && [ -s model.safetensors ] || { echo "check_readme: FAIL: the tour's files are missing"; exit 1; }
echo "check_readme: the README's $n commands ran as written"
