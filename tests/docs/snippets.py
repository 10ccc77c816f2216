#!/usr/bin/env python3
"""Compiles every C++ block of README.md and docs/*.md as a file of its own (the ctest docs_snippets).

    python3 tests/docs/snippets.py SOURCE_DIR CXX [COMPILER FLAGS...]

A ```cpp block is a whole file: it is written out as it stands (indentation
of a block inside a list item removed), its own #include lines and all, and
compiled with `CXX -std=c++17 -fsyntax-only FLAGS` (the ctest passes the
package's include folder and Eigen's). Nothing is put before, after or
around it, so a block compiles exactly when a user's copy of it does.

The one exception is a block whose first line starts `// excerpt` (say
`// excerpt: autograd/ops/elementwise.cpp, after its helpers`): a marked part
of a larger file, visibly so to the reader. Excerpts are not compiled; each
is named in the output and counted.

A `<!-- snippet: ... -->` comment (hidden context for a block) is refused:
what a block needs is in the block.

Prints one line per failing block (page:line and the compiler's first
errors) and a summary; exit status 1 when any block fails.
"""
import concurrent.futures
import glob
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^(\s*)```(cpp|c\+\+|cxx|cc)\s*$", re.IGNORECASE)
HIDDEN = re.compile(r"^\s*<!--\s*snippet\s*:")


class Block:
    def __init__(self, page, line, code):
        self.page, self.line, self.code = page, line, code

    @property
    def excerpt(self):
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        return first.startswith("// excerpt")


def read_page(path, root):
    """(the page's C++ blocks, the lines of its hidden snippet comments)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    where = os.path.relpath(path, root)
    blocks, hidden = [], []
    i = 0
    while i < len(lines):
        if HIDDEN.search(lines[i]):
            hidden.append(i + 1)
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m.group(1)), i + 2  # the block's first line, 1-based
        code = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            code.append(line[indent:] if line[:indent].strip() == "" else line)
            i += 1
        blocks.append(Block(where, start, "\n".join(code) + "\n"))
        i += 1
    return blocks, hidden


def compile_block(cxx, flags, work, n, block):
    """(True, "") when the block compiles as a file of its own, else (False, its first errors)."""
    src = os.path.join(work, "block%d.cpp" % n)
    with open(src, "w", encoding="utf-8") as f:
        f.write(block.code)
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only"] + flags + [src],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode == 0:
        return True, ""
    # The compiler's line numbers as the page's: line k of the block is line block.line + k - 1.
    at_page = lambda m: "%s:%d:" % (block.page, block.line + int(m.group(1)) - 1)
    errors = [re.sub(re.escape(src) + r":(\d+):", at_page, l) for l in r.stderr.split("\n") if "error" in l]
    return False, "\n  ".join(errors[:4] or r.stderr.strip().split("\n")[:4])


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: snippets.py SOURCE_DIR CXX [COMPILER FLAGS...]")
    root, cxx, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    blocks, failures = [], []
    for page in pages:
        found, hidden = read_page(page, root)
        blocks += found
        for line in hidden:
            failures.append("FAIL: %s:%d: a hidden <!-- snippet: --> comment; put what the block needs in the block"
                            % (os.path.relpath(page, root), line))
    whole = [b for b in blocks if not b.excerpt]
    excerpts = [b for b in blocks if b.excerpt]
    with tempfile.TemporaryDirectory() as work:
        workers = max(1, min(8, os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda nb: compile_block(cxx, flags, work, nb[0], nb[1]), enumerate(whole)))
    failed = 0
    for block, (ok, errors) in zip(whole, results):
        if not ok:
            failed += 1
            failures.append("FAIL: %s:%d: the block does not compile as a file of its own\n  %s"
                            % (block.page, block.line, errors))
    for f in failures:
        print(f)
    for b in excerpts:
        print("excerpt, not compiled: %s:%d" % (b.page, b.line))
    print("snippets.py: %d C++ blocks: %d compiled as whole files (%d failed), %d marked excerpts not compiled%s"
          % (len(blocks), len(whole), failed, len(excerpts),
             "; %d hidden snippet comments" % (len(failures) - failed) if len(failures) > failed else ""))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
