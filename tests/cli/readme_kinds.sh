#!/usr/bin/env bash
# README.md's tables of the model families (attention, positional, block,
# MLP) are generated from the registries: the lines between its kinds
# markers must equal `tapeformer kinds --readme`. A kind added or a summary
# changed without regenerating the README fails here.
# Usage: readme_kinds.sh TAPEFORMER README.md [--write]   (--write regenerates them)
set -euo pipefail
tf=${1:?usage: readme_kinds.sh TAPEFORMER README.md [--write]}
readme=${2:?usage: readme_kinds.sh TAPEFORMER README.md [--write]}
write=${3:-}
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
"$tf" kinds --readme > "$generated"
python3 - "$readme" "$generated" "$write" <<'PY'
import sys
readme_path, generated_path, write = sys.argv[1], sys.argv[2], sys.argv[3] == "--write"
text = open(readme_path, encoding="utf-8").read()
block = open(generated_path, encoding="utf-8").read()
begin, end = block.splitlines()[0], block.splitlines()[-1]
i = text.find(begin[:len("<!-- kinds:begin")])
j = text.find(end, i)
if i < 0 or j < 0:
    sys.exit("README.md has no <!-- kinds:begin ... --> / <!-- kinds:end --> markers")
current = text[i:j + len(end) + 1]
if current == block:
    print(f"readme_kinds: README.md's {block.count(chr(10)) - 2} table lines match the registries")
elif write:
    open(readme_path, "w", encoding="utf-8").write(text[:i] + block + text[j + len(end) + 1:])
    print("readme_kinds: README.md regenerated")
else:
    sys.exit("README.md's kinds tables drift from the registries: regenerate them with\n"
             "  bash tests/cli/readme_kinds.sh build/cli/tapeformer README.md --write")
PY
