#!/usr/bin/env python3
"""test_walkthrough.py - docs/walkthrough.md cannot go stale.

  - every generated block (<!-- trace: ... --> ... <!-- /trace -->) equals what ./zaya --trace prints
    now on the compact fixture test/fixtures (docs/make_walkthrough.py renders the document in memory; `make docs`
    rewrites it);
  - every step of docs/architecture.md section 3 (3.1 .. 3.18) and section 4 (decoding state) has a section
    `## 3.N` / `## 4.` with at least one generated block;
  - every function any document of the repository names as `name()` is defined in its C or Python
    sources (or is a Python builtin);
  - every dump name a document quotes (a `name:part`, or a name quoted after "dump" or "tap" on its
    line) is one that `./zaya --list-taps` prints, or one compare.py derives (router_margin, logits:topK).
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
    steps = steps or [f"3.{i}" for i in range(1, 19)]
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
    # bench/**/*.md, docs/*.md, test/**/*.md
    docs = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "bench", "**", "*.md"), recursive=True),
            *glob.glob(os.path.join(ROOT, "docs", "*.md")), *glob.glob(os.path.join(ROOT, "test", "**", "*.md"), recursive=True)]
    sources = ""
    for pattern in ("*.c", "*.h", "*.py", "bench/*.c", "bench/*.h", "bench/*.py", "test/*.c", "test/*.py", "test/fuzz/*.c",
                    "test/fuzz/*.py", "docs/*.py", "tools/*.py"):
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
    if os.path.exists(blob):
        check_dump_names(blob, docs)
    finish()


# a quoted dump name: optional "…" or "model.layers.{i}." prefix, then a path of module names
DUMP_NAME = re.compile(r"`((?:…|\.\.\.)?(?:model\.layers\.(?:\d+|\{i\}|N)\.)?[a-z_][a-z0-9_.]*(?::[a-z0-9_]+)?|:[a-z0-9_]+)`")
DERIVED = {"mlp.gate:router_margin", "logits:top16_ids", "logits:top16_values",   # compare.py's, not the engine's
           "self_attn:attn_weights"}   # ragged (its width grows with the position): --trace only, not in a dump


def check_dump_names(blob, docs):
    """Every dump name the documents quote is a tap of --list-taps (without its model.layers.N. prefix)."""
    rc, out, err = run(["./zaya", blob, "--list-taps"])
    names = set(DERIVED)
    for line in out.splitlines():
        for n in re.findall(r"(?:^|[ ,(])((?:model\.layers\.(?:\d+|\{i\})\.)?[a-z_][a-z0-9_.]*(?::[a-z0-9_]+)?|:[a-z_]+)", line)[:1] \
                if not line.startswith("(") else re.findall(r"[a-z_.]*:[a-z_]+", line):
            names.add(re.sub(r"^model\.layers\.(\d+|\{i\})\.", "", n))
    if not check(rc == 0 and len(names) > 30, "--list-taps names the tensors of a dump", err[-200:]):
        return
    for path in sorted(docs):
        bad = []
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f, 1):
                context = re.search(r"\b([Dd]umps?|tap)\b", line)
                for m in DUMP_NAME.finditer(line):
                    q = m.group(1)
                    if ":" not in q and not (context and context.start() < m.start()):
                        continue
                    if re.search(r"\.(weight|bias|c|h|py|md|sh|json|npy|bin)$|^module:|^model\.layers\.(\d+|\{i\}|N)$", q) or \
                            ("." not in q and ":" not in q and q != "logits"):
                        continue   # files, weights, placeholders, a whole layer, words that are not paths
                    short = re.sub(r"^(…|\.\.\.)?(model\.layers\.(\d+|\{i\}|N)\.)?", "", q)
                    if not re.match(r"(model[.:]|self_attn|mlp\.|input_layernorm|post_|logits|qkv_proj|qk_norm|router_mlp|:)",
                                    short):
                        continue   # not a module path of the model (numpy.load, safetensors.safe_open, ...)
                    if not any(n == short or n.endswith(short if short[0] in ":." else "." + short) or
                               n.endswith(":" + short) for n in names):
                        bad.append(f"line {k}: {q}")
        check(not bad, f"{os.path.relpath(path, ROOT)}: every dump name it quotes is one --list-taps prints",
              f"not a tap: {bad[:8]}")


if __name__ == "__main__":
    main()
