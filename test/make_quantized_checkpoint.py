#!/usr/bin/env python3
"""make_quantized_checkpoint.py - FP8-Experts / MXFP4-Experts versions of a bf16 ZAYA checkpoint.

    python3 test/make_quantized_checkpoint.py SRC OUT --format fp8|mxfp4
            [--names stacked|per-expert|split] [--scale-dtype bf16|f16|f32] [--dequantized-out DIR]
            [--random-experts --seed N]
    python3 test/make_quantized_checkpoint.py --selftest

SRC is a native bf16 checkpoint folder (test fixtures, tools/make_checkpoint.py output). OUT gets one
model.safetensors where every expert matrix is quantized the way compressed-tensors does it
(docs/quantized-experts.md) and every other tensor is copied byte for byte, a config.json with a
compressed-tensors quantization_config, and SRC's other files (tokenizer).
  fp8    FP8 E4M3FN values ('<module>.weight') with one scale per output row ('<module>.weight_scale',
         [rows, 1], bf16 by default as compressed-tensors keeps the model's dtype): scale = max|w| / 448
         rounded to bf16, q = e4m3(clamp(bf16(w / scale), +-448)) with round-to-nearest-even.
  mxfp4  two E2M1 values per byte, low nibble = even column ('<module>.weight_packed', U8 [rows, cols/2]),
         one E8M0 byte per 32 inputs ('<module>.weight_scale', U8 [rows, cols/32]): the group's max|w|
         rounded to a power of two as compressed-tensors' round_to_power_2 does (bf16 bits + 32, mantissa
         dropped), exponent = that power - 2 (E2M1's largest value is 6 = 1.5 x 2^2), q = E2M1 rounding of
         clamp(w / 2^exponent, +-6) with compressed-tensors' cast_to_fp4 thresholds.
A legacy SRC (one tensor per expert, '...local_experts.e.linear_fc1.weight') keeps its per-expert modules.
--names chooses how the native expert modules are named (docs/quantized-experts.md, 'names'): 'stacked'
(model.layers.i.mlp.experts.gate_up_proj.weight [E, 2I, H], the layout ports report), 'per-expert'
(...experts.e.gate_up_proj.weight [2I, H]) or 'split' (...experts.e.gate_proj / up_proj / down_proj).
--dequantized-out DIR also writes SRC with its experts replaced by the values this script's own
unpacking gives (the weights the official code materialises: MXFP4 exactly in bf16; FP8 as the exact
product rounded to the scale's dtype, so the twin's expert tensors are F16 / F32 for such scales).
--random-experts does not quantize SRC's experts: it writes random codes (no NaN, plausible scales),
streaming, for full-size benchmark checkpoints (a full-size run quantizing 8 G values in Python would
take hours).
Standard library only; memory stays around one expert matrix.
"""
import argparse
import bisect
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tempfile

FP8_MAX = 448.0
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
GROUP = 32
ST_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}


# ----------------------------------------------------------------------------------------------
# number formats
# ----------------------------------------------------------------------------------------------

def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_round(x):
    """x rounded to bf16 (through float32, round-to-nearest-even at both steps), as a float."""
    b = f32_bits(x)
    h = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def bf16_bytes(values):
    out = bytearray(2 * len(values))
    for i, x in enumerate(values):
        b = f32_bits(x)
        struct.pack_into("<H", out, 2 * i, (b + 0x7FFF + ((b >> 16) & 1)) >> 16)
    return bytes(out)


def bf16_values(raw):
    n = len(raw) // 2
    return list(struct.unpack(f"<{n}f", b"".join(b"\0\0" + raw[2 * i:2 * i + 2] for i in range(n))))


def fp8_decode(code):
    """FP8 E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; no inf; 0x7f / 0xff are NaN."""
    if code & 0x7F == 0x7F:
        return float("nan")
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    return s * (m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


FP8_POS = [fp8_decode(c) for c in range(0x7F)]      # codes 0..126, increasing values 0 .. 448


def fp8_encode(x):
    """Round-to-nearest-even to E4M3FN (torch's .to(torch.float8_e4m3fn)); |x| must be <= 448."""
    a = abs(x)
    i = bisect.bisect_left(FP8_POS, a)
    if i == len(FP8_POS):
        raise ValueError(f"{x} is outside the E4M3 range")
    if FP8_POS[i] != a and i > 0:
        lo, hi = FP8_POS[i - 1], FP8_POS[i]
        i = i - 1 if (a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0)) else i
    return i | (0x80 if (x < 0 or (x == 0 and struct.pack("<d", x)[7] & 0x80)) else 0)


def e2m1_encode(x):
    """compressed-tensors cast_to_fp4 (ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
    3.5 -> 4, 5 -> 4), then the nibble index of pack_fp4_to_uint8 (sign in bit 3)."""
    a = abs(x)
    for idx, (lo, closed) in enumerate(((0.25, True), (0.75, False), (1.25, True), (1.75, False),
                                        (2.5, True), (3.5, False), (5.0, True))):
        if a < lo or (closed and a == lo):
            break
    else:
        idx = 7
    return idx | (8 if math.copysign(1.0, x) < 0 else 0)     # a negative rounded to 0 is -0 (sign(x) * 0): nibble 8


def e2m1_decode(n):
    return (-1.0 if n & 8 else 1.0) * E2M1[n & 7]


def pack_nibbles(codes):
    """pack_fp4_to_uint8: consecutive pairs, the first (even column) in the low nibble."""
    return bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2))


def unpack_nibbles(packed):
    """unpack_fp4_from_uint8: low nibble first."""
    out = []
    for b in packed:
        out += [b & 15, b >> 4]
    return out


def mx_exponent(amax):
    """E8M0 byte of a group from its max |w| (bf16): compressed-tensors generate_mx_scales."""
    b = f32_bits(amax) >> 16                      # bf16 bits of the (bf16) amax
    p2 = (b + (1 << 5)) & 0xFF80                  # round_to_power_2: VAL_TO_ADD = 1 << (7 - 1 - 1)
    return min(254, max(0, ((p2 >> 7) & 0xFF) - 2))   # 127 + floor(log2(p2)) - 2, clamped as a uint8 (0 for amax 0)


# ----------------------------------------------------------------------------------------------
# quantizing one matrix (rows x cols bf16) and unpacking it again
# ----------------------------------------------------------------------------------------------

def quantize_fp8(w, cols, scale_dtype):
    """-> (E4M3 bytes, scale bytes in scale_dtype, scales as floats)"""
    codes, scales = bytearray(len(w)), []
    for r in range(len(w) // cols):
        row = w[r * cols:(r + 1) * cols]
        s = ROUND[scale_dtype](max(abs(x) for x in row) / FP8_MAX)
        if s == 0:                                # compressed-tensors replaces a 0 scale by its dtype's eps
            s = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10, "f32": 2.0 ** -23}[scale_dtype]
        scales.append(s)
        for j, x in enumerate(row):
            y = max(-FP8_MAX, min(FP8_MAX, bf16_round(x / s)))
            codes[r * cols + j] = fp8_encode(y)
    fmt = {"bf16": None, "f32": "f", "f16": "e"}[scale_dtype]
    raw = bf16_bytes(scales) if fmt is None else struct.pack(f"<{len(scales)}{fmt}", *scales)
    return bytes(codes), raw, scales


ROUND = {"bf16": bf16_round, "f32": lambda v: struct.unpack("<f", struct.pack("<f", v))[0],
         "f16": lambda v: struct.unpack("<e", struct.pack("<e", v))[0]}


def dequantize_fp8(codes, scales, cols, scale_dtype="bf16"):
    """The values the official code materialises: compressed-tensors' x_q.to(scale.dtype) * scale,
    the exact product rounded once to the scale's dtype."""
    r = ROUND[scale_dtype]
    return [r(fp8_decode(c) * scales[i // cols]) for i, c in enumerate(codes)]


def pack_values(values, dtype):
    """Floats already representable in dtype -> its little-endian bytes."""
    if dtype == "BF16":
        return bf16_bytes(values)
    return struct.pack(f"<{len(values)}{'f' if dtype == 'F32' else 'e'}", *values)


def quantize_mxfp4(w, cols):
    """-> (packed bytes, E8M0 bytes)"""
    codes, exps = [], bytearray()
    for g in range(len(w) // GROUP):
        grp = w[g * GROUP:(g + 1) * GROUP]
        e = mx_exponent(max(abs(x) for x in grp))
        exps.append(e)
        s = 2.0 ** (e - 127)
        codes += [e2m1_encode(max(-6.0, min(6.0, x / s))) for x in grp]
    return pack_nibbles(codes), bytes(exps)


def dequantize_mxfp4(packed, exps):
    codes = unpack_nibbles(packed)
    return [bf16_round(e2m1_decode(n) * 2.0 ** (exps[i // GROUP] - 127)) for i, n in enumerate(codes)]


# ----------------------------------------------------------------------------------------------
# safetensors in and out
# ----------------------------------------------------------------------------------------------

def read_checkpoint(d):
    """{name: (path, dtype, shape, absolute begin, end)} over model.safetensors or its shards."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for fn in files:
        p = os.path.join(d, fn)
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h = json.loads(f.read(n))
        for name, info in h.items():
            if name != "__metadata__":
                out[name] = (p, info["dtype"], info["shape"], 8 + n + info["data_offsets"][0], 8 + n + info["data_offsets"][1])
    return out


def read_bytes(entry, begin=0, end=None):
    p, _, _, b, e = entry
    with open(p, "rb") as f:
        f.seek(b + begin)
        return f.read((e - b if end is None else end) - begin)


def copy_tensor(entry, w, chunk=1 << 24):
    """Streams one tensor's bytes from its shard to a writer, 16 MB at a time."""
    size = entry[4] - entry[3]
    for b in range(0, size, chunk):
        w.write(read_bytes(entry, b, min(size, b + chunk)))


class SafetensorsWriter:
    """Header first (every name, dtype and shape known up front), then the data streamed in order."""

    def __init__(self, path, specs):
        self.f = open(path, "wb")
        header, off = {}, 0
        for name, dtype, shape in specs:
            n = ST_SIZE[dtype]
            for x in shape:
                n *= x
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.f.write(struct.pack("<Q", len(raw)) + raw)
        self.expected, self.written = off, 0

    def write(self, b):
        self.f.write(b)
        self.written += len(b)

    def close(self):
        assert self.written == self.expected, (self.written, self.expected)
        self.f.close()


# ----------------------------------------------------------------------------------------------
# the checkpoint
# ----------------------------------------------------------------------------------------------

def quantization_config(fmt):
    weights = ({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False,
                "group_size": None, "observer": "minmax"} if fmt == "fp8" else
               {"num_bits": 4, "type": "float", "strategy": "group", "group_size": GROUP, "symmetric": True,
                "dynamic": False, "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8", "observer": "minmax"})
    form = "float-quantized" if fmt == "fp8" else "mxfp4-pack-quantized"
    return {"quant_method": "compressed-tensors", "format": form, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": form}},
            "ignore": ["re:^(?!.*experts).*$"], "kv_cache_scheme": None, "sparsity_config": {}}


def expert_modules(name, shape, names):
    """[(module, first row, rows)] that store native expert tensor `name` [E, R, C] under --names."""
    E, R, _ = shape
    base, proj = name.rsplit(".", 1)
    if names == "stacked":
        return [(name, 0, E * R)]
    if names == "split" and proj == "gate_up_proj":
        return [(f"{base}.{e}.{p}", e * R + k * (R // 2), R // 2) for e in range(E) for k, p in enumerate(("gate_proj", "up_proj"))]
    return [(f"{base}.{e}.{proj}", e * R, R) for e in range(E)]


def make(src, out, fmt, names="stacked", scale_dtype="bf16", dequantized_out=None, random_experts=False, seed=0,
         quiet=False):
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    ck = read_checkpoint(src)
    legacy = lambda n: re.search(r"\.local_experts\.\d+\.linear_fc[12]\.weight$", n)  # noqa: E731
    is_expert = lambda n: n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")) or legacy(n)  # noqa: E731
    E = cfg["num_experts"]
    specs, dq_specs, jobs = [], [], []
    for name in sorted(ck, key=lambda n: (ck[n][0], ck[n][3])):   # file by file, in storage order
        _, dtype, shape, _, _ = ck[name]
        twin = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[scale_dtype] if fmt == "fp8" and is_expert(name) else dtype
        dq_specs.append((name, twin, shape))
        if not is_expert(name):
            specs.append((name, dtype, shape))
            jobs.append((name, None))
            continue
        if dtype != "BF16" or len(shape) != (2 if legacy(name) else 3) or (not legacy(name) and shape[0] != E):
            sys.exit(f"make_quantized_checkpoint.py: {name} is {dtype} {shape}, expected BF16 [E, rows, cols]")
        R, C = shape[-2], shape[-1]
        if fmt == "mxfp4" and C % GROUP:
            sys.exit(f"make_quantized_checkpoint.py: {name} has rows of {C}: MXFP4 needs a multiple of {GROUP}")
        stacked = names == "stacked" and not legacy(name)
        mods = [(name[:-len(".weight")], 0, R)] if legacy(name) else expert_modules(name, shape, names)
        for module, _, rows in mods:
            lead = [E] if stacked else []
            r = rows // E if stacked else rows
            if fmt == "fp8":
                specs += [(module + ".weight", "F8_E4M3", lead + [r, C]),
                          (module + ".weight_scale", {"bf16": "BF16", "f16": "F16", "f32": "F32"}[scale_dtype], lead + [r, 1])]
            else:
                specs += [(module + ".weight_packed", "U8", lead + [r, C // 2]), (module + ".weight_scale", "U8", lead + [r, C // GROUP])]
        jobs.append((name, mods))
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(src):
        if fn.endswith(".safetensors") or fn in ("model.safetensors.index.json", "config.json"):
            continue
        if os.path.isfile(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), os.path.join(out, fn))
    qcfg = dict(cfg, quantization_config=quantization_config(fmt))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(qcfg, f, indent=2)
    # one pass per output: the quantized tensors are computed once per module and kept only for it
    w = SafetensorsWriter(os.path.join(out, "model.safetensors"), specs)
    dq = None
    if dequantized_out:
        os.makedirs(dequantized_out, exist_ok=True)
        for fn in os.listdir(src):
            if not fn.endswith(".safetensors") and fn != "model.safetensors.index.json" and os.path.isfile(os.path.join(src, fn)):
                shutil.copy(os.path.join(src, fn), os.path.join(dequantized_out, fn))
        dq = SafetensorsWriter(os.path.join(dequantized_out, "model.safetensors"), dq_specs)
    rng = random.Random(seed)
    by_name = {}
    for name, mods in jobs:
        if mods is None:
            copy_tensor(ck[name], w)
            continue
        C = ck[name][2][-1]
        parts = {}
        for module, first, rows in mods:
            if random_experts:
                parts[module] = random_module(rng, fmt, rows, C, scale_dtype)
                continue
            raw = read_bytes(ck[name], 2 * first * C, 2 * (first + rows) * C)
            vals = bf16_values(raw)
            parts[module] = (quantize_fp8(vals, C, scale_dtype) if fmt == "fp8" else quantize_mxfp4(vals, C))
        for module, _, _ in mods:
            w.write(parts[module][0])
            w.write(parts[module][1])
        if dq is not None:
            deq = []
            for module, _, _ in mods:
                p = parts[module]
                deq += dequantize_fp8(p[0], p[2], C, scale_dtype) if fmt == "fp8" else dequantize_mxfp4(p[0], p[1])
            by_name[name] = pack_values(deq, "BF16" if fmt == "mxfp4" else {"bf16": "BF16", "f16": "F16", "f32": "F32"}[scale_dtype])
        if not quiet:
            print(f"  {name}: {fmt} ({len(mods)} module{'s' if len(mods) > 1 else ''})", flush=True)
    w.close()
    if dq is not None:
        for name, _, _ in dq_specs:
            if name in by_name:
                dq.write(by_name[name])
            else:
                copy_tensor(ck[name], dq)
        dq.close()


def random_module(rng, fmt, rows, cols, scale_dtype):
    """Random codes for a benchmark checkpoint: values of about N(0, 1/sqrt(cols)), no NaN."""
    n = rows * cols
    if fmt == "fp8":
        # exponent field at most 7 (|code value| < 2): byte & 0xBF; NaN codes cannot occur
        codes = random_bytes(rng, n).translate(bytes(b & 0xBF for b in range(256)))
        s = 0.5 / cols ** 0.5
        scales = [s] * rows
        raw = (bf16_bytes(scales) if scale_dtype == "bf16" else
               struct.pack(f"<{rows}{'f' if scale_dtype == 'f32' else 'e'}", *scales))
        return codes, raw, scales
    e = max(1, min(254, 127 + round(math.log2(0.5 / cols ** 0.5))))
    return random_bytes(rng, n // 2), bytes([e]) * (n // GROUP)


def random_bytes(rng, n, chunk=1 << 24):
    return b"".join(rng.randbytes(min(chunk, n - i)) for i in range(0, n, chunk))


# ----------------------------------------------------------------------------------------------
# self test: pack -> unpack -> same values
# ----------------------------------------------------------------------------------------------

def selftest():
    ok = True

    def check(cond, name, detail=""):
        nonlocal ok
        print(f"PASS {name}" if cond else f"FAIL {name}: {detail}")
        ok = ok and cond

    bad = [c for c in range(256) if c & 0x7F != 0x7F and fp8_encode(fp8_decode(c)) != c]
    check(not bad, "FP8 E4M3FN: encode(decode(code)) == code for all 254 non-NaN codes", f"codes {bad[:8]}")
    check(fp8_decode(0x7E) == 448.0 and fp8_decode(0x01) == 2.0 ** -9 and fp8_decode(0x08) == 2.0 ** -6,
          "FP8 E4M3FN: max 448 (0x7e), smallest subnormal 2^-9, smallest normal 2^-6")
    check(fp8_encode(448 * 0.99) == 0x7E and fp8_encode(0.5 * (2.0 ** -9)) == 0 and fp8_encode(1.5 * 2.0 ** -9) == 2,
          "FP8 encode rounds to nearest, ties to even")
    rng = random.Random(1)
    codes = [rng.randrange(16) for _ in range(4096)]
    packed = pack_nibbles(codes)
    check(unpack_nibbles(packed) == codes and packed[0] == codes[0] | codes[1] << 4,
          "MXFP4: unpack(pack(nibbles)) == nibbles, first value in the low nibble")
    check([e2m1_encode(e2m1_decode(n)) for n in range(16)] == list(range(16)),
          "E2M1: encode(decode(nibble)) == nibble for all 16 (-0 is nibble 8)")
    w = [rng.gauss(0, 0.05) for _ in range(64 * 64)]
    w = [bf16_round(x) for x in w]
    p, e = quantize_mxfp4(w, 64)
    d = dequantize_mxfp4(p, e)
    p2, e2 = quantize_mxfp4(d, 64)
    check((p2, e2) == (p, e), "MXFP4: quantize(dequantize(q)) == q (dequantized values are on the grid)")
    err = max(abs(a - b) for a, b in zip(w, d)) / max(abs(a) for a in w)
    check(err < 0.25, f"MXFP4: max error {err:.3f} of max|w| (< 0.25)")
    q, raw, s = quantize_fp8(w, 64, "bf16")
    d8 = dequantize_fp8(q, s, 64)
    check(all(abs(a - b) <= abs(a) * 2 ** -3 + 2 ** -9 * max(s) * 2 for a, b in zip(w, d8)), "FP8: error within half an E4M3 step")
    check(bf16_values(raw) == s, "FP8: bf16 scales stored exactly")
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--format", choices=("fp8", "mxfp4"))
    ap.add_argument("--names", choices=("stacked", "per-expert", "split"), default="stacked")
    ap.add_argument("--scale-dtype", choices=("bf16", "f16", "f32"), default="bf16", help="FP8 row scales")
    ap.add_argument("--dequantized-out", help="also write SRC with its experts dequantized to bf16 here")
    ap.add_argument("--random-experts", action="store_true", help="random codes instead of quantizing SRC")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    if a.selftest:
        return 0 if selftest() else 1
    if not (a.src and a.out and a.format):
        ap.error("SRC, OUT and --format are needed")
    make(a.src, a.out, a.format, a.names, a.scale_dtype, a.dequantized_out, a.random_experts, a.seed, a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
