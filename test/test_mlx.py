#!/usr/bin/env python3
"""test_mlx.py - MLX-saved folders read natively: mx.dequantize bit for bit, names mapped, an MLX port judged.

    make zaya && python3 test/test_mlx.py        (needs numpy for compare.py; no mlx: the outputs are recorded)

1. mlx_weights.dequantize against mx.dequantize's own outputs (test/fixtures/mlx/dequantize.safetensors,
   tools/mlx_fixtures.py on mlx-cpu 0.32.4): affine with bits 1-6 and 8, groups 32/64/128, scales in
   BF16/F16/F32 (the bulk path and its element-by-element twin); mxfp4, mxfp8, nvfp4 (with and without a
   global scale) into BF16/F16/F32. Bytes equal (a NaN may carry other bits than MLX's).
2. An MLX port's folder (test/fixtures/mlx/port: mlx-vlm's ZAYA model on the compact legacy checkpoint,
   quantized by mlx.nn.quantize with per-module entries: 4-bit affine group 32 where the row allows it,
   nvfp4 on rows of 16; tools/mlx_port.py) plus the checkpoint's embedding (kept in BF16 there, left out of
   the fixture for size): export_weights.py reads it; the blob's quantized matrices are mx.dequantize's
   recorded values (test/fixtures/mlx/port_dequantized.safetensors) byte for byte, its other tensors the
   checkpoint's.
3. The port's own dump (mlx-vlm on mlx-cpu, recorded) through compare.py --quant: the weights alone differ
   in every layer, and the port's own computation differs from the exact model's on its weights in the
   sliding-window layers (mlx-vlm's ZAYA has no sliding window), not in the full-attention ones.
4. Bad MLX folders: one message each, never the BF16 hint.
"""
import json
import os
import shutil
import struct
import sys

from harness import ROOT, check, finish, need_fixtures, run, temp_dir

sys.path.insert(0, ROOT)
import export_weights  # noqa: E402
import mlx_weights  # noqa: E402
from fake_quant import write_safetensors_raw  # noqa: E402

FX = need_fixtures("mlx")
LEGACY = need_fixtures("checkpoint_legacy")
NATIVE = need_fixtures("checkpoint_native")
TOK = need_fixtures("tokenizer")
TMP = temp_dir("zaya_test_mlx_")


def read_st(path):
    """{name: (dtype, shape, raw bytes)}, metadata of a safetensors file (standard library)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}, meta


def same_values(got, want, dtype):
    """Equal bytes, a NaN matching any NaN; returns (ok, first differing index, got value, want value)."""
    if got == want:
        return True, None, None, None
    if len(got) != len(want):
        return False, f"length {len(got)} vs {len(want)}", None, None
    size = mlx_weights.SIZE[dtype]
    for i in range(0, len(want), size):
        if got[i:i + size] != want[i:i + size]:
            g, w = mlx_weights.decode(got[i:i + size], dtype)[0], mlx_weights.decode(want[i:i + size], dtype)[0]
            if not (g != g and w != w):
                return False, i // size, g, w
    return True, None, None, None


# 1. mx.dequantize, every mode
fx, meta = read_st(os.path.join(FX, "dequantize.safetensors"))
cases = json.loads(meta["cases"])
DT = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
by_mode = {}
for name, c in sorted(cases.items()):
    wd, ws, w = fx[name + ".weight"]
    sd, _, s = fx[name + ".scales"]
    b = fx.get(name + ".biases")
    g = struct.unpack("<f", fx[name + ".global_scale"][2])[0] if name + ".global_scale" in fx else None
    od, oshape, want = fx[name + ".out"]
    got = mlx_weights.dequantize(w, tuple(ws), s, sd, b[2] if b else None, b[0] if b else None, c["group_size"],
                                 c["bits"], c["mode"], None if c["mode"] == "affine" else DT[c["dtype"]], g)
    ok, i, gv, wv = same_values(got, want, od)
    if ok and c["mode"] == "affine":    # the element-by-element loop too (the bulk path's plain twin)
        plain = mlx_weights.dequantize(w, tuple(ws), s, sd, b[2], b[0], c["group_size"], c["bits"], "affine",
                                       plain=True)
        ok, i, gv, wv = same_values(plain, want, od)
    key = f"{c['mode']}" + (f" {c['bits']}-bit" if c["mode"] == "affine" else "")
    by_mode.setdefault(key, [0, 0, []])
    by_mode[key][0 if ok else 1] += 1
    if not ok:
        by_mode[key][2].append(f"{name}: element {i}: {gv!r} where mx.dequantize gives {wv!r}")
for key, (good, bad, notes) in sorted(by_mode.items()):
    check(bad == 0, f"mx.dequantize {key}: {good} case(s) bit-identical (groups, dtypes as recorded)",
          "; ".join(notes[:3]) + " (hint: the order and dtype of MLX's operations: multiply by the scale, round, "
          "add the bias, round, in the scales' dtype; tools/mlx_fixtures.py recorded these on mlx-cpu)")

# 1b. the compiled twin (dequantize.c --mlx, what export_weights.py uses) on the same recorded cases, and against
# the Python loop on random scales and biases (every bit pattern class: subnormal, huge, F16 overflow, NaN codes)
exe = export_weights.build_dequantizer(print, "the MLX test", "ZAYA_MLX_PYTHON_UNSET")
check(exe is not None, "dequantize.c builds (export_weights.py's compiled MLX dequantizer)", "no helper")
mlx_weights.use_helper(exe)
by_bits = {}
for name, c in sorted(cases.items()) if exe else []:
    if c["mode"] != "affine":
        continue
    _, ws, w = fx[name + ".weight"]
    sd, _, s = fx[name + ".scales"]
    b = fx[name + ".biases"]
    od, _, want = fx[name + ".out"]
    got = mlx_weights.dequantize(w, tuple(ws), s, sd, b[2], b[0], c["group_size"], c["bits"], "affine")
    f32 = mlx_weights.dequantize(w, tuple(ws), s, sd, b[2], b[0], c["group_size"], c["bits"], "affine", compute="F32")
    mlx_weights.close_helper()
    py32 = mlx_weights.dequantize(w, tuple(ws), s, sd, b[2], b[0], c["group_size"], c["bits"], "affine", compute="F32")
    mlx_weights.use_helper(exe)
    ok, i, gv, wv = same_values(got, want, od)
    r = by_bits.setdefault(c["bits"], [0, []])
    r[0] += 1
    if not ok or f32 != py32:
        r[1].append(f"{name}: element {i}: {gv!r} where mx.dequantize gives {wv!r}; compute F32 equal {f32 == py32}")
check(not exe or len(by_bits) >= 2, f"affine cases recorded for {len(by_bits)} bit widths", "hint: tools/mlx_fixtures.py")
for bits, (n, notes) in sorted(by_bits.items()):
    check(not notes, f"dequantize.c --mlx affine {bits}-bit: {n} case(s) bit-identical to mx.dequantize (and to "
          "mlx_weights.py with compute F32)", "; ".join(notes[:3]))

import random  # noqa: E402

rng = random.Random(48)
bad = []
for bits in (1, 2, 3, 4, 5, 6, 8) if exe else ():
    for sd in ("BF16", "F16", "F32"):
        rows, group = 3, 32
        packed = group * 4 * bits // 32                     # 4 groups a row
        words = bytes(rng.getrandbits(8) for _ in range(rows * packed * 4))
        size = mlx_weights.SIZE[sd]

        def pattern():
            k = rng.randrange(6)
            if k == 0:                                      # subnormal
                v = rng.getrandbits(7 if sd != "F32" else 23)
            elif k == 1:                                    # large: F16 products and sums overflow
                v = {"F16": 0x7000, "BF16": 0x4700, "F32": 0x47000000}[sd] | rng.getrandbits(8)
            else:
                v = rng.getrandbits(8 * size) & ~(0x7C00 if sd == "F16" else 0x7F80 if sd == "BF16" else 0x7F800000)
            return v.to_bytes(size, "little")
        n = rows * 4
        sc, bi = b"".join(pattern() for _ in range(n)), b"".join(pattern() for _ in range(n))
        for compute in (None, "F32"):
            got = mlx_weights.dequantize(words, (rows, packed), sc, sd, bi, sd, group, bits, "affine", compute=compute)
            want = mlx_weights.dequantize(words, (rows, packed), sc, sd, bi, sd, group, bits, "affine", compute=compute,
                                          plain=True)
            ok, i, gv, wv = same_values(got, want, compute or sd)
            if not ok:
                bad.append(f"{bits}-bit {sd} compute {compute}: element {i}: C {gv!r}, Python {wv!r}")
mlx_weights.close_helper()
check(exe and not bad, "dequantize.c --mlx equals mlx_weights.py's element-by-element loop on random scales and biases "
      "(bits 1-6, 8; BF16, F16, F32; subnormal, huge, overflowing; compute F32 too)", "; ".join(bad[:3]))

# 2. an MLX port's folder
folder = os.path.join(TMP, "mlx_port")
os.makedirs(folder)
port, port_meta = read_st(os.path.join(FX, "port", "model.safetensors"))
with open(os.path.join(LEGACY, "model.safetensors.index.json")) as f:
    shard = json.load(f)["weight_map"]["model.embed_tokens.weight"]
legacy_emb = read_st(os.path.join(LEGACY, shard))[0]["model.embed_tokens.weight"]
port["language_model.model.embed_tokens.weight"] = legacy_emb
write_safetensors_raw(os.path.join(folder, "model.safetensors"), port, port_meta)
shutil.copy(os.path.join(FX, "port", "config.json"), folder)
for fn in ("tokenizer.json.gz", "tokenizer_config.json.gz"):
    os.symlink(os.path.join(TOK, fn), os.path.join(folder, fn))


def export(src, out, *extra):
    rc, stdout, err = run([sys.executable, "export_weights.py", src, out, *extra])
    return rc, stdout + err


mlx_blob = os.path.join(TMP, "mlx.bin")
rc, text = export(folder, mlx_blob)
check(rc == 0 and "MLX folder:" in text and "nvfp4" in text and "affine" in text,
      "export_weights.py reads the MLX port's folder (mlx-vlm names, per-module quantization)", text[-600:])

deq = read_st(os.path.join(FX, "port_dequantized.safetensors"))[0]
with open(os.path.join(LEGACY, "config.json")) as f:
    c = export_weights.legacy_to_native_config(json.load(f), "config.json")
native = {}                    # mx.dequantize's recorded values under the blob's (native) names, experts stacked
for name, shape, kind in export_weights.expected_tensors(c):
    srcs = export_weights.legacy_sources(name, c)
    if all(s in deq for s in srcs):
        native[name] = b"".join(deq[s][2] for s in srcs)


def blob_tensors(path):
    """{name: raw bytes} of a blob's tensors (docs/blob-format.md: the directory after the 1024-byte header)."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = {}, export_weights.HEADER_SIZE
    while pos + export_weights.DIR_ENTRY_SIZE <= len(data):
        e = data[pos:pos + export_weights.DIR_ENTRY_SIZE]
        name = e[:export_weights.NAME_SIZE].rstrip(b"\0").decode("utf-8", "replace")
        if not name or not name.isprintable():
            break
        code, nd, d0, d1, d2, d3, off, nbytes = struct.unpack_from("<II4QQQ", e, export_weights.NAME_SIZE)
        out[name] = data[off:off + nbytes]
        pos += export_weights.DIR_ENTRY_SIZE
    return out


# 3. the MLX port's own dump through --quant
exact_blob = os.path.join(TMP, "exact.bin")
rc, text = export(NATIVE, exact_blob)
check(rc == 0, "export the exact checkpoint", text[-300:])
got, exact = blob_tensors(mlx_blob), blob_tensors(exact_blob)
wrong = [k for k in native if got.get(k) != native[k]]
others = [k for k in exact if k not in native]
wrong_other = [k for k in others if got.get(k) != exact[k]]
check(len(native) == 42 and not wrong and len(got) == len(exact) and others and not wrong_other,
      f"the MLX folder's blob: its {len(native)} quantized matrices are mx.dequantize's recorded values (experts "
      f"split, names mapped), its {len(others)} other tensors the checkpoint's (convolutions transposed back)",
      f"differ: {(wrong + wrong_other)[:4]}")
rc_q, out, err = run([sys.executable, "compare.py", "--quant", os.path.join(FX, "port_dump"), "--model", mlx_blob,
                      "--exact", exact_blob, "--replay-out", os.path.join(TMP, "q")])
out_q = out + err
with open(os.path.join(NATIVE, "config.json")) as f:
    sliding = [i for i, t in enumerate(json.load(f)["layer_types"]) if t == "hybrid_sliding"]
print("\n".join("      " + ln for ln in out_q.splitlines()
                if ln[:5].strip().isdigit() or ln.startswith(("layer", "VERDICT"))))
finish_rows = {}
for line in out_q.splitlines():
    f = line.split()
    if f and f[0].isdigit() and len(f) >= 6:
        finish_rows[int(f[0])] = f
check(len(finish_rows) == 6 and all(float(finish_rows[i][1]) > 1e-3 for i in finish_rows),
      "--quant: the MLX port's weights alone differ in every layer", out_q[-600:])
check(all(float(finish_rows[i][5]) > 0.01 for i in sliding) and "VERDICT: layer 0," in out_q,
      f"--quant: the port's own computation differs in the sliding-window layers {sliding} (mlx-vlm has no "
      "sliding window)", out_q[-600:])

# the port's full-attention layers, replayed with its skip class (passthrough, as mlx-vlm computes it): on the
# weights its quantized matmul multiplies float32 activations by (--mlx-compute float32: q * scale + bias in
# float32) they are exact; on mx.dequantize's values (rounded to the BF16 scales' dtype) they differ by that rounding
f32_blob = os.path.join(TMP, "mlx_f32.bin")
rc, text = export(folder, f32_blob, "--mlx-compute", "float32")
check(rc == 0 and "float32 activations" in text, "export_weights.py --mlx-compute float32", text[-300:])


def local_errors(blob, name):
    replay = os.path.join(TMP, "replay_" + name)
    rc, _, err = run(["./zaya", blob, "--replay", os.path.join(FX, "port_dump"), "--dump", replay,
                      "--skip-expert", "passthrough"])
    rc, out, err = run([sys.executable, "compare.py", "--local", os.path.join(FX, "port_dump"), replay])
    errors = {}
    for line in (out + err).splitlines():
        f = line.split()
        if f and f[0].isdigit() and len(f) >= 2:
            errors[int(f[0])] = float(f[1])
    shutil.rmtree(replay, ignore_errors=True)
    return errors, out + err


full = [i for i in range(6) if i not in sliding]
local, text = local_errors(f32_blob, "f32")
check(len(local) == 6 and all(local[i] < 1e-5 for i in full) and all(local[i] > 0.01 for i in sliding),
      f"--local: on its own float32 weights the MLX port computes the full-attention layers {full} as the exact "
      f"model ({', '.join(f'{local.get(i, -1):.2g}' for i in full)}); the sliding ones differ", text[-600:])
local, text = local_errors(mlx_blob, "bf16")
check(len(local) == 6 and all(1e-4 < local[i] < 1e-2 for i in full),
      f"--local: on mx.dequantize's BF16 values the full-attention layers differ by BF16 rounding "
      f"({', '.join(f'{local.get(i, -1):.2g}' for i in full)})", text[-600:])


# 4. bad folders
def bad_folder(name, edit_cfg=None, drop=(), rename=None):
    d = os.path.join(TMP, name)
    shutil.copytree(folder, d, symlinks=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if edit_cfg:
        edit_cfg(cfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    t = dict(port)
    for k in drop:
        del t[k]
    write_safetensors_raw(os.path.join(d, "model.safetensors"), t, port_meta)
    rc, text = export(d, os.path.join(d, "out.bin"))
    return rc, text


Q = "language_model.model.layers.0.attn.self_attn.o_proj"
rc, text = bad_folder("no_scales", drop=(Q + ".scales",))
check(rc == 1 and "without its scales" in text and "published in BF16" not in text and "Traceback" not in text,
      "a packed U32 weight without its scales: named, no BF16 hint", text[-400:])


def wrong_bits(cfg):
    cfg["quantization"][Q]["bits"] = 8
    cfg.pop("quantization_config")


rc, text = bad_folder("wrong_bits", wrong_bits)
check(rc == 1 and "do not match the packed weight" in text and Q in text and "Traceback" not in text,
      "config.json's bits disagree with the packed tensor: named", text[-400:])


def no_quant(cfg):
    cfg.pop("quantization")
    cfg.pop("quantization_config")


rc, text = bad_folder("no_quantization", no_quant)
check(rc == 1 and "without a 'quantization' entry" in text and "Traceback" not in text,
      "packed weights without config.json's quantization: named", text[-400:])


def bad_mode(cfg):
    cfg["quantization"][Q]["mode"] = "int4"


rc, text = bad_folder("bad_mode", bad_mode)
check(rc == 1 and "unknown MLX quantization mode" in text and "Traceback" not in text,
      "an unknown quantization mode: named", text[-400:])
finish()
