#!/usr/bin/env python3
"""test_simd.py - this build's SIMD kernels (AVX-512, AVX2 + FMA, or none) against the portable loops.

    make zaya zaya_debug && python3 test/test_simd.py

kernels.c writes each fast dot product twice, intrinsics and plain C, with the same operations in the
same order. ./zaya is built with -march=native (whichever SIMD path this machine has), ./zaya_debug
without (the plain C loops, under ASan + UBSan). On checkpoints wide enough for the SIMD blocks to run
(hidden 512: int8 rows of whole blocks of 8 groups of 64, float rows of whole 32-value steps) and on odd
widths (hidden 200, head_dim 40: every row has a tail), in fp32, bf16 and int8 blobs (int8 also with
groups of 32), every tensor of a --dump, whole prompt and token by token (--batch 1: one token a dot
product), must be the same bits from both builds. The fixture is too narrow for the SIMD blocks of the
int8 kernels (hidden 16), so the whole-model tests elsewhere do not reach them.
Build products go to build/simd/. Prints `PASS name` / `FAIL name: detail`.
"""
import os
import shutil
import subprocess
import sys

from harness import ROOT, check, finish, tokenizer_dir

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_dims import load_dump, small_tokenizer  # noqa: E402

OUT = os.path.join(ROOT, "build", "simd")
CONFIGS = [   # (name, make_checkpoint.py flags)
    ("wide", ["--hidden", "512", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
              "--experts", "2", "--moe-intermediate", "512", "--router-hidden", "64", "--vocab", "1000", "--seed", "3"]),
    ("odd", ["--hidden", "200", "--layers", "2", "--heads", "3", "--kv-heads", "1", "--head-dim", "40",
             "--experts", "3", "--moe-intermediate", "136", "--router-hidden", "24", "--vocab", "1000", "--seed", "5"]),
]
BLOBS = [("fp32", ["--dtype", "fp32"]), ("bf16", ["--dtype", "bf16"]), ("int8", ["--dtype", "int8"]),
         ("int8_g32", ["--dtype", "int8", "--group-size", "32"])]
IDS = "2,17,996,512,0,45,300,301,7,88,650,3,3,3,420,777,1,106,250,995"


def run(cmd):
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    return p.returncode, p.stderr


def same_bits(a, b):
    """(tensors compared, the first that differs or None) over every tensor of dump a."""
    ta, order = load_dump(a)
    tb, _ = load_dump(b)
    for name in order:
        if name not in tb:
            return len(order), f"{name} missing from {b}"
        with open(os.path.join(a, ta[name]["file"]), "rb") as f, open(os.path.join(b, tb[name]["file"]), "rb") as g:
            if f.read() != g.read():
                return len(order), name
    return len(order), None


def main():
    for exe in ("zaya", "zaya_debug"):
        if not check(os.path.exists(os.path.join(ROOT, exe)), f"./{exe} is built", "run: make zaya zaya_debug"):
            return finish()
    shutil.rmtree(OUT, ignore_errors=True)
    tok = small_tokenizer(tokenizer_dir(), os.path.join(OUT, "tokenizer"))
    for name, flags in CONFIGS:
        ck = os.path.join(OUT, name)
        rc, err = run([sys.executable, "tools/make_checkpoint.py", ck, *flags, "--tokenizer-dir", tok, "--force", "--quiet"])
        if not check(rc == 0, f"make_checkpoint {name}", err[-300:]):
            continue
        for dtype, extra in BLOBS if name == "wide" else BLOBS[:3]:   # 200-wide rows have no groups of 32
            blob = f"{ck}_{dtype}.bin"
            rc, err = run([sys.executable, "export_weights.py", ck, blob, "--chat-format", "none", *extra])
            if not check(rc == 0, f"export {name} {dtype}", err[-300:]):
                continue
            for how, batch in (("whole prompt", []), ("token by token", ["--batch", "1"])):
                dumps = []
                for exe in ("./zaya", "./zaya_debug"):
                    d = f"{blob}_{exe[2:]}_{len(batch)}"
                    rc, err = run([exe, blob, "--ids", IDS, "--dump", d, *batch])
                    check(rc == 0, f"{exe} {name} {dtype} {how}: runs", err[-300:])
                    dumps.append(d)
                n, differs = same_bits(*dumps)
                check(differs is None, f"{name} {dtype}, {how}: SIMD and portable kernels give the same bits in all "
                      f"{n} tensors of the dump", f"first differing: {differs}")
    return finish()


if __name__ == "__main__":
    main()
