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
   float32 cache's replay, and with +ggml-kv-f16 every tap is within tolerance.
"""
import os
import re
import shutil
import struct
import sys

from harness import BUILD, ROOT, check, finish, need_fixtures, run

sys.path.insert(0, ROOT)
import gguf  # noqa: E402

CAP = need_fixtures("llama_capture", "tiny-Q4_K_M")
GG = need_fixtures("gguf", "tiny-Q4_K_M.gguf")
TOK = need_fixtures("tokenizer")
LMAP = os.path.join(ROOT, "maps", "llama.cpp-zaya1.json")
OUT = os.path.join(BUILD, "ggml_capture")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
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
import zlib  # noqa: E402
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
bad = [(i, t, taps.get((i, t))) for i in range(L) for t in QKV if taps.get((i, t), (1, ""))[0] > 1e-6]
qerr = [taps.get((i, "self_attn.qkv_proj.q_proj"), (0, ""))[0] for i in range(L)]
check(L >= 2 and not bad, f"fp32+ggml: q_proj, k_proj, v_proj agree in every layer (<= 1e-6; q_proj "
      f"{' '.join(f'{x:.2g}' for x in qerr)})", str(bad[:4]))
check(rc == 1 and "FIRST LOCAL ERROR: layer 0, model.layers.0.self_attn.qkv_proj.conv_qk_grouped" in text,
      "fp32+ggml: the first local error is layer 0's grouped CCA convolution (the port's F16 conv)", text[-400:])

# 4. and the port's own choices: everything within tolerance
rc, text, taps = local("fp32+ggml+ggml-conv+ggml-gelu")
out = [(i, t, v) for (i, t), v in taps.items() if v[1] != "ok"]
check(taps and not out, f"fp32+ggml+ggml-conv+ggml-gelu: every one of {len(taps)} taps in tolerance in every layer",
      str(out[:4]) + text[-300:])

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
finish()
