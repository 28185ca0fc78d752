#!/usr/bin/env python3
"""How far a Lloyd k-means (tools/quants.py's int4_pal(method="lloyd"), its former INT4-pal) and, for groups under
10,000 values, scikit-learn's k-means++ (what coremltools runs there) are from the optimal 1-D k-means.
INT4-pal itself is coremltools' result bit for bit (quants.palettize_group: kmeans1d_weighted or
sklearn_kmeans; test/test_quant_sensitivity.py and test/test_coreml_pal.py against tools/coreml_fixtures.py).

coremltools (apple/coremltools, coremltools/optimize/coreml/_quantization_passes.py,
_get_kmeans_lookup_table_and_weight) palettizes a group of an fp16 weight holding >= 10,000 values with
kmeans1d: the OPTIMAL 1-D k-means over the group's unique values weighted by their counts; other groups with
scikit-learn's KMeans (k-means++, n_init=1, tol=1e-2, random_state=0). With per_grouped_channel, group_size=32
every group of 32 output channels is 32 x in values: >= 10,000 for in >= 313 (every ZAYA1-8B matrix but the
router MLP's 256 x 256 and the CCA convolutions' [1280, 128, 2] and [1280, 1, 2]). This tool computes the
optimum exactly (dynamic programming, divide and conquer over the monotone split point) and prints the weight
MSE of the Lloyd k-means for a few iteration counts, and of scikit-learn's k-means++ when 32 x in < 10,000 (e.g.
--in 256), against it, on fp16 groups.

    /usr/bin/python3 tools/check_int4_pal.py [--in 2048] [--seed 0]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quants  # noqa: E402


def optimal_kmeans1d(x, k=16):
    """Exact k-means of the 1-D values x (weighted unique values) -> (sorted centers, mean squared error)."""
    vals, cnt = np.unique(np.asarray(x, np.float64), return_counts=True)
    n = len(vals)
    w = cnt.astype(np.float64)
    W = np.concatenate([[0.0], np.cumsum(w)])
    S = np.concatenate([[0.0], np.cumsum(w * vals)])
    Q = np.concatenate([[0.0], np.cumsum(w * vals * vals)])

    def cost(i, j):  # sum of squared deviations of segment [i, j) from its mean; i an array
        ww = W[j] - W[i]
        ss = S[j] - S[i]
        return (Q[j] - Q[i]) - np.where(ww > 0, ss * ss / np.maximum(ww, 1e-300), 0.0)

    prev = Q - np.where(W > 0, S * S / np.maximum(W, 1e-300), 0.0)   # one cluster over [0, j)
    splits = []
    for _ in range(min(k, n) - 1):
        cur = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, np.int64)
        cur[0] = 0.0
        stack = [(1, n, 0, n)]
        while stack:
            lo, hi, olo, ohi = stack.pop()
            if lo > hi:
                continue
            mid = (lo + hi) // 2
            ii = np.arange(olo, min(mid, ohi) + 1)
            c = prev[ii] + cost(ii, mid)
            b = int(np.argmin(c))
            cur[mid], arg[mid] = c[b], ii[b]
            stack.append((lo, mid - 1, olo, arg[mid]))
            stack.append((mid + 1, hi, arg[mid], ohi))
        splits.append(arg)
        prev = cur
    bounds, j = [n], n
    for arg in reversed(splits):
        j = int(arg[j])
        bounds.append(j)
    bounds.append(0)
    bounds = bounds[::-1]
    centers = [(S[b] - S[a]) / (W[b] - W[a]) for a, b in zip(bounds[:-1], bounds[1:]) if W[b] > W[a]]
    return np.array(centers), prev[n] / W[n]


def mse_with_lut(x, lut):
    lut = np.sort(lut)
    q = lut[np.searchsorted((lut[1:] + lut[:-1]) / 2, x)]
    return float(np.mean((x - q) ** 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--in", dest="inn", type=int, default=2048, help="input channels of the group (default 2048)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n = quants.PAL_GROUP * a.inn
    cases = [("normal", rng.standard_normal(n) * 0.02), ("student-t(3)", rng.standard_t(3, n) * 0.02)]
    print(f"| group (fp16, {quants.PAL_GROUP} x {a.inn}) | Lloyd iterations | MSE / optimal MSE |")
    print("| --- | --- | --- |")
    for name, g in cases:
        g = g.astype(np.float16).astype(np.float64)
        t = time.time()
        centers, best = optimal_kmeans1d(g)
        dt = time.time() - t
        assert abs(mse_with_lut(g, centers) - best) <= 1e-9 * best + 1e-30, "DP's centers do not give its MSE"
        for it in (quants.KMEANS_ITERS, 50, 300):
            ratio = mse_with_lut(g, quants._kmeans_1d(g[None, :], iters=it)[0]) / best
            print(f"| {name} | {it} | {ratio:.4f} |")
        if len(g) < quants.KMEANS1D_MIN:
            lut, idx = quants.palettize_group(g.astype(np.float16))
            ratio = float(np.mean((lut[idx].astype(np.float64) - g) ** 2)) / best
            print(f"| {name} | scikit-learn k-means++ (coremltools' choice here), fp16 table | {ratio:.4f} |")
        print(f"| {name} | optimal (kmeans1d, {dt:.1f} s) | 1 (relative MSE {best / np.mean(g * g):.3e}) |")


if __name__ == "__main__":
    main()
