"""tapeformer against PyTorch at every thread count, in one run: nanoGPT's CPU
recipe (configs/shakespeare_char_cpu.json) and its default shakespeare_char
model (configs/shakespeare_char.json, 10.7M parameters), each trained by
`tapeformer train` and by bench/charlm_reference.py (nanoGPT's model and loop
in PyTorch) on the same data, alternating which goes first. The PyTorch is the
newest on PyPI, in a virtual environment made on first use (out/torch-venv;
benchlib.torch_python), never a dependency of tapeformer; its version is in
every table.

    python3 bench/scale.py DATA                       # threads 1, 2, 4, ... up to min(cores, 16)
    python3 bench/scale.py DATA --threads 1,2 --large-steps 12 --small-steps 300
    python3 bench/scale.py DATA --no-results          # print only; leave docs/results.md alone
    python3 bench/scale.py DATA --precisions fp32     # no bf16 runs (the default where the CPU has AVX512-BF16)
    python3 bench/scale.py DATA --also-torch /usr/bin/python3   # and Debian's PyTorch 1.13 in the same turns
    TORCH_PYTHON=/usr/bin/python3 python3 bench/scale.py DATA   # Debian's PyTorch as the peer instead

For each recipe and thread count it prints tokens/s of each, their ratio, the
model-FLOP rate of each (nanoGPT's 6N + 12 L H Q T FLOPs per token) against the
machine's measured peaks at that thread count (bench/machine_peak: an FMA loop
on every core used, and the best GEMM), and the peak RSS of each. The table
goes to docs/results.md (section "scale") with the command and the machine.
tokens/s are over all the run's steps (the first included) and exclude
evaluation, as the trainers report them.

With bf16 (`train.precision=bf16`; PyTorch: `torch.autocast("cpu",
dtype=torch.bfloat16)`, `charlm_reference.py --precision bf16`), a second
table puts each in both precisions side by side, with every PyTorch run:
the peer (--torch-venv DIR, or $TORCH_PYTHON; --torch-venv none: Debian's
/usr/bin/python3) and each --also-torch interpreter, run in the same turns.
Without bf16, that table appears when there is an --also-torch.
"""
import argparse
import json
import os
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
from benchlib import ROOT  # noqa: E402


def fail(message):
    print(f"scale.py: {message}", file=sys.stderr)
    sys.exit(2)


# The peer PyTorch's matrix product (MKL in PyPI's build, OpenBLAS in Debian's)
# on the same 1536^3 product as machine_peak's GEMM, best of 10 calls: the best
# GEMM at hand is the better of the two.
TORCH_GEMM = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = 1536
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(3): a @ b
best = 0.0
for _ in range(10):
    t0 = time.perf_counter(); a @ b; best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
print(best)
"""


def flops_per_token(config_path, params):
    """nanoGPT's estimate_mfu: 6 N + 12 L H Q T, N without the position table."""
    with open(os.path.join(ROOT, config_path)) as f:
        m = json.load(f)["model"]
    n = params - m["block_size"] * m["n_embd"]
    return 6 * n + 12 * m["n_layer"] * m["n_embd"] * m["block_size"]  # H * Q = C


def bf16_supported():
    """Whether this CPU has the bf16 dot products tapeformer's bf16 needs (core/kernels/precision.h)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return all(f" {flag}" in flags for flag in ("avx512f", "avx512bw", "avx512_bf16"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_arguments(ap, "scale")
    ap.add_argument("--threads", help="comma-separated thread counts (default 1, 2, 4, ... up to min(cores, 16))")
    ap.add_argument("--precisions", help="fp32 and/or bf16, comma-separated (default: both on a CPU with "
                                         "AVX512-BF16, else fp32)")
    ap.add_argument("--torch-venv", help="virtual environment of the PyTorch peer (default: $TORCH_PYTHON when "
                                         "set, else out/torch-venv with the newest PyTorch on PyPI, made on first "
                                         "use; 'none': Debian's /usr/bin/python3)")
    ap.add_argument("--also-torch", metavar="PYTHON", action="append", default=[],
                    help="another interpreter with PyTorch (e.g. /usr/bin/python3: Debian's 1.13) run in the same "
                         "turns, in every precision, and shown in the second table (repeatable)")
    args = ap.parse_args()
    precisions = (args.precisions or ("fp32,bf16" if bf16_supported() else "fp32")).split(",")
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions) or "fp32" not in precisions:
        fail(f"--precisions must be fp32 or fp32,bf16, got '{args.precisions}'")
    if "bf16" in precisions and not bf16_supported():
        fail("--precisions bf16 needs a CPU with AVX512-BF16 (avx512_bf16 in /proc/cpuinfo)")
    chosen = benchlib.selected(args, fail)
    cores = os.cpu_count() or 1
    if args.threads:
        try:
            threads = [int(t) for t in args.threads.split(",")]
        except ValueError:
            fail(f"--threads must be comma-separated integers, got '{args.threads}'")
        if any(t < 1 for t in threads):
            fail("--threads must be positive")
    else:
        threads = sorted({t for t in (1, 2, 4, 8, 16) if t <= min(cores, 16)} | {min(cores, 16)})

    # The PyTorch builds compared: the peer (the newest on PyPI unless chosen otherwise), then --also-torch.
    peers = [benchlib.torch_python(args.torch_venv)] + args.also_torch
    if len({os.path.realpath(p) for p in peers}) < len(peers):
        fail(f"--also-torch names the peer's interpreter again: {', '.join(peers)}")
    debian = sorted({pkg for p in peers for pkg in benchlib.debian_torch_packages(p)})  # for Debian's torch
    subprocess.run(["bash", "scripts/setup.sh", *debian, "time"], cwd=ROOT, check=True)
    versions = [benchlib.torch_version(p) for p in peers]
    import_rss = benchlib.torch_import_rss_mb(peers[0])  # part of every peak RSS of the peer's runs
    for p, v in zip(peers, versions):
        print(f"scale.py: PyTorch {v} ({benchlib.torch_origin(p)}): {p}", file=sys.stderr)
    print(f"scale.py: importing PyTorch {versions[0]} alone: peak RSS {import_rss:.0f} MB", file=sys.stderr)
    print("scale.py: building (Release)...", file=sys.stderr)
    benchlib.build("tapeformer_command", "machine_peak")
    os.makedirs(args.out, exist_ok=True)

    peaks = {}
    out = subprocess.run(["build/bench/machine_peak", "1"] + [str(t) for t in threads], cwd=ROOT, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        p = json.loads(line)
        t = p["threads"]
        env = dict(os.environ, OMP_NUM_THREADS=str(t))
        p["torch_gemm_gflops"] = float(subprocess.run([peers[0], "-c", TORCH_GEMM, str(t)], env=env, check=True,
                                                      stdout=subprocess.PIPE, text=True).stdout)
        p["best_gemm"] = max(p["gemm_gflops"], p["torch_gemm_gflops"])
        peaks[t] = p
        print(f"peak at {t} threads ({p['isa']}): FMA {p['fma_gflops']:.0f} GFLOP/s, GEMM: tapeformer "
              f"{p['gemm_gflops']:.0f}, PyTorch {p['torch_gemm_gflops']:.0f} GFLOP/s", file=sys.stderr)

    rows = []
    for name, recipe, steps in chosen:
        sets = benchlib.overrides(steps)
        for i, t in enumerate(threads):
            env = dict(os.environ, OMP_NUM_THREADS=str(t), TAPEFORMER_THREADS=str(t))
            runs = []  # (impl, precision, command): tapeformer and each PyTorch, in each precision
            for p in precisions:
                run_dir = os.path.join(args.out, f"{name}-{t}-{p}")
                runs.append(("tapeformer", p, ["build/cli/tapeformer", "train", "--config", recipe["config"], "--data",
                                               args.data, "--out", run_dir, "--threads", str(t),
                                               "--set", f"train.precision={p}"] + sets))
                for k, python in enumerate(peers):
                    runs.append((f"pytorch-{k}", p, [python, "bench/charlm_reference.py", "--config",
                                                     recipe["config"], "--data", args.data, "--threads", str(t),
                                                     "--precision", p] + sets))
            if i % 2:
                runs.reverse()  # alternate which goes first: a slow spell of a shared machine hits all alike
            results = {}
            for impl, p, cmd in runs:
                print(f"scale.py: {name} recipe, {t} threads: {impl} {p}...", file=sys.stderr)
                subprocess.run(["rm", "-rf", os.path.join(args.out, f"{name}-{t}-{p}")])
                results[(impl, p)] = benchlib.run_timed(cmd, env, os.path.join(args.out, f"{name}-{t}-{impl}-{p}.log"),
                                                        fail)
                if impl != "tapeformer" and results[(impl, p)].get("torch") != versions[int(impl.split("-")[1])]:
                    fail(f"{impl} reports PyTorch {results[(impl, p)].get('torch')}, not "
                         f"{versions[int(impl.split('-')[1])]}")
            ours, theirs = results[("tapeformer", "fp32")], results[("pytorch-0", "fp32")]
            fpt = flops_per_token(recipe["config"], ours["params"])
            row = {"recipe": recipe["label"], "threads": t, "steps": steps, "ours": ours, "theirs": theirs,
                   "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
                   "ours_gflops": ours["tokens_per_s"] * fpt / 1e9, "theirs_gflops": theirs["tokens_per_s"] * fpt / 1e9,
                   "fma_peak": peaks[t]["fma_gflops"], "gemm_peak": peaks[t]["best_gemm"],
                   "rss_ratio": ours["peak_rss_mb"] / theirs["peak_rss_mb"], "torch": versions[0],
                   "torch_python": peers[0], "torch_import_rss_mb": import_rss,
                   "also_torch": dict(zip(args.also_torch, versions[1:])),
                   "runs": {f"{impl} {p}": r for (impl, p), r in results.items()}}
            rows.append(row)
            print(f"  tapeformer {ours['tokens_per_s']:.0f} tok/s, PyTorch {theirs['tokens_per_s']:.0f} tok/s: "
                  f"{row['ratio']:.2f}x; RSS {ours['peak_rss_mb']:.0f} / {theirs['peak_rss_mb']:.0f} MB", file=sys.stderr)
            if "bf16" in precisions or len(peers) > 1:
                print("  " + ", ".join(f"{impl} {p} {r['tokens_per_s']:.0f} tok/s" for (impl, p), r in results.items()
                                       if p == "bf16" or impl not in ("tapeformer", "pytorch-0")), file=sys.stderr)
            with open(os.path.join(args.out, "scale.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")

    v0 = versions[0]
    header = (f"| recipe | threads | tapeformer tok/s | PyTorch {v0} tok/s | ratio | tapeformer GFLOP/s (of FMA peak, "
              f"of best GEMM) | PyTorch {v0} GFLOP/s (of FMA peak) | peak RSS MB: tapeformer / PyTorch {v0} (ratio) |")
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | {r['threads']} | {r['ours']['tokens_per_s']:,.0f} | {r['theirs']['tokens_per_s']:,.0f} "
            f"| **{r['ratio']:.2f}x** | {r['ours_gflops']:.0f} ({r['ours_gflops'] / r['fma_peak']:.0%}, "
            f"{r['ours_gflops'] / r['gemm_peak']:.0%}) | {r['theirs_gflops']:.0f} "
            f"({r['theirs_gflops'] / r['fma_peak']:.0%}) | {r['ours']['peak_rss_mb']:,.0f} / "
            f"{r['theirs']['peak_rss_mb']:,.0f} ({r['rss_ratio']:.2f}) |")
    scaling = []
    for _, recipe, _ in chosen:
        per = {r["threads"]: r for r in rows if r["recipe"] == recipe["label"]}
        if 1 in per and len(per) > 1:
            parts = [f"{t}: {per[t]['ours']['tokens_per_s'] / per[1]['ours']['tokens_per_s']:.2f}x "
                     f"(PyTorch {per[t]['theirs']['tokens_per_s'] / per[1]['theirs']['tokens_per_s']:.2f}x)"
                     for t in sorted(per) if t != 1]
            scaling.append(f"- {recipe['label']}, tokens/s against 1 thread: " + ", ".join(parts))
    peak_text = "; ".join(f"{t} thread{'s' if t > 1 else ''}: FMA {p['fma_gflops']:.0f}, GEMM {p['gemm_gflops']:.0f} "
                          f"(tapeformer) and {p['torch_gemm_gflops']:.0f} (PyTorch {v0}) GFLOP/s"
                          for t, p in sorted(peaks.items()))
    table = "\n".join(lines)
    print(table)
    print("\n".join(scaling))
    bf16 = "bf16" in precisions
    bf16_lines = []  # every precision of every PyTorch run: with bf16, or with an --also-torch
    if bf16 or len(peers) > 1:
        head = "| recipe | threads | tapeformer fp32 |" + (" tapeformer bf16 | bf16 / fp32 |" if bf16 else "")
        for v in versions:
            head += (f" PyTorch {v} fp32 | PyTorch {v} bf16 | tapeformer bf16 / PyTorch {v} bf16 |" if bf16 else
                     f" PyTorch {v} fp32 | tapeformer fp32 / PyTorch {v} fp32 |")
        head += " peak RSS MB, tapeformer fp32 / bf16 |" if bf16 else ""
        bf16_lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for r in rows:
            tok = {k: v["tokens_per_s"] for k, v in r["runs"].items()}
            line = f"| {r['recipe']} | {r['threads']} | {tok['tapeformer fp32']:,.0f} |"
            if bf16:
                line += f" {tok['tapeformer bf16']:,.0f} | **{tok['tapeformer bf16'] / tok['tapeformer fp32']:.2f}x** |"
            for k in range(len(peers)):
                fp32 = tok[f"pytorch-{k} fp32"]
                if bf16:
                    b = tok[f"pytorch-{k} bf16"]
                    line += f" {fp32:,.0f} | {b:,.0f} | **{tok['tapeformer bf16'] / b:.2f}x** |"
                else:
                    line += f" {fp32:,.0f} | **{tok['tapeformer fp32'] / fp32:.2f}x** |"
            if bf16:
                line += (f" {r['runs']['tapeformer fp32']['peak_rss_mb']:,.0f} / "
                         f"{r['runs']['tapeformer bf16']['peak_rss_mb']:,.0f} |")
            bf16_lines.append(line)
        print("\n".join(bf16_lines))
    if args.no_results:
        return
    extra = (f" --threads {args.threads}" if args.threads else "") + \
        (f" --precisions {args.precisions}" if args.precisions else "") + \
        (f" --torch-venv {args.torch_venv}" if args.torch_venv else "") + \
        "".join(f" --also-torch {p}" for p in args.also_torch)
    cmd = benchlib.reproduce("scale.py", args, extra)
    if not args.torch_venv and os.environ.get("TORCH_PYTHON"):
        cmd = f"TORCH_PYTHON={os.environ['TORCH_PYTHON']} {cmd}"
    peer_text = ", ".join(f"{v} ({benchlib.torch_origin(p)})" for p, v in zip(peers, versions))
    isa = next(iter(peaks.values()))["isa"] if peaks else "?"
    intro = (
        "nanoGPT's CPU recipe (4 layers, width 128, block 64, batch 12; "
        f"{args.small_steps} steps) and its default shakespeare_char model (6 layers, 6 heads, width 384, block 256, "
        f"batch 64, dropout 0.2, 10.7M parameters; {args.large_steps} steps), fp32, trained by `tapeformer train` "
        f"and by `bench/charlm_reference.py` (nanoGPT's model and loop; PyTorch {v0}, "
        f"{benchlib.torch_origin(peers[0])}) on tiny shakespeare, "
        "one after the other at each thread count (alternating which goes first). tokens/s over all steps "
        "(evaluation excluded); GFLOP/s are model FLOPs (nanoGPT's 6N + 12 L H Q T per token) against the "
        f"machine's measured peaks at that thread count ({isa}; {peak_text}): an FMA loop in registers on every "
        "thread (`build/bench/machine_peak`) and the best GEMM at hand, tapeformer's or PyTorch's on a 1536³ "
        f"product; peak RSS from `/usr/bin/time -v` (`import torch` alone: {import_rss:,.0f} MB for PyTorch {v0}).")
    body = [table] + (["", "\n".join(scaling)] if scaling else [])  # scaling: none for one thread count
    if bf16_lines and bf16:
        body += ["", "bf16 (`train.precision=bf16`: bf16 operands of every product, float32 sums, weights and "
                 "optimizer; PyTorch: `torch.autocast(\"cpu\", dtype=torch.bfloat16)` around each forward, as "
                 "nanoGPT's `dtype='bfloat16'`), tokens/s, the same runs as above and in the same turns, with "
                 f"PyTorch {peer_text}:", "", "\n".join(bf16_lines)]
    elif bf16_lines:
        body += ["", f"fp32 tokens/s of every PyTorch run, the same runs as above and in the same turns: PyTorch "
                 f"{peer_text}:", "", "\n".join(bf16_lines)]
    benchlib.write_section(args.results, "scale", "Threads: tapeformer against PyTorch on the two recipes", intro,
                           cmd, body)


if __name__ == "__main__":
    main()
