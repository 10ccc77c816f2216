#!/usr/bin/env bash
# Debian's fortunes as one text file: the corpus scripts/run.sh trains on by
# default, and the second text of the kNN-LM domain experiment
# (experiments/knn_domain.json).
#
#   bash scripts/fortunes_corpus.sh FILE              # writes FILE unless it is there
#   bash scripts/fortunes_corpus.sh FILE -- CMD ARG   # then runs CMD ARG... (a spec's command)
#
# Installs the fortunes package when missing (scripts/setup.sh). The package
# ships plain-text files next to binary .dat indexes; the text ones (regular
# files only, not the .dat/.u8 or symlinks) are joined in name order. Joined
# once per FILE: a resumed run keeps reading the same text.
set -euo pipefail
file=${1:?usage: fortunes_corpus.sh FILE [-- COMMAND...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" fortunes
if [ ! -s "$file" ]; then
  mkdir -p "$(dirname "$file")"
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 \
    | sort -z | xargs -0 cat > "$file.tmp"
  mv "$file.tmp" "$file"
fi
if [ $# -gt 0 ]; then
  [ "$1" = "--" ] || { echo "fortunes_corpus.sh: expected -- before the command, got '$1'" >&2; exit 2; }
  shift
  exec "$@"
fi
