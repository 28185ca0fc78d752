#!/usr/bin/env python3
"""test_diagnose.py - weights or code: --local locates a code difference that every layer runs, and says the weights
differ only when the products that read weights are where the port departs (zaya_compare/diagnose.py).

    make zaya && python3 test/test_diagnose.py

Recorded runs of the OFFICIAL code (transformers' modeling_zaya on test/fixtures/checkpoint_native, first 8
positions of the fixture's prompt; test/fixtures/every/README.md), each with one code difference in every
layer (tools/golden_variant.py), judged against the checkpoint's own blob:
  fp32: the grouped conv rounding its kernel and input to F16 (llama.cpp's port), the router's GELUs as tanh,
        the sliding layers with the full layers' RoPE base, post_attention_residual_scale without residual_bias:
        --local must name that step in layer 0 and say the weights are the checkpoint's;
  bf16: the RoPE base, the residual bias and the router's tanh GELU (all 38 positions: its one element past
        the bound is at position 36), with --bf16 (the step check): layer 0, that step; without --bf16 the
        verdict says the port computes in bf16, not that its weights differ; the official bf16 code unchanged
        (none-bf16) agrees in every layer;
  llama-q8_0: llama.cpp's port on the converter's Q8_0 GGUF (bisect_llama.sh's mapped dump), judged on the
        GGUF's own weights: every product departs, but the weights are the port's: layer 0, q_proj;
  q8_0: the official code unchanged on the checkpoint's attention and expert matrices as ggml's Q8_0
        (test/fake_quant.py): YOUR WEIGHTS DIFFER, and no layer is blamed; --quant with the checkpoint's blob
        as --model (not the port's weights) says the same in its verdict.
"""
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, finish, need_fixtures, run, temp_dir  # noqa: E402

CK = need_fixtures("checkpoint_native")
EVERY = need_fixtures("every")
TMP = temp_dir("zaya_diagnose_")
BLOB = os.path.join(TMP, "fx.bin")
rc, _, err = run([sys.executable, "export_weights.py", CK, BLOB])
check(rc == 0, "export the checkpoint's blob", err[-300:])

CODE = [("conv_f16-fp32", "self_attn.qkv_proj.conv_qk_grouped"), ("router_gelu_tanh-fp32", "mlp.gate.router_mlp.fc2"),
        ("rope_sliding-fp32", "self_attn:query_after_rope"), ("no_residual_bias-fp32", "post_attention_residual_scale"),
        ("rope_sliding-bf16", "self_attn:query_after_rope"), ("no_residual_bias-bf16", "post_attention_residual_scale"),
        ("router_gelu_tanh-bf16", "mlp.gate.router_mlp.act_fn:fc1")]


def local(dump, *extra):
    rc, out, err = run([sys.executable, "compare.py", "--local", os.path.join(EVERY, dump), "--model", BLOB,
                        "--replay-out", os.path.join(TMP, dump.replace("-", "_") + "".join(extra).replace("-", "_")),
                        *extra])
    return rc, out + err


def verdict(text):
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(("FIRST", "YOUR", "EVERY", "THE PORT"))), len(lines))
    return "\n".join(lines[start:])


for dump, step in CODE:
    bf16 = dump.endswith("bf16")
    rc, text = local(dump, *(["--bf16"] if bf16 else []))
    want = f"FIRST LOCAL ERROR: layer 0, model.layers.0.{step}\n"
    ok = rc == 1 and want in text and "WEIGHTS DIFFER" not in text and "EVERY LAYER DIFFERS" not in text
    if not bf16:
        ok = ok and "the weights are the checkpoint's" in text \
            and "the same step is where the error enters in" in text
    check(ok, f"{dump}: --local names layer 0, {step}" + ("" if bf16 else
          " (the products before it agree: the weights are the checkpoint's; the same step in every layer)"),
          verdict(text)[-900:])

rc, text = local("none-bf16", "--bf16")
check(rc == 0 and "every layer agrees locally" in text and "LOCAL ERROR" not in text,
      "none-bf16 (the official bf16 code unchanged): every layer agrees locally", verdict(text)[-900:] or text[-900:])

rc, text = local("rope_sliding-bf16")
check(rc == 1 and "THE PORT COMPUTES IN BF16" in text and "--bf16" in text and "WEIGHTS DIFFER" not in text,
      "rope_sliding-bf16 without --bf16: the port computes in bf16 (pass --bf16), not other weights", verdict(text)[-600:])

rc, text = local("q8_0-fp32")
check(rc == 1 and "YOUR WEIGHTS DIFFER" in text and "FIRST LOCAL ERROR" not in text
      and "q_proj" in text and "k_proj" in text and "v_proj_current" in text and "--model PORTWEIGHTS.bin" in text,
      "q8_0-fp32 (the official code on Q8_0 weights): your weights differ (q_proj, k_proj, v_proj_* depart where "
      "input_layernorm agrees), no layer blamed", verdict(text)[-900:])

# --quant with a --model that is not the port's weights (here the checkpoint's, for a Q8_0 port): the same rule
COPY = os.path.join(TMP, "exact.bin")
with open(BLOB, "rb") as f, open(COPY, "wb") as g:
    g.write(f.read())
rc, out, err = run([sys.executable, "compare.py", "--quant", os.path.join(EVERY, "q8_0-fp32"), "--model", BLOB,
                    "--exact", COPY, "--replay-out", os.path.join(TMP, "quant")])
text = out + err
check(rc == 1 and f"VERDICT: the port's weights are not those of {BLOB}" in text and "adds error" not in text,
      "--quant with other weights than the port's: the verdict says so, not a layer", text[-700:])

# llama.cpp's port (7c5cc530) on the converter's Q8_0 GGUF of the fixture, judged on that GGUF's own weights (as
# bisect_llama.sh does): every product departs where its inputs agree, but the replay's blob comes from the GGUF,
# so the verdict is the first product (ggml's rounded activations), not "your weights differ"
import gguf  # noqa: E402
import export_weights as ew  # noqa: E402
g = gguf.GGUFFile(need_fixtures("gguf", "compact-Q8_0.gguf"))
k = "zaya_test.dropped.token_embd.weight."
ne, typ = g.kv[k + "ne"], g.kv[k + "type"]
st = ew.open_checkpoint(need_fixtures("checkpoint_legacy"))["model.embed_tokens.weight"]
emb = ew.bf16_to_f32(st.read("model.embed_tokens.weight", 0, 2 * ne[0] * ne[1]))
if typ == "F16":
    emb = struct.pack(f"<{ne[0] * ne[1]}e", *struct.unpack(f"<{ne[0] * ne[1]}f", emb))
check(hashlib.sha256(emb).hexdigest() == g.kv[k + "sha256"], "the Q8_0 GGUF's embedding put back byte for byte")
GG = os.path.join(TMP, "compact-Q8_0.gguf")
gguf.write_gguf(GG, [(key, g.kv_types[key], v) for key, v in g.kv.items() if not key.startswith("zaya_test.")],
                [("token_embd.weight", typ, tuple(ne), emb)] + [(n, t.type, t.ne, bytes(g.raw(n))) for n, t in g.tensors.items()],
                g.alignment)
g.close()
QB, QN = os.path.join(TMP, "q8.bin"), os.path.join(TMP, "q8-noskip.bin")
rc, _, err = run([sys.executable, "export_weights.py", GG, QB, "--tokenizer", need_fixtures("tokenizer")])
rc2, _, err2 = run([sys.executable, "tools/forbid_skip.py", QB, QN])
check(rc == 0 and rc2 == 0, "export the Q8_0 GGUF's weights (and forbid the skip class, as the bisect does)",
      (err + err2)[-300:])
rc, out, err = run([sys.executable, "compare.py", "--local", os.path.join(EVERY, "llama-q8_0"), "--model", QN,
                    "--replay-out", os.path.join(TMP, "llama_q8")])
text = out + err
check(rc == 1 and "FIRST LOCAL ERROR: layer 0, model.layers.0.self_attn.qkv_proj.q_proj\n" in text
      and "the replay's weights are the GGUF's own (compact-Q8_0.gguf" in text and "WEIGHTS DIFFER" not in text,
      "llama.cpp on its Q8_0 GGUF, replayed on that GGUF's weights: layer 0, q_proj (the products compute otherwise), "
      "not other weights", verdict(text)[-900:])
finish()
