#!/usr/bin/env python3
"""test_bench.py - bench/decode_vs_read.c on small blobs, bench/matmul_rate.c on small shapes (their speed
numbers are not checked here).
(Blobs: the compact fixture in fp32 / bf16 / int8, odd dimensions in int8, native MXFP4 and FP8
experts with int8 elsewhere.)

decode_vs_read reads, after each decode step, the weight bytes a decode step reads; its
bytes_per_token must equal bench/bytes_per_token.py's total for the same blob (the two count those
bytes independently: one from the loaded model's tensors, one from the blob's tensor directory).
Checked on the compact fixture (test/fixtures) at fp32, bf16 and int8, and on an odd-dimension checkpoint from
tools/make_checkpoint.py (hidden 50, 5 experts, expert width 27: int8 groups that do not fill a
block); at 1 and 2 threads; its --profile table (rows that add up, the step's tap pairs in order);
plus its usage and error exits. Needs build/decode_vs_read (make test). And bench/bench.sh --contention
runs on the compact fixture (one round, one token: the code path, not its speed).
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, check, finish, need_fixtures, tokenizer_dir, run  # noqa: E402
from test_dims import small_tokenizer  # noqa: E402

EXE = os.path.join(ROOT, "build", "decode_vs_read")
LINE = re.compile(r"^decode_vs_read threads=(\d+) steps=(\d+) bytes_per_token=(\d+) decode_tok/s=([0-9.]+) "
                  r"read_GB/s=([0-9.]+) ceiling_tok/s=([0-9.]+) ratio=([0-9.]+) ratio_median=([0-9.]+) "
                  r"ratio_min=([0-9.]+) ratio_max=([0-9.]+)$")


def python_total(blob):
    rc, out, err = run(["python3", "bench/bytes_per_token.py", blob])
    m = re.search(r"total=(\d+)", out)
    return int(m.group(1)) if rc == 0 and m else None


def paired(label, blob, threads, steps=3):
    rc, out, err = run([EXE, blob, "--ids", "2,17,300,45", "-n", str(steps), "--threads", str(threads)])
    m = LINE.match(out.strip())
    if not check(rc == 0 and m is not None, f"{label}: one report line at {threads} thread(s)",
                 f"exit {rc}, stdout {out.strip()[:300]!r}, stderr {err.strip()[-300:]!r}"):
        return
    want = python_total(blob)
    check(int(m.group(3)) == want, f"{label}: bytes per token = bytes_per_token.py's total ({want})",
          f"decode_vs_read counts {m.group(3)}")
    check(int(m.group(1)) == threads and int(m.group(2)) == steps, f"{label}: threads and steps as asked",
          out.strip())
    # the ratios print with 3 decimals: a step pair preempted on a loaded machine can print 0.000
    ok = all(float(m.group(i)) > 0 for i in range(4, 7)) and all(float(m.group(i)) >= 0 for i in range(7, 11)) \
        and float(m.group(9)) <= float(m.group(8)) <= float(m.group(10)) and float(m.group(10)) > 0
    check(ok, f"{label}: speeds positive, ratios >= 0 (the largest > 0), min <= median <= max", out.strip())


RATE = os.path.join(ROOT, "build", "matmul_rate")
RATE_LINE = re.compile(r"^matmul_rate dtype=(\w+) rows=(\d+) cols=(\d+) tokens=(\d+) rounds=(\d+) GMAC/s=([0-9.]+) "
                       r"\(([0-9.]+)-([0-9.]+)\) product_GB/s=([0-9.]+) read_GB/s=([0-9.]+) ratio=([0-9.]+)$")


def matmul_rate():
    """bench/matmul_rate.c: its line for each dtype, one token and several (odd rows: the pair kernel's last
    row alone), and its argument errors (exit 2, what was wrong and what was found)."""
    if not check(os.path.exists(RATE), "build/matmul_rate exists", "run: make test (it builds it)"):
        return
    for args in (["bf16", "33", "320", "9"], ["f32", "17", "96", "1"], ["int8", "64", "128", "3"]):
        rc, out, err = run([RATE] + args + ["--rounds", "3"])
        m = RATE_LINE.match(out.strip())
        ok = rc == 0 and m is not None and list(m.group(1, 2, 3, 4, 5)) == args + ["3"] \
            and float(m.group(7)) <= float(m.group(6)) <= float(m.group(8)) and float(m.group(6)) > 0
        check(ok, f"matmul_rate {' '.join(args)}: one line, the shape as asked, min <= median <= max",
              f"exit {rc}, stdout {out.strip()[:300]!r}, stderr {err.strip()[-300:]!r}")
    for args, what in ((["f16", "8", "64", "1"], "the dtype must be f32, bf16 or int8"),
                       (["bf16", "8", "0", "1"], "COLS must be a whole number"),
                       (["int8", "8", "65", "1"], "a multiple of 64"),
                       (["bf16", "8", "64", "1", "--round", "2"], "unknown option"), ([], "usage")):
        rc, out, err = run([RATE] + args)
        check(rc == 2 and what in err and "usage" in err, f"matmul_rate {' '.join(args) or '(no arguments)'}: exit 2, says {what!r}",
              f"exit {rc}, {err.strip()[:300]!r}")
    for args, what in ((["bf16", "100000", "100000", "1"], "20.0 GB of weights"),
                       (["bf16", "8", "64", "1073741824"], "309.2 GB of activations")):
        rc, out, err = run([RATE] + args)
        check(rc == 1 and what in err and "hint" in err, f"matmul_rate {' '.join(args)}: {what} refused before allocating, exit 1",
              f"exit {rc}, {err.strip()[:300]!r}")


SEGMENT = re.compile(r"^ *([0-9.]+) ms +([0-9.]+) %  (.+) -> (.+)$")


def profiled(label, blob, threads, steps=2):
    """--profile: after the paired line, the time between consecutive taps of `steps` more steps."""
    rc, out, err = run([EXE, blob, "--ids", "2,17,300,45", "-n", str(steps), "--threads", str(threads), "--profile"])
    lines = out.strip().splitlines()
    head = re.match(r"^profile steps=(\d+) ms/token=([0-9.]+) taps_ms/token=([0-9.]+) ", lines[1]) if len(lines) > 1 else None
    if not check(rc == 0 and LINE.match(lines[0]) and head and int(head.group(1)) == steps,
                 f"{label} --profile: the paired line, then the profile line", f"exit {rc}, {out[:300]!r}, {err[-300:]!r}"):
        return
    segs = [SEGMENT.match(line) for line in lines[2:]]
    if not check(segs and all(segs), f"{label} --profile: every row is 'ms, share, from -> to'", out[:500]):
        return
    pairs = [(m.group(3), m.group(4)) for m in segs]
    ms = sum(float(m.group(1)) for m in segs)
    check(abs(ms - float(head.group(3))) <= 0.001 * len(segs) and float(head.group(3)) <= float(head.group(2)),
          f"{label} --profile: the rows add up to the taps' total, within the step's time",
          f"rows {ms:.3f} ms, taps {head.group(3)}, step {head.group(2)}")
    check(abs(sum(float(m.group(2)) for m in segs) - 100) <= 0.1 * len(segs), f"{label} --profile: shares add up to 100 %",
          str(sum(float(m.group(2)) for m in segs)))
    check(pairs[0] == ("(step start)", "model.embed_tokens") and pairs[-1] == ("logits", "(step end)")
          and ("input_layernorm", "self_attn.qkv_proj.q_proj") in pairs and ("model.norm", "logits") in pairs
          and len(set(pairs)) == len(pairs),
          f"{label} --profile: the step's tap pairs in order, each once", str(pairs[:4] + pairs[-3:]))


def main():
    check(os.path.exists(EXE), "build/decode_vs_read exists", "run: make test (it builds it)")
    if not os.path.exists(EXE):
        finish()
    ckpt = need_fixtures("checkpoint_native")
    os.makedirs(BUILD, exist_ok=True)
    for dtype in ("fp32", "bf16", "int8"):
        blob = os.path.join(BUILD, f"bench_fixture_{dtype}.bin")
        rc, _, err = run(["python3", "export_weights.py", ckpt, blob, "--dtype", dtype])
        if check(rc == 0, f"export the fixture ({dtype})", err[-500:]):
            paired(f"fixture {dtype}", blob, 1)
    paired("fixture int8", os.path.join(BUILD, "bench_fixture_int8.bin"), 2)
    profiled("fixture int8", os.path.join(BUILD, "bench_fixture_int8.bin"), 2)

    odd = os.path.join(BUILD, "bench_odd")
    tok = small_tokenizer(tokenizer_dir(), os.path.join(BUILD, "bench_tokenizer_1000"))
    rc, _, err = run(["python3", "tools/make_checkpoint.py", odd, "--hidden", "50", "--layers", "3", "--heads", "2",
                      "--kv-heads", "2", "--head-dim", "16", "--experts", "5", "--moe-intermediate", "27",
                      "--router-hidden", "13", "--vocab", "997", "--cca-time0", "2", "--cca-time1", "3",
                      "--skip-bias", "0.04", "--seed", "3", "--tokenizer-dir", tok, "--force", "--quiet"])
    if check(rc == 0, "make_checkpoint: odd dimensions", err[-500:]):
        blob = odd + "_int8.bin"
        rc, _, err = run(["python3", "export_weights.py", odd, blob, "--dtype", "int8", "--chat-format", "none"])
        if check(rc == 0, "export the odd-dimension checkpoint (int8)", err[-500:]):
            paired("odd int8", blob, 1, steps=5)
            paired("odd int8", blob, 2, steps=5)
            profiled("odd int8", blob, 1)

    # format version 2: native MXFP4 / FP8 experts (rows of 64, a multiple of MXFP4's 32), int8 elsewhere
    small = os.path.join(BUILD, "bench_small64")
    rc, _, err = run(["python3", "tools/make_checkpoint.py", small, "--hidden", "64", "--layers", "2", "--heads", "4",
                      "--kv-heads", "2", "--head-dim", "16", "--experts", "3", "--moe-intermediate", "64",
                      "--router-hidden", "16", "--vocab", "1000", "--seed", "3", "--tokenizer-dir", tok, "--force", "--quiet"])
    if check(rc == 0, "make_checkpoint: hidden 64 for the quantized experts", err[-500:]):
        for fmt in ("mxfp4", "fp8"):
            q, blob = f"{small}_{fmt}", f"{small}_{fmt}_int8.bin"
            rc, _, err = run(["python3", "test/make_quantized_checkpoint.py", small, q, "--format", fmt, "--random-experts",
                              "--quiet"])
            if rc == 0:
                rc, _, err = run(["python3", "export_weights.py", q, blob, "--dtype", "int8", "--keep-quantized-experts",
                                  "--chat-format", "none"])
            if check(rc == 0, f"native {fmt} experts + int8: checkpoint and export", err[-500:]):
                paired(f"native {fmt} + int8", blob, 1)

    with tempfile.TemporaryDirectory() as out_dir:   # bench.sh keeps its blobs out of the repository
        rc, out, err = run(["bash", "bench/bench.sh", ckpt, "--contention", "--rounds", "1", "-n", "1", "--threads", "1 2",
                            "--out", out_dir], env=dict(os.environ, ZAYA=os.path.join(ROOT, "zaya")))
        rows = [ln for ln in out.splitlines() if re.match(r"^\| [12] \| (quiet|busy) \| [0-9.]+ \(", ln)]
        check(rc == 0 and len(rows) == 4 and os.path.exists(os.path.join(out_dir, "contention-int8.md")),
              "bench.sh --contention: a row per thread count and condition (1 round, 1 token, compact fixture)",
              f"exit {rc}, {len(rows)} rows; {out[-600:]!r} {err[-600:]!r}")

    matmul_rate()
    rc, out, err = run([EXE])
    check(rc == 2 and "usage" in err, "no arguments: usage, exit 2", f"exit {rc}, {err.strip()[:200]!r}")
    rc, out, err = run([EXE, os.path.join(BUILD, "bench_fixture_int8.bin"), "-n", "zero"])
    check(rc == 2 and "-n needs a number" in err, "bad -n: what was wrong, exit 2", f"exit {rc}, {err.strip()[:200]!r}")
    rc, out, err = run([EXE, os.path.join(BUILD, "bench_fixture_int8.bin"), "--ids", "2,x"])
    check(rc == 2 and "item 2 is not a token id" in err, "bad --ids: which item, exit 2", f"exit {rc}, {err.strip()[:200]!r}")
    rc, out, err = run([EXE, os.path.join(BUILD, "no_such_blob.bin")])
    check(rc == 1 and "cannot open" in err and "hint" in err, "missing blob: the loader's message and hint, exit 1",
          f"exit {rc}, {err.strip()[:200]!r}")
    finish()


if __name__ == "__main__":
    main()
