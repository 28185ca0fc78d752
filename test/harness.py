"""Small shared pieces of the Python tests: PASS/FAIL lines, running programs, reading .npy files."""
import atexit
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from compare import read_npy  # noqa: E402,F401  (shape, flat array.array) of a .npy file, C order
# the compact fixture in the repository (test/fixtures/README.md): checkpoints, official goldens, tokenizer
FIXTURES = os.environ.get("ZAYA_FIXTURES", os.path.join(ROOT, "test", "fixtures"))
# this test's own build folder (run_tests.py gives each test one, so that tests can run at once)
BUILD = os.environ.get("ZAYA_TEST_BUILD") or os.path.join(ROOT, "build", "test")
failures = 0


def check(ok, name, detail=""):
    """Prints `PASS name` or `FAIL name: detail`; returns ok."""
    global failures
    if ok:
        print(f"PASS {name}", flush=True)
    else:
        failures += 1
        print(f"FAIL {name}: {detail}", flush=True)
    return ok


def finish():
    sys.exit(1 if failures else 0)


def temp_dir(prefix, dir=None):
    """A fresh temporary folder (in dir, default the system's), removed when the test exits (however it exits)."""
    d = tempfile.mkdtemp(prefix=prefix, dir=dir)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def need_fixtures(*parts):
    """The fixture path; a missing fixture is a failure (never a skip): the test stops here."""
    path = os.path.join(FIXTURES, *parts)
    if not os.path.exists(path):
        check(False, "fixtures present", f"{path} not found (hint: test/fixtures/ is part of the repository; "
              "restore it with `git checkout -- test/fixtures`)")
        finish()
    return path


def run(cmd, input=b"", **kw):
    """Runs cmd in the repo root with `input` (bytes) on stdin; returns (returncode, stdout, stderr) as text."""
    p = subprocess.run(cmd, cwd=ROOT, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def export_blob(ckpt, out_dir, name, *extra):
    """export_weights.py CKPT OUT_DIR/NAME.bin [extra]: a check named `export NAME`; returns the blob's path."""
    blob = os.path.join(out_dir, name + ".bin")
    rc, _, err = run([sys.executable, "export_weights.py", ckpt, blob, *extra])
    check(rc == 0, f"export {name}", err[-300:])
    return blob


def dump_run(zaya, blob, ids, out_dir, name, *extra):
    """zaya BLOB --ids IDS --dump OUT_DIR/NAME [extra]: a check named `dump NAME`; returns the dump folder."""
    out = os.path.join(out_dir, name)
    rc, _, err = run([zaya, blob, "--ids", ids, "--dump", out, *extra])
    check(rc == 0, f"dump {name}", err[-300:])
    return out


def compare(*args):
    """compare.py ARGS: (exit status, stdout + stderr)."""
    rc, out, err = run([sys.executable, "compare.py", *args])
    return rc, out + err


def rel_l2(a, b):
    num = sum((x - y) ** 2 for x, y in zip(a, b))
    den = sum(y * y for y in b)
    return math.sqrt(num / den) if den else math.sqrt(num)


def prompt_ids():
    import json
    with open(need_fixtures("index.json")) as f:
        return json.load(f)["prompt"]["ids"]


def tokenizer_dir():
    """A folder with the fixture's tokenizer.json and tokenizer_config.json unpacked (build/test/tokenizer),
    for tests that edit or copy the plain files; written once, again when a .gz is newer."""
    import gzip
    out = os.path.join(BUILD, "tokenizer")
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src, dst = need_fixtures("tokenizer", name + ".gz"), os.path.join(out, name)
        if not os.path.exists(dst) or os.path.getmtime(dst) < os.path.getmtime(src):
            with gzip.open(src, "rb") as f:
                data = f.read()
            with open(dst + ".tmp", "wb") as f:
                f.write(data)
            os.replace(dst + ".tmp", dst)
    return out


def mutant(name, edits):
    """A ./zaya built from a copy of the sources with `edits` [(old, new), ...] applied to zaya.c: a port
    with a bug put there on purpose (build/test/mutants/NAME/zaya). Returns its path, or None after a
    FAIL line when an edit's text is not in zaya.c (the engine changed: update the test's mutation)."""
    import shutil
    out = os.path.join(BUILD, "mutants", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in os.listdir(ROOT):
        if f.endswith((".c", ".h")):
            shutil.copy(os.path.join(ROOT, f), out)
    with open(os.path.join(out, "zaya.c")) as f:
        src = f.read()
    for old, new in edits:
        if not check(src.count(old) == 1, f"mutant {name}: the line to change is in zaya.c once", old[:100]):
            return None
        src = src.replace(old, new)
    with open(os.path.join(out, "zaya.c"), "w") as f:
        f.write(src)
    sources = [os.path.join(out, f) for f in sorted(os.listdir(out)) if f.endswith(".c") and f not in ("quantize.c", "dequantize.c")]
    rc, _, err = run(["cc", "-O2", "-std=c11", f"-DZAYA_COMMIT=\"{name}\"", "-o", os.path.join(out, "zaya"), *sources,
                      "-pthread", "-lm"])
    return os.path.join(out, "zaya") if check(rc == 0, f"mutant {name}: builds", err[-300:]) else None
