#!/usr/bin/env bash
# The recipe's matrix products on one core: tapeformer's packet GEMM, Eigen's
# GEMM and PyTorch's torch.mm (Debian's PyTorch on OpenBLAS), in one run.
#
#   bash bench/gemm_vs_pytorch.sh [SECONDS_PER_SHAPE]     # default 0.5 (about a minute in all)
#   OUT=out/gemm bash bench/gemm_vs_pytorch.sh
#
# bench/gemm_shapes (C++) measures tapeformer and Eigen, then
# bench/gemm_shapes.py measures PyTorch on the same shapes, one after the
# other (never at the same time). Prints GFLOP/s per shape, the ratios
# tapeformer/PyTorch and tapeformer/Eigen, and their geometric means; the
# rows also go to OUT/gemm.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-0.5}
[[ "$seconds" =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "gemm_vs_pytorch.sh: SECONDS_PER_SHAPE must be a number, got '$seconds'" >&2; exit 2; }
out=${OUT:-out/gemm}

bash scripts/setup.sh python3-torch libopenblas0-openmp
echo "gemm_vs_pytorch.sh: building (Release)..." >&2
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target gemm_shapes >/dev/null
mkdir -p "$out"

build/bench/gemm_shapes "$seconds" > "$out/tapeformer.jsonl"
OMP_NUM_THREADS=1 /usr/bin/python3 bench/gemm_shapes.py "$seconds" < "$out/tapeformer.jsonl" > "$out/gemm.jsonl"

/usr/bin/python3 - "$out/gemm.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'product (m x k x n)':<36} {'tapeformer':>10} {'eigen':>7} {'pytorch':>8} {'vs pytorch':>10} {'vs eigen':>9}")
for r in rows:
    label = f"{r['shape']} ({r['m']}x{r['k']}x{r['n']}{', A^T' if r['transposed_a'] else ''})"
    print(f"{label:<36} {r['tapeformer_gflops']:10.1f} {r['eigen_gflops']:7.1f} {r['pytorch_gflops']:8.1f} "
          f"{r['tapeformer_gflops'] / r['pytorch_gflops']:9.2f}x {r['tapeformer_gflops'] / r['eigen_gflops']:8.2f}x")
geo = lambda key: math.exp(sum(math.log(r['tapeformer_gflops'] / r[key]) for r in rows) / len(rows))
print(f"{'geometric mean of the ratios':<36} {'':>10} {'':>7} {'':>8} {geo('pytorch_gflops'):9.2f}x {geo('eigen_gflops'):8.2f}x")
PY
echo "gemm_vs_pytorch.sh: GFLOP/s on one core, best of 5; rows in $out/gemm.jsonl" >&2
