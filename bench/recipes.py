"""The two char-LM recipes the scaling benchmarks (scale.py, ranks.py) train,
and the options they share."""
import os

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


def overrides(steps):
    """--set arguments: `steps` steps, one evaluation at the end on 20 batches."""
    sets = [f"train.max_iters={steps}", f"schedule.decay_iters={max(steps, 100)}", f"eval.interval={steps}",
            "eval.iters=1", "eval.final_iters=20"]
    return [a for s in sets for a in ("--set", s)]
