#!/usr/bin/env python3
"""golden_vl.py - the ZAYA1-VL fixture and what the official code computes on it (test/fixtures/vl/).

    /work/venv/bin/python tools/golden_vl.py --upstream DIR [--fixtures test/fixtures] [--out test/fixtures/vl]
        [--seed 49] [--images 130x200,61x90] [--text CKPT] [--vision depth=2,hidden_size=32,...]
        [--fullatt 1] [--lora-ranks 4,6] [--dtype float32|float64] [--reference64] [--compact]

DIR holds the official files of transformers pull request #46011 (`zaya1_vl/configuration_zaya1_vl.py`,
`zaya1_vl/modeling_zaya1_vl.py`, unmodified); they are imported as transformers.models.zaya1_vl beside a
transformers 5.x from PyPI (the commit and the files' sha256 go into vl/index.json). Needs torch, transformers
and Pillow (the image processor's resize).

The model (the defaults make test/fixtures/vl): the text fixture's language model (test/fixtures/checkpoint_native:
hidden 16, 6 layers, the real vocabulary; --text: another native-layout checkpoint folder with one
model.safetensors, e.g. from tools/make_checkpoint.py --single-file) with vision LoRA pairs (--lora-ranks: attention
4, MLP 6) and a compact Qwen2.5-VL vision tower (--vision: hidden 32, 2 heads, depth 2, --fullatt: block 1 full
attention, block 0 window attention, window 112 px, patch 14, temporal patch 1, merge 2 -> the decoder's hidden
size), random weights rounded to bf16 and stored as bf16 in OUT/extra.safetensors (only the new tensors:
tools/vl_checkpoint.py composes the whole checkpoint). Random images of the --images sizes (height x width before
the processor's resize; the defaults are two different, non-square sizes), named image_a, image_b, ...; for each:
the processor's pixel values (Qwen2VLImageProcessorPil, BICUBIC), the prompt ids (bos, vision_start, one image
token per merged patch, vision_end, text), every tap of the vision tower and of the decoder (module outputs by HF
module path, token-major, batch dimension removed), top-16 logits of every position and 8 greedy tokens (one full
forward per step; see the note at `greedy` below). Everything on CPU, eager attention, float32; --dtype float64
runs the same official code in float64 on the same (bf16-exact) weights and float32 pixel values (the code's
own float32 casts stay: RMSNorm input, residual, softmax, RoPE tables), for measuring how far each float32 side
is from exact; --reference64 keeps a compact part of that run beside the float32 fixture (CASE/reference64/: every
vision block's and decoder layer's output and the top-16 logits, float64), which test/test_vl.py reads.
"""
import argparse
import atexit
import copy
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vl_checkpoint  # noqa: E402

VISION = dict(depth=2, hidden_size=32, hidden_act="silu", intermediate_size=40, num_heads=2, in_channels=3,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=1, window_size=112, out_hidden_size=16,
              fullatt_block_indexes=[1], tokens_per_second=2)
LORA = dict(vision_lora=True, vision_lora_rank_attn=4, vision_lora_rank_mlp=6)
IMAGES = "130x200,61x90"          # height x width before the processor's resize
TEXT_IDS = [818, 5279, 529, 506, 2268]                 # a few text tokens after the image
# --compact (a variant fixture stays small): vision taps left out: the ones equal to another tap (a module's last
# submodule) and a block's widest insides (qkv, the MLP's gate / up / product), so block, norm, attention and MLP
# outputs and the merger's steps stay; decoder taps kept: five per layer and the final norm.
COMPACT_DROP = (".act_fn", ".attn.proj", ".mlp.down_proj", "merger.mlp", "merger.mlp.2", "patch_embed.proj",
                ".attn.qkv", ".mlp.gate_proj", ".mlp.up_proj")
COMPACT_DECODER = (".input_layernorm", ".self_attn.o_proj", ".post_attention_residual_scale", ".mlp.experts",
                   ".post_mlp_residual_scale", "final_norm")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def import_upstream(upstream):
    import transformers.models as tm
    pkg = types.ModuleType("transformers.models.zaya1_vl")
    pkg.__path__ = [os.path.join(upstream, "zaya1_vl")]
    sys.modules["transformers.models.zaya1_vl"] = pkg
    tm.zaya1_vl = pkg
    cfg = importlib.import_module("transformers.models.zaya1_vl.configuration_zaya1_vl")
    mod = importlib.import_module("transformers.models.zaya1_vl.modeling_zaya1_vl")
    return cfg, mod


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="folder with zaya1_vl/{configuration,modeling}_zaya1_vl.py")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(HERE), "test", "fixtures"))
    ap.add_argument("--out", default=None, help="default: FIXTURES/vl")
    ap.add_argument("--commit", default="b53060fb3c9c6a5f4dd20550e81c265e4169ddd1")
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--images", default=IMAGES, help="HxW,HxW,...: the images' sizes before the resize")
    ap.add_argument("--text", default=None, help="native text checkpoint folder (default FIXTURES/checkpoint_native)")
    ap.add_argument("--vision", default="", help="vision_config overrides, KEY=INT,...: depth, hidden_size, "
                    "num_heads, intermediate_size, window_size, patch_size, spatial_merge_size")
    ap.add_argument("--fullatt", default=None, help="fullatt_block_indexes, e.g. 1 or 0,2 ('' for none)")
    ap.add_argument("--lora-ranks", default=None, help="ATTN,MLP (default 4,6)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads (default 1: the order torch_cpu.h "
                    "models; 2: MKL sums the decoder's products in another order)")
    ap.add_argument("--exact-trig", action="store_true", help="a variant, not a golden: the official code with "
                    "float32 cos and sin correctly rounded (computed in float64) instead of MKL's, which differ in the "
                    "last bit for ~5%% of values; how far it moves from the golden is how much the official run's "
                    "own last bits weigh on this input")
    ap.add_argument("--compact", action="store_true", help="keep fewer vision taps (see COMPACT_DROP) and no "
                    "extra PNG color types")
    ap.add_argument("--reference64", action="store_true", help="with float32: also run the model in float64 and "
                    "keep its vision block, decoder layer and top-16 logit values as CASE/reference64/*.npy")
    args = ap.parse_args()
    args.sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.images.split(",")]
    if any(len(s) != 2 or min(s) < 1 for s in args.sizes):
        ap.error(f"--images {args.images}: expected HxW,HxW,... (positive pixel sizes)")
    vision = dict(VISION)
    for kv in filter(None, args.vision.split(",")):
        k, _, v = kv.partition("=")
        if k not in vision or k in ("fullatt_block_indexes", "hidden_act"):
            ap.error(f"--vision {kv}: not an integer field of vision_config")
        vision[k] = int(v)
    if args.fullatt is not None:
        vision["fullatt_block_indexes"] = [int(v) for v in args.fullatt.split(",") if v.strip()]
    lora = dict(LORA)
    if args.lora_ranks:
        lora["vision_lora_rank_attn"], lora["vision_lora_rank_mlp"] = (int(v) for v in args.lora_ranks.split(","))
    args.vision_config, args.lora = vision, lora
    return args


def text_fixtures(args, tmp):
    """A fixtures folder whose checkpoint_native is --text (vl_checkpoint.compose reads it from there)."""
    if not args.text:
        return args.fixtures
    os.symlink(os.path.abspath(args.text), os.path.join(tmp, "checkpoint_native"))
    os.symlink(os.path.abspath(os.path.join(args.fixtures, "tokenizer")), os.path.join(tmp, "tokenizer"))
    return tmp


def build_model(args, cfgmod, mod, fixtures, out, tmp):
    """The official Zaya1VLForConditionalGeneration with the text checkpoint and random bf16 vision / LoRA
    tensors (written to OUT/extra.safetensors, config to OUT/config.json). -> (model, config_json)"""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    text = json.load(open(os.path.join(fixtures, "checkpoint_native", "config.json")))
    for k in ("architectures", "model_type", "dtype"):
        text.pop(k, None)
    text.update(args.lora)
    vision = dict(args.vision_config, out_hidden_size=text["hidden_size"])
    config_json = {"architectures": ["Zaya1VLForConditionalGeneration"], "model_type": "zaya1_vl",
                   "text_config": dict(text, model_type="zaya1_vl_text"),
                   "vision_config": dict(vision, model_type="zaya1_vl_vision"),
                   "image_token_id": 262147, "vision_start_token_id": 255999, "vision_end_token_id": 256000,
                   "tie_word_embeddings": True}
    config = cfgmod.Zaya1VLConfig(text_config=dict(text), vision_config=dict(vision),
                                  image_token_id=262147, vision_start_token_id=255999, vision_end_token_id=256000)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"

    # the new tensors: random, rounded to bf16
    torch.manual_seed(args.seed)
    model = mod.Zaya1VLForConditionalGeneration(config).eval()
    text_sd = load_file(os.path.join(fixtures, "checkpoint_native", "model.safetensors"))
    extra = {}
    for name, p in model.state_dict().items():
        if name.startswith("model.visual.") or "lora" in name:
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("ln_q.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape)
            elif name.endswith(".bias"):
                v = 0.2 * torch.randn(p.shape)
            else:
                fan_in = p.shape[-1] if p.dim() == 2 else int(np.prod(p.shape[1:])) if "patch_embed" in name else p.shape[-1]
                v = torch.randn(p.shape) / fan_in ** 0.5 * (2.0 if "lora" in name else 1.0)
            extra[name] = v.to(torch.bfloat16).contiguous()
    save_file(extra, os.path.join(out, "extra.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
        f.write("\n")
    ckpt = vl_checkpoint.compose(fixtures, os.path.join(tmp, "ckpt"), out)
    full = load_file(os.path.join(ckpt, "model.safetensors"))
    sd = {k: v.float() for k, v in full.items()}
    sd["lm_head.weight"] = sd["model.language_model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    assert len(text_sd) + len(extra) == len(full)
    if args.dtype == "float64":
        model = model.double()
    return model, config_json


def run_taps(model, input_ids, pixel_values, grid, text_layer_types):
    """One forward of the official model on the prompt with hooks on every module: -> (taps by HF module path
    (token-major, batch dimension removed; float32, or float64 for a float64 model), the model's output)."""
    import numpy as np
    import torch
    double = next(model.parameters()).dtype == torch.float64
    n_ids = input_ids.shape[1]
    taps = {}

    def hook(name):
        def fn(module, inp, outp):
            o = outp.pooler_output if hasattr(outp, "pooler_output") else outp
            o = o[0] if isinstance(o, tuple) else o
            if name.endswith("rotary_emb") and name.startswith("model.language_model") and \
                    inp[2] != text_layer_types[0]:
                return          # called once per layer type, in set() order: keep the first layer's
            if name in taps:        # v_proj_delayed runs twice: the sequence, then zeros (position -1)
                return
            o = o.detach().double() if double else o.detach().float()
            if name.startswith("model.language_model") and o.dim() >= 2 and o.shape[0] == 1:
                o = o[0]
            if name.endswith("conv_qk_depthwise"):      # [C, K + S] -> [S, C]: the outputs of the S tokens
                o = o.T[-n_ids:]
            elif name.endswith("conv_qk_grouped"):      # [C, S] -> [S, C]
                o = o.T
            taps[name] = o.numpy().copy()
        return fn
    hooks = []
    for name, m in model.named_modules():
        if not name or name in ("model", "lm_head", "model.language_model") or isinstance(m, torch.nn.ModuleList):
            continue
        if name.startswith("model.visual") or name.startswith("model.language_model"):
            if ".experts" in name and not name.endswith(".experts"):
                continue
            hooks.append(m.register_forward_hook(hook(name)))

    def pre(module, a, kw):
        taps["model.language_model:inputs_embeds"] = kw["inputs_embeds"][0].detach().float().numpy().copy()
        taps["model.language_model:image_mask"] = kw["image_mask"][0].numpy().astype(np.int32)
    hooks.append(model.model.language_model.register_forward_pre_hook(pre, with_kwargs=True))
    with torch.no_grad():
        outp = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid, use_cache=True)
    for hk in hooks:
        hk.remove()
    return taps, outp


def reference64(taps64, logits64, top_ids):
    """The float64 run's taps kept as the reference of the float32 fixture: every vision block's output and
    the tower's (patch_embed, blocks.N, model.visual), every decoder layer's output (layers.N =
    its post_mlp_residual_scale), and the logits at the float32 run's top-16 ids; float64."""
    import numpy as np
    keep = {}
    for name, v in taps64.items():
        parts = name.split(".")
        if name in ("model.visual", "model.visual.patch_embed") or \
                (len(parts) == 4 and parts[:3] == ["model", "visual", "blocks"]) or \
                (len(parts) == 4 and parts[:3] == ["model", "language_model", "layers"]):
            keep[name] = v
    keep["logits_top16"] = np.take_along_axis(logits64, top_ids.astype(np.int64), -1)
    return keep


def main():
    args = parse_args()
    out = args.out or os.path.join(args.fixtures, "vl")
    os.makedirs(out, exist_ok=True)

    import numpy as np
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    torch.set_num_threads(args.threads)
    if args.exact_trig:   # the RoPE tables' emb.cos() / emb.sin(), tower and decoder
        cos, sin = torch.Tensor.cos, torch.Tensor.sin
        torch.Tensor.cos = lambda t: cos(t.double()).float() if t.dtype == torch.float32 else cos(t)
        torch.Tensor.sin = lambda t: sin(t.double()).float() if t.dtype == torch.float32 else sin(t)
    cfgmod, mod = import_upstream(args.upstream)
    tmp = tempfile.mkdtemp(prefix="golden_vl_")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    model, config_json = build_model(args, cfgmod, mod, text_fixtures(args, tmp), out, tmp)
    dtype = getattr(torch, args.dtype)
    model64 = copy.deepcopy(model).double() if args.reference64 and args.dtype == "float32" else None
    text_layer_types = config_json["text_config"]["layer_types"]

    vc = config_json["vision_config"]
    proc = Qwen2VLImageProcessorPil(patch_size=vc["patch_size"], temporal_patch_size=1,
                                    merge_size=vc["spatial_merge_size"])
    rs = np.random.RandomState(args.seed)
    index = {"producer": {"pull_request": "huggingface/transformers#46011", "commit": args.commit,
                          "files": {f: sha256(os.path.join(args.upstream, "zaya1_vl", f))
                                    for f in ("configuration_zaya1_vl.py", "modeling_zaya1_vl.py")},
                          "torch": torch.__version__, "transformers": __import__("transformers").__version__,
                          "processor": f"Qwen2VLImageProcessorPil(patch_size={vc['patch_size']}, "
                                       f"temporal_patch_size=1, merge_size={vc['spatial_merge_size']}),"
                                       " resample BICUBIC (PIL), rescale 1/255, CLIP mean/std",
                          "dtype": args.dtype, "attention": "eager", "seed": args.seed, "threads": args.threads,
                          "trig": "correctly rounded (a variant)" if args.exact_trig else "torch's (MKL)",
                          "command": "tools/golden_vl.py " + " ".join(sys.argv[1:])},
             "config": config_json, "cases": {}}
    if model64 is not None:
        index["producer"]["reference64"] = ("CASE/reference64: the same official code and weights run in float64 "
                                            "(model.double(), float32 pixel values; the code's own float32 casts "
                                            "kept: RMSNorm input, residual, softmax, RoPE tables)")
    for number, (h, w) in enumerate(args.sizes):
        case = "image_" + chr(ord("a") + number)
        # a smooth image plus noise, so that the resize matters
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([128 + 100 * np.sin(xx / 7.0 + c) * np.cos(yy / 9.0 - c) for c in range(3)], -1)
        img = np.clip(img + rs.randint(-40, 41, size=img.shape), 0, 255).astype(np.uint8)
        d = os.path.join(out, case)
        os.makedirs(os.path.join(d, "taps"), exist_ok=True)
        with open(os.path.join(d, "image.ppm"), "wb") as f:
            f.write(b"P6\n%d %d\n255\n" % (w, h) + img.tobytes())
        from PIL import Image
        Image.fromarray(img).save(os.path.join(d, "image.png"))   # RGB, Pillow's adaptive filters
        if case == "image_b" and not args.compact:   # the other PNG color types, and PIL's convert("RGB") of them
            alpha = rs.randint(0, 256, size=(h, w, 1)).astype(np.uint8)
            Image.fromarray(np.concatenate([img, alpha], -1), "RGBA").save(os.path.join(d, "rgba.png"))
            for name, im in (("gray", Image.fromarray(img).convert("L")),
                             ("palette", Image.fromarray(img).quantize(64))):
                im.save(os.path.join(d, name + ".png"))
                np.save(os.path.join(d, name + "_rgb.npy"), np.asarray(Image.open(os.path.join(d, name + ".png"))
                                                                       .convert("RGB")))
        pv = proc(images=[img], return_tensors="pt")
        pixel_values, grid = pv["pixel_values"].float(), pv["image_grid_thw"]
        merge = vc["spatial_merge_size"] ** 2
        n_img = int(grid.prod()) // merge
        ids = [2, 255999] + [262147] * n_img + [256000] + TEXT_IDS
        input_ids = torch.tensor([ids])
        taps, outp = run_taps(model, input_ids, pixel_values.to(dtype), grid, text_layer_types)
        widx, cu = model.model.visual.get_window_index(grid)
        taps["model.visual:window_index"] = widx.numpy().astype(np.int32)
        taps["model.visual:cu_window_seqlens"] = np.array(sorted(set(cu)), dtype=np.int32)
        logits = outp.logits[0].float()
        if args.dtype == "float64":
            np.save(os.path.join(d, "logits_f64.npy"), outp.logits[0].numpy())
        top = torch.topk(logits, 16, dim=-1)
        # greedy tokens: one full forward per step (the official code without a cache). model.generate() with
        # the cache gives other tokens from the second on: at this commit with transformers 5.24 the cache
        # layers' conv_states / recurrent_states are dicts, has_previous_state() is false, and each decoded
        # token restarts the CCA convolution and the delayed value from zeros (recorded as generate_cached).
        greedy, run_ids = [], input_ids
        with torch.no_grad():
            for _ in range(8):
                nxt = int(model(input_ids=run_ids, pixel_values=pixel_values.to(dtype), image_grid_thw=grid,
                                use_cache=False).logits[0, -1].argmax())
                greedy.append(nxt)
                run_ids = torch.cat([run_ids, torch.tensor([[nxt]])], 1)
            gen = model.generate(input_ids=input_ids, pixel_values=pixel_values.to(dtype), image_grid_thw=grid,
                                 max_new_tokens=8, do_sample=False)
        generate_cached = gen[0, len(ids):].tolist()
        np.save(os.path.join(d, "tokens.npy"), np.array(ids, dtype=np.int32))
        np.save(os.path.join(d, "pixel_values.npy"), pixel_values.numpy())
        np.save(os.path.join(d, "image_grid_thw.npy"), grid.numpy().astype(np.int32))
        np.save(os.path.join(d, "logits_top16_ids.npy"), top.indices.numpy().astype(np.int32))
        np.save(os.path.join(d, "logits_top16_values.npy"), top.values.numpy())
        np.save(os.path.join(d, "greedy_tokens.npy"), np.array(greedy, dtype=np.int32))
        if args.compact:
            taps = {k: v for k, v in taps.items() if ":" in k or (k.startswith("model.visual") and
                                                                  not k.endswith(COMPACT_DROP)) or
                    (k.startswith("model.language_model") and k.endswith(COMPACT_DECODER))}
        for name, v in taps.items():
            np.save(os.path.join(d, "taps", name + ".npy"), v)
        if model64 is not None:
            taps64, out64 = run_taps(model64, input_ids, pixel_values.double(), grid, text_layer_types)
            os.makedirs(os.path.join(d, "reference64"), exist_ok=True)
            for name, v in reference64(taps64, out64.logits[0].numpy(), top.indices.numpy()).items():
                np.save(os.path.join(d, "reference64", name + ".npy"), v)
        index["cases"][case] = {"image_size_hw": [h, w], "image_grid_thw": grid[0].tolist(), "image_tokens": n_img,
                                "ids": ids, "greedy_tokens": greedy, "generate_cached": generate_cached,
                                "taps": len(taps)}
        print(case, "grid", grid[0].tolist(), "tokens", len(ids), "taps", len(taps), "greedy", greedy)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
