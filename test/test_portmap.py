#!/usr/bin/env python3
"""test_portmap.py - port name maps (zaya_compare/portmap.py, docs/compare.md §9) on a made-up port and on
recorded captures of the real llama.cpp ZAYA port.

    make zaya && python3 test/test_portmap.py          (the converter needs a python3 with numpy)

1. An imaginary MLX-like port, its map written from docs/compare.md §9 alone: other names, a batch axis,
   split heads [B, heads, T, d], channels-first convolutions with the padded column, merged value heads,
   a router state without batch axis, one tap only approximated (its attention output cast to bf16). Its
   capture is made from zaya.c's own dump of the fixture by hand-written numpy (not by the converter);
   the converted dump must equal zaya.c's dump bit for bit, hold the approximate tap only under
   approximate/, and compare.py must agree with zaya.c (plain and --local).
2. Map errors are loud: a head axis read the wrong way round (same sizes, other values) is a divergence
   at that tap, never silence; axes that contradict the shapes, an unknown dump name, an approximate
   entry without `why`, a map that names nothing in the capture: exit 2 with a message.
3. The recorded capture of the real llama.cpp ZAYA port (test/fixtures/llama_capture/, written by
   tools/llama_capture.cpp from the compact fixture's F32 GGUF, see its README): converted by
   maps/llama.cpp-zaya1.json and replayed by zaya.c on the fixture's weights with the skip class
   forbidden (tools/forbid_skip.py), compare.py --local names what the real run named (layer 0's grouped
   CCA convolution, which the port computes in F16), every tap before it in that layer agrees, and the
   taps that the F16 convolution cannot reach agree in every layer.
"""
import json
import os
import re
import shutil
import subprocess
import sys

from harness import BUILD, ROOT, check, finish, need_fixtures, prompt_ids, read_npy, run

FX = need_fixtures()
OUT = os.path.join(BUILD, "portmap")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)


def numpy_python():
    """A python3 that has numpy (the converter needs it): this one, else Debian's."""
    for py in (sys.executable, "/usr/bin/python3", "python3"):
        try:
            if subprocess.run([py, "-c", "import numpy"], stderr=subprocess.DEVNULL).returncode == 0:
                return py
        except OSError:
            pass
    return None


PY = numpy_python()
if not check(PY is not None, "a python3 with numpy for zaya_compare.portmap", "install python3-numpy"):
    finish()


def portmap(*args):
    rc, out, err = run([PY, "-m", "zaya_compare.portmap", *args])
    return rc, out + err


def compare(*args):
    rc, out, err = run([sys.executable, "compare.py", *args])
    return rc, out + err


# ------------------------------------------------------------------------------------------------
# 1. an imaginary MLX-like port

blob = os.path.join(OUT, "fx.bin")
rc, _, err = run([sys.executable, "export_weights.py", os.path.join(FX, "checkpoint_native"), blob])
check(rc == 0, "export the fixture", err[-300:])
IDS = prompt_ids()
ref = os.path.join(OUT, "zaya")
rc, _, err = run(["./zaya", blob, "--ids", ",".join(map(str, IDS)), "-n", "0", "--dump", ref])
check(rc == 0, "zaya.c's dump of the fixture", err[-300:])
with open(os.path.join(ref, "index.json")) as f:
    REF = {t["name"]: t for t in json.load(f)["tensors"]}
with open(os.path.join(FX, "checkpoint_native", "config.json")) as f:
    CFG = json.load(f)
L, NQ, NKV, D = CFG["num_hidden_layers"], CFG["num_attention_heads"], CFG["num_key_value_heads"], CFG["head_dim"]

# The map, written from docs/compare.md §9 for a port that names and lays out everything its own way.
MLX_MAP = {
    "format": "zaya-portmap/1",
    "port": {"name": "mlx-zaya (imaginary)", "commit": "0000000"},
    "order": "numpy",
    "precision": "fp32",
    "tensors": [
        {"port": "embed.scaled", "name": "model:input_scaled", "axes": "B T H"},
        {"port": "blocks.{i}.attn_norm", "name": "model.layers.{i}.input_layernorm", "axes": "B T H"},
        {"port": "blocks.{i}.attn.q", "name": "model.layers.{i}.self_attn.qkv_proj.q_proj", "axes": "B nq T d"},
        {"port": "blocks.{i}.attn.k", "name": "model.layers.{i}.self_attn.qkv_proj.k_proj", "axes": "B nkv T d"},
        {"port": "blocks.{i}.attn.conv0", "name": "model.layers.{i}.self_attn.qkv_proj.conv_qk_depthwise",
         "axes": "B C T", "slice": {"T": "1:"}},
        {"port": "blocks.{i}.attn.conv1", "name": "model.layers.{i}.self_attn.qkv_proj.conv_qk_grouped", "axes": "B C T"},
        {"port": "blocks.{i}.attn.v", "name": "model.layers.{i}.self_attn.qkv_proj:value", "axes": "B T (nkv d)"},
        {"port": "blocks.{i}.attn.q_normed", "name": "model.layers.{i}.self_attn.qk_norm:query", "axes": "B nq T d"},
        {"port": "blocks.{i}.attn.k_normed", "name": "model.layers.{i}.self_attn.qk_norm:key", "axes": "B nkv T d"},
        {"port": "blocks.{i}.attn.q_rope", "name": "model.layers.{i}.self_attn:query_after_rope", "axes": "B nq T d"},
        {"port": "blocks.{i}.attn.k_rope", "name": "model.layers.{i}.self_attn:key_after_rope", "axes": "B nkv T d"},
        {"port": "blocks.{i}.attn.sdpa", "name": "model.layers.{i}.self_attn:attn_output", "axes": "B T (nq d)",
         "match": "approximates", "why": "the port casts the attention output to bf16 before o_proj"},
        {"port": "blocks.{i}.attn.out", "name": "model.layers.{i}.self_attn.o_proj", "axes": "B T H"},
        {"port": "blocks.{i}.h_attn", "name": "model.layers.{i}.post_attention_residual_scale", "axes": "B T H"},
        {"port": "blocks.{i}.router.state", "name": "model.layers.{i}.mlp.gate:router_state", "axes": "T R"},
        {"port": "blocks.{i}.router.probs", "name": "model.layers.{i}.mlp.gate:router_probs", "axes": "B T E1"},
        {"port": "blocks.{i}.router.choice", "name": "model.layers.{i}.mlp.gate.router_indices", "axes": "B T k"},
        {"port": "blocks.{i}.moe", "name": "model.layers.{i}.mlp.experts", "axes": "B T H"},
        {"port": "blocks.{i}.h_out", "name": "model.layers.{i}.post_mlp_residual_scale", "axes": "B T H"},
        {"port": "norm", "name": "model.norm", "axes": "B T H"},
    ],
}
map_path = os.path.join(OUT, "mlx_like.json")
with open(map_path, "w") as f:
    json.dump(MLX_MAP, f, indent=1)

# The port's capture, made by hand from zaya.c's dump (numpy, the inverse of each layout).
SYNTH = r'''
import json, os, sys
import numpy as np
ref, raw, L, NQ, NKV, D = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
os.makedirs(raw, exist_ok=True)
idx = json.load(open(os.path.join(ref, "index.json")))
z = lambda n: np.load(os.path.join(ref, n.replace(":", "~") + ".npy"))
T = len(idx["tokens"])
out = {"embed.scaled": z("model:input_scaled")[None], "norm": z("model.norm")[None]}
for i in range(L):
    p, q = f"model.layers.{i}.", f"blocks.{i}."
    heads = lambda x, n: x.reshape(T, n, D).transpose(1, 0, 2)[None]          # [T, n*d] -> [B, n, T, d]
    out[q + "attn_norm"] = z(p + "input_layernorm")[None]
    out[q + "attn.q"] = heads(z(p + "self_attn.qkv_proj.q_proj"), NQ)
    out[q + "attn.k"] = heads(z(p + "self_attn.qkv_proj.k_proj"), NKV)
    dw = z(p + "self_attn.qkv_proj.conv_qk_depthwise").T                        # channels first [C, T]
    out[q + "attn.conv0"] = np.concatenate([np.full((dw.shape[0], 1), 7.0, np.float32), dw], 1)[None]
    out[q + "attn.conv1"] = z(p + "self_attn.qkv_proj.conv_qk_grouped").T[None]
    out[q + "attn.v"] = z(p + "self_attn.qkv_proj:value").reshape(T, NKV * D)[None]
    for a, b, n in (("q_normed", "self_attn.qk_norm:query", NQ), ("k_normed", "self_attn.qk_norm:key", NKV),
                    ("q_rope", "self_attn:query_after_rope", NQ), ("k_rope", "self_attn:key_after_rope", NKV)):
        out[q + "attn." + a] = z(p + b).transpose(1, 0, 2)[None]
    x = z(p + "self_attn:attn_output").astype(np.float32)
    bits = x.view(np.uint32)
    out[q + "attn.sdpa"] = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)[None]
    out[q + "attn.out"] = z(p + "self_attn.o_proj")[None]
    out[q + "h_attn"] = z(p + "post_attention_residual_scale")[None]
    out[q + "router.state"] = z(p + "mlp.gate:router_state")
    out[q + "router.probs"] = z(p + "mlp.gate:router_probs")[None]
    out[q + "router.choice"] = z(p + "mlp.gate.router_indices").astype(np.int64).reshape(1, T, 1)
    out[q + "moe"] = z(p + "mlp.experts")[None]
    out[q + "h_out"] = z(p + "post_mlp_residual_scale")[None]
for n, a in out.items():
    np.save(os.path.join(raw, n + ".npy"), a)
json.dump({"tokens": idx["tokens"], "model": {"path": "fx.safetensors"}}, open(os.path.join(raw, "index.json"), "w"))
'''
raw = os.path.join(OUT, "mlx_raw")
rc, _, err = run([PY, "-c", SYNTH, ref, raw, str(L), str(NQ), str(NKV), str(D)])
check(rc == 0, "synthesize the MLX-like port's capture", err[-400:])
conv = os.path.join(OUT, "mlx_dump")
rc, text = portmap(map_path, raw, conv)
check(rc == 0, "convert the MLX-like capture with its map", text[-400:])
with open(os.path.join(conv, "index.json")) as f:
    got = json.load(f)
names = [t["name"] for t in got["tensors"]]
want = 2 + L * 17          # 18 entries a layer, one of them approximate
check(len(names) == want and got["tokens"] == IDS and got["producer"]["program"] == "mlx-zaya (imaginary)",
      f"the dump holds {want} tensors under zaya.c's names, the ids and the port", f"{len(names)} tensors: {names[:5]}")
bad = []
for n in names:
    s1, a = read_npy(os.path.join(conv, n.replace(":", "~") + ".npy"))
    s2, b = read_npy(os.path.join(ref, REF[n]["file"]))
    if list(s1) != list(s2) or list(a) != list(b):
        bad.append(f"{n} {list(s1)} vs {list(s2)}")
check(not bad and len(names) == want, "every converted tensor equals zaya.c's dump bit for bit (shapes and values)",
      "; ".join(bad[:4]))
approx = os.path.join(conv, "approximate")
with open(os.path.join(approx, "index.json")) as f:
    anames = [t["name"] for t in json.load(f)["tensors"]]
check(anames == [f"model.layers.{i}.self_attn:attn_output" for i in range(L)]
      and not any(n.endswith(":attn_output") for n in names),
      "the approximate tap (bf16 attention output) is only under approximate/, never judged", f"{anames} / {names[:3]}")
rc, text = compare(conv, ref)
check(rc == 0 and "RESULT: AGREE" in text, "compare.py: the converted MLX-like dump agrees with zaya.c", text[-400:])
rc, text = compare("--local", conv, "--model", blob, "--replay-out", os.path.join(OUT, "mlx_replay"))
check(rc == 0 and "every layer agrees locally" in text, "compare.py --local: every layer agrees", text[-400:])
rc, text = portmap("--approximate", approx, os.path.join(OUT, "mlx_replay_fp32"))
m = re.search(r"model\.layers\.0\.self_attn:attn_output\s+([0-9.e+-]+)", text)
check(rc == 0 and m and 1e-4 < float(m.group(1)) < 1e-2, "the approximate tap is shown beside the replay (bf16-sized "
      "distance)", text[-300:])

# ------------------------------------------------------------------------------------------------
# 2. map errors are loud


def variant(name, edit):
    m = json.loads(json.dumps(MLX_MAP))
    edit(m)
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def set_axes(port, axes):
    def edit(m):
        next(e for e in m["tensors"] if e["port"] == port)["axes"] = axes
    return edit


# the k heads read in the wrong order: [B, T, nkv, d] sizes would not fit; [B, nkv, T, d] -> "B nkv d T"? d != T.
# The silent kind: (nkv d) vs (d nkv) in the merged value axis: the same sizes, other values.
bad_map = variant("swapped_value_heads", set_axes("blocks.{i}.attn.v", "B T (d nkv)"))
rc, text = portmap(bad_map, raw, os.path.join(OUT, "bad_dump"))
rc2, text2 = compare(os.path.join(OUT, "bad_dump"), ref)
check(rc == 0 and rc2 == 1 and "FIRST DIVERGENCE: model.layers.0.self_attn.qkv_proj:value" in text2,
      "a merged axis read the wrong way round is a divergence at that tap, not silence", (text + text2)[-400:])
for name, edit, expect in [
        ("axes_vs_shape", set_axes("blocks.{i}.attn.q", "B T nq d"), "has"),
        ("unknown_name", lambda m: m["tensors"].append({"port": "x", "name": "model.layers.{i}.self_attn.nope",
                                                        "axes": "T H"}), "not a zaya.c dump name"),
        ("no_why", lambda m: m["tensors"][11].pop("why"), "must say `why`"),
        ("nothing_named", lambda m: [e.update(port="other." + e["port"]) for e in m["tensors"]], "none of the map's"),
        ("bad_placeholder", lambda m: m["tensors"][2].update(port="blocks.{i*2}.attn.q"), "not a*i+b")]:
    rc, text = portmap(variant(name, edit), raw, os.path.join(OUT, "err_" + name))
    check(rc == 2 and expect in text and "Traceback" not in text, f"map error {name}: exit 2, says what",
          f"rc {rc}: {text[-300:]}")

# ------------------------------------------------------------------------------------------------
# 3. the recorded capture of the real llama.cpp ZAYA port (compact fixture, F32 GGUF, the first 12 ids)
CAP = need_fixtures("llama_capture", "compact-f32")
LMAP = os.path.join(ROOT, "maps", "llama.cpp-zaya1.json")
with open(os.path.join(CAP, "index.json")) as f:
    CAP_IDS = json.load(f)["tokens"]
T = len(CAP_IDS)
SLIDING = [i for i, t in enumerate(CFG.get("layer_types") or []) if t == "hybrid_sliding"]
FULL = [i for i in range(L) if i not in SLIDING]
lport = os.path.join(OUT, "llama_port")
rc, text = portmap(LMAP, CAP, lport)
with open(os.path.join(lport, "index.json")) as f:
    lidx = json.load(f)
lnames = [t["name"] for t in lidx["tensors"]]
check(rc == 0 and len(lnames) == 3 + 28 * L and lidx["tokens"] == CAP_IDS and lidx["portmap"]["layers"] == L
      and lidx["producer"]["commit"].startswith("7c5cc530"),
      f"the llama.cpp map turns the recorded capture into {3 + 28 * L} tensors under zaya.c's names ({L} layers from "
      f"{2 * L} half-layers)", text[-300:] + f" {len(lnames)}")
noskip = os.path.join(OUT, "fx_noskip.bin")
rc, _, err = run([sys.executable, "tools/forbid_skip.py", blob, noskip])
check(rc == 0, "tools/forbid_skip.py", err[-300:])
rc, text = compare("--local", lport, "--model", noskip, "--replay-out", os.path.join(OUT, "llama_replay"), "--verbose")
report = os.path.join(OUT, "llama_local.txt")
with open(report, "w") as f:
    f.write(text)
print("\n".join("      " + ln for ln in text.splitlines() if ln[:5].strip().isdigit() or ln.startswith(("layer", "FIRST"))))
TAP = re.compile(r"^\s+model\.layers\.(\d+)[.:](\S+)\s+local\s+(\S+)\s+env\s+\S+\s+tol\s+(\S+)\s+(ok|OUT)$")
taps = {}
for m in filter(None, map(TAP.match, text.splitlines())):
    taps[(int(m.group(1)), m.group(2))] = (float(m.group(3)), m.group(5))
GRP = "self_attn.qkv_proj.conv_qk_grouped"
check(rc == 1 and f"FIRST LOCAL ERROR: layer 0, model.layers.0.{GRP}" in text,
      "the real port's first local error: layer 0's grouped CCA convolution (the port's F16 im2col)", text[-400:])
UPSTREAM = ["input_layernorm", "self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj",
            "self_attn.qkv_proj.conv_qk_depthwise", "self_attn.qkv_proj:query_residual",
            "self_attn.qkv_proj:key_residual", "self_attn.qkv_proj.v_proj_current", "self_attn.qkv_proj:value"]
bad = [(i, t, taps.get((i, t))) for i in range(L) for t in UPSTREAM if taps.get((i, t), (1, ""))[0] > 1e-6]
check(not bad, "every mapped tap the F16 convolution cannot reach agrees in every layer (<= 1e-6 rel L2): the map is "
      "right there", str(bad[:4]))
grp = [taps.get((i, GRP), (0, ""))[0] for i in range(L)]
check(all(1e-4 < e < 5e-4 for e in grp), "conv_qk_grouped: an F16-sized local error (1e-4..5e-4) in every layer",
      str(grp))
rc, steps = portmap("--steps", report)
print("\n".join("      " + ln for ln in steps.splitlines() if ln.strip()))


def step_layers(tap):
    m = re.search(r"^\s+" + re.escape(tap) + r"\s+layers ([0-9 ]+?)\s+local error", steps, re.M)
    return [int(x) for x in m.group(1).split()] if m else []


check(step_layers(GRP) == list(range(L)) and step_layers("self_attn:query_after_rope") == SLIDING
      and set(step_layers("self_attn:attn_output")) == set(SLIDING) and SLIDING,
      f"steps that add error: the grouped conv in every layer; RoPE and attention in the sliding layers {SLIDING} only "
      f"(the port has one RoPE base and no window)", steps[-600:])
check(any(i in FULL for i in step_layers("mlp.gate.router_mlp.act_fn:fc1")),
      f"steps that add error: the router MLP's first GELU (act_fn:fc1) in a full-attention layer (ggml's tanh GELU "
      f"from an F16 table)", steps[-400:])
rows = {int(ln.split()[0]): ln.split() for ln in text.splitlines() if ln[:5].strip().isdigit()}
check(all(rows[i][3] == f"{T}/{T}" for i in FULL), "with the skip class forbidden the full-attention layers route "
      "every position as the port does", str(rows))
rc, text2 = compare("--local", lport, "--model", blob, "--replay-out", os.path.join(OUT, "llama_replay_skip"))
rows2 = {int(ln.split()[0]): ln.split() for ln in text2.splitlines() if ln[:5].strip().isdigit()}
check(any(rows2[i][2] != f"{T}/{T}" for i in FULL), "with the checkpoint's own biases zaya.c picks the skip class where "
      "the port cannot: a routing difference by design", str(rows2))
ref12 = os.path.join(OUT, "zaya12")
rc, _, err = run(["./zaya", noskip, "--ids", ",".join(map(str, CAP_IDS)), "-n", "0", "--dump", ref12])
rc2, glob = portmap("--globals", lport, ref12)
check(rc == 0 and rc2 == 0 and re.search(r"model\.embed_tokens\s+rel L2 0, worst row 0: agrees", glob)
      and re.search(r"model:input_scaled\s+rel L2 0, worst row 0: agrees", glob),
      "outside the layers: the port's embedding rows and layer 0's input equal zaya.c's bit for bit", err + glob)
# a map error shows, it does not pass: the value heads read (nkv d) instead of (d nkv) (same sizes)
with open(LMAP) as f:
    bad_map = json.load(f)
next(e for e in bad_map["tensors"] if e["port"] == "Vcur-{2i}")["axes"] = "(nkv d) T"
bad_path = os.path.join(OUT, "llama_bad.json")
with open(bad_path, "w") as f:
    json.dump(bad_map, f)
rc, _ = portmap(bad_path, CAP, os.path.join(OUT, "llama_bad_port"))
rc2, text3 = compare("--local", os.path.join(OUT, "llama_bad_port"), os.path.join(OUT, "llama_replay_fp32"), "--verbose")
m = re.search(r"model\.layers\.0\.self_attn\.qkv_proj:value\s+local\s+(\S+).*(OUT|ok)$", text3, re.M)
check(rc == 0 and m and m.group(2) == "OUT", "a map error (value heads read the wrong way round) is a local error at "
      "that tap, not an agreement", text3[-300:])

finish()
