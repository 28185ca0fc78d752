"""Row metrics of two tensors (numpy): relative L2 with floors, cosine, NMSE, max abs, top-k, log-sum-exp, KL.

Every tensor is seen as [rows, n] (one row per position). The sums are float64 over float32 data,
computed a block of rows at a time so that a 512 x 262272 logits tensor never has a float64 copy whole.
"""
import math

import numpy as np

CHUNK = 1 << 22     # values per block of float64 temporaries (32 MB)


def row_blocks(rows, n):
    """(start, end) of row blocks holding about CHUNK values each."""
    step = max(1, CHUNK // max(n, 1))
    for s in range(0, rows, step):
        yield s, min(rows, s + step)


def as_rows(data, rows):
    """A flat or shaped array as [rows, n] (a view, no copy)."""
    return data.reshape(rows, -1) if rows else data.reshape(0, 0)


def row_metrics(a, b):
    """Per row of two [rows, n] arrays: sum (a-b)^2, sum b^2, sum a^2, a.b, max |a-b| and its index in the row
    (float64 arrays; the index is int64). A row with a non-finite difference has max inf at its first
    non-finite value. a.b is (||a||^2 + ||b||^2 - ||a-b||^2) / 2, so identical rows have cosine exactly 1."""
    rows, n = b.shape
    sq_d, sq_b, sq_a = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    mx, mi = np.zeros(rows), np.zeros(rows, dtype=np.int64)
    if n == 0:
        return sq_d, sq_b, sq_a, sq_d.copy(), mx, mi
    for s, e in row_blocks(rows, n):
        x = a[s:e].astype(np.float64)
        y = b[s:e].astype(np.float64)
        d = x - y
        sq_d[s:e] = np.einsum("ij,ij->i", d, d)
        sq_b[s:e] = np.einsum("ij,ij->i", y, y)
        sq_a[s:e] = np.einsum("ij,ij->i", x, x)
        ad = np.abs(d, out=d)
        idx = ad.argmax(axis=1)
        mi[s:e] = idx
        mx[s:e] = ad[np.arange(e - s), idx]
        bad = ~np.isfinite(sq_d[s:e])
        for r in np.flatnonzero(bad):
            mi[s + r] = int(np.argmax(~np.isfinite(ad[r])))
            mx[s + r] = math.inf
    dot = (sq_a + sq_b - sq_d) / 2
    return sq_d, sq_b, sq_a, dot, mx, mi


def cosine(sq_a, sq_b, dot):
    """Cosine from the sums (scalars): 1 when both are zero, 0 when one is."""
    if sq_a == 0 and sq_b == 0:
        return 1.0
    if sq_a == 0 or sq_b == 0:
        return 0.0
    return dot / math.sqrt(sq_a * sq_b)


def cosines(sq_a, sq_b, dot):
    """cosine() of every row (arrays)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        c = dot / np.sqrt(sq_a * sq_b)
    c = np.where((sq_a == 0) | (sq_b == 0), 0.0, c)
    return np.where((sq_a == 0) & (sq_b == 0), 1.0, c)


def row_errors(sq_d, sq_b, floor):
    """||a_t - b_t|| / max(||b_t||, floor) per row (inf for a non-finite difference; 0/0 = 0)."""
    denom = np.maximum(np.sqrt(sq_b), floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.sqrt(sq_d) / denom
    err = np.where(denom > 0, err, np.where(sq_d == 0, 0.0, math.inf))
    return np.where(np.isfinite(sq_d), err, math.inf)


def fsum(x):
    """Sum of an array (math.fsum over float64: the order does not matter)."""
    return math.fsum(np.asarray(x, dtype=np.float64).tolist())


def unravel(flat, shape):
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return list(reversed(idx))


def topk_ids(row, k):
    """Ids of the k largest values of a 1-D row, descending (ties: lowest id first)."""
    k = min(k, row.shape[0])
    if k <= 0:
        return []
    threshold = np.partition(row, row.shape[0] - k)[row.shape[0] - k]
    ids = np.flatnonzero(row >= threshold)
    ids = ids[np.lexsort((ids, -row[ids].astype(np.float64)))]
    return ids[:k].tolist()


def log_sum_exp_rows(x):
    """log sum exp of each row of a [rows, V] float64 array."""
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


def logits_rows_stats(a, b, k=16):
    """Per row of two [T, V] logits: (top-k ids of a, of b, KL(P_b || P_a) >= 0), blocks of rows in float64."""
    T, V = b.shape
    ia, ib, kl = [], [], np.zeros(T)
    for s, e in row_blocks(T, V):
        x = a[s:e].astype(np.float64)
        y = b[s:e].astype(np.float64)
        for r in range(e - s):
            ia.append(topk_ids(x[r], k))
            ib.append(topk_ids(y[r], k))
        lse_a, lse_b = log_sum_exp_rows(x), log_sum_exp_rows(y)
        p = np.exp(y - lse_b[:, None])
        kl[s:e] = lse_a - lse_b - np.einsum("ij,ij->i", p, x - y)
    return ia, ib, np.maximum(kl, 0.0)


def rms(values):
    """Root mean square of the values that are not None (0 when none)."""
    v = [x for x in values if x is not None]
    return math.sqrt(math.fsum(x * x for x in v) / len(v)) if v else 0.0


def fmt(x, spec=".3g"):
    """A number for a report: '-' for None, 'inf'/'nan' as such."""
    if x is None:
        return "-"
    if isinstance(x, (float, np.floating)) and not math.isfinite(x):
        return str(float(x))
    if isinstance(x, np.generic):
        x = x.item()
    return format(x, spec)


_VOCAB_SAID = set()


def common_vocabulary(a, b, what="logits"):
    """Two [T, V] logits of different vocabulary widths (a GGUF keeps the tokenizer's rows, 262,147 for
    ZAYA1; the checkpoint has 262,272): both cut to the rows they share (ids 0 .. min - 1), said once per
    pair of widths. The rows past the shorter vocabulary are ids no tokenizer produces."""
    va, vb = a.shape[-1], b.shape[-1]
    if va == vb:
        return a, b
    n = min(va, vb)
    if (va, vb, what) not in _VOCAB_SAID:
        _VOCAB_SAID.add((va, vb, what))
        print(f"note: {what}: vocabularies of {va:,} and {vb:,} rows; comparing the {n:,} rows both have (ids 0..{n - 1}); "
              f"the other {abs(va - vb):,} rows of the wider one are left out")
    return a[..., :n], b[..., :n]
