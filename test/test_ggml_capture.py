#!/usr/bin/env python3
"""test_ggml_capture.py - the bisect's compare step on a recorded capture of the real llama.cpp ZAYA port running a
Q4_K_M GGUF (made by the port's llama-quantize), without llama.cpp: ggml's CPU arithmetic as a placement.

Fixtures (test/fixtures/llama_capture/README.md): llama_capture/tiny-Q4_K_M/ (tools/llama_capture.cpp's dump of
the GGUF on 8 ids, logits left out) and gguf/tiny-Q4_K_M.gguf (the GGUF with its embedding and tokenizer arrays
left out by tools/gguf_strip.py). The replay takes layer 0's input from the capture, so the test puts back an
all-zero embedding of the recorded shape (Q4_0 blocks of zeros) and exports the port's weights from the GGUF
alone (what the port computes: full attention everywhere, one RoPE base), as tools/bisect_llama.sh does.

1. The blob records each tensor's ggml type (the name field's tail, docs/blob-format.md).
2. The plain float32 replay blames ggml's arithmetic on the port: the first local error is layer 0's q_proj.
3. With --precision fp32+ggml (each product's input quantized as ggml's CPU backend does for its weight type) q,
   k and v agree in every layer, and the first local error is the grouped CCA convolution, as on the F32 GGUF.
4. With the port's two own choices too (+ggml-conv: the conv in F16; +ggml-gelu: ggml_gelu's F16 tanh table)
   every tap of every layer is within tolerance.
5. A capture of the same GGUF with an F16 KV cache (llama_capture --kv f16): attention differs in every layer from a
   float32 cache's replay, and with +ggml-kv-f16 every tap is within tolerance. With flash attention (--fa on, F16
   cache; llama.cpp's default on the CPU) it differs from +ggml-kv-f16's, and +ggml-fa agrees in every layer.
6. The steps that add error (zaya_compare.portmap --steps, with the step check of zaya_compare/ggml.py: each product
   recomputed from the port's own input to it as ggml computes it) of the Q4_K_M capture replayed with fp32+ggml equal
   those of a capture of the port running an F32 GGUF of the same values (llama_capture/tiny-Q4_K_M-f32), replayed in
   float32; o_proj and the experts, whose error grows through ggml's requantization, are not among them.
7. A product the port computes otherwise is still named: the replay's blob with layer 1's o_proj x 1.02, then layer 0's
   experts x 1.015 (the port runs the GGUF's): that step is listed, its step check departs.
8. zaya_compare/ggml.py's quantizers bit for bit against ggml's (test/fixtures/ggml_round), Q8_1's second scale too,
   and its Q4_1 / Q5_1 product against ggml's vec_dot.
"""
import os
import re
import shutil
import struct
import sys
import zlib

from harness import BUILD, ROOT, check, finish, need_fixtures, run, temp_dir

sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import forbid_skip  # noqa: E402
import gguf  # noqa: E402

CAP = need_fixtures("llama_capture", "tiny-Q4_K_M")
GG = need_fixtures("gguf", "tiny-Q4_K_M.gguf")
TOK = need_fixtures("tokenizer")
LMAP = os.path.join(ROOT, "maps", "llama.cpp-zaya1.json")
os.makedirs(BUILD, exist_ok=True)
OUT = temp_dir("ggml_capture_", BUILD)     # this run's own folder (tests may run in parallel)
PY = sys.executable

# the GGUF with an all-zero embedding of the recorded shape (its values never reach the replay)
g = gguf.GGUFFile(GG)
k = "zaya_test.dropped.token_embd.weight."
ne = g.kv[k + "ne"]
zeros = bytes(ne[0] * ne[1] // 32 * 18)          # Q4_0 blocks with d = 0
kv = [(key, g.kv_types[key], v) for key, v in g.kv.items() if not key.startswith("zaya_test.")]
tensors = [("token_embd.weight", "Q4_0", tuple(ne), zeros)] + [
    (name, t.type, t.ne, bytes(g.raw(name))) for name, t in g.tensors.items()]
types = sorted({t.type for t in g.tensors.values()})
path = os.path.join(OUT, "tiny-Q4_K_M.gguf")
gguf.write_gguf(path, kv, tensors, g.alignment)
g.close()

blob = os.path.join(OUT, "port-weights.bin")
rc, out, err = run([PY, "export_weights.py", path, blob, "--tokenizer", TOK])
check(rc == 0, f"the port's Q4_K_M GGUF exports (types {', '.join(types)})", err[-400:])
noskip = os.path.join(OUT, "port-weights-noskip.bin")
rc, _, err = run([PY, "tools/forbid_skip.py", blob, noskip])
check(rc == 0, "tools/forbid_skip.py", err[-300:])

# 1. the ggml types in the blob
with open(noskip, "rb") as f:
    head = f.read(1 << 16)
(n,) = struct.unpack_from("<I", head, 32)
tagged = {}
for i in range(n):
    e = 1024 + 192 * i
    name = head[e:e + 128].split(b"\0")[0].decode()
    (t,) = struct.unpack_from("<I", head, e + 124)
    tagged[name] = gguf.GGML_TYPE_NAMES.get(t - 1, "none") if t else "none"
q = tagged.get("model.layers.0.self_attn.qkv_proj.q_proj.weight")
check(q in ("Q4_K", "Q5_K", "Q6_K") and tagged.get("model.layers.0.input_layernorm.weight") == "F32"
      and all(v != "none" for v in tagged.values()),
      f"the blob records each tensor's ggml type (q_proj {q}; every one of {n} tensors tagged)",
      str({k: v for k, v in tagged.items() if v == "none"})[:300])

# a ggml type out of range in a name field's tail is refused with its message (the header CRC is recomputed)
with open(noskip, "rb") as f:
    data = bytearray(f.read(1 << 20))
O_PROJ = b"model.layers.0.self_attn.o_proj.weight\0"
e = next(1024 + 192 * i for i in range(n) if head[1024 + 192 * i:].startswith(O_PROJ))
struct.pack_into("<I", data, e + 124, 200)
struct.pack_into("<I", data, 12, 0)
struct.pack_into("<I", data, 12, zlib.crc32(bytes(data[:1024]) + bytes(data[1024:1024 + 192 * n])) & 0xFFFFFFFF)
bad_blob = os.path.join(OUT, "bad-ggml-type.bin")
shutil.copyfile(noskip, bad_blob)
with open(bad_blob, "r+b") as f:
    f.write(data[:1024 + 192 * n])
rc, o, e = run(["./zaya", bad_blob, "--ids", "2", "-n", "0"])
check(rc != 0 and "records ggml type 200" in e and "o_proj" in e, "a blob whose name field records ggml type 199 is "
      "refused, naming the tensor", f"rc {rc}: {e[-300:]}")

# the capture under zaya.c's names
port = os.path.join(OUT, "port")
rc, o, e = run([PY, "-m", "zaya_compare.portmap", LMAP, CAP, port])
check(rc == 0, "the llama.cpp map converts the recorded Q4_K_M capture", (o + e)[-300:])

TAP = re.compile(r"^\s+model\.layers\.(\d+)[.:](\S+)\s+local\s+(\S+)\s+env\s+\S+\s+tol\s+(\S+)\s+(ok|OUT)$")
QKV = ["self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj", "self_attn.qkv_proj.v_proj_current"]


def local(precision, port=port):
    """compare.py --local --model with the replay at `precision`: (exit status, text, {(layer, tap): (err, ok)})."""
    replay = os.path.join(OUT, os.path.basename(port) + "_replay_" + (precision or "fp32").replace("+", "_"))
    args = [PY, "compare.py", "--local", port, "--model", noskip, "--replay-out", replay, "--verbose"]
    rc, o, e = run(args + (["--precision", precision] if precision else []))
    taps = {(int(m.group(1)), m.group(2)): (float(m.group(3)), m.group(5))
            for m in filter(None, map(TAP.match, o.splitlines()))}
    return rc, o + e, taps


# 2. plain float32: ggml's activation quantization shows as the port's error at the first product
rc, text, taps = local(None)
L = 1 + max((i for i, _ in taps), default=-1)
qerr = [taps.get((i, "self_attn.qkv_proj.q_proj"), (0, ""))[0] for i in range(L)]
check(rc == 1 and "layer 0, model.layers.0.self_attn.qkv_proj.q_proj" in text and min(qerr) > 1e-3,
      f"plain float32 replay: the first local error is layer 0's q_proj (ggml's Q8_K activations; q_proj local error "
      f"{' '.join(f'{x:.2g}' for x in qerr)})", text[-400:])

# 3. fp32+ggml: q, k, v agree in every layer; the first local error is the grouped conv, as on the F32 GGUF
rc, text, taps = local("fp32+ggml")
text_q = text
bad = [(i, t, taps.get((i, t))) for i in range(L) for t in QKV if taps.get((i, t), (1, ""))[0] > 1e-6]
qerr = [taps.get((i, "self_attn.qkv_proj.q_proj"), (0, ""))[0] for i in range(L)]
check(L >= 2 and not bad, f"fp32+ggml: q_proj, k_proj, v_proj agree in every layer (<= 1e-6; q_proj "
      f"{' '.join(f'{x:.2g}' for x in qerr)})", str(bad[:4]))
check(rc == 1 and "FIRST LOCAL ERROR: layer 0, model.layers.0.self_attn.qkv_proj.conv_qk_grouped" in text,
      "fp32+ggml: the first local error is layer 0's grouped CCA convolution (the port's F16 conv)", text[-400:])

# 4. and the port's own choices: every tap within tolerance, or within its step check (the router's act_fn:fc2
# reads ggml's F16 GELU table at the replay's own act_fn:fc1, which may round to the other half: an F16 step)
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu")
agree = {ln.split()[1] for ln in text.splitlines() if ln.startswith("  step ") and " agrees " in ln}
out = [(i, t, v) for (i, t), v in taps.items() if v[1] != "ok" and f"model.layers.{i}.{t}" not in agree]
check(rc == 0 and taps and not out and "every layer agrees locally" in text,
      f"fp32+ggml+ggml-conv+ggml-gelu: every one of {len(taps)} taps in tolerance in every layer, or within its step "
      f"check; every layer agrees locally", str(out[:4]) + text[-300:])

# 5. the same GGUF run with an F16 KV cache (llama_capture --kv f16, no flash attention): +ggml-kv-f16
port16 = os.path.join(OUT, "port_kvf16")
rc, o, e = run([PY, "-m", "zaya_compare.portmap", LMAP, need_fixtures("llama_capture", "tiny-Q4_K_M-kvf16"), port16])
check(rc == 0, "the llama.cpp map converts the recorded capture with an F16 KV cache", (o + e)[-300:])
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu", port16)
att = [taps.get((i, "self_attn:attn_output"), (0, ""))[0] for i in range(L)]
check(rc == 1 and min(att) > 1e-4, f"F16 KV cache, replayed with a float32 cache: attention differs in every layer "
      f"({' '.join(f'{x:.2g}' for x in att)})", text[-300:])
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu+ggml-kv-f16", port16)
out = [(i, t, v) for (i, t), v in taps.items() if v[1] != "ok"]
check(rc == 0 and taps and not out, f"F16 KV cache, +ggml-kv-f16: every one of {len(taps)} taps in tolerance",
      str(out[:4]) + text[-300:])

# 5b. the same GGUF with llama.cpp's default attention on the CPU, flash attention (-fa auto turns it on; F16 cache):
# the plain F16-cache replay departs at attention, +ggml-fa (ggml-cpu's one-chunk flash attention) agrees everywhere
portfa = os.path.join(OUT, "port_fa")
rc, o, e = run([PY, "-m", "zaya_compare.portmap", LMAP, need_fixtures("llama_capture", "tiny-Q4_K_M-fa"), portfa])
check(rc == 0, "the llama.cpp map converts the recorded capture with flash attention", (o + e)[-300:])
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu+ggml-kv-f16", portfa)
att = [taps.get((i, "self_attn:attn_output"), (0, ""))[0] for i in range(L)]
check(rc == 1 and "FIRST LOCAL ERROR: layer 0, model.layers.0.self_attn:attn_output" in text and min(att) > 1e-4,
      f"flash attention, replayed as ggml's attention without it (F16 cache): attention differs in every layer "
      f"({' '.join(f'{x:.2g}' for x in att)})", text[-300:])
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu+ggml-fa", portfa)
att = [taps.get((i, "self_attn:attn_output"), (0, ""))[0] for i in range(L)]
check(rc == 0 and "every layer agrees locally" in text,
      f"flash attention, +ggml-fa: every layer agrees locally (attention {' '.join(f'{x:.2g}' for x in att)})",
      text[-300:])


# 6. steps that add error: the step check judges each product on the port's own input to it. A capture of the
# port running an F32 GGUF with the Q4_K_M GGUF's own values (llama-quantize --allow-requantize ... F32) replayed in
# plain float32, and the Q4_K_M capture replayed with fp32+ggml: the same steps, in the same layers
def steps(text):
    """{tap: layers} of zaya_compare.portmap --steps's "steps that add error", and of its "grows ... while the step
    check agrees" lines."""
    rep = os.path.join(OUT, "report.txt")
    with open(rep, "w") as f:
        f.write(text)
    rc, o, e = run([PY, "-m", "zaya_compare.portmap", "--steps", rep])
    adds, amp, part = {}, {}, None
    for ln in o.splitlines():
        if ln.startswith("steps that add error"):
            part = adds
        elif ln.startswith("steps whose error grows"):
            part = amp
        elif part is not None and ln.startswith("  ") and " layers " in ln:
            tap, rest = ln.split(None, 1)
            part[tap] = [int(x) for x in rest.split("local error")[0].split()[1:]]
    return adds, amp, o


portf = os.path.join(OUT, "port_f32")
rc, o, e = run([PY, "-m", "zaya_compare.portmap", LMAP, need_fixtures("llama_capture", "tiny-Q4_K_M-f32"), portf])
check(rc == 0, "the llama.cpp map converts the recorded capture of the F32 GGUF of the Q4_K_M's values", (o + e)[-300:])
rc, text_f, taps_f = local(None, portf)
adds_f, amp_f, out_f = steps(text_f)
adds_q, amp_q, out_q = steps(text_q)      # check 3's report
GRP = "self_attn.qkv_proj.conv_qk_grouped"
check(adds_f.get(GRP) == [0, 1] and "mlp.gate.router_mlp.act_fn:fc1" in adds_f,
      f"F32 GGUF, plain float32: the steps that add error are the port's two own choices (the grouped conv in F16 in "
      f"every layer, ggml's tanh GELU in the router MLP): {adds_f}", out_f[-600:])
check(adds_q == adds_f, f"Q4_K_M, fp32+ggml: the steps that add error are the F32 GGUF's, in the same layers ({adds_q})",
      f"Q4_K_M {adds_q} vs F32 {adds_f}\n{out_q[-700:]}")
grown = [t for t in ("self_attn.o_proj", "mlp.experts", "mlp.gate.router_mlp") if t in amp_q]
check(not any(t in adds_q for t in ("self_attn.o_proj", "mlp.experts")) and grown,
      f"Q4_K_M: {', '.join(grown)} grow beyond their inputs' error (ggml's requantization of an input the conv moved) "
      f"but their step check agrees: not listed as the port's", out_q[-700:])


# 7. a real difference in a product is still located: the replay's blob with one product scaled (the port computes
# the GGUF's): layer 1's o_proj x 1.02, then layer 0's experts' down_proj x 1.015
def scale_in_place(path, name, factor):
    """Blob `path`'s float32 tensor `name` times factor, in place (its CRC and the header's updated); returns the
    tensor's old bytes for restore_in_place. In place: the blob is 290 MB (the recorded embedding's shape)."""
    with open(path, "r+b") as f:
        hdr, diroff, d, entries = forbid_skip.read_directory(f, path)
        e = entries[name]
        (dtype,) = struct.unpack_from("<I", d, e + 128)
        off, size = struct.unpack_from("<QQ", d, e + 168)
        assert dtype == 0, f"{name} is not float32"
        f.seek(off)
        old = f.read(size)
        data = old if factor is None else struct.pack(f"<{size // 4}f", *[v * factor for v in
                                                                          struct.unpack(f"<{size // 4}f", old)])
        return old, write_tensor(f, hdr, d, diroff, e, off, data)


def write_tensor(f, hdr, d, diroff, e, off, data):
    forbid_skip.patch_tensor(f, d, e, off, data)
    forbid_skip.write_header(f, hdr, d, diroff)
    return (hdr, d, diroff, e, off)


def restore_in_place(path, saved):
    old, (hdr, d, diroff, e, off) = saved
    with open(path, "r+b") as f:
        write_tensor(f, hdr, d, diroff, e, off, old)


for tensor, tap, layer, factor in (("model.layers.1.self_attn.o_proj.weight", "self_attn.o_proj", 1, 1.02),
                                   ("model.layers.0.mlp.experts.down_proj", "mlp.experts", 0, 1.015)):
    saved = scale_in_place(noskip, tensor, factor)
    replay = os.path.join(OUT, f"bug_replay_{tap}")
    rc, o, e = run([PY, "compare.py", "--local", port, "--model", noskip, "--replay-out", replay, "--verbose",
                    "--precision", "fp32+ggml"])
    restore_in_place(noskip, saved)
    adds_b, _, out_b = steps(o)
    step_line = next((ln for ln in o.splitlines() if f"step model.layers.{layer}.{tap} " in ln), "")
    check(layer in adds_b.get(tap, []) and "departs" in step_line and adds_b.get(GRP) == [0, 1],
          f"the port's {tap} of layer {layer} computing with weights x{factor} of the blob's, Q4_K_M, fp32+ggml: named "
          f"among the steps that add error (its step check departs), beside the grouped conv",
          f"{adds_b}\n{step_line}\n{out_b[-500:]}")
rc, o, e = run(["./zaya", noskip, "--verify", "--ids", "2", "-n", "0"])
check(rc == 0, "the blob restored (zaya --verify: every CRC)", e[-300:])

# 8. the step check's quantizers (zaya_compare/ggml.py, numpy) equal ggml's own values bit for bit, Q8_1's second scale
# too, and its Q4_1 / Q5_1 product is ggml's vec_dot to float32 summation (test/fixtures/ggml_round)
import numpy as np  # noqa: E402
from zaya_compare import ggml as G  # noqa: E402
FX = need_fixtures("ggml_round")
ld = lambda name, *shape: np.fromfile(os.path.join(FX, name + ".f32"), dtype="<f4").reshape(shape)  # noqa: E731
x = ld("input", 8, 512)
with np.errstate(all="ignore"):
    for fx, wt, x86 in (("Q8_0", G.Q8_0, True), ("Q8_0_ref", G.Q8_0, False), ("Q8_1", G.Q4_1, True),
                        ("Q8_K", 12, True), ("F16", G.F16, True), ("BF16", G.BF16, True)):
        got, want = G.quantize(x, wt, x86), ld(fx, 8, 512)
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        check(not bad.size, f"zaya_compare.ggml: the input as ggml's {fx} holds it, bit for bit ({x.size} values)",
              f"{bad.size} differ; first at {bad[:1]}: {got.reshape(-1)[bad[:1]]} vs ggml {want.reshape(-1)[bad[:1]]}")
    y = G.q8_0(x, True)[0].reshape(-1, 32).astype(np.float64)
    s = (G.q8_1_s_excess(x, True).reshape(-1) + y.sum(axis=1)).astype(np.float32)
    bad = np.flatnonzero(s.view(np.uint32) != ld("Q8_1_s", 128).view(np.uint32))
    check(not bad.size, "zaya_compare.ggml: Q8_1's second scale s equals ggml's, bit for bit (128 blocks)", str(bad[:5]))
    for t, wt in (("Q4_1", G.Q4_1), ("Q5_1", G.Q5_1)):
        W = ld(t + "_w", 16, 512).astype(np.float64)
        xq = G.quantize(x, wt).astype(np.float64)
        yy = xq @ W.T + G.q8_1_s_excess(x) @ W.reshape(16, -1, 32).min(axis=-1).T
        err = float((np.abs(yy - ld(t + "_dot", 8, 16)) / np.maximum(np.abs(xq) @ np.abs(W).T, 1e-30)).max())
        check(err < 1e-6, f"zaya_compare.ggml: the {t} product with Q8_1's second scale = ggml's vec_dot to float32 "
              f"summation (largest |difference| / sum|w||x| {err:.2g})", f"{err}")
finish()
