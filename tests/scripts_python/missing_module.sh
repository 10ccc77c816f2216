#!/usr/bin/env bash
# The Python scripts of scripts/ without a module they import: scripts/digits.py
# under interpreters that cannot import scikit-learn (a package of that name on
# PYTHONPATH that fails as a missing one does, so the check holds whether or
# not the machine has it) exits with status 1 and one line naming the
# interpreter (path and version) and the install command for that interpreter:
# Debian's package for one that reads Debian's packages (/usr/bin/python3),
# its own pip for any other (pyenv's, a venv, even one made from
# /usr/bin/python3). experiment.py's plots without matplotlib say the same and
# go on. The Python scripts with a #! line are executable.
# Usage: missing_module.sh SOURCE_DIR
set -u
src=${1:?usage: missing_module.sh SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for m in sklearn matplotlib; do
  mkdir -p "$work/shadow/$m"
  echo "raise ModuleNotFoundError(\"No module named '$m'\", name='$m')" > "$work/shadow/$m/__init__.py"
done

# expect_advice LABEL PYTHON ADVICE [COMMAND...]: COMMAND (default: PYTHON scripts/digits.py) fails with status 1
# and one line that names PYTHON's sys.executable and version and ADVICE ("apt" or "pip"); nothing is written.
expect_advice() {
  local label=$1 py=$2 advice=$3 before=$failures
  shift 3
  local cmd=("$@")
  [ ${#cmd[@]} -gt 0 ] || cmd=("$py" "$src/scripts/digits.py")
  local exe ver
  exe=$("$py" -c 'import sys; print(sys.executable)') || { fail "$label: $py does not run"; return; }
  ver=$("$py" -c 'import sys; print(sys.version.split()[0])')
  PYTHONPATH="$work/shadow" "${cmd[@]}" "$work/digits.txt" > "$work/out" 2> "$work/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$label: exit status $rc, not 1"
  [ -e "$work/digits.txt" ] && fail "$label: wrote the corpus without scikit-learn"
  [ "$(wc -l < "$work/err")" -eq 1 ] || fail "$label: not one line on stderr"
  grep -qF "digits.py: scikit-learn (module sklearn) cannot be imported by $exe (Python $ver)" "$work/err" ||
    fail "$label: the interpreter is not named"
  if [ "$advice" = apt ]; then
    grep -qF "apt-get install python3-sklearn" "$work/err" || fail "$label: no apt-get advice"
    grep -qF "bash scripts/setup.sh python3-sklearn" "$work/err" || fail "$label: no setup.sh advice"
    grep -qF "pip install" "$work/err" && fail "$label: pip advice for Debian's interpreter"
  else
    grep -qF "$exe -m pip install scikit-learn" "$work/err" || fail "$label: no pip advice for $exe"
    if [ -x /usr/bin/python3 ]; then
      grep -qF "&& /usr/bin/python3 scripts/digits.py" "$work/err" || fail "$label: Debian's interpreter not offered"
    fi
  fi
  if [ "$failures" -gt "$before" ]; then cat "$work/err"; fi
}

reads_debian() {  # PYTHON: whether it imports Debian's packages
  "$1" -c 'import sys; sys.exit("/usr/lib/python3/dist-packages" not in sys.path)'
}

# The python3 on PATH (pyenv's on a developer's machine, often Debian's in CI).
if reads_debian python3; then expect_advice "python3 on PATH" python3 apt; else expect_advice "python3 on PATH" python3 pip; fi

if [ -x /usr/bin/python3 ] && reads_debian /usr/bin/python3; then
  expect_advice /usr/bin/python3 /usr/bin/python3 apt
  # By its #! line: the script is executable and runs Debian's interpreter.
  expect_advice "scripts/digits.py by its #! line" /usr/bin/python3 apt "$src/scripts/digits.py"
  # A venv of Debian's interpreter reads none of Debian's packages: its own pip.
  if /usr/bin/python3 -m venv --without-pip "$work/venv" > /dev/null 2>&1; then
    expect_advice "a venv of /usr/bin/python3" "$work/venv/bin/python3" pip
  else
    echo "missing_module: /usr/bin/python3 cannot make a venv here; that case is skipped"
  fi
fi

# experiment.py draws no plots without matplotlib, and says which interpreter lacks it.
PYTHONPATH="$work/shadow" python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import experiment; sys.exit(experiment.pyplot() is not None)' \
  "$src/scripts" > /dev/null 2> "$work/err" < /dev/null ||
  fail "experiment.py: pyplot() did not return None without matplotlib"
exe=$(python3 -c 'import sys; print(sys.executable)')
grep -qF "experiment.py: matplotlib (module matplotlib) cannot be imported by $exe" "$work/err" ||
  { fail "experiment.py: the interpreter without matplotlib is not named"; cat "$work/err"; }
grep -q "; no plots$" "$work/err" || fail "experiment.py: no 'no plots'"

for f in "$src"/scripts/*.py; do
  if [ "$(head -c 2 "$f")" = "#!" ] && [ ! -x "$f" ]; then fail "${f#"$src"/} has a #! line but is not executable"; fi
done

if [ "$failures" -gt 0 ]; then echo "missing_module: $failures failure(s)"; exit 1; fi
echo "missing_module: each interpreter without scikit-learn was named with its own install command"
