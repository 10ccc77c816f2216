#!/usr/bin/env python3
"""Compiles every C++ snippet of README.md and docs/*.md (a ctest: docs_snippets).

    python3 tests/docs/snippets.py SOURCE_DIR CXX [COMPILER FLAGS...]

Each ```cpp block is compiled with -fsyntax-only:
- a block with #include lines of its own is compiled with those alone, so a
  user who copies it gets what it needs; a block without any is a fragment
  of its page and is compiled after every public header and the page's
  fragments before it (a class, then the entry that names it);
- statements (not declarations) are compiled as a function's body;
- an HTML comment right before the block, <!-- snippet: ... -->, holds what
  the surrounding text assumes (variables the prose names, an include), put
  before the block and never shown.
Exit status 1 names every block that does not compile, with the compiler's
first errors.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

PUBLIC = ["autograd/ops.h", "autograd/gradcheck.h", "autograd/function.h", "core/kernels/score_mods.h",
          "layers/transformer.h", "layers/attention/projected.h", "layers/attention/softmax.h",
          "layers/attention/sparse.h", "layers/memory/memory.h", "layers/memory/memorizing.h",
          "layers/mlp.h", "cli/cli.h", "train/build.h", "train/model_hooks.h", "optim/optimizer.h"]


def blocks(path):
    """[(line, context, code)] for each ```cpp block of a markdown file."""
    out = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            context = ""
            j = i - 1
            while j >= 0 and lines[j].strip() == "":
                j -= 1
            if j >= 0:
                m = re.match(r"\s*<!--\s*snippet:(.*)-->\s*$", lines[j])
                if m:
                    context = m.group(1).strip()
            i += 1
            code = []
            while i < len(lines) and lines[i].strip() != "```":
                code.append(lines[i])
                i += 1
            out.append((start, context, "\n".join(code)))
        i += 1
    return out


def split(code):
    """(#include and using-namespace lines, the rest)."""
    head, body = [], []
    for line in code.split("\n"):
        (head if re.match(r"\s*(#include|using namespace)", line) else body).append(line)
    return head, body


def split_context(context):
    """A snippet comment's includes and using-declarations, and its other statements."""
    includes = re.findall(r'#include\s*[<"][^>"]+[>"]', context)
    rest = re.sub(r'#include\s*[<"][^>"]+[>"]', "", context)
    statements = [s.strip() + ";" for s in rest.split(";") if s.strip()]
    head = includes + [s for s in statements if s.startswith("using ")]
    return head, [s for s in statements if not s.startswith("using ")]


def compile_ok(cxx, flags, text, work):
    src = os.path.join(work, "snippet.cpp")
    with open(src, "w") as f:
        f.write(text)
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", *flags, src], capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def main():
    root, cxx, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    prelude = ("#include <cmath>\n#include <memory>\n#include <string>\n#include <vector>\n" +
               "".join(f"#include <tapeformer/{h}>\n" for h in PUBLIC) + "using namespace tapeformer;\n")
    failed = checked = 0
    with tempfile.TemporaryDirectory() as work:
        for page in pages:
            fragments = []  # the page's declarations so far
            for line, context, code in blocks(page):
                checked += 1
                head, body = split(code)
                ctx_head, ctx_body = split_context(context)
                own = any(h.strip().startswith("#include") for h in head)
                top = ("\n".join(head + ctx_head) + "\n") if own else (prelude + "\n".join(head + ctx_head) + "\n")
                if not own:
                    top += "\n".join(fragments) + "\n"
                decls = "\n".join(ctx_body) + "\n"
                as_declarations = top + decls + "\n".join(body) + "\n"
                as_statements = top + "void tapeformer_snippet() {\n" + decls + "\n".join(body) + "\n}\n"
                ok, err = compile_ok(cxx, flags, as_declarations, work)
                if ok:
                    if not own:
                        fragments.append("\n".join(body))
                    continue
                ok2, err2 = compile_ok(cxx, flags, as_statements, work)
                if ok2:
                    continue
                failed += 1
                where = os.path.relpath(page, root)
                first = [l for l in (err2 or err).split("\n") if "error" in l][:4]
                print(f"FAIL: {where}:{line}: the snippet does not compile\n  " + "\n  ".join(first))
    print(f"snippets.py: {checked} C++ snippets, {failed} do not compile")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
