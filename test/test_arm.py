#!/usr/bin/env python3
"""test_arm.py - arm64 builds (NEON + dotprod, NEON, no SIMD) under qemu give the x86 builds' bits.

    make zaya && python3 test/test_arm.py

Cross-builds ./zaya for arm64 with Debian's aarch64-linux-gnu-gcc: -march=armv8.2-a+dotprod (NEON, the
dot-product extension on), -march=armv8-a (NEON) and -march=armv8-a+nosimd (the portable loops); with
clang -mcpu=apple-m1 where clang is installed; and for x86-64 beside ./zaya (-march=native, here
AVX-512): -mavx2 -mfma (the AVX2 kernels) and no -march (the portable loops). Runs each, arm64 under
qemu-aarch64, on test_simd.py's checkpoints (hidden 512: every SIMD block; hidden 200, head_dim 40:
tails everywhere), fp32, bf16 and int8 blobs (groups of 64 and 32), whole prompt and token by token
(--batch 1), and NEON+dotprod on the compact fixture with its prompt (--precision fp32 and
bf16-torch1.13); every tensor of every --dump must be the same bytes as ./zaya's. Also zmath.c:
test_zmath's checksum over its sweep, arm64 = x86-64; and test_kernels.c (every fast kernel against its
plain twin) built for arm64 passes under qemu. Without the cross tools it prints a SKIP line
(run_tests.py counts it as skipped, never passed); .ci/run installs them (gcc-aarch64-linux-gnu,
libc6-dev-arm64-cross, qemu-user). Prints `PASS name` / `FAIL name: detail` / `SKIP name: why`.
"""
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from harness import BUILD, ROOT, check, finish, need_fixtures, prompt_ids, tokenizer_dir

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_dims import small_tokenizer  # noqa: E402
from test_simd import BLOBS, CONFIGS, IDS, same_bits  # noqa: E402

CROSS, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
SRC = ["zaya.c", "blob.c", "kernels.c", "ggml_round.c", "tokenizer.c", "trace.c", "zmath.c", "torch_cpu.c", "vision.c", "image.c", "dump.c", "kld.c", "replay.c", "main.c"]
FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", "-ffp-contract=off",
         '-DZAYA_COMMIT="arm-test"']
ARM = [("arm64 NEON+dotprod", ["-march=armv8.2-a+dotprod"]), ("arm64 NEON", ["-march=armv8-a"]),
       ("arm64 portable", ["-march=armv8-a+nosimd"])]
# where clang is installed: the Mac's compiler family for an Apple M1 (clang contracts a * b + c into an FMA
# unless told not to: the Makefile's -ffp-contract=off), linked against the same Debian arm64 libc
CLANG_ARM = ("arm64 clang -mcpu=apple-m1", ["--target=aarch64-linux-gnu", "-mcpu=apple-m1"])
X86 = [("x86-64 AVX2", ["-mavx2", "-mfma"]), ("x86-64 portable", [])]
ZMATH_STRIDE = "65521"   # test_zmath's sweep, thinned for qemu (~260k values a function)


def run(cmd, cwd=ROOT):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    return p.returncode, p.stdout, p.stderr


def main():
    if platform.machine() != "x86_64":
        print(f"SKIP arm64 builds under qemu: this test compares them with x86-64 builds; this machine is "
              f"{platform.machine()} (hint: run it on an x86-64 Linux machine)")
        return finish()
    missing = [t for t in (CROSS, QEMU) if not shutil.which(t)]
    if missing or not os.path.isdir(SYSROOT):
        print(f"SKIP arm64 builds under qemu: {', '.join(missing) or SYSROOT} not found (hint: apt-get install "
              "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; .ci/run does)")
        return finish()
    if not check(os.path.exists(os.path.join(ROOT, "zaya")), "./zaya is built", "run: make zaya"):
        return finish()
    os.makedirs(BUILD, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="arm_", dir=BUILD)
    try:
        test(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


def test(tmp):
    # the builds, two at a time (each ~7 s of one core)
    builds, jobs = [], []
    variants = ARM + ([CLANG_ARM] if shutil.which("clang") else []) + X86
    if not shutil.which("clang"):
        print("SKIP arm64 clang -mcpu=apple-m1 build: clang not found (hint: apt-get install clang)")
    for i, (name, flags) in enumerate(variants):
        cc = "clang" if "clang" in name else CROSS if name.startswith("arm64") else "cc"
        exe = os.path.join(tmp, f"zaya_{i}")
        builds.append((name, exe, name.startswith("arm64")))
        jobs.append((f"{name}: {cc} -O3 {' '.join(flags)}", [cc, *FLAGS, *flags, "-o", exe, *SRC, "-pthread", "-lm"]))
    zm_arm, zm_x86 = os.path.join(tmp, "test_zmath_arm"), os.path.join(tmp, "test_zmath_x86")
    tk = os.path.join(tmp, "test_kernels_arm")
    jobs.append(("test_kernels for arm64 NEON+dotprod", [CROSS, *FLAGS, "-march=armv8.2-a+dotprod", "-I.", "-o", tk,
                                                          "test/test_kernels.c", *SRC[:10], "-pthread", "-lm"]))
    zm = ["-I.", "test/test_zmath.c", "zmath.c", "-lm"]
    jobs.append(("test_zmath for arm64", [CROSS, *FLAGS, "-march=armv8.2-a+dotprod", "-o", zm_arm, *zm]))
    jobs.append(("test_zmath for x86-64", ["cc", *FLAGS, "-march=native", "-o", zm_x86, *zm]))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: run(j[1]), jobs))
    ok = True
    for (label, _), (rc, _, err) in zip(jobs, results):
        ok &= check(rc == 0, f"build {label}", err[-500:])
    if not ok:
        return
    qemu = [QEMU, "-cpu", "max", "-L", SYSROOT]   # max: every extension the builds may use (dotprod, the M1's)

    # zmath.c: the same results on arm64 as on x86-64 (and within its bounds there too)
    (rc_a, out_a, err_a), (rc_x, out_x, _) = run([*qemu, zm_arm, ZMATH_STRIDE]), run([zm_x86, ZMATH_STRIDE])
    sums = [next((ln for ln in o.splitlines() if ln.startswith("checksum")), "no checksum line")
            for o in (out_a, out_x)]
    check(rc_a == 0 and rc_x == 0 and sums[0] == sums[1] and sums[0] != "no checksum line",
          f"zmath.c on arm64 (qemu) = on x86-64: {sums[1]}",
          f"arm64 rc {rc_a}, {sums[0]}; x86-64 rc {rc_x}, {sums[1]} ({(out_a + err_a)[-300:]}) (hint: zmath.c must use "
          "only IEEE double +-*/ without contraction; look for an FMA or a libm call)")

    # every fast kernel against its plain twin (test_kernels.c: FP8, MXFP4, attention too), on arm64
    rc, out, err = run([*qemu, tk])
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL ")]
    check(rc == 0 and not fails and "PASS " in out, f"test_kernels on arm64 (qemu): {out.count('PASS ')} checks pass",
          f"rc {rc}: {(fails[:3] or [err[-300:]])}")

    tok = small_tokenizer(tokenizer_dir(), os.path.join(tmp, "tokenizer"))
    cases = []
    for name, flags in CONFIGS:
        ck = os.path.join(tmp, name)
        rc, _, err = run([sys.executable, "tools/make_checkpoint.py", ck, *flags, "--tokenizer-dir", tok, "--force",
                          "--quiet"])
        if not check(rc == 0, f"make_checkpoint {name}", err[-300:]):
            continue
        for dtype, extra in BLOBS if name == "wide" else BLOBS[:3]:   # 200-wide rows have no groups of 32
            blob = f"{ck}_{dtype}.bin"
            rc, _, err = run([sys.executable, "export_weights.py", ck, blob, "--chat-format", "none", *extra])
            if check(rc == 0, f"export {name} {dtype}", err[-300:]):
                cases.append((name, dtype, blob))
    runs = []   # (case, how, build name, command, dump)
    for name, dtype, blob in cases:
        for how, batch in (("whole prompt", []), ("token by token", ["--batch", "1"])):
            for b, (bname, exe, arm) in enumerate([("x86-64 -march=native (./zaya)", "./zaya", False), *builds]):
                d = f"{blob}_{b}_{len(batch)}"
                runs.append(((name, dtype, how), bname, [*(qemu if arm else []), exe, blob, "--ids", IDS, "--dump", d,
                                                         "--threads", "1", *batch], d))
    # the compact fixture (6 layers, sliding windows, the 262k vocabulary; too narrow for the SIMD blocks) with
    # its prompt, in float32 and in the bf16 emulation: where glibc's libm made 184 of 220 tensors differ
    fx = os.path.join(tmp, "fixture.bin")
    rc, _, err = run([sys.executable, "export_weights.py", os.path.join(need_fixtures(), "checkpoint_native"), fx])
    if check(rc == 0, "export the compact fixture", err[-300:]):
        fx_ids = ",".join(map(str, prompt_ids()))
        for precision in ("fp32", "bf16-torch1.13"):
            for b, (bname, exe, arm) in enumerate([("x86-64 -march=native (./zaya)", "./zaya", False), builds[0]]):
                d = f"{fx}_{precision}_{b}"
                runs.append((("fixture", precision, "whole prompt"), bname, [*(qemu if arm else []), exe, fx, "--ids",
                             fx_ids, "--precision", precision, "--dump", d, "--threads", "1"], d))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: run(r[2]), runs))
    ref = {}
    for (case, bname, cmd, d), (rc, _, err) in zip(runs, results):
        label = f"{case[0]} {case[1]}, {case[2]}"
        if not check(rc == 0, f"{bname} {label}: runs", err[-300:]):
            continue
        if case not in ref:
            ref[case] = d
            continue
        n, differs = same_bits(ref[case], d)
        check(differs is None, f"{label}: {bname} gives ./zaya's bits in all {n} tensors of the dump",
              f"first differing: {differs} (hint: a SIMD twin in kernels.c parts from its portable loop's "
              "operations or order, or a libm call or an FMA contraction crept in)")


if __name__ == "__main__":
    main()
