#!/usr/bin/env python3
"""make_walkthrough.py - rewrites the generated blocks of docs/walkthrough.md from ./zaya --trace.

    python3 docs/make_walkthrough.py [--check] [--blob build/walkthrough.bin] [--fixtures test/fixtures]

A generated block is

    <!-- trace: --trace 30 --trace-layer 2 --filter 'REGEX' -->
    ```text
    ... the output, rewritten by this script ...
    ```
    <!-- /trace -->

The words after `trace:` are ./zaya's arguments (shell quoting), run on the fixture blob with
the fixture prompt (`--ids` from test/fixtures/index.json) unless they give `--ids` or `-i` themselves.
`--filter REGEX` is this script's: the output is cut into units (a step line with the indented lines
below it, or one header line) and only the units whose first line matches REGEX (re.search) are kept.
Without --filter the whole trace is pasted. `--vl` (this script's too) runs the ZAYA1-VL fixture instead:
the blob composed from test/fixtures/vl (tools/vl_checkpoint.py) and exported beside the text one
(walkthrough_vl.bin), with `--image test/fixtures/vl/image_b/image.png` and that case's prompt
(test/fixtures/vl/image_b/tokens.npy) unless the arguments give their own.

The blob is exported from test/fixtures/checkpoint_native with export_weights.py when it is missing.
--check writes nothing and exits 1 when the document differs from what the program prints now
(test/test_walkthrough.py does the same in memory). Standard library only.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "walkthrough.md")
FIXTURES = os.environ.get("ZAYA_FIXTURES", os.path.join(ROOT, "test", "fixtures"))
sys.path.insert(0, ROOT)
from zaya_compare.dumps import read_npy  # noqa: E402
BLOCK = re.compile(r"^(<!-- trace: ([^\n]*?) -->\n)(.*?)^(<!-- /trace -->)$", re.S | re.M)   # markers on their own lines


def prompt_ids(fixtures):
    with open(os.path.join(fixtures, "index.json")) as f:
        return json.load(f)["prompt"]["ids"]


def ensure_blob(blob, fixtures):
    """Exports the fixture to `blob` if it is not there yet."""
    if os.path.exists(blob):
        return
    os.makedirs(os.path.dirname(os.path.abspath(blob)), exist_ok=True)
    ckpt = os.path.join(fixtures, "checkpoint_native")
    subprocess.run([sys.executable, os.path.join(ROOT, "export_weights.py"), ckpt, blob], check=True,
                   stdout=subprocess.DEVNULL)


def vl_blob_of(blob):
    return os.path.join(os.path.dirname(os.path.abspath(blob)), "walkthrough_vl.bin")


def ensure_vl_blob(blob, fixtures):
    """Exports the ZAYA1-VL fixture (the text checkpoint + vl/extra.safetensors) to `blob` if it is not there yet, or
    older than the exporter or the VL fixture's files."""
    sources = [os.path.join(ROOT, "export_weights.py"), os.path.join(fixtures, "vl", "extra.safetensors"),
               os.path.join(fixtures, "vl", "config.json")]
    if os.path.exists(blob) and all(os.path.getmtime(blob) >= os.path.getmtime(f) for f in sources if os.path.exists(f)):
        return
    import tempfile
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import vl_checkpoint
    os.makedirs(os.path.dirname(os.path.abspath(blob)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = vl_checkpoint.compose(fixtures, os.path.join(tmp, "ckpt"))
        subprocess.run([sys.executable, os.path.join(ROOT, "export_weights.py"), ckpt, blob + ".partial"], check=True,
                       stdout=subprocess.DEVNULL)
    os.replace(blob + ".partial", blob)


def vl_ids(fixtures, case="image_b"):
    """The VL case's prompt ids from its tokens.npy."""
    return list(read_npy(os.path.join(fixtures, "vl", case, "tokens.npy"))[1])


def units(text):
    """The trace cut into units: a line that does not start with a space, plus the indented lines after it."""
    out = []
    for line in text.splitlines():
        if line.startswith(" ") and out:
            out[-1].append(line)
        else:
            out.append([line])
    return out


def run_block(spec, blob, ids, zaya, cache, fixtures):
    """The text of one generated block for the marker arguments `spec`."""
    args = shlex.split(spec)
    regex = None
    if "--vl" in args:   # the ZAYA1-VL fixture, its image and prompt
        args.remove("--vl")
        blob = vl_blob_of(blob)
        ensure_vl_blob(blob, fixtures)
        if "--image" not in args:
            args = ["--image", os.path.relpath(os.path.join(fixtures, "vl", "image_b", "image.png"), ROOT)] + args
        if "--ids" not in args and "-i" not in args:
            ids = vl_ids(fixtures)
    if "--filter" in args:
        k = args.index("--filter")
        regex = re.compile(args[k + 1])
        del args[k:k + 2]
    if "--ids" not in args and "-i" not in args:
        args = ["--ids", ",".join(map(str, ids))] + args
    key = tuple(args)
    if key not in cache:
        p = subprocess.run([zaya, blob] + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise RuntimeError(f"./zaya {' '.join(args)} failed: {p.stderr.decode(errors='replace').strip()}")
        cache[key] = p.stdout.decode("utf-8")
    text = cache[key]
    if regex is not None:
        text = "".join("\n".join(u) + "\n" for u in units(text) if regex.search(u[0]))
    if not text.strip():
        raise RuntimeError(f"the block '{spec}' is empty: the filter matches nothing")
    return "```text\n" + text + "```\n"


def render(doc, blob, ids, zaya="./zaya", fixtures=FIXTURES):
    """The document with every generated block rewritten."""
    cache = {}
    return BLOCK.sub(lambda m: m.group(1) + run_block(m.group(2), blob, ids, zaya, cache, fixtures) + m.group(4), doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the document is stale; write nothing")
    ap.add_argument("--blob", default=os.path.join(ROOT, "build", "walkthrough.bin"))
    ap.add_argument("--fixtures", default=FIXTURES)
    ap.add_argument("--doc", default=DOC)
    args = ap.parse_args()
    ensure_blob(args.blob, args.fixtures)
    with open(args.doc, encoding="utf-8") as f:
        doc = f.read()
    new = render(doc, args.blob, prompt_ids(args.fixtures), fixtures=args.fixtures)
    if args.check:
        if new != doc:
            a, b = doc.splitlines(), new.splitlines()
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"{args.doc} is stale from line {i + 1}:\n  document: {a[i] if i < len(a) else '(end)'}\n"
                  f"  program:  {b[i] if i < len(b) else '(end)'}\n  run: make docs")
            sys.exit(1)
        print(f"{args.doc} is up to date")
        return
    if new != doc:
        with open(args.doc, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"rewrote the generated blocks of {args.doc}")
    else:
        print(f"{args.doc} is up to date")


if __name__ == "__main__":
    main()
