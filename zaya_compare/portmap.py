#!/usr/bin/env python3
"""zaya_compare.portmap - a port's own tensors under zaya.c's names, by a name map written as data.

    python3 -m zaya_compare.portmap MAP.json RAW_CAPTURE OUT_DUMP [--layers N] [--dim NAME=SIZE ...]
    python3 -m zaya_compare.portmap MAP.json --regex          # the regex of the port names the map reads
    python3 -m zaya_compare.portmap MAP.json --check          # validate the map alone

A port names its tensors its own way (llama.cpp: `attn_out-12`, legacy half-layer 12, in ggml's reversed
shape; an MLX port: `blocks.6.attn.q` as [B, heads, T, d]). A map (docs/compare.md §9) lists, per port
tensor, the zaya.c dump name (HF module path, docs/compare.md §2) it stands for, its axes, and whether it
EQUALS that tap (same quantity at the same place: judged) or only APPROXIMATES it (a cast, another
placement: written to OUT_DUMP/approximate/, shown but never judged as exact). RAW_CAPTURE is a folder of
the port's tensors as .npy under the port's own names plus an index.json with at least `tokens`
(tools/llama_capture.cpp writes one for llama.cpp). OUT_DUMP is a zaya.c dump: one .npy per tensor under
§1's file-name rule and an index.json with the ids, the model, the precision and the port's commit, ready
for `./zaya MODEL --replay OUT_DUMP` and `compare.py --local`.

Map format (JSON):
  {"format": "zaya-portmap/1",
   "port": {"name": ..., "commit": ..., ...},        free-form, copied into the dump's producer
   "order": "numpy" | "ggml",                        how `axes` lists a tensor's axes (below)
   "precision": "fp32" | "bf16",                     how the port computes (the replay's precision)
   "skip_expert": "zero" | "passthrough",            the port's skip-class semantics (default zero)
   "weights": "exact" | "quantized" | TYPE | {"type": TYPE, "note": ...},   the port's weights (optional): a
                                                     quantized port needs its own weights in --local and --quant
   "tensors": [{"port": "attn_out-{2i}", "name": "model.layers.{i}.self_attn.o_proj", "axes": "H T",
                "match": "equals" | "approximates", "why": ..., "layers": "1:", "slice": {"T": "1:"}}],
   "unmapped": [{"port": ..., "why": ...}]}          port tensors with no zaya.c tap, and why
  {i} is the native layer (0..L-1); {2i}, {2i+1}, {i+1}, {3i+2}: any a*i+b. `layers` restricts an entry to
  some layers: an index ("0", "-1" = the last) or a Python slice ("1:", ":-1"). `axes`: the tensor's axes,
  slowest first ("numpy": the .npy's shape as written) or fastest first ("ggml": ggml's ne order; the
  capture writes ne reversed, so a ggml tensor of ne [n_embd, n_tokens] is "H T" in ggml order). Axis
  names: T positions, H hidden, nq, nkv query/KV heads, d head_dim, C conv channels ((nq+nkv)d), dv the
  v_proj width (nkv d/2), R router width, E experts, E1 router classes (E+1), V vocabulary; "(nq d)" is
  one axis holding nq x d (listed in the same order as the rest); any other name (B, S, k, 1) is an axis
  of size 1 that is dropped. `slice` cuts a named axis before the transpose (the port's depthwise conv
  output has one position more). Sizes come from the shapes themselves; --dim fixes one that cannot.
numpy is required (docs/compare.md §9).
"""
import argparse
import json
import os
import re
import sys

import numpy as np

from .dumps import InputError, file_name
from .names import DEPS, GLOBAL_FIRST, GLOBAL_LAST, LAYER_TENSORS

FORMAT = "zaya-portmap/1"


class MapError(InputError):
    """A usage or input error: printed as a message, exit status 2 (never a traceback)."""


# zaya.c's dump names (docs/compare.md §2) and their axes, slowest first. `{L}` = model.layers.{i}.
_P = r"^model\.layers\.\d+\."
TARGETS = [
    (r"^model\.embed_tokens$|^model:input_scaled$|^model\.norm$", "T H"),
    (_P + r"(input_layernorm|self_attn\.o_proj|post_attention_residual_scale|post_attention_layernorm|mlp\.experts|"
     r"post_mlp_residual_scale)$", "T H"),
    (_P + r"self_attn\.qkv_proj\.q_proj$", "T (nq d)"),
    (_P + r"self_attn\.qkv_proj\.k_proj$", "T (nkv d)"),
    (_P + r"self_attn\.qkv_proj\.conv_qk_(depthwise|grouped)$", "T C"),
    (_P + r"self_attn[.:](qkv_proj:query_residual|qkv_proj:query|qk_norm:query|query_after_rope)$", "T nq d"),
    (_P + r"self_attn[.:](qkv_proj:key_residual|qkv_proj:key|qk_norm:key|key_after_rope)$", "T nkv d"),
    (_P + r"self_attn\.qkv_proj\.v_proj_(current|delayed)$", "T dv"),
    (_P + r"self_attn\.qkv_proj:value$", "T nkv d"),
    (_P + r"self_attn:attn_output$", "T (nq d)"),
    (_P + r"mlp\.gate(\.down_proj|:router_state|\.router_mlp\.norm|\.router_mlp\.fc1|\.router_mlp\.fc2|"
     r"\.router_mlp\.act_fn:fc1|\.router_mlp\.act_fn:fc2)$", "T R"),
    (_P + r"mlp\.gate(\.router_mlp|:router_probs|:router_scores)$", "T E1"),
    (_P + r"mlp\.gate(\.router_indices|:router_weight|:router_margin)$", "T"),
    (r"^logits$", "T V"),
]
TARGETS = [(re.compile(r), a) for r, a in TARGETS]
INT_TARGETS = re.compile(r"\.router_indices$")
KNOWN = ("T", "H", "nq", "nkv", "d", "C", "dv", "R", "E", "E1", "V")
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
TERM = re.compile(r"^\s*(?:(\d*)\s*\*?\s*i|(\d+))\s*(?:([+-])\s*(\d+))?\s*$")


def target_axes(name):
    for rx, axes in TARGETS:
        if rx.search(name):
            return axes
    return None


def parse_axes(text, where):
    """'T (nq d) S' -> [['T'], ['nq', 'd'], ['S']] (slowest first as written)."""
    out, group = [], None
    for tok in re.findall(r"\(|\)|[A-Za-z0-9_]+|\S", text or ""):
        if tok == "(":
            if group is not None:
                raise MapError(f"{where}: axes {text!r}: nested parentheses")
            group = []
        elif tok == ")":
            if not group:
                raise MapError(f"{where}: axes {text!r}: an empty or unopened group")
            out.append(group)
            group = None
        elif re.fullmatch(r"[A-Za-z0-9_]+", tok):
            if group is not None:
                group.append(tok)
            else:
                out.append([tok])
        else:
            raise MapError(f"{where}: axes {text!r}: unexpected {tok!r}\n  hint: axis names separated by spaces, "
                           f"e.g. \"T (nq d)\"")
    if group is not None or not out:
        raise MapError(f"{where}: axes {text!r}: unbalanced or empty")
    return out


def expand(pattern, i, where):
    """'attn_out-{2i}' at layer i -> 'attn_out-12'."""
    def sub(m):
        t = TERM.match(m.group(1))
        if not t:
            raise MapError(f"{where}: placeholder {{{m.group(1)}}} is not a*i+b\n  hint: {{i}}, {{2i}}, {{2i+1}}, {{i-1}}")
        if t.group(2) is not None and t.group(1) is None:
            v = int(t.group(2))
        else:
            v = int(t.group(1) or 1) * i
        if t.group(3):
            v += int(t.group(4)) * (1 if t.group(3) == "+" else -1)
        return str(v)
    return PLACEHOLDER.sub(sub, pattern)


def layer_set(spec, n_layers, where):
    if spec is None or spec == "all":
        return range(n_layers)
    s = str(spec).strip()
    try:
        if ":" in s:
            a, b = (p.strip() for p in s.split(":", 1))
            return range(n_layers)[slice(int(a) if a else None, int(b) if b else None)]
        k = int(s)
        return [range(n_layers)[k]] if -n_layers <= k < n_layers else []
    except ValueError:
        raise MapError(f"{where}: layers {spec!r}: expected an index (\"0\", \"-1\") or a slice (\"1:\", \":-1\")")


# a map's `weights` type that holds the checkpoint's values (any other type is a quantization)
EXACT_WEIGHTS = ("exact", "checkpoint", "f32", "fp32", "bf16", "f16", "fp16")


def load_map(path):
    try:
        with open(path) as f:
            m = json.load(f)
    except OSError as e:
        raise MapError(f"cannot read the map {path}: {e.strerror}")
    except ValueError as e:
        raise MapError(f"the map {path} is not valid JSON: {e}")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise MapError(f"{path}: not a port map (expected \"format\": \"{FORMAT}\", found "
                       f"{m.get('format') if isinstance(m, dict) else type(m).__name__!r})\n  hint: docs/compare.md §9")
    if m.get("order", "numpy") not in ("numpy", "ggml"):
        raise MapError(f"{path}: order {m.get('order')!r}: expected \"numpy\" or \"ggml\"")
    if m.get("precision", "fp32") not in ("fp32", "bf16"):
        raise MapError(f"{path}: precision {m.get('precision')!r}: expected \"fp32\" or \"bf16\"")
    w = m.get("weights")
    if w is not None and not (isinstance(w, str) and w or isinstance(w, dict) and isinstance(w.get("type"), str)
                              and set(w) <= {"type", "note"}):
        raise MapError(f"{path}: weights {w!r}: expected a type (\"exact\", \"quantized\", \"Q4_K_M\", ...) or "
                       f"{{\"type\": ..., \"note\": ...}}\n  hint: docs/compare.md §9 (maps)")
    if not isinstance(m.get("tensors"), list) or not m["tensors"]:
        raise MapError(f"{path}: no `tensors` list")
    for k, e in enumerate(m["tensors"]):
        where = f"{path}: tensors[{k}]"
        if not isinstance(e, dict) or not isinstance(e.get("port"), str) or not isinstance(e.get("name"), str):
            raise MapError(f"{where}: needs string `port` and `name`")
        where += f" ({e['port']} -> {e['name']})"
        unknown = set(e) - {"port", "name", "axes", "match", "why", "layers", "slice", "code"}
        if unknown:
            raise MapError(f"{where}: unknown field(s) {sorted(unknown)}\n  hint: port, name, axes, match, why, layers, "
                           f"slice, code")
        if e.get("match", "equals") not in ("equals", "approximates"):
            raise MapError(f"{where}: match {e.get('match')!r}: expected \"equals\" or \"approximates\"")
        if e.get("match") == "approximates" and not e.get("why"):
            raise MapError(f"{where}: an approximate entry must say `why` (what the port does differently)")
        tgt = target_axes(expand(e["name"], 0, where))
        if tgt is None:
            raise MapError(f"{where}: {e['name']} is not a zaya.c dump name of docs/compare.md §2 with a known layout")
        src = parse_axes(e.get("axes"), where)
        if m.get("order") == "ggml":     # fastest first: reverse the axes and each group
            src = [g[::-1] for g in src[::-1]]
        flat_src = [a for g in src for a in g]
        for a in (x for g in parse_axes(tgt, where) for x in g):
            if a not in flat_src:
                raise MapError(f"{where}: axes {e.get('axes')!r} lack {a!r}, which {e['name']} has ({tgt}, slowest first)")
        dup = {a for a in flat_src if flat_src.count(a) > 1}
        if dup:
            raise MapError(f"{where}: axes {e.get('axes')!r} name {sorted(dup)} twice")
        for ax, sl in (e.get("slice") or {}).items():
            if [ax] not in src or not re.fullmatch(r"-?\d*:-?\d*", str(sl)):
                raise MapError(f"{where}: slice {{{ax!r}: {sl!r}}}: expected a plain axis of `axes` and \"a:b\"")
        e["_src"], e["_tgt"] = src, parse_axes(tgt, where)
    return m


def regex_of(m):
    """One regex matching every port tensor name the map reads (placeholders as digits)."""
    alts = []
    for e in m["tensors"]:
        parts = PLACEHOLDER.split(e["port"])
        rx = "".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", p) if k % 2 == 0 else "[0-9]+"
                     for k, p in enumerate(parts))
        if rx not in alts:
            alts.append(rx)
    return "^(" + "|".join(alts) + ")$"


def read_capture(folder):
    path = os.path.join(folder, "index.json")
    try:
        with open(path) as f:
            idx = json.load(f)
    except OSError as e:
        raise MapError(f"cannot read {path}: {e.strerror}\n  hint: a raw capture is a folder of .npy files under the "
                       f"port's names and an index.json with at least `tokens`")
    except ValueError as e:
        raise MapError(f"{path} is not valid JSON: {e}")
    tokens = idx.get("tokens") if isinstance(idx, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        raise MapError(f"{path}: no `tokens` list of ids\n  hint: the ids the port ran, e.g. \"tokens\": [2, 818, 2255]")
    files = {}
    for t in idx.get("tensors") or []:
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            files[t["name"]] = os.path.join(folder, t.get("file") or t["name"] + ".npy")
    if not idx.get("tensors"):      # no list: every .npy file is a tensor named by its file
        for fn in os.listdir(folder):
            if fn.endswith(".npy"):
                files[fn[:-4].replace("~", ":")] = os.path.join(folder, fn)
    return idx, files


def load_npy(path, name):
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise MapError(f"cannot read the port's {name} from {path}: {e}")
    return a


def infer_dims(jobs, T, given):
    """Sizes of the named axes from the port's shapes: {name: size}. Raises on a conflict."""
    dims = dict(given)
    dims.setdefault("T", T)
    eqs = []
    for job in jobs:
        e = job["entry"]
        src = job["src"]
        for g, n in zip(src, job["shape"]):
            if len(g) == 1 and g[0] in (e.get("slice") or {}):
                continue
            eqs.append((g, n, job))
    changed = True
    while changed:
        changed = False
        for g, n, job in eqs:
            known = [a for a in g if a in dims or a not in KNOWN]
            unknown = [a for a in g if a not in known]
            prod = 1
            for a in known:
                prod *= dims.get(a, 1)
            if len(unknown) == 1:
                if prod == 0 or n % prod:
                    raise MapError(f"{job['port']} ({job['entry']['name']}): axis {'('+' '.join(g)+')'} has {n} values, "
                                   f"not a multiple of {prod}\n  hint: check `axes` in the map")
                dims[unknown[0]] = n // prod
                changed = True
        if "C" not in dims and all(k in dims for k in ("nq", "nkv", "d")):
            dims["C"] = (dims["nq"] + dims["nkv"]) * dims["d"]; changed = True
        if "dv" not in dims and all(k in dims for k in ("nkv", "d")):
            dims["dv"] = dims["nkv"] * dims["d"] // 2; changed = True
        if "E1" not in dims and "E" in dims:
            dims["E1"] = dims["E"] + 1; changed = True
        if "E" not in dims and "E1" in dims:
            dims["E"] = dims["E1"] - 1; changed = True
    for g, n, job in eqs:
        prod = 1
        for a in g:
            if a in dims or a not in KNOWN:
                prod *= dims.get(a, 1)
            else:
                raise MapError(f"{job['port']} ({job['entry']['name']}): the size of {a!r} is not known from the "
                               f"capture\n  hint: --dim {a}=SIZE")
        if prod != n:
            raise MapError(f"{job['port']} ({job['entry']['name']}): axis {'('+' '.join(g)+')'} has {n} values, but "
                           + " x ".join(f"{a}={dims.get(a, 1)}" for a in g) + f" = {prod}\n  hint: the map's `axes` "
                           f"for this tensor, or the sizes the other tensors give ({', '.join(f'{k}={v}' for k, v in sorted(dims.items()))})")
    for name, rel in (("C", lambda d: (d["nq"] + d["nkv"]) * d["d"]), ("dv", lambda d: d["nkv"] * d["d"] // 2),
                      ("E1", lambda d: d["E"] + 1)):
        try:
            want = rel(dims)
        except KeyError:
            continue
        if name in dims and dims[name] != want:
            raise MapError(f"the capture's sizes disagree: {name} = {dims[name]} but the other axes give {want}\n  "
                           f"hint: a map entry names the wrong axes")
    return dims


def transform(job, dims):
    """The port's array -> zaya.c's layout: slice, drop size-1 axes, transpose, reshape."""
    a, src, tgt, e = job["array"], job["src"], job["tgt"], job["entry"]
    for ax, sl in (e.get("slice") or {}).items():
        k = src.index([ax])
        lo, hi = (int(p) if p else None for p in str(sl).split(":"))
        a = a[(slice(None),) * k + (slice(lo, hi),)]
    # split every axis into its atoms
    atoms = [x for g in src for x in g]
    a = a.reshape([dims.get(x, 1) if (x in dims or x not in KNOWN) else -1 for x in atoms])
    tgt_atoms = [x for g in tgt for x in g]
    drop = [k for k, x in enumerate(atoms) if x not in tgt_atoms]
    for k in drop:
        if a.shape[k] != 1:
            raise MapError(f"{job['port']} ({e['name']}): axis {atoms[k]!r} has size {a.shape[k]}, but {e['name']} has no "
                           f"such axis\n  hint: only size-1 axes (batch, sequence, top-1) may be left out")
    a = a.reshape([n for k, n in enumerate(a.shape) if k not in drop])
    kept = [x for x in atoms if x in tgt_atoms]
    a = np.transpose(a, [kept.index(x) for x in tgt_atoms])
    shape = [int(np.prod([dims[x] for x in g])) for g in tgt]
    return np.ascontiguousarray(a.reshape(shape))


def stats(a):
    f = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    if f.size == 0:
        return {"min": 0.0, "max": 0.0, "mean": 0.0, "rms": 0.0, "nan": int(np.isnan(a).sum()), "inf": int(np.isinf(a).sum())}
    f64 = f.astype(np.float64)
    return {"min": float(f64.min()), "max": float(f64.max()), "mean": float(f64.mean()),
            "rms": float(np.sqrt((f64 * f64).mean())),
            "nan": int(np.isnan(a).sum()) if a.dtype.kind == "f" else 0, "inf": int(np.isinf(a).sum()) if a.dtype.kind == "f" else 0}


def write_dump(folder, tensors, meta):
    os.makedirs(folder, exist_ok=True)
    idx = os.path.join(folder, "index.json")
    if os.path.exists(idx):
        os.remove(idx)               # index.json last: a folder without it is an unfinished dump
    entries = []
    for order, (name, a, extra) in enumerate(tensors):
        np.save(os.path.join(folder, file_name(name)), a)
        entries.append(dict({"name": name, "file": file_name(name), "shape": list(a.shape),
                             "dtype": "int32" if a.dtype == np.int32 else "float32", "order": order, "stats": stats(a)},
                            **extra))
    with open(idx + ".tmp", "w") as f:
        json.dump(dict(meta, tensors=entries), f, indent=1)
    os.replace(idx + ".tmp", idx)


def exec_rank(name):
    """Sort key: zaya.c's execution order (docs/compare.md §2, names.py)."""
    m = re.match(r"^model\.layers\.(\d+)\.(.*)$", name)
    if m and m.group(2) in LAYER_TENSORS:
        return (int(m.group(1)), LAYER_TENSORS.index(m.group(2)))
    if name in GLOBAL_FIRST:
        return (-1, GLOBAL_FIRST.index(name))
    return (1 << 30, GLOBAL_LAST.index(name) if name in GLOBAL_LAST else len(GLOBAL_LAST))


GGUF_FILE_TYPES = {"0": "F32", "1": "F16", "7": "Q8_0", "32": "BF16", "2": "Q4_0", "3": "Q4_1", "8": "Q5_0", "9": "Q5_1",
                   "10": "Q2_K", "11": "Q3_K_S", "14": "Q4_K_S", "15": "Q4_K_M", "17": "Q5_K_M", "18": "Q6_K"}


def convert(map_path, raw, out, n_layers=None, given=None, log=print):
    """Apply a map: returns (written names, approximate names, missing [(port, name)], unread port names)."""
    m = load_map(map_path)
    idx, files = read_capture(raw)
    T = len(idx["tokens"])
    per_layer = [e for e in m["tensors"] if PLACEHOLDER.search(e["port"]) or PLACEHOLDER.search(e["name"])]
    if n_layers is None:
        n_layers = 0
        for e in per_layer:
            if e.get("layers") not in (None, "all"):
                continue
            i = n_layers
            while expand(e["port"], i, map_path) in files:
                i += 1
            n_layers = max(n_layers, i)
        if n_layers == 0 and per_layer:
            raise MapError(f"{raw}: none of the map's per-layer tensors (e.g. {expand(per_layer[0]['port'], 0, map_path)}) "
                           f"is in the capture\n  hint: capture with the map's regex: python3 -m zaya_compare.portmap "
                           f"{map_path} --regex")
    jobs, missing, seen = [], [], set()
    for e in m["tensors"]:
        layers = layer_set(e.get("layers"), n_layers, map_path) if e in per_layer else [None]
        for i in layers:
            port = expand(e["port"], i, map_path) if i is not None else e["port"]
            name = expand(e["name"], i, map_path) if i is not None else e["name"]
            if name in seen:
                raise MapError(f"{map_path}: {name} is the target of two entries at layer {i}\n  hint: restrict them "
                               f"with `layers`")
            seen.add(name)
            if port not in files:
                missing.append((port, name))
                continue
            arr = load_npy(files[port], port)
            src = e["_src"]
            shape = list(arr.shape)
            while len(shape) < len(src):          # ggml drops trailing size-1 ne, numpy leading size-1 axes
                shape.insert(0, 1)
            while len(shape) > len(src) and shape[0] == 1:
                shape.pop(0)
            if len(shape) != len(src):
                raise MapError(f"{port} ({name}): shape {list(arr.shape)} has {len(arr.shape)} axes, the map's axes "
                               f"{e.get('axes')!r} {len(src)}\n  hint: list every axis of the port's tensor")
            jobs.append({"entry": e, "port": port, "name": name, "array": arr.reshape(shape), "shape": shape,
                         "src": src, "tgt": e["_tgt"]})
    dims = infer_dims(jobs, T, given or {})
    exact, approx = [], []
    for job in jobs:
        try:
            a = transform(job, dims)
        except ValueError as e:
            raise MapError(f"{job['port']} ({job['name']}): its shape {job['shape']} cannot be laid out as "
                           f"{job['entry'].get('axes')!r} -> {job['name']}: {e}\n  hint: check the entry's axes and slice")
        if INT_TARGETS.search(job["name"]):
            if a.dtype.kind == "f" and not np.all(a == np.round(a)):
                raise MapError(f"{job['port']} ({job['name']}): not integer values")
            a = a.astype(np.int32)
        else:
            a = a.astype(np.float32)
        if a.shape[0] != T:
            raise MapError(f"{job['port']} ({job['name']}): {a.shape[0]} positions, the capture's tokens {T}")
        e = job["entry"]
        extra = {"port": job["port"], "match": e.get("match", "equals")}
        if e.get("why"):
            extra["why"] = e["why"]
        (approx if e.get("match") == "approximates" else exact).append((job["name"], a, extra))
    exact.sort(key=lambda t: exec_rank(t[0]))
    approx.sort(key=lambda t: exec_rank(t[0]))
    model = idx.get("model") if isinstance(idx.get("model"), dict) else {}
    ftype = GGUF_FILE_TYPES.get(str(model.get("file_type")), model.get("file_type"))
    port = dict(m.get("port") or {})
    prod = idx.get("producer") if isinstance(idx.get("producer"), dict) else {}
    meta = {
        "format_version": 1,
        "producer": {"program": port.get("name", prod.get("program", "port")),
                     "commit": prod.get("commit") if prod.get("commit") not in (None, "unknown") else port.get("commit"),
                     "capture": prod.get("capture"), "map": os.path.basename(map_path), "converter": "zaya_compare.portmap"},
        "model": {"path": model.get("path"), "file_type": ftype},
        "weight_format": {"dtype": "fp32" if ftype in (None, "F32") else "int8", "port_type": ftype},
        "precision": m.get("precision", "fp32"),
        "skip_expert": m.get("skip_expert", "zero"),
        "tokens": idx["tokens"],
        "run": idx.get("run"),
        "portmap": {"map": os.path.abspath(map_path), "capture": os.path.abspath(raw), "layers": n_layers,
                    "dims": dims, "missing": [{"port": p, "name": n} for p, n in missing],
                    "approximate": [n for n, _, _ in approx]},
    }
    w = m.get("weights")
    if w is not None:          # the map declares the port's weights: --local and --quant read it (docs/compare.md §9)
        w = w if isinstance(w, dict) else {"type": w}
        meta["weight_format"].update(port_type=w["type"], quantized=w["type"].lower() not in EXACT_WEIGHTS,
                                     declared_by="map")
        if w.get("note"):
            meta["weight_format"]["note"] = w["note"]
    if meta["precision"] == "fp32":
        del meta["precision"]        # docs/compare.md §1: absent = fp32
        meta["port_precision"] = "fp32"
    write_dump(out, exact, meta)
    if approx:
        write_dump(os.path.join(out, "approximate"), approx, dict(meta, notes="taps the port only approximates "
                   "(see each entry's `why`): shown beside the replay, never judged as exact"))
    read = {j["port"] for j in jobs}
    unread = sorted(n for n in files if n not in read)
    log(f"portmap: {len(exact)} tensors equal to zaya.c taps, {len(approx)} approximate, {len(missing)} named by the map "
        f"but not in the capture; {n_layers} layers; sizes " + ", ".join(f"{k}={v}" for k, v in sorted(dims.items())))
    return [n for n, _, _ in exact], [n for n, _, _ in approx], missing, unread


def dump_files(d):
    """{tensor name: its file} of a dump folder's index.json."""
    try:
        with open(os.path.join(d, "index.json")) as f:
            return {t["name"]: os.path.join(d, t.get("file") or file_name(t["name"])) for t in json.load(f)["tensors"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MapError(f"cannot read the dump {d}: {e}")


def paired(port_file, ref_file):
    """(port, reference, rel L2 of port against reference) of two .npy files as float64; rel is None when
    their shapes differ."""
    a, b = np.load(port_file).astype(np.float64), np.load(ref_file).astype(np.float64)
    if a.shape != b.shape:
        return a, b, None
    return a, b, float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def approximate_report(port_dir, replay_dir, log=print):
    """The approximate taps of a converted dump beside zaya.c's replay: shown, not judged."""
    port, rep = dump_files(port_dir), dump_files(replay_dir)
    log(f"\napproximate taps (the port computes something close to them, see `why` in {port_dir}/index.json); "
        f"shown, not judged:")
    log(f"{'tensor':62s} {'rel L2 vs replay':>16}")
    for name in sorted(port, key=exec_rank):
        if name not in rep:
            log(f"{name:62s} {'(not in the replay)':>16}")
            continue
        a, b, rel = paired(port[name], rep[name])
        log(f"{name:62s} {rel:16.3g}" if rel is not None else f"{name:62s} shape {list(a.shape)} vs {list(b.shape)}")


def step_summary(report_path, jump=3.0, log=print):
    """From `compare.py --local --verbose`'s report: the taps that agree in every layer, and the steps that add
    error: past their tolerance and, where the report has the step check (zaya_compare/ggml.py: the step
    recomputed from the port's own input to it, as the replay's placement computes it), departing from it; for a
    tap without the step check, a local error `jump` times the largest of their inputs' (DEPS; an input the dump
    lacks is replaced by its own inputs). Where the port's computation adds error, as opposed to taps that only
    inherit it (or, after ggml's requantization of an input that differs, amplify it). A hint beside the
    verdict, not a verdict."""
    row = re.compile(r"^\s+model\.layers\.(\d+)[.:](\S+)\s+local\s+(\S+)\s+env\s+\S+\s+tol\s+(\S+)\s+(ok|OUT)$")
    step = re.compile(r"^\s+step\s+model\.layers\.(\d+)[.:](\S+)\s+(agrees|departs)\s")
    try:
        with open(report_path) as f:
            lines = f.readlines()
    except OSError as e:
        raise MapError(f"cannot read {report_path}: {e.strerror}")
    rows = [m.groups() for m in map(row.match, lines) if m]
    checked = {(int(m.group(1)), m.group(2)): m.group(3) for m in map(step.match, lines) if m}
    if not rows:
        raise MapError(f"{report_path}: no per-tap lines (run compare.py --local with --verbose)")
    taps, layers, verdicts, adds, amplified = [], {}, {}, {}, {}
    for layer, tap, e, tol, verdict in rows:
        if tap not in taps:
            taps.append(tap)
        layers.setdefault(int(layer), {})[tap] = (float(e) if e != "-" else 0.0, float(tol), verdict)
    for layer, tl in sorted(layers.items()):
        def inherited(tap, seen=()):
            if tap == "" or tap in seen:
                return 0.0
            if tap in tl:
                return tl[tap][0]
            return max([inherited(d, seen + (tap,)) for d in DEPS.get(tap, [])] or [0.0])
        for tap, (e, tol, verdict) in tl.items():
            if tap.endswith("router_indices"):
                continue
            verdicts.setdefault(tap, []).append(verdict)
            src = max([inherited(d) for d in DEPS.get(tap, [])] or [0.0])
            grows = e > jump * max(src, tol)
            entry = (layer, e / src if src > tol else None, e)
            if verdict == "OUT" and ((layer, tap) in checked and checked[(layer, tap)] == "departs"
                                     or (layer, tap) not in checked and grows):
                adds.setdefault(tap, []).append(entry)
            elif verdict == "OUT" and grows:
                amplified.setdefault(tap, []).append(entry)
    agree = [t for t in taps if verdicts.get(t) and all(v == "ok" for v in verdicts[t])]

    def line(tap, ls):
        grow = [g for _, g, _ in ls if g]
        return (f"  {tap:40s} layers {' '.join(str(x) for x, _, _ in ls):12s} local error {min(e for _, _, e in ls):.2g}"
                f"..{max(e for _, _, e in ls):.2g}" + (f", x{min(grow):.3g}..x{max(grow):.3g} its inputs'" if grow else
                                                       ", its inputs agree"))
    log("\ntaps that agree in every layer: " + (", ".join(agree) if agree else "none"))
    log(f"steps that add error (past the tolerance, and departing from the step check where the report has it, else "
        f"local error > {jump:g}x their inputs'; read the port's code there, later taps inherit it):")
    for tap in taps:
        if tap in adds:
            log(line(tap, adds[tap]))
    if not adds:
        log("  none")
    if amplified:
        log(f"steps whose error grows > {jump:g}x their inputs' while the step check agrees (the arithmetic on the port's "
            f"own input, e.g. ggml's requantization of an input the steps before moved): not the port's code")
        for tap in taps:
            if tap in amplified:
                log(line(tap, amplified[tap]))


def globals_report(port_dir, ref_dir, log=print):
    """The taps outside the layers, the port against zaya.c's run of the same ids and weights: the embedding
    and layer 0's input come before any layer and must agree (fp32 row tolerance); model.norm and logits
    carry every layer's error end to end (shown, not judged; their local check is the last layer's)."""
    port, ref = dump_files(port_dir), dump_files(ref_dir)
    log("\noutside the layers (the port against zaya.c on the same ids and weights):")
    bad = 0
    for name, judged in (("model.embed_tokens", True), ("model:input_scaled", True), ("model.norm", False), ("logits", False)):
        if name not in port or name not in ref:
            continue
        a, b, rel = paired(port[name], ref[name])
        if rel is None:
            log(f"  {name:22s} shape {list(a.shape)} vs zaya.c's {list(b.shape)}")
            continue
        rows = np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-30)
        if judged:
            ok = rows.max() <= 1e-5
            bad += not ok
            log(f"  {name:22s} rel L2 {rel:.3g}, worst row {rows.max():.3g}: {'agrees' if ok else 'DIFFERS (before any layer)'}")
        else:
            log(f"  {name:22s} rel L2 {rel:.3g} end to end (every layer's error; not judged)")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m zaya_compare.portmap",
                                 description="a port's raw capture -> a zaya.c dump under HF names, by a name map")
    ap.add_argument("map")
    ap.add_argument("raw", nargs="?", help="the port's capture folder (npy files under its names + index.json)")
    ap.add_argument("out", nargs="?", help="the zaya.c dump to write")
    ap.add_argument("--regex", action="store_true", help="print the regex of every port name the map reads")
    ap.add_argument("--check", action="store_true", help="validate the map and exit")
    ap.add_argument("--layers", type=int, help="the model's layer count (default: from the capture)")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="an axis size the shapes do not give")
    ap.add_argument("--verbose", action="store_true", help="list the missing and the unread port tensors")
    ap.add_argument("--approximate", action="store_true", help="MAP is a converted dump's approximate/ folder, RAW "
                    "a replay of it: print their distances (not judged)")
    ap.add_argument("--globals", action="store_true", help="MAP is a converted dump, RAW zaya.c's dump of the same ids "
                    "and weights: the embedding, layer 0's input, model.norm and logits side by side")
    ap.add_argument("--steps", action="store_true", help="MAP is compare.py --local --verbose's report: which taps "
                    "agree everywhere, where an error appears or grows")
    a = ap.parse_args(argv)
    try:
        if a.globals:
            if not a.raw:
                raise MapError("--globals PORT_DUMP ZAYA_DUMP")
            return 1 if globals_report(a.map, a.raw) else 0
        if a.steps:
            step_summary(a.map)
            return 0
        if a.approximate:
            if not a.raw:
                raise MapError("--approximate PORT_DUMP/approximate REPLAY_DUMP")
            approximate_report(a.map, a.raw)
            return 0
        if a.regex or a.check:
            m = load_map(a.map)
            print(regex_of(m) if a.regex else f"{a.map}: {len(m['tensors'])} entries, OK")
            return 0
        if not (a.raw and a.out):
            raise MapError("give MAP RAW_CAPTURE OUT_DUMP (or MAP --regex)")
        given = {}
        for d in a.dim:
            k, _, v = d.partition("=")
            if k not in KNOWN or not v.isdigit():
                raise MapError(f"--dim {d}: expected NAME=SIZE with NAME one of {', '.join(KNOWN)}")
            given[k] = int(v)
        _, _, missing, unread = convert(a.map, a.raw, a.out, a.layers, given)
        if missing:
            print("portmap: not in the capture: " + ", ".join(p for p, _ in missing[:8]) + (" ..." if len(missing) > 8 else ""))
        if a.verbose and unread:
            print("portmap: in the capture, not read by the map: " + ", ".join(unread))
        return 0
    except MapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot apply the map ({type(e).__name__}: {e})\n  hint: check the map and the capture against "
              f"docs/compare.md §9", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
