"""GGUF input: gguf.py's dequantization against ggml's own values, its parser's refusals, and the llama.cpp
ZAYA port's converter output for the compact fixture exported by export_weights.py and run by zaya.c.

Fixtures (test/fixtures/gguf/README.md): <TYPE>.gguf + <TYPE>.f32 recorded by tools/gguf_fixtures.c (ggml's
quantize, ggml's to_float, ggml's GGUF writer); compact-<TYPE>.gguf are the port's converter output for
test/fixtures/checkpoint_legacy with the tokenizer arrays and the embedding left out (tools/gguf_strip.py); the
test puts the embedding back from the checkpoint as the converter writes it and checks it against the
SHA-256 the strip tool recorded of the converter's own bytes.
"""
import hashlib
import json
import os
import shutil
import struct
import sys

from harness import BUILD, ROOT, check, finish, need_fixtures, prompt_ids, run

sys.path.insert(0, ROOT)
import export_weights as ew  # noqa: E402
import gguf  # noqa: E402

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
OUT = os.path.join(BUILD, "gguf")
os.makedirs(OUT, exist_ok=True)


def fixture(name):
    return need_fixtures("gguf", name)


# -- 1. every type: gguf.py's values are ggml's, bit for bit -------------------------------------------
for t in TYPES:
    g = gguf.GGUFFile(fixture(f"{t}.gguf"))
    ten = g.tensors["t"]
    got = g.dequantize("t").tobytes()
    with open(fixture(f"{t}.f32"), "rb") as f:
        want = f.read()
    diff = [i for i in range(0, min(len(got), len(want)), 4) if got[i:i + 4] != want[i:i + 4]]
    check(ten.type == t and got == want, f"dequantize {t} bit-identical to ggml's to_float ({ten.numel} values)",
          f"type {ten.type}, {len(diff)} of {len(want) // 4} values differ" + (
              f", first at {diff[0] // 4}: {struct.unpack('<f', got[diff[0]:diff[0] + 4])[0]!r} vs ggml "
              f"{struct.unpack('<f', want[diff[0]:diff[0] + 4])[0]!r}" if diff else f", {len(got)} vs {len(want)} bytes"))
    g.close()

# the compiled helper (dequantize.c, what export_weights.py uses) against ggml's values and its Python twin
helper = ew.build_dequantizer(print)
check(helper is not None, "dequantize.c builds (export_weights.py's compiled GGUF dequantizer)", "no helper")
for t in TYPES if helper else []:
    g = gguf.GGUFFile(fixture(f"{t}.gguf"))
    py = g.dequantize("t").tobytes()
    g.use_helper(helper)
    c_all, c_row = g.dequantize("t").tobytes(), g.dequantize("t", 2, 3).tobytes()   # a whole tensor and a row range
    g.close()
    with open(fixture(f"{t}.f32"), "rb") as f:
        want = f.read()
    diff = [i for i in range(0, min(len(c_all), len(want)), 4) if c_all[i:i + 4] != want[i:i + 4]]
    check(c_all == want and c_all == py and c_row == want[2 * 1024:5 * 1024],
          f"dequantize.c {t}: bit-identical to ggml's to_float and to gguf.py's Python ({len(want) // 4} values)",
          f"{len(diff)} values differ from ggml's" + (f", first at {diff[0] // 4}" if diff else "")
          + f"; equal to Python's: {c_all == py}; rows 2..4: {c_row == want[2048:5120]}")


# dequantize.c --into (the exporter's path to the disk): values written into a file at an offset, CRC-32 answered
def into(gguf_path, blob, request):
    """Runs the helper's --into mode on one request; (exit status, answer, stderr)."""
    import subprocess
    p = subprocess.run([helper, gguf_path, "--into", blob], input=request.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


import zlib  # noqa: E402

FILL, AT = b"\xab", 4096 + 64                        # bytes around the tensor must stay as they were
for t in TYPES if helper else []:
    g = gguf.GGUFFile(fixture(f"{t}.gguf"))
    ten = g.tensors["t"]
    rows = ten.numel // ten.ne[0]
    pieces = g.pieces("t", 0, 2) + g.pieces("t", 2, rows - 2)            # two pieces: rows 0-1, then the rest
    g.close()
    with open(fixture(f"{t}.f32"), "rb") as f:
        want = f.read()
    for dtype in ("f32", "bf16") if t == "BF16" else ("f32",):
        vals = want if dtype == "f32" else ew.f32_to_bf16_exact(want, t)
        blob = os.path.join(OUT, f"into-{t}-{dtype}.bin")
        with open(blob, "wb") as f:
            f.write(FILL * (AT + len(vals) + 100))
        req = f"{dtype} {AT} 2 x.{t}\n" + "".join(f"{a} {b} {c} {d}\n" for a, b, c, d in pieces)
        rc, ans, err = into(fixture(f"{t}.gguf"), blob, req)
        with open(blob, "rb") as f:
            got = f.read()
        ok = (rc == 0 and ans.split() == [str(zlib.crc32(vals)), str(len(vals))] and got[AT:AT + len(vals)] == vals
              and got[:AT] == FILL * AT and got[AT + len(vals):] == FILL * 100)
        check(ok, f"dequantize.c --into {t} as {dtype}: ggml's values at the offset, zlib's CRC-32, nothing else "
              "touched",
              f"rc {rc}, answer {ans.strip()!r} (want {zlib.crc32(vals)} {len(vals)}), values equal "
              f"{got[AT:AT + len(vals)] == vals}, around untouched {got[:AT] == FILL * AT}: {err[-300:]}")

if helper:
    g = gguf.GGUFFile(fixture("Q4_K.gguf"))
    (typ, off, nb, _), = g.pieces("t", 0, 6)
    g.close()
    blob = os.path.join(OUT, "into-refused.bin")
    with open(blob, "wb") as f:
        f.write(bytes(1 << 16))
    cut = os.path.join(OUT, "Q4_K-cut.gguf")
    with open(fixture("Q4_K.gguf"), "rb") as f, open(cut, "wb") as o:
        o.write(f.read()[:off + nb - 1])                  # the tensor's last byte missing
    for name, path, req, needles in (
            ("a GGUF cut short (the last byte of the tensor)", cut, f"f32 {AT} 1 x\n{typ} {off} {nb} t\n",
             ["GGUF file is truncated", "where:    " + cut + ": tensor 't'", f"expected: {nb} bytes of data at byte",
              f"found:    a file of {off + nb - 1} bytes", "hint:"]),
            ("a piece that is not whole blocks", fixture("Q4_K.gguf"), f"f32 {AT} 1 x\n{typ} {off} {nb - 1} t\n",
             ["bad request", "whole 144-byte blocks of Q4_K"]),
            ("an unknown type", fixture("Q4_K.gguf"), f"f32 {AT} 1 x\nQ9_K {off} {nb} t\n",
             ["unsupported type", "Q9_K"]),
            ("bf16 values that are not exact", fixture("Q4_K.gguf"), f"bf16 {AT} 1 blob.x\n{typ} {off} {nb} t\n",
             ["bf16 cannot hold exactly", "blob.x (value", "--dtype fp32"]),
            ("a request without its pieces", fixture("Q4_K.gguf"), f"f32 {AT} 2 x\n{typ} {off} {nb} t\n",
             ["bad request", "TYPE OFFSET NBYTES GGUF_NAME"])):
        rc, ans, err = into(path, blob, req)
        check(rc == 1 and all(n in err for n in needles),
              f"dequantize.c --into refuses {name}, with what, where, expected vs found", f"rc {rc}: {err[-400:]}")

g = gguf.GGUFFile(fixture("Q4_K.gguf"))
want_kv = {"general.architecture": "fixture", "fixture.u8": 200, "fixture.i8": -100, "fixture.u16": 60000,
           "fixture.i16": -30000, "fixture.u32": 4000000000, "fixture.i32": -2000000000,
           "fixture.f32": struct.unpack("<f", struct.pack("<f", 0.1))[0], "fixture.u64": 18000000000000000000,
           "fixture.i64": -9000000000000000000, "fixture.f64": 0.1, "fixture.bool": True,
           "fixture.arr_i32": [1, -2, 3], "fixture.arr_str": ["a", "", "\u00e9t\u00e9"]}
bad = {k: g.kv.get(k) for k, v in want_kv.items() if g.kv.get(k) != v or type(g.kv.get(k)) is not type(v)}
check(not bad and g.kv_types["fixture.arr_str"] == "array[string]", "metadata of every GGUF value type read as ggml wrote it",
      f"differ: {bad}")
g.close()


# -- 2. the parser's refusals, each with its message ------------------------------------------------
def refused(data, name, needle):
    path = os.path.join(OUT, name + ".gguf")
    with open(path, "wb") as f:
        f.write(data)
    try:
        gguf.GGUFFile(path)
    except gguf.GGUFError as e:
        msg = str(e)
        return check(needle in msg and "where:" in msg, f"refused: {name}", f"message lacks {needle!r}: {msg}")
    return check(False, f"refused: {name}", "accepted")


with open(fixture("Q4_K.gguf"), "rb") as f:
    good = f.read()
g = gguf.GGUFFile(fixture("Q4_K.gguf"))
data_start, tpos = g.data_start, g.tensors["t"].offset
g.close()
info = struct.pack("<Q", 1) + b"t" + struct.pack("<I2Q", 2, 256, 6)   # tensor "t": name, n_dims, ne
at = good.index(info) + len(info)                                      # its ggml type (uint32) is here
refused(b"GGUX" + good[4:], "bad magic", "bad magic")
refused(good[:4] + struct.pack("<I", 1) + good[8:], "version 1", "unsupported GGUF version")
refused(good[:4] + struct.pack(">I", 3) + good[8:], "big-endian", "big-endian")
for cut, where in ((12, "in the header"), (200, "in the metadata"), (at, "in the tensor directory"),
                  (len(good) - 1, "in the tensor data")):
    refused(good[:cut], f"truncated {where} (at byte {cut})", "truncated")
refused(good[:at] + struct.pack("<I", 39) + good[at + 4:], "type MXFP4 refused by name", "tensor type MXFP4 is not supported")
refused(good[:at] + struct.pack("<I", 16) + good[at + 4:], "type IQ2_XXS refused by name", "tensor type IQ2_XXS is not supported")
refused(good[:at] + struct.pack("<I", 77) + good[at + 4:], "an unknown type number", "unknown type 77")
refused(good[:at - 16] + struct.pack("<Q", 250) + good[at - 8:], "a row that is not whole blocks",
        "not a multiple of its type's block size")

# the same refusals through export_weights.py: one message, exit status 1, no traceback
for args, needle, name in (
        ([os.path.join(OUT, "bad magic.gguf")], "bad magic", "bad magic"),
        ([os.path.join(OUT, "type MXFP4 refused by name.gguf")], "MXFP4", "an unsupported type"),
        ([fixture("Q4_K.gguf"), "--tokenizer", need_fixtures("tokenizer")], "not a ZAYA model", "another architecture"),
        ([fixture("compact-F32.gguf")], "lacks token_embd.weight", "a GGUF stripped of its embedding"),
        ([need_fixtures("checkpoint_legacy"), "--tokenizer", need_fixtures("tokenizer")], "--tokenizer is for a GGUF",
         "--tokenizer with a checkpoint folder")):
    rc, out, err = run([sys.executable, "export_weights.py", *args[:1], os.path.join(OUT, "x.bin"), *args[1:]])
    check(rc == 1 and needle in err and "Traceback" not in err, f"export_weights.py refuses {name}",
          f"rc {rc}, stderr: {err[-400:]}")


# -- 3. the port's converter output for the compact fixture -----------------------------------------
def full_gguf(kind):
    """compact-<kind>.gguf with the converter's embedding put back (checked against its recorded SHA-256)."""
    g = gguf.GGUFFile(fixture(f"compact-{kind}.gguf"))
    k = "zaya_test.dropped.token_embd.weight."
    ne, typ = g.kv[k + "ne"], g.kv[k + "type"]
    st = ew.open_checkpoint(need_fixtures("checkpoint_legacy"))["model.embed_tokens.weight"]
    n = ne[0] * ne[1]                      # the converter keeps the tokenizer's rows: the first ne[1]
    emb = ew.bf16_to_f32(st.read("model.embed_tokens.weight", 0, 2 * n))     # BF16 -> F32: exact
    if typ == "F16":                       # the converter's F16: round to nearest even
        emb = struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", emb))
    check(hashlib.sha256(emb).hexdigest() == g.kv[k + "sha256"],
          f"compact {kind}: the embedding put back is the converter's, byte for byte ({typ} {ne})",
          "SHA-256 differs from the one tools/gguf_strip.py recorded")
    kv = [(key, g.kv_types[key], v) for key, v in g.kv.items() if not key.startswith("zaya_test.")]
    tensors = [("token_embd.weight", typ, tuple(ne), emb)] + [
        (name, t.type, t.ne, bytes(g.raw(name))) for name, t in g.tensors.items()]
    path = os.path.join(OUT, f"compact-{kind}.gguf")
    gguf.write_gguf(path, kv, tensors, g.alignment)
    g.close()
    return path, ne[1]


def blob_tensors(path):
    """{name: raw bytes} of a zaya.c blob (docs/blob-format.md: directory of 192-byte entries at byte 1024)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<I", data, 32)
    out = {}
    for i in range(n):
        e = 1024 + 192 * i
        name = data[e:e + 128].split(b"\0")[0].decode()      # a GGUF's blob keeps the ggml type in the tail
        off, nbytes = struct.unpack_from("<QQ", data, e + 128 + 8 + 32)
        out[name] = data[off:off + nbytes]
    return out


def logits(dump):
    with open(os.path.join(dump, "logits.npy"), "rb") as f:
        raw = f.read()
    (hl,) = struct.unpack_from("<H", raw, 8)
    header = raw[10:10 + hl].decode("latin1")
    shape = tuple(int(x) for x in header.split("(")[1].split(")")[0].split(",") if x.strip())
    return shape, raw[10 + hl:]


ids = ",".join(str(i) for i in prompt_ids())
ck_blob, ck_dump = os.path.join(OUT, "ckpt-legacy.bin"), os.path.join(OUT, "dump-ckpt")
rc, _, err = run([sys.executable, "export_weights.py", need_fixtures("checkpoint_legacy"), ck_blob])
check(rc == 0, "the checkpoint's blob exports", err[-300:])
shutil.rmtree(ck_dump, ignore_errors=True)
rc, _, err = run(["./zaya", ck_blob, "--ids", ids, "-n", "0", "--dump", ck_dump, "--dump-filter", "^logits$"])
check(rc == 0, "the checkpoint's blob runs", err[-300:])
ck_shape, ck_logits = logits(ck_dump)

for kind in ("F32", "Q8_0"):
    path, V = full_gguf(kind)
    blob, dump = os.path.join(OUT, f"compact-{kind}.bin"), os.path.join(OUT, f"dump-{kind}")
    rc, out, err = run([sys.executable, "export_weights.py", path, blob, "--tokenizer", need_fixtures("checkpoint_legacy")])
    check(rc == 0 and "checked against" in out, f"compact {kind} GGUF of the port's converter exports",
          f"rc {rc}: {err[-400:]}{out[-300:]}")
    shutil.rmtree(dump, ignore_errors=True)
    rc, _, err = run(["./zaya", blob, "--ids", ids, "-n", "0", "--dump", dump, "--dump-filter", "^logits$"])
    if not check(rc == 0, f"compact {kind}: zaya.c runs the blob", err[-300:]):
        continue
    shape, lg = logits(dump)
    T, Vck = ck_shape[-2], ck_shape[-1]
    check(shape == (T, V) and V <= Vck, f"compact {kind}: logits over the GGUF's {V} rows (the converter trims the "
          f"embedding to the tokenizer's size; the checkpoint has {Vck})", f"shape {shape}")
    first = b"".join(ck_logits[4 * Vck * t:4 * (Vck * t + V)] for t in range(T))
    if kind == "F32":
        check(lg == first, "compact F32: the blob's logits equal the checkpoint blob's bit for bit (same weights)",
              f"{sum(a != b for a, b in zip(lg[::4], first[::4]))} of {T * V} logits differ")
    else:
        check(lg != first, "compact Q8_0: the quantized weights change the logits", "identical to the checkpoint's")
        bt = blob_tensors(blob)
        g = gguf.GGUFFile(path)
        for native, gname in (("model.layers.1.self_attn.o_proj.weight", "blk.2.attn_output.weight"),
                              ("model.layers.0.mlp.experts.gate_up_proj", "blk.1.ffn_gate_up_exps.weight"),
                              ("model.layers.2.self_attn.qkv_proj.conv_qk_grouped.weight", "blk.4.cca_conv_grp.weight"),
                              ("model.layers.5.mlp.gate.router_mlp.out_proj.weight", "blk.11.zaya_router_mlp4.weight")):
            check(bt.get(native) == g.dequantize(gname).tobytes(),
                  f"compact Q8_0: {native} is {gname} ({g.tensors[gname].type}) as ggml dequantizes it",
                  "bytes differ" if native in bt else "not in the blob")
        g.close()
    # the whole blob: the Python twin (gguf.py dequantizing, Python writing) against dequantize.c --into
    py_blob = os.path.join(OUT, f"compact-{kind}-python.bin")
    rc, out, err = run([sys.executable, "export_weights.py", path, py_blob, "--tokenizer",
                        need_fixtures("checkpoint_legacy")], env={**os.environ, "ZAYA_GGUF_PYTHON": "1"})
    with open(blob, "rb") as f1, open(py_blob, "rb") as f2:
        same = rc == 0 and f1.read() == f2.read()
    check(same, f"compact {kind}: the blob of the Python dequantizer (ZAYA_GGUF_PYTHON=1) is dequantize.c's "
          "(written straight into the blob), byte for byte", f"rc {rc}: {err[-300:]}")

# the GGUF alone (a tokenizer folder without config.json): what the port computes, every layer full attention
path = os.path.join(OUT, "compact-F32.gguf")
blob, dump = os.path.join(OUT, "compact-F32-alone.bin"), os.path.join(OUT, "dump-alone")
rc, out, err = run([sys.executable, "export_weights.py", path, blob, "--tokenizer", need_fixtures("tokenizer")])
check(rc == 0 and "GGUF alone" in out, "compact F32 with a tokenizer folder only: hyper-parameters from the GGUF alone",
      f"rc {rc}: {err[-300:]}{out[-300:]}")
shutil.rmtree(dump, ignore_errors=True)
rc, _, err = run(["./zaya", blob, "--ids", ids, "-n", "0", "--dump", dump, "--dump-filter", "^logits$"])
if check(rc == 0, "the GGUF-alone blob runs", err[-300:]):
    with open(os.path.join(need_fixtures("checkpoint_legacy"), "config.json")) as f:
        sliding = any(json.load(f).get("swa_layers") or [])
    shape, lg = logits(dump)
    V = shape[-1]
    first = b"".join(ck_logits[4 * ck_shape[-1] * t:4 * (ck_shape[-1] * t + V)] for t in range(shape[0]))
    check((lg != first) == sliding, "the GGUF alone computes full attention everywhere (the compact fixture has "
          "sliding layers: its logits differ from the checkpoint's)", f"sliding layers {sliding}, logits equal {lg == first}")

# a tokenizer folder with another vocabulary size than the GGUF's own tokenizer.ggml.tokens
g = gguf.GGUFFile(path)
kv = [(k, g.kv_types[k], v) for k, v in g.kv.items()] + [("tokenizer.ggml.tokens", "array[string]", ["x"] * 1000)]
wrong = os.path.join(OUT, "compact-F32-1000-tokens.gguf")
gguf.write_gguf(wrong, kv, [(n, t.type, t.ne, bytes(g.raw(n))) for n, t in g.tensors.items()], g.alignment)
g.close()
rc, out, err = run([sys.executable, "export_weights.py", wrong, os.path.join(OUT, "x.bin"), "--tokenizer",
                    need_fixtures("checkpoint_legacy")])
check(rc == 1 and "does not match the GGUF's vocabulary" in err and "1000 token ids" in err,
      "a tokenizer folder whose size differs from the GGUF's tokenizer.ggml.tokens is refused", err[-400:])

# a checkpoint whose config.json disagrees with the GGUF's metadata
bad_dir = os.path.join(OUT, "mismatch")
os.makedirs(bad_dir, exist_ok=True)
with open(os.path.join(need_fixtures("checkpoint_legacy"), "config.json")) as f:
    cfg = json.load(f)
cfg["zaya_mlp_expansion"] += 4
with open(os.path.join(bad_dir, "config.json"), "w") as f:
    json.dump(cfg, f)
rc, out, err = run([sys.executable, "export_weights.py", path, os.path.join(OUT, "x.bin"), "--tokenizer", bad_dir])
check(rc == 1 and "differ from the checkpoint's config.json" in err and "router_hidden_size" in err,
      "a GGUF whose metadata differs from the checkpoint's config.json is refused, naming the key", err[-400:])

finish()
