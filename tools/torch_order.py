#!/usr/bin/env python3
"""torch_order.py - does torch's CPU float32 arithmetic sum as torch_cpu.c and matmul_chain model it?

    /work/venv/bin/python tools/torch_order.py                 # measure on this machine: one line per rule
    /work/venv/bin/python tools/torch_order.py --record DIR    # write the cases test/test_torch_cpu.py checks

Needs torch (pip). Runs torch on one thread, as tools/golden_vl.py runs the official code. Each rule is
emulated here in numpy (a float32 fused multiply-add is exact in float64 before its one rounding, up to
a rare double rounding) and compared with torch's output value by value: "identical" is the share of the
same float32 bits. The rules (torch_cpu.h): nn.Linear = the bias, then blocks of k (torch_k_block) of fused
multiply-add chains, added in order; matmul the same, and under 400 multiply-adds torch's own loop;
x.pow(2).mean(-1) summed in SumKernel's 8-lane order; softmax and SiLU with SLEEF's expf_u10.
"""
import argparse
import os
import sys

import numpy as np

F, D = np.float32, np.float64


def k_block(k):
    return k if k <= 192 else (k + 1) // 2 if k <= 384 else 192


def chain(x, w, k0, k1):
    """x [m, k], w [n, k] -> [m, n]: one fused multiply-add chain over k0..k1-1 from 0."""
    acc = np.zeros((x.shape[0], w.shape[0]), F)
    for k in range(k0, k1):
        acc = (x[:, k:k + 1].astype(D) * w[:, k][None, :].astype(D) + acc).astype(F)
    return acc


def linear(x, w, b=None):
    k, block = x.shape[1], k_block(x.shape[1])
    y = np.broadcast_to(b, (x.shape[0], w.shape[0])).astype(F) if b is not None else None
    for k0 in range(0, k, block):
        part = chain(x, w, k0, min(k, k0 + block))
        y = part if y is None else (y.astype(D) + part).astype(F)
    return y


def matmul(a, b):
    """a [m, k] @ b [k, n] as torch's CPU matmul: under 400 multiply-adds its own loop (rounded products added
    in order), else as linear (MKL)."""
    m, k = a.shape
    if m * k * b.shape[1] >= 400:
        return linear(a, np.ascontiguousarray(b.T))
    y = np.zeros((m, b.shape[1]), F)
    for i in range(k):
        y = (y + (a[:, i:i + 1] * b[i][None, :]).astype(F)).astype(F)
    return y


def torch_sum(r):
    lanes, ilp = 8, 4
    n = len(r)
    vectors = n // lanes
    rows = vectors // ilp
    power = max(4, (int(np.ceil(np.log2(rows))) if rows > 1 else 0) // 4)
    step = 1 << power
    acc = np.zeros((4, ilp, lanes), F)
    v = r[:vectors * lanes].reshape(vectors, lanes)
    i = 0
    while i + step <= rows:
        for _ in range(step):
            acc[0] = (acc[0] + v[i * ilp:(i + 1) * ilp]).astype(F)
            i += 1
        for level in range(1, 4):
            acc[level] = (acc[level] + acc[level - 1]).astype(F)
            acc[level - 1] = 0
            if i & ((step - 1) << (level * power)):
                break
    while i < rows:
        acc[0] = (acc[0] + v[i * ilp:(i + 1) * ilp]).astype(F)
        i += 1
    for level in range(1, 4):
        acc[0] = (acc[0] + acc[level]).astype(F)
    part = acc[0]
    for j in range(rows * ilp, vectors):
        part[0] = (part[0] + v[j]).astype(F)
    for k in range(1, ilp):
        part[0] = (part[0] + part[k]).astype(F)
    s = F(0)
    for k in range(vectors * lanes, n):
        s = F(s + r[k])
    for x in part[0]:
        s = F(s + x)
    return s


def fma(a, b, c):
    return (np.asarray(a, D) * np.asarray(b, D) + np.asarray(c, D)).astype(F)


def sleef_expf(d):
    d = np.asarray(d, F)
    q = np.rint((d * F(1.4426950408889634)).astype(F))
    s = fma(q, F(-0.693145751953125), d)
    s = fma(q, F(-1.428606765330187045e-06), s)
    u = np.full_like(d, F(0.000198527617612853646278381))
    for c in (0.00139304355252534151077271, 0.00833336077630519866943359, 0.0416664853692054748535156,
              0.166666671633720397949219, 0.5):
        u = fma(u, s, F(c))
    u = (F(1) + fma((s * s).astype(F), u, s)).astype(F)
    e = q.astype(np.int64)
    half = e >> 1
    u = (u * np.ldexp(F(1), half).astype(F)).astype(F)
    u = (u * np.ldexp(F(1), e - half).astype(F)).astype(F)
    return np.where(d < -104, F(0), np.where(d > 100, F(np.inf), u)).astype(F)


def softmax(r):
    e = sleef_expf(r - r.max())
    if len(e) < 16:
        s = F(0)
        for x in e:
            s = F(s + x)
    else:
        lane = e[:16].copy()
        for j in range(16, len(e)):
            lane[j % 16] = F(lane[j % 16] + e[j])
        h = 8
        while h >= 1:
            lane[:h] = (lane[:h] + lane[h:2 * h]).astype(F)
            h //= 2
        s = lane[0]
    return (e * F(F(1) / s)).astype(F)


LINEAR = [(40, 40, 120), (10, 160, 16), (16, 200, 24), (16, 256, 32), (4, 1000, 12)]
MATMUL = [(4, 20, 4), (8, 6, 8), (16, 20, 16), (12, 80, 12), (16, 300, 20)]
ROWS = [(3, 40), (5, 56), (4, 160), (2, 1280), (2, 3420)]
SOFTMAX = [(4, 8), (4, 16), (4, 40), (2, 64), (2, 1024)]


def cases(torch):
    g = torch.Generator().manual_seed(4901)
    out = []
    for m, k, n in LINEAR:
        x, w, b = (torch.randn(*s, generator=g) for s in ((m, k), (n, k), (n,)))
        out.append(("linear", f"{m}x{k}x{n}", [x.numpy(), (w * 0.05).numpy(), b.numpy()],
                    torch.nn.functional.linear(x, w * 0.05, b).numpy(), lambda a: linear(*a)))
    for m, k, n in MATMUL:
        a, b = torch.randn(1, m, k, generator=g), torch.randn(1, n, k, generator=g).transpose(1, 2)
        out.append(("matmul", f"{m}x{k}x{n}", [a[0].numpy(), b[0].contiguous().numpy()], torch.matmul(a, b)[0].numpy(),
                    lambda a: matmul(*a)))
    for m, n in ROWS:
        x = torch.randn(m, n, generator=g)
        out.append(("sumsq", f"{m}x{n}", [x.numpy()], x.pow(2).mean(-1).numpy(),
                    lambda a: np.array([F(torch_sum((r * r).astype(F)) / F(r.size)) for r in a[0]])))
    for m, n in SOFTMAX:
        x = torch.randn(m, n, generator=g) * 3
        out.append(("softmax", f"{m}x{n}", [x.numpy()], torch.nn.functional.softmax(x, dim=-1).numpy(),
                    lambda a: np.stack([softmax(r) for r in a[0]])))
    x = torch.randn(4096, generator=g) * 6
    out.append(("silu", "4096", [x.numpy()], torch.nn.functional.silu(x).numpy(),
                lambda a: (a[0] / (F(1) + sleef_expf(-a[0]))).astype(F)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record", metavar="DIR", help="write each case's inputs and torch's output (.npy)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("torch_order.py: error: needs torch\n  hint: pip install torch (e.g. /work/venv/bin/python)")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, one thread")
    for kind, shape, inputs, want, model in cases(torch):
        got = model(inputs)
        same = float((got.astype(F) == want).mean())
        print(f"  {kind:8s} {shape:12s} identical {same:.4f}")
        if args.record:
            os.makedirs(args.record, exist_ok=True)
            for i, a in enumerate(inputs):
                np.save(os.path.join(args.record, f"{kind}_{shape}_in{i}.npy"), a.astype(F))
            np.save(os.path.join(args.record, f"{kind}_{shape}_torch.npy"), want.astype(F))


if __name__ == "__main__":
    main()
