#!/usr/bin/env python3
"""test_vision.py - vision.c's tower against the official code (test/fixtures/vl, tools/golden_vl.py).

    make build/test_vision && python3 test/test_vision.py

For both fixture images: the weights of vl/extra.safetensors and the processor's pixel values go to
build/test_vision as raw float32; every tap of the tower (patch_embed, each block's norm1, attn.qkv, attn,
norm2, mlp and output, the merger's ln_q, mlp.0, mlp.1 and output, and the image features in image order)
must be within relative L2 1e-6 of the official float32 run; the patch embedding and the first block's norm1
(the same input bits, summed in torch's order) bit-identical to it.
"""
import json
import os
import sys
import tempfile

import numpy as np

from harness import ROOT, check, finish, need_fixtures, run

sys.path.insert(0, os.path.join(ROOT, "tools"))
import vl_checkpoint  # noqa: E402

VL = need_fixtures("vl")
LIMIT = 1e-6


def tensors():
    header, data = vl_checkpoint.read_safetensors(os.path.join(VL, "extra.safetensors"))
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        assert e["dtype"] == "BF16", (name, e["dtype"])
        raw = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
        out[name] = raw.view(np.float32).reshape(e["shape"])
    return out


def write_inputs(d, w, vc, pixels, grid):
    D, I = vc["hidden_size"], vc["intermediate_size"]
    order = [w["model.visual.patch_embed.proj.weight"].reshape(D, -1)]
    for i in range(vc["depth"]):
        p = f"model.visual.blocks.{i}."
        order += [w[p + "norm1.weight"], w[p + "norm2.weight"], w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"],
                  w[p + "attn.proj.weight"], w[p + "attn.proj.bias"]]
        for m in ("gate_proj", "up_proj", "down_proj"):
            order += [w[p + f"mlp.{m}.weight"], w[p + f"mlp.{m}.bias"]]
    order += [w["model.visual.merger.ln_q.weight"], w["model.visual.merger.mlp.0.weight"],
              w["model.visual.merger.mlp.0.bias"], w["model.visual.merger.mlp.2.weight"],
              w["model.visual.merger.mlp.2.bias"]]
    np.concatenate([np.ascontiguousarray(x, dtype=np.float32).ravel() for x in order]).tofile(os.path.join(d, "weights.f32"))
    pixels.astype(np.float32).tofile(os.path.join(d, "pixels.f32"))
    full = vc["fullatt_block_indexes"]
    fields = [vc["depth"], D, vc["num_heads"], I, vc["in_channels"], vc["patch_size"], vc["temporal_patch_size"],
              vc["spatial_merge_size"], vc["window_size"], vc["out_hidden_size"], len(full), *full,
              int(grid[1]), int(grid[2])]
    with open(os.path.join(d, "config.txt"), "w") as f:
        f.write(" ".join(map(str, fields)) + "\n")


def main():
    exe = os.path.join(ROOT, "build", "test_vision")
    if not check(os.path.exists(exe), "build/test_vision is built", "hint: make build/test_vision"):
        finish()
    vc = json.load(open(os.path.join(VL, "config.json")))["vision_config"]
    w = tensors()
    for case in ("image_a", "image_b"):
        cd = os.path.join(VL, case)
        grid = np.load(os.path.join(cd, "image_grid_thw.npy"))[0]
        with tempfile.TemporaryDirectory() as tmp:
            ind, outd = os.path.join(tmp, "in"), os.path.join(tmp, "out")
            os.makedirs(ind), os.makedirs(outd)
            write_inputs(ind, w, vc, np.load(os.path.join(cd, "pixel_values.npy")), grid)
            rc, _, err = run([exe, ind, outd])
            if not check(rc == 0, f"{case}: vision tower runs", err.strip()[-500:]):
                continue
            names = sorted(f[:-4] for f in os.listdir(os.path.join(cd, "taps"))
                           if f.startswith("model.visual") and ":" not in f)
            worst, compared = (0.0, ""), 0
            for name in names:
                want = np.load(os.path.join(cd, "taps", name + ".npy")).astype(np.float64)
                path = os.path.join(outd, name + ".f32")
                if not os.path.exists(path):
                    if name.endswith(".act_fn") or name.endswith(("merger.mlp", "merger.mlp.2")) or name.endswith("attn.proj") \
                            or name.endswith("patch_embed.proj") or name.endswith(("mlp.down_proj",)):
                        continue   # the same tensor as another tap (a module's last submodule)
                    check(False, f"{case}: tap {name}", "vision.c does not report it (hint: a step lost its tap)")
                    continue
                got = np.fromfile(path, dtype=np.float32).astype(np.float64)
                if got.size != want.size:
                    check(False, f"{case}: tap {name}", f"{got.size} values, expected {want.size} {want.shape}")
                    continue
                rel = float(np.linalg.norm(got - want.ravel()) / max(np.linalg.norm(want), 1e-30))
                compared += 1
                hints = {"model.visual.patch_embed": "the (t, y, x, c) multiply-add chain of torch's CPU Conv3d",
                         "model.visual.blocks.0.norm1": "torch.sum's order of the squares (torch_cpu.c)"}
                if name in hints:   # from the same input bits, in torch's order: the same output bits
                    n_diff = int((got.astype(np.float32) != want.ravel().astype(np.float32)).sum())
                    check(n_diff == 0, f"{case}: {name} bit-identical to the official float32 run",
                          f"{n_diff} of {got.size} values differ (hint: {hints[name]})")
                check(rel <= LIMIT, f"{case}: {name} within rel L2 {LIMIT:g}",
                      f"rel L2 {rel:.3g} (first differing tap in execution order points at the step)")
                worst = max(worst, (rel, name))
            print(f"  {case}: {compared} taps, worst rel L2 {worst[0]:.3g} ({worst[1]})")
    finish()


if __name__ == "__main__":
    main()
