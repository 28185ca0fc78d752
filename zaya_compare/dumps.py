"""Dumps: reading and writing them, and checking that two of them can be compared.

A dump is a folder with index.json and one NumPy .npy file per tensor (docs/compare.md), or one
.safetensors file holding the same tensors with index.json's fields in its __metadata__
(docs/golden-formats.md). The writers (write_npy, write_dump) and read_npy work on array.array and need
only the standard library (tools/fixture_to_dump.py and tools/golden_hf.py use them); Dump.load, which
the comparisons use, gives numpy arrays mapped from the file (no copy of a 537 MB logits tensor).
"""
import array
import ast
import errno
import json
import math
import operator
import os
import struct
import sys

try:
    import numpy as np
except ImportError:     # compare.py says how to install it; the writers here do not need it
    np = None

from .names import STATE_SUFFIXES  # noqa: E402  (standard library only)

NEED_NUMPY = "compare.py needs numpy: apt-get install python3-numpy (or pip install numpy)"


class InputError(Exception):
    """Bad input (missing folder, bad .npy, shape mismatch): reported as a message, exit status 2."""


# ------------------------------------------------------------------------------------------------
# .npy files and dump folders

NPY_TYPES = {"<f4": "f", "<i4": "i", "<f8": "d", "<i8": "q"}


def file_name(name):
    """The file of a tensor: its name with ':' replaced by '~', plus '.npy'."""
    return name.replace(":", "~") + ".npy"


def npy_header(path):
    """(descr, fortran_order, shape, data offset) of a little-endian NumPy file (format 1.0/2.0/3.0), its
    data size checked against the shape."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(12)
            if raw[:6] == b"\x93NUMPY" and len(raw) >= 10:
                hlen = struct.unpack("<H", raw[8:10])[0] if raw[6] == 1 else \
                    struct.unpack("<I", raw[8:12])[0] if raw[6] in (2, 3) and len(raw) >= 12 else 0
                start = 10 if raw[6] == 1 else 12
                f.seek(start)
                text = f.read(min(hlen, 1 << 20))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    if raw[:6] != b"\x93NUMPY" or len(raw) < 10:
        raise InputError(f"{path} is not a NumPy .npy file (magic \\x93NUMPY missing)")
    if not (raw[6] == 1 or (raw[6] in (2, 3) and len(raw) >= 12)):
        raise InputError(f"{path}: unsupported .npy version {raw[6]}.{raw[7]} (expected 1.0)")
    try:
        header = ast.literal_eval(text.decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        raise InputError(f"{path}: unreadable .npy header {text[:120]!r}")
    if descr not in NPY_TYPES:
        raise InputError(f"{path}: dtype {descr!r} not supported (expected '<f4' or '<i4')")
    count = math.prod(shape)
    need = count * array.array(NPY_TYPES[descr]).itemsize
    if size - start - hlen != need:
        raise InputError(f"{path}: shape {list(shape)} needs {need} data bytes, "
                         f"found {size - start - hlen} (truncated or corrupt file)")
    return descr, fortran, shape, start + hlen


def read_npy(path):
    """(shape tuple, flat array.array in C order) of a little-endian NumPy file (format 1.0/2.0/3.0;
    fortran_order files are reordered). Standard library only; the comparisons use load_npy."""
    descr, fortran, shape, offset = npy_header(path)
    data = array.array(NPY_TYPES[descr])
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data.frombytes(f.read())
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    if sys.byteorder == "big":
        data.byteswap()
    if fortran:
        data = fortran_to_c(data, shape)
    return shape, data


def load_npy(path):
    """(shape tuple, numpy array of that shape in C order) of a .npy file, mapped read-only from the file."""
    descr, fortran, shape, offset = npy_header(path)
    if math.prod(shape) == 0:
        return shape, np.zeros(shape, dtype=descr)
    try:
        data = np.memmap(path, dtype=descr, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path}: {e}")
    return shape, (np.ascontiguousarray(data) if fortran else data)


def fortran_to_c(data, shape):
    """Column-major data -> row-major: row i of a Fortran array of shape [s0, ...] is data[i::s0]
    (itself column-major over the remaining axes)."""
    if len(shape) <= 1:
        return data
    out = array.array(data.typecode)
    for i in range(shape[0]):
        out.extend(fortran_to_c(data[i::shape[0]], shape[1:]))
    return out


def write_npy(path, shape, data):
    """Writes a float32 ('f') or int32 ('i') array.array as NumPy 1.0, header padded to 64 bytes."""
    descr = {"f": "<f4", "i": "<i4"}[data.typecode]
    shape_s = "(" + "".join(f"{d}, " for d in shape).rstrip(" ") + ")" if len(shape) != 1 else f"({shape[0]},)"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    if math.prod(shape) != len(data):
        raise ValueError(f"write_npy {path}: shape {shape} does not hold {len(data)} values")
    out = data
    if sys.byteorder == "big":
        out = array.array(data.typecode, data)
        out.byteswap()
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(out.tobytes())


def tensor_stats(data):
    """{min, max, mean, rms, nan, inf} of the finite values (None when there are none)."""
    vals = [v for v in data if math.isfinite(v)] if data.typecode in "fd" else list(data)
    nan = sum(1 for v in data if v != v) if data.typecode in "fd" else 0
    inf = len(data) - len(vals) - nan
    if not vals:
        return {"min": None, "max": None, "mean": None, "rms": None, "nan": nan, "inf": inf}
    n = len(vals)
    return {"min": min(vals), "max": max(vals), "mean": math.fsum(vals) / n,
            "rms": math.sqrt(math.fsum(map(operator.mul, vals, vals)) / n), "nan": nan, "inf": inf}


def write_dump(out_dir, tensors, meta):
    """Writes a dump folder: tensors = list of (name, shape, array.array 'f'/'i'[, extra dict]) in
    execution order, meta = the index.json fields other than `tensors` (format_version is added).
    `extra` (e.g. {"source": ..., "derived": ...}) is merged into the tensor's index entry."""
    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for order, (name, shape, data, *extra) in enumerate(tensors):
        fname = file_name(name)
        write_npy(os.path.join(out_dir, fname), shape, data)
        entry = {"name": name, "file": fname, "shape": list(shape),
                 "dtype": "float32" if data.typecode == "f" else "int32", "order": order,
                 "stats": tensor_stats(data)}
        for e in extra:
            entry.update(e)
        entries.append(entry)
    index = {"format_version": 1}
    index.update(meta)
    index["tensors"] = entries
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


# safetensors (https://github.com/huggingface/safetensors, README "Format" and safetensors/src/tensor.rs):
# 8 bytes little-endian u64 N, N bytes of a UTF-8 JSON object {name: {dtype, shape, data_offsets: [begin,
# end]}, "__metadata__": {str: str}} (trailing spaces allowed), then the data buffer; offsets are relative
# to the buffer, the tensors cover it exactly (no holes, no overlap), little-endian, C order.
ST_DTYPES = {"F32": ("f", 4), "I32": ("i", 4), "F64": ("d", 8), "I64": ("q", 8), "F16": ("e", 2), "BF16": ("bf16", 2)}
ST_MAX_HEADER = 100_000_000


class Incomplete(InputError):
    """A dump cut short or not finished (index.json missing, a safetensors header not written or data missing)."""


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise InputError("duplicate key " + repr(next(k for k in keys if keys.count(k) > 1)))
    return dict(pairs)


def read_safetensors_header(path, label="the"):
    """(data start, {name: (dtype, shape, begin, end)} in offset order, __metadata__ dict) of a safetensors
    file, checked like the reference reader: header length, UTF-8 JSON object, str->str metadata, known
    dtypes, offsets contiguous from 0 with end - begin = bytes of the shape, the file exactly as long as
    the header says. A file whose header length is still 0 (zaya writes the header last) or that is
    shorter than its header says raises Incomplete."""
    hint = "\n  hint: the run that wrote it was interrupted or failed; write the dump again"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            text = f.read(n) if n and n <= ST_MAX_HEADER else b""
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    if n is None:
        raise Incomplete(f"{label} dump {path} is incomplete: {size} bytes, shorter than the 8-byte header length" + hint)
    if n == 0:
        raise Incomplete(f"{label} dump {path} is incomplete: its header length is 0 (./zaya writes the header "
                         f"last, so the run did not finish)" + hint)
    if n > ST_MAX_HEADER:
        raise InputError(f"{path}: header length {n} is over the format's limit of {ST_MAX_HEADER} bytes "
                         f"(not a safetensors file?)")
    if len(text) < n:
        raise Incomplete(f"{label} dump {path} is incomplete: cut short inside its {n}-byte header "
                         f"({size} bytes in the file)" + hint)
    try:
        s = text.decode("utf-8")
        if not s.startswith("{"):
            raise ValueError("the header does not start with '{'")
        obj = json.loads(s, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, InputError) as e:
        raise InputError(f"{path}: the safetensors header is not a valid UTF-8 JSON object ({e})")
    meta = obj.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise InputError(f"{path}: __metadata__ must map strings to strings")
    tensors = []
    for name, info in obj.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = dtype in ST_DTYPES and all(type(d) is int and d >= 0 for d in shape) and \
                type(begin) is int and type(end) is int and 0 <= begin <= end
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise InputError(f"{path}: tensor {name}: expected {{dtype ({'/'.join(ST_DTYPES)}), shape, "
                             f"data_offsets [begin, end]}}, found {str(info)[:200]}")
        tensors.append((begin, end, name, dtype, list(shape)))
    tensors.sort()
    pos = 0
    for begin, end, name, dtype, shape in tensors:
        if begin != pos:
            raise InputError(f"{path}: tensor {name} starts at {begin}, expected {pos} (the data must be covered "
                             f"without holes or overlap)")
        if end - begin != math.prod(shape) * ST_DTYPES[dtype][1]:
            raise InputError(f"{path}: tensor {name}: {dtype} {shape} needs {math.prod(shape) * ST_DTYPES[dtype][1]} "
                             f"bytes, data_offsets give {end - begin}")
        pos = end
    if 8 + n + pos > size:
        raise Incomplete(f"{label} dump {path} is incomplete: cut short, {size} bytes of the {8 + n + pos} its "
                         f"header describes" + hint)
    if 8 + n + pos < size:
        raise InputError(f"{path}: {size - 8 - n - pos} bytes after the last tensor (the header describes "
                         f"{8 + n + pos} bytes)")
    return 8 + n, {name: (dtype, shape, begin, end) for begin, end, name, dtype, shape in tensors}, meta


ST_NUMPY = {"F32": "<f4", "I32": "<i4", "F64": "<f8", "I64": "<i8", "F16": "<f2", "BF16": "<u2"}


def load_safetensors_tensor(path, offset, dtype, shape, label, name):
    """A tensor of a safetensors file as a numpy array (mapped; F16 and BF16 widened to float32)."""
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype=np.float32 if dtype in ("F16", "BF16") else ST_NUMPY[dtype])
    try:
        data = np.memmap(path, dtype=ST_NUMPY[dtype], mode="r", offset=offset, shape=tuple(shape))
    except ValueError:
        raise Incomplete(f"{label} dump {path} is incomplete: cut short inside tensor {name}")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    if dtype == "F16":
        return data.astype(np.float32)
    if dtype == "BF16":
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data


def safetensors_index(path, meta, header):
    """The index.json fields of a safetensors dump: from __metadata__ where zaya.c put them (each field as
    JSON text, plain strings as they are), else the header's tensors in offset order."""
    index = {}
    for key, value in meta.items():
        if key in ("format_version", "producer", "model", "weight_format", "tokens", "tensors", "replay", "image_positions",
                   "images"):
            try:
                value = json.loads(value)
            except ValueError:
                if key in ("tokens", "tensors"):
                    raise InputError(f"{path}: __metadata__ {key} is not JSON text")
        index[key] = value
    st_dtype = {"F32": "float32", "I32": "int32", "F64": "float64", "I64": "int64", "F16": "float16", "BF16": "bfloat16"}
    listed = index.get("tensors") if isinstance(index.get("tensors"), list) else []
    names = {t.get("name") for t in listed if isinstance(t, dict)}
    index["tensors"] = list(listed) + [{"name": name, "shape": shape, "dtype": st_dtype[dtype]}
                                       for name, (dtype, shape, _, _) in header.items() if name not in names]
    for t in index["tensors"]:
        if isinstance(t, dict) and t.get("name") not in header:
            raise InputError(f"{path}: __metadata__ lists tensor {t.get('name')} but the header has no such tensor")
    return index




class Dump:
    """A dump, a folder (index.json + one .npy per tensor) or one .safetensors file: the index, the tensor
    names in execution order, and lazy tensor loading."""

    def __init__(self, folder, label):
        self.folder, self.label = folder, label
        self.st = None          # safetensors: (data start, {name: (dtype, shape, begin, end)})
        if os.path.isfile(folder):
            start, header, meta = read_safetensors_header(folder, label)
            self.st = (start, header)
            self.index = safetensors_index(folder, meta, header)
            path = folder
        elif not os.path.isdir(folder):
            raise InputError(f"{label} dump {folder} does not exist (neither a folder nor a .safetensors file)\n"
                             f"  hint: write one with ./zaya MODEL.bin --ids 2,818,... --dump {folder}")
        else:
            path = os.path.join(folder, "index.json")
            try:
                with open(path) as f:
                    self.index = json.load(f)
            except OSError as e:
                npys = [n for n in os.listdir(folder) if n.endswith(".npy")] if e.errno == errno.ENOENT else []
                if e.errno == errno.ENOENT and "hidden_states.npy" in npys and os.path.isdir(os.path.join(folder, "taps")):
                    raise InputError(f"{label} dump {folder} is a fixture folder (test/fixtures/golden layout: "
                                     f"hidden_states.npy, taps/, no dump index.json), not a dump\n"
                                     f"  expected: a dump (index.json + one .npy per tensor under its HF name, "
                                     f"docs/compare.md)\n  hint: convert it first: python3 tools/fixture_to_dump.py "
                                     f"{folder} OUT_DUMP, then compare OUT_DUMP")
                if npys:
                    raise Incomplete(f"{label} dump {folder} is incomplete: {len(npys)} .npy files but no index.json, "
                                     f"which ./zaya writes last\n  hint: the run that wrote it was interrupted or "
                                     f"failed; write the dump again")
                raise InputError(f"cannot read {path}: {e.strerror}\n  hint: a dump folder holds index.json "
                                 f"and one .npy per tensor (docs/compare.md)")
            except ValueError as e:
                raise InputError(f"{path} is not valid JSON: {e}")
        tensors = self.index.get("tensors") if isinstance(self.index, dict) else None
        if not isinstance(tensors, list):
            raise InputError(f"{path}: no `tensors` list (expected the format of docs/compare.md)")
        self.entries, self.order = {}, []
        for i, t in enumerate(tensors):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise InputError(f"{path}: tensors[{i}] has no string `name`")
            if not isinstance(t.get("file", ""), str) or not isinstance(t.get("shape", []), list):
                raise InputError(f"{path}: tensors[{i}] ({t['name']}): `file` must be a string and `shape` a list")
            if t["name"] in self.entries:
                raise InputError(f"{path}: tensor {t['name']} is listed twice")
            self.entries[t["name"]] = t
            self.order.append(t["name"])
        tokens = self.index.get("tokens")
        self.tokens = list(tokens) if isinstance(tokens, list) else None
        self.skip = self.index.get("skip_expert")
        self.image_positions = image_positions_of(self.index, path)
        wf = self.index.get("weight_format")
        self.weights = (wf.get("dtype") if isinstance(wf, dict) else wf) or "fp32"
        self._cache = {}

    def has(self, name):
        return name in self.entries

    def load(self, name, keep=False):
        """(shape tuple, numpy array of that shape) of a tensor; checks the shape against index.json."""
        if name in self._cache:
            return self._cache[name]
        entry = self.entries[name]
        if self.st:
            start, header = self.st
            dtype, shape, begin, end = header[name]
            shape, fname = tuple(shape), os.path.basename(self.folder)
            data = load_safetensors_tensor(self.folder, start + begin, dtype, shape, self.label, name)
        else:
            fname = entry.get("file") or file_name(name)
            shape, data = load_npy(os.path.join(self.folder, fname))
        if "shape" in entry and list(entry["shape"]) != list(shape):
            raise InputError(f"{self.label} {name}: {'__metadata__' if self.st else 'index.json'} says shape {entry['shape']}, "
                             f"{fname} holds {list(shape)}")
        if keep:
            self._cache[name] = (shape, data)
        return shape, data

    def producer(self):
        p = self.index.get("producer")
        if isinstance(p, dict):
            return " ".join(str(p[k]) for k in ("program", "version", "commit") if p.get(k))
        return str(p) if p else "unknown producer"



def image_positions_of(index, path):
    """ZAYA1-VL: the set of positions that take image features, from index.json's `image_positions` ([first, end)
    ranges, docs/golden-formats.md); empty for a text dump."""
    ranges = index.get("image_positions") if isinstance(index, dict) else None
    if ranges is None:
        return frozenset()
    if not isinstance(ranges, list) or not all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r)
                                               and 0 <= r[0] <= r[1] for r in ranges):
        raise InputError(f"{path}: image_positions is {str(ranges)[:80]}\n  expected: a list of [first, end) position "
                         f"ranges, e.g. [[2, 37]] (docs/golden-formats.md)")
    return frozenset(t for a, b in ranges for t in range(a, b))


def need_router_indices(d, view):
    """Raises InputError when a dump has a MoE layer's output but not its routing (mlp.gate.router_indices):
    without it a routing flip at a near-tie cannot be told from a bug, and every row after it looks like one."""
    missing = sorted({int(n.split(".")[2]) for n in d.order if n.startswith("model.layers.") and n.endswith(".mlp.experts")
                      and not d.has(n[:-len("experts")] + "gate.router_indices")})
    if missing:
        name = f"model.layers.{missing[0]}.mlp.gate.router_indices"
        raise InputError(f"{d.label} {d.folder} has no {name}"
                         + (f" (nor for layers {missing[1:]})" if len(missing) > 1 else "")
                         + f"\n  {view} needs each MoE layer's chosen experts: bf16 moves router margins, and a position "
                           f"routed to another expert at a near-tie is legitimate, but without the indices it cannot be "
                           f"recognised and every later row would look like a bug\n"
                           f"  hint: dump the router's top-1 expert per position as {name} (int32 [T]); "
                           f"docs/compare.md §9's forward-hook example shows it")


def position_text(d, t):
    """"position t (token id X)": a position of dump d, with the token id at it when index.json has `tokens`, and
    ", an image position" where the dump's image_positions (ZAYA1-VL) hold it."""
    toks = d.tokens if d is not None else None
    image = d is not None and t in getattr(d, "image_positions", ())
    return (f"position {t}" + (f" (token id {toks[t]}{', an image position' if image else ''})"
                               if toks and 0 <= t < len(toks) else ", an image position" if image else ""))


def worst_position(port, ref, name, skip=()):
    """The position of a tap where the port is furthest from ref: for a float tap the row with the largest row
    error (||a_t - b_t|| / max(||b_t||, 0.1 rowrms(b)), docs/compare.md §3), for an integer tap (router_indices)
    the first that differs; positions in `skip` (near-tie flips) left out. "position t (token id X)", or None."""
    if port is None or ref is None or not (port.has(name) and ref.has(name)):
        return None
    sa, a = port.load(name)
    sb, b = ref.load(name)
    rows = min(sa[0], sb[0]) if sa and sb else 1
    n = min(a.size // max(sa[0] if sa else 1, 1), b.size // max(sb[0] if sb else 1, 1))
    integer = a.dtype.kind in "iu" or b.dtype.kind in "iu"
    a = a.reshape(sa[0] if sa else 1, -1)[:rows, :n].astype(np.float64)
    b = b.reshape(sb[0] if sb else 1, -1)[:rows, :n].astype(np.float64)
    keep = np.array([t not in skip for t in range(rows)], dtype=bool)
    if name.endswith(STATE_SUFFIXES) or not keep.any():      # a state holds the last rows, not one per position
        return None
    if integer:
        differ = np.flatnonzero((a != b).any(axis=1) & keep)
        return position_text(port, int(differ[0])) if differ.size else None
    d = np.sqrt(np.square(a - b).sum(axis=1))
    nb = np.sqrt(np.square(b).sum(axis=1))
    floor = max(0.1 * math.sqrt(float(np.square(nb).sum()) / max(rows, 1)), 1e-30)
    err = np.where(np.isfinite(d), d / np.maximum(nb, floor), np.inf)
    err[~keep] = -1.0
    return position_text(port, int(np.argmax(err)))


def declared_weights(d):
    """What a port's dump declares of its weights (a map's `weights` field, written by portmap into index.json's
    weight_format): {"type", "quantized", "note"}, or None when nothing is declared."""
    wf = d.index.get("weight_format") if d is not None else None
    if not isinstance(wf, dict) or "quantized" not in wf:
        return None
    return {"type": wf.get("port_type"), "quantized": bool(wf.get("quantized")), "note": wf.get("note")}


def own_weights(provenance):
    """Whether a blob's provenance (export_weights.py) says it holds a port's own weights: --weights PORT.safetensors,
    a GGUF, or a quantized checkpoint's experts."""
    p = provenance if isinstance(provenance, dict) else {}
    return bool(p.get("weights") or p.get("experts") or "gguf" in str(p.get("layout", "")).lower()
                or str(p.get("source", "")).lower().endswith(".gguf"))


def model_dims(d):
    """{dimension: (value, the tensor it is read from)} from the shapes in a dump's index: hidden size, vocabulary,
    experts (+ skip), query heads x head dim."""
    def width(name):
        e = d.entries.get(name)
        return e["shape"][-1] if e and e["shape"] else None
    dims = {}
    for key, names in (("hidden size", ["model.norm", "model.embed_tokens"] + [f"model.layers.{i}.post_mlp_residual_scale"
                                                                              for i in range(4)]),
                       ("vocabulary", ["logits"]), ("router width", ["model.layers.0.mlp.gate:router_probs"]),
                       ("q_proj width", ["model.layers.0.self_attn.qkv_proj.q_proj"])):
        for n in names:
            if width(n) is not None:
                dims[key] = (width(n), n)
                break
    return dims


def same_model(a, b):
    """Raises InputError, before any tensor is compared, when two dumps are of models of different shapes
    (index.json's `model` says which model each is)."""
    da, db = model_dims(a), model_dims(b)
    diff = [(k, da[k], db[k]) for k in da if k in db and da[k][0] != db[k][0] and da[k][1] == db[k][1]]
    if diff:
        def who(d):
            m = d.index.get("model")
            if isinstance(m, dict):
                prov = m.get("provenance") if isinstance(m.get("provenance"), dict) else {}
                return m.get("path") or m.get("checkpoint") or prov.get("source") or "?"
            return str(m) if m else "index.json names no model"
        raise InputError(f"{a.label} {a.folder} and {b.label} {b.folder} are dumps of different models: "
                         + "; ".join(f"{k} {x[0]} vs {y[0]} ({x[1]})" for k, x, y in diff)
                         + f"\n  {a.label}'s model: {who(a)}\n  {b.label}'s model: {who(b)}"
                         + "\n  hint: dump both runs from the same checkpoint (./zaya MODEL.bin / tools/golden_hf.py "
                           "of the same folder) and the same --ids")


def guarded(work):
    """(work(), None); or, on bad input (and input this tool did not anticipate), a message on stderr and
    (None, 2): exit status 2, never a traceback."""
    try:
        return work(), None
    except InputError as e:
        print(f"compare.py: {e}", file=sys.stderr)
    except MemoryError:
        print("compare.py: out of memory while reading a tensor", file=sys.stderr)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, ZeroDivisionError) as e:
        print(f"compare.py: cannot compare these dumps ({type(e).__name__}: {e})\n  hint: check the index.json "
              f"files against docs/compare.md", file=sys.stderr)
    return None, 2
