#!/usr/bin/env bash
# tapeformer added to a user's project with add_subdirectory, next to a
# user target named `tapeformer`: the project configures (the package's own
# consumer build, C++14 asked and <tapeformer/...> headers, is
# custom_attention.sh's).
# Usage: subproject.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: subproject.sh SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/app"
cat > "$work/app/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(app LANGUAGES CXX)
add_subdirectory("$src" tapeformer-build)
add_executable(tapeformer main.cpp)
target_link_libraries(tapeformer PRIVATE tapeformer::core)
CMAKE
cat > "$work/app/main.cpp" <<'CPP'
#include <tapeformer/core/tensor.h>
int main() { return tapeformer::Tensor::ones({2, 3}).numel() == 6 ? 0 : 1; }
CPP
cmake -S "$work/app" -B "$work/build" -G Ninja -DCMAKE_CXX_STANDARD=14 -DTAPEFORMER_NATIVE=OFF \
    > "$work/log" 2>&1 || { cat "$work/log"; echo "FAIL: configure"; exit 1; }
echo "subproject: configures with a user target named tapeformer"
