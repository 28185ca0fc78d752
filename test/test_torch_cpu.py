#!/usr/bin/env python3
"""test_torch_cpu.py - torch_cpu.c and matmul_chain against torch's own outputs (test/fixtures/torch_cpu).

    make build/test_torch_cpu && python3 test/test_torch_cpu.py

The fixtures are tools/torch_order.py --record's cases: inputs and what torch 2.15 computed from them on one
thread of this project's x86 machine (AVX-512 dispatch): nn.Linear with a bias (k in one block, two halves,
blocks of 192), torch.matmul (under and over 400 multiply-adds), x.pow(2).mean(-1) (rows of 40 to 3420: the
cascade of torch.sum), softmax (rows shorter and longer than a 16-lane vector) and SiLU. Each must come out
with torch's bits, value for value.
"""
import os
import tempfile

import numpy as np

from harness import ROOT, check, finish, need_fixtures, run

FX = need_fixtures("torch_cpu")


def main():
    exe = os.path.join(ROOT, "build", "test_torch_cpu")
    if not check(os.path.exists(exe), "build/test_torch_cpu is built", "hint: make build/test_torch_cpu"):
        finish()
    cases = sorted(f[:-len("_torch.npy")] for f in os.listdir(FX) if f.endswith("_torch.npy"))
    check(len(cases) >= 20, f"{len(cases)} recorded cases",
          "hint: tools/torch_order.py --record test/fixtures/torch_cpu")
    for case in cases:
        kind, shape = case.split("_")
        inputs = [np.load(os.path.join(FX, f"{case}_in{i}.npy")) for i in range(3)
                  if os.path.exists(os.path.join(FX, f"{case}_in{i}.npy"))]
        want = np.load(os.path.join(FX, f"{case}_torch.npy")).ravel()
        dims = [int(d) for d in shape.split("x")]
        m, k, n = (dims + [1, 1])[:3] if kind in ("linear", "matmul") else (dims[0], dims[1], 1) if len(dims) == 2 \
            else (1, dims[0], 1)
        with tempfile.TemporaryDirectory() as tmp:
            for i, a in enumerate(inputs):
                a.astype("<f4").tofile(os.path.join(tmp, f"in{i}.f32"))
            rc, _, err = run([exe, kind, tmp, str(m), str(k), str(n)])
            if not check(rc == 0, f"{kind} {shape} runs", err.strip()[-300:]):
                continue
            got = np.fromfile(os.path.join(tmp, "out.f32"), dtype="<f4")
        if not check(got.size == want.size, f"{kind} {shape}: {want.size} values", f"got {got.size}"):
            continue
        bad = np.flatnonzero(got != want)
        check(bad.size == 0, f"{kind} {shape}: torch's bits in all {want.size} values",
              f"{bad.size} differ, the first at {bad[0] if bad.size else 0}: "
              f"{got[bad[0]] if bad.size else 0!r} vs torch's {want[bad[0]] if bad.size else 0!r} "
              "(hint: tools/torch_order.py says which rule torch follows here)")
    finish()


if __name__ == "__main__":
    main()
