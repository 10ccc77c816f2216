#!/usr/bin/env bash
# Final val loss of a recipe over several seeds: tapeformer and the PyTorch
# reference (bench/charlm_reference.py) on the same config and data.
#
#   bash bench/val_loss_seeds.sh DATA [SEED ...]        # default seeds: 1337 2 3 4 5 6 7 8 9 10
#   CONFIG=configs/shakespeare_char_cpu.json OUT=out/seeds bash bench/val_loss_seeds.sh input.txt 1337 2 3
#   TORCH_PYTHON=/usr/bin/python3 bash bench/val_loss_seeds.sh input.txt       # Debian's PyTorch 1.13 instead
#
# PyTorch is the newest on PyPI, in a virtual environment made on first use
# (out/torch-venv: `python3 bench/benchlib.py torch-python`), never a
# dependency of tapeformer; TORCH_PYTHON names another interpreter with torch.
#
# For each seed the two implementations run at the same time, one thread each.
# tapeformer runs with train.shards=2, which gives exactly the numbers of a
# default run on a 2-core machine (results depend on the shard count, not on
# the thread count). Prints one row per seed, then mean, standard deviation,
# how many seeds are at or under THRESHOLD (default 1.90) and the difference
# of the means with its standard error. This measures loss, not speed.
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:?usage: bench/val_loss_seeds.sh DATA [SEED ...]}
shift
[ -f "$data" ] || { echo "val_loss_seeds.sh: data file '$data' not found" >&2; exit 2; }
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1337 2 3 4 5 6 7 8 9 10)
config=${CONFIG:-configs/shakespeare_char_cpu.json}
out=${OUT:-out/seeds}
threshold=${THRESHOLD:-1.90}

# The PyTorch peer's interpreter (Debian's needs python3-torch on OpenBLAS).
torch_python=$(python3 bench/benchlib.py torch-python)
torch_packages=$(python3 bench/benchlib.py torch-packages "$torch_python")
# shellcheck disable=SC2086  # the package names, one word each
bash scripts/setup.sh $torch_packages
torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)')
echo "val_loss_seeds.sh: PyTorch $torch_version ($torch_python)" >&2
echo "val_loss_seeds.sh: building tapeformer (Release)..." >&2
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target tapeformer_command >/dev/null
mkdir -p "$out"
# Every seed runs the binary built now, even if build/ changes meanwhile.
cp build/cli/tapeformer "$out/tapeformer"

for seed in "${seeds[@]}"; do
  echo "val_loss_seeds.sh: seed $seed..." >&2
  rm -rf "$out/run-$seed"
  "$out/tapeformer" train --config "$config" --data "$data" --out "$out/run-$seed" --threads 1 \
    --set train.shards=2 --set "train.seed=$seed" > "$out/tapeformer-$seed.json" 2> "$out/tapeformer-$seed.log" &
  tf=$!
  "$torch_python" bench/charlm_reference.py --config "$config" --data "$data" --threads 1 \
    --set "train.seed=$seed" > "$out/pytorch-$seed.json" 2> "$out/pytorch-$seed.log" &
  pt=$!
  wait "$tf" || { echo "val_loss_seeds.sh: tapeformer failed; see $out/tapeformer-$seed.log" >&2; exit 1; }
  wait "$pt" || { echo "val_loss_seeds.sh: pytorch failed; see $out/pytorch-$seed.log" >&2; exit 1; }
done

/usr/bin/python3 - "$out" "$threshold" "$torch_python" "$torch_version" "${seeds[@]}" <<'PY'
import json, math, statistics, sys
out, threshold, torch_python, torch_version, seeds = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
def result(name, seed):
    return json.loads(open(f"{out}/{name}-{seed}.json").read().strip().splitlines()[-1])
assert all(result("pytorch", s)["torch"] == torch_version for s in seeds), "every PyTorch run reports the version asked"
rows = [(s, result("tapeformer", s)["val_loss"], result("pytorch", s)["val_loss"]) for s in seeds]
print(f"final val loss: tapeformer against PyTorch {torch_version} ({torch_python})")
w = max(9, len("pytorch " + torch_version))
print(f"{'seed':>6} {'tapeformer':>11} {'pytorch ' + torch_version:>{w}}")
for s, t, p in rows:
    print(f"{s:>6} {t:11.4f} {p:{w}.4f}")
summary = {}
for i, name in ((1, "tapeformer"), (2, "pytorch")):
    v = [r[i] for r in rows]
    sd = statistics.stdev(v) if len(v) > 1 else float("nan")
    summary[name] = {"mean": statistics.mean(v), "sd": sd, "n": len(v),
                     "at_or_under": sum(x <= threshold for x in v)}
t, p = summary["tapeformer"], summary["pytorch"]
print(f"{'mean':>6} {t['mean']:11.4f} {p['mean']:{w}.4f}")
print(f"{'sd':>6} {t['sd']:11.4f} {p['sd']:{w}.4f}")
print(f"{'<=' + format(threshold, 'g'):>6} {str(t['at_or_under']) + '/' + str(t['n']):>11} "
      f"{str(p['at_or_under']) + '/' + str(p['n']):>{w}}")
se = math.sqrt(t["sd"] ** 2 / t["n"] + p["sd"] ** 2 / p["n"])
print(f"difference of means (tapeformer - pytorch): {t['mean'] - p['mean']:+.4f} +- {se:.4f} (one standard error)")
json.dump({"seeds": rows, "summary": summary, "torch": torch_version, "torch_python": torch_python},
          open(f"{out}/seeds.json", "w"), indent=2)
PY
echo "val_loss_seeds.sh: results in $out/seeds.json" >&2
