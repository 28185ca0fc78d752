#!/usr/bin/env python3
"""test_vl_export.py - ZAYA1-VL checkpoint layouts through export_weights.py, and its --dry-run schema check.

    make zaya && python3 test/test_vl_export.py

- Zyphra's own layout (the hub's; the input of transformers PR #46011's convert_zaya1_vl_weights_to_hf.py):
  the exporter's source name of every blob tensor is the one the converter maps to it (its renames recorded
  in test/fixtures/vl_export/converter_names.json); the compact VL fixture written in that layout
  (tools/vl_checkpoint.py --zyphra) exports to the same tensors, byte for byte, as in transformers' layout,
  with every layer full attention (as the converter's config says), and ./zaya runs an image prompt on it.
- mlx-vlm's folder (mlx_vlm.convert; recorded by tools/vl_mlx_fixture.py): the fixture written with mlx-vlm's
  names and layouts has exactly the recorded names, dtypes and shapes and exports to the checkpoint's tensors
  byte for byte; with the recorded -q matrices (4-bit affine) those 12 tensors are mx.dequantize's values.
- --dry-run on a full-size ZAYA1-VL-8B in Zyphra's layout (header-only shards from
  tools/make_vl_checkpoint.py --header-only --layout zyphra, 97 kB): OK; each kind of damage is listed
  (a missing LoRA pair, a vision depth the weights do not have, a transposed tensor, the other layout's names,
  a name missing from the index) and exits 1; the index alone checks names; a truncated shard is refused.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

from harness import ROOT, check, finish, need_fixtures, run

sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import export_weights  # noqa: E402
import vl_checkpoint  # noqa: E402

FX = need_fixtures()
VX = need_fixtures("vl_export")
N_8B = 5833          # tensors of ZAYA1-VL-8B in Zyphra's layout (per-expert experts and LoRA pairs)


def dry(folder):
    return run([sys.executable, "export_weights.py", "--dry-run", folder])


def converter_names(tmp):
    """The exporter's Zyphra source names against the converter's recorded renames (6 layers, 4 experts)."""
    rec = json.load(open(os.path.join(VX, "converter_names.json")))["names"]
    want = {}                 # transformers' name -> Zyphra's names (experts in order)
    for z, t in rec.items():
        if isinstance(t, list):
            want.setdefault(t[0], []).append((t[1], z))
        else:
            want[t] = [(0, z)]
    want = {t: [z for _, z in sorted(v)] for t, v in want.items()}
    cfg = json.load(open(os.path.join(FX, "vl", "config.json")))
    c = export_weights.vl_config(cfg, "vl/config.json")
    got, bad = {}, []
    for name, _, _ in export_weights.expected_tensors(c):
        t = export_weights.vl_source_name(name)
        got[t] = export_weights.vl_zyphra_sources(name, c)
        if want.get(t) != got[t]:
            bad.append(f"{name}: expected {want.get(t)}, found {got[t]}")
    check(not bad and set(got) == set(want), f"Zyphra's name of each of the {len(got)} blob tensors is the one "
          "the PR's converter maps to it", "; ".join(bad[:3]) + f" ({len(bad)} differ; "
          f"{len(set(want) - set(got))} converter names never read)")


def export_all(tmp, names):
    """export_weights.py tmp/NAME tmp/NAME.bin for each name, all at once (the test's wall clock)."""
    procs = {n: subprocess.Popen([sys.executable, "export_weights.py", os.path.join(tmp, n),
                                  os.path.join(tmp, n + ".bin")],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in names}
    return {n: (p.wait(), p.stdout.read().decode(), p.stderr.read().decode()) for n, p in procs.items()}


def zyphra_export(tmp):
    pr = vl_checkpoint.compose(FX, os.path.join(tmp, "pr"))
    zy = vl_checkpoint.to_zyphra(pr, os.path.join(tmp, "zy"))
    mlx_vlm_header = mlx_vlm_folder(zy, os.path.join(tmp, "mlx"))
    mlx_vlm_folder(zy, os.path.join(tmp, "mlx_q"), quantized=True)
    done = export_all(tmp, ("pr", "zy", "mlx", "mlx_q"))
    blobs = {n: os.path.join(tmp, n + ".bin") for n in done}
    for name in ("pr", "zy"):
        if not check(done[name][0] == 0, f"export the VL fixture in {name} layout", done[name][2][-600:]):
            return
    a, b = open(blobs["pr"], "rb").read(), open(blobs["zy"], "rb").read()
    n = struct.unpack_from("<I", a, 32)[0]        # tensors; the directory follows the 1024-byte header
    check(len(a) == len(b) and a[1024:] == b[1024:], "Zyphra's layout: the same directory and tensor bytes as "
          "transformers' layout", f"sizes {len(a)} / {len(b)}; first difference at byte "
          f"{next((i for i in range(1024, min(len(a), len(b))) if a[i] != b[i]), None)} ({n} tensors)")
    L = struct.unpack_from("<I", b, 136)[0]
    check(struct.unpack_from("<I", b, 44)[0] == 0 and set(b[256:256 + L]) == {0} and
          struct.unpack_from("<i", b, 176)[0] == 0 and b[896:1024] == a[896:1024],
          "Zyphra's flat config: every layer full attention (the converter drops swa_layers), native source layout, "
          "the same VL block", f"layer types {list(b[256:256 + L])}, window {struct.unpack_from('<i', b, 176)[0]}")
    mlx_vlm(tmp, zy, blobs["zy"], mlx_vlm_header, done)
    png = os.path.join(FX, "vl", "image_b", "image.png")
    if check(os.path.exists("zaya"), "./zaya is built", "hint: make zaya"):
        rc, _, err = run(["./zaya", blobs["zy"], "--image", png, "-i", "Describe this image.", "-n", "2", "-t", "0"])
        check(rc == 0 and "6 image tokens" in err, "./zaya --image on the blob of Zyphra's layout",
              err[-300:])


def blob_tensors(path):
    """{name: raw bytes} of a blob's tensors (docs/blob-format.md: the directory after the 1024-byte header)."""
    data = open(path, "rb").read()
    n = struct.unpack_from("<I", data, 32)[0]
    out = {}
    for k in range(n):
        e = data[1024 + k * export_weights.DIR_ENTRY_SIZE:1024 + (k + 1) * export_weights.DIR_ENTRY_SIZE]
        name = e[:export_weights.NAME_SIZE].rstrip(b"\0").decode()
        off, nbytes = struct.unpack_from("<QQ", e, export_weights.NAME_SIZE + 40)
        out[name] = data[off:off + nbytes]
    return out


def mlx_vlm_folder(zy, out, quantized=False):
    """The Zyphra-layout checkpoint `zy` written as mlx_vlm.convert writes it: mlx-vlm's names, experts and their
    LoRA pairs stacked, MLX's Conv1d [C, kernel, in] and Conv3d [D, T, P, P, C]; with `quantized`, the recorded
    packed weights, scales and biases of mlx_vlm.convert -q in place of their modules. Returns the header."""
    rec = json.load(open(os.path.join(VX, "mlx_vlm.json")))
    h, data = vl_checkpoint.read_safetensors(os.path.join(zy, "model.safetensors"))
    arr = {n: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], np.uint16).reshape(e["shape"])
           for n, e in h.items()}
    tensors, stacks = {}, {}
    for n in sorted(h):
        m = re.match(r"(model\.layers\.\d+\.mlp\.zaya_block\.experts)\.local_experts\.(\d+)\.(.*)$", n)
        if m:
            stacks.setdefault(f"language_model.{m.group(1)}.{m.group(3)}", []).append((int(m.group(2)), arr[n]))
            continue
        a = arr[n]
        if re.search(r"conv_qk\.[01]\.weight$", n):
            a = a.transpose(0, 2, 1)
        if n.endswith("patch_embed.proj.weight"):
            a = a.transpose(0, 2, 3, 4, 1)
        tensors["language_model." + n if n.startswith("model.") else n] = a
    for n, parts in stacks.items():
        tensors[n] = np.stack([a for _, a in sorted(parts, key=lambda p: p[0])])
    hdr = {n: ["BF16", list(a.shape)] for n, a in tensors.items()}
    raw = {n: ("BF16", list(a.shape), np.ascontiguousarray(a).tobytes()) for n, a in tensors.items()}
    cfg = dict(rec["config"])
    if quantized:
        qh, qdata = vl_checkpoint.read_safetensors(os.path.join(VX, "mlx_vlm_q.safetensors"))
        for n, e in qh.items():
            raw.pop(n, None)
            raw[n] = (e["dtype"], e["shape"], qdata[e["data_offsets"][0]:e["data_offsets"][1]])
        cfg["quantization"] = rec["quantization"]
    os.makedirs(out)
    vl_checkpoint.write_safetensors(os.path.join(out, "model.safetensors"),
                                    [(n, *raw[n]) for n in sorted(raw)])
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    for name in os.listdir(zy):
        if name.startswith("tokenizer"):
            shutil.copyfile(os.path.join(zy, name), os.path.join(out, name))
    return hdr, rec["tensors"]


def mlx_vlm(tmp, zy, zy_blob, header, done):
    """mlx-vlm's ZAYA1-VL folder (unquantized and -q) through the exporter."""
    got, want = header
    diff = sorted(set(got) ^ set(want)) + [n for n in got if n in want and got[n] != want[n]]
    check(not diff, f"the folder written in mlx-vlm's layout has the {len(want)} names, dtypes and shapes "
          "mlx_vlm.convert wrote (recorded)", f"{len(diff)} differ: {diff[:4]}")
    blob = os.path.join(tmp, "mlx.bin")
    rc, out, err = done["mlx"]
    if not check(rc == 0 and "vl-zyphra layout" in out, "export mlx-vlm's ZAYA1-VL folder", (out + err)[-500:]):
        return
    a, b = blob_tensors(zy_blob), blob_tensors(blob)
    same = [n for n in a if a[n] == b.get(n)]
    check(len(same) == len(a) == len(b), "mlx-vlm's folder: every tensor equals the checkpoint's (same numbers as "
          "test/fixtures/vl's weights)", f"{len(a) - len(same)} of {len(a)} differ: "
          f"{[n for n in a if a[n] != b.get(n)][:3]}")
    blob_q = os.path.join(tmp, "mlx_q.bin")
    rc, out, err = done["mlx_q"]
    if not check(rc == 0 and "12 affine 4-bit group 32" in out, "export mlx-vlm's -q ZAYA1-VL folder",
                 (out + err)[-500:]):
        return
    dh, ddata = vl_checkpoint.read_safetensors(os.path.join(VX, "mlx_vlm_dequantized.safetensors"))
    c = export_weights.vl_config(json.load(open(os.path.join(zy, "config.json"))), "config.json")
    to_blob = {}
    for name, _, _ in export_weights.expected_tensors(c):
        for s in export_weights.vl_zyphra_sources(name, c):
            to_blob["language_model." + s if s.startswith("model.") else s] = name
    q = blob_tensors(blob_q)
    bad, moved = [], set()
    for n, e in dh.items():
        want = np.frombuffer(ddata[e["data_offsets"][0]:e["data_offsets"][1]], np.uint16).astype(np.uint32) << 16
        name = to_blob[n]
        moved.add(name)
        if q[name] != want.astype("<u4").tobytes():
            bad.append(name)
    check(len(dh) == 12 and not bad and all(q[n] == a[n] for n in a if n not in moved),
          "mlx-vlm's -q folder: its 12 quantized matrices are mx.dequantize's recorded values, the other "
          f"{len(a) - len(moved)} tensors the checkpoint's", f"{bad[:3]}")
    rc, out, err = dry(os.path.join(tmp, "mlx_q"))
    check(rc == 1 and "--dry-run checks unquantized Hugging Face layouts only" in err and "run it without --dry-run"
          in err, "--dry-run on a quantized MLX folder says it does not check it (no false listing)", (out + err)[-300:])


def shard_headers(folder):
    idx = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    out = {}
    for fn in sorted(set(idx["weight_map"].values())):
        raw = open(os.path.join(folder, fn), "rb").read()
        n = struct.unpack_from("<Q", raw, 0)[0]
        out[fn] = json.loads(raw[8:8 + n])
    return idx, out


def write_back(folder, idx, headers):
    for fn, h in headers.items():
        tensors = [(k, v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0]) for k, v in h.items()]
        vl_checkpoint.write_safetensors(os.path.join(folder, fn), tensors)
    idx["weight_map"] = {k: fn for fn, h in headers.items() for k in h}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(idx, f)


def damaged(tmp, base, name, edit=None, edit_config=None):
    d = os.path.join(tmp, name)
    shutil.copytree(base, d)
    if edit:
        idx, headers = shard_headers(d)
        edit(headers)
        write_back(d, idx, headers)
    if edit_config:
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        edit_config(cfg)
        json.dump(cfg, open(p, "w"))
    return dry(d)


def find(headers, name):
    return next(h for h in headers.values() if name in h)


def full_size(tmp):
    base = os.path.join(tmp, "zaya1_vl_8b")
    with tarfile.open(os.path.join(VX, "zaya1_vl_8b_zyphra_headers.tar.gz")) as t:
        t.extractall(base)
    before = sorted(os.listdir(base))
    rc, out, err = dry(base)
    check(rc == 0 and f"{N_8B} tensors read from the headers of 4 shard(s); {N_8B} expected for 40 layers, hidden "
          "2048, 16 experts, vision depth 32 hidden 1280, LoRA ranks 8 / 32" in out and "dry run: OK" in out,
          f"--dry-run: ZAYA1-VL-8B in Zyphra's layout ({N_8B} tensors) passes", (out + err)[-500:])
    check(sorted(os.listdir(base)) == before, "--dry-run writes nothing into the checkpoint folder",
          f"{sorted(set(os.listdir(base)) - set(before))} appeared")
    rc, _, err = run([sys.executable, "export_weights.py", base, os.path.join(tmp, "x.bin")])
    check(rc != 0 and "data offsets are out of range" in err and not os.path.exists(os.path.join(tmp, "x.bin")),
          "the export refuses header-only shards (a truncated file is not taken for a whole one)", err[-300:])

    lora = "model.layers.7.attn.self_attn.qkv.lora_linear_q."

    def drop_lora(h):
        for s in ("0.weight", "1.weight"):
            del find(h, lora + s)[lora + s]
    rc, out, _ = damaged(tmp, base, "no_lora", drop_lora)
    check(rc == 1 and f"missing tensor\n  where:    {tmp}/no_lora: {lora}0.weight (and {lora}1.weight)" in out
          and "expected: [8, 2048] (for model.layers.7.self_attn.qkv_proj.q_lora_a.weight)" in out,
          "--dry-run lists a missing LoRA pair (A and B, with their shapes)", out[-600:])

    def drop_block(h):
        for hh in h.values():
            for k in [k for k in hh if k.startswith("vision_tower.blocks.31.")]:
                del hh[k]
    rc, out, _ = damaged(tmp, base, "no_block", drop_block)
    check(rc == 1 and "vision_tower.blocks.31.norm1.weight" in out and "12 problem(s)" in out and
          "more like vision_tower.blocks.#." not in out,
          "--dry-run: weights with one vision block fewer than vision_config.depth (12 missing tensors, grouped)",
          out[-600:])
    rc, out, _ = damaged(tmp, base, "depth33", edit_config=lambda c: c["vision_config"].update(depth=33))
    check(rc == 1 and "missing tensor" in out and "vision_tower.blocks.32." in out and "12 problem(s)" in out,
          "--dry-run: vision_config.depth 33 on 32 blocks of weights", out[-600:])
    rc, out, err = damaged(tmp, base, "depth31", edit_config=lambda c: c["vision_config"].update(depth=31))
    check(rc == 1 and "fullatt_block_indexes" in err and "at most 16 block indexes in 0..30" in err,
          "--dry-run: vision_config.depth 31 with a full-attention block 31 is refused", (out + err)[-400:])

    q = "model.layers.3.attn.self_attn.qkv.linear_q.weight"

    def transpose(h):
        e = find(h, q)[q]
        e["shape"] = e["shape"][::-1]
    rc, out, _ = damaged(tmp, base, "swapped", transpose)
    check(rc == 1 and "tensor has the wrong shape" in out and q in out and "expected: [1024, 2048]" in out and
          "found:    [2048, 1024]" in out and "hint:     transposed: the dimensions reversed" in out,
          "--dry-run: a transposed tensor", out[-600:])

    def mixed(h):
        for old, new in (("vision_tower.merger.ln_q.weight", "model.visual.merger.ln_q.weight"),
                         ("model.final_norm.weight", "model.language_model.final_norm.weight")):
            hh = find(h, old)
            hh[new] = hh.pop(old)
    rc, out, _ = damaged(tmp, base, "mixed", mixed)
    check(rc == 1 and "unexpected tensor" in out and "model.visual.merger.ln_q.weight" in out and
          "a name of transformers' ZAYA1-VL layout" in out and "mixed layouts" in out and
          f"missing tensor\n  where:    {tmp}/mixed: vision_tower.merger.ln_q.weight" in out and "4 problem(s)" in out,
          "--dry-run: names of transformers' layout in Zyphra's (missing + unexpected, the hint names the layout)",
          out[-800:])

    idx_only = os.path.join(tmp, "index_only")
    os.makedirs(idx_only)
    for f in ("config.json", "model.safetensors.index.json"):
        shutil.copyfile(os.path.join(base, f), os.path.join(idx_only, f))
    rc, out, _ = dry(idx_only)
    check(rc == 0 and "the index alone" in out and "names only" in out, "--dry-run on config.json + the index alone",
          out[-300:])
    idx = json.load(open(os.path.join(idx_only, "model.safetensors.index.json")))
    del idx["weight_map"]["model.layers.39.mlp.zaya_block.experts.local_experts.15.lora_fc2.1.weight"]
    json.dump(idx, open(os.path.join(idx_only, "model.safetensors.index.json"), "w"))
    rc, out, _ = dry(idx_only)
    check(rc == 1 and "local_experts.15.lora_fc2.1.weight" in out and "expected: [2048, 32]" in out,
          "--dry-run on the index alone: a missing expert LoRA tensor", out[-400:])

    partial = os.path.join(tmp, "partial")
    shutil.copytree(base, partial)
    os.remove(os.path.join(partial, "model-00002-of-00004.safetensors"))
    rc, out, err = dry(partial)
    check(rc == 1 and "a shard named in the index is missing" in err and "model-00002-of-00004" in err and
          "3 of 4 shards" in err, "--dry-run: a shard missing from a partial download is refused", (out + err)[-300:])

    shard = os.path.join(base, "model-00004-of-00004.safetensors")
    raw = open(shard, "rb").read()
    open(shard, "wb").write(raw[:len(raw) // 2])
    rc, out, err = dry(base)
    check(rc == 1 and "safetensors header length is out of range" in err and "model-00004" in err,
          "--dry-run: a truncated shard is refused", (out + err)[-300:])


def text_layouts():
    for layout in ("checkpoint_native", "checkpoint_legacy"):
        rc, out, err = dry(os.path.join(FX, layout))
        check(rc == 0 and "dry run: OK (names, shapes and dtypes checked" in out, f"--dry-run: {layout}",
              (out + err)[-300:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        converter_names(tmp)
        zyphra_export(tmp)
        full_size(tmp)
        text_layouts()
    finish()


if __name__ == "__main__":
    main()
