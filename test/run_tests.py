#!/usr/bin/env python3
"""run_tests.py - runs every test of zaya.c and ends with the line `N passed, N failed` (`, N skipped` after it
when a check was skipped).

    python3 test/run_tests.py [--fixtures test/fixtures] [--only NAME] [-j JOBS]

Each test is a program that prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`,
and exits non-zero when anything failed. A test that exits non-zero without printing a FAIL line
(a crash) counts as one failure. Missing fixtures are a failure, never a skip; `SKIP <name>: <why>` is
only for a check whose optional tools are not on this machine (counted as skipped, never as passed).
Tests run two at a time on a machine with two or more cores (-j), each in its own build folder
(ZAYA_TEST_BUILD, build/test/NAME); their output is printed whole, in the order listed below. The
fixtures are the compact set in the repository (test/fixtures/README.md): nothing beside the repository is read.
"""
import argparse
import concurrent.futures
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
    ("legit", [sys.executable, "test/test_legit.py"]),
    ("portmap", [sys.executable, "test/test_portmap.py"]),
    ("compare", [sys.executable, "test/test_compare.py"]),
    ("misuse", [sys.executable, "test/test_misuse.py"]),
    ("precision", [sys.executable, "test/test_precision.py"]),
    ("port_weights", [sys.executable, "test/test_port_weights.py"]),
    ("quant", [sys.executable, "test/test_quant.py"]),
    ("diagnose", [sys.executable, "test/test_diagnose.py"]),
    ("gguf_tokenizer", [sys.executable, "test/test_gguf_tokenizer.py"]),
    ("quant_sensitivity", [sys.executable, "test/test_quant_sensitivity.py"]),
    ("mlx", [sys.executable, "test/test_mlx.py"]),
    ("formats", [sys.executable, "test/test_formats.py"]),
    ("golden_hf", [sys.executable, "test/test_golden_hf.py"]),
    ("trace", [sys.executable, "test/test_trace.py"]),
    ("walkthrough", [sys.executable, "test/test_walkthrough.py"]),
    ("bad_input", [sys.executable, "test/test_bad_input.py"]),
    ("fuzz", [sys.executable, "test/test_fuzz.py"]),
    ("bench", [sys.executable, "test/test_bench.py"]),
    ("zmath", ["build/test_zmath", "test/test_zmath.c"]),
    ("arm", [sys.executable, "test/test_arm.py"]),
    ("vision", [sys.executable, "test/test_vision.py"]),
    ("torch_cpu", [sys.executable, "test/test_torch_cpu.py"]),
    ("vl", [sys.executable, "test/test_vl.py"]),
    ("vl_export", [sys.executable, "test/test_vl_export.py"]),
    ("vl_tools", [sys.executable, "test/test_vl_tools.py"]),
    ("ggml_round", ["build/test_ggml_round", "test/test_ggml_round.c"]),
    ("ggml_capture", [sys.executable, "test/test_ggml_capture.py"]),
    ("coreml_pal", [sys.executable, "test/test_coreml_pal.py"]),
]

# started first when tests run in parallel (each takes minutes here)
SLOW = {"arm", "simd", "bf16", "replay", "quantized", "dims", "fuzz", "bad_input", "compare", "engine"}


def run_one(name, cmd, env):
    """Runs one test; returns (its output lines, indented except PASS/FAIL/SKIP lines, and its summary line;
    passed, failed, skipped). Each test gets its own build folder (ZAYA_TEST_BUILD) so tests can run at once."""
    source = cmd[-1] if cmd[0] != sys.executable else cmd[1]
    if not os.path.exists(os.path.join(ROOT, source)):
        return [f"FAIL {name}: {source} is missing"], 0, 1, 0
    if cmd[0] != sys.executable:
        cmd = cmd[:-1]          # a compiled test: the last item only names its source
        if not os.path.exists(os.path.join(ROOT, cmd[0])):
            return [f"FAIL {name}: {cmd[0]} is not built (hint: run `make test`, which builds it)"], 0, 1, 0
    env = dict(env, ZAYA_TEST_BUILD=os.path.join(ROOT, "build", "test", name))
    lines = [f"== {name}: {' '.join(cmd)}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="replace")
    n_pass = n_fail = n_skip = 0
    for line in p.stdout.splitlines():
        lines.append(line if line.startswith(("PASS ", "FAIL ", "SKIP ")) else "   " + line)
        n_pass += line.startswith("PASS ")
        n_fail += line.startswith("FAIL ")
        n_skip += line.startswith("SKIP ")
    if p.returncode != 0 and n_fail == 0:
        lines.append(f"FAIL {name}: exited with status {p.returncode} without naming a failed check")
        n_fail += 1
    lines.append(f"   ({name}: {n_pass} passed, {n_fail} failed, {n_skip} skipped, {time.time() - t0:.1f} s)")
    return lines, n_pass, n_fail, n_skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="test/fixtures", help="a folder laid out like test/fixtures")
    ap.add_argument("--only", action="append", help="run only these tests (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="tests run at once (default: 2, or 1 on one core); output stays in the listed order")
    args = ap.parse_args()
    env = dict(os.environ, ZAYA_FIXTURES=os.path.abspath(os.path.join(ROOT, args.fixtures)))
    passed = failed = skipped = 0
    if not os.path.isdir(env["ZAYA_FIXTURES"]):
        print(f"FAIL fixtures: {env['ZAYA_FIXTURES']} not found (hint: test/fixtures/ is part of the repository; "
              "restore it with `git checkout -- test/fixtures`)")
        failed += 1
    chosen = [(name, cmd) for name, cmd in TESTS if not args.only or name in args.only]
    unknown = sorted(set(args.only or []) - {name for name, _ in TESTS})
    for name in unknown:
        print(f"FAIL {name}: no such test (hint: one of {', '.join(n for n, _ in TESTS)})")
        failed += 1
    # the slowest tests first, so that two workers finish together; output is printed in TESTS order
    order = sorted(range(len(chosen)), key=lambda i: chosen[i][0] not in SLOW)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {i: pool.submit(run_one, *chosen[i], env) for i in order}
        for i in range(len(chosen)):
            lines, n_pass, n_fail, n_skip = futures[i].result()
            print("\n".join(lines), flush=True)
            passed += n_pass
            failed += n_fail
            skipped += n_skip
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
