#!/usr/bin/env python3
"""test_walkthrough.py - docs/walkthrough.md cannot go stale.

  - every generated block (<!-- trace: ... --> ... <!-- /trace -->) equals what ./zaya --trace prints
    now on the compact fixture test/fixtures (docs/make_walkthrough.py renders the document in memory; `make docs`
    rewrites it);
  - every step of docs/architecture.md section 3 (3.1 .. 3.16) and section 4 (decoding state) has a section `## 3.N` / `## 4.` with at least one
    generated block;
  - every function any document of the repository names as `name()` is defined in its C or Python
    sources (or is a Python builtin).
"""
import builtins
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"))
from harness import ROOT, BUILD, check, finish, need_fixtures, prompt_ids, run  # noqa: E402
import make_walkthrough  # noqa: E402

DOC = os.path.join(ROOT, "docs", "walkthrough.md")


def main():
    native = need_fixtures("checkpoint_native")
    if not check(os.path.exists(DOC), "docs/walkthrough.md exists"):
        finish()
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    rc, _, err = run(["make", "zaya"])
    if not check(rc == 0, "make zaya", err[-300:]):
        finish()
    os.makedirs(BUILD, exist_ok=True)
    blob = os.path.join(BUILD, "walkthrough.bin")
    rc, _, err = run([sys.executable, "export_weights.py", native, blob])
    if check(rc == 0, "export the fixture", err[-300:]):
        n_blocks = len(make_walkthrough.BLOCK.findall(doc))
        try:
            new = make_walkthrough.render(doc, blob, prompt_ids(), os.path.join(ROOT, "zaya"))
        except Exception as e:       # a block whose command fails or whose filter matches nothing
            check(False, f"the {n_blocks} generated blocks render", str(e)[:300])
        else:
            a, b = doc.splitlines(), new.splitlines()
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            check(new == doc, f"the {n_blocks} generated blocks equal ./zaya --trace now (else: make docs)",
                  f"line {i + 1}: document {a[i] if i < len(a) else '(end)'!r} vs program {b[i] if i < len(b) else '(end)'!r}")

    # every step of the spec's section 3, and section 4, has a section with numbers
    spec = os.path.join(ROOT, "docs", "architecture.md")
    steps = []
    if os.path.exists(spec):
        with open(spec, encoding="utf-8") as f:
            steps = re.findall(r"^\*\*(3\.\d+) ", f.read(), re.M)
    steps = steps or [f"3.{i}" for i in range(1, 17)]
    sections = re.split(r"^## ", doc, flags=re.M)
    missing, empty = [], []
    for step in steps + ["4."]:
        sec = next((s for s in sections if s.startswith(step + (" " if not step.endswith(".") else ""))), None)
        if sec is None:
            missing.append(step)
        elif not make_walkthrough.BLOCK.search(sec):
            empty.append(step)
    check(not missing, f"every step of architecture.md §3 ({steps[0]}..{steps[-1]}) and §4 has a section", f"missing: {missing}")
    check(not empty, "every such section shows numbers (a generated block)", f"without a block: {empty}")

    # every function any document names as `name()` is defined in the repository: README.md,
    # bench/*.md, docs/*.md, test/**/*.md
    docs = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "bench", "*.md")),
            *glob.glob(os.path.join(ROOT, "docs", "*.md")), *glob.glob(os.path.join(ROOT, "test", "**", "*.md"), recursive=True)]
    sources = ""
    for pattern in ("*.c", "*.h", "*.py", "bench/*.c", "bench/*.h", "bench/*.py", "test/*.c", "test/*.py", "test/fuzz/*.c",
                    "test/fuzz/*.py", "docs/*.py"):
        for name in glob.glob(os.path.join(ROOT, pattern)):
            with open(name, encoding="utf-8", errors="replace") as f:
                sources += f.read() + "\n"
    defined = set(re.findall(r"^(?:[A-Za-z_][\w \t\*]*?[ \t\*])?([a-z_][a-z0-9_]*)\([^;]*?\)\s*\{", sources, re.M))
    defined |= set(re.findall(r"^\s*def ([a-z_][a-z0-9_]*)\(", sources, re.M))
    defined |= set(re.findall(r"^#define ([A-Za-z_][A-Za-z0-9_]*)\(", sources, re.M)) | set(dir(builtins))
    for path in sorted(docs):
        with open(path, encoding="utf-8") as f:
            named = sorted(set(re.findall(r"`([a-z_][a-z0-9_]*)\(\)`", f.read())))
        gone = [n for n in named if n not in defined]
        check(not gone, f"{os.path.relpath(path, ROOT)}: the {len(named)} functions it names as `name()` are defined",
              f"not defined anywhere: {gone}")
    finish()


if __name__ == "__main__":
    main()
