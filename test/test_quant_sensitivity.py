#!/usr/bin/env python3
"""test_quant_sensitivity.py - tools/quants.py against values ggml computed, and tools/quant_sensitivity.py
end to end on a small generated checkpoint (numpy; no llama.cpp needed).

- ggml's rows: test/fixtures/gguf/F32.f32 (6 rows x 256, the source values) and <TYPE>.f32 (ggml's
  ggml_quantize_chunk + to_float of them, recorded by the gguf branch's tools/gguf_fixtures.c): our
  Q8_0, Q4_0, Q4_K fake quantization must give the same float32 bits.
- Q8_0's round trip: |x - value| <= d/2 + 127 |d - fp16(d)| per value (d = amax/127).
- INT4-pal: every group of 32 output channels holds at most 16 values, each weight its group's nearest (up to
  the fp16 rounding of the table); and equal, bit for bit, to coremltools 9.0's own palettize_weights (kmeans,
  4 bits, per_grouped_channel, groups of 32, fp16 model) on the recorded weights of
  test/fixtures/coreml/palettized.safetensors (tools/coreml_fixtures.py; groups >= 10,000 values: kmeans1d;
  the smaller ones: test/test_coreml_pal.py); the former Lloyd k-means' weight error is printed beside it.
- The tool on a small checkpoint (tools/make_checkpoint.py: hidden 64, 2 layers, 4 experts of 64):
  nothing quantized gives KLD 0, 100 % top-1, PPL ratio 1; per group, Q8_0's KLD is above 0 and below
  Q4_0's.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from harness import ROOT, check, finish, need_fixtures

sys.path.insert(0, os.path.join(ROOT, "tools"))
import quants  # noqa: E402

# 1. ggml's own quantizers on recorded rows
src = np.fromfile(need_fixtures("gguf", "F32.f32"), "<f4").reshape(6, 256)
for t in ("Q8_0", "Q4_0", "Q4_K"):
    ref = np.fromfile(need_fixtures("gguf", f"{t}.f32"), "<f4").reshape(6, 256)
    got = quants.fake_quant(src, t)
    same = got.view(np.uint32) == ref.view(np.uint32)
    check(bool(same.all()), f"{t} equals ggml's quantize + dequantize bit for bit (6 rows x 256)",
          f"{int((~same).sum())} of {same.size} values differ, max |diff| {float(np.abs(got - ref).max()):.3g}")

# 2. Q8_0 round trip bound
rng = np.random.default_rng(7)
x = (rng.standard_normal((512, 32)) * rng.uniform(1e-3, 10, (512, 1))).astype(np.float32)
q = quants.fake_quant(x, "Q8_0")
d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
bound = d / 2 + 127 * np.abs(d - d.astype(np.float16).astype(np.float32))
err = np.abs(x - q)
check(bool((err <= bound * (1 + 1e-6)).all()), "Q8_0 round trip error <= d/2 (+ the fp16 rounding of d) per value",
      f"worst error / bound {float((err / bound).max()):.4f}")

# 3. INT4-pal: 16 entries per group of 32 output channels, each weight its nearest up to the table's fp16
# rounding (coremltools assigns each weight to a float64 center, then casts the table to fp16)
w = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)
p = quants.fake_quant(w, "INT4-pal")
ok, detail = True, ""
for g in range(2):
    blk, orig = p[32 * g:32 * g + 32].ravel(), w[32 * g:32 * g + 32].ravel().astype(np.float16).astype(np.float32)
    lut = np.unique(blk)
    near = lut[np.argmin(np.abs(orig.reshape(-1, 1) - lut.reshape(1, -1)), axis=1)]
    excess = np.abs(blk - orig) - np.abs(near - orig)
    ulp = (np.spacing(np.abs(blk).astype(np.float16)) + np.spacing(np.abs(near).astype(np.float16))).astype(np.float32)
    if len(lut) > 16 or (excess > ulp / 2).any():
        i = int(np.argmax(excess - ulp / 2))
        ok, detail = False, (f"group {g}: {len(lut)} values; weight {orig[i]} -> {blk[i]}, nearest entry {near[i]} "
                             f"({excess[i]:.3g} closer, more than the entries' fp16 rounding {ulp[i] / 2:.3g})")
check(ok, "INT4-pal: <= 16 values per group of 32 output channels, each weight its nearest up to fp16 rounding",
      detail)

# 3b. INT4-pal = coremltools' own palettization (recorded)
def read_f16_safetensors(path):
    import json
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: np.frombuffer(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float16)
            .reshape(v["shape"]) for k, v in header.items() if k != "__metadata__"}


cml = read_f16_safetensors(need_fixtures("coreml", "palettized.safetensors"))
for case in sorted(k[:-7] for k in cml if k.endswith(".weight")):
    w, want = cml[case + ".weight"].astype(np.float32), cml[case + ".palettized"].astype(np.float32)
    got = quants.fake_quant(w, "INT4-pal")
    lloyd = quants.int4_pal(w, method="lloyd")
    ratio = float(((lloyd - w) ** 2).mean() / max(((want - w) ** 2).mean(), 1e-30))
    diff = got != want
    check(not diff.any(), f"INT4-pal equals coremltools' palettize_weights bit for bit: {case} "
          f"(the former Lloyd k-means: {ratio:.2f}x its weight MSE)",
          f"{int(diff.sum())} of {diff.size} weights differ "
          f"(first at {np.argwhere(diff)[0].tolist() if diff.any() else ''}); "
          "hint: kmeans1d_weighted must follow coremltools' deps/kmeans1d step by step")

# 4. the tool end to end
zaya = os.path.join(ROOT, "zaya")
tmp = tempfile.mkdtemp(prefix="zaya_qs_")
try:
    ckpt = os.path.join(tmp, "ckpt")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_checkpoint.py"), ckpt, "--layout", "native",
                        "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                        "--experts", "4", "--moe-intermediate", "64", "--router-hidden", "32", "--vocab", "512",
                        "--seed", "5", "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, "make_checkpoint.py writes the small checkpoint", r.stderr[-500:])
    table = os.path.join(tmp, "table.md")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "quant_sensitivity.py"), ckpt, "--random-ids", "16",
                        "--types", "Q8_0,Q4_0", "--groups", "attention,experts", "--work", os.path.join(tmp, "work"),
                        "--zaya", zaya, "--out", table], capture_output=True, text=True)
    check(r.returncode == 0, "quant_sensitivity.py runs", (r.stderr or r.stdout)[-800:])
    rows = {}
    if os.path.exists(table):
        for line in open(table):
            c = [s.strip() for s in line.strip().strip("|").split("|")]
            if len(c) == 9 and c[0] in ("none", "attention", "experts"):
                rows[(c[0], c[1])] = dict(n=c[2], kld=float(c[4]), top1=float(c[6]), ratio=float(c[7]))
    base = rows.get(("none", "-"))
    check(base is not None and base["kld"] == 0 and base["top1"] == 100.0 and base["ratio"] == 1.0,
          "nothing quantized: KLD 0, 100 % top-1, PPL ratio 1", repr(base))
    for g in ("attention", "experts"):
        a, b = rows.get((g, "Q8_0")), rows.get((g, "Q4_0"))
        check(a is not None and b is not None and 0 < a["kld"] < b["kld"],
              f"{g}: 0 < KLD(Q8_0) < KLD(Q4_0)", f"{a} vs {b}")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
finish()
