#!/usr/bin/env python3
"""Short runs of every registered kind, compared bit for bit with stored ones.

For every family a config selects from (`tapeformer kinds --json`), each kind
trains a tiny model for a few steps with its small test options; attention
kinds are crossed with every positional scheme, run again on rows longer than
one kernel tile with dropout, and with a segment memory; every memory kind
(with the kinds it builds on) runs on every block kind that carries
memories; SPALM trains from a store built on a run; every kind alone runs
again with bf16 products (train.precision bf16 on a CPU with AVX512-BF16,
else bf16_portable: the same bits, so one stored run checks both). Each run is then
sampled and evaluated. What is kept of a run: its metrics.jsonl with the
timing fields dropped, the sampled text and the eval line (or the one error
line of a refused combination), as SHA-256 digests beside the final losses.

    python3 scripts/kind_runs.py build/cli/tapeformer --check tests/fixtures/kind_runs
    python3 scripts/kind_runs.py OLD/cli/tapeformer --plan-from build/cli/tapeformer --write tests/fixtures/kind_runs
    python3 scripts/kind_runs.py build/cli/tapeformer --only 'attention=mine(,|$)' --write tests/fixtures/kind_runs
    python3 scripts/kind_runs.py build/cli/tapeformer --check tests/fixtures/kind_runs --recompute blocks

References are written by the build before a change (the second line: the
runs a new build plans, run by the old one), never by the build under test;
a new kind has no build before it, so its own runs are added by the build
that brings it (the third line: with --only, --write adds to the stored runs).

--recompute trains every run with train.recompute set and compares it with
the stored run made without: activation recompute must not change a bit.

The bits depend on the seed and the shard count, not on the machine: an
AVX2 (x86-64-v3) and an AVX-512 build of the same tree give the same runs, so
one reference file (DIR/runs.json) serves every build; --check exits 1 naming
every run that differs.
"""
import argparse
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

TIMING = re.compile(r"(seconds|_s|per_s|_ms)$")

BASE = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
    "train": {"batch_size": 4, "max_iters": 8, "threads": 2, "shards": 2},
    "schedule": {"warmup_iters": 2, "decay_iters": 8},
    "eval": {"interval": 4, "iters": 2, "final_iters": 2},
    "log": {"interval": 1},
}


def corpus(path):
    with open(path, "w") as f:
        for i in range(1, 401):
            f.write(f"Verse {i}: the quick brown fox jumps over the lazy dog {i * 37 % 101}.\n")


def small(kind):
    """--set arguments for a kind's own small test values."""
    return [f"{o['name']}={json.dumps(o['small'])}" for o in kind["options"] if "small" in o]


def setting(prefix, pairs):
    return [prefix + p for p in pairs]


def plan(families):
    """[(name, [--set key=value, ...])] for every run, from the registries."""
    fam = {f["key"]: f for f in families}
    kinds = {key: {k["name"]: k for k in f["kinds"]} for key, f in fam.items()}
    runs = []

    def kind_sets(key, name):
        f = fam[key]
        return [f"{key}={name}"] + setting(f["prefix"], small(kinds[key][name]))

    # Every kind of every family alone, the rest at their defaults.
    for f in families:
        key = f["key"]
        if "." not in key:
            continue  # no key selects its kinds (the memories, below)
        for name in kinds[key]:
            if key == "model.arch" and name == "spalm":
                continue  # SPALM needs more than a config (a store): its runs are below
            extra = []
            if key == "model.feature_map":
                extra = ["model.attention=linear"]
            elif key == "model.gate":
                extra = ["model.block=gtrxl"]
            elif key == "model.activation":
                extra = ["model.mlp=standard"]
            elif key == "data.tokenizer" and name == "sentencepiece":
                extra = ["data.vocab_size=320"]
            runs.append((f"{key}={name}", extra + kind_sets(key, name)))

    # Every kind alone again with bf16 products: train.precision bf16 where the CPU has AVX512-BF16, else
    # bf16_portable, whose bits are the same (run() picks), so one stored run serves both.
    runs += [("bf16," + name, sets + ["train.precision=bf16"]) for name, sets in list(runs)]

    attention = list(kinds["model.attention"])
    positional = list(kinds["model.positional"])
    # Attention x positional: every score term, rotation and relative term through every kernel.
    for a in attention:
        for p in positional:
            runs.append((f"attention={a},positional={p}", kind_sets("model.attention", a) + kind_sets("model.positional", p)))
    # Rows longer than one 64-row kernel tile, with dropout on the attention weights.
    for a in attention:
        for p in ("learned", "alibi"):
            runs.append((f"long,dropout,attention={a},positional={p}",
                         kind_sets("model.attention", a) + kind_sets("model.positional", p)
                         + ["model.block_size=150", "model.dropout=0.1", "train.batch_size=2"]))
    # A segment memory through every attention kind (those without one refuse), with positions in the
    # scores (ALiBi: a constant term) and in q and k (RoPE).
    for a in attention:
        for p in ("alibi", "rope"):
            runs.append((f"memory=xl,attention={a},positional={p}",
                         kind_sets("model.attention", a) + [f"model.positional={p}", "model.mem_len=16"]))
    # Every memory kind, with the kinds it builds on, on every block kind that carries memories, with
    # Transformer-XL's relative positions.
    memory = fam.get("memory")
    if memory:
        mem = {k["name"]: k for k in memory["kinds"]}

        def with_needs(name):
            sets = []
            for need in mem[name].get("needs", []):
                sets += with_needs(need)
            return sets + setting("model.", small(mem[name]))

        for b, block in kinds["model.block"].items():
            if not block.get("memory"):
                continue
            for m in mem:
                runs.append((f"memory={m},block={b}", kind_sets("model.block", b) + ["model.positional=txl"]
                             + with_needs(m)))
    return runs


def digest(data):
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()[:16]


def strip_timing(metrics):
    out = []
    for line in metrics.splitlines():
        row = json.loads(line)
        out.append(json.dumps({k: v for k, v in row.items() if not TIMING.search(k)}, sort_keys=True))
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def bf16_on_cpu(binary):
    """Whether the build runs bf16 products on this CPU's instructions (`tapeformer --version`)."""
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return "bf16 products on AVX512-BF16" in v


def run(binary, work, name, sets, base_args=None):
    """Trains, samples and evaluates one run; returns what is kept of it."""
    if "train.precision=bf16" in sets and not bf16_on_cpu(binary):
        sets = [s if s != "train.precision=bf16" else "train.precision=bf16_portable" for s in sets]
    out = os.path.join(work, re.sub(r"[^A-Za-z0-9_.=-]", "_", name))
    args = base_args or ["--config", os.path.join(work, "cfg.json"), "--data", os.path.join(work, "text.txt")]
    cmd = [binary, "train", *args, "--out", out]
    for s in sets:
        cmd += ["--set", s]
    t = subprocess.run(cmd, capture_output=True, text=True)
    if t.returncode != 0:
        errors = [l for l in t.stderr.splitlines() if "error" in l]
        return {"refused": errors[-1] if errors else f"exit {t.returncode}"}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = f.read()
    final = json.loads(t.stdout.strip().splitlines()[-1])
    kept = {"metrics": digest(strip_timing(metrics)), "train_loss": final["train_loss"], "val_loss": final["val_loss"]}
    s = subprocess.run([binary, "sample", "--checkpoint", out, "--tokens", "24", "--seed", "1", "--prompt", "Verse"],
                       capture_output=True)  # bytes: a byte tokenizer may sample invalid UTF-8
    kept["sample"] = (digest(s.stdout) if s.returncode == 0
                      else "refused: " + s.stderr.decode(errors="replace").strip().splitlines()[-1])
    e = subprocess.run([binary, "eval", "--checkpoint", out, "--data", os.path.join(work, "text.txt")],
                       capture_output=True, text=True)
    if e.returncode == 0:
        row = json.loads(e.stdout.strip().splitlines()[-1])
        kept["eval"] = {k: v for k, v in row.items() if not TIMING.search(k)}
    else:
        kept["eval"] = "refused: " + e.stderr.strip().splitlines()[-1]
    return kept, out


def spalm_runs(binary, work, extra=()):
    """SPALM: a Transformer-XL run, its kNN store, and SPALM trained from them."""
    kept = {}
    r = run(binary, work, "spalm_retriever", ["model.positional=txl", "model.mem_len=16", *extra])
    if isinstance(r, dict):
        return {"model.arch=spalm": r}
    _, retriever = r
    store = os.path.join(work, "spalm.knn")
    b = subprocess.run([binary, "knn", "build", "--checkpoint", retriever, "--data", os.path.join(work, "text.txt"),
                        "--split", "train", "--out", store, "--index", "exact"], capture_output=True, text=True)
    if b.returncode != 0:
        return {"model.arch=spalm": {"refused": "knn build: " + b.stderr.strip()}}
    sets = ["model.arch=spalm", "model.positional=txl", "model.mem_len=16", "model.spalm_k=3",
            f"model.spalm_store={store}", f"model.spalm_retriever={retriever}"]
    r = run(binary, work, "model.arch=spalm", [*sets, *extra])
    kept["model.arch=spalm"] = r if isinstance(r, dict) else r[0]
    # kNN-LM's mixture through eval, on the retriever and its store.
    e = subprocess.run([binary, "eval", "--checkpoint", retriever, "--data", os.path.join(work, "text.txt"),
                        "--knn", store], capture_output=True, text=True)
    kept["eval --knn"] = (json.loads(e.stdout.strip().splitlines()[-1]) if e.returncode == 0
                          else "refused: " + e.stderr.strip().splitlines()[-1])
    if isinstance(kept["eval --knn"], dict):
        kept["eval --knn"] = {k: v for k, v in kept["eval --knn"].items() if not TIMING.search(k)}
    return kept


def registers(binary):
    """What the build computes with, from `--version`: "16-float packets in 8-float registers, FMA"."""
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+-float packets in \d+-float registers(, FMA)?)", v)
    if not m:
        sys.exit(f"kind_runs.py: `{binary} --version` does not say its vectors: {v.strip()}")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the tapeformer command")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="DIR", help="store this build's runs as DIR/runs.json")
    group.add_argument("--check", metavar="DIR", help="compare with DIR/runs.json")
    ap.add_argument("--only", help="a regular expression: the runs whose names match")
    ap.add_argument("--recompute", metavar="SETTING",
                    help="train every run with train.recompute=SETTING (with --check: against the runs stored "
                         "without it)")
    ap.add_argument("--plan-from", metavar="BINARY",
                    help="plan the runs from this build's registries (kinds --json) and run them with BINARY: "
                         "references for a new plan from the code before a change")
    a = ap.parse_args()
    if a.recompute and a.write:
        ap.error("--recompute checks against the stored runs; it writes none")

    build = registers(a.binary)
    ref_path = os.path.join(a.write or a.check, "runs.json")
    if a.check and not os.path.exists(ref_path):
        sys.exit(f"kind_runs.py: no stored runs at {ref_path}")
    families = json.loads(subprocess.run([a.plan_from or a.binary, "kinds", "--json"], capture_output=True,
                                         text=True, check=True).stdout)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        corpus(os.path.join(work, "text.txt"))
        with open(os.path.join(work, "cfg.json"), "w") as f:
            json.dump(BASE, f)
        extra = [f"train.recompute={a.recompute}"] if a.recompute else []
        for name, sets in plan(families):
            if a.only and not re.search(a.only, name):
                continue
            r = run(a.binary, work, name, sets + extra)
            results[name] = r if isinstance(r, dict) else r[0]
        if not a.only or re.search(a.only, "model.arch=spalm"):
            results.update(spalm_runs(a.binary, work, extra))

    if a.write:
        os.makedirs(a.write, exist_ok=True)
        if a.only and os.path.exists(ref_path):  # a new kind's runs join the stored ones
            with open(ref_path) as f:
                results = {**json.load(f), **results}
        with open(ref_path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
            f.write("\n")
        refused = sum(1 for r in results.values() if "refused" in r)
        print(f"kind_runs.py: {len(results)} runs ({refused} refused combinations) written to {ref_path}")
        return
    with open(ref_path) as f:
        ref = json.load(f)
    differ = [n for n in results if n in ref and results[n] != ref[n]]
    new = [n for n in results if n not in ref]
    missing = [n for n in ref if n not in results and (not a.only or re.search(a.only, n))]
    for n in differ:
        print(f"DIFFERS: {n}\n  stored: {json.dumps(ref[n], sort_keys=True)}\n  now:    {json.dumps(results[n], sort_keys=True)}")
    for n in new:
        print(f"NEW (no stored run): {n}")
    for n in missing:
        print(f"MISSING (stored, not run now): {n}")
    arm = f", train.recompute={a.recompute}" if a.recompute else ""
    print(f"kind_runs.py: {len(results)} runs, {len(differ)} differ, {len(new)} new, {len(missing)} missing ({build}{arm})")
    sys.exit(1 if differ or missing else 0)


if __name__ == "__main__":
    main()
