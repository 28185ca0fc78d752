#!/usr/bin/env python3
"""golden_vl.py - the ZAYA1-VL fixture and what the official code computes on it (test/fixtures/vl/).

    /work/venv/bin/python tools/golden_vl.py --upstream DIR [--fixtures test/fixtures] [--out test/fixtures/vl]

DIR holds the official files of transformers pull request #46011 (`zaya1_vl/configuration_zaya1_vl.py`,
`zaya1_vl/modeling_zaya1_vl.py`, unmodified); they are imported as transformers.models.zaya1_vl beside a
transformers 5.x from PyPI (the commit and the files' sha256 go into vl/index.json). Needs torch, transformers
and Pillow (the image processor's resize).

The model: the text fixture's language model (test/fixtures/checkpoint_native: hidden 16, 6 layers, the real
vocabulary) with vision LoRA pairs (ranks 4 / 6) and a compact Qwen2.5-VL vision tower (hidden 32, 2 heads,
depth 2: block 0 window attention, block 1 full attention, window 112 px, patch 14, temporal patch 1,
merge 2 -> 16), random weights rounded to bf16 and stored as bf16 in vl/extra.safetensors (only the new
tensors: tools/vl_checkpoint.py composes the whole checkpoint). Two random images of different, non-square
sizes; for each: the processor's pixel values (Qwen2VLImageProcessorPil, BICUBIC), the prompt ids
(bos, vision_start, one image token per merged patch, vision_end, text), every tap of the vision tower and
of the decoder (module outputs by HF module path, token-major, batch dimension removed), top-16 logits of
every position and 8 greedy tokens (one full forward per step; see the note at `greedy` below).
Everything float32 on CPU, eager attention.
"""
import argparse
import hashlib
import importlib
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vl_checkpoint  # noqa: E402

VISION = dict(depth=2, hidden_size=32, hidden_act="silu", intermediate_size=40, num_heads=2, in_channels=3,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=1, window_size=112, out_hidden_size=16,
              fullatt_block_indexes=[1], tokens_per_second=2)
LORA = dict(vision_lora=True, vision_lora_rank_attn=4, vision_lora_rank_mlp=6)
IMAGES = {"image_a": (130, 200), "image_b": (61, 90)}   # height, width before the processor's resize
TEXT_IDS = [818, 5279, 529, 506, 2268]                 # a few text tokens after the image


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="folder with zaya1_vl/{configuration,modeling}_zaya1_vl.py")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(HERE), "test", "fixtures"))
    ap.add_argument("--out", default=None, help="default: FIXTURES/vl")
    ap.add_argument("--commit", default="b53060fb3c9c6a5f4dd20550e81c265e4169ddd1")
    ap.add_argument("--seed", type=int, default=49)
    args = ap.parse_args()
    out = args.out or os.path.join(args.fixtures, "vl")
    os.makedirs(out, exist_ok=True)

    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    torch.set_num_threads(1)
    cfgmod, mod = import_upstream(args.upstream)

    text = json.load(open(os.path.join(args.fixtures, "checkpoint_native", "config.json")))
    for k in ("architectures", "model_type", "dtype"):
        text.pop(k, None)
    text.update(LORA)
    config_json = {"architectures": ["Zaya1VLForConditionalGeneration"], "model_type": "zaya1_vl",
                   "text_config": dict(text, model_type="zaya1_vl_text"),
                   "vision_config": dict(VISION, model_type="zaya1_vl_vision"),
                   "image_token_id": 262147, "vision_start_token_id": 255999, "vision_end_token_id": 256000,
                   "tie_word_embeddings": True}
    config = cfgmod.Zaya1VLConfig(text_config=dict(text), vision_config=dict(VISION),
                                  image_token_id=262147, vision_start_token_id=255999, vision_end_token_id=256000)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"

    # the new tensors: random, rounded to bf16
    torch.manual_seed(args.seed)
    model = mod.Zaya1VLForConditionalGeneration(config).eval()
    text_sd = load_file(os.path.join(args.fixtures, "checkpoint_native", "model.safetensors"))
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
    ckpt = vl_checkpoint.compose(args.fixtures, os.path.join("/tmp", f"golden_vl_ckpt_{os.getpid()}"), out)
    full = load_file(os.path.join(ckpt, "model.safetensors"))
    sd = {k: v.float() for k, v in full.items()}
    sd["lm_head.weight"] = sd["model.language_model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    assert len(text_sd) + len(extra) == len(full)

    proc = Qwen2VLImageProcessorPil(patch_size=14, temporal_patch_size=1, merge_size=2)
    rs = np.random.RandomState(args.seed)
    index = {"producer": {"pull_request": "huggingface/transformers#46011", "commit": args.commit,
                          "files": {f: sha256(os.path.join(args.upstream, "zaya1_vl", f))
                                    for f in ("configuration_zaya1_vl.py", "modeling_zaya1_vl.py")},
                          "torch": torch.__version__, "transformers": __import__("transformers").__version__,
                          "processor": "Qwen2VLImageProcessorPil(patch_size=14, temporal_patch_size=1, merge_size=2),"
                                       " resample BICUBIC (PIL), rescale 1/255, CLIP mean/std",
                          "dtype": "float32", "attention": "eager", "seed": args.seed},
             "config": config_json, "cases": {}}
    for case, (h, w) in IMAGES.items():
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
        if case == "image_b":     # the other PNG color types, and what PIL's convert("RGB") makes of them
            alpha = rs.randint(0, 256, size=(h, w, 1)).astype(np.uint8)
            Image.fromarray(np.concatenate([img, alpha], -1), "RGBA").save(os.path.join(d, "rgba.png"))
            for name, im in (("gray", Image.fromarray(img).convert("L")),
                             ("palette", Image.fromarray(img).quantize(64))):
                im.save(os.path.join(d, name + ".png"))
                np.save(os.path.join(d, name + "_rgb.npy"), np.asarray(Image.open(os.path.join(d, name + ".png"))
                                                                       .convert("RGB")))
        pv = proc(images=[img], return_tensors="pt")
        pixel_values, grid = pv["pixel_values"].float(), pv["image_grid_thw"]
        n_img = int(grid.prod()) // 4
        ids = [2, 255999] + [262147] * n_img + [256000] + TEXT_IDS
        input_ids = torch.tensor([ids])
        taps = {}

        def hook(name):
            def fn(module, inp, outp):
                o = outp.pooler_output if hasattr(outp, "pooler_output") else outp
                o = o[0] if isinstance(o, tuple) else o
                if name in taps:        # v_proj_delayed runs twice: the sequence, then zeros (position -1)
                    return
                o = o.detach().float()
                if name.startswith("model.language_model") and o.dim() >= 2 and o.shape[0] == 1:
                    o = o[0]
                if name.endswith("conv_qk_depthwise"):      # [C, K + S] -> [S, C]: the outputs of the S tokens
                    o = o.T[-len(ids):]
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
        widx, cu = model.model.visual.get_window_index(grid)
        taps["model.visual:window_index"] = widx.numpy().astype(np.int32)
        taps["model.visual:cu_window_seqlens"] = np.array(sorted(set(cu)), dtype=np.int32)
        logits = outp.logits[0].float()
        top = torch.topk(logits, 16, dim=-1)
        # greedy tokens: one full forward per step (the official code without a cache). model.generate() with
        # the cache gives other tokens from the second on: at this commit with transformers 5.24 the cache
        # layers' conv_states / recurrent_states are dicts, has_previous_state() is false, and each decoded
        # token restarts the CCA convolution and the delayed value from zeros (recorded as generate_cached).
        greedy, run_ids = [], input_ids
        with torch.no_grad():
            for _ in range(8):
                nxt = int(model(input_ids=run_ids, pixel_values=pixel_values, image_grid_thw=grid,
                                use_cache=False).logits[0, -1].argmax())
                greedy.append(nxt)
                run_ids = torch.cat([run_ids, torch.tensor([[nxt]])], 1)
            gen = model.generate(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                                 max_new_tokens=8, do_sample=False)
        generate_cached = gen[0, len(ids):].tolist()
        np.save(os.path.join(d, "tokens.npy"), np.array(ids, dtype=np.int32))
        np.save(os.path.join(d, "pixel_values.npy"), pixel_values.numpy())
        np.save(os.path.join(d, "image_grid_thw.npy"), grid.numpy().astype(np.int32))
        np.save(os.path.join(d, "logits_top16_ids.npy"), top.indices.numpy().astype(np.int32))
        np.save(os.path.join(d, "logits_top16_values.npy"), top.values.numpy())
        np.save(os.path.join(d, "greedy_tokens.npy"), np.array(greedy, dtype=np.int32))
        for name, v in taps.items():
            np.save(os.path.join(d, "taps", name + ".npy"), v)
        index["cases"][case] = {"image_size_hw": [h, w], "image_grid_thw": grid[0].tolist(), "image_tokens": n_img,
                                "ids": ids, "greedy_tokens": greedy, "generate_cached": generate_cached,
                                "taps": len(taps)}
        print(case, "grid", grid[0].tolist(), "tokens", len(ids), "taps", len(taps), "greedy", greedy)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
