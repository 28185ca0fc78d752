#!/usr/bin/env python3
"""fuzz_export.py - a mutation fuzzer for export_weights.py's input parsing (config.json, safetensors
headers, shard index), standard library only.

    python3 test/fuzz/fuzz_export.py [--iterations N] [--seed S] [--zaya ./zaya]
    python3 test/fuzz/fuzz_export.py --replay test/fuzz/regressions/fuzz_export

A tiny valid checkpoint (the dims of make_seeds.py, bf16 weights) is mutated N times with a fixed seed:
config.json values replaced by odd values of every JSON type or deleted, rope_parameters edited,
safetensors header entries edited (dtype, shape, offsets, names, added, removed), the header's raw
bytes or length field changed, the file cut, an index.json with shards. Each case runs
export_weights.main() in-process. The properties:
  - it returns 0 or 1 and never raises (a traceback is a bug);
  - a failure prints 'export_weights.py: error:' with a 'where:' line;
  - when the export succeeds, ./zaya (if --zaya is given) loads the blob and runs one token: the
    exporter never writes a blob that zaya.c refuses.
The tokenizer section is not fuzzed here (test/fuzz/fuzz_tokenizer.c does that): export_tokenizer's
builder is replaced by one returning an empty section, so a case takes milliseconds.
A failing case is saved under build/fuzz_export_failures/<n>/ (config.json + model.safetensors[+ index])
to be copied to test/fuzz/regressions/fuzz_export/; --replay runs such folders. Exit status 1 on any bug.
"""
import argparse
import contextlib
import io
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import export_tokenizer  # noqa: E402
import export_weights as ew  # noqa: E402

export_tokenizer.build_tokenizer_section = lambda ckpt, chat_format=None: b""
WORK = os.path.join(ROOT, "build", "fuzz_export")


def tiny_config():
    return {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "vocab_size": 24, "hidden_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
            "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 4, "router_hidden_size": 4,
            "cca_time0": 2, "cca_time1": 2, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "layer_types": ["hybrid_sliding", "hybrid"], "sliding_window": 3, "max_position_embeddings": 64,
            "bos_token_id": 2, "pad_token_id": 0, "eos_token_id": 1, "attention_bias": False,
            "tie_word_embeddings": True,
            "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                                "hybrid_sliding": {"rope_type": "default", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 0.5}}}


def legacy_config(cfg):
    """The Zyphra-fork schema of the same model (docs/architecture.md 2.4, inverse of the exporter's mapping)."""
    swa = []
    for t in cfg["layer_types"]:
        swa += [cfg["sliding_window"] - 1 if t == "hybrid_sliding" else 0, 0]
    rope = cfg["rope_parameters"]
    return {"architectures": ["ZayaForCausalLM"], "model_type": "zaya", "cca": True, "zaya_use_eda": True,
            "scale_residual_merge": True, "gated_linear_unit": True, "activation_func": "swiglu", "rope_scaling": None,
            "vocab_size": cfg["vocab_size"], "hidden_size": cfg["hidden_size"],
            "num_hidden_layers": 2 * cfg["num_hidden_layers"], "num_attention_heads": cfg["num_attention_heads"],
            "num_query_groups": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"], "num_experts": cfg["num_experts"],
            "moe_router_topk": 1, "ffn_hidden_size": 2 * cfg["moe_intermediate_size"],
            "zaya_mlp_expansion": cfg["router_hidden_size"], "cca_time0": 2, "cca_time1": 2, "norm_epsilon": 1e-5,
            "swa_layers": swa, "rope_theta": rope["hybrid"]["rope_theta"],
            "swa_rotary_base": rope["hybrid_sliding"]["rope_theta"],
            "partial_rotary_factor": rope["hybrid"]["partial_rotary_factor"], "max_position_embeddings": 64,
            "bos_token_id": 2, "pad_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": True}


def legacy_tensors(cfg, tensors):
    """The native tensors under their legacy names (experts split into one tensor each)."""
    c = {"num_hidden_layers": cfg["num_hidden_layers"], "num_experts": cfg["num_experts"]}
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        srcs = ew.legacy_sources(name, c)
        if len(srcs) == 1:
            out[srcs[0]] = (dtype, shape, raw)
        else:
            step = len(raw) // len(srcs)
            for k, src in enumerate(srcs):
                out[src] = (dtype, shape[1:], raw[k * step:(k + 1) * step])
    return out


def tiny_tensors(cfg, rng):
    """{name: (dtype, shape, bytes)} for the native layout of cfg (bf16)."""
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "num_experts", "moe_intermediate_size",
                             "router_hidden_size", "cca_time0", "cca_time1")}
    out = {}
    for name, shape, _ in ew.expected_tensors(c):
        n = math.prod(shape)
        out[name] = ("BF16", list(shape), bytes(rng.randrange(0x3c00, 0x3f80) >> (8 * (i % 2)) & 0xFF
                                                for i in range(2 * n)))
    return out


def safetensors_bytes(tensors):
    header, data = {}, bytearray()
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    return header, bytes(data)


ODD = [0, -1, 1, 2, 3, 7, 2 ** 31, 2 ** 32 + 1, 2 ** 64, 10 ** 30, -2 ** 63, 0.5, 1.5, -0.0, 1e-45, 1e39,
       float("nan"), float("inf"), "", "x", "hybrid", "default", None, True, False, [], [1], ["hybrid"], {}, {"a": 1}]


def mutate_value(rng, v):
    r = rng.random()
    if r < 0.6:
        return rng.choice(ODD)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return rng.choice(ODD)
    return type(v)(v * rng.choice([2, 3, 0.5, -1, 1000])) if isinstance(v, int) else v * rng.choice([2, 0.5, -1, 1e30])


def mutate_config(rng, cfg):
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        r = rng.random()
        keys = list(cfg)
        if r < 0.1:
            del cfg[rng.choice(keys)]
        elif r < 0.3:
            rope = cfg.get("rope_parameters")
            if isinstance(rope, dict) and rope:
                t = rng.choice(list(rope))
                if isinstance(rope[t], dict) and rope[t] and rng.random() < 0.8:
                    k = rng.choice(list(rope[t]) + ["rope_type"])
                    rope[t][k] = mutate_value(rng, rope[t].get(k))
                else:
                    rope[t] = rng.choice(ODD)
        elif r < 0.4 and isinstance(cfg.get("layer_types"), list):
            lt = cfg["layer_types"]
            op = rng.random()
            if op < 0.3 and lt:
                lt.pop()
            elif op < 0.6:
                lt.append(rng.choice(["hybrid", "hybrid_sliding", "mamba", 1, None]))
            elif lt:
                lt[rng.randrange(len(lt))] = rng.choice(ODD)
        elif r < 0.45:
            cfg[rng.choice(["lm_head_bias", "zaya_layers", "cca", "ffn_hidden_size", "swa_layers"])] = rng.choice(ODD)
        else:
            k = rng.choice(keys)
            cfg[k] = mutate_value(rng, cfg[k])
    return cfg


def mutate_header(rng, header, data_len):
    for _ in range(rng.choice([1, 1, 2])):
        names = [n for n in header if n != "__metadata__"]
        name = rng.choice(names)
        e = header[name]
        r = rng.random()
        if not isinstance(e, dict) and 0.35 <= r < 0.9:     # already replaced by an odd value
            r = 0.95
        if r < 0.15:
            del header[name]
        elif r < 0.25:
            header[name + rng.choice(["", ".x", "_"]) + "2"] = json.loads(json.dumps(e))
        elif r < 0.35:
            header[rng.choice(["lm_head.weight", "model.layers.9.foo", "model.layers.0.self_attn.qkv.linear_q.weight",
                               "__metadata__"])] = json.loads(json.dumps(e)) if rng.random() < 0.7 else rng.choice(ODD)
        elif r < 0.5:
            e["dtype"] = rng.choice(["F32", "F16", "BF16", "I8", "U8", "F64", "bf16", 3, None])
        elif r < 0.7:
            sh = e.get("shape") if isinstance(e.get("shape"), list) and all(type(x) is int for x in e["shape"]) else [3]
            e["shape"] = rng.choice([[], [0], [1], sh[::-1], sh + [1], [2 ** 40], [-1], "8", None,
                                     [x * 2 for x in sh], [1.0] * len(sh)])
        elif r < 0.9 and isinstance(e, dict) and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2 \
                and all(type(x) is int for x in e["data_offsets"]):
            o = e["data_offsets"]
            e["data_offsets"] = rng.choice([[o[1], o[0]], [o[0], o[1] + 2], [o[0] - 2, o[1] - 2], [0, data_len + 2],
                                            [o[0]], [o[0], o[1], 0], [str(o[0]), o[1]], [o[0] + 1, o[1] + 1],
                                            [data_len - 2, data_len], [-4, o[1]], None])
        else:
            header[name] = rng.choice(ODD)
    return header


def write_case(d, cfg_text, st_raw, index=None):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "wb") as f:
        f.write(cfg_text.encode("utf-8", "surrogateescape"))
    if index is None:
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st_raw)
    else:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(index)
        for fn, raw in st_raw.items():
            with open(os.path.join(d, fn), "wb") as f:
                f.write(raw)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(d, fn), "w") as f:
            f.write("{}")


def make_case(rng, d, cfg, tensors):
    """One mutated checkpoint folder in d."""
    cfg = json.loads(json.dumps(cfg))
    header, data = safetensors_bytes(tensors)
    kind = rng.random()
    if kind < 0.4:
        cfg = mutate_config(rng, cfg)
    elif kind < 0.75:
        header = mutate_header(rng, header, len(data))
    elif kind < 0.8:
        cfg = mutate_config(rng, cfg)
        header = mutate_header(rng, header, len(data))
    cfg_text = json.dumps(cfg)
    hb = json.dumps(header).encode()
    st = struct.pack("<Q", len(hb)) + hb + data
    if 0.8 <= kind < 0.88:          # raw bytes of the header / length field
        b = bytearray(st)
        for _ in range(rng.choice([1, 2, 4])):
            r = rng.random()
            if r < 0.3:
                struct.pack_into("<Q", b, 0, rng.choice([0, 1, len(hb) - 1, len(hb) + 1, len(b), 2 ** 63, 2 ** 64 - 1]))
            else:
                i = rng.randrange(8, 8 + len(hb))
                b[i] = rng.choice([0, 0x22, 0x7b, 0x7d, 0x5b, 0x2c, 0x30, 0xff, 0x80, 0x5c, rng.randrange(256)])
        st = bytes(b)
    elif 0.88 <= kind < 0.93:       # a cut file
        st = st[:rng.randrange(len(st))]
    elif 0.93 <= kind < 0.97:       # config.json raw text edits
        t = bytearray(cfg_text.encode())
        for _ in range(rng.choice([1, 3])):
            t[rng.randrange(len(t))] = rng.choice(b'{}[]",:0 \xff')
        cfg_text = t.decode("utf-8", "surrogateescape")
    elif kind >= 0.97:              # sharded, with an index (sometimes wrong)
        names = [n for n in header if n != "__metadata__"]
        half = len(names) // 2
        shards = {}
        wm = {}
        for k, part in enumerate((names[:half], names[half:])):
            fn = f"model-0000{k + 1}-of-00002.safetensors"
            sub = {n: tensors[n] for n in part}
            h2, d2 = safetensors_bytes(sub)
            hb2 = json.dumps(h2).encode()
            shards[fn] = struct.pack("<Q", len(hb2)) + hb2 + d2
            wm.update({n: fn for n in part})
        r = rng.random()
        if r < 0.3:
            wm[rng.choice(names)] = rng.choice(["model-00003-of-00002.safetensors", "../x", "", 5, None])
        elif r < 0.5:
            del shards[rng.choice(list(shards))]
        elif r < 0.7:
            del wm[rng.choice(names)]
        index = json.dumps({"metadata": {}, "weight_map": wm} if rng.random() < 0.9 else rng.choice(ODD))
        write_case(d, cfg_text, shards, index)
        return
    write_case(d, cfg_text, st)


def run_case(d, zaya):
    """None if the case behaves, else a description of the bug."""
    out = os.path.join(WORK, "out.bin")
    for p in (out, out + ".tmp"):
        if os.path.exists(p):
            os.remove(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = ew.main([d, out])
    except BaseException:          # noqa: B036 - anything escaping main() is a bug, even SystemExit
        return "traceback:\n" + traceback.format_exc()
    msg = err.getvalue()
    if rc not in (0, 1):
        return f"exit status {rc}: {msg}"
    if rc == 1:
        if "export_weights.py: error:" not in msg or "where:" not in msg:
            return f"failure without a proper message: {msg!r}"
        if os.path.exists(out) or os.path.exists(out + ".tmp"):
            return "an output file was left behind after a failure"
        return None
    if zaya:
        with open(os.path.join(d, "config.json"), "rb") as f:
            try:
                bos = json.loads(f.read()).get("bos_token_id", 2)
            except ValueError:
                bos = 2
        p = subprocess.run([zaya, out, "--ids", str(bos if isinstance(bos, int) else 2), "-n", "1", "--print-ids"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if p.returncode != 0:
            return f"the exporter wrote a blob that zaya refuses (status {p.returncode}): {p.stderr.decode()[-500:]}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zaya", default=None, help="also load every successful export with this zaya binary")
    ap.add_argument("--replay", nargs="*", help="folders holding saved cases (each a checkpoint folder)")
    args = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    bugs = 0
    if args.replay is not None:
        for top in args.replay:
            for name in sorted(os.listdir(top)):
                d = os.path.join(top, name)
                tmp = os.path.join(WORK, "replay")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(d, tmp)
                for fn in ("tokenizer.json", "tokenizer_config.json"):
                    if not os.path.exists(os.path.join(tmp, fn)):
                        with open(os.path.join(tmp, fn), "w") as f:
                            f.write("{}")
                bug = run_case(tmp, args.zaya)
                print(f"{'FAIL' if bug else 'PASS'} fuzz_export replay {name}" + (f": {bug}" if bug else ""))
                bugs += bug is not None
        return 1 if bugs else 0
    rng = random.Random(args.seed)
    cfg = tiny_config()
    tensors = tiny_tensors(cfg, random.Random(0))
    bases = {"native": (cfg, tensors), "legacy": (legacy_config(cfg), legacy_tensors(cfg, tensors))}
    d = os.path.join(WORK, "case")
    for layout, (bcfg, btensors) in bases.items():
        header, data = safetensors_bytes(btensors)
        hb = json.dumps(header).encode()
        write_case(d, json.dumps(bcfg), struct.pack("<Q", len(hb)) + hb + data)
        base_bug = run_case(d, args.zaya)
        if base_bug or not os.path.exists(os.path.join(WORK, "out.bin")):
            print(f"FAIL fuzz_export: the unmutated tiny {layout} checkpoint does not export: {base_bug}")
            return 1
    ok = fails = 0
    for i in range(args.iterations):
        make_case(rng, d, *bases["legacy" if rng.random() < 0.3 else "native"])
        bug = run_case(d, args.zaya)
        if bug:
            bugs += 1
            keep = os.path.join(ROOT, "build", "fuzz_export_failures", str(i))
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(d, keep)
            print(f"BUG case {i} (saved in {keep}): {bug.strip()[-1500:]}")
        elif os.path.exists(os.path.join(WORK, "out.bin")):
            ok += 1
        else:
            fails += 1
    print(f"fuzz_export: {args.iterations} cases (seed {args.seed}): {ok} exported, {fails} refused cleanly, {bugs} bugs")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
