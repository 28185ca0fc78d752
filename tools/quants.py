#!/usr/bin/env python3
"""quants.py - fake quantization (quantize, then dequantize to float32) of weight matrices, in numpy.

    import quants
    w_q = quants.fake_quant(w, "Q4_K")      # w: float32 array [..., in]; same shape, float32

Types:
  Q8_0     ggml's quantize_row_q8_0_ref: blocks of 32 along the last axis, d = amax/127 stored fp16,
           q = roundf(x/d) in int8; value = fp16(d) * q.
  Q4_0     ggml's quantize_row_q4_0_ref: blocks of 32, d = max/-8 (max = the value of largest |x|)
           stored fp16, q = min(15, (int8)(x/d + 8.5)); value = (q - 8) * fp16(d).
  Q4_K     ggml's quantize_row_q4_K_ref (what llama-quantize runs without an imatrix): super-blocks of
           256 = 8 sub-blocks of 32; each sub-block's scale and min from make_qkx2_quants (weights
           av_x + |x|, rmin -1, rdelta 0.1, 20 steps), quantized to 6 bits against the super-block's
           fp16 d and dmin; q = nearest_int((x + dmin*m) / (d*sc)) in 0..15; value = d*sc*q - dmin*m.
  INT4-pal the Core ML port's palettization, coremltools OpPalettizerConfig(mode="kmeans", nbits=4,
           granularity="per_grouped_channel", group_size=32) on an fp16 model: each group of 32 OUTPUT
           channels (axis 0 of a [out, in] weight; a [E, out, in] expert tensor is E linear layers) shares
           one look-up table of 16 fp16 values; as coremltools computes it (optimize/coreml/
           _quantization_passes.py -> models/neural_network/quantization_utils.py
           _get_kmeans_lookup_table_and_weight), bit for bit for every group (palettize_group):
           - an fp16 group of >= 10,000 values: its distinct values weighted by their counts, clustered by
             kmeans1d (coremltools' own copy, deps/kmeans1d: the optimal 1-D k-means by Gronlund et al.'s
             dynamic programming); kmeans1d_weighted() is that algorithm step by step in float64;
           - any other group (smaller: ZAYA1-8B's router MLP 256 x 256 and CCA conv_qk_grouped [1280, 128, 2],
             8,192 values, conv_qk_depthwise [1280, 1, 2], 64; or an fp32 model's): scikit-learn's
             KMeans(k-means++, n_init=1, tol=1e-2, random_state=0) on the values (fp16 -> float64);
             sklearn_kmeans() is scikit-learn 1.9.1's algorithm step by step, including its OpenMP thread
             count's summation order (n_threads; 1 and 2 threads checked).
           The table = the centers cast to the weight's dtype, each weight = its cluster's entry. Checked
           on groups palettized by coremltools 9.0 itself (tools/coreml_fixtures.py;
           test/test_quant_sensitivity.py, test/test_coreml_pal.py). int4_pal(nbits=, group=) gives the
           other bit widths and per_tensor (group = out channels) of the same kmeans mode.

The ggml types follow ggml/src/ggml-quants.c step by step in float32 (sums accumulated in the C
loop's order, fp16 by round-to-nearest-even, nearest_int = round half to even, roundf = half away from
zero). Their block axis is the last axis: the input dimension of an HF weight [out, in], which is
ggml's ne0. A last axis that is not a multiple of the block (32, or 256 for Q4_K) cannot be stored in
that type; fake_quant raises NotQuantizable (llama.cpp falls back to another type for such tensors).
Checked against values ggml computed: test/test_quant_sensitivity.py (rows of test/fixtures/gguf/).

int4_pal(..., method="lloyd") is the former approximation (12 Lloyd iterations from quantiles, float32 table;
weight MSE 1.25x-2.6x the optimum, tools/check_int4_pal.py).
"""

import numpy as np

TYPES = ("Q8_0", "Q4_0", "Q4_K", "INT4-pal")
BLOCK = {"Q8_0": 32, "Q4_0": 32, "Q4_K": 256}
PAL_GROUP = 32
KMEANS_ITERS = 12


class NotQuantizable(ValueError):
    pass


def _f16(x):
    """fp32 -> fp16 (round to nearest even, as GGML_FP32_TO_FP16) -> fp32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _roundf(x):
    """C roundf: halfway cases away from zero (np.round rounds them to even)."""
    t = np.trunc(x)
    frac = x - t                                   # exact in float32
    return t + np.where(np.abs(frac) >= 0.5, np.sign(x), 0).astype(np.float32)


def _nearest_int(x):
    """ggml's nearest_int (adds 1.5 * 2^23): round half to even, for |x| < 2^22."""
    return np.rint(x)


def _seqsum(a):
    """Sum over the last axis in the C loop's order (float32, left to right): a [N, n] -> [N]."""
    a = np.ascontiguousarray(np.moveaxis(a, -1, 0))
    acc = a[0].copy()
    for i in range(1, a.shape[0]):
        acc += a[i]
    return acc


def q8_0(x, block=32):
    b = x.reshape(-1, block)
    amax = np.max(np.abs(b), axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = _roundf(b * idv[:, None])
    return (q * _f16(d)[:, None]).astype(np.float32).reshape(x.shape)


def q4_0(x, block=32):
    b = x.reshape(-1, block)
    i = np.argmax(np.abs(b), axis=1)               # first of equal |x|, as the C loop's strict '<'
    mx = b[np.arange(b.shape[0]), i]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv[:, None] + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v).astype(np.int32))   # (int8_t) truncates; v >= 0.5 here
    return ((q - 8).astype(np.float32) * _f16(d)[:, None]).astype(np.float32).reshape(x.shape)


def _make_qkx2_quants(x, w, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20):
    """make_qkx2_quants over N sub-blocks at once: x, w [N, n] float32 -> (scale [N], the_min [N])."""
    f = np.float32
    xt = np.ascontiguousarray(x.T)                 # [n, N]: the C loop runs over the rows of xt
    wt = np.ascontiguousarray(w.T)
    mn = xt.min(axis=0)
    mx = xt.max(axis=0)
    sum_w = wt[0].copy()
    sum_x = sum_w * xt[0]
    for i in range(1, xt.shape[0]):
        sum_w += wt[i]
        sum_x += wt[i] * xt[i]
    mn = np.minimum(mn, f(0))
    flat = mx == mn
    rng = np.where(flat, f(1), mx - mn).astype(f)
    iscale = (f(nmax) / rng).astype(f)
    scale = (f(1) / iscale).astype(f)
    L = np.clip(_nearest_int(iscale * (xt - mn)), 0, nmax).astype(f)
    best = np.zeros_like(sum_w)
    for i in range(xt.shape[0]):
        diff = scale * L[i] + mn - xt[i]
        best += wt[i] * (diff * diff)
    for s in range(nstep + 1):
        # as the C loop: min is the best step's so far, in both max - min and x - min
        rng = np.where(flat, f(1), mx - mn).astype(f)
        isc = ((f(rmin) + f(rdelta) * f(s) + f(nmax)) / rng).astype(f)
        La = np.clip(_nearest_int(isc * (xt - mn)), 0, nmax).astype(f)
        sum_l = np.zeros_like(sum_w); sum_l2 = np.zeros_like(sum_w); sum_xl = np.zeros_like(sum_w)
        for i in range(xt.shape[0]):
            wl = wt[i] * La[i]
            sum_l += wl
            sum_l2 += wl * La[i]
            sum_xl += wl * xt[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, f(1))
        ts = ((sum_w * sum_xl - sum_x * sum_l) / Ds).astype(f)
        tm = ((sum_l2 * sum_x - sum_l * sum_xl) / Ds).astype(f)
        pos = tm > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ts = np.where(pos, sum_xl / sum_l2, ts).astype(f)
        tm = np.where(pos, f(0), tm).astype(f)
        cur = np.zeros_like(sum_w)
        for i in range(xt.shape[0]):
            diff = ts * La[i] + tm - xt[i]
            cur += wt[i] * (diff * diff)
        better = ok & (cur < best) & ~flat
        best = np.where(better, cur, best)
        scale = np.where(better, ts, scale)
        mn = np.where(better, tm, mn)
    scale = np.where(flat, f(0), scale).astype(f)
    return scale, (-mn).astype(f)


def q4_k(x):
    f = np.float32
    sb = x.reshape(-1, 8, 32)                      # super-blocks of 256 = 8 sub-blocks of 32
    sub = sb.reshape(-1, 32)
    sum_x2 = _seqsum(sub * sub)
    av_x = np.sqrt((sum_x2 / f(32)).astype(f)).astype(f)
    w = (av_x[:, None] + np.abs(sub)).astype(f)
    scales, mins = _make_qkx2_quants(sub, w)
    scales = scales.reshape(-1, 8)
    mins = mins.reshape(-1, 8)
    max_scale = np.maximum(scales.max(axis=1), f(0))
    max_min = np.maximum(mins.max(axis=1), f(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f(63) / max_scale, f(0)).astype(f)
        inv_min = np.where(max_min > 0, f(63) / max_min, f(0)).astype(f)
    ls = np.minimum(63, _nearest_int(inv_scale[:, None] * scales).astype(np.int64) & 0xFF)
    lm = np.minimum(63, _nearest_int(inv_min[:, None] * mins).astype(np.int64) & 0xFF)
    d = _f16(max_scale / f(63))
    dmin = _f16(max_min / f(63))
    dj = (d[:, None] * ls.astype(f)).astype(f)       # [S, 8]
    dmj = (dmin[:, None] * lm.astype(f)).astype(f)
    with np.errstate(divide="ignore", invalid="ignore"):
        l = _nearest_int((sb + dmj[:, :, None]) / dj[:, :, None])
    l = np.clip(np.nan_to_num(l), 0, 15).astype(f)
    out = (dj[:, :, None] * l - dmj[:, :, None]).astype(f)   # d = 0: d*q = 0, value -dmin*m as ggml
    return out.reshape(x.shape)


def _kmeans_1d(v, k=16, iters=KMEANS_ITERS):
    """Lloyd's k-means on the rows of v [G, n] (float64), deterministic quantile start -> centers [G, k]."""
    s = np.sort(v, axis=1)
    n = v.shape[1]
    c = s[:, ((2 * np.arange(k) + 1) * n) // (2 * k)].astype(np.float64)
    for _ in range(iters):
        c = np.sort(c, axis=1)
        mids = (c[:, 1:] + c[:, :-1]) / 2
        # assignment on sorted values: counts of values below each midpoint -> segment sums by cumsum
        cs = np.concatenate([np.zeros((v.shape[0], 1)), np.cumsum(s, axis=1)], axis=1)
        idx = np.stack([np.searchsorted(s[g], mids[g], side="right") for g in range(v.shape[0])])
        lo = np.concatenate([np.zeros((v.shape[0], 1), np.int64), idx], axis=1)
        hi = np.concatenate([idx, np.full((v.shape[0], 1), n, np.int64)], axis=1)
        cnt = hi - lo
        sums = np.take_along_axis(cs, hi, 1) - np.take_along_axis(cs, lo, 1)
        c = np.where(cnt > 0, sums / np.maximum(cnt, 1), c)   # an empty cluster keeps its center
    return np.sort(c, axis=1)


def _cost(cw, cs, cs2, j, i):
    """kmeans1d's WeightedCostCalculator.calc(j, i): the weighted squared error of sorted values j..i about
    their mean, in its order of float64 operations (j <= i; arrays)."""
    w = cw[i + 1] - cw[j]
    s = cs[i + 1] - cs[j]
    mu = s / w
    r = cs2[i + 1] - cs2[j]
    r = r + w * (mu * mu)
    return r - (2 * mu) * s


def kmeans1d_weighted(values, weights, k=16):
    """coremltools' kmeans1d.cluster(values, k, weights=weights) for distinct ascending values (np.unique):
    -> (cluster of each value, centroids [min(k, n)]), bit for bit. Its dynamic programme (Gronlund et al.
    2017, section 2.2): D[0][i] = cost(0, i); D[m][i] = min over j of C(i, j), C(i, j) = D[m-1][col] +
    cost(j, i) with col = j - 1, or i where j = 0 or j > i + 1 (its unsigned j - 1), cost 0 where j > i.
    kmeans1d finds each row's leftmost arg-min with SMAWK; here divide and conquer over the rows (the
    arg-min is monotone), one vectorized step per level, gives the same arg-mins."""
    x = np.asarray(values, np.float64)
    wt = np.asarray(weights, np.float64)
    n = len(x)
    k = min(k, n)
    cw = np.concatenate([[0.0], np.cumsum(wt)])            # sequential sums, as its prefix-sum loop
    cs = np.concatenate([[0.0], np.cumsum(wt * x)])
    cs2 = np.concatenate([[0.0], np.cumsum(wt * x * x)])
    D = _cost(cw, cs, cs2, np.zeros(n, np.int64), np.arange(n))
    T = [np.zeros(n, np.int64)]
    for _ in range(1, k):
        arg, best = np.zeros(n, np.int64), np.zeros(n)
        lo, hi = np.array([0]), np.array([n - 1])           # rows lo..hi search columns clo..chi
        clo, chi = np.array([0]), np.array([n - 1])
        while len(lo):
            mid = (lo + hi) // 2
            cnt = chi - clo + 1
            seg = np.concatenate([[0], np.cumsum(cnt)[:-1]])
            row = np.repeat(np.arange(len(mid)), cnt)           # each candidate's row (ascending)
            r = mid[row]
            c = np.arange(len(row)) - seg[row] + clo[row]
            col = np.where((c == 0) | (c >= r + 2), r, c - 1)
            inside = c <= r
            val = D[col] + np.where(inside, _cost(cw, cs, cs2, np.where(inside, c, r), r), 0.0)
            mins = np.minimum.reduceat(val, seg)
            hit = np.flatnonzero(val == mins[row])              # every row has one; the leftmost per row:
            first = hit[np.searchsorted(row[hit], np.arange(len(mid)))]
            a = c[first]
            arg[mid], best[mid] = a, mins
            left, right = lo <= mid - 1, mid + 1 <= hi
            lo, hi, clo, chi = (np.concatenate([lo[left], mid[right] + 1]), np.concatenate([mid[left] - 1, hi[right]]),
                                np.concatenate([clo[left], a[right]]), np.concatenate([a[left], chi[right]]))
        D = best
        T.append(arg)
    clusters, centroids = np.zeros(n, np.int64), np.zeros(k)
    t, m, last = n, k - 1, n - 1                              # backtracking, as kmeans1d
    while True:
        t_, t = t, int(T[m][last])
        c = 0.0
        for i in range(t, t_):                                # its incremental weighted mean
            c += (x[i] - c) * (cw[i + 1] - cw[i]) / (cw[i + 1] - cw[t])
        clusters[t:t_] = m
        centroids[m] = c
        m, last = m - 1, t - 1
        if t <= 0:
            break
    return clusters, centroids


KMEANS1D_MIN = 10_000      # coremltools: kmeans1d for an fp16 group of at least this many values
SKLEARN_CHUNK = 256        # sklearn.cluster._k_means_common.CHUNK_SIZE: samples per Lloyd chunk


def _sk_sqdist(A, X, xsq, dt):
    """sklearn's _euclidean_distances(A, X, Y_norm_squared=xsq, squared=True) for one-feature rows: float64 as
    -2 * A.X^T + |a|^2 + |x|^2 in that order; float32 data upcast to float64 (norms recomputed), rounded back."""
    if dt == np.float32:
        A, X = A.astype(np.float64), X.astype(np.float64)
        xsq = np.einsum("ij,ij->i", X, X)
    d = -2 * (A @ X.T)
    d += np.einsum("ij,ij->i", A, A)[:, None]
    d += xsq[None, :]
    d = d.astype(dt, copy=False)
    np.maximum(d, 0, out=d)
    return d


def _sk_labels(X, centers):
    """lloyd's E step (_update_chunk_dense): argmin over j of |c_j|^2 + (-2 x c_j) (the gemm with beta 1),
    the first of equal distances."""
    c2 = np.einsum("ij,ij->i", centers, centers)
    return np.argmin(c2[None, :] + (-2 * (X @ centers.T)), axis=1).astype(np.int32)


def _sk_cluster_sums(labels, x, k, dt, n_threads):
    """lloyd_iter_chunked_dense's M-step sums: chunks of 256 samples, OpenMP's static split of the chunks over
    n_threads threads (the first n_chunks % T threads take one more), each thread summing its samples in
    order into its own buffer, the buffers added to zero in thread order (for T >= 3 sklearn adds them in
    the order the threads finish: not deterministic; T = 1 or 2 is)."""
    n = len(x)
    chunk = SKLEARN_CHUNK if n > SKLEARN_CHUNK else n
    n_chunks = -(-n // chunk)
    T = min(n_threads, n_chunks)
    q, r = divmod(n_chunks, T)
    sums, weights = np.zeros(k, dt), np.zeros(k, dt)
    c0 = 0
    for t in range(T):
        c1 = c0 + q + (t < r)
        a, b = c0 * chunk, min(c1 * chunk, n)
        if dt == np.float64:                       # bincount adds in order, in float64
            part = np.bincount(labels[a:b], weights=x[a:b], minlength=k)
        else:                                      # ufunc.at adds in order, in the array's float32
            part = np.zeros(k, dt)
            np.add.at(part, labels[a:b], x[a:b])
        sums += part
        weights += np.bincount(labels[a:b], minlength=k).astype(dt)
        c0 = c1
    return sums, weights


def sklearn_kmeans(values, k=16, n_threads=1, seed=0, tol=1e-2, max_iter=300):
    """scikit-learn's KMeans(k, init="k-means++", n_init=1, tol=1e-2, random_state=0).fit(values[:, None])
    as coremltools calls it (models/neural_network/quantization_utils.py, _get_kmeans_lookup_table_and_weight)
    -> (cluster_centers_[:, 0], labels_), bit for bit: read from scikit-learn 1.9.1 (sklearn/cluster/_kmeans.py,
    _k_means_lloyd.pyx, _k_means_common.pyx) and checked against it, 1 and 2 threads (docs/quantization.md).

    values: 1-D; float16 is converted to float64 (KMeans' validate_data, dtype=[float64, float32]), float32
    stays float32 (an fp32 model: every sum and distance in float32, k-means++ distances via float64).
    n_threads: sklearn's OpenMP threads (_openmp_effective_n_threads(): the machine's cores, or
    OMP_NUM_THREADS); it changes the M step's summation order, hence last bits of the centers.
    Steps: tol scaled by the mean variance; the data centred on its mean; k-means++ (the first center by
    RandomState(seed).choice with the weights, then 2 + int(log k) candidates per center drawn by uniform *
    potential, searchsorted in the cumulative distances, the candidate with the smallest potential kept);
    Lloyd: E step, M step sums (_sk_cluster_sums), empty clusters relocated to the farthest points, each center
    sum times 1 / weight (an empty one copies the largest cluster's entry as it stands at that moment), stop
    on unchanged labels or a squared center shift <= tol, then a last E step unless the labels were unchanged;
    the mean added back to the centers."""
    X = np.asarray(values)
    dt = np.float32 if X.dtype == np.float32 else np.float64
    X = X.astype(dt).reshape(-1, 1)                # a copy (copy_x)
    n = X.shape[0]
    if n < k:
        raise ValueError(f"{n} values for {k} clusters (sklearn: n_samples should be >= n_clusters)")
    tol = np.mean(np.var(X, axis=0)) * dt(tol)
    mean = X.mean(axis=0)
    X -= mean
    xsq = np.einsum("ij,ij->i", X, X)
    sw = np.ones(n, dt)
    rs = np.random.RandomState(seed)
    # k-means++ (_kmeans_plusplus)
    trials = 2 + int(np.log(k))
    centers = np.empty((k, 1), dt)
    centers[0] = X[rs.choice(n, p=sw / sw.sum())]
    closest = _sk_sqdist(centers[:1], X, xsq, dt)
    pot = closest @ sw
    for c in range(1, k):
        ids = np.searchsorted(np.cumsum(sw * closest), rs.uniform(size=trials) * pot)
        np.clip(ids, None, closest.size - 1, out=ids)
        d = _sk_sqdist(X[ids], X, xsq, dt)
        np.minimum(closest, d, out=d)
        cand = d @ sw.reshape(-1, 1)
        best = np.argmin(cand)
        pot, closest = cand[best], d[best]
        centers[c] = X[ids[best]]
    # Lloyd (_kmeans_single_lloyd)
    x = X[:, 0]
    old = np.full(n, -1, np.int32)
    converged = False
    for _ in range(max_iter):
        labels = _sk_labels(X, centers)
        sums, weights = _sk_cluster_sums(labels, x, k, dt, n_threads)
        empty = np.flatnonzero(weights == 0)
        if len(empty):                             # _relocate_empty_clusters_dense
            dist = ((X - centers[labels]) ** 2).sum(axis=1)
            far = np.argpartition(dist, -len(empty))[:-len(empty) - 1:-1]
            if np.max(dist) != 0:
                for e, f in zip(empty, far):
                    sums[labels[f]] -= x[f] * sw[f]
                    sums[e] = x[f] * sw[f]
                    weights[e] = sw[f]
                    weights[labels[f]] -= sw[f]
        biggest = np.argmax(weights)               # _average_centers, in place and in order
        for j in range(k):
            if weights[j] > 0:
                sums[j] *= dt(1.0) / weights[j]
            else:
                sums[j] = sums[biggest]
        shift = np.sqrt((sums - centers[:, 0]) * (sums - centers[:, 0]))
        centers = sums.reshape(-1, 1)
        if np.array_equal(labels, old):
            converged = True
            break
        if (shift ** 2).sum() <= tol:
            break
        old[:] = labels
    if not converged:
        labels = _sk_labels(X, centers)
    centers += mean
    return centers[:, 0], labels


PAL_NBITS = (1, 2, 3, 4, 6, 8)   # coremltools' palettize_weights._SUPPORTED_NBITS


def palettize_group(g, nbits=4, n_threads=1, mode="kmeans"):
    """One group as coremltools' palettization computes it -> (table [2**nbits] in g's dtype, index per
    weight). The weight's dtype is the model's: float16 (an fp16 model) or float32.
    mode "kmeans": an fp16 group of >= 10,000 values: kmeans1d over its distinct values weighted by their
      counts (kmeans1d_weighted); any other group (smaller, or an fp32 model's): scikit-learn's KMeans
      (sklearn_kmeans, min(size, 2**nbits) clusters). The table: the centers in float64, zeros after them,
      cast to the weight's dtype.
    mode "uniform" (compress_uniform): 2**nbits evenly spaced entries min + i * (max - min) / (2**nbits - 1)
      (the step in the weight's dtype, the entries in float64, then cast), index round((w - min) / (max - min)
      * (2**nbits - 1)) in the weight's dtype, half to even. A constant group is refused (coremltools divides
      by zero there).
    mode "unique" (compress_unique): the sorted distinct values, zeros after them; nbits must hold them all."""
    g = np.asarray(g)
    dt = np.float32 if g.dtype == np.float32 else np.float16
    g = g.astype(dt).ravel()
    if not np.isfinite(g).all():
        bad = np.flatnonzero(~np.isfinite(g))
        raise NotQuantizable(f"{len(bad)} non-finite values in the group (first {g[bad[0]]} at {bad[0]}); "
                             "not palettized (scikit-learn, coremltools' k-means for small groups, refuses them)")
    if mode == "uniform":
        lo, hi = np.amin(g), np.amax(g)
        if lo == hi:
            raise NotQuantizable("uniform palettization of a constant group (coremltools divides by zero)")
        levels = (1 << nbits) - 1
        step = (hi - lo) / dt(levels)
        idx = np.round(((g - lo) / (hi - lo)) * dt(levels)).astype(np.uint8)
        lut = np.arange(1 << nbits, dtype=np.int64) * step + lo          # int64 * scalar: float64
        return lut.astype(dt), idx
    lut = np.zeros(1 << nbits)
    if mode == "unique":
        values, idx = np.unique(g, return_inverse=True)
        if len(values) > 1 << nbits:
            raise NotQuantizable(f"{len(values)} distinct values do not fit {nbits} bits")
        lut[:len(values)] = values
        return lut.astype(dt), idx.ravel()
    if mode != "kmeans":
        raise ValueError(f"unknown palettization mode {mode!r} (kmeans, uniform, unique)")
    if dt == np.float16 and g.size >= KMEANS1D_MIN:
        values, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
        clusters, centroids = kmeans1d_weighted(values, counts, 1 << nbits)
        lut[:len(centroids)] = centroids
        return lut.astype(dt), clusters[inverse.ravel()]
    centers, labels = sklearn_kmeans(g, min(g.size, 1 << nbits), n_threads=n_threads)
    lut[:len(centers)] = centers
    return lut.astype(dt), labels


def unique_nbits(groups):
    """coremltools' nbits for mode "unique": the smallest of PAL_NBITS that holds every group's distinct
    values (the largest over the op's groups)."""
    need = max(len(np.unique(np.asarray(g))) for g in groups)
    for b in PAL_NBITS:
        if need <= 1 << b:
            return b
    raise NotQuantizable(f"{need} distinct values: more than 8 bits (coremltools skips the op)")


def int4_pal(x, group=PAL_GROUP, lut_dtype="float16", method="coremltools", nbits=4, n_threads=1, mode="kmeans"):
    """x [..., out, in] -> its palettization (float32 values), groups of `group` output channels (group = out:
    coremltools' per_tensor). method "coremltools": palettize_group on each group (mode kmeans, uniform or
    unique; for unique nbits is coremltools' choice, unique_nbits), the weight in lut_dtype (float16: an fp16
    model; float32: an fp32 one); n_threads: sklearn's threads on the machine that ran coremltools (kmeans,
    small groups only). method "lloyd": the former approximation (kmeans, nbits 4 only)."""
    if x.ndim < 2:
        raise NotQuantizable("palettization needs a matrix")
    m = x.reshape(-1, x.shape[-2], x.shape[-1])    # [E, out, in]
    E, out, inn = m.shape
    if out % group:
        raise NotQuantizable(f"{out} output channels are not a multiple of the group size {group}")
    g = m.reshape(E * out // group, group * inn)
    res = np.empty(g.shape, np.float32)
    if method == "coremltools":
        per_op = g.shape[0] // E                   # groups per linear layer (one op each)
        for i in range(g.shape[0]):
            if mode == "unique" and i % per_op == 0:
                nbits = unique_nbits(g[i:i + per_op].astype(lut_dtype))
            with np.errstate(over="ignore"):                # |w| > 65504 -> inf: refused below
                gi = g[i].astype(lut_dtype)
            lut, idx = palettize_group(gi, nbits, n_threads, mode)
            res[i] = lut[idx]
        return res.reshape(x.shape)
    if method != "lloyd" or nbits != 4 or mode != "kmeans":
        raise ValueError(f"int4_pal: unknown method {method!r} (coremltools, or lloyd with kmeans and nbits 4)")
    step = max(1, (1 << 22) // g.shape[1])         # groups per k-means batch (bounded memory)
    for a in range(0, g.shape[0], step):
        lut = _kmeans_1d(g[a:a + step].astype(np.float64)).astype(np.float32)
        if lut_dtype == "float16":
            lut = _f16(lut)
        mids = (lut[:, 1:].astype(np.float64) + lut[:, :-1]) / 2
        for i in range(lut.shape[0]):              # nearest entry; a tie goes to the lower entry
            res[a + i] = lut[i][np.searchsorted(mids[i], g[a + i], side="left")]
    return res.reshape(x.shape)


def fake_quant(w, qtype, rows_per_chunk=4096, block=None):
    """w (any float array, last axis = the block axis) -> float32 of the same shape, quantized and
    dequantized in qtype. Raises NotQuantizable when the shape does not allow the type. block: another
    block length for Q8_0 / Q4_0 (ggml has only 32; tests use shorter ones on rows narrower than 32)."""
    w = np.asarray(w, np.float32)
    if qtype == "INT4-pal":
        return int4_pal(w)
    if qtype not in BLOCK:
        raise ValueError(f"unknown type {qtype!r}; known: {', '.join(TYPES)}")
    if block is not None and qtype not in ("Q8_0", "Q4_0"):
        raise ValueError(f"{qtype} has a fixed block of {BLOCK[qtype]}")
    blk = block or BLOCK[qtype]
    if w.ndim < 1 or w.shape[-1] % blk:
        raise NotQuantizable(f"last axis {w.shape[-1] if w.ndim else 0} is not a multiple of {qtype}'s block of {blk}")
    fn = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_K": q4_k}[qtype]
    if block is not None:
        fn = (lambda f: lambda r: f(r, blk))(fn)
    rows = w.reshape(-1, w.shape[-1])
    out = np.empty_like(rows)
    for a in range(0, rows.shape[0], rows_per_chunk):
        out[a:a + rows_per_chunk] = fn(rows[a:a + rows_per_chunk])
    return out.reshape(w.shape)
