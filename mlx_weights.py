"""mlx_weights.py - read an MLX-saved model folder's quantized weights exactly as mx.dequantize gives them.

    d = mlx_weights.dequantize(words, (rows, packed_cols), scales, "BF16", biases, "BF16",
                               group_size=64, bits=4, mode="affine")   # bytes of the values, in out_dtype(...)
    cfg, where = mlx_weights.open_mlx(cfg, cfg_path, where, log)        # export_weights.py's MLX input

An MLX folder (mlx-lm / mlx-vlm `convert -q`, or a port's own `mx.save_safetensors`) keeps each quantized
matrix as three tensors: NAME.weight (U32, the codes packed along each row), NAME.scales and NAME.biases
(one per group of `group_size` consecutive inputs), plus NAME.global_scale for nvfp4 with a global scale;
config.json says how: "quantization": {"group_size": 64, "bits": 4, "mode": "affine", "PATH": {...} or
false per module} (mlx-lm also copies it to "quantization_config"). Everything else is an ordinary tensor.

The values are mx.dequantize's on the CPU (mlx/ops.cpp: affine_dequantize's and fp_dequantize's
"fallback", which the CPU runs op by op), bit for bit:
  affine (bits 1, 2, 3, 4, 5, 6, 8; groups 32, 64, 128): the codes are one little-endian bit stream per
    row (code k = bits k*b .. k*b+b-1 of the row's words; a 3/5/6-bit code may straddle two words);
    w = (q * scale) + bias, two operations, each rounded to the scales' dtype (BF16, F16 or F32): MLX
    multiplies the uint32 codes by the scales in the scales' dtype, then adds the biases; no fused
    multiply-add. The result has the scales' dtype.
  mxfp4 / mxfp8 (groups of 32, an E8M0 exponent byte per group): w = code * 2^(e - 127), the scale
    computed as pow(2, e - 127) in the output dtype first (it underflows to 0 in F16 below 2^-24), then the
    product rounded to it; fp4 codes are E2M1 (two per byte, low nibble first), fp8 codes E4M3.
  nvfp4 (groups of 16, an E4M3 scale byte per group): w = code * scale; with a global scale
    (NAME.global_scale, F32) scale = E4M3(s) * (global / 2688), each rounded to F32, and the result is
    F32 whatever the output dtype (the CPU fallback's type promotion).
Each float operation is done in a Python double and rounded once to float32 (exact: 53 >= 2 x 24 + 2),
then to the dtype where MLX's dtype is narrower (the double rounding F32 -> BF16/F16 of one operation is
innocuous, 24 >= 2 x 11 + 2). NaN codes give NaN (the bits of a NaN may differ from MLX's).
tools/mlx_fixtures.py records mx.dequantize's outputs for every case; test/test_mlx.py compares bytes.

The tensor names are mapped to the checkpoint's: the HF names (native or legacy) as they are; mlx-vlm's
(`language_model.` prefix, ZAYA1-VL's blocks `model.layers.{i}.attn.*` / `.mlp.*`) to the legacy ones (half-layers
2i / 2i+1) for a text model, to Zyphra's own ZAYA1-VL names (the hub's, blocks kept) for a VL config; stacked
experts `...experts.linear_fc1.weight` [E, rows, cols] and their LoRA pairs `lora_fc1.0` ... split into
`local_experts.{e}`; MLX's Conv1d weights [C, kernel, in/groups] transposed back to PyTorch's
[C, in/groups, kernel], its Conv3d patch embedding [D, T, P, P, C] to [D, C, T, P, P].

Python standard library only. Errors are raised as MLXError with one message (what, where, expected vs
found, hint).
"""

import re
import struct
import sys
from array import array

from gguf import message

MODES = {  # mode: (allowed bits, allowed group sizes, scale dtypes, has biases)
    "affine": ((1, 2, 3, 4, 5, 6, 8), (32, 64, 128), ("BF16", "F16", "F32"), True),
    "mxfp4": ((4,), (32,), ("U8",), False),
    "mxfp8": ((8,), (32,), ("U8",), False),
    "nvfp4": ((4,), (16,), ("U8",), False),
}
SIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "U32": 4}
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
CHUNK_ROWS_BYTES = 1 << 22


class MLXError(ValueError):
    """A problem with the MLX folder; the message is printed as is."""


def fail(what, where, expected=None, found=None, hint=None):
    raise MLXError(message(what, where, expected, found, hint))


# ----------------------------------------------------------------------------------------------
# Rounding, as MLX's float types do
# ----------------------------------------------------------------------------------------------

INF, NAN = float("inf"), float("nan")


def r32(x):
    """x (a double) rounded to float32, to nearest even; overflow gives +-inf."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return INF if x > 0 else -INF


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def to_bf16_bits(x):
    """The bf16 of a float32 value x (to nearest even; NaN stays NaN)."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def bf16_value(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def to_f16_bits(x):
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0x7C00 if x > 0 else 0xFC00


def f16_value(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


def rnd(x, dtype):
    """One float32 operation's result x (a double), rounded as MLX stores it in `dtype`."""
    x = r32(x)
    if dtype == "BF16":
        return bf16_value(to_bf16_bits(x))
    if dtype == "F16":
        return f16_value(to_f16_bits(x))
    return x


def encode(values, dtype):
    """Little-endian bytes of already-rounded values in dtype."""
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "BF16":
        return struct.pack(f"<{len(values)}H", *map(to_bf16_bits, values))
    return struct.pack(f"<{len(values)}H", *map(to_f16_bits, values))


def decode(raw, dtype):
    """Values (doubles) of little-endian raw bytes in dtype."""
    n = len(raw) // SIZE[dtype]
    if dtype == "F32":
        return struct.unpack(f"<{n}f", raw)
    if dtype == "F16":
        return struct.unpack(f"<{n}e", raw)
    if dtype == "BF16":   # exact widening: the float32 bits are the bf16 bits followed by 16 zero bits
        wide = bytearray(2 * len(raw))
        wide[2::4], wide[3::4] = raw[0::2], raw[1::2]
        return struct.unpack(f"<{n}f", wide)
    return tuple(raw)


def e4m3(b):
    """An E4M3 (fn) byte's value: no infinities, S.1111.111 is NaN."""
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return NAN
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))


# ----------------------------------------------------------------------------------------------
# Codes: one little-endian bit stream per row
# ----------------------------------------------------------------------------------------------

_TABLES = {}


def _tables(shift, mask, left=0):
    """bytes.translate table: each byte's (b >> shift) & mask (or (b << left) & mask)."""
    key = (shift, mask, left)
    if key not in _TABLES:
        _TABLES[key] = bytes(((b >> shift) if not left else (b << left)) & mask for b in range(256))
    return _TABLES[key]


def unpack_codes(raw, bits):
    """One byte per code, in order, of a row's packed bytes (codes of `bits` bits, low bits first)."""
    mask = (1 << bits) - 1
    if bits == 8:
        return bytes(raw)
    if 8 % bits == 0:                       # 1, 2, 4: whole codes in each byte
        k = 8 // bits
        out = bytearray(len(raw) * k)
        for j in range(k):
            out[j::k] = raw.translate(_tables(j * bits, mask))
        return bytes(out)
    # 3, 5, 6: every `bits` bytes hold 8 codes; code j starts at bit j*bits of that span
    span = len(raw) // bits
    out = bytearray(span * 8)
    for j in range(8):
        i0, sh = divmod(j * bits, 8)
        lo = raw[i0::bits].translate(_tables(sh, mask))
        if sh + bits > 8:                   # the code straddles two bytes
            hi = raw[i0 + 1::bits].translate(_tables(0, mask, 8 - sh))
            lo = (int.from_bytes(lo, "little") | int.from_bytes(hi, "little")).to_bytes(span, "little")
        out[j::8] = lo
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# mx.dequantize
# ----------------------------------------------------------------------------------------------

def out_dtype(mode, scale_dtype, dtype=None, global_scale=False):
    """The dtype mx.dequantize returns on the CPU: affine: the scales'; fp modes: `dtype` (default BF16);
    nvfp4 with a global scale: F32."""
    if mode == "affine":
        return dtype or scale_dtype
    if mode == "nvfp4" and global_scale:
        return "F32"
    return dtype or "BF16"


def dequantize(words, shape, scales, scale_dtype, biases=None, bias_dtype=None, group_size=64, bits=4,
               mode="affine", dtype=None, global_scale=None, compute=None, plain=False):
    """Bytes of mx.dequantize(w, scales, biases, group_size, bits, mode, global_scale, dtype) on the CPU.
    words: the packed U32 tensor's raw bytes, shape (rows, packed columns) (leading dims flattened into rows);
    scales/biases: raw bytes, one per group, in scale_dtype/bias_dtype; global_scale: a float or None.
    compute="F32" (affine): q * scale + bias in float32 instead, the result float32: the weights MLX's
    quantized matmul multiplies float32 activations by (it computes scale * q + bias in the activations'
    type; with BF16/F16 scales, q * scale is exact in float32, so one rounding, fused or not).
    plain=True: the element-by-element loop (the reference the bulk affine path is tested against)."""
    rows, packed = shape
    cols = packed * 32 // bits
    groups = cols // group_size
    od = out_dtype(mode, scale_dtype, dtype, global_scale is not None)
    ct = scale_dtype
    if mode == "affine" and compute:
        ct = od = compute
    if mode == "affine" and not plain and _HELPER and biases is not None and bias_dtype == scale_dtype:
        return _helper_affine(words, rows, packed, scales, scale_dtype, biases, group_size, bits, ct, od)
    sv = decode(scales, scale_dtype)
    bv = decode(biases, bias_dtype) if biases is not None else None
    mask = (1 << bits) - 1
    if mode == "affine" and sys.byteorder == "little" and not plain:
        try:
            return _affine_fast(words, rows, packed, sv, bv, group_size, bits, ct)
        except OverflowError:       # an F16 value out of range: the plain loop below rounds it to infinity
            pass
    out = []
    if mode == "nvfp4" and global_scale is not None:
        inv = r32(r32(global_scale) / 2688.0)          # divide(global_scale, array(448 * 6, out_type)): F32
    row_bytes = packed * 4
    for r in range(rows):
        codes = unpack_codes(words[r * row_bytes:(r + 1) * row_bytes], bits)
        for g in range(groups):
            q = codes[g * group_size:(g + 1) * group_size]
            i = r * groups + g
            if mode == "affine":
                s, b = sv[i], bv[i]
                # multiply(w, scales) then add(w, biases), each in the scales' dtype
                table = {c: rnd(rnd(c * s, ct) + b, ct) for c in set(q)}
                if od != ct:
                    table = {c: rnd(v, od) for c, v in table.items()}
            else:
                if mode == "nvfp4":
                    scale = e4m3(sv[i])
                    scale = rnd(scale * inv, "F32") if global_scale is not None else rnd(scale, od)
                else:   # subtract(astype(e, T), 127) then power(2, .) in T
                    scale = rnd(2.0 ** (sv[i] - 127), od) if sv[i] < 255 else INF
                lut = E2M1 if bits == 4 else [e4m3(c) for c in range(256)]
                table = {}
                for c in set(q):
                    v = lut[c & mask] * scale if not (lut[c & mask] == 0 and scale == INF) else NAN
                    table[c] = rnd(v, od) if v == v else NAN
            out.extend(table[c] for c in q)
    return encode(out, od)


_HELPER = []        # [the compiled twin's process] (dequantize.c --mlx) once use_helper() started it; empty: Python


def use_helper(exe):
    """Affine dequantization by exe (dequantize.c --mlx: the same operations and roundings in C, the same bits as
    the Python below, tested against the same recorded mx.dequantize outputs) from now on; exe None: Python."""
    import subprocess
    close_helper()
    if exe:
        _HELPER.append(subprocess.Popen([exe, "--mlx"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE))


def close_helper():
    while _HELPER:
        p = _HELPER.pop()
        p.stdin.close()
        p.wait()


def _helper_affine(words, rows, packed, scales, sd, biases, group_size, bits, ct, od):
    p = _HELPER[0]
    want = rows * (packed * 32 // bits) * SIZE[od]
    try:
        p.stdin.write(f"affine {bits} {group_size} {sd} {ct} {od} {rows} {packed}\n".encode())
        for b in (words, scales, biases):
            p.stdin.write(b)
        p.stdin.flush()
        data = p.stdout.read(want) if want else b""
    except (BrokenPipeError, OSError):
        data = b""
    if len(data) != want:
        err = p.stderr.read().decode(errors="replace").strip() if p.poll() is not None else ""
        fail("the compiled MLX dequantizer failed", f"affine {bits}-bit group {group_size}, {rows} rows",
             f"{want} bytes of values", f"{len(data)} bytes" + (f" ({err})" if err else ""),
             "set ZAYA_MLX_PYTHON=1 to dequantize in Python instead (slower, the same values)")
    return data


def _round_bits(values, dtype):
    """Bit patterns of doubles rounded to dtype, in bulk (array('f') rounds to float32 to nearest even;
    BF16 then from those bits, as MLX's conversion; F16 by struct's half-precision packing)."""
    if dtype == "F16":
        return array("H", struct.pack(f"<{len(values)}e", *values))
    u = array("I", array("f", values).tobytes())
    if dtype == "F32":
        return u
    return array("H", [((x + 0x7FFF + ((x >> 16) & 1)) >> 16) if (x & 0x7FFFFFFF) <= 0x7F800000 else (x >> 16) | 0x40
                       for x in u])


def _values(bits, dtype):
    if dtype == "F32":
        return array("f", bits.tobytes()).tolist()
    if dtype == "F16":
        return list(struct.unpack(f"<{len(bits)}e", bits.tobytes()))
    return array("f", array("I", [h << 16 for h in bits]).tobytes()).tolist()


def _affine_fast(words, rows, packed, sv, bv, group_size, bits, dtype):
    """dequantize()'s affine case with the same roundings, computed for every (group, code) pair at once
    and gathered per group: one value table of 2^bits entries per group."""
    k = 1 << bits
    groups = packed * 32 // bits // group_size
    row_bytes = packed * 4
    if k > group_size:              # 8 bits: fewer values than codes per group; every value computed
        codes = b"".join(unpack_codes(words[r * row_bytes:(r + 1) * row_bytes], bits) for r in range(rows))
        per = [(sv[i], bv[i]) for i in range(rows * groups) for _ in range(group_size)]
        m = _values(_round_bits([c * sb[0] for c, sb in zip(codes, per)], dtype), dtype)
        return _round_bits([x + sb[1] for x, sb in zip(m, per)], dtype).tobytes()
    codes_k = range(k)
    prods = [c * s for s in sv for c in codes_k]               # exact in a double (<= 8 + 24 bits)
    m = _values(_round_bits(prods, dtype), dtype)              # multiply(q, scales), rounded to dtype
    sums = [x + b for x, b in zip(m, (b for b in bv for _ in codes_k))]
    table = _round_bits(sums, dtype)                           # add(., biases), rounded to dtype
    out = array(table.typecode)
    for r in range(rows):
        codes = unpack_codes(words[r * row_bytes:(r + 1) * row_bytes], bits)
        for g in range(groups):
            base = (r * groups + g) * k
            out.extend(map(table[base:base + k].__getitem__, codes[g * group_size:(g + 1) * group_size]))
    return out.tobytes()


# ----------------------------------------------------------------------------------------------
# An MLX folder: which tensors are quantized, how, and under which checkpoint names
# ----------------------------------------------------------------------------------------------

def is_mlx(cfg, where):
    """True for a folder with MLX quantized weights (a U32 tensor, NAME.scales beside NAME.weight, or
    an MLX `quantization` entry in config.json)."""
    q = cfg.get("quantization")
    if isinstance(q, dict) and ("bits" in q or "group_size" in q):
        return True
    for n, st in where.items():
        if st.tensors[n][0] == "U32" or n.startswith("language_model.model."):   # packed, or mlx-vlm's names
            return True
        if n.endswith(".scales") and n[:-7] + ".weight" in where:
            return True
    return False


def quant_params(q, path, module, where_text):
    """(group_size, bits, mode) for module `module` from config.json's quantization (None: not quantized)."""
    if not isinstance(q, dict):
        fail("config.json's 'quantization' is not an object", where_text, '{"group_size": 64, "bits": 4, ...}',
             repr(q)[:200])
    p = q.get(module, q)
    if p is False:
        return None
    if not isinstance(p, dict):
        fail("config.json's per-module quantization entry is not an object or false", f"{path}: quantization.{module}",
             '{"group_size": G, "bits": B[, "mode": M]} or false', repr(p)[:200])
    mode = p.get("mode", q.get("mode", "affine"))
    defaults = {"affine": (64, 4), "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}
    if mode not in MODES:
        fail("unknown MLX quantization mode", f"{path}: quantization" + (f".{module}" if module in q else ""),
             "one of " + ", ".join(MODES), repr(mode), "mx.dequantize knows these modes (MLX 0.32)")
    g = p.get("group_size", defaults[mode][0])
    b = p.get("bits", defaults[mode][1])
    return g, b, mode


class MLXTensors:
    """The folder's tensors under checkpoint names, dequantized where quantized; the interface of
    export_weights.SafetensorsFile (tensors[name] = (dtype, shape, begin, end); read(name, begin, end))."""

    def __init__(self, path="MLX folder"):
        self.tensors, self.src, self.path = {}, {}, path

    def add(self, name, dtype, shape, read):
        """read(begin, end): the bytes [begin, end) of the tensor's data."""
        n = 1
        for d in shape:
            n *= d
        self.tensors[name] = (dtype, tuple(shape), 0, n * SIZE[dtype])
        self.src[name] = read

    def read(self, name, begin, end):
        return self.src[name](begin, min(end, self.tensors[name][3]))


def transpose_last2(raw, shape, size):
    """Bytes of a [A, B, C] tensor transposed to [A, C, B]."""
    a, b, c = shape
    out = bytearray(len(raw))
    for i in range(a):
        base = i * b * c * size
        for j in range(b):
            for k in range(c):
                src = base + (j * c + k) * size
                dst = base + (k * b + j) * size
                out[dst:dst + size] = raw[src:src + size]
    return bytes(out)


VL_BLOCK = re.compile(r"model\.layers\.(\d+)\.(attn|mlp)\.(.*)$")
STACKED = re.compile(r"(model\.layers\.\d+\.(?:mlp\.)?zaya_block\.experts)\.(linear_fc[12]|lora_fc[12]\.[01])\.weight$")


def is_vl(cfg):
    """A ZAYA1-VL config: transformers' (model_type zaya1_vl) or Zyphra's flat config.json with its vision_config
    (mlx-vlm's zaya1_vl keeps that); export_weights.py asks this too."""
    return cfg.get("model_type") == "zaya1_vl" or isinstance(cfg.get("vision_config"), dict)


def checkpoint_name(n, vl=False):
    """mlx-vlm's name -> the checkpoint name (HF names are returned as they are): for ZAYA1-VL (vl) Zyphra's own
    (the hub's: model.layers.{i}.attn.* / .mlp.* blocks, vision_tower.*), else the legacy one (the blocks are
    half-layers 2i / 2i+1)."""
    if n.startswith("language_model."):
        n = n[len("language_model."):]
    m = VL_BLOCK.match(n)
    if m and not vl:
        n = f"model.layers.{2 * int(m.group(1)) + (m.group(2) == 'mlp')}.{m.group(3)}"
    return n


def channels_first(raw, shape, size):
    """Bytes of MLX's Conv3d weight [D, T, P, P, C] as PyTorch's [D, C, T, P, P]."""
    a = array({2: "H", 4: "I"}[size], raw)       # elements moved whole: the byte order does not matter
    C, block = shape[4], shape[1] * shape[2] * shape[3] * shape[4]
    out = array(a.typecode)
    for d in range(shape[0]):
        for c in range(C):
            out.extend(a[d * block + c:(d + 1) * block:C])
    return out.tobytes()


def open_mlx(cfg, cfg_path, where, log, compute=None):
    """(config without the MLX quantization keys, {checkpoint name: tensor source}) for an MLX folder.
    compute="F32": affine weights as MLX's quantized matmul uses them with float32 activations (dequantize())."""
    q = cfg.get("quantization")
    if q is None:
        q = cfg.get("quantization_config")
    bad = next((n for n in sorted(where) if where[n].tensors[n][0] == "U32" or n.endswith(".scales")), None)
    if q is None and bad is None:   # an unquantized folder in mlx-vlm's names (mlx_vlm.convert without -q)
        q = {}
    if q is None:
        fail("MLX quantized weights without a 'quantization' entry in config.json", f"{where[bad].path}: tensor {bad}",
             '"quantization": {"group_size": G, "bits": B, "mode": M} (as mlx_lm.convert writes it)', "none",
             "the packed U32 weights cannot be read without their bits and group size")
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    out = MLXTensors()
    used = set()
    modes = {}
    for n in sorted(where):
        st = where[n]
        dtype, shape = st.tensors[n][0], st.tensors[n][1]
        if dtype != "U32":
            continue
        if not n.endswith(".weight"):
            fail("a packed U32 tensor that is not a module's weight", f"{st.path}: tensor {n}", "NAME.weight",
                 n, "MLX packs only Linear / Embedding / SwitchLinear weights")
        base = n[:-7]
        sname, bname, gname = base + ".scales", base + ".biases", base + ".global_scale"
        if sname not in where:
            fail("a packed U32 weight without its scales", f"{st.path}: tensor {n}", f"{sname} beside it", "no scales",
                 "is this folder complete? MLX writes NAME.weight, NAME.scales and (affine) NAME.biases together")
        module = base                            # the module path, as config.json names it
        params = quant_params(q, cfg_path, module, cfg_path)
        if params is None:
            fail("a packed U32 weight that config.json says is not quantized", f"{st.path}: tensor {n}",
                 f'quantization["{module}"] is a dict', "false")
        g, bits, mode = params
        sd, sshape = where[sname].tensors[sname][0], where[sname].tensors[sname][1]
        allowed_bits, allowed_groups, sdtypes, has_bias = MODES[mode]
        where_q = f"{st.path}: tensor {n} (mode {mode}, bits {bits}, group size {g})"
        if bits not in allowed_bits or g not in allowed_groups:
            fail("MLX quantization parameters that mx.dequantize does not take", where_q,
                 f"bits in {allowed_bits}, group size in {allowed_groups}", f"bits {bits}, group size {g}")
        if sd not in sdtypes:
            fail("MLX scales of the wrong dtype for the mode", f"{where[sname].path}: tensor {sname}",
                 " or ".join(sdtypes), sd, "affine keeps scales in the weights' dtype, the fp modes as one byte")
        rows_shape, packed = tuple(shape[:-1]), shape[-1]
        cols, rem = divmod(packed * 32, bits)
        if rem or cols % g or tuple(sshape) != rows_shape + (cols // g,):
            fail("MLX scales do not match the packed weight", where_q,
                 f"scales of shape {list(rows_shape) + [cols // g if not rem else '?']}", list(sshape),
                 "the bits or group size in config.json do not match how the tensor was packed")
        if has_bias:
            bt = where[bname].tensors[bname] if bname in where else None
            if bt is None or bt[1] != tuple(sshape) or bt[0] != sd:
                fail("an affine-quantized weight without matching biases", f"{st.path}: tensor {n}",
                     f"{bname} of shape {list(sshape)} and dtype {sd}",
                     "none" if bt is None else f"{list(bt[1])} {bt[0]}")
            used.add(bname)
        gs = None
        if gname in where:
            if mode != "nvfp4" or where[gname].tensors[gname][0] != "F32":
                fail("a global scale outside nvfp4", f"{where[gname].path}: tensor {gname}", "nvfp4 with an F32 scale",
                     f"{mode}, {where[gname].tensors[gname][0]}")
            used.add(gname)
            gs = gname
        used.update((n, sname))
        modes[(mode, bits, g)] = modes.get((mode, bits, g), 0) + 1

        gsv = None
        if gs:
            raw = where[gs].read(gs, 0, where[gs].tensors[gs][3] - where[gs].tensors[gs][2])
            vals = struct.unpack(f"<{len(raw) // 4}f", raw)
            if len(set(vals)) != 1:
                fail("a per-expert nvfp4 global scale", f"{where[gs].path}: tensor {gs}", "one value",
                     f"{len(vals)} values", "this reader takes one global scale per tensor")
            gsv = vals[0]
        od = out_dtype(mode, sd, None if mode == "affine" else "F32", gs is not None)   # fp modes: exact, as F32
        if mode == "affine" and compute:
            od = compute
        row_out = cols * SIZE[od]
        sbytes = cols // g * SIZE[sd]

        def read(begin, end, n=n, sname=sname, bname=bname if has_bias else None, g=g, bits=bits, mode=mode,
                 od=od, packed=packed, sd=sd, gsv=gsv, row_out=row_out, sbytes=sbytes):
            r0, r1 = begin // row_out, -(-end // row_out)
            words = where[n].read(n, r0 * packed * 4, r1 * packed * 4)
            scales = where[sname].read(sname, r0 * sbytes, r1 * sbytes)
            biases = where[bname].read(bname, r0 * sbytes, r1 * sbytes) if bname else None
            values = dequantize(words, (r1 - r0, packed), scales, sd, biases, sd, g, bits, mode,
                                None if mode == "affine" else od, gsv, compute)
            return values[begin - r0 * row_out:end - r0 * row_out]
        out.add(n, od, rows_shape + (cols,), read)
    for n in sorted(where):
        if n in used or n in out.tensors:
            continue
        if n.endswith((".scales", ".biases")) and n[:-7] + ".weight" not in out.tensors:
            fail("MLX scales or biases without a packed weight", f"{where[n].path}: tensor {n}",
                 f"{n[:-7]}.weight of dtype U32", "none")
        st = where[n]
        out.add(n, st.tensors[n][0], st.tensors[n][1], lambda b, e, n=n, st=st: st.read(n, b, e))
    renamed = rename(out, cfg)
    log("MLX folder: " + ", ".join(f"{k} {m} {b}-bit group {g}" for (m, b, g), k in sorted(modes.items()))
        + " tensor(s) dequantized as " + ("MLX's quantized matmul does with float32 activations (affine: "
                                          "q * scale + bias in float32" if compute else
                                          "mx.dequantize does (affine: in the scales' dtype")
        + "; fp modes: exact, F32); "
        f"{len(renamed.tensors)} tensors")
    return cfg, {name: renamed for name in renamed.tensors}


def rename(src, cfg):
    """The tensors under checkpoint names: mlx-vlm names mapped, stacked experts split, convs transposed."""
    out = MLXTensors(src.path)
    for n in sorted(src.tensors):
        dtype, shape = src.tensors[n][0], src.tensors[n][1]
        name = checkpoint_name(n, is_vl(cfg))
        vc = cfg.get("vision_config") or {}
        if name.endswith("patch_embed.proj.weight") and len(shape) == 5 and shape[1] != shape[4] and \
                shape[4] == vc.get("in_channels", vc.get("in_chans", 3)):   # MLX's Conv3d: [D, T, P, P, C]
            out.add(name, dtype, (shape[0], shape[4], shape[1], shape[2], shape[3]),
                    lambda b, x, n=n, shape=shape: channels_first(src.read(n, 0, src.tensors[n][3]), shape,
                                                                  SIZE[src.tensors[n][0]])[b:x])
            continue
        m = STACKED.match(name)
        if m and len(shape) == 3:
            per = shape[1] * shape[2] * SIZE[dtype]
            for e in range(shape[0]):
                out.add(f"{m.group(1)}.local_experts.{e}.{m.group(2)}.weight", dtype, shape[1:],
                        lambda b, x, n=n, e=e, per=per: src.read(n, e * per + b, e * per + x))
            continue
        conv = re.search(r"\.conv_qk(\.[01]|_depthwise|_grouped)\.weight$", name)
        if conv and len(shape) == 3:
            k = cfg.get("cca_time0", 2) if conv.group(1) in (".0", "_depthwise") else cfg.get("cca_time1", 2)
            if shape[1] == k and shape[2] != k:     # MLX Conv1d: [out, kernel, in / groups]
                size = SIZE[dtype]
                out.add(name, dtype, (shape[0], shape[2], shape[1]),
                        lambda b, x, n=n, shape=shape, size=size: transpose_last2(
                            src.read(n, 0, src.tensors[n][3]), shape, size)[b:x])
                continue
        if name in out.tensors:
            fail("two MLX tensors map to one checkpoint name", f"{src.path}: {n}", "distinct names", name)
        out.add(name, dtype, shape, lambda b, x, n=n: src.read(n, b, x))
    return out
