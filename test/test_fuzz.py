#!/usr/bin/env python3
"""test_fuzz.py - replays every fuzz regression input and the seed corpora, without clang.

    python3 test/test_fuzz.py

- fuzz_blob: test/fuzz/replay.c + test/fuzz/fuzz_blob.c + zaya.c built with gcc, ASan and UBSan (twice:
  portable kernels and -march=native, whose AVX-512 kernels are the ones fuzzed) run
  test/fuzz/regressions/fuzz_blob/* and the seeds of test/fuzz/make_seeds.py: no crash, no report.
- fuzz_tokenizer (the tokenizer's libFuzzer target, test/fuzz/fuzz_tokenizer.c): the same replay over
  test/fuzz/regressions/fuzz_tokenizer/* if any, plus a few built-in inputs, on the real tokenizer section.
- fuzz_export: test/fuzz/regressions/fuzz_export/* (checkpoint folders) through export_weights.main(),
  then 400 fresh mutations (fixed seed) with every successful export loaded by ./zaya: no traceback,
  exit status 0 or 1, a proper message.
test/fuzz/README.md says how to run the fuzzers themselves (clang / libFuzzer).
"""
import os
import subprocess
import sys

from harness import BUILD, ROOT, check, finish, tokenizer_dir

FUZZ = os.path.join(ROOT, "test", "fuzz")
REG = os.path.join(FUZZ, "regressions")
os.makedirs(BUILD, exist_ok=True)
SAN = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fsanitize=float-cast-overflow", "-fno-sanitize-recover=all", "-std=c11",
       "-I."]
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1")
cc = os.environ.get("CC", "cc")


def run(cmd, env=ENV, timeout=900):
    try:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timed out"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def inputs(name):
    d = os.path.join(REG, name)
    return [d] if os.path.isdir(d) and os.listdir(d) else []


def replay(label, exe, args, env=ENV):
    rc, out, err = run([exe, *args], env=env)
    n = out.strip().splitlines()[-1] if out.strip() else "nothing replayed"
    bad = rc != 0 or any(m in err for m in ("ERROR: AddressSanitizer", "runtime error", "LeakSanitizer"))
    last = [ln for ln in err.splitlines() if ln.startswith("replay: ")][-1:] or ["?"]
    check(not bad, f"{label}: {n}", f"status {rc}, last input {last[0]}\n{err.strip()[-1500:]}")


# --- fuzz_blob ---
seeds = os.path.join(BUILD, "fuzz_blob_seeds")
rc, _, err = run([sys.executable, os.path.join(FUZZ, "make_seeds.py"), seeds])
check(rc == 0, "make_seeds.py writes the tiny seed blobs", err[-500:])
for flavour, extra in (("portable", []), ("native", ["-march=native"])):
    exe = os.path.join(BUILD, f"replay_blob_{flavour}")
    rc, _, err = run([cc, *SAN, *extra, "-o", exe, "test/fuzz/replay.c", "test/fuzz/fuzz_blob.c", "zaya.c", "blob.c", "kernels.c", "ggml_round.c", "tokenizer.c", "zmath.c", "torch_cpu.c", "vision.c", "image.c", "-pthread", "-lm"])
    if check(rc == 0, f"build the fuzz_blob replay ({flavour}, gcc + ASan/UBSan)", err[-800:]):
        replay(f"fuzz_blob replay ({flavour}) of the regressions and seeds", exe, inputs("fuzz_blob") + [seeds])

# --- fuzz_tokenizer ---
tok_src = os.path.join(FUZZ, "fuzz_tokenizer.c")
if check(os.path.exists(tok_src), "test/fuzz/fuzz_tokenizer.c is present"):
    section = os.path.join(BUILD, "fuzz_tokenizer_section.bin")
    if not os.path.exists(section):
        rc, _, err = run([sys.executable, "test/make_tokenizer_section.py", section, tokenizer_dir()])
        check(rc == 0, "make the tokenizer section for the tokenizer replay", err[-500:])
    exe = os.path.join(BUILD, "replay_tokenizer")
    rc, _, err = run([cc, *SAN, "-o", exe, "test/fuzz/replay.c", "test/fuzz/fuzz_tokenizer.c", "tokenizer.c", "-lm"])
    if check(rc == 0, "build the fuzz_tokenizer replay (gcc + ASan/UBSan)", err[-800:]):
        builtin = os.path.join(BUILD, "fuzz_tokenizer_builtin")
        os.makedirs(builtin, exist_ok=True)
        for name, data in (("encode_text", b"\x00Hello, world! <bos><start_of_turn>user\n \xe2\x96\x81\xff\xfe"),
                           ("splice_header", b"\x01\x00\x00\x00\x00" + bytes(range(256)) * 4),
                           ("splice_tail", b"\x01\xff\xff\xff\x7f" + b"\xff" * 600)):
            with open(os.path.join(builtin, name), "wb") as f:
                f.write(data)
        replay("fuzz_tokenizer replay of the regressions and built-in inputs", exe, inputs("fuzz_tokenizer") + [builtin],
               env=dict(ENV, ZAYA_TOK_SECTION=section))

# --- fuzz_export ---
if inputs("fuzz_export"):
    rc, out, err = run([sys.executable, os.path.join(FUZZ, "fuzz_export.py"), "--zaya", "./zaya", "--replay"] + inputs("fuzz_export"))
    for line in out.splitlines():
        if line.startswith(("PASS ", "FAIL ")):
            check(line.startswith("PASS "), line[5:].split(":")[0], line)
    check(rc == 0, "fuzz_export.py --replay of the saved checkpoint folders", (out + err)[-1500:])
rc, out, err = run([sys.executable, os.path.join(FUZZ, "fuzz_export.py"), "--iterations", "400", "--seed", "7", "--zaya", "./zaya"])
check(rc == 0 and "0 bugs" in out, "fuzz_export.py: 400 mutated checkpoints (seed 7), no traceback, every export loads",
      (out + err)[-1500:])
finish()
