#!/usr/bin/env bash
# README's family tables are prose, written by hand; this keeps them from
# drifting from the registries: every kind the stock command lists for
# model.attention, model.positional, model.block and model.mlp must appear
# in README.md as `name`. A kind added without a README line fails here.
# Usage: readme_kinds.sh TAPEFORMER README.md
set -euo pipefail
tf=${1:?usage: readme_kinds.sh TAPEFORMER README.md}
readme=${2:?usage: readme_kinds.sh TAPEFORMER README.md}
"$tf" kinds | python3 -c '
import re, sys
readme = open(sys.argv[1], encoding="utf-8").read()
family, missing, checked = None, [], 0
for line in sys.stdin:
    if not line.startswith(" "):
        family = line.strip()
        continue
    m = re.match(r"  (\S+)", line)
    if m and not line.startswith("      ") and family in ("model.attention", "model.positional", "model.block", "model.mlp"):
        checked += 1
        if "`" + m.group(1) + "`" not in readme:
            missing.append(family + " " + m.group(1))
if missing:
    sys.exit("README.md does not mention: " + ", ".join(missing) + " (add them to its family tables)")
print(f"readme_kinds: all {checked} kinds of the four families are in README.md")
' "$readme"
