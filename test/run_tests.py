#!/usr/bin/env python3
"""run_tests.py - runs every test of zaya.c and ends with the line `N passed, N failed`.

    python3 test/run_tests.py [--fixtures test/fixtures] [--only NAME]

Each test is a program that prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`,
and exits non-zero when anything failed. A test that exits non-zero without printing a FAIL line
(a crash) counts as one failure. Missing fixtures are a failure, never a skip. The fixtures are the
compact set in the repository (test/fixtures/README.md): nothing beside the repository is read.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, command) in the order they run; commands run in the repo root.
TESTS = [
    ("kernels", ["build/test_kernels", "test/test_kernels.c"]),
    ("sample", ["build/test_sample", "test/test_sample.c"]),
    ("engine", [sys.executable, "test/test_engine.py"]),
    ("int8", [sys.executable, "test/test_int8.py"]),
    ("simd", [sys.executable, "test/test_simd.py"]),
    ("quantized", [sys.executable, "test/test_quantized.py"]),
    ("gguf", [sys.executable, "test/test_gguf.py"]),
    ("cli", [sys.executable, "test/test_cli.py"]),
    ("tokenizer", [sys.executable, "test/test_tokenizer.py"]),
    ("dims", [sys.executable, "test/test_dims.py"]),
    ("bf16", [sys.executable, "test/test_bf16.py"]),
    ("replay", [sys.executable, "test/test_replay.py"]),
    ("portmap", [sys.executable, "test/test_portmap.py"]),
    ("compare", [sys.executable, "test/test_compare.py"]),
    ("misuse", [sys.executable, "test/test_misuse.py"]),
    ("precision", [sys.executable, "test/test_precision.py"]),
    ("port_weights", [sys.executable, "test/test_port_weights.py"]),
    ("quant", [sys.executable, "test/test_quant.py"]),
    ("quant_sensitivity", [sys.executable, "test/test_quant_sensitivity.py"]),
    ("formats", [sys.executable, "test/test_formats.py"]),
    ("golden_hf", [sys.executable, "test/test_golden_hf.py"]),
    ("trace", [sys.executable, "test/test_trace.py"]),
    ("walkthrough", [sys.executable, "test/test_walkthrough.py"]),
    ("bad_input", [sys.executable, "test/test_bad_input.py"]),
    ("fuzz", [sys.executable, "test/test_fuzz.py"]),
    ("bench", [sys.executable, "test/test_bench.py"]),
    ("ggml_round", ["build/test_ggml_round", "test/test_ggml_round.c"]),
    ("ggml_capture", [sys.executable, "test/test_ggml_capture.py"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="test/fixtures", help="a folder laid out like test/fixtures")
    ap.add_argument("--only", action="append", help="run only these tests (repeatable)")
    args = ap.parse_args()
    env = dict(os.environ, ZAYA_FIXTURES=os.path.abspath(os.path.join(ROOT, args.fixtures)))
    passed = failed = 0
    if not os.path.isdir(env["ZAYA_FIXTURES"]):
        print(f"FAIL fixtures: {env['ZAYA_FIXTURES']} not found (hint: test/fixtures/ is part of the repository; "
              "restore it with `git checkout -- test/fixtures`)")
        failed += 1
    for name, cmd in TESTS:
        if args.only and name not in args.only:
            continue
        source = cmd[-1] if cmd[0] != sys.executable else cmd[1]
        if not os.path.exists(os.path.join(ROOT, source)):
            print(f"FAIL {name}: {source} is missing")
            failed += 1
            continue
        if cmd[0] != sys.executable:
            cmd = cmd[:-1]          # a compiled test: the last item only names its source
            if not os.path.exists(os.path.join(ROOT, cmd[0])):
                print(f"FAIL {name}: {cmd[0]} is not built (hint: run `make test`, which builds it)")
                failed += 1
                continue
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
        n_pass = n_fail = 0
        for line in p.stdout.splitlines():
            print("   " + line if not line.startswith(("PASS ", "FAIL ")) else line)
            n_pass += line.startswith("PASS ")
            n_fail += line.startswith("FAIL ")
        if p.returncode != 0 and n_fail == 0:
            print(f"FAIL {name}: exited with status {p.returncode} without naming a failed check")
            n_fail += 1
        print(f"   ({name}: {n_pass} passed, {n_fail} failed, {time.time() - t0:.1f} s)", flush=True)
        passed += n_pass
        failed += n_fail
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
