#!/usr/bin/env bash
# The installed package as a user meets it: `cmake --install` into a
# temporary prefix, then examples/custom_layer (a project of its own) finds
# tapeformer with find_package, builds, gradchecks its SwiGLU op and trains a
# model of its own block kind through the library's Trainer.
# Usage: install_example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=${1:?usage: install_example.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: install_example.sh BUILD_DIR SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # a step's output only when it fails
  "$@" > "$work/log" 2>&1 || { cat "$work/log"; echo "FAIL: $*"; exit 1; }
}
run cmake --install "$build" --prefix "$work/prefix"
for f in bin/tapeformer lib/cmake/tapeformer/tapeformerConfig.cmake lib/cmake/tapeformer/tapeformerConfigVersion.cmake \
         include/tapeformer/layers/transformer.h; do
  [ -e "$work/prefix/$f" ] || [ -e "$work/prefix/${f/lib\//lib64/}" ] || { echo "FAIL: $f not installed"; exit 1; }
done
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
run cmake -S "$src/examples/custom_layer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}"
run cmake --build "$work/build"
"$work/build/custom_layer"
