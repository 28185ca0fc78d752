#!/usr/bin/env python3
"""test_replay.py - --replay and compare.py --local: where a port's error enters.

    make zaya && python3 test/test_replay.py

1. The official dumps replayed: every layer's local error at the float floor (fp32 golden of upstream
   and of Zyphra's fork: <= 1e-6 rel L2 per layer); compare.py --local agrees.
2. A port with an error in one layer only (the middle one, layer num_hidden_layers // 2), made by zaya.c
   from a copy of the checkpoint with one tensor of that layer changed (o_proj perturbed;
   router_states_scale zeroed = EDA off): the local comparison names that layer and the tap (o_proj;
   :router_state) while the end-to-end comparison has every later layer out of tolerance.
3. The hard cases in bf16 (compare.py --local --model --bf16, the two-tier verdict): a port whose last
   layer's experts use GELU instead of SiLU and one whose middle layer's o_proj output is 2 % too large
   (zaya.c built with that one change) drift from fp32 about as much as legitimate bf16 runs do; the local
   comparison names that layer's tap (test_legit.py has the router's tanh GELU and legitimate placements). A port whose Linear sums differ by a few float32 ulps passes. The official bf16 runs pass: the whole prompt computes like
   the official code (tier 1), token by token within the placements' envelope (tier 2); zaya.c run in
   vLLM's placement passes and is named closest to it.
4. A dump without the final norm and logits (not replayed); bad input: --replay without --dump, a dump
   missing a layer boundary, a truncated tensor.
"""
import json
import os
import shutil
import struct
import sys

from harness import BUILD, check, compare, dump_run, export_blob, finish, mutant, need_fixtures, prompt_ids, read_npy, rel_l2 as rel, run

FX = need_fixtures()
with open(os.path.join(FX, "checkpoint_native", "config.json")) as f:
    N_LAYERS = json.load(f)["num_hidden_layers"]
MID, LAST = N_LAYERS // 2, N_LAYERS - 1
os.makedirs(BUILD, exist_ok=True)
IDS = ",".join(map(str, prompt_ids()))
OUT = os.path.join(BUILD, "replay")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)


def export(ckpt, name, *extra):
    return export_blob(ckpt, OUT, name, *extra)


def dump(blob, name, *extra, zaya="./zaya"):
    return dump_run(zaya, blob, IDS, OUT, name, *extra)


def layer_of(name):
    return int(name.split(".")[2])


def layer_errors(text):
    """{layer: (local, end to end)} from compare.py --local's table."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0].isdigit() and f[1] != "-":
            rows[int(f[0])] = (float(f[1]), f[-3] if len(f) > 4 else None)
    return rows


def patched_checkpoint(name, tensor, edit):
    """A copy of the native fixture whose bf16 tensor `tensor` is edit(values)."""
    ck = os.path.join(OUT, name)
    shutil.copytree(os.path.join(FX, "checkpoint_native"), ck)
    path = os.path.join(ck, "model.safetensors")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header, base = json.loads(data[8:8 + n]), 8 + n
    a, b = header[tensor]["data_offsets"]
    values = [struct.unpack("<f", b"\0\0" + bytes(data[base + i:base + i + 2]))[0] for i in range(a, b, 2)]
    for k, v in enumerate(edit(values)):
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        data[base + a + 2 * k:base + a + 2 * k + 2] = struct.pack("<H", (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    with open(path, "wb") as f:
        f.write(data)
    return ck


fp32 = export(os.path.join(FX, "checkpoint_native"), "native_fp32")
bf16 = export(os.path.join(FX, "checkpoint_native"), "native_bf16", "--dtype", "bf16")
legacy = export(os.path.join(FX, "checkpoint_legacy"), "legacy_fp32")
reference = dump(fp32, "reference_fp32")

# 1. the official fp32 goldens replayed
for golden, blob, extra in (("golden", fp32, []), ("golden_zyphra", legacy, ["--skip-expert", "passthrough"])):
    official = os.path.join(OUT, "official_" + golden)
    rc, _, err = run([sys.executable, "tools/fixture_to_dump.py", os.path.join(FX, golden), official])
    replay = official + "_replay"
    rc2, _, err2 = run(["./zaya", blob, "--replay", official, "--dump", replay, *extra])
    check(rc == 0 and rc2 == 0, f"replay of the official {golden} dump", (err + err2)[-300:])
    rc, text = compare("--local", official, replay)
    errors = layer_errors(text)
    check(rc == 0 and len(errors) == N_LAYERS and max(e for e, _ in errors.values()) <= 1e-6,
          f"{golden}: every layer's local error <= 1e-6 rel L2 "
          f"(max {max([e for e, _ in errors.values()] or [float('nan')]):.2g}), compare.py --local agrees", text[-600:])

# 2. an error in the middle layer only
P = f"model.layers.{MID}."
cases = [("o_proj", P + "self_attn.o_proj.weight", lambda v: [x * 1.05 if k % 7 == 0 else x for k, x in enumerate(v)],
          P + "self_attn.o_proj"),
         ("eda_off", P + "mlp.gate.router_states_scale", lambda v: [0.0] * len(v), P + "mlp.gate:router_state")]
for name, tensor, edit, tap in cases:
    port = dump(export(patched_checkpoint("ck_" + name, tensor, edit), "port_" + name), "port_" + name)
    rc, e2e = compare(port, reference)
    later = [f"    {i} " in e2e and next(ln for ln in e2e.splitlines() if ln.startswith(f"    {i} ")).split()[2] != "0"
             for i in range(MID, N_LAYERS)]
    check(rc == 1 and all(later), f"{name}: end to end, every layer from {MID} on differs from the reference", e2e[-500:])
    rc, text = compare("--local", port, "--model", fp32, "--reference", reference)
    errors = layer_errors(text)
    print("\n".join("      " + ln for ln in text.splitlines() if ln[:5].strip().isdigit() or ln.startswith("layer")))
    check(rc == 1 and f"FIRST LOCAL ERROR: layer {MID}, {tap}" in text
          and all(errors[i][0] == 0 for i in range(N_LAYERS) if i != MID),
          f"{name}: the local comparison names layer {MID}, {tap}; every other layer's local error is 0",
          text[-500:])

# 3. the hard case in bf16: GELU instead of SiLU in the last layer's experts
silu = "gate[i] = held(b, silu_held(b, gate[i]) * up[i]);"
gelu = f"gate[i] = held(b, (b->layer == {LAST} ? held(b, gelu(gate[i])) : silu_held(b, gate[i])) * up[i]);"
gelu5 = mutant("gelu_last", [(silu, gelu)])
bug = dump(bf16, "port_gelu5", "--precision", "bf16-torch1.13", zaya=gelu5 or "false")
gold = need_fixtures("golden_bf16")
(L, T, H), official_pre = read_npy(os.path.join(gold, "hidden_states.npy"))
_, official_dec = read_npy(os.path.join(gold, "decode", "hidden_states.npy"))


last = slice((L - 1) * T * H, L * T * H)
bug_out = read_npy(os.path.join(bug, f"model.layers.{L - 1}.post_mlp_residual_scale.npy"))[1]
ref_out = read_npy(os.path.join(reference, f"model.layers.{L - 1}.post_mlp_residual_scale.npy"))[1]
spread = rel(official_dec[last], official_pre[last])
print(f"      last layer vs fp32: the bug {rel(bug_out, ref_out):.3g}, official bf16 {rel(official_pre[last], ref_out):.3g}, "
      f"official token by token {rel(official_dec[last], ref_out):.3g}; the bug vs official bf16 {rel(bug_out, official_pre[last]):.3g}, "
      f"two official bf16 runs {spread:.3g}")
decode_dump = os.path.join(OUT, "official_bf16_decode")
for src, dst in ((gold, os.path.join(OUT, "official_bf16")), (os.path.join(gold, "decode"), decode_dump)):
    rc, _, err = run([sys.executable, "tools/fixture_to_dump.py", src, dst])
    check(rc == 0, f"fixture_to_dump.py {os.path.relpath(src, FX)}", err[-300:])
o_proj2 = mutant("o_proj_2pct", [("    held_rows(b, y, w->rows, w->rows, b->n);\n    tap(b, name, y, w->rows, w->rows, 0);",
                                    f"    if (b->layer == {MID} && !strcmp(name, \"self_attn.o_proj\")) for (size_t k = 0; "
                                    "k < (size_t)b->n * w->rows; k++) y[k] *= 1.02f;\n"
                                    "    held_rows(b, y, w->rows, w->rows, b->n);\n    tap(b, name, y, w->rows, w->rows, 0);")])
o_proj2_dump = dump(bf16, "port_o_proj_2pct", "--precision", "bf16-torch1.13", zaya=o_proj2 or "false")
# legitimate: every Linear output moved by a few float32 ulps before its bf16 rounding (torch summing in another order)
other_order = mutant("linear_other_order", [("    held_rows(b, y, w->rows, w->rows, b->n);\n    tap(b, name, y, w->rows, w->rows, 0);",
                                             "    for (size_t k = 0; k < (size_t)b->n * w->rows; k++) y[k] *= 1.0f + "
                                             "(float)((int)((k * 2654435761u) >> 30) - 1) * 0x1p-22f;\n"
                                             "    held_rows(b, y, w->rows, w->rows, b->n);\n    tap(b, name, y, w->rows, w->rows, 0);")])
other_dump = dump(bf16, "port_other_order", "--precision", "bf16-torch1.13", zaya=other_order or "false")
vllm = dump(bf16, "port_vllm", "--precision", "bf16+fp32-residual+fp32-norm")
cases = [(bug, f"the GELU bug: layer {LAST}, mlp.experts", f"model.layers.{LAST}.mlp.experts", None),
         (o_proj2_dump, f"o_proj output 2 % too large in layer {MID}", f"model.layers.{MID}.self_attn.o_proj", None),
         (os.path.join(OUT, "official_bf16"), "official bf16 (whole prompt)", None, "computes like the official bf16 code"),
         (other_dump, "Linear sums in another order", None, "RESULT"),
         (decode_dump, "official bf16 (token by token)", None, "within the bf16 envelope"),
         (vllm, "zaya.c in vLLM's placement", None, "closest legitimate placement: vLLM")]
for port, what, located_at, passes in cases:
    rc, text = compare("--local", port, "--model", bf16, "--bf16", "--reference", reference)
    print("\n".join("      " + ln for ln in text.splitlines() if ln[:5].strip().isdigit() or ln.startswith(("layer", "TIER"))))
    if located_at:
        check(rc == 1 and f"FIRST LOCAL ERROR: layer {layer_of(located_at)}, {located_at}\n" in text,
              f"bf16, two-tier local comparison: {what} located", text[-600:])
    else:
        check(rc == 0 and passes in text and "RESULT: every layer agrees locally" in text,
              f"bf16, two-tier local comparison: {what} passes ({passes})", text[-600:])

# 4. bad input
rc, _, err = run(["./zaya", fp32, "--replay", reference])
check(rc != 0 and "--dump" in err and "Traceback" not in err, "--replay without --dump: refused with the usage", err[-200:])
holed = os.path.join(OUT, "holed")
shutil.copytree(reference, holed)
os.remove(os.path.join(holed, "model.layers.2.post_mlp_residual_scale.npy"))
rc, _, err = run(["./zaya", fp32, "--replay", holed, "--dump", os.path.join(OUT, "holed_replay")])
check(rc != 0 and "model.layers.2.post_mlp_residual_scale" in err and "hint" in err,
      "a dump without a layer boundary: the missing tensor named, with a hint", err[-300:])
cut = os.path.join(holed, "model.layers.1.post_mlp_residual_scale.npy")
with open(cut, "rb") as f:
    data = f.read()
with open(cut, "wb") as f:
    f.write(data[:len(data) // 2])
rc, _, err = run(["./zaya", fp32, "--replay", holed, "--dump", os.path.join(OUT, "cut_replay")])
check(rc != 0 and "cut short" in err and "model.layers.1" in err, "a truncated tensor: reported as cut short", err[-300:])
layers_only = os.path.join(OUT, "layers_only")   # a port that dumps no final norm or logits: the LM head is not replayed
shutil.copytree(o_proj2_dump, layers_only)
for f in ("logits.npy", "model.norm.npy"):
    os.remove(os.path.join(layers_only, f))
rc, _, err = run(["./zaya", bf16, "--replay", layers_only, "--dump", os.path.join(OUT, "layers_only_replay")])
check(rc == 0 and "the final norm and the LM head are not replayed" in err
      and not os.path.exists(os.path.join(OUT, "layers_only_replay", "logits.npy")),
      "a dump without model.norm and logits: the final norm and LM head are not replayed, and the log says so", err[-300:])
rc, text = compare("--local", layers_only, "--model", bf16, "--bf16")
check(rc == 1 and f"FIRST LOCAL ERROR: layer {MID}, model.layers.{MID}.self_attn.o_proj\n" in text,
      "... and the two-tier comparison still locates the o_proj bug", text[-400:])
rc, text = compare("--local", reference, reference)
check(rc == 2 and "not a replay" in text, "compare.py --local refuses a REPLAY that is not a replay", text[-300:])
finish()
