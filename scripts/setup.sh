#!/usr/bin/env bash
# Installs exactly what building and testing tapeformer needs, from Debian's
# packages, when it is missing. Idempotent and quiet when everything is there.
#
#   bash scripts/setup.sh            # as root (or with sudo available)
#   bash scripts/setup.sh python3-sklearn   # and extra packages a caller needs
#
# A Debian python3-* package serves Debian's interpreter, /usr/bin/python3,
# only: when the python3 on PATH is another one (pyenv's, a venv), the script
# says so, since it then installs nothing that interpreter can import.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache      # build tools (ccache keeps rebuilds fast)
  libeigen3-dev                     # SIMD packets (GEMM kernel) and vectorised maps
  libtbb-dev                        # all parallelism
  libcereal-dev                     # checkpoints
  doctest-dev                       # tests
  nlohmann-json3-dev                # JSON configs and metrics lines
  libsentencepiece-dev pkg-config   # subword tokenizers (found through pkg-config)
  libpcre2-dev                      # GPT-2's pre-tokenising pattern (Unicode letter/digit classes)
  libcli11-dev                      # the tapeformer command's flags
  libfaiss-dev                      # vector search for kNN-LM datastores (retrieval/)
  libopenmpi-dev openmpi-bin        # distributed training (mpirun) and its test
  python3                           # the experiment harness (scripts/experiment.py) and its test
  gnuplot-nox                       # tapeformer plot draws its PNGs with it
  libpng-dev                        # tapeformer sample --png encodes sampled images with it
)
# Extra packages a caller needs, e.g. `bash scripts/setup.sh fortunes`.
packages+=("$@")

# One line on stderr when a python3-* package was asked for and the python3
# on PATH does not read Debian's packages (/usr/lib/python3/dist-packages).
python_note() {
  local asked=() p path_python
  for p in "$@"; do [[ $p == python3-* ]] && asked+=("$p"); done
  [ ${#asked[@]} -eq 0 ] && return 0
  path_python=$(python3 -c 'import sys
if "/usr/lib/python3/dist-packages" not in sys.path: print(f"{sys.executable} (Python {sys.version.split()[0]})")' \
    2> /dev/null) || return 0
  [ -n "$path_python" ] || return 0
  local verb=serves
  [ ${#asked[@]} -gt 1 ] && verb=serve
  echo "setup: ${asked[*]} $verb Debian's /usr/bin/python3 only; the python3 on PATH, $path_python," \
    "does not read Debian's packages: run the script with /usr/bin/python3, or install the module into" \
    "that interpreter with its own pip (python3 -m pip install, by the module's PyPI name)" >&2
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  python_note "$@"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: run as root (or install them with: apt-get install ${missing[*]})" >&2
    exit 1
  fi
else
  SUDO=
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
python_note "$@"
