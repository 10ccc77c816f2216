"""What the benchmarks that write docs/results.md share (scale.py, ranks.py,
rss_depth.py): the two char-LM recipes and their options, the build, a run
timed by /usr/bin/time, the section of the results page, and the interpreter
that runs the PyTorch peer (bench/charlm_reference.py) for every bench.

The PyTorch peer runs on the newest PyTorch on PyPI, in a virtual environment
out of the repository's tracked files (never a dependency of tapeformer):

    python3 bench/benchlib.py torch-python            # its interpreter's path (made on first use)
    python3 bench/benchlib.py torch-python --venv DIR # another virtual environment ('none': Debian's /usr/bin/python3)
    python3 bench/benchlib.py torch-version [PYTHON]  # torch.__version__ of PYTHON (default: the one above)
    TORCH_PYTHON=/usr/bin/python3 ...                 # any interpreter with torch instead (here Debian's 1.13)
"""
import argparse
import datetime
import functools
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

# The PyTorch peer's interpreter (torch_python): $TORCH_PYTHON when set, else the
# virtual environment TORCH_VENV, made on first use with the newest torch on PyPI;
# out/hf-venv (tests/fixtures/make_hf_gpt2.py: the newest torch and transformers)
# serves instead while TORCH_VENV has not been made, to spare a second install.
TORCH_VENV = os.path.join(ROOT, "out", "torch-venv")
HF_VENV = os.path.join(ROOT, "out", "hf-venv")
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's python3-torch (PyTorch 1.13 on the system BLAS)

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


def parse_data_bench(ap, fail):
    """The arguments of a bench that trains on a DATA file and writes a results section: adds --results and
    --no-results to `ap` (which declares "data" and its own options), parses, checks the file and builds
    the tapeformer command."""
    ap.add_argument("--results", default=os.path.join(ROOT, "docs", "results.md"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args()
    if not os.path.isfile(args.data):
        fail(f"data file '{args.data}' not found")
    build("tapeformer_command")
    return args


def publish(ap, args, script, name, title, intro, table):
    """Prints a parse_data_bench bench's table and, unless --no-results, writes it as the section `name`
    of the results page with the command that reruns it: DATA and every option `ap` parsed to a value
    other than its default."""
    print(table)
    if args.no_results:
        return
    cmd = f"python3 bench/{script} {os.path.relpath(args.data, ROOT)}"
    for action in ap._actions:
        if not action.option_strings or action.dest in ("help", "results", "no_results"):
            continue
        value = getattr(args, action.dest)
        if value != action.default:
            cmd += f" {action.option_strings[-1]} {value}"
    write_section(args.results, name, title, intro, cmd, [table])


def last_json(stdout):
    """The last line of a command's stdout that is a JSON object, parsed (None when there is none)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


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


def _venv_python(venv):
    return os.path.join(venv, "bin", "python")


def _imports_torch(python):
    return subprocess.run([python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def torch_python(venv=None):
    """The interpreter that runs the PyTorch peer (bench/charlm_reference.py), as a path.

    venv None: $TORCH_PYTHON when set (any interpreter with torch, e.g. /usr/bin/python3), else
    out/torch-venv, else out/hf-venv when only that exists and has torch, else out/torch-venv made
    now with `pip install torch numpy` (the newest on PyPI). venv 'none': Debian's /usr/bin/python3.
    venv DIR: that virtual environment, made the same way on first use. Progress goes to stderr."""
    if venv is None:
        chosen = os.environ.get("TORCH_PYTHON")
        if chosen:  # a path (made absolute: benches run it from the repository's root), or a name on PATH
            return os.path.abspath(chosen) if os.sep in chosen else (shutil.which(chosen) or chosen)
        if not os.path.exists(_venv_python(TORCH_VENV)) and os.path.exists(_venv_python(HF_VENV)) \
                and _imports_torch(_venv_python(HF_VENV)):
            return _venv_python(HF_VENV)
        venv = TORCH_VENV
    if venv == "none":
        return DEBIAN_PYTHON
    venv = os.path.abspath(venv)
    python = _venv_python(venv)
    if not os.path.exists(python):
        print(f"{os.path.basename(sys.argv[0])}: installing the newest PyTorch from PyPI into "
              f"{os.path.relpath(venv)} (for the benches only; a few GB)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, stdout=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "torch", "numpy"], check=True, stdout=sys.stderr)
    elif not _imports_torch(python):
        sys.exit(f"{os.path.basename(sys.argv[0])}: {python} cannot import torch; remove {venv} to make it again")
    return python


@functools.lru_cache(maxsize=None)
def torch_version(python):
    """torch.__version__ of the interpreter `python` (e.g. '2.15.0+cu132', Debian's '1.13.0a0')."""
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()


def torch_import_rss_mb(python):
    """Peak RSS in MB of `python -c "import torch"` alone, under /usr/bin/time -v: the floor under every
    PyTorch run's peak RSS (about 640 MB for PyPI's wheel, which loads its CUDA libraries even on a CPU;
    about 235 MB for Debian's)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        subprocess.run(["/usr/bin/time", "-v", "-o", timing.name, python, "-c", "import torch"], check=True)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing.read())
    return int(rss.group(1)) / 1024 if rss else float("nan")


def _venv_of(python):
    """The virtual environment `python` belongs to, or None."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(shutil.which(python) or python)))
    return venv if os.path.exists(os.path.join(venv, "pyvenv.cfg")) else None


def is_debian_python(python):
    """Whether `python` is Debian's own interpreter (not a virtual environment), whose torch comes from apt
    (python3-torch, on the system BLAS)."""
    return _venv_of(python) is None and os.path.realpath(shutil.which(python) or python).startswith("/usr/bin/")


def debian_torch_packages(python):
    """The Debian packages `python`'s torch needs: for Debian's own interpreter, python3-torch and the OpenMP
    OpenBLAS (Debian's torch calls the system BLAS, and on the default reference BLAS it runs ~15x slower);
    none for a virtual environment, whose wheel brings its own BLAS (MKL on x86)."""
    return ["python3-torch", "libopenblas0-openmp"] if is_debian_python(python) else []


def torch_origin(python):
    """Where `python`'s torch comes from, in words: "Debian's python3-torch", "PyPI, out/torch-venv" (or
    out/hf-venv), another virtual environment's directory, or the interpreter's path."""
    if is_debian_python(python):
        return "Debian's python3-torch"
    venv = _venv_of(python)
    if venv and os.path.realpath(venv) in (os.path.realpath(TORCH_VENV), os.path.realpath(HF_VENV)):
        return "PyPI, " + os.path.relpath(venv, ROOT)  # the environments made here, from PyPI
    return f"the virtual environment {venv}" if venv else python


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


def main():
    ap = argparse.ArgumentParser(description="The interpreter of the PyTorch peer the benches run.")
    sub = ap.add_subparsers(dest="command", required=True)
    tp = sub.add_parser("torch-python", help="print the interpreter's path (the virtual environment is made on first use)")
    tp.add_argument("--venv", help="a virtual environment (default: $TORCH_PYTHON, else out/torch-venv; "
                                   "'none': Debian's /usr/bin/python3)")
    tv = sub.add_parser("torch-version", help="print torch.__version__ of PYTHON")
    tv.add_argument("python", nargs="?", help="an interpreter (default: what torch-python prints)")
    tk = sub.add_parser("torch-packages", help="print the Debian packages PYTHON's torch needs (for scripts/setup.sh): "
                                               "python3-torch and OpenBLAS for Debian's /usr/bin/python3, else none")
    tk.add_argument("python")
    args = ap.parse_args()
    if args.command == "torch-python":
        print(torch_python(args.venv))
    elif args.command == "torch-packages":
        print(" ".join(debian_torch_packages(args.python)))
    else:
        print(torch_version(args.python or torch_python()))


if __name__ == "__main__":
    main()
