"""gguf.py - read a GGUF file (ggml's model format) and dequantize its tensors exactly as ggml does.

    g = gguf.GGUFFile("model.gguf")        # parses the header, the metadata and the tensor directory
    g.kv["zaya.embedding_length"]          # metadata values (arrays as Python lists)
    t = g.tensors["blk.0.attn_q.weight"]   # .type ("Q8_0"), .ne (ggml order), .shape (row-major), .nbytes
    values = g.dequantize(t.name)          # array('f'): every element as ggml's to_float gives it

Written from ggml's specification (docs/gguf.md of llama.cpp: versions 2 and 3, little-endian) and, for the
dequantization, from ggml's reference code (dequantize_row_* in ggml/src/ggml-quants.c, block layouts in
ggml/src/ggml-common.h). Every result is the float32 ggml computes, bit for bit: each operation is done in a
Python double and rounded to float32 (array('f')) where ggml's float32 code rounds, in ggml's order. A
float32 operation computed in double and rounded once is the correctly rounded float32 result (53 >= 2 x 24
+ 2 bits). In these formats every intermediate product is exact in float32 (an fp16 scale times small
integers; Q6_K's (d * scale) * q is the one product that can round), so each value is one rounding of ggml's
expression, whether or not a compiler fuses a multiply-add; the order still decides the sign of zeros
(d * (sc * q) gives -0.0 where ggml gives +0.0), and the tests compare bytes. test/test_gguf.py checks every
type against values ggml computed (tools/gguf_fixtures.c).

Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. Any other
ggml type is refused by name. Python standard library only; the work is done with bytes.translate, slicing
and map() over arrays, one Python step per block rather than per element where the layout allows.

Errors are raised as GGUFError with one message: what, where, expected vs found, a hint.
"""

import mmap
import os
import struct
from array import array
from itertools import chain, repeat
from operator import add, mul, or_, sub

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                   # GGML_MAX_DIMS


class GGUFError(ValueError):
    """A problem with the GGUF file; the message is printed as is."""


def message(what, where, expected=None, found=None, hint=None):
    """The project's error text: what was wrong, where, expected vs found, a hint (export_weights.py too)."""
    msg = f"{what}\n  where:    {where}"
    if expected is not None:
        msg += f"\n  expected: {expected}\n  found:    {found}"
    if hint:
        msg += f"\n  hint:     {hint}"
    return msg


def fail(what, where, expected=None, found=None, hint=None):
    raise GGUFError(message(what, where, expected, found, hint))


# ggml_type ids (ggml/include/ggml.h) -> name; (elements per block, bytes per block) for the ones read here
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    34: "TQ1_0", 35: "TQ2_0", 36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8", 39: "MXFP4",
    40: "NVFP4", 41: "Q1_0",
}
QK_K = 256
BLOCKS = {                     # name: (elements per block, bytes per block)
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (QK_K, 84), "Q3_K": (QK_K, 110), "Q4_K": (QK_K, 144), "Q5_K": (QK_K, 176), "Q6_K": (QK_K, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (QK_K, 136),
}
SUPPORTED = tuple(BLOCKS)

# GGUF metadata value types (docs/gguf.md: gguf_metadata_value_type)
VT_UINT8, VT_INT8, VT_UINT16, VT_INT16, VT_UINT32, VT_INT32, VT_FLOAT32, VT_BOOL, VT_STRING, VT_ARRAY, \
    VT_UINT64, VT_INT64, VT_FLOAT64 = range(13)
SCALAR_FMT = {VT_UINT8: "B", VT_INT8: "b", VT_UINT16: "H", VT_INT16: "h", VT_UINT32: "I", VT_INT32: "i",
              VT_FLOAT32: "f", VT_BOOL: "?", VT_UINT64: "Q", VT_INT64: "q", VT_FLOAT64: "d"}
VT_NAMES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
            "uint64", "int64", "float64"]


# ----------------------------------------------------------------------------------------------
# The file: header, metadata, tensor directory (docs/gguf.md "File Structure")
# ----------------------------------------------------------------------------------------------

class GGUFTensor:
    def __init__(self, name, type_name, ne, offset, nbytes):
        self.name = name
        self.type = type_name
        self.ne = ne                          # ggml order: ne[0] is the contiguous (row) dimension
        self.shape = tuple(reversed(ne))      # row-major shape, as torch / safetensors would give it
        self.offset = offset                  # absolute file offset of the data
        self.nbytes = nbytes
        n = 1
        for d in ne:
            n *= d
        self.numel = n


def open_sized(path, kind, least, what_least, hint, fail=fail):
    """(size, binary file) of a weight file at least `least` bytes long, else fail(...) (export_weights.py too)."""
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        fail(f"cannot open {kind} file", path, hint=str(e))
    if size < least:
        f.close()
        fail(f"{kind} file is truncated", path, what_least, f"{size} bytes", hint)
    return size, f


class GGUFFile:
    def __init__(self, path):
        self.path = path
        self.helper = None                    # the compiled dequantizer's process (use_helper), or None
        self.helper_exe = None                # its executable
        self.size, self.f = open_sized(path, "GGUF", 24, "at least 24 bytes (magic, version, counts)",
                                       "the file is incomplete; download or convert it again")
        self.mm = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        self.pos = 0
        magic = self.mm[:4]
        if magic != GGUF_MAGIC:
            fail("not a GGUF file (bad magic)", path, repr(GGUF_MAGIC), repr(bytes(magic)),
                 "give a .gguf written by llama.cpp's convert_hf_to_gguf.py or llama-quantize")
        (version,) = struct.unpack_from("<I", self.mm, 4)
        if version not in (2, 3):
            swapped = struct.unpack_from(">I", self.mm, 4)[0]
            if swapped in (2, 3):
                fail("big-endian GGUF files are not supported", path, "a little-endian GGUF (version 2 or 3)",
                     f"version {swapped}, big-endian", "convert the model again on a little-endian machine")
            fail("unsupported GGUF version", path, "2 or 3", version,
                 "version 1 (2023) used 32-bit counts; convert the model again with a current llama.cpp")
        self.version = version
        self.pos = 8
        n_tensors, n_kv = self._unpack("<QQ", "the tensor and metadata counts")
        # every tensor info takes at least 8+0+4+8+4+8 bytes, every key-value 8+0+4+1: bound them by the file
        if n_tensors > self.size // 32 or n_kv > self.size // 13:
            fail("GGUF counts are out of range", path, f"at most {self.size // 32} tensors and {self.size // 13} "
                 "metadata entries for a file of this size", f"{n_tensors} tensors, {n_kv} entries",
                 "the file is corrupt or truncated")
        self.kv, self.kv_types = {}, {}
        for i in range(n_kv):
            key = self._string(f"metadata entry {i}'s key")
            (vt,) = self._unpack("<I", f"the value type of '{key}'")
            if key in self.kv:
                fail("metadata key stored twice", f"{path}: '{key}'", "unique keys", "a duplicate")
            self.kv[key] = self._value(vt, key)
            self.kv_types[key] = VT_NAMES[vt]
            if vt == VT_ARRAY:
                self.kv_types[key] += "[" + VT_NAMES[self._last_array_type] + "]"
        align = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if self.kv_types.get("general.alignment", "uint32") != "uint32" or not (
                isinstance(align, int) and align > 0 and align & (align - 1) == 0):
            fail("general.alignment is not a power of two (uint32)", path, "a power of two", repr(align))
        self.alignment = align
        infos = []
        for i in range(n_tensors):
            name = self._string(f"tensor {i}'s name")
            (n_dims,) = self._unpack("<I", f"tensor '{name}''s dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                fail("tensor has an unsupported number of dimensions", f"{path}: tensor '{name}'",
                     f"1..{MAX_DIMS}", n_dims, "the file is corrupt")
            ne = self._unpack(f"<{n_dims}Q", f"tensor '{name}''s dimensions")
            ttype, offset = self._unpack("<IQ", f"tensor '{name}''s type and offset")
            infos.append((name, ne, ttype, offset))
        self.data_start = -(-self.pos // align) * align
        if self.data_start > self.size:
            fail("GGUF file is truncated", f"{path}: the data section", f"it to start at byte {self.data_start}",
                 f"a file of {self.size} bytes", "the file is incomplete; download or convert it again")
        self.tensors = {}
        spans = []
        for name, ne, ttype, offset in infos:
            where = f"{path}: tensor '{name}'"
            if name in self.tensors:
                fail("tensor stored twice", where, "unique tensor names", "a duplicate")
            tname = GGML_TYPE_NAMES.get(ttype, f"unknown type {ttype}")
            if any(d == 0 for d in ne) or any(d >= 1 << 40 for d in ne):
                fail("tensor has a dimension out of range", where, "1 .. 2^40", list(ne))
            if tname not in BLOCKS:       # read the rest of the directory first? No: refuse at the first one
                fail(f"tensor type {tname} is not supported", where, "one of " + ", ".join(SUPPORTED), tname,
                     "requantize the model to one of these types (llama-quantize), or add its dequantization "
                     "to gguf.py from ggml-quants.c")
            qk, bs = BLOCKS[tname]
            if ne[0] % qk:
                fail("tensor row length is not a multiple of its type's block size", where,
                     f"a multiple of {qk} ({tname})", ne[0], "the file is corrupt")
            numel = 1
            for d in ne:
                numel *= d
            nbytes = numel // qk * bs
            if offset % align:
                fail("tensor data offset is not aligned", where, f"a multiple of {align}", offset, "the file is corrupt")
            start = self.data_start + offset
            if start + nbytes > self.size:
                fail("GGUF file is truncated", where, f"{nbytes} bytes of data at byte {start}",
                     f"a file of {self.size} bytes", "the file is incomplete; download or convert it again")
            self.tensors[name] = GGUFTensor(name, tname, tuple(ne), start, nbytes)
            spans.append((start, start + nbytes, name))
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                fail("two tensors overlap in the data section", f"{path}: '{n0}' and '{n1}'",
                     "disjoint byte ranges", f"[{b0},{e0}) and [{b1},{e1})")

    # -- primitive readers, every one bounds-checked ------------------------------------------------
    def _need(self, n, what):
        if self.pos + n > self.size:
            fail("GGUF file is truncated", f"{self.path}: {what} at byte {self.pos}",
                 f"{n} more bytes", f"{self.size - self.pos}", "the file is incomplete; download or convert it again")

    def _unpack(self, fmt, what):
        n = struct.calcsize(fmt)
        self._need(n, what)
        v = struct.unpack_from(fmt, self.mm, self.pos)
        self.pos += n
        return v

    def _string(self, what):
        (n,) = self._unpack("<Q", what)
        self._need(n, what)
        b = self.mm[self.pos:self.pos + n]
        self.pos += n
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            fail("a GGUF string is not valid UTF-8", f"{self.path}: {what} at byte {self.pos - n}",
                 hint="the file is corrupt")

    def _value(self, vt, key):
        what = f"the value of '{key}'"
        if vt in SCALAR_FMT:
            return self._unpack("<" + SCALAR_FMT[vt], what)[0]
        if vt == VT_STRING:
            return self._string(what)
        if vt == VT_ARRAY:
            et, n = self._unpack("<IQ", what)
            self._last_array_type = et
            if et in SCALAR_FMT:
                size = struct.calcsize(SCALAR_FMT[et])
                self._need(n * size, what)
                v = list(struct.unpack_from(f"<{n}{SCALAR_FMT[et]}", self.mm, self.pos))
                self.pos += n * size
                return v
            if et == VT_STRING:
                if n > (self.size - self.pos) // 8:
                    self._need(8 * n, what)
                return [self._string(f"{what}[{i}]") for i in range(n)]
            if et == VT_ARRAY:
                return [self._value(VT_ARRAY, f"{key}[{i}]") for i in range(n)]
            fail("unknown GGUF array element type", f"{self.path}: '{key}'", "0..12", et, "the file is corrupt")
        fail("unknown GGUF metadata value type", f"{self.path}: '{key}'", "0..12", vt,
             "the file is corrupt or of a newer GGUF version")

    # -- tensor data ----------------------------------------------------------------------------
    def raw(self, name, begin=0, end=None):
        t = self.tensors[name]
        end = t.nbytes if end is None else end
        return self.mm[t.offset + begin:t.offset + end]

    def dequantize(self, name, first_row=0, n_rows=None):
        """Rows [first_row, first_row + n_rows) of tensor `name` (rows of ne[0] elements) as array('f'):
        by the compiled helper when use_helper() started one, else in Python (the same bits)."""
        t = self.tensors[name]
        rows = t.numel // t.ne[0]
        n_rows = rows - first_row if n_rows is None else n_rows
        qk, bs = BLOCKS[t.type]
        row_bytes = t.ne[0] // qk * bs
        if self.helper is not None:
            return self._helper_dequantize(t, first_row * row_bytes, n_rows * row_bytes)
        return dequantize(t.type, self.raw(name, first_row * row_bytes, (first_row + n_rows) * row_bytes))

    def use_helper(self, exe):
        """Dequantize with exe (dequantize.c, built by export_weights.py: ggml's to_float in C, the same bits as
        this module's Python twin), one process for the file that answers one request per tensor piece."""
        import subprocess
        self.helper_exe = exe
        self.helper = subprocess.Popen([exe, self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)

    def _helper_dequantize(self, t, begin, nbytes):
        qk, bs = BLOCKS[t.type]
        want = nbytes // bs * qk * 4
        out = array("f")
        try:
            self.helper.stdin.write(f"{t.type} {t.offset + begin} {nbytes}\n".encode())
            self.helper.stdin.flush()
            data = self.helper.stdout.read(want) if want else b""
        except (BrokenPipeError, OSError):
            data = b""
        if len(data) != want:
            err = self.helper.stderr.read().decode(errors="replace").strip() if self.helper.poll() is not None else ""
            fail("the compiled GGUF dequantizer failed", f"{self.path}: tensor '{t.name}'", f"{want} bytes of values",
                 f"{len(data)} bytes" + (f" ({err})" if err else ""),
                 "set ZAYA_GGUF_PYTHON=1 to dequantize in Python instead (slower, the same values)")
        out.frombytes(data)
        return out

    def pieces(self, name, first_row, n_rows):
        """[(type, file offset, nbytes, name)] of rows [first_row, first_row + n_rows) of tensor `name`."""
        t = self.tensors[name]
        qk, bs = BLOCKS[t.type]
        row_bytes = t.ne[0] // qk * bs
        return [(t.type, t.offset + first_row * row_bytes, n_rows * row_bytes, name)]

    def close(self):
        if self.helper is not None:
            self.helper.stdin.close()
            self.helper.wait()
            self.helper = None
        self.mm.close()
        self.f.close()


class BlobFiller:
    """The compiled dequantizer writing straight into a blob (dequantize.c --into): each tensor's values go from the
    GGUF to their offset in the blob file without passing through Python, which gets back their CRC-32."""

    def __init__(self, exe, gguf_path, blob_path):
        import subprocess
        self.path, self.blob = gguf_path, blob_path
        self.p = subprocess.Popen([exe, gguf_path, "--into", blob_path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def fill(self, name, dtype, offset, pieces):
        """Writes the values of pieces [(type, file offset, nbytes, GGUF name)], in order, as dtype ('f32' or
        'bf16') at byte `offset` of the blob; returns (CRC-32, bytes written)."""
        merged = []                            # consecutive pieces of one GGUF tensor (the experts) as one
        for p in pieces:
            if merged and merged[-1][3] == p[3] and merged[-1][1] + merged[-1][2] == p[1]:
                merged[-1] = (p[0], merged[-1][1], merged[-1][2] + p[2], p[3])
            else:
                merged.append(p)
        req = f"{dtype} {offset} {len(merged)} {name}\n" + "".join(f"{t} {o} {n} {g}\n" for t, o, n, g in merged)
        try:
            self.p.stdin.write(req.encode())
            self.p.stdin.flush()
            answer = self.p.stdout.readline().split()
        except (BrokenPipeError, OSError):
            answer = []
        if len(answer) != 2:
            try:
                self.p.stdin.close()
            except OSError:                    # the helper is gone: its stderr says why
                pass
            err = self.p.stderr.read().decode(errors="replace").strip() if self.p.wait() != 0 else ""
            if "\n  where:" in err:           # dequantize.c's own message: what, where, expected vs found, hint
                raise GGUFError(err)
            fail("the compiled GGUF dequantizer failed", f"{self.path}: tensor '{pieces[0][3]}' for {name}",
                 "a CRC-32 and a byte count", err or "no answer",
                 "set ZAYA_GGUF_PYTHON=1 to dequantize in Python instead (slower, the same values)")
        return int(answer[0]), int(answer[1])

    def close(self):
        self.p.stdin.close()
        err = self.p.stderr.read().decode(errors="replace").strip()
        if self.p.wait() != 0:
            fail("the compiled GGUF dequantizer failed", self.blob, hint=err)


# ----------------------------------------------------------------------------------------------
# Dequantization (ggml-quants.c dequantize_row_*, block layouts of ggml-common.h)
# ----------------------------------------------------------------------------------------------

LO = bytes(b & 15 for b in range(256))
HI = bytes(b >> 4 for b in range(256))
LO_M8 = bytes(((b & 15) - 8) & 255 for b in range(256))      # Q4_0: nibble - 8, as a signed byte
HI_M8 = bytes(((b >> 4) - 8) & 255 for b in range(256))
SHIFT2 = [bytes((b >> (2 * s)) & 3 for b in range(256)) for s in range(4)]           # 2-bit fields
BIT_AS = lambda k, v: bytes(v if (b >> k) & 1 else 0 for b in range(256))           # noqa: E731
BIT16 = [BIT_AS(k, 16) for k in range(8)]                    # Q5_K: bit k of qh -> 16
BIT4 = [BIT_AS(k, 4) for k in range(8)]                      # Q3_K: bit k of hmask -> 4
EXPAND16 = [bytes(16 if (b >> k) & 1 else 0 for k in range(8)) for b in range(256)]  # Q5_0/1: 8 bits -> 8 bytes
QH6 = [bytes(((b >> (2 * s)) & 3) << 4 for b in range(256)) for s in range(4)]       # Q6_K: 2 high bits -> 16s
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
IQ4_LO = bytes(KVALUES_IQ4NL[b & 15] & 255 for b in range(256))
IQ4_HI = bytes(KVALUES_IQ4NL[b >> 4] & 255 for b in range(256))


def rep(values, k):
    """Each value repeated k times (a lazy iterator)."""
    return chain.from_iterable(map(repeat, values, repeat(k)))


def f32(it):
    """Round every double of `it` to float32 (one IEEE rounding, as a float32 operation's result)."""
    return array("f", it)


def field(raw, nb, bs, off, n):
    """Bytes [off, off + n) of each of the nb blocks of bs bytes, concatenated."""
    if n == 1:
        return raw[off::bs]
    return b"".join([raw[i:i + n] for i in range(off, nb * bs, bs)])


def halves(raw, nb, bs, off):
    """fp16 field at `off` of every block, as Python floats (exact: GGML_FP16_TO_FP32)."""
    b = field(raw, nb, bs, off, 2)
    return struct.unpack(f"<{nb}e", b)


def interleave_nibbles(lo, hi, n):
    """Blocks of 16 bytes: 16 low nibbles then the 16 high nibbles of the same bytes (Q4_0, IQ4_NL, ...)."""
    return b"".join([lo[i:i + 16] + hi[i:i + 16] for i in range(0, n, 16)])


def dq_f32(raw, nb):
    return array("f", raw)


def dq_f16(raw, nb):
    return array("f", struct.unpack(f"<{nb}e", raw))


def dq_bf16(raw, nb):
    out = bytearray(2 * len(raw))            # the float32 bits are the bf16 bits followed by 16 zero bits
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return array("f", bytes(out))


def dq_q8_0(raw, nb):
    d = halves(raw, nb, 34, 0)
    q = array("b", field(raw, nb, 34, 2, 32))
    return f32(map(mul, q, rep(d, 32)))                  # y = qs[j] * d


def dq_q4_0(raw, nb):
    d = halves(raw, nb, 18, 0)
    qs = field(raw, nb, 18, 2, 16)
    q = array("b", interleave_nibbles(qs.translate(LO_M8), qs.translate(HI_M8), len(qs)))
    return f32(map(mul, q, rep(d, 32)))                  # y = (nibble - 8) * d


def dq_q4_1(raw, nb):
    d, m = halves(raw, nb, 20, 0), halves(raw, nb, 20, 2)
    qs = field(raw, nb, 20, 4, 16)
    q = interleave_nibbles(qs.translate(LO), qs.translate(HI), len(qs))
    return f32(map(add, f32(map(mul, q, rep(d, 32))), rep(m, 32)))   # y = x * d + m


def q5_codes(raw, nb, bs, qh_off, qs_off):
    qh = field(raw, nb, bs, qh_off, 4)               # element e's fifth bit is bit e of the LE uint32
    high = b"".join(map(EXPAND16.__getitem__, qh))
    qs = field(raw, nb, bs, qs_off, 16)
    low = interleave_nibbles(qs.translate(LO), qs.translate(HI), len(qs))
    return map(or_, low, high)


def dq_q5_0(raw, nb):
    d = halves(raw, nb, 22, 0)
    q = map(sub, q5_codes(raw, nb, 22, 2, 6), repeat(16))
    return f32(map(mul, q, rep(d, 32)))                  # y = (x - 16) * d


def dq_q5_1(raw, nb):
    d, m = halves(raw, nb, 24, 0), halves(raw, nb, 24, 2)
    q = q5_codes(raw, nb, 24, 4, 8)
    return f32(map(add, f32(map(mul, q, rep(d, 32))), rep(m, 32)))   # y = x * d + m


def dq_q2_k(raw, nb):
    sc = field(raw, nb, 84, 0, 16)
    d, dmin = halves(raw, nb, 84, 80), halves(raw, nb, 84, 82)
    dl = f32(map(mul, rep(d, 16), sc.translate(LO)))      # dl = d * (sc & 0xF)
    ml = f32(map(mul, rep(dmin, 16), sc.translate(HI)))   # ml = min * (sc >> 4)
    qs = field(raw, nb, 84, 16, 64)
    p = [qs.translate(t) for t in SHIFT2]
    q = b"".join([p[j][b + 32 * n:b + 32 * n + 32] for b in range(0, 64 * nb, 64) for n in (0, 1) for j in range(4)])
    return f32(map(sub, f32(map(mul, rep(dl, 16), q)), rep(ml, 16)))   # y = dl * q - ml


def q3_k_scales(s):
    a0, a1, tmp = struct.unpack("<3I", s)
    k1, k2 = 0x03030303, 0x0f0f0f0f
    r = struct.pack("<4I", (a0 & k2) | (((tmp >> 0) & k1) << 4), (a1 & k2) | (((tmp >> 2) & k1) << 4),
                    ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4), ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4))
    return [v - 32 for v in r]


def dq_q3_k(raw, nb):
    hm = field(raw, nb, 110, 0, 32)
    qs = field(raw, nb, 110, 32, 64)
    sc = field(raw, nb, 110, 96, 12)
    d = halves(raw, nb, 110, 108)
    scales = chain.from_iterable(q3_k_scales(sc[i:i + 12]) for i in range(0, 12 * nb, 12))
    dl = f32(map(mul, rep(d, 16), scales))                # dl = d_all * (scale - 32)
    p = [qs.translate(t) for t in SHIFT2]
    h = [hm.translate(t) for t in BIT4]
    low = b"".join([p[j][64 * i + 32 * n:64 * i + 32 * n + 32] for i in range(nb) for n in (0, 1) for j in range(4)])
    high = b"".join([h[4 * n + j][32 * i:32 * i + 32] for i in range(nb) for n in (0, 1) for j in range(4)])
    q = map(sub, map(or_, low, high), repeat(4))          # low 2 bits - (hmask bit ? 0 : 4)
    return f32(map(mul, rep(dl, 16), q))


def k4_scales_mins(s):
    """get_scale_min_k4 for j = 0..7 of one block's 12 scale bytes."""
    sc = [s[j] & 63 for j in range(4)] + [(s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4) for j in range(4, 8)]
    mn = [s[j + 4] & 63 for j in range(4)] + [(s[j + 4] >> 4) | ((s[j] >> 6) << 4) for j in range(4, 8)]
    return sc, mn


def k4_d1_m1(raw, nb, bs):
    d, dmin = halves(raw, nb, bs, 0), halves(raw, nb, bs, 2)
    s = field(raw, nb, bs, 4, 12)
    pairs = [k4_scales_mins(s[i:i + 12]) for i in range(0, 12 * nb, 12)]
    d1 = f32(map(mul, rep(d, 8), chain.from_iterable(p[0] for p in pairs)))      # d * sc
    m1 = f32(map(mul, rep(dmin, 8), chain.from_iterable(p[1] for p in pairs)))   # min * m
    return d1, m1


def dq_q4_k(raw, nb):
    d1, m1 = k4_d1_m1(raw, nb, 144)
    qs = field(raw, nb, 144, 16, 128)
    lo, hi = qs.translate(LO), qs.translate(HI)
    q = b"".join([x[b:b + 32] for b in range(0, 128 * nb, 32) for x in (lo, hi)])
    return f32(map(sub, f32(map(mul, rep(d1, 32), q)), rep(m1, 32)))   # y = d1 * q - m1


def dq_q5_k(raw, nb):
    d1, m1 = k4_d1_m1(raw, nb, 176)
    qh = field(raw, nb, 176, 16, 32)
    qs = field(raw, nb, 176, 48, 128)
    lo, hi = qs.translate(LO), qs.translate(HI)
    hb = [qh.translate(t) for t in BIT16]
    low = b"".join([x[128 * i + 32 * c:128 * i + 32 * c + 32] for i in range(nb) for c in range(4) for x in (lo, hi)])
    high = b"".join([hb[2 * c + k][32 * i:32 * i + 32] for i in range(nb) for c in range(4) for k in (0, 1)])
    q = map(or_, low, high)
    return f32(map(sub, f32(map(mul, rep(d1, 32), q)), rep(m1, 32)))


def dq_q6_k(raw, nb):
    ql = field(raw, nb, 210, 0, 128)
    qh = field(raw, nb, 210, 128, 64)
    sc = array("b", field(raw, nb, 210, 192, 16))
    d = halves(raw, nb, 210, 208)
    ds = f32(map(mul, rep(d, 16), sc))                    # d * sc[is], then * q
    lo, hi = ql.translate(LO), ql.translate(HI)
    h = [qh.translate(t) for t in QH6]
    low, high = [], []
    for i in range(nb):
        for n in (0, 1):
            a, b = 128 * i + 64 * n, 64 * i + 32 * n
            low += [lo[a:a + 32], lo[a + 32:a + 64], hi[a:a + 32], hi[a + 32:a + 64]]
            high += [h[0][b:b + 32], h[1][b:b + 32], h[2][b:b + 32], h[3][b:b + 32]]
    q = map(sub, map(or_, b"".join(low), b"".join(high)), repeat(32))
    return f32(map(mul, rep(ds, 16), q))


def dq_iq4_nl(raw, nb):
    d = halves(raw, nb, 18, 0)
    qs = field(raw, nb, 18, 2, 16)
    k = array("b", interleave_nibbles(qs.translate(IQ4_LO), qs.translate(IQ4_HI), len(qs)))
    return f32(map(mul, rep(d, 32), k))                   # y = d * kvalues_iq4nl[nibble]


def dq_iq4_xs(raw, nb):
    d = halves(raw, nb, 136, 0)
    sh = struct.unpack(f"<{nb}H", field(raw, nb, 136, 2, 2))
    sl = field(raw, nb, 136, 4, 4)
    ls = [(((sl[4 * i + ib // 2] >> 4 * (ib % 2)) & 0xf) | (((sh[i] >> 2 * ib) & 3) << 4)) - 32
          for i in range(nb) for ib in range(8)]
    dl = f32(map(mul, rep(d, 8), ls))                     # dl = d * (ls - 32)
    qs = field(raw, nb, 136, 8, 128)
    k = array("b", interleave_nibbles(qs.translate(IQ4_LO), qs.translate(IQ4_HI), len(qs)))
    return f32(map(mul, rep(dl, 32), k))


DEQUANTIZE = {"F32": dq_f32, "F16": dq_f16, "BF16": dq_bf16, "Q8_0": dq_q8_0, "Q4_0": dq_q4_0, "Q4_1": dq_q4_1,
              "Q5_0": dq_q5_0, "Q5_1": dq_q5_1, "Q2_K": dq_q2_k, "Q3_K": dq_q3_k, "Q4_K": dq_q4_k,
              "Q5_K": dq_q5_k, "Q6_K": dq_q6_k, "IQ4_NL": dq_iq4_nl, "IQ4_XS": dq_iq4_xs}
CHUNK_BLOCKS = 1 << 13


def dequantize(type_name, raw):
    """The float32 values ggml's to_float gives for `raw` (whole blocks of type `type_name`)."""
    if type_name not in DEQUANTIZE:
        fail(f"tensor type {type_name} is not supported", "gguf.dequantize", "one of " + ", ".join(SUPPORTED),
             type_name)
    qk, bs = BLOCKS[type_name]
    if len(raw) % bs:
        fail("tensor data is not whole blocks", "gguf.dequantize", f"a multiple of {bs} bytes ({type_name})", len(raw))
    nb = len(raw) // bs
    fn = DEQUANTIZE[type_name]
    if nb <= CHUNK_BLOCKS:
        return fn(bytes(raw), nb)
    out = array("f")
    for b in range(0, nb, CHUNK_BLOCKS):
        n = min(CHUNK_BLOCKS, nb - b)
        out.extend(fn(bytes(raw[b * bs:(b + n) * bs]), n))
    return out


# ----------------------------------------------------------------------------------------------
# A minimal writer (version 3, little-endian), for fixtures: tools/gguf_strip.py and the tests
# ----------------------------------------------------------------------------------------------

def _pack_value(vt, v):
    if vt in SCALAR_FMT:
        return struct.pack("<" + SCALAR_FMT[vt], v)
    if vt == VT_STRING:
        b = v.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    raise ValueError(f"cannot write value type {vt}")


def write_gguf(path, kv, tensors, alignment=DEFAULT_ALIGNMENT):
    """kv: [(key, type name as in GGUFFile.kv_types, e.g. 'uint32' or 'array[string]', value)];
    tensors: [(name, ggml type name, ne in ggml order, raw bytes)]."""
    vt_of = {n: i for i, n in enumerate(VT_NAMES)}
    type_id = {n: i for i, n in GGML_TYPE_NAMES.items()}
    out = [GGUF_MAGIC, struct.pack("<IQQ", 3, len(tensors), len(kv))]
    for key, tname, v in kv:
        out.append(_pack_value(VT_STRING, key))
        if tname.startswith("array["):
            et = vt_of[tname[6:-1]]
            out.append(struct.pack("<IIQ", VT_ARRAY, et, len(v)))
            out.extend(_pack_value(et, x) for x in v)
        else:
            out.append(struct.pack("<I", vt_of[tname]) + _pack_value(vt_of[tname], v))
    offset = 0
    for name, tname, ne, raw in tensors:
        out.append(_pack_value(VT_STRING, name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
                   + struct.pack("<IQ", type_id[tname], offset))
        offset += -(-len(raw) // alignment) * alignment
    head = b"".join(out)
    head += bytes(-len(head) % alignment)
    with open(path, "wb") as f:
        f.write(head)
        for name, tname, ne, raw in tensors:
            f.write(raw)
            f.write(bytes(-len(raw) % alignment))
