"""Tensor names (HF module paths), their execution order, their kinds and tolerances (docs/compare.md).

Standard library only: tools that write dumps (tools/fixture_to_dump.py, tools/golden_hf.py) import
these lists without numpy.

Tolerances (the same table is in docs/compare.md). Every tensor is compared row by row, one row per
position (token-major, first axis). For a row a_t (test) and b_t (reference) with n values:

  rowerr_t = ||a_t - b_t||_2 / max(||b_t||_2, FLOOR_REL * rowrms(b), ATOL * sqrt(n))

where rowrms(b) = ||b||_2 / sqrt(T) is the typical row norm of the reference tensor, so a row that is
tiny compared with its neighbours (or exactly zero) is judged against a floor, not against itself.

  | kind                  | names                                     | fp32/bf16 vs fp32       | int8 vs fp32           |
  | --------------------- | ----------------------------------------- | ----------------------- | ---------------------- |
  | activation (default)  | every float tensor not listed below       | rowerr <= 1e-5          | cosine (see below)     |
  | attention path        | `self_attn:*`, `qk_norm:*`, `o_proj`,     | rowerr <= 3e-5          | cosine                 |
  |                       | the K/V caches                            |                         |                        |
  | router                | `mlp.gate.*`, `mlp.gate:*` floats         | rowerr <= 3e-5          | cosine                 |
  | logits                | `logits` (full or `logits:topK_values`)   | max abs <= 1e-3 per row | cosine; against a top-k|
  |                       |                                           |                         | reference max abs 0.1  |
  | integer               | `router_indices`, any int32 tensor        | exact                   | exact                  |
  | vision (ZAYA1-VL)     | `model.visual*`: rows are patches (or     | rowerr <= 1e-5          | cosine                 |
  |                       | merged patches), not positions            |                         |                        |

int8 "cosine": the whole tensor's cosine >= COS_INT8 = 0.999 and every row's >= COS_INT8_ROW = 0.995
(when the tensor is below 0.999, its rows below 0.999 are the bad ones); rows explained by a routing
flip are left out of the tensor cosine.
FLOOR_REL = 0.1 and ATOL = 1e-6 for every float kind. `--tol-scale X` multiplies every rtol, ATOL, the
logits max abs and (1 - cosine gate) by X. A router_indices disagreement is a routing flip: the
reference's top-1 margin (best minus second-best biased router score, from its `:router_scores` or
`:router_margin`) below NEAR_TIE = 0.02 makes it a near-tie (allowed; downstream rows of that position,
and of later positions in later layers, are reported as "after routing flip (near-tie)"), otherwise BUG.
NMSE here is sum((a-b)^2) / sum(b^2) (= relative L2 squared); llama.cpp's scripts report MSE / Var(b).
"""
import re

# ------------------------------------------------------------------------------------------------
# Tolerances (the table above; docs/compare.md)

FLOOR_REL = 0.1     # a row's error is relative to at least 10% of the tensor's typical row norm
ATOL = 1e-6         # ... and to at least ATOL * sqrt(n) (all-zero tensors)
NEAR_TIE = 0.02     # routing flips below this reference margin are near-ties
COS_INT8 = 0.999    # int8 weights vs fp32: minimum cosine of the whole tensor ...
COS_INT8_ROW = 0.995  # ... and of every row (position)
LOGITS_ATOL = 1e-3  # fp32: max |a-b| per logits row
LOGITS_TOPK_ATOL_INT8 = 0.1  # int8 vs a top-k-only reference: max |a-b| over the reference's top-k

# (kind, regex on the name, rtol for fp32 vs fp32); the first match wins
KINDS = [
    ("vision", re.compile(r"^model\.visual([.:]|$)"), 1e-5),
    ("attention", re.compile(r"(self_attn:|qk_norm:|self_attn\.o_proj$)"), 3e-5),
    ("router", re.compile(r"\.mlp\.gate[.:]"), 3e-5),
    ("activation", re.compile(r""), 1e-5),
]
STATE_SUFFIXES = (":conv_state", ":delayed_value_state", ":key_cache", ":value_cache")
LAYER_RE = re.compile(r"^model\.layers\.(\d+)[.:]")
TOPK_RE = re.compile(r"^logits:top(\d+)_(ids|values)$")

# ------------------------------------------------------------------------------------------------
# Tensor names in execution order (docs/compare.md). Writers use these lists; compare.py itself
# follows the order of the reference's index.json.

GLOBAL_FIRST = ["model.embed_tokens", "model:input_scaled"]
LAYER_TENSORS = [
    "input_layernorm",
    "self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj",
    "self_attn.qkv_proj.conv_qk_depthwise", "self_attn.qkv_proj.conv_qk_grouped",
    "self_attn.qkv_proj:query_residual", "self_attn.qkv_proj:key_residual",
    "self_attn.qkv_proj:query", "self_attn.qkv_proj:key",
    "self_attn.qkv_proj.v_proj_current", "self_attn.qkv_proj.v_proj_delayed", "self_attn.qkv_proj:value",
    "self_attn.qk_norm:query", "self_attn.qk_norm:key",
    "self_attn:query_after_rope", "self_attn:key_after_rope", "self_attn:attn_output",
    "self_attn.o_proj", "post_attention_residual_scale", "post_attention_layernorm",
    "mlp.gate.down_proj", "mlp.gate:router_state", "mlp.gate.router_mlp.norm",
    "mlp.gate.router_mlp.fc1", "mlp.gate.router_mlp.act_fn:fc1", "mlp.gate.router_mlp.fc2",
    "mlp.gate.router_mlp.act_fn:fc2", "mlp.gate.router_mlp",
    "mlp.gate:router_probs", "mlp.gate:router_scores", "mlp.gate:router_margin",
    "mlp.gate.router_indices", "mlp.gate:router_weight", "mlp.experts", "post_mlp_residual_scale",
]
GLOBAL_LAST = ["model.norm", "logits"]
# ZAYA1-VL: the vision tower (HF Zaya1VLVisionModel, model.visual), before the decoder. Its tensors are
# [rows, cols]: patch rows (patch_embed in image order, the blocks and merger.ln_q in window order), merged
# patch rows (the merger, in window order; model.visual, the image features, in image order), the rotary
# table's positions; they run before every decoder position.
VISION_FIRST = ["model.visual.patch_embed", "model.visual.rotary_pos_emb"]
VISION_BLOCK = ["norm1", "attn.qkv", "attn", "norm2", "mlp.gate_proj", "mlp.up_proj", "mlp", ""]
VISION_LAST = ["model.visual.merger.ln_q", "model.visual.merger.mlp.0", "model.visual.merger.mlp.1",
               "model.visual.merger", "model.visual"]
LAYER_STATE = ["self_attn.qkv_proj:conv_state", "self_attn.qkv_proj:delayed_value_state",
               "self_attn:key_cache", "self_attn:value_cache"]
LAYER_OUTPUT = "post_mlp_residual_scale"

# Each tap's inputs inside a layer (docs/compare.md §2; "" = the layer's input, which the replay takes from the port)
DEPS = {
    "input_layernorm": [""], "self_attn.qkv_proj.q_proj": ["input_layernorm"], "self_attn.qkv_proj.k_proj": ["input_layernorm"],
    "self_attn.qkv_proj.conv_qk_depthwise": ["self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj"],
    "self_attn.qkv_proj.conv_qk_grouped": ["self_attn.qkv_proj.conv_qk_depthwise"],
    "self_attn.qkv_proj:query_residual": ["self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj"],
    "self_attn.qkv_proj:key_residual": ["self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj"],
    "self_attn.qkv_proj:query": ["self_attn.qkv_proj.conv_qk_grouped", "self_attn.qkv_proj:query_residual"],
    "self_attn.qkv_proj:key": ["self_attn.qkv_proj.conv_qk_grouped", "self_attn.qkv_proj:key_residual"],
    "self_attn.qkv_proj.v_proj_current": ["input_layernorm"], "self_attn.qkv_proj.v_proj_delayed": ["input_layernorm"],
    "self_attn.qkv_proj:value": ["self_attn.qkv_proj.v_proj_current", "self_attn.qkv_proj.v_proj_delayed"],
    "self_attn.qk_norm:query": ["self_attn.qkv_proj:query"], "self_attn.qk_norm:key": ["self_attn.qkv_proj:key"],
    "self_attn:query_after_rope": ["self_attn.qk_norm:query"], "self_attn:key_after_rope": ["self_attn.qk_norm:key"],
    "self_attn:attn_output": ["self_attn:query_after_rope", "self_attn:key_after_rope", "self_attn.qkv_proj:value"],
    "self_attn.o_proj": ["self_attn:attn_output"], "post_attention_residual_scale": ["self_attn.o_proj", ""],
    "post_attention_layernorm": ["post_attention_residual_scale"], "mlp.gate.down_proj": ["post_attention_layernorm"],
    "mlp.gate:router_state": ["mlp.gate.down_proj"], "mlp.gate.router_mlp.norm": ["mlp.gate:router_state"],
    "mlp.gate.router_mlp.fc1": ["mlp.gate.router_mlp.norm"],
    "mlp.gate.router_mlp.act_fn:fc1": ["mlp.gate.router_mlp.fc1"], "mlp.gate.router_mlp.fc2": ["mlp.gate.router_mlp.act_fn:fc1"],
    "mlp.gate.router_mlp.act_fn:fc2": ["mlp.gate.router_mlp.fc2"], "mlp.gate.router_mlp": ["mlp.gate.router_mlp.act_fn:fc2"], "mlp.gate:router_probs": ["mlp.gate.router_mlp"],
    "mlp.gate:router_scores": ["mlp.gate:router_probs"], "mlp.gate:router_weight": ["mlp.gate:router_probs"],
    "mlp.experts": ["post_attention_layernorm", "mlp.gate:router_weight"],
    "post_mlp_residual_scale": ["mlp.experts", "post_attention_residual_scale"],
}

# ZAYA1-VL: what a decoder step adds at image positions that no tap shows alone (zaya.c and the official code tap
# q_proj, k_proj, v_proj_*, o_proj before their LoRA): the first tap each reaches (docs/architecture.md §V.9-10)
VL_STEPS = {
    "self_attn.qkv_proj.conv_qk_depthwise": "the q_proj / k_proj vision LoRA (B (A h), added to u = [q~ ; k~] before "
                                            "the convolutions)",
    "self_attn.qkv_proj:query_residual": "the q_proj / k_proj vision LoRA (added to u before the residual mix)",
    "self_attn.qkv_proj:key_residual": "the q_proj / k_proj vision LoRA (added to u before the residual mix)",
    "self_attn.qkv_proj:value": "the v_proj_current / v_proj_delayed vision LoRA (added before the delay)",
    "self_attn:attn_output": "the bidirectional image mask (an image position attends to every image position)",
    "post_attention_residual_scale": "o_proj's vision LoRA (o_lora_b (o_lora_a attn_output), added to o_proj's "
                                     "output)",
    "mlp.experts": "each expert's vision LoRA (lora_gate_up_proj, lora_down_proj)",
}


def vision_order(depth):
    """Every vision tower tensor zaya.c's --dump --image writes for a tower of `depth` blocks, in execution order."""
    return VISION_FIRST + [f"model.visual.blocks.{i}" + (f".{x}" if x else "") for i in range(depth)
                           for x in VISION_BLOCK] + VISION_LAST


def is_vision(name):
    """A ZAYA1-VL vision tower tensor (model.visual...): rows are patches, not positions."""
    return name == "model.visual" or name.startswith(("model.visual.", "model.visual:"))


def execution_order(n_layers, vision_depth=0):
    """Every tensor name a full dump of an n_layers model holds, in execution order (ZAYA1-VL with an image: the
    vision tower's vision_depth blocks first)."""
    names = vision_order(vision_depth) if vision_depth else []
    names += GLOBAL_FIRST
    for i in range(n_layers):
        names += [f"model.layers.{i}.{s}" for s in LAYER_TENSORS]
    names += GLOBAL_LAST
    for i in range(n_layers):
        names += [f"model.layers.{i}.{s}" for s in LAYER_STATE]
    return names


def kind_of(name):
    """(kind, rtol for fp32 vs fp32) of a tensor name."""
    if name == "logits" or TOPK_RE.match(name):
        return "logits", LOGITS_ATOL
    for kind, rx, rtol in KINDS:
        if rx.search(name):
            return kind, rtol
    return "activation", 1e-5


def layer_of(name):
    """The layer index of a model.layers.N tensor, else None."""
    m = LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def is_logits(name):
    return name == "logits" or bool(TOPK_RE.match(name))
