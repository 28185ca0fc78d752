#!/usr/bin/env python3
"""mlx_fixtures.py - record mx.dequantize's own outputs for test/test_mlx.py (needs mlx; not run by tests).

    /work/venv/bin/python tools/mlx_fixtures.py test/fixtures/mlx/dequantize.safetensors

Every quantization MLX writes, on the CPU (mlx-cpu): "affine" with bits 1, 2, 3, 4, 5, 6, 8 and group sizes
32, 64, 128, scales and biases in bfloat16, float16 and float32; "mxfp4", "mxfp8" (E8M0 scales) and "nvfp4"
(E4M3 scales, with and without a global scale), output as bfloat16, float16 and float32. Each case holds
the packed uint32 words, the scales (and biases, global scale) and mx.dequantize's result:
  CASE.weight, CASE.scales[, CASE.biases][, CASE.global_scale], CASE.out
and the file's metadata names each case's mode, bits, group size and output dtype (JSON under "cases").
The packed words and scales are random (every code and every rounding, not only mx.quantize's outputs);
one affine case per dtype comes from mx.quantize of a random matrix, as a model's weights would.
"""
import json
import sys

import mlx.core as mx
import numpy as np

mx.set_default_device(mx.cpu)
DT = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


def scales_of(rng, shape, dtype):
    """Random scales over a few binades, both signs (a port's scales are positive; the arithmetic is the same)."""
    s = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.integers(-12, 2, shape)
    return mx.array(s).astype(DT[dtype])


def main(out):
    rng = np.random.default_rng(48)
    tensors, cases = {}, {}
    rows = 3
    for bits in (1, 2, 3, 4, 5, 6, 8):
        for group in (32, 64, 128):
            for dtype in ("bfloat16", "float16", "float32"):
                cols = 2 * group if group < 128 else 128
                words = rows * cols * bits // 32
                w = mx.array(rng.integers(0, 1 << 32, (rows, cols * bits // 32), dtype=np.uint64).astype(np.uint32))
                assert w.size == words
                s = scales_of(rng, (rows, cols // group), dtype)
                b = scales_of(rng, (rows, cols // group), dtype)
                o = mx.dequantize(w, s, b, group_size=group, bits=bits, mode="affine")
                name = f"affine_b{bits}_g{group}_{dtype}"
                tensors.update({name + ".weight": w, name + ".scales": s, name + ".biases": b, name + ".out": o})
                cases[name] = {"mode": "affine", "bits": bits, "group_size": group, "dtype": dtype}
    for dtype in ("bfloat16", "float16", "float32"):      # as a model's weights are written: mx.quantize
        x = mx.array(rng.standard_normal((4, 128)).astype(np.float32) * 0.02).astype(DT[dtype])
        w, s, b = mx.quantize(x, group_size=64, bits=4, mode="affine")
        o = mx.dequantize(w, s, b, group_size=64, bits=4, mode="affine")
        name = f"affine_quantized_b4_g64_{dtype}"
        tensors.update({name + ".weight": w, name + ".scales": s, name + ".biases": b, name + ".out": o})
        cases[name] = {"mode": "affine", "bits": 4, "group_size": 64, "dtype": dtype}
    for mode, bits, group in (("mxfp4", 4, 32), ("mxfp8", 8, 32), ("nvfp4", 4, 16)):
        for gs in ((False, True) if mode == "nvfp4" else (False,)):
            for dtype in ("bfloat16", "float16", "float32"):
                cols = 8 * group
                w = mx.array(rng.integers(0, 1 << 32, (rows, cols * bits // 32), dtype=np.uint64).astype(np.uint32))
                if mode == "nvfp4":     # E4M3 scales: every byte but the NaN codes
                    sc = rng.integers(0, 256, (rows, cols // group)).astype(np.uint8)
                    sc[(sc & 0x7F) == 0x7F] = 0x3C
                else:                   # E8M0: every exponent; 255 (NaN) once
                    sc = rng.integers(0, 255, (rows, cols // group)).astype(np.uint8)
                    sc[0, 0], sc[1, 0] = 255, 0
                if mode == "mxfp8":     # E4M3 elements: one NaN code kept, so NaN handling is recorded
                    raw = np.array(w).view(np.uint8)
                    raw[0, 3] = 0x7F
                    w = mx.array(raw.view(np.uint32))
                s = mx.array(sc)
                g = mx.array(np.float32(rng.uniform(100, 3000))) if gs else None
                o = mx.dequantize(w, s, None, group_size=group, bits=bits, mode=mode, global_scale=g,
                                  dtype=DT[dtype])
                name = f"{mode}{'_gs' if gs else ''}_{dtype}"
                tensors.update({name + ".weight": w, name + ".scales": s, name + ".out": o})
                if gs:
                    tensors[name + ".global_scale"] = g
                cases[name] = {"mode": mode, "bits": bits, "group_size": group, "dtype": dtype,
                               "out_dtype": str(o.dtype).split(".")[-1]}
    meta = {"cases": json.dumps(cases, sort_keys=True), "mlx": mx.__version__,
            "made_by": "tools/mlx_fixtures.py (mx.dequantize on mlx-cpu)"}
    mx.save_safetensors(out, tensors, metadata=meta)
    print(f"wrote {out}: {len(cases)} cases, mlx {mx.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
