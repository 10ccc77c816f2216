"""What the benchmarks that write docs/results.md share (scale.py, ranks.py,
rss_depth.py): the two char-LM recipes and their options, the build, a run
timed by /usr/bin/time, and the section of the results page."""
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import experiment  # noqa: E402  (replace_section, machine)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPES = {
    "small": {"label": "nanoGPT CPU recipe (0.8M)", "config": "configs/shakespeare_char_cpu.json"},
    "large": {"label": "shakespeare_char (10.7M)", "config": "configs/shakespeare_char.json"},
}


def add_arguments(ap, out_name):
    """DATA and the options every scaling benchmark takes."""
    ap.add_argument("data", help="a UTF-8 text file (tiny shakespeare)")
    ap.add_argument("--small-steps", type=int, default=300)
    ap.add_argument("--large-steps", type=int, default=12)
    ap.add_argument("--recipes", default="small,large")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", out_name))
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    ap.add_argument("--no-results", action="store_true")


def selected(args, fail):
    """[(name, recipe, steps)] that --recipes names, after checking DATA."""
    if not os.path.isfile(args.data):
        fail(f"data file '{args.data}' not found")
    names = args.recipes.split(",")
    unknown = [n for n in names if n not in RECIPES]
    if unknown or not names:
        fail(f"--recipes must name small and/or large, got '{args.recipes}'")
    return [(n, RECIPES[n], args.small_steps if n == "small" else args.large_steps) for n in names]


def reproduce(script, args, extra=""):
    """The command line that reruns `script` as it ran: DATA, `extra` options, and the recipe options
    that differ from their defaults."""
    cmd = f"python3 bench/{script} {os.path.relpath(args.data, ROOT)}{extra}"
    if args.small_steps != 300 or args.large_steps != 12:
        cmd += f" --small-steps {args.small_steps} --large-steps {args.large_steps}"
    if args.recipes != "small,large":
        cmd += f" --recipes {args.recipes}"
    return cmd


def overrides(steps):
    """--set arguments: `steps` steps, one evaluation at the end on 20 batches."""
    sets = [f"train.max_iters={steps}", f"schedule.decay_iters={max(steps, 100)}", f"eval.interval={steps}",
            "eval.iters=1", "eval.final_iters=20"]
    return [a for s in sets for a in ("--set", s)]


def build(*targets):
    """Configures build/ (Release) and builds `targets`, quietly."""
    subprocess.run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "build", "--target", *targets], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def run_timed(cmd, env, log_path, fail):
    """Runs cmd under /usr/bin/time -v, stderr to log_path; returns its last JSON line on stdout, with
    "peak_rss_mb" added (the process's peak RSS). fail(message) when it fails or prints no result."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing, open(log_path, "w") as log:
        proc = subprocess.run(["/usr/bin/time", "-v", "-o", timing.name] + cmd, cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=log, text=True)
        if proc.returncode != 0:
            fail(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}); see {log_path}")
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing.read())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        fail(f"no result line from {' '.join(cmd[:3])} ...; see {log_path}")
    result = json.loads(lines[-1])
    result["peak_rss_mb"] = int(rss.group(1)) / 1024 if rss else float("nan")
    return result


def train_timed(config, data, sets, fail, prefix="bench-"):
    """`tapeformer train --config CONFIG --data DATA --set S...` in a run directory of its own, under
    run_timed; the directory and the log are removed after a run that succeeds (a failure keeps the log
    it names). Returns run_timed's result."""
    out = tempfile.mkdtemp(prefix=prefix)
    cmd = ["build/cli/tapeformer", "train", "--config", config, "--data", data, "--out", out]
    for s in sets:
        cmd += ["--set", s]
    result = run_timed(cmd, None, out + ".log", fail)
    shutil.rmtree(out)
    os.remove(out + ".log")
    return result


def mean_sd(values, digits=0):
    """'mean ± sd' of a list of numbers (sd 0 for one value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def write_section(results, name, title, intro, cmd, body):
    """Replaces the section `name` of the results page: the title, the intro, the command that
    reproduces it with today's date and the machine, then the lines of `body`."""
    section = "\n".join([
        f"<!-- results:{name} -->",
        f"## {title}",
        "",
        intro,
        "",
        f"Reproduce: `{cmd}` (measured {datetime.date.today().isoformat()} on {experiment.machine()}).",
        "",
        *body,
        "",
        f"<!-- /results:{name} -->",
    ])
    experiment.replace_section(results, name, section)
    print(f"{os.path.basename(sys.argv[0])}: wrote the '{name}' section of {os.path.relpath(results, ROOT)}",
          file=sys.stderr)
