#!/usr/bin/env python3
"""mlx_port.py - an MLX port of a ZAYA1 checkpoint, quantized and saved as mlx-vlm saves it (needs mlx, mlx-vlm).

    /work/venv/bin/python tools/mlx_port.py LEGACY_CKPT OUT_DIR [--recipe mixed|affine4|...] [--ids 2,818,...]
                                            [--dump PORT.safetensors] [--dequantized DEQ.safetensors]

The port is mlx-vlm's own ZAYA model (mlx_vlm/models/zaya1_vl/language.py, LanguageModel: the text part of
ZAYA1-VL; mlx-lm has no ZAYA model), built from a legacy-layout checkpoint (docs/architecture.md 2.4):
its half-layers 2i / 2i+1 are mlx-vlm's blocks' `attn` / `mlp`, its sanitize() stacks the experts and
transposes the convolutions to MLX's [out, kernel, in]. The model is then quantized with mlx.nn.quantize
and written as mlx-vlm writes a quantized model: model.safetensors (names under `language_model.`,
metadata format=mlx) and config.json with "quantization" (and its copy "quantization_config") holding the
defaults and one entry per module that differs (false = kept in float). OUT_DIR is what
`export_weights.py OUT_DIR OUT.bin` reads.

Recipes (MLX needs rows that are a multiple of the group size; a row that is not is kept in float):
  mixed:   every matrix whose row allows it: 4-bit affine, group 64 (group 32 where 64 does not divide);
           rows of 16 (the compact fixture's hidden size): nvfp4 (group 16); the embedding kept (--keep-embedding)
  affineB: B-bit affine (B = 2..8), group 32; other rows kept
  mxfp4, mxfp8, nvfp4: that mode wherever the row allows it
  none:    nothing quantized (the port's own computation on the checkpoint's weights)

--dequantized writes every quantized matrix as mx.dequantize gives it (float32, under the legacy names,
experts per expert, as the checkpoint lays them out): what export_weights.py must read from OUT_DIR.
--dump runs the port on the ids on the CPU (float32 activations) and writes its per-layer outputs as a
zaya.c-style dump folder (.npy + index.json) (compare.py's tap names: model.embed_tokens,
model.layers.{i}.post_mlp_residual_scale
= the residual stream after layer i, model.layers.{i}.mlp.gate:router_state, model.norm, logits).
"""
import argparse
import json
import os
import shutil
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_vlm.models.zaya1_vl.config import TextConfig
from mlx_vlm.models.zaya1_vl.language import LanguageModel

mx.set_default_device(mx.cpu)


def load_legacy(ckpt):
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    weights = {}
    for fn in sorted(os.listdir(ckpt)):
        if fn.endswith(".safetensors"):
            weights.update(mx.load(os.path.join(ckpt, fn)))
    return cfg, weights


def to_vl_names(weights):
    """Legacy half-layer names -> mlx-vlm's block names (model.layers.{i}.attn / .mlp)."""
    out = {}
    for n, v in weights.items():
        parts = n.split(".")
        if n.startswith("model.layers."):
            j = int(parts[2])
            n = f"model.layers.{j // 2}.{'mlp' if j % 2 else 'attn'}." + ".".join(parts[3:])
        out[n] = v
    return out


def recipe_predicate(recipe, keep_embedding):
    def pred(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        if keep_embedding and path.endswith("embed_tokens"):
            return False
        cols = module.weight.shape[-1]
        if recipe == "none":
            return False
        if recipe == "mixed":
            if cols % 64 == 0:
                return {"group_size": 64, "bits": 4, "mode": "affine"}
            if cols % 32 == 0:
                return {"group_size": 32, "bits": 4, "mode": "affine"}
            if cols % 16 == 0:
                return {"group_size": 16, "bits": 4, "mode": "nvfp4"}
            return False
        if recipe.startswith("affine"):
            return {"group_size": 32, "bits": int(recipe[6:]), "mode": "affine"} if cols % 32 == 0 else False
        g = 16 if recipe == "nvfp4" else 32
        return {"group_size": g, "bits": 8 if recipe == "mxfp8" else 4, "mode": recipe} if cols % g == 0 else False
    return pred


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--recipe", default="mixed")
    ap.add_argument("--keep-embedding", action="store_true")
    ap.add_argument("--ids", default=None)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--dequantized", default=None)
    ap.add_argument("--fixture", action="store_true", help="leave the (unquantized) embedding out of model.safetensors "
                    "and copy no tokenizer: test/fixtures/mlx/port, completed by test/test_mlx.py from the checkpoint")
    args = ap.parse_args()
    cfg, weights = load_legacy(args.checkpoint)
    tc = dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] // 2, vision_lora=False, model_type="zaya1_vl")
    model = LanguageModel(TextConfig.from_dict(tc))
    weights = model.sanitize({"language_model." + k: v for k, v in to_vl_names(weights).items()})
    model.load_weights([(k[len("language_model."):], v) for k, v in weights.items()], strict=True)
    pred = recipe_predicate(args.recipe, args.keep_embedding)
    quant = {}

    def record(path, module):
        p = pred(path, module)
        if hasattr(module, "to_quantized"):
            quant["language_model." + path] = p
        return p
    nn.quantize(model, class_predicate=record)
    mx.eval(model.parameters())
    params = {"language_model." + k: v for k, v in tree_flatten(model.parameters())}
    os.makedirs(args.out, exist_ok=True)
    saved = {k: v for k, v in params.items() if not (args.fixture and k.endswith("embed_tokens.weight"))}
    mx.save_safetensors(os.path.join(args.out, "model.safetensors"), saved, metadata={"format": "mlx"})
    q = {"group_size": 64, "bits": 4, "mode": "affine"}
    q.update({k: v for k, v in sorted(quant.items()) if v != q})
    out_cfg = dict(cfg, quantization=q, quantization_config=q)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dict(sorted(out_cfg.items())), f, indent=4)
    for fn in os.listdir(args.checkpoint):
        if fn.startswith("tokenizer") and not args.fixture:
            src = os.path.realpath(os.path.join(args.checkpoint, fn))
            shutil.copyfile(src, os.path.join(args.out, fn))
    n_q = sum(1 for v in quant.values() if v)
    print(f"wrote {args.out}: {len(params)} tensors, {n_q} modules quantized ({args.recipe})")
    if args.dequantized:
        deq = {}
        for path, p in quant.items():
            if not p:
                continue
            base = path[len("language_model."):]
            w = mx.dequantize(params[path + ".weight"], params[path + ".scales"], params.get(path + ".biases"),
                              group_size=p["group_size"], bits=p["bits"], mode=p["mode"],
                              dtype=None if p["mode"] == "affine" else mx.float32).astype(mx.float32)
            name = base
            parts = name.split(".")
            if name.startswith("model.layers."):
                i, half = int(parts[2]), parts[3]
                name = f"model.layers.{2 * i + (half == 'mlp')}." + ".".join(parts[4:])
            if name.endswith("zaya_block.experts.linear_fc1") or name.endswith("zaya_block.experts.linear_fc2"):
                stem, fc = name.rsplit(".", 1)
                for e in range(w.shape[0]):
                    deq[f"{stem}.local_experts.{e}.{fc}.weight"] = w[e]
            else:
                deq[name + ".weight"] = w
        mx.save_safetensors(args.dequantized, deq)
        print(f"wrote {args.dequantized}: {len(deq)} dequantized tensors (float32, legacy names)")
    if args.dump:
        dump(model, [int(x) for x in args.ids.split(",")], args.dump, logits=not args.fixture)


def dump(model, ids, path, logits=True):
    """The port's residual stream after each layer, as zaya.c names its taps."""
    m = model.model
    x = mx.array([ids])
    taps = {}
    h = m.embed_tokens(x).astype(mx.float32)
    taps["model.embed_tokens"] = h[0]
    residual, prev = None, None
    from mlx_vlm.models.zaya1_vl.language import create_attention_mask
    mask = create_attention_mask(h, None)
    for i, layer in enumerate(m.layers):
        h, residual, prev = layer(h, residual, mask=mask, prev_router_hidden_states=prev)
        taps[f"model.layers.{i}.mlp.gate:router_state"] = prev[0]       # after EDA, before the router's norm
        # zaya.c's layer output is the residual merge that opens the next block (post_mlp_residual_scale)
        nxt = m.layers[i + 1].attn.res_scale if i + 1 < len(m.layers) else m.res_scale
        r, hh = nxt(residual, h)
        taps[f"model.layers.{i}.post_mlp_residual_scale"] = (hh + r)[0]
    residual, h = m.res_scale(residual, h)
    out = m.final_norm(h + residual)
    taps["model.norm"] = out[0]
    if logits:              # [T, V]: 40 MB on the compact fixture's prompt; --fixture leaves it out
        taps["logits"] = m.embed_tokens.as_linear(out)[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from array import array
    from zaya_compare.dumps import write_dump
    tensors = [(k, v.shape, array("f", np.array(v.astype(mx.float32)).ravel().tolist())) for k, v in taps.items()]
    write_dump(path, tensors, {"producer": "mlx-vlm zaya1_vl on mlx-cpu (tools/mlx_port.py)", "tokens": ids,
                               "skip_expert": "passthrough"})   # ZayaSwitchMLP: where(skip, h, y) * P[E]
    print(f"wrote {path}: {len(taps)} taps")


if __name__ == "__main__":
    sys.exit(main())
