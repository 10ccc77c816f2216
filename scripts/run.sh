#!/usr/bin/env bash
# The main job: build tapeformer, train a small character-level GPT, print a sample.
#
#   bash scripts/run.sh                     # trains on Debian's fortunes (installed if missing)
#   bash scripts/run.sh --data FILE         # trains on any UTF-8 text file instead (into out/<file name>)
#   OUT=out/mine CONFIG=configs/shakespeare_char_cpu.json bash scripts/run.sh --data input.txt
# Run again with the same output directory, it continues that run (--resume):
# an interrupted run goes on where its last checkpoint left it, a finished one
# is only evaluated and sampled. Nothing in an existing run is overwritten.
set -euo pipefail
cd "$(dirname "$0")/.."

data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data)
      [ $# -ge 2 ] || { echo "run.sh: --data needs a file" >&2; exit 2; }
      data=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (use --data FILE)" >&2; exit 2 ;;
  esac
done

config=${CONFIG:-configs/quickstart.json}
[ -z "$data" ] || [ -f "$data" ] || { echo "run.sh: data file '$data' not found" >&2; exit 2; }
if [ -n "$data" ]; then
  name=$(basename "$data")
  out=${OUT:-out/${name%.*}}
else
  out=${OUT:-out/quickstart}
fi

if [ -z "$data" ]; then
  # Joined once per run directory: a resumed run keeps training on the same text.
  data="$out/fortunes.txt"
  bash scripts/fortunes_corpus.sh "$data"
  echo "run.sh: training on Debian's fortunes ($(wc -c < "$data") bytes, $data)" >&2
else
  bash scripts/setup.sh
fi

echo "run.sh: building (Release)..." >&2
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target tapeformer_command >/dev/null

resume=()
if [ -f "$out/checkpoint.bin" ]; then
  echo "run.sh: $out already holds a run: continuing it (set OUT=another/dir for a new one)" >&2
  resume=(--resume)
fi
build/cli/tapeformer train --config "$config" --data "$data" --out "$out" "${resume[@]}"
echo "run.sh: sample from $out:" >&2
build/cli/tapeformer sample --checkpoint "$out" --prompt "${PROMPT:-The }" --tokens "${TOKENS:-400}" \
  --temperature 0.8 --top-k 40 --seed 1
