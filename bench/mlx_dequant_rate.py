#!/usr/bin/env python3
"""bench/mlx_dequant_rate.py - mlx_weights.dequantize's affine rate: the C helper (dequantize.c --mlx) against the
Python twin, alternating, on random packed weights the size of ZAYA1-8B matrices.

    python3 bench/mlx_dequant_rate.py [--values 100e6] [--bits 4] [--group 64] [--scales BF16] [--rounds 3]

Each round dequantizes the same random tensor (rows of 2048 inputs, as an expert's) once through each path
(Python on a tenth of the rows, timed and scaled: it is ~1000x slower), checks the C values equal Python's on
those rows, and prints million values a second; then medians and ranges, and the ratio C / Python per round.
The helper reads its input through a pipe and writes the values back through one: that is the exporter's path
(export_weights.py then widens them to the blob's float32).
"""
import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import export_weights  # noqa: E402
import mlx_weights  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--values", type=float, default=100e6)
ap.add_argument("--bits", type=int, default=4)
ap.add_argument("--group", type=int, default=64)
ap.add_argument("--scales", default="BF16", choices=("BF16", "F16", "F32"))
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
cols = 2048
rows = int(a.values) // cols
packed = cols * a.bits // 32
rng = random.Random(0)
words = rng.randbytes(rows * packed * 4)
size = mlx_weights.SIZE[a.scales]
n_groups = rows * cols // a.group
scale_bits = {"BF16": 0x3c00, "F16": 0x2000, "F32": 0x3c000000}[a.scales]   # small positive scales
scales = b"".join((scale_bits | rng.getrandbits(7)).to_bytes(size, "little") for _ in range(n_groups))
biases = b"".join((scale_bits | 0x8000 << (16 if size == 4 else 0) | rng.getrandbits(7)).to_bytes(size, "little")
                  for _ in range(n_groups))
exe = export_weights.build_dequantizer(print, "the benchmark", "ZAYA_MLX_PYTHON_UNSET")
if not exe:
    sys.exit("bench/mlx_dequant_rate.py: the C helper could not be built")
part = max(rows // 10, 1)
sb = n_groups // rows * size      # scale bytes per row
c_rate, py_rate = [], []
for r in range(a.rounds):
    for path in (("c", "py") if r % 2 == 0 else ("py", "c")):
        if path == "c":
            mlx_weights.use_helper(exe)
            t = time.perf_counter()
            got = mlx_weights.dequantize(words, (rows, packed), scales, a.scales, biases, a.scales, a.group, a.bits)
            dt = time.perf_counter() - t
            mlx_weights.close_helper()
            c_rate.append(rows * cols / dt / 1e6)
            head = got[:part * cols * size]
        else:
            t = time.perf_counter()
            ref = mlx_weights.dequantize(words[:part * packed * 4], (part, packed), scales[:part * sb], a.scales,
                                         biases[:part * sb], a.scales, a.group, a.bits)
            dt = time.perf_counter() - t
            py_rate.append(part * cols / dt / 1e6)
        print(f"round {r + 1} {path:2s} {(c_rate if path == 'c' else py_rate)[-1]:9.2f} M values/s", flush=True)
    if head != ref:
        sys.exit("bench/mlx_dequant_rate.py: the C values differ from Python's")
ratios = [c / p for c, p in zip(c_rate, py_rate)]
print(f"{rows * cols / 1e6:.0f} M values ({a.bits}-bit, group {a.group}, {a.scales} scales; output "
      f"{rows * cols * size / 1e6:.0f} MB): C {statistics.median(c_rate):.1f} M/s "
      f"({min(c_rate):.1f}-{max(c_rate):.1f}), "
      f"Python {statistics.median(py_rate):.2f} M/s ({min(py_rate):.2f}-{max(py_rate):.2f}); C / Python "
      f"{statistics.median(ratios):.0f}x ({min(ratios):.0f}-{max(ratios):.0f}); values equal on the Python rows")
