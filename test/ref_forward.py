#!/usr/bin/env python3
"""ref_forward.py - an independent pure-Python ZAYA forward pass, for checking zaya.c on any dimensions.

    python3 test/ref_forward.py CKPT_DIR --ids 2,5,7 --out DIR [--skip-expert zero|passthrough]
                                [--logits all|none|P,P,...]

Written from docs/architecture.md (sections 2-3, 6a) and the upstream Hugging Face
modeling_zaya.py (and Zyphra's fork for the legacy and ZAYA1-base schemas), not from zaya.c. It
reads a hub checkpoint folder directly (native, legacy or ZAYA1-base config and tensor names;
attention_bias and lm_head_bias; any KV-head count; one model.safetensors or shards + index,
bf16/f16/f32 widened exactly) and runs the FULL-SEQUENCE forward the way HF does: the conv input is left-padded with K zero columns and
both convolutions run over the whole sequence, attention uses causal / sliding-window masks, the
delayed value half is shifted by one position. Arithmetic is in Python floats (doubles); only the
RoPE tables are rounded to float32 step by step, because HF builds them in float32 and a position
times an inverse frequency is where float32 rounding is largest.

Output: DIR/index.json + one NumPy 1.0 .npy per tensor (float32 / int32, token-major, file name =
tensor name with ':' replaced by '~'), names as in docs/compare.md.
--logits: `all` (default) writes `logits` [T, V]; `none` skips the LM head (it costs V*H multiply-adds
per position in pure Python); a list of positions writes `logits:rows` [n, V] for those positions.
Standard library only (Python 3.11).
"""
import argparse
import array
import json
import math
import os
import re
import struct
import sys
from operator import mul

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import compare  # noqa: E402  (the dump format's .npy writer)

FLT_EPS = 2.0 ** -23


def f32(x):
    """x rounded to the nearest float32 (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ----------------------------------------------------------------------------------------------
# safetensors -> {name: (shape, flat array of float32 values)}

def read_safetensors(path, out):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "BF16":                      # bf16 = the top 16 bits of a float32: exact widening
            wide = bytearray(2 * len(raw))
            wide[2::4] = raw[0::2]
            wide[3::4] = raw[1::2]
            vals = array.array("f", bytes(wide))
        elif dt == "F32":
            vals = array.array("f", raw)
        elif dt == "F16":
            vals = array.array("f", struct.unpack(f"<{len(raw) // 2}e", raw))
        else:
            raise SystemExit(f"{path}: tensor {name}: unsupported dtype {dt}")
        if sys.byteorder != "little":
            vals.byteswap()
        out[name] = (list(info["shape"]), vals)


def read_checkpoint_tensors(ckpt):
    tensors = {}
    index = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for s in shards:
            read_safetensors(os.path.join(ckpt, s), tensors)
    else:
        read_safetensors(os.path.join(ckpt, "model.safetensors"), tensors)
    return tensors


# ----------------------------------------------------------------------------------------------
# config (native or legacy schema) -> one plain dict

LEGACY_KEYS = ("cca", "num_query_groups", "ffn_hidden_size", "zaya_mlp_expansion", "norm_epsilon", "zaya_layers")


def read_config(ckpt, legacy):
    with open(os.path.join(ckpt, "config.json")) as f:
        c = json.load(f)
    H, nq = c["hidden_size"], c["num_attention_heads"]
    cfg = {"H": H, "nq": nq, "d": c.get("head_dim") or H // nq, "V": c["vocab_size"], "E": c.get("num_experts"),
           "t0": c.get("cca_time0", 2), "t1": c.get("cca_time1", 2)}
    if legacy and "zaya_layers" in c:            # ZAYA1-base schema (Zyphra fork, branch `zaya`)
        n = len(c["zaya_layers"])
        cfg["L"] = n // 2
        cfg["nq"] = c["cca_num_q_heads"][0]           # = num_attention_heads / 2 (the fork's views)
        cfg["d"] = H // nq                            # the fork's head_dim: hidden / num_attention_heads
        cfg["nkv"] = c["num_query_groups_list"][0]
        cfg["E"] = c["zaya_layers"][1]
        cfg["I"] = c["ffn_hidden_size_list"][1] // 2
        cfg["R"] = c["zaya_mlp_expansion"][1]
        cfg["t0"] = cfg["t1"] = 2                     # the fork's CCA defaults (config keys unused)
        cfg["eps"] = c.get("norm_epsilon", 1e-5)
        cfg["router_eps"] = c.get("layernorm_epsilon", 1e-6)   # the fork's ZayaRouter.rmsnorm_eda
        sw = c.get("sliding_window")
        cfg["types"] = ["hybrid_sliding" if sw else "hybrid"] * cfg["L"]
        cfg["window"] = sw
        r = (c.get("rope_theta", 10000.0), c.get("partial_rotary_factor", 0.5))
        cfg["rope"] = {"hybrid": r, "hybrid_sliding": r}
    elif legacy:                                 # architecture.md section 2.4, config mapping
        cfg["L"] = c["num_hidden_layers"] // 2
        cfg["nkv"] = c.get("num_query_groups") or c["num_key_value_heads"]
        cfg["I"] = c["ffn_hidden_size"] // 2
        cfg["R"] = c["zaya_mlp_expansion"]
        cfg["eps"] = c.get("norm_epsilon", 1e-5)
        swa = c.get("swa_layers") or [0] * c["num_hidden_layers"]
        cfg["types"] = ["hybrid" if w == 0 else "hybrid_sliding" for w in swa[::2]]
        cfg["window"] = max(swa) + 1 if any(swa) else None
        prf = c.get("partial_rotary_factor", 0.5)      # the fork's ZayaConfig defaults
        cfg["rope"] = {"hybrid": (c.get("rope_theta", 5000000.0), prf),
                       "hybrid_sliding": (c.get("swa_rotary_base") or 10000.0, prf)}
    else:
        cfg["L"] = c["num_hidden_layers"]
        cfg["nkv"] = c["num_key_value_heads"]
        cfg["I"] = c["moe_intermediate_size"]
        cfg["R"] = c["router_hidden_size"]
        cfg["eps"] = c.get("rms_norm_eps", 1e-5)
        cfg["types"] = list(c.get("layer_types") or ["hybrid"] * cfg["L"])
        cfg["window"] = c.get("sliding_window")
        rp = c.get("rope_parameters") or {}
        cfg["rope"] = {}
        for t in set(cfg["types"]):
            p = rp.get(t) if isinstance(rp.get(t), dict) else {}
            if p.get("rope_type", "default") != "default":
                raise SystemExit(f"rope_type {p['rope_type']} is not supported")
            cfg["rope"][t] = (p.get("rope_theta", c.get("rope_theta", 10000.0)),
                              p.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
    cfg.setdefault("router_eps", cfg["eps"])
    cfg["attention_bias"] = bool(c.get("attention_bias", False))   # the fork too: attention_bias, not add_bias_linear
    cfg["lm_head_bias"] = bool(c.get("lm_head_bias", False))
    if c.get("num_experts_per_tok", c.get("moe_router_topk", 1)) != 1:
        raise SystemExit("only top-1 routing is supported")
    if "hybrid_sliding" in cfg["types"] and not cfg["window"]:
        raise SystemExit("hybrid_sliding layers need sliding_window")
    return cfg


# ----------------------------------------------------------------------------------------------
# legacy tensor names -> native names (architecture.md section 2.4; experts are stacked)

LEGACY_ATTN = {  # half-layer 2i, suffix -> native suffix of layer i
    "input_norm.weight": "input_layernorm.weight",
    "self_attn.qkv.linear_q.weight": "self_attn.qkv_proj.q_proj.weight",
    "self_attn.qkv.linear_k.weight": "self_attn.qkv_proj.k_proj.weight",
    "self_attn.qkv.val_proj1.weight": "self_attn.qkv_proj.v_proj_current.weight",
    "self_attn.qkv.val_proj2.weight": "self_attn.qkv_proj.v_proj_delayed.weight",
    "self_attn.qkv.val_proj1.bias": "self_attn.qkv_proj.v_proj_current.bias",
    "self_attn.qkv.linear_q.bias": "self_attn.qkv_proj.q_proj.bias",
    "self_attn.qkv.linear_k.bias": "self_attn.qkv_proj.k_proj.bias",
    "self_attn.o_proj.bias": "self_attn.o_proj.bias",
    "self_attn.qkv.val_proj2.bias": "self_attn.qkv_proj.v_proj_delayed.bias",
    "self_attn.qkv.conv_qk.0.weight": "self_attn.qkv_proj.conv_qk_depthwise.weight",
    "self_attn.qkv.conv_qk.0.bias": "self_attn.qkv_proj.conv_qk_depthwise.bias",
    "self_attn.qkv.conv_qk.1.weight": "self_attn.qkv_proj.conv_qk_grouped.weight",
    "self_attn.qkv.conv_qk.1.bias": "self_attn.qkv_proj.conv_qk_grouped.bias",
    "self_attn.qkv.temp": "self_attn.qk_norm.temp",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
}
LEGACY_MLP = {  # half-layer 2i+1
    "input_norm.weight": "post_attention_layernorm.weight",
    "zaya_block.router.down_proj.weight": "mlp.gate.down_proj.weight",
    "zaya_block.router.down_proj.bias": "mlp.gate.down_proj.bias",
    "zaya_block.router.router_states_scale": "mlp.gate.router_states_scale",
    "zaya_block.router.rmsnorm_eda.weight": "mlp.gate.router_mlp.norm.weight",
    "zaya_block.router.router_mlp.0.weight": "mlp.gate.router_mlp.fc1.weight",
    "zaya_block.router.router_mlp.0.bias": "mlp.gate.router_mlp.fc1.bias",
    "zaya_block.router.router_mlp.2.weight": "mlp.gate.router_mlp.fc2.weight",
    "zaya_block.router.router_mlp.2.bias": "mlp.gate.router_mlp.fc2.bias",
    "zaya_block.router.router_mlp.4.weight": "mlp.gate.router_mlp.out_proj.weight",
    "zaya_block.router.balancing_biases": "mlp.gate.balancing_biases",
}
RES4 = ("hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias")


def legacy_to_native(tensors, L):
    out, experts = {}, {}
    for name, (shape, vals) in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if name in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"):
            out[name] = (shape, vals)
        elif name == "model.final_norm.weight":
            out["model.norm.weight"] = (shape, vals)
        elif name.startswith("model.res_scale.") and name[16:] in RES4:
            out[f"model.layers.{L - 1}.post_mlp_residual_scale.{name[16:]}"] = (shape, vals)
        elif m:
            half, rest = int(m.group(1)), m.group(2)
            i = half // 2
            e = re.fullmatch(r"zaya_block\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight", rest)
            if rest.startswith("res_scale.") and rest[10:] in RES4:
                if half == 0:
                    out[f"model.input_{rest[10:]}"] = (shape, vals)
                elif half % 2 == 0:
                    out[f"model.layers.{i - 1}.post_mlp_residual_scale.{rest[10:]}"] = (shape, vals)
                else:
                    out[f"model.layers.{i}.post_attention_residual_scale.{rest[10:]}"] = (shape, vals)
            elif half % 2 == 0 and rest in LEGACY_ATTN:
                out[f"model.layers.{i}.{LEGACY_ATTN[rest]}"] = (shape, vals)
            elif half % 2 == 1 and rest in LEGACY_MLP:
                out[f"model.layers.{i}.{LEGACY_MLP[rest]}"] = (shape, vals)
            elif half % 2 == 1 and e:
                kind = "gate_up_proj" if e.group(2) == "1" else "down_proj"
                experts.setdefault(f"model.layers.{i}.mlp.experts.{kind}", {})[int(e.group(1))] = (shape, vals)
            else:
                raise SystemExit(f"unknown legacy tensor {name}")
        else:
            raise SystemExit(f"unknown legacy tensor {name}")
    for name, per in experts.items():            # stack experts 0..E-1 on a new first axis
        vals = array.array("f")
        for e in range(len(per)):
            vals.extend(per[e][1])
        out[name] = ([len(per)] + per[0][0], vals)
    return out


def load(ckpt):
    tensors = read_checkpoint_tensors(ckpt)
    legacy = any(".zaya_block." in n or ".self_attn.qkv.linear_q" in n or ".res_scale." in n
                 or n.startswith("model.final_norm.") for n in tensors)
    cfg = read_config(ckpt, legacy)
    if legacy:
        tensors = legacy_to_native(tensors, cfg["L"])
    cfg["layout"] = "legacy" if legacy else "native"
    return cfg, tensors


# ----------------------------------------------------------------------------------------------
# small math helpers on Python lists

def dot(a, b):
    return sum(map(mul, a, b))


class Weights:
    """Native-named tensors; `vec(name)` as a list, `mat(name)` as a list of row lists (cached)."""

    def __init__(self, tensors):
        self.t = tensors
        self.cache = {}

    def has(self, name):
        return name in self.t

    def shape(self, name):
        return self.t[name][0]

    def vec(self, name):
        if name not in self.cache:
            self.cache[name] = self.t[name][1].tolist()
        return self.cache[name]

    def mat(self, name, index=None):
        """Rows of a 2-D tensor, or of slice `index` of a 3-D one ([E, out, in] expert stacks)."""
        key = (name, index)
        if key not in self.cache:
            shape, vals = self.t[name]
            rows, cols = shape[-2], shape[-1]
            base = 0 if index is None else index * rows * cols
            self.cache[key] = [vals[base + r * cols: base + (r + 1) * cols].tolist() for r in range(rows)]
        return self.cache[key]


def linear(rows, x, bias=None):
    y = [dot(r, x) for r in rows]
    return y if bias is None else [a + b for a, b in zip(y, bias)]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [(v * r) * g for v, g in zip(x, w)]


def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def silu(x):
    return x / (1.0 + math.exp(-x)) if x > -700 else 0.0


def residual_scale(W, prefix, branch, residual):
    hs, hb = W.vec(prefix + ".hidden_states_scale"), W.vec(prefix + ".hidden_states_bias")
    rs, rb = W.vec(prefix + ".residual_scale"), W.vec(prefix + ".residual_bias")
    return [(a + b1) * s1 + (r + b2) * s2 for a, b1, s1, r, b2, s2 in zip(branch, hb, hs, residual, rb, rs)]


def rope_tables(T, theta, rot):
    """cos/sin [T][rot/2] built like HF in float32: inv_freq = 1/theta^(2j/rot), angle = p*inv_freq."""
    half = rot // 2
    inv = [f32(1.0 / f32(theta ** f32((2 * j) / rot))) for j in range(half)]
    cos = [[f32(math.cos(f32(p * f))) for f in inv] for p in range(T)]
    sin = [[f32(math.sin(f32(p * f))) for f in inv] for p in range(T)]
    return cos, sin


def rope(x, c, s):
    half = len(c)
    out = list(x)
    for j in range(half):
        a, b = x[j], x[j + half]
        out[j] = a * c[j] - b * s[j]
        out[j + half] = b * c[j] + a * s[j]
    return out


# ----------------------------------------------------------------------------------------------
# the forward pass (architecture.md section 3; HF ZayaModel.forward), whole sequence at once

def forward(cfg, W, ids, skip_mode, logit_positions, emit):
    """emit(name, nested list or list of ints, dtype) receives every tensor in execution order."""
    H, L, nq, nkv, d = cfg["H"], cfg["L"], cfg["nq"], cfg["nkv"], cfg["d"]
    E, eps, T, t0, t1 = cfg["E"], cfg["eps"], len(ids), cfg["t0"], cfg["t1"]
    g, C, K = nq // nkv, (nq + nkv) * d, (t0 - 1) + (t1 - 1)
    emb_shape, emb = W.t["model.embed_tokens.weight"]
    V = emb_shape[0]
    for t in ids:
        if not 0 <= t < V:
            raise SystemExit(f"token id {t} is outside the vocabulary (0..{V - 1})")

    # 3.1 embedding and input scaling
    x = [emb[t * H:(t + 1) * H].tolist() for t in ids]
    emit("model.embed_tokens", x)
    s_in, b_in = W.vec("model.input_hidden_states_scale"), W.vec("model.input_hidden_states_bias")
    r = [[(e + b) * s for e, b, s in zip(row, b_in, s_in)] for row in x]
    emit("model:input_scaled", r)

    router_prev = None
    for i in range(L):
        P = f"model.layers.{i}"
        A = P + ".self_attn.qkv_proj"
        # 3.2 input_layernorm
        h = [rmsnorm(row, W.vec(P + ".input_layernorm.weight"), eps) for row in r]
        emit(P + ".input_layernorm", h)

        # 3.3 q/k projections and the residual mix
        ab = cfg["attention_bias"]            # nn.Linear biases of q/k/v_current/v_delayed/o_proj
        qt = [linear(W.mat(A + ".q_proj.weight"), row, W.vec(A + ".q_proj.bias") if ab else None) for row in h]
        kt = [linear(W.mat(A + ".k_proj.weight"), row, W.vec(A + ".k_proj.bias") if ab else None) for row in h]
        emit(A + ".q_proj", qt)
        emit(A + ".k_proj", kt)
        q_res, k_res = [], []
        for t in range(T):
            qr = [[(qt[t][n * d + c] + kt[t][(n // g) * d + c]) * 0.5 for c in range(d)] for n in range(nq)]
            kr = [[sum(qr[j * g + m][c] for m in range(g)) / g for c in range(d)] for j in range(nkv)]
            q_res.append(qr)
            k_res.append(kr)
        emit(A + ":query_residual", q_res)
        emit(A + ":key_residual", k_res)

        # 3.4 causal convs: pad u = [q~ ; k~] with K zero columns, depthwise (t0) then grouped (t1)
        u = [[0.0] * C for _ in range(K)] + [qt[t] + kt[t] for t in range(T)]
        w0, b0 = W.vec(A + ".conv_qk_depthwise.weight"), W.vec(A + ".conv_qk_depthwise.bias")   # [C,1,t0]
        a = [[b0[c] + sum(w0[c * t0 + k] * u[s + k][c] for k in range(t0)) for c in range(C)]
             for s in range(T + t1 - 1)]
        w1, b1 = W.vec(A + ".conv_qk_grouped.weight"), W.vec(A + ".conv_qk_grouped.bias")        # [C,d,t1]
        w1k = [[[w1[(o * d + j) * t1 + k] for j in range(d)] for o in range(C)] for k in range(t1)]
        z = []
        for t in range(T):
            col = []
            for o in range(C):
                gs = (o // d) * d
                col.append(b1[o] + sum(dot(w1k[k][o], a[t + k][gs:gs + d]) for k in range(t1)))
            z.append(col)
        emit(A + ".conv_qk_depthwise", a[t1 - 1:])
        emit(A + ".conv_qk_grouped", z)

        # 3.5 q/k assembly
        query = [[[z[t][n * d + c] + q_res[t][n][c] for c in range(d)] for n in range(nq)] for t in range(T)]
        key = [[[z[t][nq * d + j * d + c] + k_res[t][j][c] for c in range(d)] for j in range(nkv)] for t in range(T)]
        emit(A + ":query", query)
        emit(A + ":key", key)

        # 3.6 value: [v_proj_current(h_t) ; v_proj_delayed(h_{t-1})], position 0 uses v_proj_delayed(0) (its
        # bias); the concatenation (current first) is viewed as nkv heads, so with odd nkv a head straddles both
        vcb = W.vec(A + ".v_proj_current.bias") if ab else None
        vdb = W.vec(A + ".v_proj_delayed.bias") if ab else None
        vc = [linear(W.mat(A + ".v_proj_current.weight"), row, vcb) for row in h]
        vd = [linear(W.mat(A + ".v_proj_delayed.weight"), row, vdb) for row in h]
        emit(A + ".v_proj_current", vc)
        emit(A + ".v_proj_delayed", vd)
        vd0 = list(vdb) if vdb is not None else [0.0] * (nkv * d // 2)
        value = []
        for t in range(T):
            flat = vc[t] + (vd[t - 1] if t > 0 else vd0)
            value.append([flat[j * d:(j + 1) * d] for j in range(nkv)])
        emit(A + ":value", value)

        # 3.7 qk-norm: every head to norm sqrt(d) (clamped at FLT_EPSILON), keys times temp
        temp = W.vec(P + ".self_attn.qk_norm.temp")
        sd = math.sqrt(d)

        def l2n(v, f=1.0):
            s = sd / max(math.sqrt(sum(x * x for x in v)), FLT_EPS)
            return [(x * s) * f for x in v]
        qn = [[l2n(query[t][n]) for n in range(nq)] for t in range(T)]
        kn = [[l2n(key[t][j], temp[j]) for j in range(nkv)] for t in range(T)]
        emit(P + ".self_attn.qk_norm:query", qn)
        emit(P + ".self_attn.qk_norm:key", kn)

        # 3.8 partial NeoX RoPE with this layer type's theta and rotary fraction
        ltype = cfg["types"][i]
        theta, factor = cfg["rope"][ltype]
        rot = int(d * factor)
        cos, sin = rope_tables(T, theta, rot)
        qr_ = [[rope(qn[t][n][:rot], cos[t], sin[t]) + qn[t][n][rot:] for n in range(nq)] for t in range(T)]
        kr_ = [[rope(kn[t][j][:rot], cos[t], sin[t]) + kn[t][j][rot:] for j in range(nkv)] for t in range(T)]
        emit(P + ".self_attn:query_after_rope", qr_)
        emit(P + ".self_attn:key_after_rope", kr_)

        # 3.9 attention: GQA, causal or sliding window (w keys including the current one), scale d^-0.5
        w = cfg["window"] if ltype == "hybrid_sliding" else None
        scale = d ** -0.5
        att = []
        for t in range(T):
            lo = max(0, t - w + 1) if w else 0
            out = []
            for n in range(nq):
                j = n // g
                p = softmax([dot(qr_[t][n], kr_[s][j]) * scale for s in range(lo, t + 1)])
                acc = [0.0] * d
                for pk, s in zip(p, range(lo, t + 1)):
                    vs = value[s][j]
                    acc = [ac + pk * v for ac, v in zip(acc, vs)]
                out.extend(acc)
            att.append(out)
        emit(P + ".self_attn:attn_output", att)
        # decoding state after this prompt (section 4): raw conv input of the last K steps (zero-padded
        # in front), the last delayed value, and for full-attention layers the whole K/V cache
        emit(A + ":conv_state", u[-K:])
        emit(A + ":delayed_value_state", vd[T - 1])
        if w is None:
            emit(P + ".self_attn:key_cache", [sum(kr_[t], []) for t in range(T)])
            emit(P + ".self_attn:value_cache", [sum(value[t], []) for t in range(T)])

        # 3.10 o_proj, 3.11 residual merge
        o = [linear(W.mat(P + ".self_attn.o_proj.weight"), row, W.vec(P + ".self_attn.o_proj.bias") if ab else None)
             for row in att]
        emit(P + ".self_attn.o_proj", o)
        r1 = [residual_scale(W, P + ".post_attention_residual_scale", o[t], r[t]) for t in range(T)]
        emit(P + ".post_attention_residual_scale", r1)

        # 3.12 post_attention_layernorm
        h2 = [rmsnorm(row, W.vec(P + ".post_attention_layernorm.weight"), eps) for row in r1]
        emit(P + ".post_attention_layernorm", h2)

        # 3.13 router: down_proj, EDA (layers >= 1), RMSNorm, MLP, softmax, biased top-1
        G = P + ".mlp.gate"
        rho = [linear(W.mat(G + ".down_proj.weight"), row, W.vec(G + ".down_proj.bias")) for row in h2]
        emit(G + ".down_proj", rho)
        if i > 0:
            sc = W.vec(G + ".router_states_scale")
            rho = [[x + p * s for x, p, s in zip(rho[t], router_prev[t], sc)] for t in range(T)]
        router_prev = rho
        emit(G + ":router_state", rho)
        M = G + ".router_mlp"
        zn = [rmsnorm(row, W.vec(M + ".norm.weight"), cfg["router_eps"]) for row in rho]
        f1 = [linear(W.mat(M + ".fc1.weight"), row, W.vec(M + ".fc1.bias")) for row in zn]
        f2 = [linear(W.mat(M + ".fc2.weight"), [gelu(v) for v in row], W.vec(M + ".fc2.bias")) for row in f1]
        logits = [linear(W.mat(M + ".out_proj.weight"), [gelu(v) for v in row]) for row in f2]
        emit(M + ".norm", zn)
        emit(M + ".fc1", f1)            # module outputs: the linear layers, before GELU
        emit(M + ".fc2", f2)
        emit(M, logits)
        probs = [softmax(row) for row in logits]
        emit(G + ":router_probs", probs)
        beta = W.vec(G + ".balancing_biases")
        scores = [[p + b for p, b in zip(row, beta)] for row in probs]
        emit(G + ":router_scores", scores)
        idx = [row.index(max(row)) for row in scores]            # first maximum = lowest index on ties
        emit(G + ".router_indices", idx, "int32")
        margin = [sorted(row)[-1] - sorted(row)[-2] for row in scores]
        emit(G + ":router_margin", margin)

        # 3.14 experts (SwiGLU, gate rows first), weighted by the unbiased probability; skip class E
        I = cfg["I"]
        y = []
        for t in range(T):
            e = idx[t]
            if e < E:
                gu = linear(W.mat(P + ".mlp.experts.gate_up_proj", e), h2[t])
                m = linear(W.mat(P + ".mlp.experts.down_proj", e), [silu(gv) * uv for gv, uv in zip(gu[:I], gu[I:])])
                y.append([probs[t][e] * v for v in m])
            elif skip_mode == "passthrough":
                y.append([probs[t][E] * v for v in h2[t]])
            else:
                y.append([0.0] * H)
        emit(P + ".mlp.experts", y)

        # 3.15 residual merge: the layer output
        r = [residual_scale(W, P + ".post_mlp_residual_scale", y[t], r1[t]) for t in range(T)]
        emit(P + ".post_mlp_residual_scale", r)

    # 3.16 final norm and tied LM head
    fn = [rmsnorm(row, W.vec("model.norm.weight"), eps) for row in r]
    emit("model.norm", fn)
    if logit_positions is not None:
        head = W.t["lm_head.weight"][1] if "lm_head.weight" in W.t else emb
        hb = W.vec("lm_head.bias") if cfg["lm_head_bias"] else [0.0] * V
        rows = []
        for t in logit_positions:
            f = fn[t]
            rows.append([dot(head[v * H:(v + 1) * H], f) + hb[v] for v in range(V)])
        emit("logits" if logit_positions == list(range(T)) else "logits:rows", rows)


# ----------------------------------------------------------------------------------------------
# dump writer: NumPy 1.0 files + index.json

def flatten(x):
    shape, flat = [], []
    probe = x
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None

    def walk(v):
        if isinstance(v, list):
            for e in v:
                walk(e)
        else:
            flat.append(v)
    walk(x)
    return shape, flat


def write_npy(path, shape, values, dtype):
    a = array.array("f" if dtype == "float32" else "i", values)
    compare.write_npy(path, shape, a)     # the dump format's writer (compare.py)
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    ap.add_argument("--ids", required=True, help="comma-separated prompt ids")
    ap.add_argument("--out", required=True, help="dump folder")
    ap.add_argument("--skip-expert", choices=("zero", "passthrough"), default="zero")
    ap.add_argument("--logits", default="all", help="all | none | comma-separated positions")
    args = ap.parse_args()
    ids = [int(v) for v in args.ids.split(",") if v.strip()]
    if not ids:
        raise SystemExit("--ids: no ids")
    T = len(ids)
    if args.logits == "all":
        lp = list(range(T))
    elif args.logits == "none":
        lp = None
    else:
        lp = [int(v) for v in args.logits.split(",")]
        if any(not 0 <= p < T for p in lp):
            raise SystemExit("--logits: position out of range")

    cfg, tensors = load(args.ckpt)
    W = Weights(tensors)
    os.makedirs(args.out, exist_ok=True)
    entries = []

    def emit(name, x, dtype="float32"):
        shape, flat = flatten(x)
        fname = name.replace(":", "~") + ".npy"
        a = write_npy(os.path.join(args.out, fname), shape, flat, dtype)
        vals = a.tolist()
        fin = [v for v in vals if math.isfinite(v)]
        stats = {"min": min(fin) if fin else 0.0, "max": max(fin) if fin else 0.0,
                 "mean": sum(fin) / len(fin) if fin else 0.0,
                 "rms": math.sqrt(sum(v * v for v in fin) / len(fin)) if fin else 0.0,
                 "nan": sum(1 for v in vals if v != v), "inf": sum(1 for v in vals if v in (math.inf, -math.inf))}
        entries.append({"name": name, "file": fname, "shape": shape, "dtype": dtype, "order": len(entries),
                        "stats": stats})

    forward(cfg, W, ids, args.skip_expert, lp, emit)
    index = {"format_version": 1,
             "producer": {"program": "test/ref_forward.py"},
             "model": {"path": os.path.abspath(args.ckpt), "source_layout": cfg["layout"]},
             "weight_format": {"dtype": "fp32", "group_size": 0},
             "skip_expert": args.skip_expert,
             "tokens": ids,
             "tensors": entries}
    if lp is not None and lp != list(range(T)):
        index["logits_positions"] = lp
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


if __name__ == "__main__":
    main()
