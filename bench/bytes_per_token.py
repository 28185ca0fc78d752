#!/usr/bin/env python3
"""bytes_per_token.py - weight bytes one decode step must read, and the bandwidth ceiling it implies.

A decode step of ZAYA1 reads, per layer, every attention / router / norm / residual-scale tensor and
ONE expert (gate_up + down of the routed expert; 1/E of the stacked expert tensors), then the whole
LM head (= the tied embedding matrix, all V rows) and the final norm, plus one embedding row for the
input token. Sizes are counted from numel and dtype, without the blob's 64-byte alignment padding:
fp32 4 bytes, bf16 2, int8 1 + 4/group (one fp32 scale per group; the group size is per tensor);
format version 2's expert dtypes: FP8 1 + 4/row length (one fp32 scale per row), MXFP4 0.5 + 1/32
(one E8M0 byte per 32 values).
A layer that routes to the skip expert reads no expert, so this is the upper bound of the step.
The KV cache (fp32 keys and values: 2 * nkv * head_dim * 4 bytes per past position per layer) is
reported separately and not included.

  python3 bench/bytes_per_token.py MODEL.bin                 # from the blob's tensor directory
  python3 bench/bytes_per_token.py --config CKPT --dtype int8 # from config.json, blob export rules
  ... --bandwidth 15.5                                        # also print the ceiling in tok/s

stdout: one machine-readable line
  bytes_per_token total=1497640064 attention=... router=... norms=... experts=... lm_head=... kv_per_pos=...
(with --bandwidth also: ceiling_tok_s=...), and with -v a table on stderr. Standard library only.
"""

import argparse
import json
import math
import os
import struct
import sys

DTYPES = {0: "fp32", 1: "bf16", 2: "int8", 3: "fp8", 4: "mxfp4"}
BIG = ("q_proj.weight", "k_proj.weight", "v_proj_current.weight", "v_proj_delayed.weight",
       "o_proj.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "model.embed_tokens.weight")


def element_bytes(dtype, group, cols=None):
    if dtype == "fp8":
        return 1.0 + 4.0 / cols
    if dtype == "mxfp4":
        return 0.5 + 1.0 / 32
    if dtype == "fp32":
        return 4.0
    if dtype == "bf16":
        return 2.0
    if dtype == "int8":
        if group <= 0:
            raise SystemExit("error: int8 tensor without a group size")
        return 1.0 + 4.0 / group
    raise SystemExit("error: unknown dtype %r" % dtype)


def category(name):
    if name == "model.embed_tokens.weight":
        return "lm_head"
    if ".mlp.experts." in name:
        return "experts"
    if ".self_attn." in name:
        return "attention"
    if ".mlp.gate." in name:
        return "router"
    return "norms"   # layernorms, residual scales, input scale/bias, final norm


def read_blob(path):
    """[(name, dtype, shape, group)], config dict, blob size; per docs/blob-format.md (versions 1 and 2)."""
    with open(path, "rb") as f:
        head = f.read(1024)
        if len(head) < 1024 or head[:8] != b"ZAYABLOB":
            raise SystemExit("error: %s is not a zaya blob (bad magic)" % path)
        version, = struct.unpack_from("<I", head, 8)
        if version not in (1, 2):
            raise SystemExit("error: %s: blob format version %d, this tool reads 1 and 2" % (path, version))
        dir_off, n_tensors, wfmt, hdr_group = struct.unpack_from("<QIII", head, 24)
        cfg_vals = struct.unpack_from("<14I", head, 128)
        keys = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "num_experts",
                "experts_per_tok", "moe_intermediate", "router_hidden", "cca_time0", "cca_time1",
                "sliding_window", "max_position")
        cfg = dict(zip(keys, cfg_vals))
        cfg["weight_format"] = DTYPES.get(wfmt, str(wfmt))
        f.seek(dir_off)
        raw = f.read(192 * n_tensors)
        if len(raw) != 192 * n_tensors:
            raise SystemExit("error: %s: truncated tensor directory" % path)
    out = []
    for k in range(n_tensors):
        e = raw[192 * k: 192 * (k + 1)]
        name = e[:128].split(b"\0", 1)[0].decode()
        dt, nd = struct.unpack_from("<II", e, 128)
        shape = list(struct.unpack_from("<4Q", e, 136))[:nd]
        group, = struct.unpack_from("<I", e, 188)
        if DTYPES.get(dt) == "int8" and group == 0:
            group = hdr_group or 32
        out.append((name, DTYPES.get(dt, str(dt)), shape, group))
    return out, cfg, os.path.getsize(path)


def from_config(ckpt, dtype, group):
    """The blob's tensor list as export_weights.py would write it (native names; router etc. fp32)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import make_checkpoint as mc
    with open(os.path.join(ckpt, "config.json") if os.path.isdir(ckpt) else ckpt) as f:
        c = json.load(f)
    legacy = "ffn_hidden_size" in c
    ns = argparse.Namespace(
        hidden=c["hidden_size"], heads=c["num_attention_heads"], head_dim=c["head_dim"], experts=c["num_experts"],
        vocab=c["vocab_size"], cca_time0=c.get("cca_time0", 2), cca_time1=c.get("cca_time1", 2),
        layers=c["num_hidden_layers"] // (2 if legacy else 1),
        kv_heads=c["num_query_groups"] if legacy else c["num_key_value_heads"],
        moe_intermediate=c["ffn_hidden_size"] // 2 if legacy else c["moe_intermediate_size"],
        router_hidden=c["zaya_mlp_expansion"] if legacy else c["router_hidden_size"],
        layer_types="hybrid", sliding_window=None, bos=0, eos=0, pad=0)
    dm = mc.make_dims(ns)
    out = []
    for t in mc.native_tensors(dm, 0.05):
        big = t.name.endswith(BIG) and t.kind == "mat"
        dt = dtype if big else "fp32"
        g = 0
        if dt == "int8":
            row = t.shape[-1]
            g = group
            while row % g:
                g //= 2
        out.append((t.name, dt, list(t.shape), g))
    cfg = {"num_layers": dm["L"], "num_kv_heads": dm["nkv"], "head_dim": dm["d"], "hidden_size": dm["H"],
           "num_experts": dm["E"], "vocab_size": dm["V"], "weight_format": dtype}
    return out, cfg


def count(tensors, cfg):
    cats = {"attention": 0.0, "router": 0.0, "norms": 0.0, "experts": 0.0, "lm_head": 0.0}
    whole = 0.0
    for name, dt, shape, group in tensors:
        numel = math.prod(shape)
        eb = element_bytes(dt, group, shape[-1])
        whole += numel * eb
        cat = category(name)
        if cat == "experts":
            cats[cat] += numel / shape[0] * eb               # one expert of the stacked [E, ...] tensor
        elif cat == "lm_head":
            cats[cat] += numel * eb + shape[1] * eb          # every row for the logits + the input row
        else:
            cats[cat] += numel * eb
    kv = 2 * cfg["num_kv_heads"] * cfg["head_dim"] * 4 * cfg["num_layers"]
    return {k: int(round(v)) for k, v in cats.items()}, int(round(whole)), kv


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("blob", nargs="?")
    p.add_argument("--config", help="checkpoint folder or config.json instead of a blob")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="int8", help="with --config")
    p.add_argument("--group", type=int, default=64, help="int8 group size with --config (default 64, as export_weights.py)")
    p.add_argument("--bandwidth", type=float, help="GB/s: also print ceiling_tok_s = GB/s / bytes per token")
    p.add_argument("-v", "--verbose", action="store_true", help="a table on stderr")
    a = p.parse_args(argv)
    if bool(a.blob) == bool(a.config):
        p.error("give MODEL.bin or --config CKPT")
    if a.blob:
        if not os.path.isfile(a.blob):
            raise SystemExit("error: %s not found" % a.blob)
        tensors, cfg, size = read_blob(a.blob)
    else:
        tensors, cfg = from_config(a.config, a.dtype, a.group)
        size = None
    cats, whole, kv = count(tensors, cfg)
    total = sum(cats.values())
    line = "bytes_per_token total=%d %s kv_per_pos=%d weights_total=%d format=%s" % (
        total, " ".join("%s=%d" % kv_ for kv_ in cats.items()), kv, whole, cfg["weight_format"])
    if a.bandwidth:
        line += " ceiling_tok_s=%.2f" % (a.bandwidth * 1e9 / total)
    print(line)
    if a.verbose:
        e = sys.stderr
        print("| part | bytes per decoded token |", file=e)
        print("| --- | ---: |", file=e)
        for k, v in cats.items():
            print("| %s | %s (%.1f%%) |" % (k, format(v, ","), 100.0 * v / total), file=e)
        print("| **total** | **%s = %.3f GB** |" % (format(total, ","), total / 1e9), file=e)
        print("weights in the model: %.3f GB%s; KV cache read per past position: %s bytes"
              % (whole / 1e9, "" if size is None else " (blob file %.3f GB)" % (size / 1e9), format(kv, ",")),
              file=e)


if __name__ == "__main__":
    main()
