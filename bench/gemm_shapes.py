"""PyTorch side of bench/gemm_vs_pytorch.sh: the matrix products that
bench/gemm_shapes printed (its JSON lines, on stdin), timed with torch.mm on
one thread, in GFLOP/s, best of five timed repeats of SECONDS / 5 each. A
transposed A is a transposed view, as in autograd's backward. Each call also
pays Python's and PyTorch's dispatch (a few microseconds), a few percent on
the smallest products.

    bench/gemm_shapes > shapes.jsonl && python3 bench/gemm_shapes.py [SECONDS] < shapes.jsonl
"""
import json
import sys
import time

import torch


def gflops(m, k, n, seconds, f):
    f()
    best = 0.0
    for _ in range(5):
        calls, t0 = 0, time.perf_counter()
        while True:
            f()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds / 5:
                break
        best = max(best, 2.0 * m * k * n * calls / elapsed / 1e9)
    return best


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    torch.set_num_threads(1)
    torch.manual_seed(1)
    for line in sys.stdin:
        s = json.loads(line)
        m, k, n = s["m"], s["k"], s["n"]
        a = torch.randn(k, m).t() if s["transposed_a"] else torch.randn(m, k)
        b, c = torch.randn(k, n), torch.empty(m, n)
        s["pytorch_gflops"] = round(gflops(m, k, n, seconds, lambda: torch.mm(a, b, out=c)), 1)
        print(json.dumps(s), flush=True)


if __name__ == "__main__":
    main()
