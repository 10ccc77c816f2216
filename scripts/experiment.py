#!/usr/bin/env python3
"""The experiment harness: arms x seeds from a JSON spec, run in parallel,
resumable, summarised as a table (mean ± sd per arm, markdown and CSV) and
PNG curves with seed bands, and written into docs/results.md.

    python3 scripts/experiment.py experiments/e2a_copy.json [--jobs 2] [--data FILE]
    python3 scripts/experiment.py experiments/charlm_attention.json --data ../shared/data/tinyshakespeare.txt

A spec (experiments/*.json; every key is described in experiments/README.md):

    {"name": "e2a_copy", "title": "...", "about": "...",
     "command": ["{build}/examples/copy_task", "--config", "configs/e2a_copy.json",
                 "--out", "{run_dir}", "--set", "train.seed={seed}", "--set", "train.threads={threads}"],
     "seeds": [1, 2, 3], "threads_per_run": 1,
     "arms": [{"name": "softmax", "args": ["--set", "model.attention=softmax"]}, ...],
     "metrics": "metrics.jsonl",
     "table": [{"field": "accuracy", "label": "copy accuracy", "digits": 4}, ...],
     "compare": [{"field": "val_loss", "baseline": "softmax", "kind": "difference", "label": "Δ loss"}],
     "setup": ["python3-torch"],   # Debian packages the runs need (optional)
     "curves": [{"x": "step", "y": "train_loss", "log_y": true, "file": "e2a_loss.png"}, ...],
     "pictures": [{"arm": "softmax", "seed": 1, "file": "samples.png"}]}   # files runs drew (optional)

Each run (arm, seed) gets its own directory OUT/NAME/ARM/seedS. A run is
finished when its result.json exists (the last JSON line its command printed
on stdout, with the command and wall time): finished runs are skipped, so an
interrupted sweep continues where it stopped. Runs go `--jobs` at a time
(default: cores // threads_per_run). The table and curves are written next to
the runs (table.md, table.csv, *.png); with every run finished, the section
<!-- results:NAME --> of docs/results.md is replaced by the table, the plots
(copied to docs/img/) and the command that reproduces them.

Plots use matplotlib (Debian's python3-matplotlib: the harness installs it
through scripts/setup.sh when missing, and runs itself under /usr/bin/python3
when the python3 on PATH cannot import it); --no-plot skips them.
"""
import argparse
import concurrent.futures
import csv
import datetime
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print(f"experiment: error: {message}", file=sys.stderr)
    sys.exit(2)


def slug(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def load_spec(path):
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"cannot read spec '{path}': {e}")
    for key in ("name", "command", "seeds", "arms"):
        if key not in spec:
            fail(f"spec '{path}': missing key '{key}'")
    if not spec["arms"] or not spec["seeds"]:
        fail(f"spec '{path}': 'arms' and 'seeds' must not be empty")
    names = [a.get("name") for a in spec["arms"]]
    if None in names or len(set(names)) != len(names):
        fail(f"spec '{path}': every arm needs a distinct 'name'")
    return spec


def expand(template, values):
    out = template
    for k, v in values.items():
        out = out.replace("{" + k + "}", str(v))
    left = re.findall(r"\{([a-z_]+)\}", out)
    if left:
        fail(f"command placeholder {{{left[0]}}} has no value (pass --{left[0]}?)")
    return out


_torch = {}


def torch_python():
    """The interpreter of the newest PyTorch the benches use (bench/benchlib.py torch-python: out/torch-venv,
    made on first use; TORCH_PYTHON overrides it), asked once."""
    if "python" not in _torch:
        _torch["python"] = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "benchlib.py"), "torch-python"],
                                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return _torch["python"]


def torch_version():
    if "version" not in _torch:
        _torch["version"] = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "benchlib.py"), "torch-version",
                                            torch_python()], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return _torch["version"]


def run_command(spec, arm, seed, args, threads):
    run_dir = os.path.join(args.out, spec["name"], slug(arm["name"]), f"seed{seed}")
    values = {"build": args.build, "run_dir": run_dir, "seed": seed, "threads": threads, "root": ROOT, "out": args.out}
    if args.data:
        values["data"] = args.data
    if any("{torch_python}" in c for c in spec["command"] + arm.get("args", [])):
        # A dry run prints the commands without making the environment.
        values["torch_python"] = "out/torch-venv/bin/python" if getattr(args, "dry_run", False) else torch_python()
    cmd = [expand(c, values) for c in spec["command"]] + [expand(c, values) for c in arm.get("args", [])]
    return run_dir, cmd


def last_json_line(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def execute(run_dir, cmd, label):
    # A rerun starts the run afresh (its command does not resume).
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    t0 = time.time()
    with open(os.path.join(run_dir, "stdout.txt"), "w") as out, open(os.path.join(run_dir, "stderr.txt"), "w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        out.write(proc.stdout)
    seconds = time.time() - t0
    result = last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None:
        with open(os.path.join(run_dir, "stderr.txt")) as f:
            tail = f.read().strip().splitlines()[-1:] or ["(no output)"]
        return False, f"{label}: exit status {proc.returncode}: {tail[0]}"
    record = {"result": result, "command": cmd, "seconds": round(seconds, 3)}
    tmp = os.path.join(run_dir, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, os.path.join(run_dir, "result.json"))  # the finished marker, written last
    return True, f"{label}: done in {seconds:.0f} s"


def read_result(run_dir):
    try:
        with open(os.path.join(run_dir, "result.json")) as f:
            return json.load(f)["result"]
    except (OSError, json.JSONDecodeError, KeyError):
        return None


def read_metrics(run_dir, name):
    rows = []
    try:
        with open(os.path.join(run_dir, name)) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except OSError:
        pass
    return rows


def mean_sd(values):
    n = len(values)
    if n == 0:
        return None, None
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return m, sd


def fmt(m, sd, digits):
    if m is None:
        return "—"
    s = f"{m:.{digits}f}"
    return s + (f" ± {sd:.{digits}f}" if sd is not None else "")


def field_of(result, field):
    v = result
    for part in field.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    if isinstance(v, list) and len(v) == 1:  # a per-layer figure of one value ("layers": {"ponder_mean": [2.1]})
        v = v[0]
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def finished_runs(spec, args, arm):
    """(seed, run_dir, result) of the finished runs of an arm, in seed order."""
    for seed in spec["seeds"]:
        run_dir, _ = run_command(spec, arm, seed, args, 1)
        r = read_result(run_dir)
        if r is not None:
            if "layers" not in r:  # the per-layer figures of its last evaluation, as fields "layers.NAME"
                logged = [m["layers"] for m in read_metrics(run_dir, spec.get("metrics", "metrics.jsonl"))
                          if isinstance(m.get("layers"), dict)]
                if logged:
                    r = dict(r, layers=logged[-1])
            yield seed, run_dir, r


def arm_results(spec, args, arm):
    """{seed: result} of the finished runs of an arm."""
    return {seed: r for seed, _, r in finished_runs(spec, args, arm)}


def summarise(spec, args):
    """The table: per arm, mean ± sd over seeds of each field, then the
    comparisons with a baseline arm: "difference" (paired by seed: mean ± sd of
    arm - baseline), "ratio" (arm mean / baseline mean) or "speedup"
    (baseline mean / arm mean, for times)."""
    table, compare = spec.get("table", []), spec.get("compare", [])
    header = ["arm", "runs"] + [t.get("label", t["field"]) for t in table] + [c["label"] for c in compare]
    csv_header = ["arm", "runs"]
    for t in table:
        csv_header += [t["field"] + "_mean", t["field"] + "_sd"]
    for c in compare:
        csv_header += [slug(c["label"]) + "_mean", slug(c["label"]) + "_sd"]
    by_arm = {arm["name"]: arm_results(spec, args, arm) for arm in spec["arms"]}
    complete = all(len(r) == len(spec["seeds"]) for r in by_arm.values())
    rows, csv_rows = [], []
    for arm in spec["arms"]:
        results = by_arm[arm["name"]]
        cells, csv_cells = [arm["name"], f"{len(results)}/{len(spec['seeds'])}"], [arm["name"], len(results)]
        for t in table:
            m, sd = mean_sd([v for v in (field_of(r, t["field"]) for r in results.values()) if v is not None])
            cells.append(fmt(m, sd, t.get("digits", 4)))
            csv_cells += [m if m is not None else "", sd if sd is not None else ""]
        for c in compare:
            base = by_arm.get(c["baseline"])
            if base is None:
                fail(f"compare: baseline arm '{c['baseline']}' is not an arm of the spec")
            if c.get("kind", "difference") == "difference":
                diffs = [field_of(results[s], c["field"]) - field_of(base[s], c["field"])
                         for s in results if s in base and field_of(results[s], c["field"]) is not None
                         and field_of(base[s], c["field"]) is not None]
                m, sd = mean_sd(diffs)
                cells.append(("+" if m is not None and m > 0 else "") + fmt(m, sd, c.get("digits", 4)))
            else:  # "ratio": arm / baseline; "speedup": baseline / arm (for times)
                bm, _ = mean_sd([v for v in (field_of(r, c["field"]) for r in base.values()) if v is not None])
                am, _ = mean_sd([v for v in (field_of(r, c["field"]) for r in results.values()) if v is not None])
                num, den = (bm, am) if c["kind"] == "speedup" else (am, bm)
                m, sd = (num / den if num is not None and den else None), None
                cells.append("—" if m is None else f"{m:.{c.get('digits', 1)}f}x")
            csv_cells += [m if m is not None else "", sd if sd is not None else ""]
        rows.append(cells)
        csv_rows.append(csv_cells)
    return header, rows, csv_header, csv_rows, complete


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (said once on stderr)
    when it cannot be imported: the tables are written without plots."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        from _needs import missing

        print(missing("matplotlib", "matplotlib", "python3-matplotlib", "experiment.py", error) + "; no plots",
              file=sys.stderr)
        return None
    return plt


def plot_curves(spec, args, exp_dir):
    plt = pyplot()
    if plt is None:
        return []
    files = []
    for curve in spec.get("curves", []):
        x_key, y_key = curve["x"], curve["y"]
        # "key": rows are matched across seeds by this field (a threshold) instead of by x, and x is
        # then the mean over seeds of each matched row's x (a trade-off curve: loss against layers used).
        key = curve.get("key", x_key)
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        drawn = False
        # "arms_containing": only the arms whose name contains that text (one plot per learning rate, say).
        only = curve.get("arms_containing")
        for arm in (a for a in spec["arms"] if only is None or only in a["name"]):
            series = []  # one dict x -> y per seed
            for _, run_dir, _ in finished_runs(spec, args, arm):
                points = {}
                for row in read_metrics(run_dir, spec.get("metrics", "metrics.jsonl")):
                    if all(isinstance(row.get(k), (int, float)) for k in (key, x_key, y_key)):
                        points[row[key]] = (row[x_key], row[y_key])
                if points:
                    series.append(points)
            if not series:
                continue
            keys = set.intersection(*(set(s) for s in series))
            # each key's x (the mean over seeds), in increasing x
            at = sorted((mean_sd([s[k][0] for s in series])[0], k) for k in keys)
            xs = [x for x, _ in at]
            series = [{x: s[k][1] for x, k in at} for s in series]
            if not xs:
                continue
            # On a log axis the centre is the geometric mean and the band
            # exp(mean ± sd) of the logs (mean - sd can be <= 0); else mean ± sd.
            log = bool(curve.get("log_y")) and all(s[x] > 0 for s in series for x in xs)
            stats = [mean_sd([math.log(s[x]) if log else s[x] for s in series]) for x in xs]
            back = math.exp if log else (lambda v: v)
            style = ("-", "--", ":")[len(ax.get_lines()) // 10 % 3]  # the colour cycle has 10: then dashed, dotted
            line = ax.plot(xs, [back(m) for m, _ in stats], label=f"{arm['name']} (n={len(series)})", linewidth=1.4,
                           linestyle=style)[0]
            if len(series) > 1:
                lo = [back(m - (sd or 0)) for m, sd in stats]
                hi = [back(m + (sd or 0)) for m, sd in stats]
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        if curve.get("log_x"):
            ax.set_xscale("log", base=2 if curve.get("log_x") == 2 else 10)
        if curve.get("log_y"):
            ax.set_yscale("log")
        ax.set_xlabel(curve.get("x_label", x_key))
        ax.set_ylabel(curve.get("y_label", y_key))
        ax.set_title(curve.get("title", f"{spec.get('title', spec['name'])}"), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if len(ax.get_lines()) > 8:  # many arms: the legend beside the axes, the figure wider
            fig.set_size_inches(6.4 + 3.2, 4.2)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        else:
            ax.legend(fontsize=8)
        files.append(save_figure(plt, fig, exp_dir, curve["file"]))
    return files


def plot_points(spec, args, exp_dir):
    """Final figures across arms: per series (the arms whose name contains its
    text), one point per arm at x = the runs' result field `x` and y = mean ±
    sd over seeds of the result field `y` (recall against distance, say).
    With `x` a list of numbers and `y` a list of as many result fields, each
    arm of a series is one line: at x[i], mean ± sd of field y[i] (a run that
    measured recall at several distances itself)."""
    points = spec.get("points", [])
    plt = pyplot() if points else None
    if plt is None:
        return []

    files = []
    for plot in points:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        drawn = False
        for name in plot["series"]:
            if isinstance(plot["y"], list):
                for arm in (a for a in spec["arms"] if name in a["name"]):
                    results = list(arm_results(spec, args, arm).values())
                    line = [(x, mean_sd(ys)) for x, field in zip(plot["x"], plot["y"])
                            if (ys := [v for v in (field_of(r, field) for r in results) if v is not None])]
                    if line:
                        ax.errorbar([x for x, _ in line], [m for _, (m, _) in line],
                                    yerr=[sd or 0 for _, (_, sd) in line], marker="o", capsize=3, linewidth=1.4,
                                    label=f"{arm['name']} (n={len(results)})")
                        drawn = True
                continue
            xs, ms, sds, n = [], [], [], 0
            for arm in (a for a in spec["arms"] if name in a["name"]):
                results = arm_results(spec, args, arm).values()
                x = [v for v in (field_of(r, plot["x"]) for r in results) if v is not None]
                y = [v for v in (field_of(r, plot["y"]) for r in results) if v is not None]
                if not x or not y:
                    continue
                m, sd = mean_sd(y)
                xs.append(sum(x) / len(x))
                ms.append(m)
                sds.append(sd or 0)
                n = max(n, len(y))
            if not xs:
                continue
            order = sorted(range(len(xs)), key=lambda i: xs[i])
            ax.errorbar([xs[i] for i in order], [ms[i] for i in order], yerr=[sds[i] for i in order], marker="o",
                        capsize=3, linewidth=1.4, label=f"{name} (n={n})")
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        if plot.get("log_x"):
            ax.set_xscale("log", base=2 if plot.get("log_x") == 2 else 10)
        if "chance" in plot:
            ax.axhline(plot["chance"], color="grey", linestyle=":", linewidth=1, label=plot.get("chance_label", "chance"))
        ax.set_xlabel(plot.get("x_label", str(plot["x"])))
        ax.set_ylabel(plot.get("y_label", str(plot["y"])))
        ax.set_title(plot.get("title", spec.get("title", spec["name"])), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        files.append(save_figure(plt, fig, exp_dir, plot["file"]))
    return files


def save_figure(plt, fig, exp_dir, name):
    fig.tight_layout()
    path = os.path.join(exp_dir, name)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_bars(spec, args, exp_dir):
    """Per-layer figures a run logged (metrics lines' dict `field`, e.g. "layers":
    {"0.attn.spans": [head 0, head 1, ...]}) at its last logging, as grouped bars:
    one group per key, one bar per entry, mean ± sd over seeds; one panel per arm."""
    bars = spec.get("bars", [])
    plt = pyplot() if bars else None
    if plt is None:
        return []

    files = []
    for bar in bars:
        only = bar.get("arms_containing")
        arms = [a for a in spec["arms"] if only is None or only in a["name"]]
        panels = []
        for arm in arms:
            per_seed = []
            for _, run_dir, _ in finished_runs(spec, args, arm):
                last = None
                for row in read_metrics(run_dir, spec.get("metrics", "metrics.jsonl")):
                    if isinstance(row.get(bar["field"]), dict):
                        last = row[bar["field"]]
                if last:
                    per_seed.append(last)
            if per_seed:
                panels.append((arm["name"], per_seed))
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.2), dpi=110, squeeze=False)
        for ax, (name, per_seed) in zip(axes[0], panels):
            keys = sorted((k for k in per_seed[0] if k in bar.get("keys", per_seed[0])),
                          key=lambda k: [int(p) if p.isdigit() else p for p in k.split(".")])
            width = max(len(per_seed[0][k]) for k in keys)
            for h in range(width):
                stats = [mean_sd([s[k][h] for s in per_seed if k in s and h < len(s[k])]) for k in keys]
                xs = [i + (h - (width - 1) / 2) * 0.8 / width for i in range(len(keys))]
                ax.bar(xs, [m for m, _ in stats], width=0.8 / width, yerr=[sd or 0 for _, sd in stats],
                       label=f"{bar.get('series', 'entry')} {h}", capsize=2)
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels([k.split(".")[0] for k in keys])
            ax.set_xlabel(bar.get("x_label", "layer"))
            ax.set_ylabel(bar.get("y_label", bar["field"]))
            ax.set_title(f"{bar.get('title', bar['field'])}: {name} (n={len(per_seed)})", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        files.append(save_figure(plt, fig, exp_dir, bar["file"]))
    return files


def reproduce_command(spec_path, args):
    cmd = f"python3 scripts/experiment.py {os.path.relpath(spec_path, ROOT)}"
    if args.data:
        cmd += f" --data {os.path.relpath(args.data, ROOT)}"  # as run from the project's root
    return cmd


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}"


def pictures(spec, args, exp_dir, threads):
    """Images runs drew themselves (`pictures`: a file of one arm's run at one
    seed, e.g. its sampled digits), copied next to the table as ARM_FILE."""
    out = []
    arms = {a["name"]: a for a in spec["arms"]}
    for pic in spec.get("pictures", []):
        if pic.get("arm") not in arms:
            fail(f"spec '{spec['name']}': picture of unknown arm {pic.get('arm')!r}")
        run_dir, _ = run_command(spec, arms[pic["arm"]], pic["seed"], args, threads)
        src = os.path.join(run_dir, pic["file"])
        if not os.path.exists(src):
            continue  # an unfinished run: the section is not written either
        dst = os.path.join(exp_dir, f"{slug(pic['arm'])}_{pic['file']}")
        shutil.copyfile(src, dst)
        out.append(dst)
    return out


def write_results(spec, spec_path, args, table_md, plots):
    path = args.results
    begin, end = f"<!-- results:{spec['name']} -->", f"<!-- /results:{spec['name']} -->"
    img_dir = os.path.join(os.path.dirname(path), "img")
    os.makedirs(img_dir, exist_ok=True)
    body = [begin, f"## {spec.get('title', spec['name'])}", ""]
    if spec.get("about"):
        about = spec["about"]
        if "{torch_version}" in about:  # the PyTorch the arms ran on
            about = about.replace("{torch_version}", torch_version())
        body += [about, ""]
    body += [
        f"Reproduce: `{reproduce_command(spec_path, args)}` "
        f"({len(spec['arms'])} arms x {len(spec['seeds'])} seeds, mean ± sd over seeds; "
        f"measured {datetime.date.today().isoformat()} on {machine()}).",
        "",
        table_md,
        "",
    ]
    for p in plots:
        name = f"{spec['name']}_{os.path.basename(p)}"
        shutil.copyfile(p, os.path.join(img_dir, name))
        body.append(f"![{os.path.basename(p)}](img/{name})")
    if plots:
        body.append("")
    if spec.get("notes"):
        body += [spec["notes"], ""]
    body.append(end)
    replace_section(path, spec["name"], "\n".join(body))


def replace_section(path, name, section):
    """Puts `section` (which starts and ends with NAME's markers) in place of
    the one between <!-- results:NAME --> and <!-- /results:NAME --> in the
    results page, or appends it; the page is replaced atomically."""
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        if not text:
            text = ("# Results\n\nMeasured results, each section written by the command that reproduces it "
                    "(`scripts/experiment.py`); do not edit between the markers.\n")
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def use_plotting_python():
    """Installs matplotlib from Debian when missing (scripts/setup.sh) and, when
    this interpreter is not Debian's (pyenv, a venv) and cannot import it,
    starts the harness again under /usr/bin/python3, which can."""
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh"), "python3-matplotlib"], check=True)
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    debian = "/usr/bin/python3"
    if os.path.exists(debian) and os.path.realpath(sys.executable) != os.path.realpath(debian):
        os.execv(debian, [debian] + sys.argv)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="+", help="experiments/NAME.json (several: run one after the other, in this order)")
    p.add_argument("--jobs", type=int, default=0, help="runs at a time (default: cores / threads_per_run)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default: build/)")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "experiments"), help="where the runs go")
    p.add_argument("--data", help="data file, for specs whose command uses {data}")
    p.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"), help="results page to update")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG curves")
    p.add_argument("--no-results", action="store_true", help="do not touch the results page")
    p.add_argument("--dry-run", action="store_true", help="print the commands that would run")
    args = p.parse_args()
    if not args.no_plot and not args.dry_run:
        use_plotting_python()
    if args.data and not os.path.isfile(args.data):
        fail(f"--data '{args.data}' is not a file")
    args.data = os.path.abspath(args.data) if args.data else None
    status = 0
    for path in args.spec:
        status = max(status, run_spec(path, args))
    return status


def run_spec(spec_path, args):
    spec = load_spec(spec_path)
    if "{data}" in json.dumps(spec) and not args.data:
        fail(f"spec '{spec_path}' needs --data FILE")
    threads = int(spec.get("threads_per_run", 1))
    jobs = args.jobs or max(1, (os.cpu_count() or 1) // threads)
    exp_dir = os.path.join(args.out, spec["name"])
    os.makedirs(exp_dir, exist_ok=True)

    if spec.get("setup") and not args.dry_run:  # Debian packages the runs need (scripts/setup.sh installs the missing)
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")] + list(spec["setup"]), check=True)
    # Seed-major order: the arms alternate, so a slow spell of the machine
    # hits all of them, and every arm has results early.
    pending = []
    for seed in spec["seeds"]:
        for arm in spec["arms"]:
            run_dir, cmd = run_command(spec, arm, seed, args, threads)
            if read_result(run_dir) is not None:
                continue
            pending.append((run_dir, cmd, f"{arm['name']} / seed {seed}"))
    total = len(spec["arms"]) * len(spec["seeds"])
    print(f"experiment {spec['name']}: {total - len(pending)} of {total} runs finished, {len(pending)} to run, "
          f"{jobs} at a time", file=sys.stderr)
    failures = []
    if args.dry_run:
        for run_dir, cmd, label in pending:
            print(" ".join(cmd))
        return 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(execute, *job) for job in pending]
        for fut in concurrent.futures.as_completed(futures):
            ok, message = fut.result()
            print(f"experiment {spec['name']}: {message}", file=sys.stderr)
            if not ok:
                failures.append(message)

    header, rows, csv_header, csv_rows, complete = summarise(spec, args)
    table_md = markdown_table(header, rows)
    with open(os.path.join(exp_dir, "table.md"), "w") as f:
        f.write(table_md + "\n")
    with open(os.path.join(exp_dir, "table.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(csv_header)
        w.writerows(csv_rows)
    print(table_md)
    plots = [] if args.no_plot else plot_curves(spec, args, exp_dir) + plot_bars(spec, args, exp_dir) + plot_points(spec, args, exp_dir)
    plots += pictures(spec, args, exp_dir, threads)
    if complete and not args.no_results:
        write_results(spec, spec_path, args, table_md, plots)
        print(f"experiment {spec['name']}: wrote its section of {os.path.relpath(args.results, ROOT)}", file=sys.stderr)
    elif not complete:
        print(f"experiment {spec['name']}: some runs are unfinished; {os.path.relpath(args.results, ROOT)} "
              "is left as it was", file=sys.stderr)
    if failures:
        print(f"experiment {spec['name']}: {len(failures)} run(s) failed (their stderr.txt says why)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
