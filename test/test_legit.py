#!/usr/bin/env python3
"""test_legit.py - the step check judges the step's arithmetic, not a list of placements (docs/compare.md §9).

    make zaya && python3 test/test_legit.py

1. Legitimate arithmetic passes the two-tier --local --bf16: a bf16 port that computes the residual
   scalings in float32 (zaya.c bf16-torch1.13+fp32-residual; before, tier 1's step check called it a
   FIRST LOCAL ERROR at post_attention_residual_scale): every tap within the rounding-error bound; tier 1
   only states where the port departs from the official rounding.
2. The router MLP's inner taps: a bf16 port whose layer-3 router GELU is the tanh approximation (llama.cpp's
   ggml_gelu) is located at model.layers.3.mlp.gate.router_mlp.act_fn:fc1 by the step check (end to end and
   by tier 2 it is within the bf16 envelope).
3. A port dump whose logits have the GGUF's narrower vocabulary (262,147 of the checkpoint's 262,272 rows):
   --local and --quant compare the rows both have and say so (before: a broadcast ValueError).
4. --json OUT is written by --local and --quant (before: silently ignored).
5. The frictions of a new porter: a --weights file that leaves matrices out lists them (NOT replaced) and
   --quant says so before its verdict; an int8 blob given as the port's weights is said; a U32-packed tensor
   gets the quantized-checkpoint hint (not "published in BF16"); a port without :router_state taps is said;
   the plain comparison of a port that diverges points to --local and --quant.
6. The real port through every view: the recorded capture of llama.cpp's ZAYA port (test/fixtures/llama_capture,
   F32 GGUF, skip class forbidden as the port routes): --local and --quant name layer 0's grouped convolution
   (its F16 im2col), --envelope names the sliding layers' RoPE (the port's one RoPE base), and portmap --steps
   names the router's GELU at its act_fn:fc1 tap (ggml_gelu's tanh table).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

from harness import BUILD, check, compare, dump_run, export_blob, finish, mutant, need_fixtures, prompt_ids, run

FX = need_fixtures()
OUT = os.path.join(BUILD, "legit")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
IDS = ",".join(map(str, prompt_ids()))


def export(name, *extra):
    return export_blob(os.path.join(FX, "checkpoint_native"), OUT, name, *extra)


def dump(blob, name, *extra, zaya="./zaya", ids=IDS):
    return dump_run(zaya, blob, ids, OUT, name, *extra)


bf16 = export("bf16", "--dtype", "bf16")
fp32 = export("fp32")

# 1. legitimate arithmetic in other placements
for prec in ("bf16-torch1.13+fp32-residual",):
    port = dump(bf16, "port_" + prec.replace("+", "_"), "--precision", prec)
    rc, text = compare("--local", port, "--model", bf16, "--bf16", "--replay-out", port + "_r")
    check(rc == 0 and "RESULT: every layer agrees locally" in text and "STEP CHECK" in text
          and "within the rounding-error bound of legitimate arithmetic" in text,
          f"{prec}: legitimate arithmetic passes the step check and the local verdict", text[-700:])
    check("TIER 1: computes like the official bf16 code up to" in text and "a statement, not an error" in text,
          f"{prec}: tier 1 says where it departs from the official rounding, as a statement", text[-700:])

# 2. the router's tanh GELU in one layer, bf16 rounding like the official code elsewhere
gelu = "    for (size_t i = 0; i < n; i++) x[i] = held(b, b->placement & ZAYA_GGML_GELU ? ggml_gelu(x[i]) : gelu(x[i]));"
tanh = ("    for (size_t i = 0; i < n; i++) x[i] = held(b, b->layer == 3 ? 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * "
        "(x[i] + 0.044715f * x[i] * x[i] * x[i]))) : gelu(x[i]));")
z = mutant("legit_router_gelu_tanh", [(gelu, tanh)])
port = dump(bf16, "port_gelu_tanh", "--precision", "bf16-torch1.13", zaya=z or "false")
rc, text = compare("--local", port, "--model", bf16, "--bf16", "--replay-out", port + "_r", "--json",
                   os.path.join(OUT, "gelu.json"))
tap = "model.layers.3.mlp.gate.router_mlp.act_fn:fc1"
check(rc == 1 and f"FIRST LOCAL ERROR: layer 3, {tap}\n" in text and f"first past the bound: {tap}" in text
      and "largest row error at position " in text.split("FIRST LOCAL ERROR")[-1] and "(token id " in text.split("FIRST LOCAL ERROR")[-1],
      "the router's tanh GELU in layer 3 is located at its act_fn:fc1 tap by the step check", text[-700:])
try:
    doc = json.load(open(os.path.join(OUT, "gelu.json")))
    ok = (doc.get("located") or [None])[0] == tap and doc.get("exit") == 1
except (OSError, ValueError) as e:
    ok, doc = False, str(e)
check(ok, "--local --bf16 --json OUT writes the verdict and every tap", str(doc)[:300])

# 3. a port with the GGUF's narrower vocabulary (its logits cut to 262,147 columns)
narrow = dump(fp32, "port_narrow", ids=",".join(IDS.split(",")[:8]))   # 8 positions: the logits are 8 MB
logits = np.load(os.path.join(narrow, "logits.npy"))
np.save(os.path.join(narrow, "logits.npy"), np.ascontiguousarray(logits[:, :262147]))
index = json.load(open(os.path.join(narrow, "index.json")))
for t in index["tensors"]:
    if t["name"] == "logits":
        t["shape"] = [logits.shape[0], 262147]
        for k in ("min", "max", "mean", "std", "abs_mean", "rms"):
            t.pop(k, None)
json.dump(index, open(os.path.join(narrow, "index.json"), "w"))
rc, text = compare("--local", narrow, "--model", fp32, "--replay-out", narrow + "_r", "--json", os.path.join(OUT, "l.json"))
check(rc == 0 and "Traceback" not in text and "RESULT: every layer agrees locally" in text
      and os.path.exists(os.path.join(OUT, "l.json")),
      "--local: a port with 262,147 vocabulary rows replayed on a 262,272-row blob agrees; --json written", text[-500:])
rc, text = compare("--quant", narrow, "--model", fp32, "--exact", bf16, "--replay-out", os.path.join(OUT, "q"),
                   "--json", os.path.join(OUT, "q.json"))
check("comparing the 262,147 rows both have" in text and "VERDICT" in text and "ValueError" not in text
      and "cannot compare" not in text, "--quant: the same port, no broadcast error, the shared rows said", text[-500:])
try:
    doc = json.load(open(os.path.join(OUT, "q.json")))
    ok = doc.get("view") == "quant" and len(doc.get("layers", [])) > 0
except (OSError, ValueError) as e:
    ok, doc = False, str(e)
check(ok, "--quant --json OUT writes the per-layer numbers and the verdict", str(doc)[:300])


# 5. frictions
def safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}"""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


cfg = json.load(open(os.path.join(FX, "checkpoint_native", "config.json")))
H, nq, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
o_proj = "model.layers.0.self_attn.o_proj.weight"
packed = os.path.join(OUT, "packed.safetensors")
safetensors(packed, {o_proj: ("U32", [H, nq * d // 8], b"\0" * (4 * H * nq * d // 8))})
rc, _, err = run([sys.executable, "export_weights.py", os.path.join(FX, "checkpoint_native"), os.path.join(OUT, "p.bin"),
                  "--weights", packed])
check(rc != 0 and "packed integers" in err and "published in BF16" not in err and "--weights" in err,
      "a U32-packed tensor: refused with the quantized-checkpoint hint", err[-400:])
one = os.path.join(OUT, "one.safetensors")
safetensors(one, {o_proj: ("F32", [H, nq * d], np.full(H * nq * d, 0.01, dtype="<f4").tobytes())})
rc, out, err = run([sys.executable, "export_weights.py", os.path.join(FX, "checkpoint_native"), os.path.join(OUT, "one.bin"),
                    "--weights", one])
check(rc == 0 and "NOT replaced" in out + err and "mlp.experts.gate_up_proj (layers 0-5)" in out + err,
      "--weights that leaves matrices out lists them (NOT replaced, with their layers)", (out + err)[-600:])
other = dump(os.path.join(OUT, "one.bin"), "port_other", ids=",".join(IDS.split(",")[:8]))   # computes on one.bin
ref = dump(fp32, "ref8", ids=",".join(IDS.split(",")[:8]))
rc, text = compare("--quant", other, "--model", os.path.join(OUT, "one.bin"), "--exact", fp32, "--replay-out",
                   os.path.join(OUT, "q1"))
check("keeps these matrices at the checkpoint's values" in text and "experts.gate_up_proj:0-5" in text
      and text.index("keeps these matrices") < text.index("VERDICT"),
      "--quant says which matrices the port's weights left at the checkpoint's values, before its verdict", text[-800:])
flips = [ln for ln in text.splitlines() if ln.startswith("  layer ") and " -> " in ln]
near_ok = lambda ln: "near-tie: margin" not in ln or float(ln.split("margin ")[1].split()[0]) < 0.02   # noqa: E731
check(rc == 0 and flips and all("a flip the weights explain" in ln or "near-tie: margin" in ln for ln in flips)
      and any("a flip the weights explain" in ln for ln in flips) and all(map(near_ok, flips)),
      f"--quant: the port's {len(flips)} routing flips against the exact model are ones its weights explain "
      f"(not near-ties)", "\n".join(flips[:6]) or text[-600:])
int8 = export("int8", "--dtype", "int8")
rc, text = compare("--quant", other, "--model", int8, "--exact", fp32, "--replay-out", os.path.join(OUT, "q2"))
check("int8 groups" in text and "VERDICT" in text, "--quant with an int8 blob as the port's weights says so", text[-600:])
flips = [ln for ln in text.splitlines() if ln.startswith("  layer ") and " -> " in ln]
check(any("a flip to check: margin" in ln and "the largest margin change the weights alone cause" in ln for ln in flips)
      and all(map(near_ok, flips)),
      "--quant: flips the weights given (int8) do not explain are flips to check, with the rule's numbers",
      "\n".join(flips[:6]) or text[-600:])
stateless = os.path.join(OUT, "port_stateless")      # a port that dumps no EDA state (mlp.gate:router_state)
shutil.copytree(narrow, stateless)
index = json.load(open(os.path.join(stateless, "index.json")))
index["tensors"] = [t for t in index["tensors"] if not t["name"].endswith(":router_state")]
json.dump(index, open(os.path.join(stateless, "index.json"), "w"))
for f in os.listdir(stateless):
    if f.endswith("router_state.npy"):
        os.remove(os.path.join(stateless, f))
rc, text = compare("--quant", stateless, "--model", fp32, "--exact", bf16, "--replay-out", os.path.join(OUT, "q3"))
check("no mlp.gate:router_state" in text and "dump :router_state" in text and "VERDICT" in text,
      "--quant of a port without :router_state taps says its routers start from zaya.c's state", text[-600:])
rc, text = compare(other, ref)
check(rc == 1 and "RESULT: DIVERGED at model." in text and ", position " in text.split("RESULT: DIVERGED")[1].split("\n")[0]
      and "(token id " in text.split("RESULT: DIVERGED")[1].split("\n")[0] and "--quant" in text and "--local" in text,
      "the plain comparison of a diverging port points to --local and --quant", text[-500:])

# 6. the real port's recorded capture through every view
CAP = need_fixtures("llama_capture", "compact-f32")
cap_ids = ",".join(map(str, json.load(open(os.path.join(CAP, "index.json")))["tokens"]))
lport = os.path.join(OUT, "llama_port")
rc, _, err = run([sys.executable, "-m", "zaya_compare.portmap", os.path.join("maps", "llama.cpp-zaya1.json"), CAP, lport])
check(rc == 0, "the llama.cpp map converts the recorded capture", err[-300:])
noskip = {}
for name, blob in (("fp32", fp32), ("bf16", bf16)):
    noskip[name] = os.path.join(OUT, name + "_noskip.bin")
    rc, _, err = run([sys.executable, "tools/forbid_skip.py", blob, noskip[name]])
    check(rc == 0, f"tools/forbid_skip.py {name}", err[-300:])
GRP = "model.layers.0.self_attn.qkv_proj.conv_qk_grouped"
rc, text = compare("--local", lport, "--model", noskip["fp32"], "--replay-out", os.path.join(OUT, "ll"), "--verbose")
report = os.path.join(OUT, "llama_local.txt")
open(report, "w").write(text)
check(rc == 1 and f"FIRST LOCAL ERROR: layer 0, {GRP}\n" in text, "real port, --local: layer 0's grouped convolution",
      text[-400:])
rc, out, err = run([sys.executable, "-m", "zaya_compare.portmap", "--steps", report])
check(rc == 0 and any(ln.split()[:1] == ["mlp.gate.router_mlp.act_fn:fc1"] for ln in out.splitlines()),
      "real port, portmap --steps: the router's GELU named at its act_fn:fc1 tap", (out + err)[-600:])
rc, text = compare("--quant", lport, "--model", noskip["fp32"], "--exact", fp32, "--replay-out", os.path.join(OUT, "lq"),
                   "--json", os.path.join(OUT, "lq.json"))
check(rc == 1 and f"VERDICT: layer 0, {GRP} adds error" in text and "Traceback" not in text
      and "largest row error at position " in text.split("VERDICT")[-1] and "(token id " in text.split("VERDICT")[-1],
      "real port, --quant: the same step, on the port's own weights, with the position where it departs most", text[-400:])
# a map that declares the port's weights quantized: --local and --quant on the checkpoint's blob say at once
qmap = json.load(open(os.path.join("maps", "llama.cpp-zaya1.json")))
qmap["weights"] = {"type": "Q4_K_M", "note": "llama-quantize Q4_K_M"}
json.dump(qmap, open(os.path.join(OUT, "q4.json"), "w"))
qport = os.path.join(OUT, "llama_q4")
rc, _, err = run([sys.executable, "-m", "zaya_compare.portmap", os.path.join(OUT, "q4.json"), CAP, qport])
wf = json.load(open(os.path.join(qport, "index.json"))).get("weight_format", {}) if rc == 0 else {}
check(wf.get("quantized") is True and wf.get("port_type") == "Q4_K_M", "a map's `weights` goes into the dump's index.json",
      str(wf) + err[-300:])
for view in (["--local", qport, "--model", noskip["fp32"]], ["--quant", qport, "--model", noskip["fp32"], "--exact", fp32]):
    rc, text = compare(*view, "--replay-out", os.path.join(OUT, "lq4"))
    check(rc == 2 and "declared quantized (Q4_K_M" in text and "export_weights.py MODEL.gguf" in text and "--weights" in text
          and "FIRST LOCAL ERROR" not in text and "VERDICT" not in text and not os.path.exists(os.path.join(OUT, "lq4_fp32")),
          f"{view[0]} of a port its map declares quantized, on the checkpoint's blob: needs the port's own weights, at once",
          text[-500:])
ref, env = dump(noskip["fp32"], "llama_ref", ids=cap_ids), dump(noskip["bf16"], "llama_env", "--precision", "bf16", ids=cap_ids)
rc, text = compare(lport, ref, "--envelope", env)
check(rc == 1 and "exceeds it first at model.layers.0.self_attn:query_after_rope" in text,
      "real port, --envelope: exceeds the bf16 envelope first at the sliding layer's RoPE (one RoPE base)", text[-400:])
finish()
