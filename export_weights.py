#!/usr/bin/env python3
"""export_weights.py - turn a Hugging Face ZAYA1 checkpoint folder into one zaya.c model blob.

    python3 export_weights.py CKPT_DIR OUT.bin [--dtype fp32|bf16|int8] [--group-size 64]
                              [--chat-format auto|chatml|gemma|none] [--keep-quantized-experts]
                              [--weights PORT.safetensors]

CKPT_DIR is a folder as published on the hub: config.json, model.safetensors (or sharded
model-0000N-of-0000M.safetensors + model.safetensors.index.json), tokenizer.json and
tokenizer_config.json (or their gzipped .gz, read when the plain file is absent; the plain file wins
when both are there). Every ZAYA1 schema is accepted and gives the same blob (docs/checkpoints.md):
  native  (Zyphra/ZAYA1-8B, ZAYA1-74B-preview; transformers' ZayaForCausalLM): hybrid layers;
  legacy  (the -legacy repos, Zyphra's fork branch zaya1-legacy): 2L half-layers, renamed to native
          names here (docs/architecture.md section 2.4; the engine knows one layout only);
  base    (ZAYA1-base, ZAYA1-reasoning-base, fork branch zaya): per-half-layer config lists, legacy
          tensor names (section 2.5); the lists must be uniform.
An option the official code computes but zaya.c does not is refused as a limitation of zaya.c.

Quantized expert checkpoints (Zyphra's FP8-Experts / MXFP4-Experts, compressed-tensors
`quantization_config`) are recognised and their experts dequantized exactly as the official code does
(docs/quantized-experts.md); with --keep-quantized-experts the experts stay FP8 / MXFP4 in the blob
(format version 2; the other matrices take --dtype) and the engine dequantizes them as it reads them.

An MLX-saved folder (packed U32 NAME.weight + NAME.scales [+ NAME.biases], config.json "quantization") is read
with its quantized weights as mx.dequantize gives them, bit for bit, names mapped to the checkpoint's
(mlx_weights.py; --mlx-compute float32: the values MLX's quantized matmul uses with float32 activations).

With --weights, a port's own weights (F32/F16/BF16 safetensors under the HF native names, as a Core ML,
MLX or PyTorch port writes them after dequantizing) replace the checkpoint's tensors of the same name;
each replaced tensor is listed and stored exactly (float32, or bf16 when the blob's matrices are bf16 or
int8 and its values are bf16 numbers), so zaya.c computes the exact model on the port's weights.

The blob layout is described in docs/blob-format.md and mirrored by zaya.c (ZayaFileHeader).
Python standard library only. Tensors are streamed in chunks, so peak memory stays far below the
checkpoint size. Any problem with the input is reported as one message (what, where, expected vs
found, hint) and exit status 1 - never a traceback.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time
import zlib

import export_tokenizer
import gguf
import mlx_weights

FORMAT_VERSION = 1          # what every blob without native FP8 / MXFP4 experts is written as
FORMAT_VERSION_QUANTIZED = 2  # format version 2 adds the dtypes 3 (FP8 rows) and 4 (MXFP4) for the experts
MAGIC = b"ZAYABLOB"
EXPORTER_VERSION = "zaya.c export_weights.py 1.0"
HEADER_SIZE = 1024          # fixed header + config + layer types + provenance
DIR_ENTRY_SIZE = 192        # one tensor directory entry
NAME_SIZE = 128             # NUL-padded tensor name inside an entry
GGML_TYPE_AT = 124          # a GGUF's blob: u32 1 + the tensor's ggml type at bytes 124..127 of the name field
MAX_LAYERS = 256            # size of the layer-type table in format version 1
MAX_EOS = 4
ALIGN = 64                  # every tensor starts on a 64-byte boundary
DEFAULT_GROUP = 64          # int8: one fp32 scale per 64 weights = 1.0625 bytes per weight, as Q8_0's
                            # 32 weights + fp16 scale (groups of 32 would read 6% more bytes per token)
MIN_AUTO_GROUP = 8          # int8: a matrix whose rows allow no larger group stays bf16 (groups of 4 take as many bytes)
PAGE = 4096                 # the data section starts on a page boundary
CHUNK = 1 << 24             # stream 16 MB at a time

DTYPE_CODES = {"fp32": 0, "bf16": 1, "int8": 2}   # tensor dtypes in the blob
LAYER_TYPES = {"hybrid": 0, "hybrid_sliding": 1}
ST_DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2}    # safetensors dtypes we can read
QUANT_ST_DTYPE_SIZE = {"F8_E4M3": 1, "U8": 1, "F8_E8M0": 1,   # only in quantized expert checkpoints
                       "U32": 4}                                # MLX's packed weights (mlx_weights.py)


LIMITATION = "this is a limitation of zaya.c, not a problem with the checkpoint"


class ExportError(Exception):
    """A problem with the input; the message is printed as is."""


def fail(what, where, expected=None, found=None, hint=None):
    raise ExportError(gguf.message(what, where, expected, found, hint))


# ----------------------------------------------------------------------------------------------
# Reading the checkpoint folder
# ----------------------------------------------------------------------------------------------

def read_json(path, what):
    if not os.path.isfile(path):
        fail(f"missing {what}", path, hint="point export_weights.py at a Hugging Face checkpoint folder "
             "(config.json, *.safetensors, tokenizer.json, tokenizer_config.json)")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{what} is not valid JSON", path, hint=f"parser said: {e}")


class SafetensorsFile:
    """One .safetensors file: an 8-byte little-endian header length, a JSON header, raw data."""

    def __init__(self, path, header_only=False):
        """header_only (--dry-run): the data section may be absent (tools/make_vl_checkpoint.py --header-only, a
        partial download) and an unsupported dtype is the caller's to report; the header itself must be whole."""
        self.path = path
        self.size, self.f = gguf.open_sized(path, "safetensors", 8, "at least 8 bytes", "re-download the file", fail)
        (n,) = struct.unpack("<Q", self.f.read(8))
        if n == 0 or n > min(self.size - 8, 100 << 20):
            fail("safetensors header length is out of range", path,
                 f"1..{min(self.size - 8, 100 << 20)} bytes", n, "the file is truncated or not safetensors")
        try:
            header = json.loads(self.f.read(n).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            fail("safetensors header is not valid JSON", path, hint=f"parser said: {e}")
        if not isinstance(header, dict):
            fail("safetensors header is not a JSON object", path)
        self.data_start = 8 + n
        data_size = self.size - self.data_start
        self.tensors = {}
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            where = f"{path}: tensor {name}"
            if not isinstance(info, dict):
                fail("tensor entry is not an object", where)
            dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
            if dtype not in ST_DTYPE_SIZE and dtype not in QUANT_ST_DTYPE_SIZE and not header_only:
                packed = dtype in ("U32", "I32", "U16", "I16", "U8", "I8", "U4", "I4")
                fail("unsupported tensor dtype", where, "one of " + ", ".join(ST_DTYPE_SIZE), dtype,
                     "packed integers: a quantized checkpoint (MLX 4-bit packs 8 values per U32, with .scales and "
                     ".biases beside); write the weights dequantized (the values the port computes with) as F32/F16/"
                     "BF16 safetensors and give them with --weights (docs/compare.md §10)" if packed else
                     "ZAYA checkpoints are published in BF16")
            if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
                    or len(shape) > 5):        # 5: ZAYA1-VL's Conv3d patch embedding
                fail("malformed tensor shape", where, "a list of at most 5 non-negative integers", shape)
            if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
                    or not 0 <= offs[0] <= offs[1] <= (offs[1] if header_only else data_size)):
                fail("tensor data offsets are out of range", where, f"[begin, end] within 0..{data_size}",
                     offs, "the file is truncated or corrupt; re-download it")
            numel = 1
            for d in shape:
                numel *= d
            size = ST_DTYPE_SIZE.get(dtype) or QUANT_ST_DTYPE_SIZE.get(dtype)
            if size and offs[1] - offs[0] != numel * size:
                fail("tensor byte size does not match its shape and dtype", where,
                     f"{numel} x {size} = {numel * size} bytes",
                     f"{offs[1] - offs[0]} bytes")
            self.tensors[name] = (dtype, tuple(shape), offs[0], offs[1])
            spans.append((offs[0], offs[1], name))
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                fail("two tensors overlap in the data section", f"{path}: {n0} and {n1}",
                     "disjoint byte ranges", f"[{b0},{e0}) and [{b1},{e1})")

    def read(self, name, begin, end):
        """Raw bytes [begin, end) of tensor `name`'s data (offsets relative to the tensor)."""
        _, _, start, stop = self.tensors[name]
        self.f.seek(self.data_start + start + begin)
        data = self.f.read(min(end, stop - start) - begin)
        if len(data) != min(end, stop - start) - begin:
            fail("safetensors file ended early", f"{self.path}: tensor {name}", hint="re-download the file")
        return data


def checkpoint_files(ckpt):
    """(weight_map or None, shard file names) of a checkpoint folder: its index's, validated, or model.safetensors."""
    if not os.path.isdir(ckpt):
        fail("checkpoint folder not found", ckpt, hint="give the folder that holds config.json and *.safetensors")
    index = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.isfile(index):
        idx = read_json(index, "model.safetensors.index.json")
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            fail("model.safetensors.index.json has no weight_map", index)
        for fn in wm.values():
            if not isinstance(fn, str) or not fn or "/" in fn or "\\" in fn or fn.startswith("."):
                fail("weight_map names an invalid shard file", index, "a file name in this folder", repr(fn))
        return wm, sorted(set(wm.values()))
    if os.path.isfile(os.path.join(ckpt, "model.safetensors")):
        return None, ["model.safetensors"]
    fail("no weights found", ckpt, "model.safetensors or model.safetensors.index.json + shards",
         ", ".join(sorted(os.listdir(ckpt))) or "(empty folder)", "download the whole hub folder (for --dry-run the "
         "index is enough)")


def open_checkpoint(ckpt, header_only=False):
    """Returns {tensor name: SafetensorsFile} over the single file or all shards (header_only: SafetensorsFile's)."""
    wm, files = checkpoint_files(ckpt)
    for fn in files:            # every shard present before any is read
        if not os.path.isfile(os.path.join(ckpt, fn)):
            fail("a shard named in the index is missing", os.path.join(ckpt, fn), "a file", "nothing there",
                 "download the whole hub folder")
    where = {}
    for fn in files:
        path = os.path.join(ckpt, fn)
        st = SafetensorsFile(path, header_only)
        for name in st.tensors:
            if name in where:
                fail("tensor stored twice", f"{name} in {where[name].path} and {path}")
            if wm is not None and wm.get(name) != fn:
                fail("tensor is not where the index says", f"{path}: {name}", wm.get(name), fn)
            where[name] = st
    if wm is not None:
        for name, fn in wm.items():
            if name not in where:
                fail("tensor listed in the index is missing from its shard", f"{fn}: {name}",
                     hint="the shard is truncated or from another checkpoint")
    return where


# ----------------------------------------------------------------------------------------------
# Config: both schemas to one native config (docs/architecture.md 2.1, 2.4)
# ----------------------------------------------------------------------------------------------

LEGACY_CONFIG_KEYS = ("cca", "num_query_groups", "ffn_hidden_size", "zaya_mlp_expansion", "norm_epsilon",
                      "zaya_layers")
LEGACY_TENSOR_MARKERS = (".zaya_block.", ".self_attn.qkv.linear_q", ".res_scale.", "model.final_norm.")


def detect_layout(cfg, names):
    """Tensor names are authoritative; config markers decide only a folder with no marker names."""
    if any(m in n for n in names for m in LEGACY_TENSOR_MARKERS):
        return "legacy"
    if any(".self_attn.qkv_proj." in n for n in names):
        return "native"
    return "legacy" if any(k in cfg for k in LEGACY_CONFIG_KEYS) else "native"


def need(cfg, key, kind, where, check=None, expected=None):
    if key not in cfg:
        fail(f"config.json has no '{key}'", where, hint="is this a ZAYA1 checkpoint?")
    v = cfg[key]
    ok = isinstance(v, kind) and not isinstance(v, bool) if kind is not bool else isinstance(v, bool)
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok or (check is not None and not check(v)):
        fail(f"config value '{key}' is not supported", where, expected or kind.__name__, repr(v))
    return v


# transformers' ZayaConfig defaults (configuration_zaya.py): a key the config.json leaves out takes these
HF_DEFAULTS = {"vocab_size": 262272, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 8,
               "num_key_value_heads": 2, "head_dim": 128, "num_experts": 16, "num_experts_per_tok": 1,
               "moe_intermediate_size": 2048, "router_hidden_size": 256, "cca_time0": 2, "cca_time1": 2,
               "rms_norm_eps": 1e-5, "eos_token_id": 106}
HF_DEFAULT_ROPE = {"hybrid": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
                   "hybrid_sliding": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}


def native_config(cfg, path):
    """The config the engine needs, from the native (transformers ZayaConfig) schema; a missing key
    takes ZayaConfig's default, as in the official code."""
    cfg = {**HF_DEFAULTS, **cfg}
    if "layer_types" not in cfg and type(cfg["num_hidden_layers"]) is int:
        cfg["layer_types"] = ["hybrid"] * cfg["num_hidden_layers"]
    if "rope_parameters" not in cfg:
        cfg["rope_parameters"] = HF_DEFAULT_ROPE
    pos = lambda v: v > 0
    c = {k: need(cfg, k, int, path, pos) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "num_experts", "moe_intermediate_size", "router_hidden_size", "cca_time0", "cca_time1")}
    c["num_experts_per_tok"] = need(cfg, "num_experts_per_tok", int, path, lambda v: v == 1,
                                    "1 (upstream rejects top-k != 1)")
    c["rms_norm_eps"] = need(cfg, "rms_norm_eps", float, path, pos)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        fail("config value 'hidden_act' is not supported by zaya.c", path, "'silu'", repr(act),
             LIMITATION + "; the experts' activation is SiLU in every published ZAYA1 checkpoint")
    types = need(cfg, "layer_types", list, path)
    if len(types) != c["num_hidden_layers"] or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types):
        fail("config value 'layer_types' is not supported", path,
             f"{c['num_hidden_layers']} entries of 'hybrid' / 'hybrid_sliding'", repr(types)[:200])
    c["layer_types"] = types
    rope = need(cfg, "rope_parameters", dict, path)
    c["rope_theta"], c["partial_rotary_factor"] = {}, {}
    for t in LAYER_TYPES:
        p = rope.get(t)
        if not isinstance(p, dict):        # non-dict entries (a stray "rope_type") are skipped, as HF does
            if t in types:
                fail(f"rope_parameters has no entry for layer type '{t}'", path)
            p = rope.get("hybrid", {})
        if p.get("rope_type", "default") != "default":
            fail("RoPE type is not supported by zaya.c", f"{path}: rope_parameters.{t}.rope_type", "'default'",
                 repr(p.get("rope_type")), LIMITATION + " (only the plain RoPE of the published checkpoints)")
        c["rope_theta"][t] = need(p, "rope_theta", float, f"{path}: rope_parameters.{t}", pos)
        c["partial_rotary_factor"][t] = (need(p, "partial_rotary_factor", float, f"{path}: rope_parameters.{t}",
                                              lambda v: 0 < v <= 1, "a number in (0, 1]")
                                         if "partial_rotary_factor" in p else 1.0)
    sw = cfg.get("sliding_window")
    if "hybrid_sliding" in types and not (isinstance(sw, int) and sw > 0):
        fail("config has hybrid_sliding layers but no sliding_window", path, "a positive integer", repr(sw))
    c["sliding_window"] = sw if isinstance(sw, int) and sw > 0 else 0
    for key in ("attention_bias", "lm_head_bias"):     # biases of q/k/v/o_proj and of the LM head
        c[key] = need(cfg, key, bool, path) if cfg.get(key) is not None else False
    if cfg.get("tie_word_embeddings", True) is not True:
        fail("config value 'tie_word_embeddings' is not supported by zaya.c", path, "true", repr(cfg.get("tie_word_embeddings")),
             LIMITATION + ": the LM head is the embedding (every published ZAYA1 checkpoint ties them)")
    c["router_norm_eps"] = c["rms_norm_eps"]        # the base schema's fork code may use another one
    opt = lambda key, default: default if cfg.get(key) is None else need(cfg, key, int, path)  # noqa: E731
    c["max_position_embeddings"] = opt("max_position_embeddings", 131072)
    c["bos_token_id"] = opt("bos_token_id", 2)
    c["pad_token_id"] = opt("pad_token_id", 0)      # unused by zaya.c: a config without one (or null) gets 0
    eos = cfg["eos_token_id"]                       # null: no end-of-sequence id
    c["eos_token_ids"] = eos if isinstance(eos, list) else [] if eos is None else [eos]
    return c


def fork_common_checks(cfg, path, schema):
    """Flags of Zyphra's fork (both schemas) that change the computation: refused unless as published."""
    for key in ("zaya_use_eda", "zaya_use_mod", "cca", "scale_residual_merge", "gated_linear_unit"):
        if cfg.get(key, True) is not True:
            fail(f"{schema} config value '{key}' is not supported by zaya.c", path, "true", repr(cfg.get(key)),
                 LIMITATION + " (it implements the published ZAYA1 architecture: CCA, EDA router, skip expert, "
                 "scaled residuals, SwiGLU experts)")
    if cfg.get("activation_func", "swiglu") != "swiglu":
        fail(f"{schema} config value 'activation_func' is not supported by zaya.c", path, "'swiglu'",
             repr(cfg.get("activation_func")), LIMITATION)
    if cfg.get("add_bias_linear", False) is not False:
        fail(f"{schema} config value 'add_bias_linear' is not supported by zaya.c", path, "false",
             repr(cfg.get("add_bias_linear")), LIMITATION + ": in Zyphra's fork add_bias_linear adds biases to the "
             "expert MLPs (linear_fc1/fc2), which neither zaya.c nor the native ZayaForCausalLM has; the attention "
             "biases come from 'attention_bias'")
    if cfg.get("rope_scaling") not in (None, False):
        fail(f"{schema} config value 'rope_scaling' is not supported by zaya.c", path, "null or false",
             repr(cfg["rope_scaling"]), LIMITATION + " (only the plain RoPE of the published checkpoints)")
    if cfg.get("moe_router_topk", 1) != 1:
        fail(f"{schema} config value 'moe_router_topk' is not supported", path, "1", repr(cfg.get("moe_router_topk")),
             "ZAYA1 routes every token to one expert; the official code supports top-1 only")
    for key in ("attention_bias", "lm_head_bias", "tie_word_embeddings"):
        if key in cfg and not isinstance(cfg[key], bool):
            fail(f"{schema} config value '{key}' is not supported", path, "true or false", repr(cfg[key]))


def legacy_to_native_config(cfg, path):
    """Zyphra fork schema (branch zaya1-legacy: 2L half-layers, scalar fields) -> native schema
    (docs/architecture.md 2.4). Defaults are the fork's ZayaConfig defaults."""
    if "zaya_layers" in cfg:
        return base_to_native_config(cfg, path)
    fork_common_checks(cfg, path, "legacy")
    half = need(cfg, "num_hidden_layers", int, path, lambda v: v > 0 and v % 2 == 0, "an even number of half-layers")
    need(cfg, "ffn_hidden_size", int, path, lambda v: v > 0 and v % 2 == 0, "an even positive integer (2 x expert width)")
    need(cfg, "zaya_mlp_expansion", int, path, lambda v: v > 0, "a positive integer (router hidden size)")
    nkv = cfg.get("num_query_groups", cfg.get("num_key_value_heads", 2))
    if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] != nkv:
        fail("legacy config has num_query_groups != num_key_value_heads", path, f"both {nkv}",
             repr(cfg["num_key_value_heads"]), "the fork asserts they are equal (CCA uses one, the attention the other)")
    if cfg.get("sliding_window") is not None:
        fail("legacy config value 'sliding_window' is not supported by zaya.c", path, "null (windows come from swa_layers)",
             repr(cfg["sliding_window"]), LIMITATION + ": the fork's per-half-layer 'swa_layers' is what ZAYA1 checkpoints use")
    layers = half // 2
    swa = cfg.get("swa_layers") or [0] * half
    if not isinstance(swa, list) or len(swa) != half or not all(type(w) is int and w >= 0 for w in swa):
        fail("legacy config value 'swa_layers' is not supported", path, f"{half} non-negative integers", repr(swa)[:200])
    windows = sorted({w for w in swa[::2] if w > 0})
    if len(windows) > 1:
        j = next(k for k in range(0, half, 2) if swa[k] == windows[1])
        fail("legacy config value 'swa_layers' is not uniform", f"{path}: swa_layers[{j}] (half-layer {j})",
             f"one window for every sliding half-layer ({windows[0]})", swa[j],
             LIMITATION + ": the blob holds one sliding_window")
    if any(swa[1::2]):
        j = next(k for k in range(1, half, 2) if swa[k])
        fail("legacy config value 'swa_layers' sets a window on an MoE half-layer", f"{path}: swa_layers[{j}]",
             "0 on odd (MoE) half-layers", swa[j])
    types = ["hybrid" if w == 0 else "hybrid_sliding" for w in swa[::2]]
    prf = cfg.get("partial_rotary_factor", 0.5)      # checked by native_config below
    if windows and cfg.get("swa_rotary_base") is None:
        fail("legacy config has sliding half-layers (swa_layers) but no 'swa_rotary_base'", path,
             "a number (the RoPE theta of the sliding layers)", None, "the fork needs it to build the sliding layers' RoPE")
    native = {
        "vocab_size": cfg.get("vocab_size", 262272), "hidden_size": cfg.get("hidden_size"),
        "num_hidden_layers": layers, "num_attention_heads": cfg.get("num_attention_heads", 8),
        "num_key_value_heads": nkv, "head_dim": cfg.get("head_dim", 128), "num_experts": cfg.get("num_experts", 16),
        "num_experts_per_tok": cfg.get("moe_router_topk", 1),
        "moe_intermediate_size": cfg["ffn_hidden_size"] // 2,
        "router_hidden_size": cfg["zaya_mlp_expansion"], "cca_time0": cfg.get("cca_time0", 2),
        "cca_time1": cfg.get("cca_time1", 2), "rms_norm_eps": cfg.get("norm_epsilon", 1e-5),
        "hidden_act": "silu", "layer_types": types,
        "rope_parameters": {
            "hybrid": {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 5000000.0),
                       "partial_rotary_factor": prf},
            "hybrid_sliding": {"rope_type": "default", "rope_theta": cfg.get("swa_rotary_base", 10000.0),
                               "partial_rotary_factor": prf}},
        "sliding_window": windows[0] + 1 if windows else None,   # the fork's mask keeps window + 1 keys
        "attention_bias": cfg.get("attention_bias", False),     # the fork: q/k/val_proj1/val_proj2/o_proj biases
        "lm_head_bias": cfg.get("lm_head_bias", False),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", True),
    }
    for k in ("max_position_embeddings", "bos_token_id", "pad_token_id", "eos_token_id"):
        if k in cfg:
            native[k] = cfg[k]
    return native_config(native, path + " (legacy schema, converted)")


def uniform(cfg, key, path, picks, what):
    """The one value of per-half-layer list cfg[key] at the half-layers `picks`; refuses other lists."""
    v = cfg.get(key)
    n = max(picks) + 1
    if not isinstance(v, list) or len(v) < n or not all(type(x) is int and not isinstance(x, bool) for x in v):
        fail(f"ZAYA1-base config value '{key}' is not supported", path, f"a list of {n}+ integers (one per half-layer)",
             repr(v)[:200])
    first = v[picks[0]]
    for j in picks:
        if v[j] != first:
            fail(f"ZAYA1-base config value '{key}' is not uniform", f"{path}: {key}[{j}] (half-layer {j}, {what})",
                 f"{first} (as at half-layer {picks[0]})", v[j],
                 LIMITATION + ": every layer of a zaya.c model has the same shape")
    return first


def base_to_native_config(cfg, path):
    """The older per-half-layer schema of ZAYA1-base / ZAYA1-reasoning-base (Zyphra's fork, branch
    `zaya`) -> native schema. Mirrors that branch's code: head_dim = hidden_size / num_attention_heads,
    num_attention_heads / 2 query heads, CCA kernels 2 and 2, the router RMSNorm's epsilon from
    `layernorm_epsilon` (default 1e-6), one sliding_window for every layer if set."""
    fork_common_checks(cfg, path, "ZAYA1-base")
    zl = cfg["zaya_layers"]
    if not isinstance(zl, list) or not zl or len(zl) % 2:
        fail("ZAYA1-base config value 'zaya_layers' is not supported", path,
             "a list alternating 'a' (attention) and an expert count, even length", repr(zl)[:200])
    half = len(zl)          # the fork builds one half-layer per entry and never reads num_hidden_layers
    for j, e in enumerate(zl):
        if (j % 2 == 0) != (e == "a") or (j % 2 == 1 and not (type(e) is int and e > 0)):
            fail("ZAYA1-base config value 'zaya_layers' is not supported", f"{path}: zaya_layers[{j}] (half-layer {j})",
                 "'a' on even half-layers, a positive expert count on odd ones", repr(e),
                 LIMITATION + ": a zaya.c layer is one attention half-layer followed by one MoE half-layer")
    att, moe = list(range(0, half, 2)), list(range(1, half, 2))
    experts = zl[1]
    for j in moe:
        if zl[j] != experts:
            fail("ZAYA1-base config value 'zaya_layers' is not uniform", f"{path}: zaya_layers[{j}] (half-layer {j}, MoE)",
                 f"{experts} experts (as at half-layer 1)", zl[j], LIMITATION + ": every layer of a zaya.c model has the same shape")
    H = need(cfg, "hidden_size", int, path, lambda v: v > 0)
    nh = need(cfg, "num_attention_heads", int, path, lambda v: v > 0 and v % 2 == 0,
              "an even number (the fork uses num_attention_heads / 2 query heads)")
    if H % nh:
        fail("ZAYA1-base config: hidden_size is not a multiple of num_attention_heads", path,
             f"a multiple of {nh}", H, "the fork's head_dim is hidden_size / num_attention_heads")
    d = H // nh
    if cfg.get("head_dim") is not None and cfg["head_dim"] != d:
        fail("ZAYA1-base config: head_dim differs from hidden_size / num_attention_heads", path, d, cfg["head_dim"],
             "the fork's CCA uses hidden_size / num_attention_heads, its RoPE uses head_dim: they must agree")
    nq = uniform(cfg, "cca_num_q_heads", path, att, "attention")
    if nq != nh // 2:
        fail("ZAYA1-base config: cca_num_q_heads is not num_attention_heads / 2", f"{path}: cca_num_q_heads[0]",
             nh // 2, nq, "the fork views the CCA queries as num_attention_heads / 2 heads")
    nkv = uniform(cfg, "num_query_groups_list", path, att, "attention")
    if cfg.get("num_key_value_heads", nkv) != nkv:
        fail("ZAYA1-base config: num_query_groups_list differs from num_key_value_heads", f"{path}: num_query_groups_list[0]",
             cfg.get("num_key_value_heads"), nkv, "the fork's CCA uses the list, its attention num_key_value_heads")
    if nkv <= 0 or nq % nkv:
        fail("ZAYA1-base config: query heads are not a multiple of the KV heads", path,
             f"cca_num_q_heads a multiple of num_query_groups_list ({nkv})", nq)
    ffn = uniform(cfg, "ffn_hidden_size_list", path, moe, "MoE")
    if ffn <= 0 or ffn % 2:
        fail("ZAYA1-base config value 'ffn_hidden_size_list' is not supported", f"{path}: ffn_hidden_size_list[1]",
             "an even positive integer (2 x expert width)", ffn)
    R = uniform(cfg, "zaya_mlp_expansion", path, moe, "MoE")
    for key in ("cca_time0", "cca_time1"):
        if cfg.get(key, 2) != 2:
            fail(f"ZAYA1-base config value '{key}' is not supported", path, "2 (or absent)", repr(cfg[key]),
                 "the fork's ZAYA1-base code ignores it and always uses 2; a config that sets another value is ambiguous")
    for key in ("swa_layers", "swa_rotary_base", "layer_types", "rope_parameters"):
        if cfg.get(key) is not None:
            fail(f"ZAYA1-base config has '{key}'", path, "no such key in the per-half-layer schema", repr(cfg[key])[:100],
                 "this mixes two schemas; export the checkpoint as it was published")
    sw = cfg.get("sliding_window")
    if sw is not None and not (type(sw) is int and sw > 0):
        fail("ZAYA1-base config value 'sliding_window' is not supported", path, "null or a positive integer", repr(sw))
    L = half // 2
    prf = cfg.get("partial_rotary_factor", 0.5)
    theta = cfg.get("rope_theta", 10000.0)
    rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf}
    native = {
        "vocab_size": cfg.get("vocab_size", 262272), "hidden_size": H, "num_hidden_layers": L,
        "num_attention_heads": nq, "num_key_value_heads": nkv, "head_dim": d, "num_experts": experts,
        "num_experts_per_tok": cfg.get("moe_router_topk", 1), "moe_intermediate_size": ffn // 2,
        "router_hidden_size": R, "cca_time0": 2, "cca_time1": 2, "rms_norm_eps": cfg.get("norm_epsilon", 1e-5),
        "hidden_act": "silu", "layer_types": ["hybrid_sliding" if sw else "hybrid"] * L,
        "rope_parameters": {"hybrid": rope, "hybrid_sliding": rope},
        "sliding_window": sw,              # the fork's causal mask keeps sliding_window keys, on every layer
        "attention_bias": cfg.get("attention_bias", False), "lm_head_bias": cfg.get("lm_head_bias", False),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", True),
        "max_position_embeddings": cfg.get("max_position_embeddings", 4096), "bos_token_id": cfg.get("bos_token_id", 2),
        "pad_token_id": cfg.get("pad_token_id", 0), "eos_token_id": cfg.get("eos_token_id", 1),
    }
    c = native_config(native, path + " (ZAYA1-base schema, converted)")
    eps = cfg.get("layernorm_epsilon", 1e-6)       # the fork's ZayaRouter: rmsnorm_eda eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        fail("ZAYA1-base config value 'layernorm_epsilon' is not supported", path, "a number in (0, 1)", repr(eps))
    c["router_norm_eps"] = float(eps)
    return c


# ----------------------------------------------------------------------------------------------
# The tensors the engine expects (docs/architecture.md 2.2) and where each comes from
# ----------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------------------------
# ZAYA1-VL (transformers pull request #46011, Zaya1VLForConditionalGeneration): the text model's tensors
# under model.language_model.*, the vision LoRA pairs beside them, the vision tower under model.visual.*.
# Written as blob format version 3 (docs/blob-format.md): the VL block at header offset 896.
# ----------------------------------------------------------------------------------------------

FORMAT_VERSION_VL = 3
VL_HEADER_OFFSET = 896      # format version 3: the provenance is cut to 384 bytes, the VL block follows
# transformers' Zaya1VLVisionConfig defaults (configuration_zaya1_vl.py)
VL_VISION_DEFAULTS = {"depth": 32, "hidden_size": 1280, "hidden_act": "silu", "intermediate_size": 3420,
                      "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
                      "temporal_patch_size": 1, "window_size": 112, "out_hidden_size": 2048,
                      "fullatt_block_indexes": [7, 15, 23, 31]}
VL_TEXT_DEFAULTS = {"vision_lora": True, "vision_lora_rank_attn": 8, "vision_lora_rank_mlp": 32}
VL_IDS = {"image_token_id": 262147, "vision_start_token_id": 255999, "vision_end_token_id": 256000}


def vl_zyphra_text_config(cfg, path):
    """The text keys of Zyphra's own flat ZAYA1-VL config.json (the hub's: the fork's keys at the top level,
    num_hidden_layers counting blocks) in transformers' schema, as the pull request's
    convert_zaya1_vl_weights_to_hf.py convert_config() computes them: every layer 'hybrid' (swa_layers dropped),
    rope_theta (or rotary_base, default 1e6) and rope_pct (default 0.5) for both layer types."""
    nkv = cfg.get("num_query_groups")
    if nkv is not None and cfg.get("num_key_value_heads", nkv) != nkv:
        fail("config has num_query_groups != num_key_value_heads", path, f"both {cfg['num_query_groups']}",
             repr(cfg["num_key_value_heads"]),
             "the fork asserts they are equal (CCA uses one, the attention the other)")
    text = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config", "architectures", "model_type",
                                                       "swa_layers", "swa_rotary_base", "rope_pct", "rotary_base",
                                                       "temporal_patch_size", *VL_IDS)}
    layers = need(cfg, "num_hidden_layers", int, path, lambda v: v > 0, "a positive integer (decoder blocks)")
    ffn = cfg.get("intermediate_size", cfg.get("ffn_hidden_size"))
    if ffn is not None:
        text["moe_intermediate_size"] = need({"ffn_hidden_size": ffn}, "ffn_hidden_size", int, path,
                                             lambda v: v > 0 and v % 2 == 0, "an even positive integer") // 2
    text["num_key_value_heads"] = cfg.get("num_key_value_heads", cfg.get("num_query_groups", 2))
    text["rms_norm_eps"] = cfg.get("rms_norm_eps", cfg.get("norm_epsilon", 1e-5))
    text["router_hidden_size"] = cfg.get("router_hidden_size", cfg.get("zaya_mlp_expansion", 256))
    text["num_experts_per_tok"] = cfg.get("num_experts_per_tok", cfg.get("moe_router_topk", 1))
    theta, prf = cfg.get("rope_theta", cfg.get("rotary_base", 1000000.0)), cfg.get("rope_pct", 0.5)
    text["rope_parameters"] = {"hybrid": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf},
                               "hybrid_sliding": {"rope_type": "default", "partial_rotary_factor": prf,
                                                  "rope_theta": cfg.get("swa_rotary_base", 10000.0)}}
    text["layer_types"] = ["hybrid"] * layers
    for k in ("intermediate_size", "ffn_hidden_size", "num_query_groups", "norm_epsilon", "zaya_mlp_expansion",
              "moe_router_topk"):
        text.pop(k, None)
    return text


def vl_config(cfg, path):
    """The native config of the language model plus c["vl"]: the vision tower, the LoRA ranks, the ids."""
    text = cfg.get("text_config")
    flat = not isinstance(text, dict)
    if flat:                             # Zyphra's own config (the hub's): flat, the fork's keys
        text = vl_zyphra_text_config(cfg, path)
    text = {**VL_TEXT_DEFAULTS, **text}
    c = native_config({k: v for k, v in text.items() if k not in VL_TEXT_DEFAULTS}, path)
    if text["vision_lora"] is not True:
        fail("config value 'text_config.vision_lora' is not supported by zaya.c", path, "true", repr(text["vision_lora"]),
             LIMITATION + " (ZAYA1-VL-8B has its vision LoRA)")
    vc = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
    if flat:                             # the converter's renames and defaults for Zyphra's vision_config
        vc = dict(vc)
        for old, new in (("in_chans", "in_channels"), ("spatial_patch_size", "patch_size")):
            if old in vc:
                vc.setdefault(new, vc.pop(old))
        if "temporal_patch_size" in cfg:
            vc.setdefault("temporal_patch_size", cfg["temporal_patch_size"])
        vc.setdefault("out_hidden_size", c["hidden_size"])
    vc = {**VL_VISION_DEFAULTS, **vc}
    pos = lambda v: v > 0  # noqa: E731
    v = {k: need(vc, k, int, f"{path}: vision_config", pos) for k in (
        "depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size", "spatial_merge_size",
        "temporal_patch_size", "window_size", "out_hidden_size")}
    if vc["hidden_act"] != "silu":
        fail("config value 'vision_config.hidden_act' is not supported by zaya.c", path, "'silu'", repr(vc["hidden_act"]))
    full = vc["fullatt_block_indexes"]
    if not isinstance(full, list) or len(full) > 16 or any(type(i) is not int or not 0 <= i < v["depth"] for i in full):
        fail("config value 'vision_config.fullatt_block_indexes' is not supported", path,
             f"at most 16 block indexes in 0..{v['depth'] - 1}", repr(full))
    hd = v["hidden_size"] // v["num_heads"]
    if v["hidden_size"] % v["num_heads"] or hd % 4 or hd > 1024 or v["depth"] > 64:
        fail("vision_config is not supported by zaya.c", path, "heads dividing hidden_size with a head size that is a "
             "multiple of 4 up to 1024, depth <= 64", f"hidden {v['hidden_size']}, heads {v['num_heads']}, depth {v['depth']}")
    if v["out_hidden_size"] != c["hidden_size"]:
        fail("vision_config.out_hidden_size differs from the decoder's hidden size", path, c["hidden_size"],
             v["out_hidden_size"])
    v["fullatt_block_indexes"] = list(full)
    ids = {k: need({**VL_IDS, **cfg}, k, int, path, lambda x: 0 <= x < c["vocab_size"]) for k in VL_IDS}
    ranks = {k: need(text, k, int, path, lambda x: 0 < x <= 4096) for k in ("vision_lora_rank_attn", "vision_lora_rank_mlp")}
    c["vl"] = {"vision": v, **ids, **ranks}
    return c


def vl_source_name(name):
    """The checkpoint name of a blob tensor in the ZAYA1-VL layout."""
    if name.startswith("model.visual.") or name.startswith("lm_head."):
        return name
    if name == "model.norm.weight":
        return "model.language_model.final_norm.weight"
    name = name.replace(".mlp.gate.router_mlp.norm.", ".mlp.gate.router_mlp.rmsnorm_eda.")
    return "model.language_model." + name[len("model."):]


VL_ZYPHRA_LORA = {   # transformers' name (pull request #46011) -> Zyphra's (the hub checkpoint's), per block
    "self_attn.qkv_proj.q_lora_a.weight": "attn.self_attn.qkv.lora_linear_q.0.weight",
    "self_attn.qkv_proj.q_lora_b.weight": "attn.self_attn.qkv.lora_linear_q.1.weight",
    "self_attn.qkv_proj.k_lora_a.weight": "attn.self_attn.qkv.lora_linear_k.0.weight",
    "self_attn.qkv_proj.k_lora_b.weight": "attn.self_attn.qkv.lora_linear_k.1.weight",
    "self_attn.qkv_proj.v_current_lora_a.weight": "attn.self_attn.qkv.lora_val_proj1.0.weight",
    "self_attn.qkv_proj.v_current_lora_b.weight": "attn.self_attn.qkv.lora_val_proj1.1.weight",
    "self_attn.qkv_proj.v_delayed_lora_a.weight": "attn.self_attn.qkv.lora_val_proj2.0.weight",
    "self_attn.qkv_proj.v_delayed_lora_b.weight": "attn.self_attn.qkv.lora_val_proj2.1.weight",
    "self_attn.o_lora_a.weight": "attn.self_attn.lora_linear_o.0.weight",
    "self_attn.o_lora_b.weight": "attn.self_attn.lora_linear_o.1.weight",
    "mlp.experts.lora_gate_up_proj_a": "lora_fc1.0", "mlp.experts.lora_gate_up_proj_b": "lora_fc1.1",
    "mlp.experts.lora_down_proj_a": "lora_fc2.0", "mlp.experts.lora_down_proj_b": "lora_fc2.1",
}
VL_ZYPHRA_BLOCK = re.compile(r"model\.layers\.(\d+)\.(attn|mlp)\.")


def vl_zyphra_sources(name, c):
    """Zyphra's checkpoint name(s) of a blob tensor (the hub's ZAYA1-VL layout, the input of the pull request's
    convert_zaya1_vl_weights_to_hf.py): the fork's half-layer names grouped in blocks, model.layers.{i}.attn.* =
    half-layer 2i, model.layers.{i}.mlp.* = half-layer 2i+1; the vision tower under vision_tower.*; experts and
    their LoRA pairs one tensor per expert (several names: stacked along a new first dimension)."""
    if name.startswith("model.visual."):
        return ["vision_tower." + name[len("model.visual."):]]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
    if m and m.group(2) in VL_ZYPHRA_LORA:
        i, leaf = int(m.group(1)), VL_ZYPHRA_LORA[m.group(2)]
        if leaf.startswith("attn."):
            return [f"model.layers.{i}.{leaf}"]
        return [f"model.layers.{i}.mlp.zaya_block.experts.local_experts.{e}.{leaf}.weight"
                for e in range(c["num_experts"])]
    out = []
    for s in legacy_sources(name, c):   # the fork's half-layer j -> block j // 2, attn (even) or mlp (odd)
        h = re.match(r"model\.layers\.(\d+)\.(.*)$", s)
        out.append(f"model.layers.{int(h.group(1)) // 2}.{'mlp' if int(h.group(1)) % 2 else 'attn'}.{h.group(2)}"
                   if h else s)
    return out


def vl_layout(names):
    """'vl-zyphra' (Zyphra's names, as published on the hub) or 'vl' (transformers' names)."""
    zyphra = sum(1 for n in names if n.startswith("vision_tower.") or VL_ZYPHRA_BLOCK.match(n))
    return "vl-zyphra" if zyphra * 2 > len(names) else "vl"


def vl_expected_tensors(c):
    """The VL tensors of the blob (after the text model's): per layer the LoRA pairs, then the vision tower."""
    vl, v = c["vl"], c["vl"]["vision"]
    H, nq, nkv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, ra, rm = c["num_experts"], c["moe_intermediate_size"], vl["vision_lora_rank_attn"], vl["vision_lora_rank_mlp"]
    t = []
    for i in range(c["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn.qkv_proj."
        for lora, out in (("q", nq * d), ("k", nkv * d), ("v_current", nkv * d // 2), ("v_delayed", nkv * d // 2)):
            t += [(a + f"{lora}_lora_a.weight", (ra, H), "matrix"), (a + f"{lora}_lora_b.weight", (out, ra), "matrix")]
        o = f"model.layers.{i}.self_attn."
        t += [(o + "o_lora_a.weight", (ra, nq * d), "matrix"), (o + "o_lora_b.weight", (H, ra), "matrix")]
        x = f"model.layers.{i}.mlp.experts."
        t += [(x + "lora_gate_up_proj_a", (E, rm, H), "matrix"), (x + "lora_gate_up_proj_b", (E, 2 * I, rm), "matrix"),
              (x + "lora_down_proj_a", (E, rm, I), "matrix"), (x + "lora_down_proj_b", (E, H, rm), "matrix")]
    D, VI, U = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"] ** 2
    pin = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2
    t.append(("model.visual.patch_embed.proj.weight", (D, pin), "matrix"))   # Conv3d [D, C, T, P, P] as [D, C*T*P*P]
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}."
        t += [(b + "norm1.weight", (D,), "f32"), (b + "attn.qkv.weight", (3 * D, D), "matrix"),
              (b + "attn.qkv.bias", (3 * D,), "f32"), (b + "attn.proj.weight", (D, D), "matrix"),
              (b + "attn.proj.bias", (D,), "f32"), (b + "norm2.weight", (D,), "f32")]
        for m, shape in (("gate_proj", (VI, D)), ("up_proj", (VI, D)), ("down_proj", (D, VI))):
            t += [(b + f"mlp.{m}.weight", shape, "matrix"), (b + f"mlp.{m}.bias", (shape[0],), "f32")]
    m = "model.visual.merger."
    t += [(m + "ln_q.weight", (D,), "f32"), (m + "mlp.0.weight", (U * D, U * D), "matrix"),
          (m + "mlp.0.bias", (U * D,), "f32"), (m + "mlp.2.weight", (v["out_hidden_size"], U * D), "matrix"),
          (m + "mlp.2.bias", (v["out_hidden_size"],), "f32")]
    return t


def pack_vl_block(c):
    """Format version 3's VL block (128 bytes at header offset 896)."""
    vl, v = c["vl"], c["vl"]["vision"]
    full = v["fullatt_block_indexes"]
    return struct.pack("<32I", vl["image_token_id"], vl["vision_start_token_id"], vl["vision_end_token_id"],
                       vl["vision_lora_rank_attn"], vl["vision_lora_rank_mlp"], v["depth"], v["hidden_size"],
                       v["num_heads"], v["intermediate_size"], v["in_channels"], v["patch_size"],
                       v["temporal_patch_size"], v["spatial_merge_size"], v["window_size"], v["out_hidden_size"],
                       len(full), *(full + [0] * (16 - len(full))))


def expected_tensors(c):
    """[(native name, shape, kind)] in forward order; kind 'matrix' = big linear weights that take
    the blob's weight dtype, 'f32' = everything kept in float32."""
    H, L, nq, nkv, d = (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                        c["num_key_value_heads"], c["head_dim"])
    E, I, R, V = c["num_experts"], c["moe_intermediate_size"], c["router_hidden_size"], c["vocab_size"]
    C = (nq + nkv) * d
    t = [("model.embed_tokens.weight", (V, H), "matrix"),
         ("model.input_hidden_states_scale", (H,), "f32"),
         ("model.input_hidden_states_bias", (H,), "f32")]
    scales = ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias")
    bias = c.get("attention_bias", False)     # (callers such as test/fuzz build c without the optional keys)
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn.qkv_proj."
        t += [(p + "input_layernorm.weight", (H,), "f32"),
              (a + "q_proj.weight", (nq * d, H), "matrix"),
              (a + "k_proj.weight", (nkv * d, H), "matrix"),
              (a + "v_proj_current.weight", (nkv * d // 2, H), "matrix"),
              (a + "v_proj_delayed.weight", (nkv * d // 2, H), "matrix")]
        if bias:                   # attention_bias: nn.Linear biases of q/k/v_current/v_delayed (and o_proj)
            t += [(a + "q_proj.bias", (nq * d,), "f32"), (a + "k_proj.bias", (nkv * d,), "f32"),
                  (a + "v_proj_current.bias", (nkv * d // 2,), "f32"),
                  (a + "v_proj_delayed.bias", (nkv * d // 2,), "f32")]
        t += [(a + "conv_qk_depthwise.weight", (C, 1, c["cca_time0"]), "f32"),
              (a + "conv_qk_depthwise.bias", (C,), "f32"),
              (a + "conv_qk_grouped.weight", (C, d, c["cca_time1"]), "f32"),
              (a + "conv_qk_grouped.bias", (C,), "f32"),
              (p + "self_attn.qk_norm.temp", (nkv,), "f32"),
              (p + "self_attn.o_proj.weight", (H, nq * d), "matrix")]
        if bias:
            t.append((p + "self_attn.o_proj.bias", (H,), "f32"))
        t += [(p + "post_attention_residual_scale." + s, (H,), "f32") for s in scales]
        g = p + "mlp.gate."
        t += [(p + "post_attention_layernorm.weight", (H,), "f32"),
              (g + "down_proj.weight", (R, H), "f32"),
              (g + "down_proj.bias", (R,), "f32")]
        if i > 0:
            t.append((g + "router_states_scale", (R,), "f32"))
        t += [(g + "router_mlp.norm.weight", (R,), "f32"),
              (g + "router_mlp.fc1.weight", (R, R), "f32"), (g + "router_mlp.fc1.bias", (R,), "f32"),
              (g + "router_mlp.fc2.weight", (R, R), "f32"), (g + "router_mlp.fc2.bias", (R,), "f32"),
              (g + "router_mlp.out_proj.weight", (E + 1, R), "f32"),
              (g + "balancing_biases", (E + 1,), "f32"),
              (p + "mlp.experts.gate_up_proj", (E, 2 * I, H), "matrix"),
              (p + "mlp.experts.down_proj", (E, H, I), "matrix")]
        t += [(p + "post_mlp_residual_scale." + s, (H,), "f32") for s in scales]
    t.append(("model.norm.weight", (H,), "f32"))
    if c.get("lm_head_bias"):      # the tied head's own bias (nn.Linear(H, V, bias=lm_head_bias))
        t.append(("lm_head.bias", (V,), "f32"))
    if c.get("vl"):                # ZAYA1-VL: the LoRA pairs and the vision tower (format version 3)
        t += vl_expected_tensors(c)
    return t


def legacy_sources(native_name, c):
    """The legacy tensor name(s) a native tensor comes from (docs/architecture.md 2.4 table).
    A list of several names means: stack them along a new first dimension (experts)."""
    L, E = c["num_hidden_layers"], c["num_experts"]
    fixed = {"model.embed_tokens.weight": "model.embed_tokens.weight",
             "model.input_hidden_states_scale": "model.layers.0.res_scale.hidden_states_scale",
             "model.input_hidden_states_bias": "model.layers.0.res_scale.hidden_states_bias",
             "model.norm.weight": "model.final_norm.weight", "lm_head.bias": "lm_head.bias"}
    if native_name in fixed:
        return [fixed[native_name]]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", native_name)
    i, rest = int(m.group(1)), m.group(2)
    att, mlp = f"model.layers.{2 * i}.", f"model.layers.{2 * i + 1}."
    if rest.startswith("post_mlp_residual_scale."):
        owner = f"model.layers.{2 * i + 2}.res_scale." if i + 1 < L else "model.res_scale."
        return [owner + rest.split(".", 1)[1]]
    if rest.startswith("post_attention_residual_scale."):
        return [mlp + "res_scale." + rest.split(".", 1)[1]]
    simple = {
        "input_layernorm.weight": att + "input_norm.weight",
        "self_attn.qkv_proj.q_proj.weight": att + "self_attn.qkv.linear_q.weight",
        "self_attn.qkv_proj.k_proj.weight": att + "self_attn.qkv.linear_k.weight",
        "self_attn.qkv_proj.v_proj_current.weight": att + "self_attn.qkv.val_proj1.weight",
        "self_attn.qkv_proj.v_proj_delayed.weight": att + "self_attn.qkv.val_proj2.weight",
        "self_attn.qkv_proj.q_proj.bias": att + "self_attn.qkv.linear_q.bias",
        "self_attn.qkv_proj.k_proj.bias": att + "self_attn.qkv.linear_k.bias",
        "self_attn.qkv_proj.v_proj_current.bias": att + "self_attn.qkv.val_proj1.bias",
        "self_attn.qkv_proj.v_proj_delayed.bias": att + "self_attn.qkv.val_proj2.bias",
        "self_attn.o_proj.bias": att + "self_attn.o_proj.bias",
        "self_attn.qkv_proj.conv_qk_depthwise.weight": att + "self_attn.qkv.conv_qk.0.weight",
        "self_attn.qkv_proj.conv_qk_depthwise.bias": att + "self_attn.qkv.conv_qk.0.bias",
        "self_attn.qkv_proj.conv_qk_grouped.weight": att + "self_attn.qkv.conv_qk.1.weight",
        "self_attn.qkv_proj.conv_qk_grouped.bias": att + "self_attn.qkv.conv_qk.1.bias",
        "self_attn.qk_norm.temp": att + "self_attn.qkv.temp",
        "self_attn.o_proj.weight": att + "self_attn.o_proj.weight",
        "post_attention_layernorm.weight": mlp + "input_norm.weight",
        "mlp.gate.down_proj.weight": mlp + "zaya_block.router.down_proj.weight",
        "mlp.gate.down_proj.bias": mlp + "zaya_block.router.down_proj.bias",
        "mlp.gate.router_states_scale": mlp + "zaya_block.router.router_states_scale",
        "mlp.gate.router_mlp.norm.weight": mlp + "zaya_block.router.rmsnorm_eda.weight",
        "mlp.gate.router_mlp.fc1.weight": mlp + "zaya_block.router.router_mlp.0.weight",
        "mlp.gate.router_mlp.fc1.bias": mlp + "zaya_block.router.router_mlp.0.bias",
        "mlp.gate.router_mlp.fc2.weight": mlp + "zaya_block.router.router_mlp.2.weight",
        "mlp.gate.router_mlp.fc2.bias": mlp + "zaya_block.router.router_mlp.2.bias",
        "mlp.gate.router_mlp.out_proj.weight": mlp + "zaya_block.router.router_mlp.4.weight",
        "mlp.gate.balancing_biases": mlp + "zaya_block.router.balancing_biases",
    }
    if rest in simple:
        return [simple[rest]]
    fc = {"mlp.experts.gate_up_proj": "linear_fc1", "mlp.experts.down_proj": "linear_fc2"}[rest]
    return [f"{mlp}zaya_block.experts.local_experts.{e}.{fc}.weight" for e in range(E)]


def as_planned(name, got, want):
    """A source shape as the blob plans it: ZAYA1-VL's Conv3d patch embedding [D, C, T, P, P] is read as the
    matrix [D, C*T*P*P] (the same bytes); every other shape as it is."""
    if name.endswith("patch_embed.proj.weight") and len(got) == 5 and len(want) == 2 and got[0] == want[0] and \
            got[1] * got[2] * got[3] * got[4] == want[1]:
        return tuple(want)
    return tuple(got)


def plan_tensors(c, layout, where):
    """Match every expected tensor with its source(s); refuse missing, extra or misshapen ones."""
    plan, used = [], set()
    for name, shape, kind in expected_tensors(c):
        srcs = layout_sources(name, c, layout)
        src_shape = shape if len(srcs) == 1 else shape[1:]
        for s in srcs:
            if s not in where:
                fail("missing tensor", f"{s}" + (f" (for {name})" if s != name else ""),
                     hint="the checkpoint is incomplete or its config does not match its weights")
            got = as_planned(name, where[s].tensors[s][1], tuple(src_shape))
            if got != tuple(src_shape):
                fail("tensor has the wrong shape", f"{where[s].path}: {s}", list(src_shape), list(got),
                     "the config.json does not match the weights")
            used.add(s)
        plan.append((name, shape, kind, srcs))
    extra = sorted(set(where) - used)
    tied = "lm_head.weight"
    if tied in extra:        # a stored tied head must equal the embedding; it is then dropped
        extra.remove(tied)
        check_tied_head(where, layout, c)
    if extra:
        fail(f"{len(extra)} unexpected tensor(s) in the checkpoint", ", ".join(extra[:5]) +
             (" ..." if len(extra) > 5 else ""), "only the tensors of docs/architecture.md 2.2",
             "extra tensors", "is this a ZAYA1 checkpoint of another variant?")
    return plan


def check_tied_head(where, layout, c):
    emb, head = "model.language_model.embed_tokens.weight" if layout == "vl" else "model.embed_tokens.weight", "lm_head.weight"
    se, sh = where[emb], where[head]
    if se.tensors[emb][:2] != sh.tensors[head][:2]:
        fail("lm_head.weight differs from the embedding it is tied to", sh.path,
             se.tensors[emb][:2], sh.tensors[head][:2])
    total = se.tensors[emb][3] - se.tensors[emb][2]
    for b in range(0, total, CHUNK):
        if se.read(emb, b, b + CHUNK) != sh.read(head, b, b + CHUNK):
            fail("lm_head.weight differs from the embedding it is tied to", sh.path,
                 hint="untied heads are not supported (tie_word_embeddings must be true)")


# ----------------------------------------------------------------------------------------------
# Converting tensor data
# ----------------------------------------------------------------------------------------------

def bf16_to_f32(b):
    """Exact widening: the fp32 bit pattern is the bf16 bits followed by 16 zero bits."""
    out = bytearray(2 * len(b))
    out[2::4] = b[0::2]
    out[3::4] = b[1::2]
    return bytes(out)


def f16_to_f32(b):
    n = len(b) // 2
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", b))


def f32_to_bf16_exact(b, where):
    """fp32 -> bf16 only when no bits are lost (a bf16 blob keeps the hub's exact weights)."""
    low = bytes(b[0::4]) + bytes(b[1::4])
    if low.count(0) != len(low):
        fail("tensor has float32 values that bf16 cannot hold exactly", where,
             hint="export with --dtype fp32 (or int8)")
    out = bytearray(len(b) // 2)
    out[0::2] = b[2::4]
    out[1::2] = b[3::4]
    return bytes(out)


def read_source_f32_or_bf16(st, name, want, sink):
    """Stream tensor `name` from safetensors file `st` to sink(bytes) as 'f32' or 'bf16' bytes."""
    dtype, _, begin, end = st.tensors[name]
    size = ST_DTYPE_SIZE[dtype]
    step = CHUNK - CHUNK % 4
    for b in range(0, end - begin, step):
        raw = st.read(name, b, b + step)
        if dtype == "BF16":
            sink(raw if want == "bf16" else bf16_to_f32(raw))
        elif dtype == "F32":
            sink(raw if want == "f32" else f32_to_bf16_exact(raw, f"{st.path}: {name}"))
        else:
            f = f16_to_f32(raw)
            sink(f if want == "f32" else f32_to_bf16_exact(f, f"{st.path}: {name}"))
    del size


# ----------------------------------------------------------------------------------------------
# Writing the blob (docs/blob-format.md)
# ----------------------------------------------------------------------------------------------

def align(n, a):
    return (n + a - 1) // a * a


class BlobWriter:
    def __init__(self, path):
        self.path = path
        try:
            if os.path.dirname(path):     # build/fx.bin on a fresh clone: make build/ like `mkdir -p`
                os.makedirs(os.path.dirname(path), exist_ok=True)
            self.f = open(path + ".tmp", "wb")
        except OSError as e:
            fail("cannot write the output file", path, hint=str(e))
        self.pos = 0
        self.crc = 0

    def write(self, b):
        self.f.write(b)
        self.pos += len(b)
        self.crc = zlib.crc32(b, self.crc)

    def pad_to(self, a):
        n = align(self.pos, a) - self.pos
        if n:
            self.f.write(b"\0" * n)
            self.pos += n


def pack_header(c, layout, wformat, group, n_tensors, data_off, tok_off, tok_size, file_size, provenance,
                version=FORMAT_VERSION):
    L = c["num_hidden_layers"]
    eos = c["eos_token_ids"][:MAX_EOS]
    rot = [int(c["head_dim"] * c["partial_rotary_factor"][t]) for t in LAYER_TYPES]
    h = bytearray(HEADER_SIZE)
    struct.pack_into("<8sIIQQIIIIQQQ", h, 0, MAGIC, version, 0, file_size, HEADER_SIZE, n_tensors,
                     DTYPE_CODES[wformat], group, 0 if layout in ("native", "vl", "vl-zyphra") else 1, data_off,
                     tok_off, tok_size)
    struct.pack_into("<14I2iI4i2I5fIIf", h, 128,
                     c["vocab_size"], c["hidden_size"], L, c["num_attention_heads"], c["num_key_value_heads"],
                     c["head_dim"], c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"],
                     c["router_hidden_size"], c["cca_time0"], c["cca_time1"], c["sliding_window"],
                     c["max_position_embeddings"], c["bos_token_id"], c["pad_token_id"], len(eos),
                     *(eos + [-1] * (MAX_EOS - len(eos))), *rot, c["rms_norm_eps"],
                     c["rope_theta"]["hybrid"], c["rope_theta"]["hybrid_sliding"],
                     c["partial_rotary_factor"]["hybrid"], c["partial_rotary_factor"]["hybrid_sliding"], 1,
                     (1 if c.get("attention_bias") else 0) | (2 if c.get("lm_head_bias") else 0),
                     c.get("router_norm_eps", c["rms_norm_eps"]) if c.get("router_norm_eps", c["rms_norm_eps"]) != c["rms_norm_eps"] else 0.0)
    h[256:256 + L] = bytes(LAYER_TYPES[t] for t in c["layer_types"])
    prov = json.dumps(provenance, sort_keys=True).encode()[:511 if version < FORMAT_VERSION_VL else 383]
    h[512:512 + len(prov)] = prov
    if version >= FORMAT_VERSION_VL:
        h[VL_HEADER_OFFSET:VL_HEADER_OFFSET + 128] = pack_vl_block(c)
    return h


def pack_entry(name, dtype, shape, offset, nbytes, crc, group):
    e = bytearray(DIR_ENTRY_SIZE)
    nb = name.encode()
    e[:len(nb)] = nb
    dims = list(shape) + [1] * (4 - len(shape))
    code = DTYPE_CODES[dtype] if dtype in DTYPE_CODES else BLOB_V2_DTYPE_CODES[dtype]
    struct.pack_into("<II4QQQII", e, NAME_SIZE, code, len(shape), *dims, offset, nbytes, crc, group)
    return e


def tensor_nbytes(shape, dtype, group):
    n = 1
    for d in shape:
        n *= d
    if dtype == "fp32":
        return n * 4
    if dtype == "bf16":
        return n * 2
    return align(n, ALIGN) + 4 * (n // group)      # int8 values, then one fp32 scale per group


# the ranges zaya.c's loader accepts (read_config in zaya.c): a blob the exporter writes always loads
HEADER_LIMITS = {"vocab_size": (1, 1 << 24), "hidden_size": (1, 1 << 16), "num_hidden_layers": (1, MAX_LAYERS),
                 "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024), "head_dim": (2, 4096),
                 "num_experts": (1, 4096), "moe_intermediate_size": (1, 1 << 18), "router_hidden_size": (1, 1 << 14),
                 "cca_time0": (1, 16), "cca_time1": (1, 16), "sliding_window": (0, 1 << 24),
                 "max_position_embeddings": (1, 1 << 30)}


def check_config_limits(c, path):
    for key, (lo, hi) in HEADER_LIMITS.items():
        if not lo <= c[key] <= hi:
            fail(f"config value '{key}' is out of range", path, f"{lo}..{hi}", c[key],
                 "zaya.c's blob and loader take values in this range (above it, a limitation of zaya.c; the "
                 "published ZAYA1 checkpoints are well inside)")
    f32_max = 3.4028234663852886e38
    for key in ("rms_norm_eps", "router_norm_eps"):
        if not 0 < c.get(key, c["rms_norm_eps"]) < 1:
            fail(f"config value '{key}' is out of range", path, "0 < eps < 1", c[key])
    for t in LAYER_TYPES:
        if not 0 < c["rope_theta"][t] < f32_max:
            fail(f"config value 'rope_parameters.{t}.rope_theta' is out of range", path, "a positive float32",
                 c["rope_theta"][t])
    for key in ("bos_token_id", "pad_token_id"):
        if not 0 <= c[key] < c["vocab_size"]:
            fail(f"config value '{key}' is outside the vocabulary", path, f"0..{c['vocab_size'] - 1}", c[key])
    L, H, d = c["num_hidden_layers"], c["hidden_size"], c["head_dim"]
    checks = [
        (L <= MAX_LAYERS, "num_hidden_layers", f"<= {MAX_LAYERS}", L),
        (c["num_attention_heads"] % c["num_key_value_heads"] == 0, "num_attention_heads",
         f"a multiple of num_key_value_heads ({c['num_key_value_heads']})", c["num_attention_heads"]),
        ((c["num_key_value_heads"] * d) % 2 == 0, "num_key_value_heads",
         f"num_key_value_heads x head_dim ({d}) even: v_proj_current and v_proj_delayed have half of those "
         "channels each (the official code cannot view an odd count as heads either)", c["num_key_value_heads"]),
        (len(c["eos_token_ids"]) <= MAX_EOS and all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < c["vocab_size"]
                                                    for e in c["eos_token_ids"]),
         "eos_token_id", f"at most {MAX_EOS} ids below vocab_size", c["eos_token_ids"]),
    ]
    for t in LAYER_TYPES:
        rot = c["head_dim"] * c["partial_rotary_factor"][t]
        checks.append((0 < int(rot) <= d and int(rot) % 2 == 0, f"rope_parameters.{t}.partial_rotary_factor",
                       f"int(head_dim x factor) an even number in 2..{d} (an odd or zero rotary width is a "
                       "limitation of zaya.c)", c["partial_rotary_factor"][t]))
    for ok, key, expected, found in checks:
        if not ok:
            fail(f"config value '{key}' is not supported", path, expected, found)
    del H


def build_quantizer():
    """The small C helper (quantize.c) that does the int8 arithmetic; compiled on first use."""
    here = os.path.dirname(os.path.abspath(__file__))
    src, exe = os.path.join(here, "quantize.c"), os.path.join(here, "build", "zaya-quantize")
    if os.path.isfile(exe) and (not os.path.isfile(src) or os.path.getmtime(exe) >= os.path.getmtime(src)):
        return exe
    if not os.path.isfile(src):
        fail("the int8 quantizer source is missing", src, hint="int8 export needs quantize.c from the zaya.c repo")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    cc = os.environ.get("CC", "cc")
    try:
        p = subprocess.run([cc, "-O2", "-std=c11", src, "-lm", "-o", exe], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    except OSError as e:
        fail("cannot run the C compiler to build the int8 quantizer", cc, hint=f"install gcc ({e})")
    if p.returncode != 0:
        fail("building the int8 quantizer failed", src, hint=p.stdout.decode(errors="replace")[-500:])
    return exe


def build_dequantizer(log, what="the GGUF", env="ZAYA_GGUF_PYTHON", rate="about 7 million values a second"):
    """The GGUF / MLX dequantizer (dequantize.c: ggml's to_float in C, bit for bit gguf.py's; MLX's affine
    dequantization, bit for bit mlx_weights.py's); compiled on first use. None (the Python twin does the work,
    slower) when the environment variable `env` is set (ZAYA_GGUF_PYTHON=1, ZAYA_MLX_PYTHON=1) or it cannot be
    built."""
    if os.environ.get(env):
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    src, exe = os.path.join(here, "dequantize.c"), os.path.join(here, "build", "zaya-dequantize")
    if os.path.isfile(exe) and (not os.path.isfile(src) or os.path.getmtime(exe) >= os.path.getmtime(src)):
        return exe
    why = None
    if not os.path.isfile(src):
        why = f"{src} is missing"
    else:
        os.makedirs(os.path.dirname(exe), exist_ok=True)
        cc = os.environ.get("CC", "cc")
        try:
            p = subprocess.run([cc, "-O2", "-std=c11", "-ffp-contract=off", src, "-o", exe], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            why = None if p.returncode == 0 else p.stdout.decode(errors="replace")[-300:]
        except OSError as e:
            why = f"cannot run {cc} ({e})"
    if why:
        log(f"note: {what} is dequantized in Python ({rate}): the C helper could not be built: {why}")
        return None
    return exe


def quantize_tensor(quantizer, w, entry, srcs, where, log):
    """Streams one matrix through quantize.c, which writes its int8 values and scales in place."""
    name, _, shape, offset, nbytes, _, group = entry
    numel = 1
    for d in shape:
        numel *= d
    in_dtype = "bf16" if all(where[s].tensors[s][0] == "BF16" for s in srcs) else "f32"
    w.f.flush()
    p = subprocess.Popen([quantizer, in_dtype, str(group), str(shape[-1]), w.path + ".tmp", str(offset), str(numel)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for s in srcs:
            read_source_f32_or_bf16(where[s], s, "bf16" if in_dtype == "bf16" else "f32", p.stdin.write)
        p.stdin.close()
    except BrokenPipeError:
        pass
    out, err = p.stdout.read(), p.stderr.read()
    if p.wait() != 0:
        fail("int8 quantization failed", name, hint=err.decode(errors="replace").strip())
    crc, max_err, sse, ssw = out.split()
    rel = (float(sse) / float(ssw)) ** 0.5 if float(ssw) > 0 else 0.0
    log(f"  int8 {name}: rel L2 error {rel:.3e}, max abs error {float(max_err):.3e}")
    w.f.seek(offset + nbytes)
    w.pos = offset + nbytes
    return int(crc)


def export(ckpt, out, wformat="fp32", group=None, chat_format=None, log=print, keep_quantized=False, tokenizer=None,
           port_weights=None, mlx_compute="scales"):
    t0 = time.time()
    tok_dir = ckpt
    if is_gguf(ckpt):            # a port's GGUF: its tensors under legacy names, dequantized as ggml does
        cfg, cfg_path, where, layout, c, tok_dir = open_port_gguf(ckpt, tokenizer, log)
    else:
        if tokenizer is not None:
            fail("--tokenizer is for a GGUF input", tokenizer, hint="a checkpoint folder has its own tokenizer files")
        cfg, cfg_path = read_folder_config(ckpt, "*.safetensors (or a .gguf file)")
        where = open_checkpoint(ckpt)
        if mlx_weights.is_mlx(cfg, where):      # an MLX-saved folder: packed weights read as mx.dequantize gives them
            mlx_weights.use_helper(build_dequantizer(log, "the MLX folder", "ZAYA_MLX_PYTHON",
                                                     "about 2 million values a second"))
            try:
                compute = "F32" if mlx_compute == "float32" else None
                cfg, where = mlx_weights.open_mlx(cfg, cfg_path, where, log, compute)
            except mlx_weights.MLXError as e:
                raise ExportError(str(e))
        layout = detect_layout(cfg, where)
        if mlx_weights.is_vl(cfg):    # ZAYA1-VL (format version 3): transformers' names or Zyphra's (the hub's)
            layout = vl_layout(where)
        c = (vl_config(cfg, cfg_path) if layout in ("vl", "vl-zyphra")
             else native_config(cfg, cfg_path) if layout == "native" else legacy_to_native_config(cfg, cfg_path))
    check_config_limits(c, cfg_path)
    where = quantized_experts(cfg, cfg_path, where, layout, c, keep_quantized, log)
    plan = plan_tensors(c, layout, where)
    replaced = {}               # --weights: blob name -> the dtype its port tensor is stored in
    if port_weights:
        plan, where, replaced = replace_with_port_weights(plan, where, port_weights, wformat, log)
    native = {}                 # --keep-quantized-experts: blob name -> (dtype, field 188, nbytes, chunks)
    if keep_quantized:
        for name, shape, kind, srcs in plan:
            if all(isinstance(where[s], DequantizedExperts) for s in srcs):
                native[name] = native_expert_chunks(where[srcs[0]], srcs)
        if not native:
            log("note: --keep-quantized-experts: the checkpoint has no quantized experts; the blob is format version 1")
    quantizer = None
    groups = {}                 # int8: the group size of each matrix (along its rows)
    kept_bf16 = {}              # int8: matrices whose rows allow no group of MIN_AUTO_GROUP (-> row length), stored bf16
    if wformat == "int8":
        if group is not None and not 1 <= group <= 4096:
            fail("int8 group size is out of range", "--group-size", "1..4096", group)
        for name, shape, kind, _ in plan:
            if kind != "matrix" or name in native or name in replaced:
                continue
            g = group or DEFAULT_GROUP   # or the largest power of two below it that divides the row
            while shape[-1] % g and group is None:
                g //= 2
            if group is None and g < MIN_AUTO_GROUP:   # ZAYA1-VL's 3420-wide vision MLP rows: groups of 4
                kept_bf16[name] = shape[-1]
                continue
            if shape[-1] % g:
                fail("int8 group size does not divide a matrix row", f"--group-size {group}",
                     "a divisor of every row length", f"{name} has rows of {shape[-1]}",
                     "leave --group-size out to choose one per matrix automatically")
            groups[name] = g
        small = sorted({(g, n) for n, g in groups.items() if g != (group or DEFAULT_GROUP)})
        if small:
            log(f"int8 group size {group or DEFAULT_GROUP}; smaller where a row length needs it: {small[0][1]} ({small[0][0]})"
                + (f" and {len(small) - 1} more" if len(small) > 1 else ""))
        if kept_bf16:
            first = min(kept_bf16)
            log(f"int8: {len(kept_bf16)} matrices kept in bf16 (e.g. {first}, rows of {kept_bf16[first]}): no group "
                f"of {MIN_AUTO_GROUP} or more divides their rows (smaller groups take as many bytes as bf16, off the "
                "fast int8 kernels)")
        quantizer = build_quantizer()
    try:
        gguf_kv = c.pop("gguf_kv", None)
        tok = (export_tokenizer.build_tokenizer_section(tok_dir, chat_format) if gguf_kv is None else
               export_tokenizer.build_tokenizer_section_from_gguf(gguf_kv, ckpt, chat_format))
    except ValueError as e:
        raise ExportError(str(e))
    if "gguf_n_tokens" in c:
        check_gguf_tokenizer(c, tok, ckpt, tok_dir)
    if "zaya_layers" in cfg and layout == "legacy":
        layout_note = "ZAYA1-base schema, legacy tensor names"
    else:
        layout_note = f"{layout} layout"
    log(f"checkpoint: {ckpt} ({layout_note}, {len(where)} tensors, "
        f"{c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_experts']} experts)")

    # Layout of the file: header, directory, data (page-aligned start, 64-byte aligned tensors), tokenizer.
    dir_size = DIR_ENTRY_SIZE * len(plan)
    data_off = align(HEADER_SIZE + dir_size, PAGE)
    entries, pos = [], data_off
    for name, shape, kind, srcs in plan:
        if name in native:      # FP8 / MXFP4 experts as in the checkpoint (format version 2)
            code, field, nbytes, _ = native[name]
            dtype = next(k for k, v in BLOB_V2_DTYPE_CODES.items() if v == code)
            entries.append([name, dtype, shape, pos, nbytes, 0, field])
            pos = align(pos + nbytes, ALIGN)
            continue
        dtype = replaced.get(name) or ("bf16" if name in kept_bf16 else wformat if kind == "matrix" else "fp32")
        nbytes = tensor_nbytes(shape, dtype, groups.get(name, 0))
        entries.append([name, dtype, shape, pos, nbytes, 0, groups.get(name, 0)])
        pos = align(pos + nbytes, ALIGN)
    tok_off = pos
    file_size = tok_off + len(tok)

    w = BlobWriter(out)
    w.write(bytes(data_off))                         # header and directory are written last
    filler = gguf_filler(where, w)
    t_data = time.time()
    done, total = 0, sum(e[4] for e in entries)
    last = time.time()
    for entry, (name, shape, kind, srcs) in zip(entries, plan):
        w.pad_to(ALIGN)
        assert w.pos == entry[3]
        if name in native:
            w.crc = 0
            for chunk in native[name][3]:
                w.write(chunk)
            entry[5] = w.crc
            assert w.pos == entry[3] + entry[4]
        elif entry[1] == "int8":
            entry[5] = quantize_tensor(quantizer, w, entry, srcs, where, log)
        elif filler and all(isinstance(where[s], GGUFPortTensors) for s in srcs):
            w.f.flush()         # a GGUF: dequantize.c writes the values into the file and computes their CRC-32
            try:
                entry[5], n = filler.fill(name, "bf16" if entry[1] == "bf16" else "f32", entry[3],
                                          [p for s in srcs for p in where[s].pieces(s)])
            except gguf.GGUFError as e:
                raise ExportError(str(e))
            if n != entry[4]:
                fail("the compiled GGUF dequantizer wrote a wrong number of bytes", f"{w.path}.tmp: {name}",
                     entry[4], n, "set ZAYA_GGUF_PYTHON=1 to dequantize in Python instead")
            w.f.seek(entry[3] + n)
            w.pos = entry[3] + n
        else:
            w.crc = 0
            want = "bf16" if entry[1] == "bf16" else "f32"
            for s in srcs:
                read_source_f32_or_bf16(where[s], s, want, w.write)
            entry[5] = w.crc
        done += entry[4]
        if time.time() - last > 2 or done == total:
            last = time.time()
            log(f"  {100 * done / total:5.1f}%  {done / 1e9:7.2f} / {total / 1e9:.2f} GB  {name}")
    w.pad_to(ALIGN)
    assert w.pos == tok_off
    t_data = time.time() - t_data
    w.write(tok)
    provenance = {"exporter": EXPORTER_VERSION, "source": os.path.basename(os.path.abspath(ckpt)),
                  "layout": layout, "dtype": wformat}
    if replaced:
        provenance["weights"] = ",".join(os.path.basename(p) for p in port_weights)[:100]
        # the matrices left at the checkpoint's values, short: "o_proj:1-5,experts.gate_up_proj:0-5" (--quant says it)
        kept = ",".join(f"{re.sub(r'^(self_attn|mlp)[.](qkv_proj[.]|gate[.](router_mlp[.])?)?', '', k)[:-7] if k.endswith('.weight') else re.sub(r'^mlp[.]', '', k)}"
                        + (":" + layer_list(v).split(" ", 1)[1] if layer_list(v) != "global" else "")
                        for k, v in kept_matrices(plan, replaced).items())
        room = 500 - len(json.dumps(dict(provenance, kept=""), sort_keys=True).encode())
        provenance["kept"] = kept if len(kept) <= room else kept[:max(room - 3, 0)] + "..."

    if is_gguf(ckpt):
        provenance["layout"] = "gguf (llama.cpp ZAYA port, legacy half-layers)"
    if native:
        provenance["experts"] = sorted({e[1] for e in entries if e[0] in native})[0]
    header = pack_header(c, layout, wformat, (group or DEFAULT_GROUP) if wformat == "int8" else 0, len(entries), data_off,
                         tok_off, len(tok), file_size, provenance,
                         FORMAT_VERSION_VL if c.get("vl") else FORMAT_VERSION_QUANTIZED if native else FORMAT_VERSION)
    directory = b"".join(pack_entry(*e) for e in entries)
    if is_gguf(ckpt):           # each tensor's ggml type in its name field's tail (docs/blob-format.md)
        directory = bytearray(directory)
        for i, (name, shape, kind, srcs) in enumerate(plan):
            from_gguf = [s for s in srcs if isinstance(where[s], GGUFPortTensors)]
            types = {where[s].ggml_type(s) for s in from_gguf}
            if len(types) == 1 and len(from_gguf) == len(srcs) and len(name.encode()) < GGML_TYPE_AT:
                struct.pack_into("<I", directory, DIR_ENTRY_SIZE * i + GGML_TYPE_AT, 1 + types.pop())
        directory = bytes(directory)
    struct.pack_into("<I", header, 12, zlib.crc32(directory, zlib.crc32(bytes(header))))
    if filler:
        try:
            filler.close()
        except gguf.GGUFError as e:
            raise ExportError(str(e))
    w.f.seek(0)
    w.f.write(header)
    w.f.write(directory)
    w.f.close()
    os.replace(out + ".tmp", out)
    log(f"wrote {out}: {file_size / 1e6:.1f} MB, {len(entries)} tensors ({wformat}"
        + (f", experts {provenance['experts']}, format version 2" if native else "") + "), "
        f"tokenizer {len(tok) / 1e6:.1f} MB, in {time.time() - t0:.1f} s (tensor data {t_data:.1f} s"
        + (", dequantize.c into the blob" if filler else "") + ")")


# ----------------------------------------------------------------------------------------------
# Quantized expert checkpoints (docs/quantized-experts.md): compressed-tensors FP8 E4M3 with one
# scale per output row ("float-quantized", strategy channel) and MXFP4 ("mxfp4-pack-quantized": two
# E2M1 values per byte, one E8M0 exponent byte per 32 inputs). Only the expert matrices may be
# quantized; everything else is read as usual.
# ----------------------------------------------------------------------------------------------

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of nibble bits 0-2; bit 3 is the sign
MX_GROUP = 32                                             # MXFP4: inputs per E8M0 scale
FP8_SCALE_DTYPES = ("BF16", "F16", "F32")
MX_SCALE_DTYPES = ("U8", "F8_E8M0")                       # the same byte: a biased power-of-two exponent
QUANT_SCHEME_TEXT = {
    "fp8": "FP8 E4M3 values ('{p}.weight', F8_E4M3) with one scale per output row ('{p}.weight_scale', "
           "BF16/F16/F32, shape [rows, 1])",
    "mxfp4": "MXFP4 values ('{p}.weight_packed', U8, two E2M1 per byte, low nibble first) with one E8M0 "
             "scale per 32 inputs ('{p}.weight_scale', U8, shape [rows, cols/32])",
}


def fp8_e4m3_value(code):
    """The value of an FP8 E4M3FN byte (bias 7, subnormals, no infinities; 0x7f and 0xff are NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    return sign * (m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def bf16_bits_of(x, where):
    """bf16 bits of a float (an exact product here): rounded to float32, then to bf16 with
    round-to-nearest-even, as torch rounds a float32 result to bfloat16."""
    try:
        b = struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        b = 0x7F800000
    h = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    if h & 0x7F80 == 0x7F80:
        fail("a dequantized expert weight is not a finite bf16 number", where, "|w| <= 3.39e38", x,
             "the checkpoint's scales are corrupt")
    return h


_fp8_tables = {}


def fp8_row_table(scale, sdtype, where):
    """The 256 codes' dequantized values fp8(code) x scale as stored bytes of the scale's dtype (None
    for the two NaN codes): compressed-tensors' dequantize computes x_q.to(scale.dtype) * scale, so the
    exact product is rounded once to the scale's dtype (docs/quantized-experts.md, 'dequantization')."""
    t = _fp8_tables.get((scale, sdtype))
    if t is None:
        if len(_fp8_tables) > 65536:
            _fp8_tables.clear()
        t = [None] * 256
        for code in range(256):
            if code & 0x7F == 0x7F:
                continue
            x = fp8_e4m3_value(code) * scale        # exact: at most 4 + 24 significant bits
            try:
                t[code] = (struct.pack("<H", bf16_bits_of(x, where)) if sdtype == "BF16" else
                           struct.pack("<e" if sdtype == "F16" else "<f", x))
            except OverflowError:
                fail(f"a dequantized expert weight overflows {sdtype}", where, f"a finite {sdtype} number", x,
                     "the checkpoint's scales are corrupt")
        _fp8_tables[(scale, sdtype)] = t
    return t


_mx_tables = {}


def mxfp4_byte_table(e8m0, where):
    """bf16 bytes of the two E2M1 values of each byte (low nibble first) times 2^(e8m0 - 127); exact."""
    t = _mx_tables.get(e8m0)
    if t is None:
        if e8m0 == 255:
            fail("MXFP4 scale byte 0xFF is NaN", where, "an E8M0 exponent byte 0..254", 255,
                 "the checkpoint is corrupt")
        s = 2.0 ** (e8m0 - 127)
        v = [bf16_bits_of((-1.0 if n & 8 else 1.0) * E2M1_VALUES[n & 7] * s, where) for n in range(16)]
        t = [struct.pack("<HH", v[b & 15], v[b >> 4]) for b in range(256)]
        _mx_tables[e8m0] = t
    return t


def read_scale_values(raw, dtype):
    """A checkpoint's FP8 row scales (F32, F16 or BF16) as Python floats (exact)."""
    return mlx_weights.decode(raw, dtype)


class DequantizedExperts:
    """Quantized expert matrices shown as the bf16 tensors plan_tensors expects, in place of a
    SafetensorsFile: each tensor is its pieces' rows one after the other, dequantized when read."""

    def __init__(self, scheme):
        self.scheme, self.path = scheme, f"({scheme} experts, dequantized)"
        self.tensors, self.pieces = {}, {}

    def add(self, name, shape, pieces, dtype):
        """pieces: [(module, values SafetensorsFile, scales SafetensorsFile, rows)] in row order;
        dtype: what the official dequantization yields (MXFP4: BF16; FP8: the scales' dtype)."""
        numel = 1
        for d in shape:
            numel *= d
        self.tensors[name] = (dtype, tuple(shape), 0, ST_DTYPE_SIZE[dtype] * numel)
        self.pieces[name] = pieces

    def read(self, name, begin, end):
        dtype, shape, _, stop = self.tensors[name]
        rb = ST_DTYPE_SIZE[dtype] * shape[-1]          # bytes per row
        cols = shape[-1]
        end = min(end, stop)
        r0, r1 = begin // rb, -(-end // rb)
        out, first = [], 0
        for module, sv, ss, rows in self.pieces[name]:
            a, b = max(r0, first), min(r1, first + rows)
            if a < b:
                out.append(self.dequantize_rows(module, sv, ss, a - first, b - first, cols))
            first += rows
        data = b"".join(out)
        return data[begin - rb * r0:end - rb * r0]

    def dequantize_rows(self, module, sv, ss, a, b, cols):
        """Dequantized bytes of rows a..b-1 of one quantized module (a stacked module's rows run across
        experts): bf16 for MXFP4, the scales' dtype for FP8."""
        where = f"{sv.path}: {module}"
        rows = []
        if self.scheme == "fp8":
            vname, sname = module + ".weight", module + ".weight_scale"
            vals = sv.read(vname, a * cols, b * cols)
            sdt = ss.tensors[sname][0]
            size = ST_DTYPE_SIZE[sdt]
            scales = read_scale_values(ss.read(sname, a * size, b * size), sdt)
            for r, s in enumerate(scales):
                if s != s or s in (float("inf"), float("-inf")):
                    fail("an FP8 row scale is not finite", f"{ss.path}: {sname} row {a + r}", "a finite number", s)
                row = vals[r * cols:(r + 1) * cols]
                if b"\x7f" in row or b"\xff" in row:
                    fail("an FP8 E4M3 weight is NaN (byte 0x7f or 0xff)", f"{where}.weight row {a + r}",
                         hint="the checkpoint is corrupt")
                rows.append(b"".join(map(fp8_row_table(s, sdt, where).__getitem__, row)))
        else:
            vname, sname = module + ".weight_packed", module + ".weight_scale"
            half, groups = cols // 2, cols // MX_GROUP
            vals = sv.read(vname, a * half, b * half)
            exps = ss.read(sname, a * groups, b * groups)
            step = MX_GROUP // 2
            for r in range(b - a):
                row, ex = vals[r * half:(r + 1) * half], exps[r * groups:(r + 1) * groups]
                rows.append(b"".join(x for g, e in enumerate(ex) for x in
                                     map(mxfp4_byte_table(e, where).__getitem__, row[g * step:(g + 1) * step])))
        return b"".join(rows)


def quantization_scheme(qc, path):
    """'fp8' or 'mxfp4' from a compressed-tensors quantization_config; anything else is refused."""
    where = f"{path}: quantization_config"
    if not isinstance(qc, dict):
        fail("quantization_config is not a JSON object", where, "an object", type(qc).__name__)
    if qc.get("quant_method") != "compressed-tensors":
        fail("unsupported quantization method", f"{where}.quant_method", "'compressed-tensors'",
             repr(qc.get("quant_method")), "only Zyphra's FP8-Experts and MXFP4-Experts checkpoints are supported")
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        fail("unsupported quantization status", f"{where}.quantization_status", "'compressed'", repr(status))
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if qc.get(key) not in (None, {}):
            fail(f"unsupported quantization_config.{key}", f"{where}.{key}", "null", repr(qc.get(key))[:200])
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        fail("quantization_config has no config_groups", f"{where}.config_groups", "a non-empty object", repr(groups))
    schemes = set()
    for gname, g in groups.items():
        gw = f"{where}.config_groups.{gname}"
        if not isinstance(g, dict) or not isinstance(g.get("weights"), dict):
            fail("quantization group has no weights block", gw, "an object with 'weights'", repr(g)[:200])
        w, fmt = g["weights"], g.get("format") or qc.get("format")
        found = (f"format {fmt!r}, weights num_bits {w.get('num_bits')!r} type {w.get('type')!r} strategy "
                 f"{w.get('strategy')!r} group_size {w.get('group_size')!r} symmetric {w.get('symmetric', True)!r} "
                 f"dynamic {w.get('dynamic', False)!r}")
        common = (w.get("type") == "float" and w.get("symmetric", True) is True and w.get("dynamic", False) is False
                  and w.get("actorder") is None and w.get("block_structure") is None)
        acts = g.get("input_activations")
        if (fmt in ("float-quantized", "naive-quantized") and common and w.get("num_bits") == 8
                and w.get("strategy") == "channel" and w.get("group_size") is None):
            if acts is not None and not (isinstance(acts, dict) and acts.get("dynamic") is True):
                fail("static FP8 input activations are not supported", f"{gw}.input_activations",
                     "null (W8A16) or dynamic", repr(acts)[:200],
                     "zaya.c keeps activations in float32; a static input_scale would change them")
            schemes.add("fp8")
        elif (fmt == "mxfp4-pack-quantized" and common and w.get("num_bits") == 4 and w.get("strategy") == "group"
              and w.get("group_size") == MX_GROUP
              and w.get("scale_dtype") in (None, "uint8", "torch.uint8", "float8_e8m0fnu", "torch.float8_e8m0fnu")):
            if acts is not None:
                fail("MXFP4 input activations are not supported", f"{gw}.input_activations",
                     "null (weight-only MXFP4)", repr(acts)[:200])
            schemes.add("mxfp4")
        else:
            fail("unsupported quantization scheme", gw,
                 "FP8 E4M3 channel-wise ('float-quantized', num_bits 8, type float, strategy channel) or MXFP4 "
                 "('mxfp4-pack-quantized', num_bits 4, type float, strategy group, group_size 32), symmetric, static",
                 found, "see docs/quantized-experts.md")
    if len(schemes) != 1:
        fail("quantization_config mixes schemes", f"{where}.config_groups", "one scheme", sorted(schemes))
    return schemes.pop()


def expert_module_layouts(c, layout, i, proj):
    """The ways a quantized expert projection may be stored, as lists of (module, rows) in row order
    of the native [E, rows, cols] tensor; a stacked module has a leading expert dimension."""
    E, I, H = c["num_experts"], c["moe_intermediate_size"], c["hidden_size"]
    rows = 2 * I if proj == "gate_up_proj" else H
    if layout == "legacy":
        fc = "linear_fc1" if proj == "gate_up_proj" else "linear_fc2"
        m = f"model.layers.{2 * i + 1}.zaya_block.experts.local_experts"
        return {"per-expert (legacy)": [(f"{m}.{e}.{fc}", rows) for e in range(E)]}
    b = f"model.layers.{i}.mlp.experts"
    out = {"stacked": [(f"{b}.{proj}", E * rows)], "per-expert": [(f"{b}.{e}.{proj}", rows) for e in range(E)]}
    if proj == "gate_up_proj":
        out["per-expert gate_proj + up_proj"] = [(f"{b}.{e}.{p}", I) for e in range(E) for p in ("gate_proj", "up_proj")]
    return out


def check_quantized_module(where, scheme, module, rows, cols, stacked_experts):
    """Dtypes and shapes of one quantized module's values and scales; returns the tensor names used."""
    lead = [stacked_experts] if stacked_experts else []
    r = rows // stacked_experts if stacked_experts else rows
    if scheme == "fp8":
        want = {module + ".weight": (("F8_E4M3",), lead + [r, cols]),
                module + ".weight_scale": (FP8_SCALE_DTYPES, lead + [r, 1])}
    else:
        if cols % MX_GROUP:
            fail("an MXFP4 row length is not a multiple of 32", module, "a multiple of 32", cols,
                 "MXFP4 scales cover 32 inputs; this config cannot be stored as MXFP4")
        want = {module + ".weight_packed": (("U8",), lead + [r, cols // 2]),
                module + ".weight_scale": (MX_SCALE_DTYPES, lead + [r, cols // MX_GROUP])}
    for name, (dtypes, shape) in want.items():
        if name not in where:
            fail("missing tensor of a quantized expert", name, QUANT_SCHEME_TEXT[scheme].format(p=module),
                 "no such tensor", "the checkpoint is incomplete or not in the format its quantization_config names")
        dt, got = where[name].tensors[name][:2]
        if dt not in dtypes:
            fail("quantized expert tensor has the wrong dtype", f"{where[name].path}: {name}", " or ".join(dtypes), dt,
                 QUANT_SCHEME_TEXT[scheme].format(p=module))
        if list(got) != shape:
            fail("quantized expert tensor has the wrong shape", f"{where[name].path}: {name}", shape, list(got),
                 "the config.json does not match the weights")
    for name in where:
        if name.startswith(module + ".") and name not in want:
            fail("unsupported tensor of a quantized expert", f"{where[name].path}: {name}",
                 " and ".join(want), name.rsplit(".", 1)[-1],
                 "zero points, global scales, input scales and g_idx are not part of the supported formats")
    return list(want)


def quantized_experts(cfg, cfg_path, where, layout, c, keep_quantized, log):
    """Recognises an FP8-Experts / MXFP4-Experts checkpoint from quantization_config and its tensors
    and returns `where` with each quantized expert matrix replaced by its bf16 dequantization;
    a checkpoint without quantization_config must have no quantized tensors."""
    qc = cfg.get("quantization_config")
    if qc is None:
        for n in sorted(where):
            dt = where[n].tensors[n][0]
            if dt in QUANT_ST_DTYPE_SIZE:
                fail("unsupported tensor dtype", f"{where[n].path}: tensor {n}", "one of " + ", ".join(ST_DTYPE_SIZE),
                     dt, "quantized tensors need the checkpoint's quantization_config; config.json has none")
        return where
    scheme = quantization_scheme(qc, cfg_path)
    ignore = qc.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        fail("quantization_config.ignore is not a list of strings", f"{cfg_path}: quantization_config.ignore",
             "a list of module names or 're:' patterns", repr(ignore)[:200])
    dq, used, kinds, sdtypes = DequantizedExperts(scheme), set(), set(), {}
    new = dict(where)
    E = c["num_experts"]
    for i in range(c["num_hidden_layers"]):
        for proj in ("gate_up_proj", "down_proj"):
            cols = c["hidden_size"] if proj == "gate_up_proj" else c["moe_intermediate_size"]
            options = expert_module_layouts(c, layout, i, proj)
            suffix = ".weight" if scheme == "fp8" else ".weight_packed"
            kind = next((k for k, mods in options.items() if mods[0][0] + suffix in where), None)
            if kind is None:
                tried = ", ".join(mods[0][0] + suffix for mods in options.values())
                fail("quantized expert weights not found", f"layer {i} {proj}", f"one of {tried}",
                     "none of them", f"a {scheme} checkpoint stores every expert matrix as "
                     + QUANT_SCHEME_TEXT[scheme].format(p="<module>"))
            kinds.add(kind)
            pieces = []
            for module, rows in options[kind]:
                names = check_quantized_module(where, scheme, module, rows, cols, E if kind == "stacked" else 0)
                used.update(names)
                pieces.append((module, where[names[0]], where[names[1]], rows))
                sdtypes.setdefault(where[names[1]].tensors[names[1]][0], names[1])
            if scheme == "fp8" and len(sdtypes) > 1:
                fail("FP8 row scales of different dtypes", " and ".join(sorted(sdtypes.values())), "one dtype",
                     sorted(sdtypes), "the official dequantization's result has the scale's dtype")
            dtype = "BF16" if scheme == "mxfp4" else next(iter(sdtypes))
            if layout == "native":
                dq.add(f"model.layers.{i}.mlp.experts.{proj}", (E, pieces[0][3] * len(pieces) // E, cols), pieces, dtype)
            else:
                for e, piece in enumerate(pieces):
                    dq.add(piece[0] + ".weight", (piece[3], cols), [piece], dtype)
    for n in sorted(where):
        if n not in used and where[n].tensors[n][0] in QUANT_ST_DTYPE_SIZE:
            fail("a quantized tensor outside the experts", f"{where[n].path}: tensor {n}", "BF16 (only expert "
                 "matrices may be quantized in the supported checkpoints)", where[n].tensors[n][0])
    if len({k.split()[0] for k in kinds}) > 1:
        fail("quantized experts are stored in mixed layouts", ckpt_name(cfg_path), "one layout", sorted(kinds))
    for n in used:
        del new[n]
    new.update({n: dq for n in dq.tensors})
    out_dtype = "bf16" if scheme == "mxfp4" else {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}[next(iter(sdtypes))]
    log(f"quantized experts: {scheme} ({' and '.join(sorted(kinds))} modules, {len(used)} tensors), "
        + (f"kept as {scheme} in the blob (format version 2; the engine dequantizes them to {out_dtype} values)"
           if keep_quantized else f"dequantized to {out_dtype} as the official code does (docs/quantized-experts.md)"))
    return new


def ckpt_name(cfg_path):
    return os.path.dirname(cfg_path) or "."


# Blob format version 2 (docs/blob-format.md): the experts stored as in the checkpoint
# (--keep-quantized-experts).
BLOB_V2_DTYPE_CODES = {"fp8_e4m3_rows": 3, "mxfp4": 4}


def pack_blob_fp8_rows(values, scales):
    """Dtype 3: the E4M3FN bytes row-major, zero-padded to 64 bytes, then one fp32 scale per
    row (a bf16 / fp16 checkpoint scale widens exactly); the directory entry records the checkpoint
    scale's dtype, to which each product is rounded."""
    return bytes(values) + b"\0" * (align(len(values), ALIGN) - len(values)) + struct.pack(f"<{len(scales)}f", *scales)


BLOB_V2_SCALE_DTYPE = {"F32": 0, "BF16": 1, "F16": 5}     # entry field 188 of dtype 3: the products' rounding


def native_expert_chunks(dq, names, chunk_rows=4096):
    """The version-2 payload of one blob expert tensor made of the DequantizedExperts tensors `names`
    (one native tensor, or a legacy layout's experts in order), streamed: the value bytes in row order,
    zero padding to 64 bytes, then the scales (FP8: fp32 per row; MXFP4: the E8M0 bytes). What the
    dequantizing path refuses is refused here too: a NaN FP8 byte, a non-finite scale or product,
    E8M0 byte 255. Returns (blob dtype code, entry field 188, nbytes, chunk iterator)."""
    pieces = [p for name in names for p in dq.pieces[name]]
    dtype, shape, _, _ = dq.tensors[names[0]]
    cols = shape[-1]
    rows = sum(p[3] for p in pieces)
    fp8 = dq.scheme == "fp8"
    vbytes = rows * cols if fp8 else rows * cols // 2
    sbytes = 4 * rows if fp8 else rows * cols // MX_GROUP
    vsuffix = ".weight" if fp8 else ".weight_packed"

    def chunks():
        for module, sv, ss, n in pieces:
            per = cols if fp8 else cols // 2
            for a in range(0, n, chunk_rows):
                raw = sv.read(module + vsuffix, a * per, min(n, a + chunk_rows) * per)
                if fp8 and (b"\x7f" in raw or b"\xff" in raw):
                    r = a + max(raw.find(b"\x7f"), raw.find(b"\xff")) // cols
                    fail("an FP8 E4M3 weight is NaN (byte 0x7f or 0xff)", f"{sv.path}: {module}.weight row {r}",
                         hint="the checkpoint is corrupt")
                if fp8:
                    check_fp8_products(ss, module, raw, a, cols)
                yield raw
        yield b"\0" * (align(vbytes, ALIGN) - vbytes)
        for module, _, ss, n in pieces:
            sname = module + ".weight_scale"
            sdt = ss.tensors[sname][0]
            per = ST_DTYPE_SIZE[sdt] if fp8 else cols // MX_GROUP
            for a in range(0, n, chunk_rows):
                raw = ss.read(sname, a * per, min(n, a + chunk_rows) * per)
                if fp8:
                    v = read_scale_values(raw, sdt)
                    raw = struct.pack(f"<{len(v)}f", *v)
                elif 255 in raw:
                    fail("MXFP4 scale byte 0xFF is NaN", f"{ss.path}: {sname} row {a + raw.index(255) // per}",
                         "an E8M0 exponent byte 0..254", 255, "the checkpoint is corrupt")
                yield raw

    field = BLOB_V2_SCALE_DTYPE[dtype] if fp8 else MX_GROUP
    return BLOB_V2_DTYPE_CODES["fp8_e4m3_rows" if fp8 else "mxfp4"], field, align(vbytes, ALIGN) + sbytes, chunks()


FP8_DTYPE_MAX = {"BF16": 3.3895313892515355e38, "F16": 65504.0, "F32": 3.4028234663852886e38}


def check_fp8_products(ss, module, raw, first, cols):
    """Rows first.. of an FP8 module (raw: their values): every scale finite and e4m3(q) x scale finite
    in the scale's dtype for every code, as the dequantizing path requires."""
    sname = module + ".weight_scale"
    sdt = ss.tensors[sname][0]
    rows = len(raw) // cols
    size = ST_DTYPE_SIZE[sdt]
    scales = read_scale_values(ss.read(sname, first * size, (first + rows) * size), sdt)
    limit = FP8_DTYPE_MAX[sdt] / 448.0
    for r, s in enumerate(scales):
        if s != s or s in (float("inf"), float("-inf")):
            fail("an FP8 row scale is not finite", f"{ss.path}: {sname} row {first + r}", "a finite number", s)
        if abs(s) > limit:      # as in the dequantizing path: the row's table refuses an overflowing product
            fp8_row_table(s, sdt, f"{ss.path}: {module}")


def pack_blob_mxfp4(packed, exponents):
    """Dtype 4: the packed E2M1 bytes as in the checkpoint (low nibble = even column),
    zero-padded to 64 bytes, then the E8M0 exponent bytes, one per 32 values in row order."""
    return bytes(packed) + b"\0" * (align(len(packed), ALIGN) - len(packed)) + bytes(exponents)


# ----------------------------------------------------------------------------------------------
# --weights: a port's own weights in place of the checkpoint's (issue 41). A Core ML, MLX or
# PyTorch port dequantizes its weights and writes them as safetensors under the HF native names;
# zaya.c then runs the exact computation on the port's weights.
# ----------------------------------------------------------------------------------------------

def replace_with_port_weights(plan, where, paths, wformat, log):
    """The plan with every tensor the port files hold read from them instead of the checkpoint.
    Returns (plan, where, {blob name: stored dtype}); refuses a name the model does not have, a shape
    that differs, a dtype other than F32/F16/BF16, a name stored twice."""
    expected = {name: (shape, kind) for name, shape, kind, _ in plan}
    port = {}
    for path in paths:
        st = SafetensorsFile(path)
        for n, (dt, shape, _, _) in sorted(st.tensors.items()):
            where_n = f"{path}: tensor {n}"
            if n in port:
                fail("tensor stored twice in the port's weights", f"{n} in {port[n].path} and {path}",
                     hint="give each tensor once")
            if n not in expected:
                fail("the port's weights have a tensor the model does not have", where_n,
                     "a tensor name of the checkpoint under the HF native names (docs/architecture.md 2.2), e.g. "
                     + next(iter(k for k in expected if ".layers.0." in k), "model.layers.0.input_layernorm.weight"),
                     n, port_name_hint(n, expected))
            if dt not in ST_DTYPE_SIZE:
                fail("unsupported tensor dtype in the port's weights", where_n, "F32, F16 or BF16", dt,
                     "packed integers (MLX 4-bit packs 8 values per U32): write the port's weights dequantized (the "
                     "values the port computes with) as F32/F16/BF16 and give them with --weights (docs/compare.md §10)"
                     if dt in ("U32", "I32", "U16", "I16", "U8", "I8") else
                     "write the port's weights dequantized (the values the port computes with)")
            want = expected[n][0]
            if tuple(shape) != tuple(want):
                fail("a tensor of the port's weights has the wrong shape", where_n, list(want), list(shape),
                     "write it in the checkpoint's layout (transformers' ZayaForCausalLM): "
                     + ("[experts, rows, cols], the experts stacked" if ".mlp.experts." in n else "[out, in] for a linear weight")
                     + "; a port that transposes or splits it must undo that first")
            port[n] = st
    if not port:
        fail("the port's weights hold no tensor", ", ".join(paths), "at least one tensor", "none")
    where, new_plan, replaced = dict(where), [], {}
    for name, shape, kind, srcs in plan:
        if name in port:
            where[name] = port[name]            # a native name; legacy names never collide with another tensor
            srcs = [name]
            replaced[name] = port_stored_dtype(port[name], name, kind, wformat)
        new_plan.append((name, shape, kind, srcs))
    log(f"port weights: {len(replaced)} of {len(plan)} tensors replaced from {', '.join(paths)}:")
    for name, shape, kind, srcs in new_plan:
        if name in replaced:
            log(f"  replaced {name} {list(shape)} ({port[name].tensors[name][0]}, stored {replaced[name]})")
    kept = kept_matrices(new_plan, replaced)
    if kept:
        log(f"NOT replaced (kept at the checkpoint's values): {sum(len(v) for v in kept.values())} matrices: "
            + "; ".join(f"{k} ({layer_list(v)})" for k, v in kept.items())
            + "\n  if the port quantizes these too, add them to the port's weights: --quant and --local judge the port "
              "against these values, and a quantized tensor left here reads as a bug where it is used")
    return new_plan, where, replaced


def kept_matrices(plan, replaced):
    """{name without its layer: [layers]} of the matrices (kind matrix) the port's weights left out."""
    kept = {}
    for name, shape, kind, srcs in plan:
        if kind == "matrix" and name not in replaced:
            m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
            kept.setdefault(m.group(2) if m else name, []).append(int(m.group(1)) if m else -1)
    return kept


def layer_list(layers):
    ls = sorted(x for x in layers if x >= 0)
    if not ls:
        return "global"
    return f"layers {ls[0]}-{ls[-1]}" if ls == list(range(ls[0], ls[-1] + 1)) and len(ls) > 2 else \
        "layers " + ",".join(map(str, ls))


def port_name_hint(n, expected):
    if n == "lm_head.weight":
        return "the LM head is tied to the embedding: give it as model.embed_tokens.weight (zaya.c has no separate head)"
    if ".zaya_block." in n or ".qkv.linear_" in n or ".res_scale." in n:
        return "these are the legacy (Zyphra fork) names; use the native names (docs/architecture.md 2.4 maps them)"
    if re.search(r"\.experts\.\d+\.", n):
        return "give each layer's experts stacked: mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I]"
    close = [k for k in expected if k.rsplit(".", 1)[-1] == n.rsplit(".", 1)[-1]][:2]
    return "name it as transformers' ZayaForCausalLM does" + (f" (e.g. {', '.join(close)})" if close else "")


def port_stored_dtype(st, name, kind, wformat):
    """How a port tensor is stored in the blob, exactly: fp32 unless the blob's matrices are bf16/int8 and
    every value is a bf16 number (int8 would quantize the port's weights a second time)."""
    if kind != "matrix" or wformat == "fp32":
        return "fp32"
    dtype, _, begin, end = st.tensors[name]
    if dtype == "BF16":
        return "bf16"
    step = CHUNK - CHUNK % 4
    for b in range(0, end - begin, step):
        raw = st.read(name, b, b + step)
        f = raw if dtype == "F32" else f16_to_f32(raw)
        low = bytes(f[0::4]) + bytes(f[1::4])
        if low.count(0) != len(low):
            return "fp32"
    return "bf16"


# ----------------------------------------------------------------------------------------------
# A GGUF written by llama.cpp's ZAYA port (docs/checkpoints.md "A port's GGUF"). Its converter
# (convert_hf_to_gguf.py, ZayaModel) reads the legacy checkpoint layout and writes the 2L half-layers
# under its own names, in ggml's reversed dimensions; here every GGUF tensor becomes the legacy tensor it
# was written from, dequantized as ggml does (gguf.py), and the legacy path above does the rest.
# ----------------------------------------------------------------------------------------------

GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.final_norm.weight",
               "output.weight": "lm_head.weight",
               "res_scale_hs.weight": "model.res_scale.hidden_states_scale",
               "res_scale_hs.bias": "model.res_scale.hidden_states_bias",
               "res_scale_res.weight": "model.res_scale.residual_scale",
               "res_scale_res.bias": "model.res_scale.residual_bias"}
GGUF_BLOCK = {   # blk.N.<key> -> model.layers.N.<value> (N = the legacy half-layer)
    "attn_norm.weight": "input_norm.weight",
    "res_scale_hs.weight": "res_scale.hidden_states_scale", "res_scale_hs.bias": "res_scale.hidden_states_bias",
    "res_scale_res.weight": "res_scale.residual_scale", "res_scale_res.bias": "res_scale.residual_bias",
    "attn_q.weight": "self_attn.qkv.linear_q.weight", "attn_k.weight": "self_attn.qkv.linear_k.weight",
    "cca_val_proj1.weight": "self_attn.qkv.val_proj1.weight", "cca_val_proj2.weight": "self_attn.qkv.val_proj2.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ssm_conv1d.weight": "self_attn.qkv.conv_qk.0.weight",      # {k, C}: the depthwise [C, 1, k] squeezed
    "ssm_conv1d.bias": "self_attn.qkv.conv_qk.0.bias",
    "cca_conv_grp.weight": "self_attn.qkv.conv_qk.1.weight", "cca_conv_grp.bias": "self_attn.qkv.conv_qk.1.bias",
    "cca_k_scale.weight": "self_attn.qkv.temp",
    "ffn_gate_inp.weight": "zaya_block.router.down_proj.weight", "ffn_gate_inp.bias": "zaya_block.router.down_proj.bias",
    "ffn_norm.weight": "zaya_block.router.rmsnorm_eda.weight",
    "ffn_gate.weight": "zaya_block.router.router_mlp.0.weight", "ffn_gate.bias": "zaya_block.router.router_mlp.0.bias",
    "zaya_router_mlp2.weight": "zaya_block.router.router_mlp.2.weight",
    "zaya_router_mlp2.bias": "zaya_block.router.router_mlp.2.bias",
    "zaya_router_mlp4.weight": "zaya_block.router.router_mlp.4.weight",
    "zaya_router_biases.weight": "zaya_block.router.balancing_biases",
    "zaya_router_eda.weight": "zaya_block.router.router_states_scale",
}
GGUF_EXPERTS = {"ffn_gate_up_exps.weight": "linear_fc1", "ffn_down_exps.weight": "linear_fc2"}   # {H, 2I, E} / {I, H, E}


def is_gguf(path):
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == gguf.GGUF_MAGIC or path.endswith(".gguf")


class GGUFPortTensors:
    """The GGUF's tensors as legacy-named float32 tensors, with the interface of SafetensorsFile."""

    def __init__(self, g):
        self.g, self.path = g, g.path
        self.tensors, self.src = {}, {}
        self.types = {}                     # GGUF tensor name -> its type, for the log

    def add(self, name, gname, shape, first_row=0):
        n = 1
        for d in shape:
            n *= d
        self.tensors[name] = ("F32", tuple(shape), 0, 4 * n)
        self.src[name] = (gname, first_row)
        self.types[gname] = self.g.tensors[gname].type

    def ggml_type(self, name):
        """The ggml type id (ggml.h's enum ggml_type) of the GGUF tensor `name` is read from."""
        tname = self.g.tensors[self.src[name][0]].type
        return next(i for i, n in gguf.GGML_TYPE_NAMES.items() if n == tname)

    def pieces(self, name):
        """Where tensor `name`'s values are in the GGUF: [(type, file offset, nbytes, GGUF name)]."""
        gname, row0 = self.src[name]
        t = self.g.tensors[gname]
        return self.g.pieces(gname, row0, self.tensors[name][3] // 4 // t.ne[0])

    def read(self, name, begin, end):
        gname, row0 = self.src[name]
        ne0 = self.g.tensors[gname].ne[0]
        end = min(end, self.tensors[name][3])
        e0, e1 = begin // 4, end // 4
        r0, r1 = e0 // ne0, -(-e1 // ne0)
        try:
            values = self.g.dequantize(gname, row0 + r0, r1 - r0)
        except gguf.GGUFError as e:     # the compiled dequantizer failed: one message, no traceback
            raise ExportError(str(e))
        return values.tobytes()[4 * (e0 - r0 * ne0):4 * (e1 - r0 * ne0)]


def gguf_filler(where, w):
    """A GGUF's blob: dequantize.c writing the tensors straight into the blob file (gguf.BlobFiller), or None
    (not a GGUF, or the Python dequantizer: ZAYA_GGUF_PYTHON=1 or no C compiler)."""
    src = next((s for s in where.values() if isinstance(s, GGUFPortTensors)), None)
    if src is None or src.g.helper_exe is None:
        return None
    w.f.flush()
    return gguf.BlobFiller(src.g.helper_exe, src.path, w.path + ".tmp")


def gguf_scalar(g, key, kind=int, where=None):
    v = g.kv.get(key)
    if isinstance(v, list) and v and all(x == v[0] for x in v):     # per-layer arrays: only uniform ones
        v = v[0]
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        fail(f"the GGUF has no usable '{key}'", where or g.path, f"a {kind.__name__}", repr(v)[:100],
             "is this a GGUF of llama.cpp's ZAYA port (general.architecture = zaya)?")
    return v


def gguf_legacy_config(g, gname_of):
    """The legacy config.json the port's converter read, rebuilt from the GGUF's metadata and shapes.
    The GGUF has no sliding windows, no sliding-layer RoPE theta and no cca_time1 key: the port computes
    every layer with full attention; cca_time1 is read from the grouped convolution's shape."""
    a = "zaya."
    d = gguf_scalar(g, a + "attention.key_length")
    if g.kv.get(a + "attention.value_length", d) != d:
        fail("the GGUF's key and value head sizes differ", g.path, f"value_length {d}", g.kv[a + "attention.value_length"])
    emb = g.tensors.get("token_embd.weight")
    grp = g.tensors.get(gname_of.get("model.layers.0.self_attn.qkv.conv_qk.1.weight", ""))
    if emb is None or grp is None or len(emb.ne) != 2 or len(grp.ne) != 3:
        fail("the GGUF lacks token_embd.weight or blk.0.cca_conv_grp.weight", g.path,
             hint="is this a GGUF of llama.cpp's ZAYA port?")
    rot = gguf_scalar(g, a + "rope.dimension_count")
    cfg = {
        "hidden_size": gguf_scalar(g, a + "embedding_length"), "num_hidden_layers": gguf_scalar(g, a + "block_count"),
        "num_attention_heads": gguf_scalar(g, a + "attention.head_count"),
        "num_key_value_heads": gguf_scalar(g, a + "attention.head_count_kv"),
        "num_query_groups": gguf_scalar(g, a + "attention.head_count_kv"), "head_dim": d,
        "ffn_hidden_size": 2 * gguf_scalar(g, a + "feed_forward_length"),
        "zaya_mlp_expansion": gguf_scalar(g, a + "expert_feed_forward_length"),
        "num_experts": gguf_scalar(g, a + "expert_count"), "moe_router_topk": gguf_scalar(g, a + "expert_used_count"),
        "cca_time0": gguf_scalar(g, a + "ssm.conv_kernel"), "cca_time1": grp.ne[0],
        "norm_epsilon": float(gguf_scalar(g, a + "attention.layer_norm_rms_epsilon", float)),
        "rope_theta": float(gguf_scalar(g, a + "rope.freq_base", float)),
        "partial_rotary_factor": rot / d, "vocab_size": emb.ne[1],
        "max_position_embeddings": gguf_scalar(g, a + "context_length"),
        "tie_word_embeddings": "output.weight" not in g.tensors,
    }
    for key, tk in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"), ("pad_token_id", "padding_token_id")):
        if "tokenizer.ggml." + tk in g.kv:
            cfg[key] = gguf_scalar(g, "tokenizer.ggml." + tk)
    return cfg


def f32_of(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_against_checkpoint(c, ck, gpath, cpath):
    """The GGUF's hyper-parameters must be the checkpoint's; the keys the GGUF lacks come from the checkpoint."""
    same = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts",
            "num_experts_per_tok", "moe_intermediate_size", "router_hidden_size", "cca_time0", "cca_time1", "bos_token_id"]
    pairs = [(k, c[k], ck[k]) for k in same]
    pairs += [("rms_norm_eps (float32)", f32_of(c["rms_norm_eps"]), f32_of(ck["rms_norm_eps"])),
              ("rope_theta of full-attention layers (float32)", f32_of(c["rope_theta"]["hybrid"]),
               f32_of(ck["rope_theta"]["hybrid"])),
              ("partial_rotary_factor", c["partial_rotary_factor"]["hybrid"], ck["partial_rotary_factor"]["hybrid"])]
    for key, got, want in pairs:
        if got != want:
            fail("the GGUF's hyper-parameters differ from the checkpoint's config.json", f"{gpath} vs {cpath}: {key}",
                 want, got, "give --tokenizer the checkpoint folder this GGUF was converted from")
    if c["vocab_size"] > ck["vocab_size"]:
        fail("the GGUF's embedding has more rows than the checkpoint's vocab_size", f"{gpath} vs {cpath}",
             f"<= {ck['vocab_size']}", c["vocab_size"])
    for key in ("layer_types", "sliding_window", "eos_token_ids", "pad_token_id", "max_position_embeddings",
                "router_norm_eps"):
        c[key] = ck[key]
    for key in ("rope_theta", "partial_rotary_factor"):
        c[key] = {"hybrid": c[key]["hybrid"], "hybrid_sliding": ck[key]["hybrid_sliding"]}
    return c


def open_port_gguf(path, tokenizer, log):
    """(cfg, cfg_path, where, layout, c, tokenizer folder) for a GGUF of llama.cpp's ZAYA port."""
    try:
        g = gguf.GGUFFile(path)
    except gguf.GGUFError as e:
        raise ExportError(str(e))
    arch = g.kv.get("general.architecture")
    if arch != "zaya":
        fail("the GGUF is not a ZAYA model", f"{g.path}: general.architecture", "'zaya'", repr(arch),
             "export_weights.py reads GGUFs written by llama.cpp's ZAYA port (convert_hf_to_gguf.py, ZayaModel)")
    exe = build_dequantizer(log)
    if exe:
        g.use_helper(exe)
    src = GGUFPortTensors(g)
    gname_of = {}
    half = g.kv.get("zaya.block_count")
    n_exp = g.kv.get("zaya.expert_count")
    for gname, t in g.tensors.items():
        m = re.match(r"blk\.(\d+)\.(.*)$", gname)
        if m and m.group(2) in GGUF_EXPERTS and isinstance(n_exp, int) and len(t.ne) == 3:
            if t.ne[2] != n_exp:
                fail("the GGUF's stacked experts do not match its expert count", f"{path}: {gname}",
                     f"{n_exp} experts (zaya.expert_count)", t.ne[2])
            rows = t.ne[1]
            for e in range(n_exp):
                name = f"model.layers.{m.group(1)}.zaya_block.experts.local_experts.{e}.{GGUF_EXPERTS[m.group(2)]}.weight"
                src.add(name, gname, t.shape[1:], e * rows)
                gname_of[name] = gname
            continue
        if m and m.group(2) in GGUF_BLOCK:
            name = f"model.layers.{m.group(1)}.{GGUF_BLOCK[m.group(2)]}"
        elif gname in GGUF_GLOBAL:
            name = GGUF_GLOBAL[gname]
        else:
            fail("the GGUF has a tensor the ZAYA port's converter does not write", f"{path}: {gname}",
                 "the names of convert_hf_to_gguf.py's ZayaModel (docs/checkpoints.md)", gname,
                 "is this a GGUF of llama.cpp's ZAYA port, or of another version of it?")
        shape = t.shape
        if m and m.group(2) == "ssm_conv1d.weight" and len(shape) == 2:
            shape = (shape[0], 1, shape[1])           # the converter squeezed the depthwise conv's middle 1
        src.add(name, gname, shape)
        gname_of[name] = gname
    if half is not None and not isinstance(half, int):
        fail("the GGUF has no usable 'zaya.block_count'", path, "an integer", repr(half))
    cfg = gguf_legacy_config(g, gname_of)
    where = {name: src for name in src.tensors}
    c = legacy_to_native_config(cfg, f"{path} (metadata)")
    c["vocab_size"] = cfg["vocab_size"]
    cfg_path = f"{path} (metadata)"
    notes = []
    ck_cfg = os.path.join(tokenizer, "config.json") if tokenizer else None
    if ck_cfg and os.path.isfile(ck_cfg):
        ck_raw = read_json(ck_cfg, "config.json")
        if not isinstance(ck_raw, dict):
            fail("config.json is not a JSON object", ck_cfg)
        native = not any(k in ck_raw for k in LEGACY_CONFIG_KEYS) and "zaya_layers" not in ck_raw
        ck = native_config(ck_raw, ck_cfg) if native else legacy_to_native_config(ck_raw, ck_cfg)
        c = check_against_checkpoint(c, ck, path, ck_cfg)
        notes.append(f"hyper-parameters from the GGUF, checked against {ck_cfg}; sliding windows and the sliding "
                     "layers' RoPE from it (the GGUF stores none)")
    else:
        notes.append("hyper-parameters from the GGUF alone: every layer full attention with one RoPE theta, as "
                     "the port computes (the GGUF stores no sliding windows)")
    count = {}
    for t in src.types.values():
        count[t] = count.get(t, 0) + 1
    log(f"GGUF: {path}: {len(g.tensors)} tensors (" + ", ".join(f"{n} {t}" for t, n in sorted(count.items()))
        + f"), dequantized as ggml does; vocabulary {c['vocab_size']} rows")
    for n in notes:
        log("note: " + n)
    if tokenizer is None:
        # no checkpoint folder: the GGUF's own vocabulary and merges, with the ZAYA1 family's known normalizer,
        # pre-tokenizer and added tokens (export_tokenizer.gguf_tokenizer_json)
        c["gguf_kv"] = g.kv
        log("note: tokenizer from the GGUF's tokenizer.ggml.* arrays (vocabulary, merges, special ids, chat template), "
            "with the ZAYA1 normalizer and pre-tokenizer; --tokenizer DIR for the checkpoint's own files")
    else:
        log(f"note: tokenizer from {tokenizer}")
    if isinstance(g.kv.get("tokenizer.ggml.tokens"), list):
        c["gguf_n_tokens"] = len(g.kv["tokenizer.ggml.tokens"])
    return cfg, cfg_path, where, "legacy", c, tokenizer


def check_gguf_tokenizer(c, tok, path, tok_dir):
    """The tokenizer folder must have as many ids as the GGUF's own vocabulary (tokenizer.ggml.tokens)."""
    (n,) = struct.unpack_from("<I", tok, 32)
    if n != c["gguf_n_tokens"]:
        fail("the tokenizer folder does not match the GGUF's vocabulary", f"{tok_dir} vs {path}",
             f"{c['gguf_n_tokens']} token ids (tokenizer.ggml.tokens)", f"{n} ids in tokenizer.json",
             "give --tokenizer the checkpoint folder this GGUF was converted from")


# ----------------------------------------------------------------------------------------------
# --dry-run: the checkpoint's names, shapes and dtypes against its config, without reading a weight
# ----------------------------------------------------------------------------------------------

def dry_run_tensors(ckpt):
    """({name: (dtype or None, shape or None, file)}, what was read) from the shards' headers, or, where the shards
    are absent, from model.safetensors.index.json (shapes from its metadata.shapes if it has them)."""
    wm, files = checkpoint_files(ckpt)
    present = [fn for fn in files if os.path.isfile(os.path.join(ckpt, fn))]
    if present and len(present) != len(files):
        fail("a shard named in the index is missing", os.path.join(ckpt, sorted(set(files) - set(present))[0]),
             "every shard, or none (a check of the index alone)", f"{len(present)} of {len(files)} shards")
    if not present:
        index = os.path.join(ckpt, "model.safetensors.index.json")
        meta = read_json(index, "model.safetensors.index.json").get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        shapes, dtypes = meta.get("shapes") or {}, meta.get("dtypes") or {}
        out = {n: (dtypes.get(n), tuple(shapes[n]) if n in shapes else None, index) for n in wm}
        return out, f"the index alone ({len(wm)} names" + (", shapes from its metadata)" if shapes else "; no shapes)")
    where = open_checkpoint(ckpt, header_only=True)
    out = {n: (st.tensors[n][0], st.tensors[n][1], st.path) for n, st in where.items()}
    return out, f"the headers of {len(files)} shard(s)" if wm is not None else "the header"


def layout_sources(name, c, layout):
    return ([name] if layout == "native" else [vl_source_name(name)] if layout == "vl"
            else vl_zyphra_sources(name, c) if layout == "vl-zyphra" else legacy_sources(name, c))


LAYOUT_OF_NAME = (   # (test, the layout such a name belongs to), for the hint on an unexpected tensor
    (lambda n: n.startswith("model.language_model.") or n.startswith("model.visual."),
     "transformers' ZAYA1-VL layout (pull request #46011: model.language_model.*, model.visual.*)"),
    (lambda n: n.startswith("vision_tower.") or VL_ZYPHRA_BLOCK.match(n) is not None,
     "Zyphra's ZAYA1-VL layout (the hub's: model.layers.{i}.attn / .mlp blocks, vision_tower.*)"),
    (lambda n: any(m in n for m in LEGACY_TENSOR_MARKERS), "the legacy text layout (the fork's half-layers)"),
    (lambda n: ".self_attn.qkv_proj." in n or ".mlp.gate." in n or ".mlp.experts." in n,
     "the native text layout (transformers' ZayaForCausalLM)"),
)
LAYOUT_TEXT = {"native": "native text layout", "legacy": "legacy text layout", "vl": LAYOUT_OF_NAME[0][1],
               "vl-zyphra": LAYOUT_OF_NAME[1][1]}


def read_folder_config(ckpt, holds):
    """A checkpoint folder's config.json as a dict (-> cfg, its path); fails with a hint naming what the folder holds."""
    if not os.path.isdir(ckpt):
        fail("checkpoint folder not found", ckpt, "a folder", "a file" if os.path.exists(ckpt) else "nothing there",
             f"give the folder that holds config.json and {holds}")
    cfg_path = os.path.join(ckpt, "config.json")
    cfg = read_json(cfg_path, "config.json")
    if not isinstance(cfg, dict):
        fail("config.json is not a JSON object", cfg_path)
    return cfg, cfg_path


def dry_run(ckpt, log=print):
    """Checks every tensor the exporter would read (name, shape, dtype) against config.json, listing every problem
    grouped by kind; writes nothing. Returns the number of problems (0: the export would find every tensor)."""
    cfg, cfg_path = read_folder_config(ckpt, "the safetensors index or shards")
    tensors, read_what = dry_run_tensors(ckpt)
    quant = next((k for k in ("quantization_config", "quantization") if cfg.get(k) is not None), None)
    if quant or any(n.startswith("language_model.model.") for n in tensors):
        fail("--dry-run checks unquantized Hugging Face layouts only", f"{cfg_path}: {quant}" if quant else ckpt,
             "a checkpoint without quantization_config / quantization, in HF names",
             f"'{quant}'" if quant else "mlx-vlm's names (language_model.model.*)",
             "the export itself checks quantized experts and MLX folders: run it without --dry-run")
    layout = vl_layout(tensors) if mlx_weights.is_vl(cfg) else detect_layout(cfg, tensors)
    c = (vl_config(cfg, cfg_path) if layout in ("vl", "vl-zyphra") else native_config(cfg, cfg_path)
         if layout == "native" else legacy_to_native_config(cfg, cfg_path))
    check_config_limits(c, cfg_path)
    problems = []            # (kind, name, where, expected, found, hint)
    used = set()
    n_expected = 0
    for name, shape, kind in expected_tensors(c):
        srcs = layout_sources(name, c, layout)
        want = tuple(shape if len(srcs) == 1 else shape[1:])
        for s in srcs:
            n_expected += 1
            if s not in tensors:
                problems.append(("missing tensor", s, ckpt_name(cfg_path), f"{list(want)} (for {name})"
                                 if s != name else list(want), "absent",
                                 "the checkpoint is incomplete, or config.json does not match its weights"))
                continue
            used.add(s)
            dt, got, path = tensors[s]
            got = as_planned(name, got, want) if got is not None else None
            if got is not None and got != want:
                hint = ("transposed: the dimensions reversed" if got == want[::-1] and len(want) > 1 else
                        "config.json does not match the weights")
                problems.append(("tensor has the wrong shape", s, path, list(want), list(got), hint))
            if dt is not None and dt not in ST_DTYPE_SIZE:
                problems.append(("unsupported tensor dtype", s, path, " or ".join(ST_DTYPE_SIZE), dt,
                                 "ZAYA1 checkpoints are published in BF16; quantized ones are checked by the export"))
    extra = sorted(set(tensors) - used)
    if "lm_head.weight" in extra:   # a stored tied head: the export checks it equals the embedding
        extra.remove("lm_head.weight")
    vl = c.get("vl")
    for n in extra:
        other = next((text for test, text in LAYOUT_OF_NAME if test(n)), None)
        if other and other != LAYOUT_TEXT[layout]:
            hint = f"a name of {other}, in a checkpoint read as {LAYOUT_TEXT[layout]}: mixed layouts"
        elif vl and re.match(r"(vision_tower|model\.visual)\.blocks\.(\d+)\.", n):
            hint = f"vision_config.depth is {vl['vision']['depth']} (blocks 0..{vl['vision']['depth'] - 1})"
        elif re.match(r"model\.(language_model\.)?layers\.(\d+)\.", n):
            hint = f"num_hidden_layers is {c['num_hidden_layers']}; or a tensor of another ZAYA1 variant"
        else:
            hint = "is this a ZAYA1 checkpoint of another variant?"
        problems.append(("unexpected tensor", n, tensors[n][2], "no such tensor in this config", n, hint))
    log(f"dry run: {ckpt}: {LAYOUT_TEXT[layout]}; {len(tensors)} tensors read from {read_what}; "
        f"{n_expected} expected for {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_experts']} "
        "experts" + (f", vision depth {vl['vision']['depth']} hidden {vl['vision']['hidden_size']}, LoRA ranks "
                     f"{vl['vision_lora_rank_attn']} / {vl['vision_lora_rank_mlp']}" if vl else ""))
    groups = {}              # one entry per kind of problem and name pattern (the numbers replaced by #)
    for p in problems:
        groups.setdefault((p[0], re.sub(r"\d+", "#", p[1])), []).append(p)
    for (what, pattern), ps in groups.items():
        kind, name, where, expected, found, hint = ps[0]
        more = (f" (and {len(ps) - 1} more like {pattern})" if len(ps) > 4 else
                f" (and {', '.join(p[1] for p in ps[1:])})" if len(ps) > 1 else "")
        log("problem: " + gguf.message(what, f"{where}: {name}{more}", expected, found, hint))
    if problems:
        log(f"dry run: {len(problems)} problem(s) in {len(groups)} group(s); nothing written")
    else:
        known = [k for k, i in (("shapes", 1), ("dtypes", 0)) if all(t[i] is not None for t in tensors.values())]
        what = "names" + ("".join(", " + k for k in known[:-1]) + " and " + known[-1] if known else " only")
        log(f"dry run: OK ({what} checked; nothing written)")
    return len(problems)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Export a Hugging Face ZAYA1 checkpoint folder to a zaya.c blob.")
    ap.add_argument("checkpoint", help="folder with config.json, *.safetensors, tokenizer.json, tokenizer_config.json "
                    "(or their .gz); or a .gguf of llama.cpp's ZAYA port (its own tokenizer arrays, or --tokenizer DIR)")
    ap.add_argument("out", nargs="?", help="output blob, e.g. zaya1-8b.bin (not with --dry-run)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the checkpoint's tensor names, shapes and dtypes against its config.json from the "
                         "safetensors headers (or model.safetensors.index.json alone) and list every problem; "
                         "reads no weights, writes nothing; exit status 1 if anything is wrong")
    ap.add_argument("--dtype", choices=sorted(DTYPE_CODES), default="fp32",
                    help="format of the big matrices (default fp32; bf16 keeps the hub's exact weights)")
    ap.add_argument("--group-size", type=int, default=None,
                    help=f"int8 quantization group size (default {DEFAULT_GROUP} per matrix, or the largest power of "
                         "two below it that divides the matrix's rows; 32 is 5%% bigger and a little more exact)")
    ap.add_argument("--chat-format", choices=["auto", "chatml", "gemma", "none"], default="auto",
                    help="chat turn format (default: recognised from tokenizer_config.json's chat_template)")
    ap.add_argument("--keep-quantized-experts", action="store_true",
                    help="store FP8 / MXFP4 experts in their own format (docs/blob-format.md, format version 2; "
                         "the other matrices take --dtype); without it they are dequantized as the official code does")
    ap.add_argument("--weights", action="append", metavar="PORT.safetensors",
                    help="a port's own (dequantized) weights: F32/F16/BF16 tensors under the HF native names "
                         "(docs/architecture.md 2.2) that replace the checkpoint's, stored exactly; repeatable")
    ap.add_argument("--tokenizer", metavar="DIR", default=None,
                    help="GGUF input only: the folder with tokenizer.json and tokenizer_config.json (the checkpoint "
                         "the GGUF came from; its config.json, if there, is checked against the GGUF's metadata and "
                         "gives the sliding windows the GGUF does not store); without it the GGUF's own "
                         "tokenizer.ggml.* arrays")
    ap.add_argument("--mlx-compute", choices=["scales", "float32"], default="scales",
                    help="an MLX folder's affine weights: as mx.dequantize gives them, in the scales' dtype (default: "
                         "what a bf16/f16 MLX model multiplies by), or float32 (what MLX's quantized matmul uses with "
                         "float32 activations); docs/checkpoints.md")
    args = ap.parse_args(argv)
    if args.dry_run:
        try:
            return 1 if dry_run(args.checkpoint) else 0
        except ExportError as e:
            print(f"export_weights.py: error: {e}", file=sys.stderr)
            return 1
        except BrokenPipeError:         # the listing piped into head: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    if args.out is None:
        ap.error("the output blob is required (or give --dry-run)")
    try:
        export(args.checkpoint, args.out, args.dtype, args.group_size,
               None if args.chat_format == "auto" else args.chat_format, keep_quantized=args.keep_quantized_experts,
               tokenizer=args.tokenizer, port_weights=args.weights, mlx_compute=args.mlx_compute)
    except (ExportError, mlx_weights.MLXError) as e:   # MLXError: an MLX tensor's C dequantizer failed midway
        print(f"export_weights.py: error: {e}", file=sys.stderr)
        try:
            os.remove(args.out + ".tmp")
        except OSError:
            pass
        return 1
    except OSError as e:            # reading or writing failed midway (disk full, I/O error, a file removed)
        print(f"export_weights.py: error: {e.strerror or e}\n  where:    {e.filename or args.out}\n"
              "  hint:     check the disk space and that the files are readable", file=sys.stderr)
        try:
            os.remove(args.out + ".tmp")
        except OSError:
            pass
        return 1
    except KeyboardInterrupt:
        print("export_weights.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
