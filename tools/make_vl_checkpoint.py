#!/usr/bin/env python3
"""make_vl_checkpoint.py - a ZAYA1-VL-shaped checkpoint with random weights, for benchmarks (bench/README.md).

    python3 tools/make_vl_checkpoint.py OUT_DIR [--layers 40] [make_checkpoint.py options ...]
    python3 tools/make_vl_checkpoint.py OUT_DIR --header-only [--layout zyphra]   # names and shapes only, ~1 MB
--layout zyphra writes Zyphra's own names (the hub's layout, tools/vl_checkpoint.py) and its flat config.json.

The language model comes from tools/make_checkpoint.py (ZAYA1-8B's shape by default; --layers N for a
full-width slice), renamed to the layout of transformers' Zaya1VLForConditionalGeneration (pull request
#46011: model.language_model.*, final_norm, router_mlp.rmsnorm_eda); the vision LoRA pairs (ranks 8 / 32) and
the Qwen2.5-VL vision tower of ZAYA1-VL-8B (depth 32, hidden 1280, 16 heads, intermediate 3420, full attention
in blocks 7, 15, 23, 31, merger to 2048) are added with random bf16 weights, N(0, 1/sqrt(fan_in)), norms
1 + N(0, 0.05), biases N(0, 0.02). config.json is the VL config. Needs numpy (the 0.7 B vision values).
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vl_checkpoint  # noqa: E402

VISION = {"depth": 32, "hidden_size": 1280, "hidden_act": "silu", "intermediate_size": 3420, "num_heads": 16,
          "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 1, "window_size": 112,
          "out_hidden_size": 2048, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2}
RANKS = {"vision_lora_rank_attn": 8, "vision_lora_rank_mlp": 32}


def bf16(x):
    """float32 array -> raw bf16 bytes (rounded to nearest even)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def vl_shapes(c, v):
    """[(name, shape)] of the LoRA pairs and the vision tower, in transformers' layout."""
    H, L, nq, nkv, d = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, ra, rm = c["num_experts"], c["moe_intermediate_size"], RANKS["vision_lora_rank_attn"], RANKS["vision_lora_rank_mlp"]
    shapes = []
    for i in range(L):
        a = f"model.language_model.layers.{i}.self_attn.qkv_proj."
        for lora, out in (("q", nq * d), ("k", nkv * d), ("v_current", nkv * d // 2), ("v_delayed", nkv * d // 2)):
            shapes += [(a + f"{lora}_lora_a.weight", (ra, H)), (a + f"{lora}_lora_b.weight", (out, ra))]
        o = f"model.language_model.layers.{i}.self_attn."
        shapes += [(o + "o_lora_a.weight", (ra, nq * d)), (o + "o_lora_b.weight", (H, ra))]
        x = f"model.language_model.layers.{i}.mlp.experts."
        shapes += [(x + "lora_gate_up_proj_a", (E, rm, H)), (x + "lora_gate_up_proj_b", (E, 2 * I, rm)),
                   (x + "lora_down_proj_a", (E, rm, I)), (x + "lora_down_proj_b", (E, H, rm))]
    D, VI, U, P = v["hidden_size"], v["intermediate_size"], 4, v["patch_size"]
    shapes.append(("model.visual.patch_embed.proj.weight", (D, 3, v["temporal_patch_size"], P, P)))
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}."
        shapes += [(b + "norm1.weight", (D,)), (b + "attn.qkv.weight", (3 * D, D)), (b + "attn.qkv.bias", (3 * D,)),
                   (b + "attn.proj.weight", (D, D)), (b + "attn.proj.bias", (D,)), (b + "norm2.weight", (D,))]
        for m, shape in (("gate_proj", (VI, D)), ("up_proj", (VI, D)), ("down_proj", (D, VI))):
            shapes += [(b + f"mlp.{m}.weight", shape), (b + f"mlp.{m}.bias", (shape[0],))]
    shapes += [("model.visual.merger.ln_q.weight", (D,)), ("model.visual.merger.mlp.0.weight", (U * D, U * D)),
               ("model.visual.merger.mlp.0.bias", (U * D,)), ("model.visual.merger.mlp.2.weight", (H, U * D)),
               ("model.visual.merger.mlp.2.bias", (H,))]
    return shapes


def vl_tensors(c, v, rng):
    for name, shape in vl_shapes(c, v):
        if name.endswith(("norm1.weight", "norm2.weight", "ln_q.weight")):
            x = 1 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            x = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if "patch_embed" in name else shape[-1]
            x = rng.standard_normal(shape, dtype=np.float32) / np.float32(fan_in ** 0.5)
        yield name, "BF16", list(shape), bf16(x)


def vl_config(cfg, vision):
    return {"architectures": ["Zaya1VLForConditionalGeneration"], "model_type": "zaya1_vl",
            "text_config": dict(cfg, model_type="zaya1_vl_text", vision_lora=True, **RANKS),
            "vision_config": dict(vision, model_type="zaya1_vl_vision"), "image_token_id": 262147,
            "vision_start_token_id": 255999, "vision_end_token_id": 256000, "tie_word_embeddings": True}


def zyphra_tensors(tensors, n_layers):
    """(name, dtype, shape, raw) in transformers' layout -> Zyphra's (experts and their LoRA pairs split)."""
    out = []
    for name, dtype, shape, raw in tensors:
        z = vl_checkpoint.zyphra_name(name, n_layers)
        if "{e}" not in z:
            out.append((z, dtype, shape, raw))
            continue
        per, view = len(raw) // shape[0], memoryview(raw)
        out += [(z.format(e=e), dtype, list(shape[1:]), view[e * per:(e + 1) * per]) for e in range(shape[0])]
    return out


def zyphra_entries(name, entry, n_layers):
    """One safetensors header entry in transformers' layout -> Zyphra's entries (a stacked expert tensor as its
    per-expert slices of the same bytes)."""
    z = vl_checkpoint.zyphra_name(name, n_layers)
    if "{e}" not in z:
        return {z: entry}
    (a, b), n = entry["data_offsets"], entry["shape"][0]
    per = (b - a) // n
    return {z.format(e=e): dict(entry, shape=entry["shape"][1:], data_offsets=[a + e * per, a + (e + 1) * per])
            for e in range(n)}


def header_only(args, rest):
    """config.json + safetensors shards holding only their headers (every name, dtype BF16, shape; no data): the
    full-size layout for export_weights.py --dry-run, in kilobytes. Zyphra's layout (the hub's) or transformers'."""
    text_dir = os.path.join(args.out_dir, "text")
    subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoint.py"), text_dir, "--dry-run", "--quiet",
                    "--force", *rest], check=True)
    cfg = json.load(open(os.path.join(text_dir, "config.json")))
    shapes = json.load(open(os.path.join(text_dir, "model.safetensors.index.json")))["metadata"]["shapes"]
    for k in ("architectures", "model_type", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    config = vl_config(cfg, dict(VISION, out_hidden_size=cfg["hidden_size"]))
    items = [(vl_checkpoint.text_to_vl_name(n), tuple(shape)) for n, shape in shapes.items()]
    items += vl_shapes(cfg, config["vision_config"])
    if args.layout == "zyphra":
        L, named = cfg["num_hidden_layers"], []
        for n, shape in items:
            z = vl_checkpoint.zyphra_name(n, L)
            named += [(z.format(e=e), shape[1:]) for e in range(shape[0])] if "{e}" in z else [(z, shape)]
        items, config = named, vl_checkpoint.zyphra_config(config)
    shards, size = [[]], 0                  # about 5 GB of bf16 per shard, as the hub's
    for n, shape in items:
        nbytes = 2 * math.prod(shape)
        if size + nbytes > 5 << 30 and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((n, "BF16", list(shape), nbytes))
        size += nbytes
    wm = {}
    for k, shard in enumerate(shards, 1):
        fn = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        vl_checkpoint.write_safetensors(os.path.join(args.out_dir, fn), shard)
        wm.update({n: fn for n, _, _, _ in shard})
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t[3] for sh in shards for t in sh)}, "weight_map": wm}, f, indent=1)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(text_dir):
        os.remove(os.path.join(text_dir, name))
    os.rmdir(text_dir)
    print(f"wrote {args.out_dir}: {len(wm)} tensors ({args.layout} layout) in {len(shards)} header-only shard(s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--header-only", action="store_true",
                    help="no weights: shards holding only their safetensors headers (for export_weights.py --dry-run)")
    ap.add_argument("--layout", choices=("transformers", "zyphra"), default="transformers",
                    help="tensor names: transformers' (pull request #46011) or Zyphra's (the hub's)")
    args, rest = ap.parse_known_args()
    if args.header_only:
        return header_only(args, rest)
    text_dir = os.path.join(args.out_dir, "text")
    subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoint.py"), text_dir, "--single-file",
                    "--seed", str(args.seed), *rest], check=True)
    cfg = json.load(open(os.path.join(text_dir, "config.json")))
    for k in ("architectures", "model_type", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    def relabel(header):   # transformers' names (Zyphra's: experts and their LoRA pairs split), same bytes
        out = {}
        for name, e in header.items():
            name = vl_checkpoint.text_to_vl_name(name)
            out.update(zyphra_entries(name, e, cfg["num_hidden_layers"]) if args.layout == "zyphra" else {name: e})
        return out
    text = os.path.join(text_dir, "model.safetensors")
    wm = {n: "model-00001-of-00002.safetensors" for n in vl_checkpoint.relabel_in_place(text, relabel)}
    os.replace(text, os.path.join(args.out_dir, "model-00001-of-00002.safetensors"))
    rng = np.random.default_rng(args.seed)
    vision = dict(VISION, out_hidden_size=cfg["hidden_size"])
    extra = list(vl_tensors(cfg, vision, rng))
    if args.layout == "zyphra":
        extra = zyphra_tensors(extra, cfg["num_hidden_layers"])
    vl_checkpoint.write_safetensors(os.path.join(args.out_dir, "model-00002-of-00002.safetensors"), extra)
    wm.update({n: "model-00002-of-00002.safetensors" for n, _, _, _ in extra})
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    config = vl_config(cfg, vision)
    if args.layout == "zyphra":
        config = vl_checkpoint.zyphra_config(config)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(text_dir):
        if name.startswith("tokenizer"):
            os.replace(os.path.join(text_dir, name), os.path.join(args.out_dir, name))
    os.remove(os.path.join(text_dir, "config.json"))
    print(f"wrote {args.out_dir}: {len(wm)} tensors")


if __name__ == "__main__":
    main()
