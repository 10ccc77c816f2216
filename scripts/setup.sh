#!/usr/bin/env bash
# Installs exactly what building and testing tapeformer needs, from Debian's
# packages, when it is missing. Idempotent and quiet when everything is there.
#
#   bash scripts/setup.sh            # as root (or with sudo available)
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache      # build tools (ccache keeps rebuilds fast)
  libeigen3-dev                     # SIMD packets (GEMM kernel) and vectorised maps
  libtbb-dev                        # all parallelism
  libcereal-dev                     # checkpoints
  doctest-dev                       # tests
  nlohmann-json3-dev                # JSON configs and metrics lines
  libsentencepiece-dev pkg-config   # subword tokenizers (found through pkg-config)
  libcli11-dev                      # the tapeformer command's flags
  libfaiss-dev                      # vector search for kNN-LM datastores (retrieval/)
  libopenmpi-dev openmpi-bin        # distributed training (mpirun) and its test
  python3                           # the experiment harness (scripts/experiment.py) and its test
  gnuplot-nox                       # tapeformer plot draws its PNGs with it
  libpng-dev                        # tapeformer sample --png encodes sampled images with it
)
# Extra packages a caller needs, e.g. `bash scripts/setup.sh fortunes`.
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

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
