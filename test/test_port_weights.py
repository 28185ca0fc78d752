#!/usr/bin/env python3
"""test_port_weights.py - export_weights.py --weights: a port's own weights in place of the checkpoint's.

    make zaya && python3 test/test_port_weights.py        (needs numpy: test/fake_quant.py)

1. A Q8_0 port of the compact fixture (test/fake_quant.py: ggml's Q8_0 on the attention and expert
   matrices, dequantized, written as F32 safetensors under HF names): every replaced tensor is listed,
   and the blob's dump (every tap, the logits) is byte-identical to the dump of a blob exported from a copy
   of the checkpoint whose model.safetensors holds the same values.
2. Stored exactly: with --dtype bf16 the Q8_0 values (not bf16 numbers) are stored fp32, a BF16 port
   tensor bf16; with --dtype int8 a replaced matrix is not quantized again.
3. Refused with what, where, expected vs found and a hint: a name the model does not have, the tied
   lm_head.weight, a legacy name, a transposed matrix, an I8 tensor.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

from harness import BUILD, check, finish, need_fixtures, prompt_ids, run
from fake_quant import quantized_port, read_safetensors, write_safetensors

FX = need_fixtures()
CK = os.path.join(FX, "checkpoint_native")
OUT = os.path.join(BUILD, "port_weights")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
IDS = ",".join(map(str, prompt_ids()))


def export(ckpt, name, *extra):
    blob = os.path.join(OUT, name + ".bin")
    rc, out, err = run([sys.executable, "export_weights.py", ckpt, blob, *extra])
    return rc, out, err, blob


def dump_files(blob, name):
    d = os.path.join(OUT, name)
    rc, _, err = run(["./zaya", blob, "--ids", IDS, "--dump", d])
    check(rc == 0, f"dump {name}", err[-300:])
    files = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".npy"):
            with open(os.path.join(d, f), "rb") as fh:
                files[f] = fh.read()
    return files


def blob_entries(blob):
    """{name: dtype code} from the blob's tensor directory (docs/blob-format.md)."""
    with open(blob, "rb") as f:
        head = f.read(1 << 16)
    n, hsize = struct.unpack_from("<I", head, 32)[0], 1024
    out = {}
    for k in range(n):
        e = head[hsize + 192 * k:hsize + 192 * (k + 1)]
        out[e[:128].rstrip(b"\0").decode()] = struct.unpack_from("<I", e, 128)[0]
    return out


ckpt = read_safetensors(os.path.join(CK, "model.safetensors"))
port = quantized_port(ckpt, "q8_0")
port_st = os.path.join(OUT, "port_q8_0.safetensors")
write_safetensors(port_st, port)

# 1. replaced tensors listed; the same result as a checkpoint edited the same way
rc, out, err, blob = export(CK, "port_q8_0", "--weights", port_st)
listed = {ln.split()[1] for ln in out.splitlines() if ln.strip().startswith("replaced ")}
check(rc == 0 and listed == set(port) and f"{len(port)} of " in out,
      f"--weights: the {len(port)} replaced tensors are listed, no other", (err or out)[-400:])
edited = os.path.join(OUT, "ck_edited")
shutil.copytree(CK, edited)
whole = {n: (port[n] if n in port else v) for n, v in ckpt.items()}
write_safetensors(os.path.join(edited, "model.safetensors"), whole)
rc2, _, err2, blob2 = export(edited, "ck_edited")
check(rc2 == 0, "export of the edited checkpoint", err2[-300:])
a, b = dump_files(blob, "dump_port"), dump_files(blob2, "dump_edited")
same = [f for f in a if a[f] == b.get(f)]
check(len(a) > 100 and len(same) == len(a) == len(b) and "logits.npy" in a,
      f"the --weights blob's dump equals the edited checkpoint's blob's, byte for byte ({len(same)} of {len(a)} files)",
      f"differ: {sorted(set(a) - set(same))[:5]}")
plain = dump_files(export(CK, "exact")[3], "dump_exact")
check(plain["logits.npy"] != a["logits.npy"], "the port's weights change the logits (the replacement took effect)")

# 2. stored exactly, whatever --dtype says
rc, out, err, blob = export(CK, "port_q8_0_bf16", "--dtype", "bf16", "--weights", port_st)
codes = blob_entries(blob)
name0 = "model.layers.0.mlp.experts.gate_up_proj"
check(rc == 0 and all(codes[n] == 0 for n in port) and codes["model.embed_tokens.weight"] == 1
      and "stored fp32" in out, "--dtype bf16: Q8_0 values stored fp32, the other matrices bf16", (err or out)[-300:])
bf_st = os.path.join(OUT, "port_bf16.safetensors")
bfv = (port[name0].view(np.uint32) & 0xFFFF0000).view(np.float32)     # bf16 numbers, written as F32
write_safetensors(bf_st, {name0: bfv}, "F32")
rc, out, err, blob = export(CK, "port_bf16", "--dtype", "bf16", "--weights", bf_st)
check(rc == 0 and blob_entries(blob)[name0] == 1 and "stored bf16" in out,
      "--dtype bf16: F32 values that are bf16 numbers stored bf16", (err or out)[-300:])
rc, out, err, blob = export(CK, "port_int8", "--dtype", "int8", "--weights", port_st)
codes = blob_entries(blob)
check(rc == 0 and all(codes[n] == 0 for n in port) and codes["model.embed_tokens.weight"] == 2,
      "--dtype int8: replaced matrices stored fp32, not quantized again", (err or out)[-300:])

# 3. refusals
bad = [("unknown name", {"model.layers.0.self_attn.q_proj.weight": port["model.layers.0.self_attn.qkv_proj.q_proj.weight"]},
        "F32", ["model.layers.0.self_attn.q_proj.weight", "does not have", "q_proj.weight"]),
       ("tied head", {"lm_head.weight": ckpt["model.embed_tokens.weight"][:4]}, "F32", ["lm_head.weight", "tied"]),
       ("legacy name", {"model.layers.1.zaya_block.router.balancing_biases": np.zeros(5, np.float32)}, "F32", ["legacy"]),
       ("transposed", {"model.layers.2.self_attn.o_proj.weight": port["model.layers.2.self_attn.o_proj.weight"].T},
        "F32", ["wrong shape", "[16, 32]", "[32, 16]", "model.layers.2.self_attn.o_proj.weight"])]
for what, tensors, dtype, words in bad:
    p = os.path.join(OUT, what.replace(" ", "_") + ".safetensors")
    write_safetensors(p, tensors, dtype)
    rc, out, err, blob = export(CK, "bad", "--weights", p)
    check(rc == 1 and all(w in err for w in words) and "hint:" in err and "expected:" in err
          and "Traceback" not in err and not os.path.exists(blob),
          f"refused: {what} (what, where, expected vs found, hint; no blob written)", err[-400:])
i8 = os.path.join(OUT, "i8.safetensors")
h = json.dumps({"model.norm.weight": {"dtype": "I8", "shape": [16], "data_offsets": [0, 16]}}).encode()
with open(i8, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + bytes(16))
rc, out, err, _ = export(CK, "bad", "--weights", i8)
check(rc == 1 and "I8" in err and "Traceback" not in err, "refused: an I8 tensor", err[-300:])
finish()
