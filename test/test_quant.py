#!/usr/bin/env python3
"""test_quant.py - compare.py --quant and --local on a quantized port: is it the quantization or a bug?

    make zaya && python3 test/test_quant.py        (needs numpy: test/fake_quant.py, compare.py)

The compact fixture's attention and expert matrices quantized as ggml's Q8_0 and Q4_0 (test/fake_quant.py),
dequantized, written as PORT.safetensors and exported with export_weights.py --weights. For each type:
1. a port that computes exactly (zaya.c itself on those weights): --quant shows per layer the error the
   weights alone cause (nonzero everywhere, growing end to end) and says the port is as close to the exact
   model as its weights allow;
2. a port with one bug (a copy of zaya.c whose layer-3 experts scale SiLU(gate) x up by 1.03): --quant and
   --local --model PORTWEIGHTS.bin name layer 3, mlp.experts; --local with the checkpoint's blob does not
   blame a layer (q_proj, k_proj, v_proj_* depart where their input agrees: the weights differ) and says to
   pass the port's weights.
3. --quant without --exact, and with --exact the same file as --model: exit 2 with a hint.
"""
import json
import os
import shutil

from harness import BUILD, check, compare, dump_run, export_blob, finish, mutant, need_fixtures, prompt_ids
from fake_quant import quantized_port, read_safetensors, write_safetensors

FX = need_fixtures()
CK = os.path.join(FX, "checkpoint_native")
with open(os.path.join(CK, "config.json")) as f:
    N_LAYERS = json.load(f)["num_hidden_layers"]
BUG = N_LAYERS // 2
OUT = os.path.join(BUILD, "quant")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
IDS = ",".join(map(str, prompt_ids()))


def export(name, *extra):
    return export_blob(CK, OUT, name, *extra)


def dump(zaya, blob, name):
    return dump_run(zaya, blob, IDS, OUT, name, "--dump-filter", "^model")   # no logits: 40 MB each


def table(text, first_col="layer"):
    """{layer: [columns]} of the per-layer table that follows the header starting with `first_col`."""
    rows, on = {}, False
    for line in text.splitlines():
        f = line.split()
        if f[:1] == [first_col]:
            on = True
        elif on and f and f[0].isdigit():
            rows[int(f[0])] = f[1:]
        elif on and rows:
            break
    return rows


def show(text):
    print("\n".join("      " + ln for ln in text.splitlines() if ln[:5].strip().isdigit() or ln.startswith(("layer", "VERDICT", "EVERY", "FIRST"))))


exact = export("exact")
ckpt = read_safetensors(os.path.join(CK, "model.safetensors"))
silu = "gate[i] = held(b, silu_held(b, gate[i]) * up[i]);"
buggy = mutant("quant_experts_scaled", [(silu, f"gate[i] = held(b, (b->layer == {BUG} ? 1.03f : 1.0f) * silu_held(b, gate[i]) * up[i]);")])
for qtype in ("q8_0", "q4_0"):
    st = os.path.join(OUT, f"port_{qtype}.safetensors")
    write_safetensors(st, quantized_port(ckpt, qtype))
    weights = export(qtype, "--weights", st)
    port = dump("./zaya", weights, f"port_{qtype}")

    # 1. a port that computes exactly on its weights
    rc, text = compare("--quant", port, "--model", weights, "--exact", exact)
    show(text)
    t = table(text)
    alone = [float(t[i][0]) for i in range(N_LAYERS)] if len(t) == N_LAYERS else []
    check(rc == 0 and "as close to the exact model as its weights allow" in text and alone
          and all(a > 1e-4 for a in alone) and alone[-1] > alone[0]
          and all(t[i][1] == t[i][0] and t[i][4] == "0" for i in range(N_LAYERS)),
          f"{qtype}: --quant shows the weights' own error in every layer ({', '.join(f'{a:.3g}' for a in alone)}) "
          "and passes the exact port", text[-600:])

    # 2. one injected bug
    if not buggy:
        continue
    bug = dump(buggy, weights, f"bug_{qtype}")
    rc, text = compare("--quant", bug, "--model", weights, "--exact", exact)
    show(text)
    check(rc == 1 and f"VERDICT: layer {BUG}, model.layers.{BUG}.mlp.experts adds error the weights do not explain" in text,
          f"{qtype}: --quant locates the bug at layer {BUG}, mlp.experts", text[-600:])
    rc, text = compare("--local", bug, "--model", weights, "--replay-out", os.path.join(OUT, f"rw_{qtype}"))
    errors = table(text)
    check(rc == 1 and f"FIRST LOCAL ERROR: layer {BUG}, model.layers.{BUG}.mlp.experts" in text
          and all(errors[i][0] == "0" for i in range(N_LAYERS) if i != BUG),
          f"{qtype}: --local --model PORTWEIGHTS.bin locates it; every other layer's local error is 0", text[-600:])
    rc, text = compare("--local", bug, "--model", exact, "--replay-out", os.path.join(OUT, f"rx_{qtype}"))
    show(text)
    for d in os.listdir(OUT):         # the replays hold the logits; keep the disk use of one type at a time
        if os.path.isdir(os.path.join(OUT, d)) and qtype in d:
            shutil.rmtree(os.path.join(OUT, d))
    check(rc == 1 and "YOUR WEIGHTS DIFFER" in text and "--weights PORT.safetensors" in text
          and "layer 0: every product that reads a weight departs where its inputs agree" in text
          and "FIRST LOCAL ERROR" not in text,
          f"{qtype}: --local with the checkpoint's blob blames no layer: the weights differ (q_proj, k_proj, v_proj_* "
          "depart where input_layernorm agrees); pass the port's weights", text[-900:])

# 3. bad input
rc, text = compare("--quant", port, "--model", weights)
check(rc == 2 and "--exact" in text and "hint" in text and "Traceback" not in text, "--quant without --exact: exit 2", text[-300:])
rc, text = compare("--quant", port, "--model", weights, "--exact", weights)
check(rc == 2 and "same file" in text and "Traceback" not in text, "--quant with --exact = --model: exit 2", text[-300:])
finish()
