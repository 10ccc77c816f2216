#!/usr/bin/env bash
# The test command: install build deps if missing, configure, build, run ctest.
#
#   bash scripts/test.sh                       # Release build in build/
#   BUILD_DIR=build-asan CMAKE_ARGS=-DTAPEFORMER_SANITIZE=ON bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
start=$(date +%s)
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DTAPEFORMER_BUILD_TESTS=ON ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
echo "test.sh: build + tests took $(( $(date +%s) - start )) s"
