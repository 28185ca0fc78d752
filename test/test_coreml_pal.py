#!/usr/bin/env python3
"""test_coreml_pal.py - tools/quants.py's Core ML palettization against coremltools' own, on groups that
coremltools hands to scikit-learn's KMeans (numpy only; no coremltools, no scikit-learn).

test/fixtures/coreml/palettized_small.safetensors (tools/coreml_fixtures.py --small; coremltools 9.0,
scikit-learn 1.9.1): each case is one linear weight palettized by coremltools' palettize_weights(kmeans, 4 bits,
per_grouped_channel, CASE.group channels per group), for scikit-learn's OpenMP thread counts 1 and 2. Per case
and thread count, quants.palettize_group on each group must give the same table (fp16 or fp32 bits, in
coremltools' order) and the same index of every weight: fp16 groups of 32, 200, 2,048, 9,999 values, ties, 11
distinct values for 16 entries, 99 % zeros, a constant group, the ZAYA1-8B router MLP's 256 x 256 (8,192 per
group), fp32 models (sklearn in float32, even at 10,240 values), and 10,000 fp16 values (kmeans1d's side of the
threshold). With 1 thread, other settings (metadata "modes"): kmeans with 2, 3, 6 and 8 bits, per_tensor,
"uniform" (4 and 8 bits) and "unique" (nbits chosen as coremltools does).
"""
import json
import os
import struct
import sys

import numpy as np

from harness import ROOT, check, finish, need_fixtures

sys.path.insert(0, os.path.join(ROOT, "tools"))
import quants  # noqa: E402

DTYPES = {"F16": np.float16, "F32": np.float32, "U8": np.uint8, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + a:8 + n + b], DTYPES[v["dtype"]]).reshape(v["shape"])
    return out, header.get("__metadata__", {})


def bits(a):
    return a.view(np.uint16 if a.dtype == np.float16 else np.uint32)


t, meta = read_safetensors(need_fixtures("coreml", "palettized_small.safetensors"))
versions = f"coremltools {meta.get('coremltools')}, scikit-learn {meta.get('scikit-learn')}"
cases = sorted(k[:-len(".weight")] for k in t if k.endswith(".weight"))
check(len(cases) >= 10, f"the recording holds the small-group cases ({versions})", f"{len(cases)} cases found")
modes = json.loads(meta.get("modes", "{}"))
threads_differ = 0
for case in cases:
    w, group = t[case + ".weight"], int(t[case + ".group"][0])
    cfg = modes.get(case, {"mode": "kmeans", "nbits": 4})
    mode, nbits = cfg["mode"], cfg["nbits"]
    if mode == "unique":
        nbits = quants.unique_nbits(w[g * group:(g + 1) * group] for g in range(w.shape[0] // group))
    path = "kmeans1d" if w.dtype == np.float16 and group * w.shape[1] >= quants.KMEANS1D_MIN else "scikit-learn"
    path = f"{mode}, {nbits} bits" + (f", {path}" if mode == "kmeans" else "")
    for T in (1, 2) if case not in modes else (1,):
        rec = f"{case}.t{T}" if f"{case}.t{T}.lut" in t else f"{case}.t1"   # no t2: the same as t1
        threads_differ += rec == f"{case}.t2"
        lut, idx = t[rec + ".lut"], t[rec + ".indices"]
        bad = []
        for g in range(w.shape[0] // group):
            rows = slice(g * group, (g + 1) * group)
            got_lut, got_idx = quants.palettize_group(w[rows], nbits, n_threads=T, mode=mode)
            got_idx = got_idx.reshape(group, -1)
            if not np.array_equal(bits(got_lut), bits(lut[g])) or not np.array_equal(got_idx, idx[rows]):
                e = np.flatnonzero(bits(got_lut) != bits(lut[g]))
                bad.append(f"group {g}: table entries {e.tolist()} want {lut[g][e].tolist()} got "
                           f"{got_lut[e].tolist()}, {int((got_idx != idx[rows]).sum())} indices differ")
        check(not bad, f"palettization equals coremltools' bit for bit: {case} ({w.dtype}, {group * w.shape[1]} "
              f"values per group, {path}, {T} thread{'s' if T > 1 else ''})",
              "; ".join(bad[:3]) + " (hint: quants.sklearn_kmeans must follow scikit-learn's KMeans step by step: "
              "k-means++ draws, Lloyd's chunked sums per thread, the stop rule; kmeans1d_weighted for >= 10,000)")
check(threads_differ > 0, "the recording shows scikit-learn's thread count changing a result (and both are matched)",
      "no case differs between 1 and 2 threads: the n_threads model is untested (re-record with threadpoolctl)")
finish()
