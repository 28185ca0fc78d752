#!/usr/bin/env python3
"""make_checkpoint.py - a ZAYA-shaped hub checkpoint with random weights, for benchmarks and tests.

Writes a Hugging Face style folder: config.json, sharded model-0000N-of-0000M.safetensors plus
model.safetensors.index.json (or one model.safetensors with --single-file), and tokenizer.json /
tokenizer_config.json (or their .gz) copied from --tokenizer-dir (default test/fixtures/tokenizer). All tensors are bf16, with the names and shapes of
docs/architecture.md section 2.2 (--layout native), 2.4 (--layout legacy: 2L half-layers, one tensor
per expert, legacy config keys) or 2.5 (--layout base: ZAYA1-base's per-half-layer config lists, legacy
tensor names). Every dimension can be changed on the command line; the defaults are ZAYA1-8B
(17.68 GB), or with --preset 74b ZAYA1-74B-preview's reported shape at any --layers (149.6 GB at 60).
--attention-bias and --lm-head-bias add those biases; --dry-run writes only config.json and the index
(every tensor's shape in its metadata), for checking a full-size layout in seconds.

Weights are random with trained-model-like scales:
  projections / experts / router MLP / convs  N(0, 1/sqrt(fan_in))
  embedding (= tied LM head)                  N(0, --embed-std)
  norm weights, residual and input scales     1 + N(0, 0.05)
  biases (residual, conv, router)             N(0, 0.02)
  router_states_scale (EDA)                   U(0.3, 0.7)
  qk_norm.temp                                U(0.8, 3.0)
  balancing_biases                            N(0, 0.02), skip class (last) -U(0.05, 0.30) or --skip-bias
bf16 values are the float32 values truncated toward zero.

Memory is bounded: one pool of standard-normal values (at most POOL_VALUES) is drawn once, scaled to a
bf16 pool per distinct scale, and every matrix is written as slices of its pool taken at random
offsets (a matrix no bigger than the pool is one contiguous slice, so its values are all distinct).
The random offsets come from a generator seeded by (seed, native tensor name, expert index), so the
same --seed gives the same numbers in both layouts, whatever the shard size.

Usage:
  python3 tools/make_checkpoint.py OUT_DIR                          # ZAYA1-8B, native, seed 0
  python3 tools/make_checkpoint.py OUT_DIR --layout legacy --seed 7
  python3 tools/make_checkpoint.py OUT_DIR --hidden 96 --layers 3 --heads 6 --kv-heads 2 \\
      --head-dim 32 --experts 3 --moe-intermediate 80 --router-hidden 24 \\
      --layer-types hybrid_sliding,hybrid --sliding-window 5
  python3 tools/make_checkpoint.py OUT_DIR --preset 74b --layers 2  # a full-width 74B slice (7.06 GB)
  python3 tools/make_checkpoint.py OUT_DIR --verify                 # re-read and check a folder
  python3 tools/make_checkpoint.py --selftest                       # small native vs legacy check

Standard library only.
"""

import argparse
import array
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile
import time

POOL_VALUES = 1 << 20          # standard-normal pool: 1 Mi values = 2 MB of bf16 per scale (at most)
POOL_MIN = 1 << 17             # ... and at least 128 Ki values (small configs)
CHUNK_VALUES = 1 << 16         # a big matrix is written in slices of 64 Ki values (128 KB)
DEFAULT_SHARD = 5_000_000_000  # save_pretrained's "5GB"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.json.gz", "tokenizer_config.json.gz")     # export_weights.py reads either

HYBRID, SLIDING = "hybrid", "hybrid_sliding"


# ----------------------------------------------------------------------------------------------
# configuration

def parse_layer_types(text, n_layers):
    """Comma list of hybrid / hybrid_sliding (or h / s), repeated cyclically to n_layers."""
    short = {"h": HYBRID, "s": SLIDING, HYBRID: HYBRID, SLIDING: SLIDING,
             "full": HYBRID, "sliding": SLIDING}
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise SystemExit("error: --layer-types is empty")
    bad = [t for t in items if t not in short]
    if bad:
        raise SystemExit("error: unknown layer type %r (use hybrid, hybrid_sliding, h, s)" % bad[0])
    items = [short[t] for t in items]
    if len(items) > n_layers:
        raise SystemExit("error: %d layer types for %d layers" % (len(items), n_layers))
    return [items[i % len(items)] for i in range(n_layers)]


def make_dims(a):
    d = dict(H=a.hidden, L=a.layers, nq=a.heads, nkv=a.kv_heads, d=a.head_dim, E=a.experts,
             I=a.moe_intermediate, R=a.router_hidden, V=a.vocab, t0=a.cca_time0, t1=a.cca_time1)
    for k, v in d.items():
        if v < 1:
            raise SystemExit("error: dimension %s must be >= 1 (got %d)" % (k, v))
    if d["nq"] % d["nkv"]:
        raise SystemExit("error: --heads (%d) must be a multiple of --kv-heads (%d)" % (d["nq"], d["nkv"]))
    if (d["nkv"] * d["d"]) % 2:
        raise SystemExit("error: kv_heads * head_dim must be even (value is split current/delayed)")
    d["attention_bias"], d["lm_head_bias"] = getattr(a, "attention_bias", False), getattr(a, "lm_head_bias", False)
    d["types"] = parse_layer_types(a.layer_types, d["L"])
    d["window"] = a.sliding_window
    if SLIDING in d["types"] and not a.sliding_window:
        raise SystemExit("error: hybrid_sliding layers need --sliding-window W (W >= 1, counts the current token)")
    if a.sliding_window is not None and a.sliding_window < 1:
        raise SystemExit("error: --sliding-window must be >= 1")
    for tok, name in ((a.bos, "bos"), (a.eos, "eos"), (a.pad, "pad")):
        if not 0 <= tok < d["V"]:
            raise SystemExit("error: %s id %d outside the vocabulary of %d (set --%s)" % (name, tok, d["V"], name))
    return d


def native_config(dm, a):
    rope = {
        HYBRID: {"partial_rotary_factor": a.partial_rotary, "rope_theta": a.rope_theta, "rope_type": "default"},
        SLIDING: {"partial_rotary_factor": a.partial_rotary if a.partial_rotary_sliding is None else a.partial_rotary_sliding,
                  "rope_theta": a.rope_theta_sliding,
                  "rope_type": "default"},
        "rope_type": "default",   # the stray entry of the published config (HF deletes it)
    }
    return {
        "architectures": ["ZayaForCausalLM"],
        "attention_bias": dm["attention_bias"],
        "attention_dropout": 0.0,
        "bos_token_id": a.bos,
        "cca_time0": dm["t0"],
        "cca_time1": dm["t1"],
        "dtype": "bfloat16",
        "eos_token_id": a.eos,
        "head_dim": dm["d"],
        "hidden_act": "silu",
        "hidden_size": dm["H"],
        "initializer_range": 0.02,
        "layer_types": list(dm["types"]),
        "lm_head_bias": dm["lm_head_bias"],
        "max_position_embeddings": a.max_position,
        "model_type": "zaya",
        "moe_intermediate_size": dm["I"],
        "num_attention_heads": dm["nq"],
        "num_experts": dm["E"],
        "num_experts_per_tok": 1,
        "num_hidden_layers": dm["L"],
        "num_key_value_heads": dm["nkv"],
        "output_router_logits": False,
        "pad_token_id": a.pad,
        "partial_rotary_factor": a.partial_rotary,
        "rms_norm_eps": 1e-05,
        "rope_parameters": rope,
        "router_hidden_size": dm["R"],
        "sliding_window": dm["window"],
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": dm["V"],
    }


def legacy_config(dm, a):
    if a.partial_rotary_sliding not in (None, a.partial_rotary):
        raise SystemExit("error: the legacy schema has one partial_rotary_factor (--partial-rotary-sliding is native only)")
    cfg = {
        "activation_func": "swiglu",
        "activation_func_fp8_input_store": False,
        "add_bias_linear": False,
        "apply_rope_fusion": True,
        "architectures": ["ZayaForCausalLM"],
        "attention_bias": dm["attention_bias"],    # the fork's attention biases (add_bias_linear = expert MLPs)
        "attention_dropout": 0.0,
        "bias_activation_fusion": True,
        "bos_token_id": a.bos,
        "cca": True,
        "cca_time0": dm["t0"],
        "cca_time1": dm["t1"],
        "clamp_temp": False,
        "eos_token_id": a.eos,
        "ffn_hidden_size": 2 * dm["I"],
        "fused_add_norm": False,
        "gated_linear_unit": True,
        "head_dim": dm["d"],
        "hidden_size": dm["H"],
        "lm_head_bias": dm["lm_head_bias"],
        "max_position_embeddings": a.max_position,
        "model_type": "zaya",
        "moe_router_topk": 1,
        "norm_epsilon": 1e-05,
        "normalization": "RMSNorm",
        "num_attention_heads": dm["nq"],
        "num_experts": dm["E"],
        "num_hidden_layers": 2 * dm["L"],
        "num_key_value_heads": dm["nkv"],
        "num_query_groups": dm["nkv"],
        "pad_token_id": a.pad,
        "partial_rotary_factor": a.partial_rotary,
        "residual_in_fp32": True,
        "rope_scaling": None,
        "rope_theta": a.rope_theta,
        "scale_residual_merge": True,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": dm["V"],
        "zaya_high_prec": True,
        "zaya_mlp_expansion": dm["R"],
        "zaya_use_eda": True,
        "zaya_use_mod": True,
    }
    if SLIDING in dm["types"]:
        # per half-layer window excluding the current token; MoE half-layers 0 (section 2.4)
        swa = []
        for t in dm["types"]:
            swa += [dm["window"] - 1 if t == SLIDING else 0, 0]
        if dm["window"] - 1 < 1:
            raise SystemExit("error: the legacy layout cannot express --sliding-window 1 (swa_layers 0 = full)")
        cfg["swa_layers"] = swa
        cfg["swa_rotary_base"] = a.rope_theta_sliding
    return cfg


def base_config(dm, a):
    """The older per-half-layer schema of ZAYA1-base / ZAYA1-reasoning-base (Zyphra fork, branch `zaya`):
    per-half-layer lists, num_attention_heads = 2 x the CCA query heads, head_dim = hidden / that,
    CCA kernels fixed at 2, one sliding_window for all layers (or none)."""
    nh = 2 * dm["nq"]
    if a.partial_rotary_sliding not in (None, a.partial_rotary) or (SLIDING in dm["types"] and a.rope_theta_sliding != a.rope_theta):
        raise SystemExit("error: the ZAYA1-base schema has one RoPE for all layers (give no --partial-rotary-sliding, "
                         "and --rope-theta-sliding equal to --rope-theta)")
    if dm["H"] != nh * dm["d"]:
        raise SystemExit("error: the ZAYA1-base schema derives head_dim = hidden / (2 x heads): "
                         "--hidden must be 2 x --heads x --head-dim (%d)" % (nh * dm["d"]))
    if (dm["t0"], dm["t1"]) != (2, 2):
        raise SystemExit("error: the ZAYA1-base schema's CCA kernels are 2 and 2")
    if len(set(dm["types"])) != 1:
        raise SystemExit("error: the ZAYA1-base schema has one sliding_window for all layers or none")
    cfg = {
        "activation_func": "swiglu", "add_bias_linear": False, "apply_rope_fusion": True,
        "architectures": ["ZayaForCausalLM"], "attention_bias": dm["attention_bias"], "attention_dropout": 0.0,
        "bias_activation_fusion": True, "bos_token_id": a.bos, "cca": True,
        "cca_num_q_heads": [dm["nq"], 0] * dm["L"], "eos_token_id": a.eos,
        "ffn_hidden_size_list": [0, 2 * dm["I"]] * dm["L"], "fused_add_norm": False, "gated_linear_unit": True,
        "hidden_size": dm["H"], "lm_head_bias": dm["lm_head_bias"], "max_position_embeddings": a.max_position,
        "model_type": "zaya", "moe_router_topk": 1, "norm_epsilon": 1e-05, "normalization": "RMSNorm",
        # ZAYA1-base's config keeps the fork's default 120 whatever zaya_layers says (the fork never reads it)
        "num_attention_heads": nh, "num_hidden_layers": 120, "num_key_value_heads": dm["nkv"],
        "num_query_groups_list": [dm["nkv"], 0] * dm["L"], "pad_token_id": a.pad,
        "partial_rotary_factor": a.partial_rotary, "residual_in_fp32": False, "rope_scaling": False,
        "rope_theta": a.rope_theta, "scale_residual_merge": True,
        "sliding_window": dm["window"] if dm["types"][0] == SLIDING else None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": dm["V"],
        "zaya_layers": ["a", dm["E"]] * dm["L"], "zaya_mlp_expansion": [0, dm["R"]] * dm["L"],
        "zaya_use_eda": True, "zaya_use_mod": True,
    }
    if a.base_layernorm_epsilon is not None:   # the router RMSNorm's epsilon (the fork's default: 1e-6)
        cfg["layernorm_epsilon"] = a.base_layernorm_epsilon
    return cfg


# ----------------------------------------------------------------------------------------------
# the tensor list (native order = module order, as save_pretrained writes it)

class T:
    """One native tensor. kind: 'mat' (pool values, std = scale), 'vec' (direct values, spec)."""
    __slots__ = ("name", "shape", "kind", "scale", "spec", "experts")

    def __init__(self, name, shape, kind, scale=None, spec=None, experts=False):
        self.name, self.shape, self.kind, self.scale, self.spec, self.experts = name, shape, kind, scale, spec, experts

    @property
    def numel(self):
        return math.prod(self.shape)


def native_tensors(dm, embed_std):
    out = native_tensors_unbiased(dm, embed_std)
    if not (dm.get("attention_bias") or dm.get("lm_head_bias")):
        return out
    nq, nkv, d, H = dm["nq"], dm["nkv"], dm["d"], dm["H"]
    biased = []
    for t in out:           # each bias right after its weight (module order)
        biased.append(t)
        n = t.name
        if dm.get("attention_bias") and n.endswith(("q_proj.weight", "k_proj.weight", "v_proj_current.weight",
                                                    "v_proj_delayed.weight", "self_attn.o_proj.weight")):
            rows = {"q_proj": nq * d, "k_proj": nkv * d, "v_proj_current": nkv * d // 2,
                    "v_proj_delayed": nkv * d // 2, "o_proj": H}[n.split(".")[-2]]
            biased.append(T(n[:-len("weight")] + "bias", [rows], "vec", spec="bias"))
    if dm.get("lm_head_bias"):
        biased.append(T("lm_head.bias", [dm["V"]], "vec", spec="bias"))
    return biased


def native_tensors_unbiased(dm, embed_std):
    H, nq, nkv, d, E, I, R, V, t0, t1 = (dm[k] for k in ("H", "nq", "nkv", "d", "E", "I", "R", "V", "t0", "t1"))
    C = (nq + nkv) * d
    fan = lambda n: 1.0 / math.sqrt(n)
    out = [T("model.embed_tokens.weight", [V, H], "mat", embed_std),
           T("model.input_hidden_states_scale", [H], "vec", spec="one"),
           T("model.input_hidden_states_bias", [H], "vec", spec="bias")]
    for i in range(dm["L"]):
        p = "model.layers.%d." % i
        a = p + "self_attn.qkv_proj."
        out += [
            T(p + "input_layernorm.weight", [H], "vec", spec="one"),
            T(a + "q_proj.weight", [nq * d, H], "mat", fan(H)),
            T(a + "k_proj.weight", [nkv * d, H], "mat", fan(H)),
            T(a + "v_proj_current.weight", [nkv * d // 2, H], "mat", fan(H)),
            T(a + "v_proj_delayed.weight", [nkv * d // 2, H], "mat", fan(H)),
            T(a + "conv_qk_depthwise.weight", [C, 1, t0], "mat", fan(t0)),
            T(a + "conv_qk_depthwise.bias", [C], "vec", spec="bias"),
            T(a + "conv_qk_grouped.weight", [C, d, t1], "mat", fan(d * t1)),
            T(a + "conv_qk_grouped.bias", [C], "vec", spec="bias"),
            T(p + "self_attn.qk_norm.temp", [nkv], "vec", spec="temp"),
            T(p + "self_attn.o_proj.weight", [H, nq * d], "mat", fan(nq * d)),
        ]
        out += residual_scale(p + "post_attention_residual_scale.", H)
        out += [T(p + "post_attention_layernorm.weight", [H], "vec", spec="one"),
                T(p + "mlp.gate.down_proj.weight", [R, H], "mat", fan(H)),
                T(p + "mlp.gate.down_proj.bias", [R], "vec", spec="bias")]
        if i > 0:
            out.append(T(p + "mlp.gate.router_states_scale", [R], "vec", spec="eda"))
        g = p + "mlp.gate.router_mlp."
        out += [T(g + "norm.weight", [R], "vec", spec="one"),
                T(g + "fc1.weight", [R, R], "mat", fan(R)),
                T(g + "fc1.bias", [R], "vec", spec="bias"),
                T(g + "fc2.weight", [R, R], "mat", fan(R)),
                T(g + "fc2.bias", [R], "vec", spec="bias"),
                T(g + "out_proj.weight", [E + 1, R], "mat", fan(R)),
                T(p + "mlp.gate.balancing_biases", [E + 1], "vec", spec="balance"),
                T(p + "mlp.experts.gate_up_proj", [E, 2 * I, H], "mat", fan(H), experts=True),
                T(p + "mlp.experts.down_proj", [E, H, I], "mat", fan(I), experts=True)]
        out += residual_scale(p + "post_mlp_residual_scale.", H)
    out.append(T("model.norm.weight", [H], "vec", spec="one"))
    return out


def residual_scale(prefix, H):
    return [T(prefix + "hidden_states_scale", [H], "vec", spec="one"),
            T(prefix + "hidden_states_bias", [H], "vec", spec="bias"),
            T(prefix + "residual_scale", [H], "vec", spec="one"),
            T(prefix + "residual_bias", [H], "vec", spec="bias")]


NATIVE_TO_LEGACY_ATTN = {
    "input_layernorm.weight": "input_norm.weight",
    "self_attn.qkv_proj.q_proj.weight": "self_attn.qkv.linear_q.weight",
    "self_attn.qkv_proj.k_proj.weight": "self_attn.qkv.linear_k.weight",
    "self_attn.qkv_proj.v_proj_current.weight": "self_attn.qkv.val_proj1.weight",
    "self_attn.qkv_proj.v_proj_delayed.weight": "self_attn.qkv.val_proj2.weight",
    "self_attn.qkv_proj.q_proj.bias": "self_attn.qkv.linear_q.bias",
    "self_attn.qkv_proj.k_proj.bias": "self_attn.qkv.linear_k.bias",
    "self_attn.qkv_proj.v_proj_current.bias": "self_attn.qkv.val_proj1.bias",
    "self_attn.qkv_proj.v_proj_delayed.bias": "self_attn.qkv.val_proj2.bias",
    "self_attn.o_proj.bias": "self_attn.o_proj.bias",
    "self_attn.qkv_proj.conv_qk_depthwise.weight": "self_attn.qkv.conv_qk.0.weight",
    "self_attn.qkv_proj.conv_qk_depthwise.bias": "self_attn.qkv.conv_qk.0.bias",
    "self_attn.qkv_proj.conv_qk_grouped.weight": "self_attn.qkv.conv_qk.1.weight",
    "self_attn.qkv_proj.conv_qk_grouped.bias": "self_attn.qkv.conv_qk.1.bias",
    "self_attn.qk_norm.temp": "self_attn.qkv.temp",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
}
NATIVE_TO_LEGACY_MOE = {
    "post_attention_layernorm.weight": "input_norm.weight",
    "mlp.gate.down_proj.weight": "zaya_block.router.down_proj.weight",
    "mlp.gate.down_proj.bias": "zaya_block.router.down_proj.bias",
    "mlp.gate.router_states_scale": "zaya_block.router.router_states_scale",
    "mlp.gate.router_mlp.norm.weight": "zaya_block.router.rmsnorm_eda.weight",
    "mlp.gate.router_mlp.fc1.weight": "zaya_block.router.router_mlp.0.weight",
    "mlp.gate.router_mlp.fc1.bias": "zaya_block.router.router_mlp.0.bias",
    "mlp.gate.router_mlp.fc2.weight": "zaya_block.router.router_mlp.2.weight",
    "mlp.gate.router_mlp.fc2.bias": "zaya_block.router.router_mlp.2.bias",
    "mlp.gate.router_mlp.out_proj.weight": "zaya_block.router.router_mlp.4.weight",
    "mlp.gate.balancing_biases": "zaya_block.router.balancing_biases",
}


def legacy_names(t, n_layers):
    """Legacy (name, shape, expert index or None) pieces of one native tensor (section 2.4)."""
    n = t.name
    if n in ("model.embed_tokens.weight", "lm_head.bias"):
        return [(n, t.shape, None)]
    if n.startswith("model.input_hidden_states_"):
        return [("model.layers.0.res_scale." + n[len("model.input_"):], t.shape, None)]
    if n == "model.norm.weight":
        return [("model.final_norm.weight", t.shape, None)]
    rest = n[len("model.layers."):]
    i, sub = rest.split(".", 1)
    i = int(i)
    if sub in NATIVE_TO_LEGACY_ATTN:
        return [("model.layers.%d.%s" % (2 * i, NATIVE_TO_LEGACY_ATTN[sub]), t.shape, None)]
    if sub in NATIVE_TO_LEGACY_MOE:
        return [("model.layers.%d.%s" % (2 * i + 1, NATIVE_TO_LEGACY_MOE[sub]), t.shape, None)]
    if sub.startswith("post_attention_residual_scale."):
        return [("model.layers.%d.res_scale.%s" % (2 * i + 1, sub.split(".", 1)[1]), t.shape, None)]
    if sub.startswith("post_mlp_residual_scale."):
        leaf = sub.split(".", 1)[1]
        if i == n_layers - 1:
            return [("model.res_scale." + leaf, t.shape, None)]
        return [("model.layers.%d.res_scale.%s" % (2 * i + 2, leaf), t.shape, None)]
    if sub in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
        fc = "linear_fc1" if sub.endswith("gate_up_proj") else "linear_fc2"
        return [("model.layers.%d.zaya_block.experts.local_experts.%d.%s.weight" % (2 * i + 1, e, fc),
                 t.shape[1:], e) for e in range(t.shape[0])]
    raise AssertionError("no legacy name for " + n)


def layout_tensors(native, layout, n_layers):
    """[(stored name, shape, native tensor, expert index or None)] in module order."""
    if layout == "native":
        return [(t.name, t.shape, t, None) for t in native]
    items = []
    for t in native:
        for name, shape, e in legacy_names(t, n_layers):
            items.append((name, shape, t, e))
    # legacy module order: half-layers in order; inside a half-layer res_scale first (ZF order)
    def key(it):
        name = it[0]
        if name == "model.embed_tokens.weight":
            return (-1, 0, name)
        if name.startswith("model.layers."):
            j, leaf = name[len("model.layers."):].split(".", 1)
            e = it[3] if it[3] is not None else -1
            return (int(j), 0 if leaf.startswith("res_scale") else 1, e, leaf)
        return (1 << 30, 0, name)
    items.sort(key=key)
    return items


# ----------------------------------------------------------------------------------------------
# random values

def to_bf16(values):
    """float list -> little-endian bf16 bytes (float32 truncated toward zero)."""
    f = array.array("f", values)
    if sys.byteorder != "little":
        f.byteswap()
    b = f.tobytes()
    out = bytearray(len(b) // 2)
    out[0::2] = b[2::4]
    out[1::2] = b[3::4]
    return bytes(out)


class Source:
    def __init__(self, seed, pool_values, skip_bias):
        self.seed = seed
        self.pool_values = max(1, pool_values)
        self.skip_bias = skip_bias
        self._base = None
        self._pools = {}

    def pool(self, scale):
        """bf16 pool for std = scale (memoryview of bytes), built lazily from one N(0,1) pool."""
        p = self._pools.get(scale)
        if p is None:
            if self._base is None:
                r = random.Random("%s:pool" % self.seed)
                g = r.gauss
                self._base = [g(0.0, 1.0) for _ in range(self.pool_values)]
            p = memoryview(to_bf16([v * scale for v in self._base]))
            self._pools[scale] = p
        return p

    def vector(self, t):
        r = random.Random("%s:%s" % (self.seed, t.name))
        n = t.numel
        g = r.gauss
        if t.spec == "one":
            v = [1.0 + g(0.0, 0.05) for _ in range(n)]
        elif t.spec == "bias":
            v = [g(0.0, 0.02) for _ in range(n)]
        elif t.spec == "eda":
            v = [r.uniform(0.3, 0.7) for _ in range(n)]
        elif t.spec == "temp":
            v = [r.uniform(0.8, 3.0) for _ in range(n)]
        elif t.spec == "balance":
            v = [g(0.0, 0.02) for _ in range(n - 1)]
            v.append(-r.uniform(0.05, 0.30) if self.skip_bias is None else self.skip_bias)
        else:
            raise AssertionError(t.spec)
        return to_bf16(v)

    def write(self, f, t, expert):
        """Write native tensor t (or its expert slice) to f as bf16; returns bytes written."""
        if t.kind == "vec":
            b = self.vector(t)
            f.write(b)
            return len(b)
        n = t.numel // t.shape[0] if t.experts else t.numel
        pool = self.pool(t.scale)
        plen = len(pool) // 2
        experts = [expert] if expert is not None else (range(t.shape[0]) if t.experts else [None])
        total = 0
        for e in experts:
            r = random.Random("%s:%s:%s" % (self.seed, t.name, e))
            pos = 0
            chunk = n if n <= plen else min(CHUNK_VALUES, plen // 4)
            while pos < n:
                c = min(chunk, n - pos)
                o = r.randrange(plen - c + 1)
                f.write(pool[2 * o: 2 * (o + c)])
                pos += c
            total += 2 * n
        return total


# ----------------------------------------------------------------------------------------------
# safetensors writing

def plan_shards(items, shard_size):
    shards, cur, cur_size = [], [], 0
    for it in items:
        nbytes = 2 * math.prod(it[1])
        if cur and cur_size + nbytes > shard_size:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(it)
        cur_size += nbytes
    if cur:
        shards.append(cur)
    return shards


def shard_header(items):
    """safetensors header bytes for items, data in sorted-name order (as safetensors writes it)."""
    items = sorted(items, key=lambda it: it[0])
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _, _ in items:
        n = 2 * math.prod(shape)
        hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return items, h, off


class Progress:
    def __init__(self, total, quiet):
        self.total, self.done, self.quiet = total, 0, quiet
        self.t0 = self.last = time.time()

    def add(self, n):
        self.done += n
        now = time.time()
        if not self.quiet and (now - self.last > 5 or self.done == self.total) and now - self.t0 > 1:
            self.last = now
            print("  %6.2f / %.2f GB  %4.0f MB/s  %6.1f s" % (self.done / 1e9, self.total / 1e9,
                  self.done / 1e6 / max(now - self.t0, 1e-9), now - self.t0), file=sys.stderr)


def generate(a):
    dm = make_dims(a)
    native = native_tensors(dm, a.embed_std)
    items = layout_tensors(native, a.layout, dm["L"])
    # pool size: the biggest matrix (or expert) except the embedding, clamped to POOL_MIN..POOL_VALUES
    # (depends on the dimensions only, never on the layout or the sharding)
    biggest = max((t.numel // t.shape[0] if t.experts else t.numel)
                  for t in native if t.kind == "mat" and t.name != "model.embed_tokens.weight")
    src = Source(a.seed, max(POOL_MIN, min(POOL_VALUES, 1 << (biggest - 1).bit_length())), a.skip_bias)
    total = sum(2 * math.prod(it[1]) for it in items)
    n_params = sum(t.numel for t in native)

    out = a.out_dir
    if os.path.exists(out) and os.listdir(out) and not a.force:
        raise SystemExit("error: %s exists and is not empty (use --force to overwrite)" % out)
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):
        if fn.endswith(".safetensors") or fn.endswith(".safetensors.part") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out, fn))

    if a.dry_run:
        return dry_run(a, dm, items, n_params, total)
    shards = [items] if a.single_file else plan_shards(items, a.shard_size)
    m = len(shards)
    if not a.quiet:
        print("layout %s: %d layers, hidden %d, %d q / %d kv heads x %d, %d experts x %d, router %d, vocab %d"
              % (a.layout, dm["L"], dm["H"], dm["nq"], dm["nkv"], dm["d"], dm["E"], dm["I"], dm["R"], dm["V"]),
              file=sys.stderr)
        print("%d tensors, %s parameters, %.2f GB bf16 in %d file(s) -> %s"
              % (len(items), format(n_params, ","), total / 1e9, m, out), file=sys.stderr)
    prog = Progress(total, a.quiet)
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        fname = "model.safetensors" if a.single_file else "model-%05d-of-%05d.safetensors" % (k, m)
        ordered, hdr, size = shard_header(shard)
        tmp = os.path.join(out, fname + ".part")
        with open(tmp, "wb", buffering=1 << 20) as f:
            f.write(struct.pack("<Q", len(hdr)))
            f.write(hdr)
            for name, shape, t, e in ordered:
                n = src.write(f, t, e)
                assert n == 2 * math.prod(shape), name
                prog.add(n)
                weight_map[name] = fname
        os.replace(tmp, os.path.join(out, fname))
    if not a.single_file:
        index = {"metadata": {"total_parameters": n_params, "total_size": total},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    write_config(a, dm, out)
    copied = []
    if a.tokenizer_dir and a.tokenizer_dir != "none":
        if not os.path.isdir(a.tokenizer_dir):
            raise SystemExit("error: tokenizer dir %s not found (use --tokenizer-dir none to skip)" % a.tokenizer_dir)
        for fn in TOKENIZER_FILES:
            p = os.path.join(a.tokenizer_dir, fn)
            if os.path.exists(p):
                shutil.copyfile(p, os.path.join(out, fn))
                copied.append(fn)
    if not a.quiet:
        print("wrote %s in %.1f s%s" % (out, time.time() - prog.t0,
              "; copied " + ", ".join(copied) if copied else "; no tokenizer"), file=sys.stderr)
    return out


def write_config(a, dm, out):
    cfg = {"native": native_config, "legacy": legacy_config, "base": base_config}[a.layout](dm, a)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def dry_run(a, dm, items, n_params, total):
    """config.json + an index whose metadata lists every tensor's shape; no weights are written."""
    out = a.out_dir
    if os.path.exists(out) and os.listdir(out) and not a.force:
        raise SystemExit("error: %s exists and is not empty (use --force to overwrite)" % out)
    os.makedirs(out, exist_ok=True)
    shards = plan_shards(items, a.shard_size)
    m = len(shards)
    wm = {it[0]: "model-%05d-of-%05d.safetensors" % (k, m) for k, sh in enumerate(shards, 1) for it in sh}
    index = {"metadata": {"total_parameters": n_params, "total_size": total, "dry_run": True,
                          "shapes": {it[0]: list(it[1]) for it in items}},
             "weight_map": dict(sorted(wm.items()))}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    write_config(a, dm, out)
    if not a.quiet:
        print("dry run: %s layout, %d tensors, %s parameters, %.2f GB bf16 in %d shard(s) (not written) -> %s"
              % (a.layout, len(items), format(n_params, ","), total / 1e9, m, out), file=sys.stderr)
    return out


# ----------------------------------------------------------------------------------------------
# reading back (verify, selftest)

def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 100_000_000:
            raise ValueError("%s: header length %d is implausible" % (path, n))
        hdr = json.loads(f.read(n))
    return 8 + n, hdr


def read_tensor(path, data_start, info, limit=None):
    a, b = info["data_offsets"]
    if limit is not None:
        b = min(b, a + limit)
    with open(path, "rb") as f:
        f.seek(data_start + a)
        return f.read(b - a)


def bf16_to_floats(raw):
    out = bytearray(2 * len(raw))
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    f = array.array("f")
    f.frombytes(bytes(out))
    if sys.byteorder != "little":
        f.byteswap()
    return f


def load_dir(d):
    """name -> (file, data_start, info)"""
    files = sorted(fn for fn in os.listdir(d) if fn.endswith(".safetensors"))
    if not files:
        raise SystemExit("error: no .safetensors in %s" % d)
    tensors = {}
    for fn in files:
        p = os.path.join(d, fn)
        start, hdr = read_header(p)
        end = start
        for name, info in hdr.items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise SystemExit("error: %s stored twice" % name)
            tensors[name] = (p, start, info)
            end = max(end, start + info["data_offsets"][1])
        if os.path.getsize(p) != end:
            raise SystemExit("error: %s is %d bytes, header says %d" % (p, os.path.getsize(p), end))
    return tensors


def expected_from_config(cfg):
    """Expected {name: shape} and layout from a config.json written by this tool (either layout)."""
    base = "zaya_layers" in cfg
    legacy = "ffn_hidden_size" in cfg or base
    if base:
        ns = argparse.Namespace(
            hidden=cfg["hidden_size"], heads=cfg["cca_num_q_heads"][0],
            head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], experts=cfg["zaya_layers"][1],
            vocab=cfg["vocab_size"], cca_time0=2, cca_time1=2, layers=len(cfg["zaya_layers"]) // 2,
            kv_heads=cfg["num_query_groups_list"][0], moe_intermediate=cfg["ffn_hidden_size_list"][1] // 2,
            router_hidden=cfg["zaya_mlp_expansion"][1])
    else:
        ns = argparse.Namespace(
            hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"], head_dim=cfg["head_dim"],
            experts=cfg["num_experts"], vocab=cfg["vocab_size"], cca_time0=cfg["cca_time0"], cca_time1=cfg["cca_time1"],
            layers=cfg["num_hidden_layers"] // (2 if legacy else 1),
            kv_heads=cfg["num_query_groups"] if legacy else cfg["num_key_value_heads"],
            moe_intermediate=cfg["ffn_hidden_size"] // 2 if legacy else cfg["moe_intermediate_size"],
            router_hidden=cfg["zaya_mlp_expansion"] if legacy else cfg["router_hidden_size"])
    ns.layer_types, ns.sliding_window, ns.bos, ns.eos, ns.pad = "hybrid", None, 0, 0, 0
    ns.attention_bias, ns.lm_head_bias = bool(cfg.get("attention_bias")), bool(cfg.get("lm_head_bias"))
    dm = make_dims(ns)
    native = native_tensors(dm, 0.05)
    layout = "base" if base else "legacy" if legacy else "native"
    items = layout_tensors(native, layout, dm["L"])
    return layout, {it[0]: list(it[1]) for it in items}, sum(t.numel for t in native)


def verify(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    layout, want, n_params = expected_from_config(cfg)
    have = load_dir(d)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing or extra:
        raise SystemExit("error: %d missing (%s), %d unexpected (%s)" % (
            len(missing), ", ".join(missing[:3]), len(extra), ", ".join(extra[:3])))
    for name, shape in want.items():
        info = have[name][2]
        if info["shape"] != shape or info["dtype"] != "BF16":
            raise SystemExit("error: %s is %s %s, expected BF16 %s" % (name, info["dtype"], info["shape"], shape))
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        for name, fn in wm.items():
            if name not in have or os.path.basename(have[name][0]) != fn:
                raise SystemExit("error: index puts %s in %s" % (name, fn))
        if set(wm) != set(have):
            raise SystemExit("error: index and shards disagree")
    total = sum(2 * math.prod(s) for s in want.values())
    print("verified %s: %s layout, %d tensors, %s parameters, %.2f GB" % (
        d, layout, len(want), format(n_params, ","), total / 1e9))
    probe = ["model.embed_tokens.weight"] + [n for n in want if n.startswith("model.layers.0.")][:40]
    for name in probe:
        p, start, info = have[name]
        v = bf16_to_floats(read_tensor(p, start, info, limit=2 * 65536))
        mean = sum(v) / len(v)
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
        if not all(math.isfinite(x) for x in v):
            raise SystemExit("error: %s has non-finite values" % name)
        if name.endswith(("weight", "proj", "temp", "biases", "scale", "bias")) and len(v) > 1:
            print("  %-64s mean %+.4f std %.4f" % (name, mean, std))


def selftest():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--hidden", "96", "--layers", "3", "--heads", "6", "--kv-heads", "2", "--head-dim", "32",
                  "--experts", "3", "--moe-intermediate", "80", "--router-hidden", "24", "--vocab", "1000",
                  "--layer-types", "hybrid_sliding,hybrid", "--sliding-window", "5", "--seed", "11",
                  "--tokenizer-dir", "none", "--quiet"]
        nat, leg = os.path.join(tmp, "n"), os.path.join(tmp, "l")
        main([nat] + common)
        main([leg] + common + ["--layout", "legacy", "--shard-size", "200000"])
        main([os.path.join(tmp, "n2")] + common + ["--shard-size", "150000"])
        dm = make_dims(build_parser().parse_args(["x"] + common))
        native = native_tensors(dm, 0.05)
        hn, hl, hn2 = load_dir(nat), load_dir(leg), load_dir(os.path.join(tmp, "n2"))
        assert len(hn) == 4 + 32 * 3 - 1, len(hn)
        checked = 0
        for t in native:
            pn, sn, info = hn[t.name]
            raw = read_tensor(pn, sn, info)
            assert raw == read_tensor(*hn2[t.name]), "shard size changed " + t.name
            pieces = legacy_names(t, dm["L"])
            got = b"".join(read_tensor(*hl[name]) for name, _, _ in pieces)
            assert got == raw, "native and legacy differ: " + t.name
            checked += 1
        with open(os.path.join(leg, "config.json")) as f:
            lc = json.load(f)
        assert lc["swa_layers"] == [4, 0, 0, 0, 4, 0] and lc["num_hidden_layers"] == 6
        # value statistics of one big matrix and the skip bias
        p, s, info = hn["model.layers.0.mlp.experts.gate_up_proj"]
        v = bf16_to_floats(read_tensor(p, s, info))
        std = math.sqrt(sum(x * x for x in v) / len(v))
        assert abs(std - 1 / math.sqrt(96)) < 0.01, std
        bb = bf16_to_floats(read_tensor(*hn["model.layers.1.mlp.gate.balancing_biases"]))
        assert len(bb) == 4 and -0.31 < bb[3] < -0.04, list(bb)
        # determinism
        main([os.path.join(tmp, "n3")] + common)
        for fn in os.listdir(nat):
            with open(os.path.join(nat, fn), "rb") as f1, open(os.path.join(tmp, "n3", fn), "rb") as f2:
                assert f1.read() == f2.read(), fn
        for d in (nat, leg):
            verify(d)
    print("selftest ok: %d native tensors equal in both layouts and shardings, deterministic (%.2f s)"
          % (checked, time.time() - t0))


# ----------------------------------------------------------------------------------------------

def build_parser():
    here = os.path.dirname(os.path.abspath(__file__))
    default_tok = os.path.normpath(os.path.join(here, "..", "test", "fixtures", "tokenizer"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="defaults are ZAYA1-8B (docs/architecture.md section 2)")
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--layout", choices=("native", "legacy", "base"), default="native",
                   help="native (ZAYA1-8B), legacy (ZAYA1-8B-legacy: half-layers) or base (ZAYA1-base's "
                        "per-half-layer schema, legacy tensor names)")
    p.add_argument("--preset", choices=("8b", "74b"), default="8b",
                   help="defaults for the dimensions: ZAYA1-8B, or ZAYA1-74B-preview's reported shape (hidden 4096, "
                        "16/2 heads of 128, 24 experts x 4096, router 256, every other layer sliding with a window of "
                        "4097); --layers and any other flag still override")
    p.add_argument("--attention-bias", action="store_true", help="config attention_bias: q/k/v/o_proj biases")
    p.add_argument("--lm-head-bias", action="store_true", help="config lm_head_bias: a bias on the LM head")
    p.add_argument("--base-layernorm-epsilon", type=float, default=None,
                   help="--layout base: write layernorm_epsilon (the router norm's epsilon; the fork's default 1e-6)")
    p.add_argument("--dry-run", action="store_true",
                   help="write config.json and model.safetensors.index.json (with every tensor's shape in its metadata) "
                        "but no weights: a full-size layout checked in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=40, help="native layers (legacy writes twice as many half-layers)")
    p.add_argument("--heads", type=int, default=8, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--experts", type=int, default=16, help="real experts (the router has one more, skip, class)")
    p.add_argument("--moe-intermediate", type=int, default=2048)
    p.add_argument("--router-hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=262272)
    p.add_argument("--cca-time0", type=int, default=2)
    p.add_argument("--cca-time1", type=int, default=2)
    p.add_argument("--layer-types", default=HYBRID,
                   help="comma list of hybrid / hybrid_sliding (h / s), repeated over the layers")
    p.add_argument("--sliding-window", type=int, default=None, help="window incl. the current token")
    p.add_argument("--rope-theta", type=float, default=5000000.0)
    p.add_argument("--rope-theta-sliding", type=float, default=10000.0)
    p.add_argument("--partial-rotary", type=float, default=0.5)
    p.add_argument("--partial-rotary-sliding", type=float, default=None,
                   help="native layout: another partial_rotary_factor for the hybrid_sliding layers")
    p.add_argument("--max-position", type=int, default=131072)
    p.add_argument("--bos", type=int, default=2)
    p.add_argument("--eos", type=int, default=106)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--embed-std", type=float, default=0.05)
    p.add_argument("--skip-bias", type=float, default=None,
                   help="balancing bias of the skip class (default random in -0.30..-0.05; -1 = never skip)")
    p.add_argument("--shard-size", type=int, default=DEFAULT_SHARD, help="max bytes per shard (default 5e9)")
    p.add_argument("--single-file", action="store_true", help="one model.safetensors, no index")
    p.add_argument("--tokenizer-dir", default=default_tok, help="copy tokenizer files from here ('none' to skip)")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty OUT_DIR")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--verify", action="store_true", help="only re-read and check OUT_DIR")
    p.add_argument("--selftest", action="store_true", help="generate small checkpoints in a temp dir and check")
    return p


PRESETS = {   # ZAYA1-74B-preview as ports report it (no config.json of it is reachable from here)
    "74b": dict(hidden=4096, layers=60, heads=16, kv_heads=2, head_dim=128, experts=24, moe_intermediate=4096,
                router_hidden=256, vocab=262272, partial_rotary=0.5, layer_types="hybrid_sliding,hybrid",
                sliding_window=4097),
}


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.preset in PRESETS:          # the preset's values replace the defaults; explicit flags still win
        p.set_defaults(**PRESETS[a.preset])
        a = p.parse_args(argv)
    if a.selftest:
        return selftest()
    if not a.out_dir:
        raise SystemExit("error: OUT_DIR is required")
    if a.verify:
        return verify(a.out_dir)
    generate(a)


if __name__ == "__main__":
    main()
