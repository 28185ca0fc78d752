#!/usr/bin/env python3
"""check_fake_quant.py - test/fake_quant.py's Q8_0 / Q4_0 against ggml's own quantize_row_*_ref + dequantize_row_*.

    /usr/bin/python3 tools/check_fake_quant.py /path/to/libggml-base.so

Prints, per input and type, how many dequantized values differ bitwise from ggml's (0 expected).
Not part of make test: it needs a built ggml (the tests need neither llama.cpp nor ggml).
"""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test"))
from fake_quant import quantize, read_safetensors  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ck = read_safetensors(os.path.join(root, "test", "fixtures", "checkpoint_native", "model.safetensors"))
tests = {"fixture o_proj, 6 layers": np.concatenate([ck[f"model.layers.{i}.self_attn.o_proj.weight"].reshape(-1) for i in range(6)]),
         "normal(0,1)": np.random.RandomState(0).randn(32 * 4096),
         "k/7 (ties, zeros)": np.round(np.random.RandomState(1).randn(32 * 4096) * 3) / 7}
bad = 0
for name, x in tests.items():
    x = np.ascontiguousarray(x, np.float32)
    n = x.size
    for q, block_bytes in (("q8_0", 34), ("q4_0", 18)):
        buf = ctypes.create_string_buffer(n // 32 * block_bytes)
        getattr(lib, f"quantize_row_{q}_ref")(x.ctypes.data_as(ctypes.c_void_p), buf, ctypes.c_int64(n))
        ref = np.zeros(n, np.float32)
        getattr(lib, f"dequantize_row_{q}")(buf, ref.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        mine = quantize(x.reshape(-1, 32), q).reshape(-1)
        diff = int(np.sum(mine.view(np.uint32) != ref.view(np.uint32)))
        bad += diff
        print(f"{name:26s} {q}: {diff} of {n} values differ from ggml (bitwise)")
sys.exit(1 if bad else 0)
