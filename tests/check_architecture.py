#!/usr/bin/env python3
"""The include rules of docs/architecture.md, checked on the source tree.

- A folder includes only itself and the folders below it (ALLOWED).
- Nothing in train/ includes a command or the CLI (that is the first rule).
- A command (commands/NAME.cpp, defining NAME_command) has no header and is
  included by no file: no command includes another.
- Within train/, commands/ and cli/, no two units include each other,
  directly or through others (a unit is a .h with its .cpp: train/knn.h
  and train/knn.cpp are the unit train/knn). The lower folders' registries
  and their kinds include each other by design (a family's table names its
  kinds, a kind declares itself against the table) and are not checked.

Prints each violation with the include that makes it; exits 1 when there is
one. Usage: check_architecture.py SOURCE_DIR
"""
import os
import re
import sys

# The folders whose units may not include each other.
ACYCLIC = {"train", "commands", "cli"}
# What each folder may include besides itself.
ALLOWED = {
    "core": set(),
    "autograd": {"core"},
    "retrieval": {"core"},
    "data": {"core"},
    "optim": {"autograd", "core"},
    "layers": {"autograd", "retrieval", "core"},
    "train": {"layers", "optim", "data", "retrieval", "autograd", "core"},
    "commands": {"train", "layers", "optim", "data", "retrieval", "autograd", "core"},
    "cli": {"commands", "train", "layers", "optim", "data", "retrieval", "autograd", "core"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"tapeformer/([^"]+)"', re.M)


def sources(root):
    for folder in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith((".h", ".cpp")):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root), open(path, encoding="utf-8").read()


def unit(path):
    return os.path.splitext(path)[0]


def cycles(edges):
    """The strongly connected components of more than one unit (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = []
    edges = {}
    commands = set()
    files = dict(sources(root))
    for path, text in files.items():
        if path.startswith("commands/") and path.endswith(".cpp"):
            name = os.path.basename(path)[:-4]
            if re.search(r"\bCommand\s+" + re.escape(name) + r"_command\s*\(\s*\)\s*\{", text):
                commands.add(name)
    for path, text in files.items():
        folder = path.split("/")[0]
        for included in INCLUDE.findall(text):
            target = included.split("/")[0]
            if target != folder and target not in ALLOWED[folder]:
                problems.append(f"{path} includes tapeformer/{included}: {folder}/ may not include {target}/")
            if target == "commands" and os.path.splitext(os.path.basename(included))[0] in commands:
                problems.append(f"{path} includes tapeformer/{included}: a command is included by no file")
            if target == folder and folder in ACYCLIC and unit(included) != unit(path):
                edges.setdefault(unit(path), set()).add(unit(included))
    for name in sorted(commands):
        if f"commands/{name}.h" in files:
            problems.append(f"commands/{name}.h: a command has no header (its file is commands/{name}.cpp)")
    for comp in cycles(edges):
        problems.append("units that include each other: " + " <-> ".join(comp))
    for p in problems:
        print(p)
    print(f"check_architecture: {len(files)} files, {sum(len(v) for v in edges.values())} unit includes within "
          f"folders, {len(commands)} commands: {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
