#!/usr/bin/env python3
"""test_vl_tools.py - golden dumps, compare.py, --replay and --trace for ZAYA1-VL (the vision tower, image positions).

    make zaya && python3 test/test_vl_tools.py

On the ZAYA1-VL fixture (test/fixtures/vl, exported as test_vl.py does) and its two official goldens:
- `./zaya --image --dump` (folder and safetensors): the vision tower's tensors by HF module path before the
  decoder's, index.json's image_positions equal to the official image mask, the two forms identical;
- compare.py zaya.c against the official golden (tools/fixture_to_dump.py): AGREE for both images, every vision
  tensor within rel L2 1e-6, every layer output within 2e-6 (compare.py's view; test_vl.py holds them to 1e-6); a
  vision tensor perturbed is the FIRST DIVERGENCE before any decoder position; a decoder row perturbed at an image position is called one;
- `--replay` + compare.py --local: zaya.c's own VL dump replays at local error <= 1e-7 in every layer; a run with
  layer 3's o_lora_b zeroed (a modified blob) is located at layer 3 post_attention_residual_scale, at an image
  position, with the o_proj LoRA named; the official golden (no model:input_scaled: layer 0 from the port's
  model.visual) replays within 1e-6 per layer; zaya.c's own bf16 VL run passes --local --bf16 (the step check
  leaves out the image positions of the steps the untapped vision LoRA reaches);
- the tower's blocks replayed each from the port's input (--replay; --local's tower table): zaya.c's own at 0, a
  block's MLP off in one row located at that block and row, the official golden's within 1e-6;
- `--trace` at an image position: the vision LoRA norms equal the official LoRA taps' rows (q, k, v_current,
  v_delayed, o), the attended keys are the window and every image position.
"""
import json
import os
import re
import shutil
import struct
import sys
import tempfile

import numpy as np

from harness import ROOT, check, compare, finish, need_fixtures, run

sys.path.insert(0, os.path.join(ROOT, "tools"))
import forbid_skip  # noqa: E402
import vl_checkpoint  # noqa: E402

FX = need_fixtures()
VL = need_fixtures("vl")
ZAYA = os.path.join(ROOT, "zaya")


def rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def ids_of(case):
    return np.load(os.path.join(VL, case, "tokens.npy")).tolist()


def mask_ranges(case):
    m = np.load(os.path.join(VL, case, "taps", "model.language_model:image_mask.npy")).astype(bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m.astype(int), [0]])))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]


def zero_tensor(blob, out, name):
    """A copy of blob with one tensor's data zeroed (its CRC and the header's updated); False when it has none."""
    shutil.copy(blob, out)
    with open(out, "r+b") as f:
        hdr, diroff, d, entries = forbid_skip.read_directory(f, out)
        if name not in entries:
            return False
        off, size = struct.unpack_from("<QQ", d, entries[name] + 168)
        forbid_skip.patch_tensor(f, d, entries[name], off, bytes(size))
        forbid_skip.write_header(f, hdr, d, diroff)
    return True


def dumps(tmp, blob):
    """./zaya --image --dump for both images; returns {case: dump folder}."""
    out = {}
    for case in ("image_a", "image_b"):
        d = os.path.join(tmp, "zaya_" + case)
        rc, _, err = run([ZAYA, blob, "--image", os.path.join(VL, case, "image.png"), "--ids",
                          ",".join(map(str, ids_of(case))), "--dump", d])
        if not check(rc == 0, f"{case}: ./zaya --image --dump", err[-400:]):
            continue
        out[case] = d
        with open(os.path.join(d, "index.json")) as f:
            index = json.load(f)
        names = [t["name"] for t in index["tensors"]]
        vision = [n for n in names if n.startswith("model.visual")]
        first_decoder = next(i for i, n in enumerate(names) if not n.startswith("model.visual"))
        check(len(vision) == 23 and first_decoder == len(vision),
              f"{case}: the dump holds the 23 vision tower tensors (2 blocks), before the decoder's",
              f"{len(vision)} vision tensors, the first decoder tensor at index {first_decoder}")
        shapes = {t["name"]: t["shape"] for t in index["tensors"]}
        grid = index.get("images", [{}])[0].get("image_grid_thw")
        want_grid = np.load(os.path.join(VL, case, "image_grid_thw.npy"))[0].tolist()
        check(grid == want_grid and shapes.get("model.visual.patch_embed", [0])[0] == want_grid[1] * want_grid[2]
              and shapes.get("model.visual", [0])[0] == want_grid[1] * want_grid[2] // 4,
              f"{case}: images' grid {want_grid} and the tower's rows (patches, image features)",
              f"grid {grid}, patch_embed {shapes.get('model.visual.patch_embed')}, model.visual {shapes.get('model.visual')}")
        check(index.get("image_positions") == mask_ranges(case),
              f"{case}: index.json's image_positions {mask_ranges(case)} = the official image mask",
              f"found {index.get('image_positions')}")
    case = "image_b"
    st = os.path.join(tmp, "zaya_image_b.safetensors")
    rc, _, err = run([ZAYA, blob, "--image", os.path.join(VL, case, "image.png"), "--ids",
                      ",".join(map(str, ids_of(case))), "--dump", st])
    if check(rc == 0, "image_b: ./zaya --image --dump F.safetensors", err[-400:]) and case in out:
        rc, text = compare(out[case], st, "--verbose")
        check(rc == 0 and text.count("model.visual") >= 23 and "RESULT: AGREE" in text,
              "image_b: the safetensors dump equals the folder, the vision tensors included", text[-400:])
        with open(st, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            meta = json.loads(f.read(n))["__metadata__"]
        check(json.loads(meta.get("image_positions", "null")) == mask_ranges(case),
              "image_b: the safetensors __metadata__ has image_positions", str(meta.get("image_positions")))
    return out


def against_official(tmp, ours):
    for case, d in ours.items():
        ref = os.path.join(tmp, "official_" + case)
        rc, _, err = run([sys.executable, "tools/fixture_to_dump.py", os.path.join(VL, case), ref])
        if not check(rc == 0, f"{case}: tools/fixture_to_dump.py converts the official VL golden", err[-300:]):
            continue
        js = os.path.join(tmp, case + ".json")
        rc, text = compare(d, ref, "--json", js)
        check(rc == 0 and "RESULT: AGREE" in text, f"{case}: compare.py zaya.c vs the official golden: AGREE",
              text[-600:])
        if not os.path.exists(js):
            continue
        with open(js) as f:
            res = {r["name"]: r for r in json.load(f)["tensors"]}
        vision = {n: r["rel_l2"] for n, r in res.items() if n.startswith("model.visual") and r.get("rel_l2") is not None}
        worst = max(vision.items(), key=lambda x: x[1], default=("-", 1.0))
        check(len(vision) == 23 and worst[1] <= 1e-6,
              f"{case}: compare.py compares the 23 vision tensors, each within rel L2 1e-6 (worst {worst[1]:.2g})",
              f"{len(vision)} compared, worst {worst}")
        outs = {n: r["rel_l2"] for n, r in res.items() if n.endswith("post_mlp_residual_scale")}
        worst = max(outs.values(), default=1.0)
        check(len(outs) == 6 and worst <= 2e-6, f"{case}: every layer output within rel L2 2e-6 (worst {worst:.2g})",
              f"{len(outs)} layers, worst {worst}")
        if case != "image_a" or not check(os.path.exists(os.path.join(d, "model.visual.blocks.1.attn.npy")),
                                          f"{case}: the dump has model.visual.blocks.1.attn (to perturb it)"):
            continue
        bad = os.path.join(tmp, "bad_vision")
        shutil.copytree(d, bad)
        for name, row in (("model.visual.blocks.1.attn", 7), ("model.layers.0.input_layernorm", 2)):
            path = os.path.join(bad, name + ".npy")   # the tower off, and what it feeds (image position 2)
            x = np.load(path)
            x[row] *= 1.001
            np.save(path, x)
        rc, text = compare(bad, ref)
        check(rc == 1 and "FIRST DIVERGENCE: model.visual.blocks.1.attn (the vision tower), row 7" in text
              and "RESULT: DIVERGED at model.visual.blocks.1.attn, row 7 of the vision tower" in text,
              "a vision tensor 0.1 % off in row 7 is the first divergence (before the decoder's position 2 it feeds), "
              "named in the tower with its row",
              text[-500:])
        bad = os.path.join(tmp, "bad_decoder")
        shutil.copytree(d, bad)
        path = os.path.join(bad, "model.layers.2.self_attn.o_proj.npy")
        x = np.load(path)
        x[20] *= 1.001
        np.save(path, x)
        rc, text = compare(bad, ref)
        check(rc == 1 and "RESULT: DIVERGED at model.layers.2.self_attn.o_proj, position 20 (token id 262147, an "
              "image position)" in text, "a decoder row off at position 20 is called an image position", text[-400:])


def replays(tmp, blob, ours):
    d = ours.get("image_a")
    if not d:
        return
    case = "image_a"
    js = os.path.join(tmp, "local.json")
    rc, text = compare("--local", d, "--model", blob, "--json", js)
    local = []
    if os.path.exists(js):
        with open(js) as f:
            local = [max((t["local_error"] for t in row["taps"] if t["local_error"] is not None), default=None)
                     for row in json.load(f).get("layers", [])]
    check(rc == 0 and "RESULT: every layer agrees locally" in text and len(local) == 6
          and all(x is not None and x <= 1e-7 for x in local),
          f"{case}: zaya.c's own VL dump replays with local error <= 1e-7 at every tap of every layer "
          f"(largest {max(local, default=None)})", text[-600:])
    check(re.search(r"vision tower \(each block recomputed.*\n.*\n\s+0\s+0\s+-\n\s+1\s+0\s+-\n", text) is not None,
          f"{case}: --local replays the 2 vision blocks from the port's inputs, local error 0", text[-900:])
    replay = d + "_replay_fp32"
    with open(os.path.join(replay, "index.json")) as f:
        check(json.load(f).get("image_positions") == mask_ranges(case), f"{case}: the replay dump records the image "
              "positions it ran", "no or other image_positions")
    bf16 = os.path.join(tmp, "zaya_image_b_bf16")   # a legitimate bf16 run: the step check leaves out what the LoRA adds
    rc, _, err = run([ZAYA, blob, "--image", os.path.join(VL, "image_b", "image.png"), "--ids",
                      ",".join(map(str, ids_of("image_b"))), "--dump", bf16, "--precision", "bf16"])
    if check(rc == 0, "image_b: a bf16 run dumps", err[-300:]):
        rc, text = compare("--local", bf16, "--model", blob, "--bf16")
        check(rc == 0 and "RESULT: every layer agrees locally" in text and "STEP CHECK: " in text
              and "every one within the rounding-error bound" in text,
              "image_b: zaya.c's own bf16 VL run passes --local --bf16 (step check, tier 2)", text[-600:])
    tower = os.path.join(tmp, "port_tower")   # a port whose block 1 MLP is off in one patch row (0.1 %)
    shutil.copytree(d, tower, ignore=shutil.ignore_patterns("*_replay*"))
    with open(os.path.join(tower, "index.json")) as f:   # written as a Python port writes it: a list a line
        index = json.load(f)
    with open(os.path.join(tower, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    path = os.path.join(tower, "model.visual.blocks.1.mlp.npy")
    if check(os.path.exists(path), f"{case}: the dump has model.visual.blocks.1.mlp (to perturb it)"):
        x = np.load(path)
        x[9] *= 1.001
        np.save(path, x)
        rc, text = compare("--local", tower, "--model", blob)
        check(rc == 1 and "FIRST LOCAL ERROR: vision block 1, model.visual.blocks.1.mlp" in text
              and "largest row error at row 9" in text, "a tower block's MLP off in one row: located at vision block 1, "
              "model.visual.blocks.1.mlp, row 9", text[-600:])
    broken = os.path.join(tmp, "no_o_lora.bin")
    if not check(zero_tensor(blob, broken, "model.layers.3.self_attn.o_lora_b.weight"),
                 "the blob has model.layers.3.self_attn.o_lora_b.weight (to zero it)"):
        return
    port = os.path.join(tmp, "port_no_o_lora")
    rc, _, err = run([ZAYA, broken, "--image", os.path.join(VL, case, "image.png"), "--ids",
                      ",".join(map(str, ids_of(case))), "--dump", port])
    if not check(rc == 0, "a run without layer 3's o_proj LoRA dumps", err[-300:]):
        return
    rc, text = compare("--local", port, "--model", blob)
    m = re.search(r"largest row error at position (\d+)", text)
    check(rc == 1 and "FIRST LOCAL ERROR: layer 3, model.layers.3.post_attention_residual_scale" in text
          and "an image position" in text and "o_proj's vision LoRA" in text and m and 2 <= int(m.group(1)) < 37,
          "layer 3's o_proj LoRA dropped: located at layer 3 post_attention_residual_scale, at an image position, "
          "the o_proj LoRA named", text[-700:])
    rows = re.findall(r"^\s+(\d) +(\S+) ", text, re.M)
    check(rows and [r for r in rows if r[1] not in ("0", "-")] == [r for r in rows if r[0] == "3"],
          "... and no other layer has a local error", str(rows))
    ref = os.path.join(tmp, "official_" + case)
    if not os.path.exists(os.path.join(ref, "index.json")):
        return
    out = os.path.join(tmp, "official_replay")
    rc, _, err = run([ZAYA, blob, "--replay", ref, "--dump", out])
    if not check(rc == 0 and "model.visual at the image positions" in err,
                 f"{case}: --replay of the official golden (layer 0 from the ids and the golden's model.visual)",
                 err[-400:]):
        return
    worst = max(rel(np.load(os.path.join(out, f"model.layers.{i}.post_mlp_residual_scale.npy")),
                    np.load(os.path.join(ref, f"model.layers.{i}.post_mlp_residual_scale.npy"))) for i in range(6))
    check(worst <= 1e-6, f"{case}: the official run replays within rel L2 1e-6 per layer (worst {worst:.2g})",
          f"{worst:.3g}")
    names = [f"model.visual.blocks.{i}" for i in range(2)]
    have = [n for n in names if os.path.exists(os.path.join(out, n + ".npy"))]
    worst = max((rel(np.load(os.path.join(out, n + ".npy")), np.load(os.path.join(ref, n + ".npy"))) for n in have),
                default=1.0)
    check(len(have) == 2 and worst <= 1e-6, f"{case}: the official tower's 2 blocks replay within rel L2 1e-6 each "
          f"(worst {worst:.2g})", f"{len(have)} blocks, worst {worst:.3g}")


def trace(blob):
    case, pos = "image_b", 4
    rc, out, err = run([ZAYA, blob, "--image", os.path.join(VL, case, "image.png"), "--ids",
                        ",".join(map(str, ids_of(case))), "--trace", str(pos), "--trace-layer", "0"])
    if not check(rc == 0, "--trace 4 (an image position) runs", err[-300:]):
        return
    check("image position 2 of 6" in out and "image feature 2 (model.visual row 2" in out,
          "the trace names the image row (image position 2 of 6, model.visual row 2)", out[:600])
    got = {k: float(v) for k, v in re.findall(r"(q~|k~|v_current|v_delayed|o_lora_b)[^|\n]*\|([0-9.e+-]+)\|", out)}
    taps = os.path.join(VL, case, "taps", "model.language_model.layers.0.")
    want = {k: float(np.linalg.norm(np.load(taps + f + ".npy")[pos])) for k, f in
            (("q~", "self_attn.qkv_proj.q_lora_b"), ("k~", "self_attn.qkv_proj.k_lora_b"),
             ("v_current", "self_attn.qkv_proj.v_current_lora_b"), ("v_delayed", "self_attn.qkv_proj.v_delayed_lora_b"),
             ("o_lora_b", "self_attn.o_lora_b"))}
    worst = max((abs(got[k] - w) / w for k, w in want.items() if k in got), default=1.0)
    check(set(got) == set(want) and worst <= 1e-5, f"the trace's 5 vision LoRA norms equal the official LoRA taps' "
          f"position-4 rows (worst {worst:.2g} relative)", f"trace {got}, official {want}")
    att = out[out.find("self_attn:attn_weights"):]
    keys = [int(k) for k in re.findall(r"pos (\d+) ", att[:att.find("self_attn:attn_output")])]
    check("bidirectional image mask" in att and any(k > pos for k in keys) and min(keys, default=-1) >= 0,
          "the attention note lists the window and the later image positions (no negative position)", att[:500])
    rc, out, err = run([ZAYA, blob, "--image", os.path.join(VL, case, "image.png"), "--ids",
                        ",".join(map(str, ids_of(case))), "--trace", "11", "--trace-layer", "0"])
    check(rc == 0 and "vision LoRA" not in out and "bidirectional" not in out and "image position" not in out,
          "a text position's trace has no LoRA or image-mask lines", out[-300:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if not check(os.path.exists(ZAYA), "./zaya is built", "hint: make zaya"):
            finish()
        ckpt = vl_checkpoint.compose(FX, os.path.join(tmp, "ckpt"))
        blob = os.path.join(tmp, "vl.bin")
        rc, _, err = run([sys.executable, "export_weights.py", ckpt, blob])
        if not check(rc == 0, "export the ZAYA1-VL fixture checkpoint", err.strip()[-600:]):
            finish()
        ours = dumps(tmp, blob)
        against_official(tmp, ours)
        replays(tmp, blob, ours)
        trace(blob)
    finish()


if __name__ == "__main__":
    main()
