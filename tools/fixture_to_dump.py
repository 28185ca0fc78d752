#!/usr/bin/env python3
"""fixture_to_dump.py - convert a fixture golden folder (test/fixtures/golden, golden_zyphra, golden_bf16,
golden_bf16/decode) into a compare.py dump.

    python3 tools/fixture_to_dump.py FIXTURE_GOLDEN_DIR OUT_DIR
    python3 tools/fixture_to_dump.py test/fixtures/vl/image_a OUT_DIR      # a ZAYA1-VL golden (vl_to_dump)

FIXTURE_GOLDEN_DIR is `golden/` (the upstream transformers code: native module paths under taps/) or
`golden_zyphra/` (Zyphra's legacy fork: half-layer module paths, even 2i = attention of layer i, odd
2i+1 = MoE of layer i). The kind is detected from the tap file names, every dimension from the shapes.
`golden_bf16/` is the upstream code with the model in bfloat16 (detected from the data: its final_norm is
all bf16 values; the dump says "precision": "bf16" and the derived tensors below are rounded where the
bf16 code rounds, docs/bf16.md). `golden_bf16/decode/` (no taps, no tokens.npy: the parent's prompt) is
the same model token by token with its cache: per-layer outputs, router choices and margins, final norm
and top-16 logits only.
The output uses our names and shapes (docs/compare.md), skip_expert "zero" (upstream) or "passthrough"
(legacy), and the fixture's top-k logits as `logits:top{k}_ids` / `logits:top{k}_values`.

Facts about the fixture files this relies on (checked against the fixture README / index.json and,
where the README is silent or wrong, by the numbers):
- `hidden_states.npy` [L,T,H] = each layer's output -> `P.post_mlp_residual_scale`;
  `router_indices.npy` [L,T] = raw top-1 class (E = skip) -> `P.mlp.gate.router_indices` (the upstream
  taps' router_indices are after skip masking, so they are not used); `router_margin.npy` [L,T] ->
  `P.mlp.gate:router_margin`; `final_norm.npy` -> `model.norm`.
- Conv1d taps are [T_out, C] stored with fortran_order True (compare.read_npy reorders them); the
  depthwise conv's first T_out - T rows (a_{-1}) are dropped. The grouped output is checked against
  the one rebuilt from other taps (upstream: `qkv_proj.query/key` minus the residuals; legacy: the
  channel-first `qkv.conv_qk` Sequential output [C, T]); a mismatch is noted in index.json.
- The legacy `qkv.query` / `qkv.key` are AFTER qk-norm (and temp) -> `qk_norm:query/key`; the legacy
  `qkv.val_proj2` row t is v_proj_delayed(h_{t-1}) (shifted), so it cannot give our
  `v_proj_delayed` (this token's projection) for the last position and is not mapped.
- upstream `mlp.gate.router_probs` and legacy `router.router_probs` are [T]: the weight applied to the
  chosen expert (0 for a skip token upstream, P[E] in the legacy code) -> `P.mlp.gate:router_weight`.
- `model.layers.0.input_norm.input` (legacy) is the scaled embedding -> `model:input_scaled`; a legacy
  half-layer 2i+1's `input_norm.input` is layer i's `post_attention_residual_scale`.
Derived tensors (not tapped by the fixture; computed here from taps, marked "derived" in index.json):
`qkv_proj:query_residual/key_residual` (from q_proj, k_proj), legacy `qkv_proj:query/key` (grouped conv
+ residual), `mlp.gate:router_probs` (softmax of the router logits), `self_attn:query_after_rope/
key_after_rope` (qk-norm output and the fixture's RoPE cos/sin taps; needs the layer types from the
fixture's index.json one folder up).
"""
import array
import json
import math
import operator
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from compare import InputError, execution_order, read_npy, write_dump  # noqa: E402
from zaya_compare.names import vision_order  # noqa: E402


def f32(values):
    return array.array("f", values)


def bf16(values):
    """Rounds float32 values to bfloat16, round to nearest even (what torch's .to(torch.bfloat16) does),
    returned widened to float32. NaN stays NaN."""
    bits = array.array("I", array.array("f", values).tobytes())
    for i, b in enumerate(bits):
        if (b & 0x7F800000) == 0x7F800000 and b & 0x007FFFFF:
            bits[i] = 0x7FC00000                                     # a quiet NaN
        else:
            bits[i] = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return array.array("f", bits.tobytes())


def all_bf16(data):
    """Does every value of a float32 array have a zero low half (is it a bf16 value widened)?"""
    bits = array.array("I", array.array("f", data).tobytes())
    return all((b & 0xFFFF) == 0 for b in bits)


def rows_of(shape, data):
    n = math.prod(shape[1:]) if len(shape) > 1 else 1
    return [data[t * n:(t + 1) * n] for t in range(shape[0])]


def rel_err(a, b):
    num = math.fsum((x - y) ** 2 for x, y in zip(a, b))
    den = math.fsum(y * y for y in b)
    return math.sqrt(num / den) if den else math.sqrt(num)


class Converter:
    def __init__(self, src):
        self.src = src
        self.taps = os.path.join(src, "taps")
        if not os.path.isdir(src):
            raise InputError(f"{src} does not exist\n  hint: give test/fixtures/golden, golden_zyphra, golden_bf16 "
                             f"or golden_bf16/decode")
        self.out = {}           # name -> (shape, data, extra)
        self.notes = []
        self.unmapped = []
        self.used = set()
        # golden_bf16/decode/ has no tokens.npy and no taps/: the prompt and the tap layout are its parent's
        self.decode = not os.path.exists(os.path.join(src, "tokens.npy")) and \
            os.path.exists(os.path.join(src, "..", "tokens.npy"))
        parent = os.path.normpath(os.path.join(src, "..")) if self.decode else src
        self.tokens = list(read_npy(os.path.join(parent, "tokens.npy"))[1])
        self.T = len(self.tokens)
        hs = self.npy("hidden_states.npy", top=True)[0]
        if len(hs) != 3 or hs[1] != self.T:
            raise InputError(f"{src}/hidden_states.npy has shape {list(hs)}, expected [L, T={self.T}, H]")
        self.L = hs[0]
        ptaps = os.path.join(parent, "taps")
        if os.path.exists(os.path.join(ptaps, "model.layers.0.self_attn.qkv_proj.q_proj.npy")):
            self.layout = "native"
        elif os.path.exists(os.path.join(ptaps, "model.layers.0.self_attn.qkv.linear_q.npy")):
            self.layout = "legacy"
        else:
            raise InputError(f"{ptaps}: neither upstream (model.layers.0.self_attn.qkv_proj.q_proj.npy) nor "
                             f"legacy (model.layers.0.self_attn.qkv.linear_q.npy) taps found")
        # the fixture's index.json is one folder up (golden/, golden_bf16/) or two (golden_bf16/decode/)
        self.fixture_index, self.root = {}, os.path.dirname(os.path.abspath(parent))
        idx = os.path.join(self.root, "index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                self.fixture_index = json.load(f)
        # precision of the run, from the data: a bf16 model's final RMSNorm output is all bf16 values
        self.precision = "bf16" if all_bf16(self.npy("final_norm.npy", top=True)[1]) else "fp32"
        self.kind = os.path.basename(os.path.abspath(parent)) + ("/decode" if self.decode else "")

    # ---- reading ----
    def has(self, tap):
        return not self.decode and os.path.exists(os.path.join(self.taps, tap + ".npy"))

    def npy(self, name, top=False):
        path = os.path.join(self.src if top else self.taps, name if top else name + ".npy")
        if not top:
            self.used.add(name)
        return read_npy(path)

    def put(self, name, shape, data, source, derived=None):
        shape = tuple(shape)
        if math.prod(shape) != len(data):
            raise InputError(f"{source}: {len(data)} values cannot be {name} {list(shape)}")
        if shape and shape[0] != self.T and not name.startswith("logits"):
            raise InputError(f"{source}: first axis {shape[0]} is not the {self.T} positions")
        extra = {"source": source}
        if derived:
            extra["derived"] = derived
        self.out[name] = (shape, data if isinstance(data, array.array) else f32(data), extra)

    def tap(self, tap, name, reshape=None):
        """Maps one tap file unchanged (optionally viewed with another trailing shape)."""
        if not self.has(tap):
            self.notes.append(f"tap {tap} missing: {name} not written")
            return None
        shape, data = self.npy(tap)
        if reshape:
            shape = (shape[0],) + tuple(reshape)
        self.put(name, shape, data, f"taps/{tap}.npy")
        return shape, data

    # ---- the convolutions ----
    def conv_pair(self, P, dw_tap, gr_tap, expected):
        """Depthwise and grouped conv taps [T_out, C] -> [T, C] (the depthwise conv's first T_out - T rows,
        a_{-1}, dropped). `expected` = the grouped output rebuilt from other taps, [T, C] flat (a bf16 run:
        (residuals, query/key taps), checked as bf16(conv + residual) == tap): a mismatch is noted in
        index.json (it would mean a tap is not what this adapter thinks it is)."""
        if not (self.has(dw_tap) and self.has(gr_tap)):
            self.notes.append(f"{P}: conv taps missing")
            return None, None
        for tap, name in ((dw_tap, "conv_qk_depthwise"), (gr_tap, "conv_qk_grouped")):
            (Tout, C), d = self.npy(tap)
            drop = Tout - self.T
            self.put(f"{P}.self_attn.qkv_proj.{name}", (self.T, C), d[drop * C:],
                     f"taps/{tap}.npy" + (f" (first {drop} row(s), a_(-1), dropped)" if drop else ""))
        _, z, _ = self.out[f"{P}.self_attn.qkv_proj.conv_qk_grouped"]
        if expected is not None and self.precision == "bf16":
            # bf16: query = bf16(conv + residual) exactly, so check that forward (the difference
            # query - residual is not the conv output: the sum was rounded)
            got, want = bf16(map(operator.add, z, expected[0])), expected[1]
            n_bad = sum(1 for x, y in zip(got, want) if x != y)
            if n_bad:
                self.notes.append(f"{P}: bf16(grouped conv tap + residual) differs from the query/key taps in "
                                  f"{n_bad} of {len(want)} values")
        elif expected is not None:
            err = rel_err(z, expected)
            if err > 1e-5:
                self.notes.append(f"{P}: the grouped conv tap differs from the one rebuilt from other taps "
                                  f"(rel error {err:.3g})")
        return z, C

    # ---- derived tensors ----
    def residuals(self, P, q_tap, k_tap, nq, nkv, d):
        """query_residual[n] = (q[n] + k[n // g]) / 2; key_residual[j] = mean of its g query residuals."""
        _, q = self.npy(q_tap)
        _, k = self.npy(k_tap)
        g = nq // nkv
        qr, kr = [], []
        for t in range(self.T):
            qt, kt = q[t * nq * d:(t + 1) * nq * d], k[t * nkv * d:(t + 1) * nkv * d]
            heads = [[(qt[n * d + i] + kt[(n // g) * d + i]) for i in range(d)] for n in range(nq)]
            # bf16 run: q + k is a bf16 tensor (rounded), * 0.5 is exact, the mean is rounded once
            heads = [[x * 0.5 for x in (bf16(h) if self.precision == "bf16" else f32(h))] for h in heads]
            qr.extend(x for h in heads for x in h)
            for j in range(nkv):
                mean = [math.fsum(heads[j * g + r][i] for r in range(g)) / g for i in range(d)]
                kr.extend(bf16(mean) if self.precision == "bf16" else mean)
        how = f"from taps/{q_tap}.npy and taps/{k_tap}.npy"
        self.put(f"{P}.self_attn.qkv_proj:query_residual", (self.T, nq, d), qr,
                 how, "(q_proj[n] + k_proj[n // g]) / 2")
        self.put(f"{P}.self_attn.qkv_proj:key_residual", (self.T, nkv, d), kr,
                 how, "mean of the g query residuals of each KV head")
        return f32(qr), f32(kr)

    def layer_type(self, i):
        cfg = self.fixture_index.get("config", {})
        types = cfg.get("layer_types")
        return types[i] if isinstance(types, list) and i < len(types) else None

    def rope(self, P, i, nq, nkv, d):
        kind = self.layer_type(i)
        if kind is None:
            self.notes.append(f"{P}: layer type unknown (no config.layer_types in the fixture index.json): "
                              f"query/key_after_rope not derived")
            return
        if self.layout == "native":
            cos_tap, sin_tap = f"model.rotary_emb.{kind}.cos", f"model.rotary_emb.{kind}.sin"
        else:
            prefix = "model.swa_rotary_emb" if kind == "hybrid_sliding" else "model.rotary_emb"
            cos_tap, sin_tap = prefix + ".cos", prefix + ".sin"
        src = {"query": f"{P}.self_attn.qk_norm:query", "key": f"{P}.self_attn.qk_norm:key"}
        if not (self.has(cos_tap) and self.has(sin_tap) and all(n in self.out for n in src.values())):
            self.notes.append(f"{P}: rotary taps {cos_tap}/{sin_tap} or qk-norm outputs missing: rope not derived")
            return
        sc, cos = self.npy(cos_tap)
        _, sin = self.npy(sin_tap)
        rot = sc[1]
        half = rot // 2
        rnd = bf16 if self.precision == "bf16" else f32     # each product and the sum are rounded tensors
        for part, heads in (("query", nq), ("key", nkv)):
            _, x = self.out[src[part]][:2]
            out = array.array("f", x)
            for t in range(self.T):
                c, s = cos[t * rot:(t + 1) * rot], sin[t * rot:(t + 1) * rot]
                for h in range(heads):
                    base = (t * heads + h) * d
                    v = x[base:base + rot]
                    rh = [-v[j + half] for j in range(half)] + [v[j] for j in range(half)]
                    a = rnd(v[j] * c[j] for j in range(rot))          # q * cos, rounded like torch
                    b = rnd(rh[j] * s[j] for j in range(rot))         # rotate_half(q) * sin
                    out[base:base + rot] = rnd(a[j] + b[j] for j in range(rot))
            self.put(f"{P}.self_attn:{part}_after_rope", (self.T, heads, d), out,
                     f"qk_norm:{part} and taps/{cos_tap}.npy, {sin_tap}.npy",
                     f"x*cos + rotate_half(x)*sin on the first {rot} dims (layer type {kind})")

    def softmax_probs(self, P, logits_name):
        shape, data, _ = self.out[logits_name]
        n = shape[1]
        probs = []
        for t in range(shape[0]):
            row = data[t * n:(t + 1) * n]
            m = max(row)
            e = [math.exp(v - m) for v in row]
            s = math.fsum(e)
            p = [v / s for v in e]
            probs.extend(bf16(p) if self.precision == "bf16" else p)    # bf16: fp32 inside, rounded once
        self.put(f"{P}.mlp.gate:router_probs", shape, probs, logits_name, "softmax of the router logits")

    # ---- the two layouts ----
    def convert(self):
        T = self.T
        _, ri = self.npy("router_indices.npy", top=True)
        _, rm = self.npy("router_margin.npy", top=True)
        _, hs = self.npy("hidden_states.npy", top=True)
        sh = self.npy("hidden_states.npy", top=True)[0]
        H = sh[2]
        if not self.decode:
            self.tap("model.embed_tokens", "model.embed_tokens")
        if self.layout == "legacy" and not self.decode:
            self.tap("model.layers.0.input_norm.input", "model:input_scaled")
        for i in range(self.L):
            P = f"model.layers.{i}"
            if self.decode:
                pass                        # decode/: the per-layer outputs below only, no taps
            elif self.layout == "native":
                self.native_layer(i, P)
            else:
                self.legacy_layer(i, P)
            self.put(f"{P}.mlp.gate:router_margin", (T,), rm[i * T:(i + 1) * T], "router_margin.npy")
            self.put(f"{P}.mlp.gate.router_indices", (T,), array.array("i", ri[i * T:(i + 1) * T]),
                     "router_indices.npy (raw top-1, before skip masking)")
            self.put(f"{P}.post_mlp_residual_scale", (T, H), hs[i * T * H:(i + 1) * T * H], "hidden_states.npy")
        sf, fn = self.npy("final_norm.npy", top=True)
        self.put("model.norm", sf, fn, "final_norm.npy")
        names = sorted(n for n in os.listdir(self.src) if n.startswith("logits_top") and n.endswith("_ids.npy"))
        for n in names:
            k = n[len("logits_top"):-len("_ids.npy")]
            si, ids = self.npy(n, top=True)
            sv, vals = self.npy(f"logits_top{k}_values.npy", top=True)
            self.put(f"logits:top{k}_ids", si, ids, n)
            self.put(f"logits:top{k}_values", sv, vals, f"logits_top{k}_values.npy")
        for f in ([] if self.decode else sorted(os.listdir(self.taps))):
            if f.endswith(".npy") and f[:-4] not in self.used:
                self.unmapped.append(f[:-4])

    def native_layer(self, i, P):
        A = f"{P}.self_attn"
        self.tap(f"{P}.input_layernorm", f"{P}.input_layernorm")
        self.tap(f"{A}.qkv_proj.q_proj", f"{A}.qkv_proj.q_proj")
        self.tap(f"{A}.qkv_proj.k_proj", f"{A}.qkv_proj.k_proj")
        sq, q = self.tap(f"{A}.qkv_proj.query", f"{A}.qkv_proj:query") or ((), None)
        sk, k = self.tap(f"{A}.qkv_proj.key", f"{A}.qkv_proj:key") or ((), None)
        if len(sq) != 3 or len(sk) != 3:
            raise InputError(f"{self.taps}/{A}.qkv_proj.query.npy and .key.npy: expected [T, heads, head_dim] each, found "
                             f"{list(sq)} and {list(sk)}\n  hint: this folder's taps are not the fixture generator's "
                             f"(shared/fixtures' README gives their shapes)")
        nq, d, nkv = sq[1], sq[2], sk[1]
        qr, kr = self.residuals(P, f"{A}.qkv_proj.q_proj", f"{A}.qkv_proj.k_proj", nq, nkv, d)
        # grouped conv output = query - query_residual (q channels) and key - key_residual (k channels)
        want, res, qk = [], [], []
        for t in range(self.T):
            want += [q[t * nq * d + j] - qr[t * nq * d + j] for j in range(nq * d)]
            want += [k[t * nkv * d + j] - kr[t * nkv * d + j] for j in range(nkv * d)]
            res += qr[t * nq * d:(t + 1) * nq * d] + kr[t * nkv * d:(t + 1) * nkv * d]
            qk += q[t * nq * d:(t + 1) * nq * d] + k[t * nkv * d:(t + 1) * nkv * d]
        if self.precision == "bf16":
            want = (res, qk)
        self.conv_pair(P, f"{A}.qkv_proj.conv_qk_depthwise", f"{A}.qkv_proj.conv_qk_grouped", want)
        self.tap(f"{A}.qkv_proj.v_proj_current", f"{A}.qkv_proj.v_proj_current")
        self.tap(f"{A}.qkv_proj.v_proj_delayed", f"{A}.qkv_proj.v_proj_delayed")
        self.used.add(f"{A}.qkv_proj.v_proj_delayed.call1")   # v_proj_delayed(0): the t = -1 input
        self.tap(f"{A}.qkv_proj.value", f"{A}.qkv_proj:value")
        self.tap(f"{A}.qk_norm.query", f"{A}.qk_norm:query")
        self.tap(f"{A}.qk_norm.key", f"{A}.qk_norm:key")
        self.rope(P, i, nq, nkv, d)
        self.tap(f"{A}.o_proj.input", f"{A}:attn_output")
        self.tap(f"{A}.o_proj", f"{A}.o_proj")
        self.used.add(f"{A}.attn_output")                      # = o_proj output (the module's output)
        self.tap(f"{P}.post_attention_residual_scale", f"{P}.post_attention_residual_scale")
        self.tap(f"{P}.post_attention_layernorm", f"{P}.post_attention_layernorm")
        G = f"{P}.mlp.gate"
        self.tap(f"{G}.down_proj", f"{G}.down_proj")
        self.tap(f"{G}.router_states", f"{G}:router_state")
        self.used.update({f"{P}.mlp.router_states", f"{P}.router_states"})   # the same state, re-tapped
        self.tap(f"{G}.router_mlp.norm", f"{G}.router_mlp.norm")
        self.tap(f"{G}.router_mlp.fc1", f"{G}.router_mlp.fc1")
        self.tap(f"{G}.router_mlp.fc2", f"{G}.router_mlp.fc2")
        if self.tap(f"{G}.router_mlp", f"{G}.router_mlp"):
            self.softmax_probs(P, f"{G}.router_mlp")
        self.used.update({f"{G}.router_logits", f"{G}.router_mlp.out_proj"})  # = router_mlp output
        self.tap(f"{G}.router_probs", f"{G}:router_weight")
        self.tap(f"{P}.mlp.experts", f"{P}.mlp.experts")
        self.used.update({f"{P}.mlp.moe_output", f"{P}.hidden_states", f"{P}.post_mlp_residual_scale"})

    def legacy_layer(self, i, P):
        At, Mo = f"model.layers.{2 * i}", f"model.layers.{2 * i + 1}"
        A, Q = f"{P}.self_attn", f"{At}.self_attn.qkv"
        self.tap(f"{At}.input_norm", f"{P}.input_layernorm")
        sq, _ = self.tap(f"{Q}.linear_q", f"{A}.qkv_proj.q_proj")
        sk, _ = self.tap(f"{Q}.linear_k", f"{A}.qkv_proj.k_proj")
        sv, _ = self.npy(f"{Q}.value")
        # head_dim: value = [nkv * d] with nkv from the fixture config (num_key_value_heads); the grouped
        # conv has (nq + nkv) * d channels and q_proj nq * d.
        cfg = self.fixture_index.get("config", {})
        d = cfg.get("head_dim")
        nkv = cfg.get("num_key_value_heads")
        if not isinstance(d, int) or not isinstance(nkv, int):
            raise InputError("legacy taps are flat [T, heads*d]: the fixture index.json one folder up must give "
                             "config.head_dim and config.num_key_value_heads")
        nq = sq[1] // d
        if sk[1] != nkv * d or sv[1] != nkv * d:
            raise InputError(f"{Q}: k_proj {sk[1]} / value {sv[1]} columns are not num_key_value_heads*head_dim = {nkv * d}")
        qr, kr = self.residuals(P, f"{Q}.linear_q", f"{Q}.linear_k", nq, nkv, d)
        C = (nq + nkv) * d
        want = None
        if self.has(f"{Q}.conv_qk"):
            sc, cf = self.npy(f"{Q}.conv_qk")   # Sequential output, channel-first [C, T]
            if list(sc) == [C, self.T]:
                want = [cf[c * self.T + t] for t in range(self.T) for c in range(C)]
        z, _ = self.conv_pair(P, f"{Q}.conv_qk.0", f"{Q}.conv_qk.1", want)
        query = [z[t * C + j] + qr[t * nq * d + j] for t in range(self.T) for j in range(nq * d)]
        key = [z[t * C + nq * d + j] + kr[t * nkv * d + j] for t in range(self.T) for j in range(nkv * d)]
        how = "grouped conv + residual"
        self.put(f"{A}.qkv_proj:query", (self.T, nq, d), query, how, "conv_qk_grouped[:nq*d] + query_residual")
        self.put(f"{A}.qkv_proj:key", (self.T, nkv, d), key, how, "conv_qk_grouped[nq*d:] + key_residual")
        self.tap(f"{Q}.val_proj1", f"{A}.qkv_proj.v_proj_current")
        self.used.add(f"{Q}.val_proj2")
        self.notes.append(f"{Q}.val_proj2 not mapped: its row t is v_proj_delayed(h_(t-1)), ours is this token's "
                          f"projection (the last position is missing)")
        self.tap(f"{Q}.value", f"{A}.qkv_proj:value", (nkv, d))
        self.tap(f"{Q}.query", f"{A}.qk_norm:query", (nq, d))     # legacy qkv.query is after qk-norm
        self.tap(f"{Q}.key", f"{A}.qk_norm:key", (nkv, d))
        self.rope(P, i, nq, nkv, d)
        self.tap(f"{At}.self_attn.o_proj.input", f"{A}:attn_output")
        self.tap(f"{At}.self_attn.o_proj", f"{A}.o_proj")
        self.used.update({f"{At}.self_attn.attn_output", f"{At}.residual", f"{At}.input_norm.input",
                          f"{At}.res_scale.0", f"{At}.res_scale.1", f"{At}.router_states"})
        self.tap(f"{Mo}.input_norm.input", f"{P}.post_attention_residual_scale")
        self.tap(f"{Mo}.input_norm", f"{P}.post_attention_layernorm")
        G, R = f"{P}.mlp.gate", f"{Mo}.zaya_block.router"
        self.tap(f"{R}.down_proj", f"{G}.down_proj")
        self.tap(f"{R}.router_states", f"{G}:router_state")
        self.tap(f"{R}.rmsnorm_eda", f"{G}.router_mlp.norm")
        self.tap(f"{R}.router_mlp.0", f"{G}.router_mlp.fc1")
        self.tap(f"{R}.router_mlp.2", f"{G}.router_mlp.fc2")
        if self.tap(f"{R}.router_mlp", f"{G}.router_mlp"):
            self.softmax_probs(P, f"{G}.router_mlp")
        self.tap(f"{R}.router_probs", f"{G}:router_weight")
        self.tap(f"{Mo}.zaya_block.expert_output", f"{P}.mlp.experts")
        self.used.update({f"{R}.router_mlp.4", f"{R}.router_indices", f"{Mo}.zaya_block.router_states",
                          f"{Mo}.router_states", f"{Mo}.residual", f"{Mo}.res_scale.0", f"{Mo}.res_scale.1"})

    def write(self, out_dir):
        order = execution_order(self.L)
        extra = [n for n in self.out if n not in order]
        tensors = []
        for name in [n for n in order if n in self.out] + extra:
            shape, data, info = self.out[name]
            tensors.append((name, shape, data, info))
        fx = self.fixture_index
        prod = fx.get("producer", {}).get("golden" if self.layout == "native" else "golden_zyphra", {})
        if self.precision == "bf16" and isinstance(fx.get("golden_bf16"), dict):
            prod = fx["golden_bf16"].get("producer", prod)
        meta = {
            "producer": {"program": "tools/fixture_to_dump.py", "version": "1",
                         "commit": prod.get("commit"), "reference": prod.get("code")},
            "model": {"path": os.path.abspath(self.src), "source_layout": self.layout,
                      "checkpoint": "checkpoint_native" if self.layout == "native" else "checkpoint_legacy"},
            "weight_format": {"dtype": "fp32", "group_size": 0,
                              "note": "bf16 checkpoint widened exactly to float32 (fixture README)"},
            "precision": self.precision,
            "skip_expert": "zero" if self.layout == "native" else "passthrough",
            "tokens": self.tokens,
            "run": ("token by token with the cache, one token per call (the fixture's decode/ run)" if self.decode
                    else "full-sequence forward (the fixture's taps)"),
            "notes": self.notes,
            "unmapped_taps": self.unmapped,
        }
        write_dump(out_dir, tensors, meta)
        return len(tensors)


# ZAYA1-VL goldens (tools/golden_vl.py: test/fixtures/vl/image_a, image_b): the official module paths of
# Zaya1VLForConditionalGeneration, its decoder under model.language_model. Decoder taps whose meaning is the
# same as ours map by renaming; the vision tower's taps keep their names (zaya.c's --dump uses them);
# the LoRA halves (q_lora_a, ...: A x and B (A x) on every position, before the image mask) and the window
# index keep theirs too (zaya.c has no such tap: "only in REF"). Not mapped: the modules whose output is a
# duplicate (attn.proj = attn, mlp.down_proj = mlp, merger.mlp.2 = merger.mlp = merger), a tuple's first part
# of another meaning (self_attn, mlp, mlp.gate, the layer), act_fn (one module called twice: one file), the
# 5-D patch_embed.proj, rotary_emb (the decoder's cos), inputs_embeds (no zaya.c tap: model:input_scaled is
# after the input scaling).
VL_DECODER = {
    "input_layernorm": "input_layernorm", "self_attn.qkv_proj.q_proj": "self_attn.qkv_proj.q_proj",
    "self_attn.qkv_proj.k_proj": "self_attn.qkv_proj.k_proj",
    "self_attn.qkv_proj.conv_qk_depthwise": "self_attn.qkv_proj.conv_qk_depthwise",
    "self_attn.qkv_proj.conv_qk_grouped": "self_attn.qkv_proj.conv_qk_grouped",
    "self_attn.qkv_proj": "self_attn.qkv_proj:query",          # ZayaCCAProjection's output 0: the query
    "self_attn.qkv_proj.v_proj_current": "self_attn.qkv_proj.v_proj_current",
    "self_attn.qkv_proj.v_proj_delayed": "self_attn.qkv_proj.v_proj_delayed",
    "self_attn.qk_norm": "self_attn.qk_norm:query",            # its output 0
    "self_attn.o_proj": "self_attn.o_proj", "post_attention_residual_scale": "post_attention_residual_scale",
    "post_attention_layernorm": "post_attention_layernorm", "mlp.gate.down_proj": "mlp.gate.down_proj",
    "mlp.gate.router_mlp.rmsnorm_eda": "mlp.gate.router_mlp.norm", "mlp.gate.router_mlp.fc1": "mlp.gate.router_mlp.fc1",
    "mlp.gate.router_mlp.fc2": "mlp.gate.router_mlp.fc2", "mlp.gate.router_mlp": "mlp.gate.router_mlp",
    "mlp.experts": "mlp.experts", "post_mlp_residual_scale": "post_mlp_residual_scale",
}
VL_LORA = [f"self_attn.qkv_proj.{p}_lora_{h}" for p in ("q", "k", "v_current", "v_delayed") for h in "ab"] + \
          [f"self_attn.o_lora_{h}" for h in "ab"]
def vl_to_dump(src, out):
    """A ZAYA1-VL golden case folder (tokens.npy, taps/, logits_top16_*.npy) -> a dump under our names, with
    index.json's image_positions from the golden's image mask. Returns (tensors written, unmapped taps)."""
    taps = os.path.join(src, "taps")
    have = {f[:-4] for f in os.listdir(taps) if f.endswith(".npy")}
    tokens = list(read_npy(os.path.join(src, "tokens.npy"))[1])
    T, used, tensors = len(tokens), set(), []

    def take(tap, name, kind="f"):
        if tap not in have:
            return
        shape, data = read_npy(os.path.join(taps, tap + ".npy"))
        if data.typecode != kind:
            data = array.array(kind, data)
        used.add(tap)
        tensors.append((name, list(shape), data, {"source": f"taps/{tap}.npy"}))

    depth = 1 + max([int(n.split(".")[3]) for n in have if n.startswith("model.visual.blocks.")], default=-1)
    layers = 1 + max([int(n.split(".")[3]) for n in have if n.startswith("model.language_model.layers.")], default=-1)
    for v in vision_order(depth):   # the tower's taps, in zaya.c's --dump order
        take(v, v)
    for v in (":window_index", ":cu_window_seqlens"):
        take("model.visual" + v, "model.visual" + v, "i")
    take("model.language_model.embed_tokens", "model.embed_tokens")
    for i in range(layers):
        P = f"model.language_model.layers.{i}."
        for tap, ours in VL_DECODER.items():
            take(P + tap, f"model.layers.{i}.{ours}")
            if tap == "self_attn.qkv_proj.k_proj":   # the LoRA halves of q, k (added before the convolutions)
                for lora in VL_LORA[:4]:
                    take(P + lora, f"model.layers.{i}.{lora}")
            if tap == "self_attn.qkv_proj.v_proj_delayed":
                for lora in VL_LORA[4:8]:
                    take(P + lora, f"model.layers.{i}.{lora}")
            if tap == "self_attn.o_proj":
                for lora in VL_LORA[8:]:
                    take(P + lora, f"model.layers.{i}.{lora}")
    take("model.language_model.final_norm", "model.norm")
    for k in ("ids", "values"):
        path = os.path.join(src, f"logits_top16_{k}.npy")
        if os.path.exists(path):
            shape, data = read_npy(path)
            tensors.append((f"logits:top16_{k}", list(shape), array.array("i" if k == "ids" else "f", data),
                            {"source": os.path.basename(path)}))
    if "model.language_model:image_mask" in have:
        mask = list(read_npy(os.path.join(taps, "model.language_model:image_mask.npy"))[1])
    else:   # the image placeholder id of the case's config (golden_vl.py's index.json one folder up)
        idx = os.path.join(os.path.dirname(os.path.abspath(src)), "index.json")
        cfg = json.load(open(idx)).get("config", {}) if os.path.exists(idx) else {}
        mask = [int(t == cfg.get("image_token_id", 262147)) for t in tokens]
    used.add("model.language_model:image_mask")
    if len(mask) != T:
        raise InputError(f"{taps}/model.language_model:image_mask.npy has {len(mask)} positions, tokens.npy {T}")
    ranges, t = [], 0
    while t < T:
        if mask[t]:
            end = t
            while end < T and mask[end]:
                end += 1
            ranges.append([t, end])
            t = end
        t += 1
    meta = {"producer": {"program": "tools/golden_vl.py (official Zaya1VLForConditionalGeneration, float32)",
                         "converted_by": "tools/fixture_to_dump.py", "fixture": os.path.abspath(src)},
            "model": {"checkpoint": "test/fixtures/vl (tools/vl_checkpoint.py)"}, "weight_format": "fp32",
            "skip_expert": "zero", "image_positions": ranges, "tokens": tokens}
    idx = os.path.join(os.path.dirname(os.path.abspath(src)), "index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            case = json.load(f).get("cases", {}).get(os.path.basename(os.path.abspath(src)), {})
        if case:
            meta["images"] = [{"file": "image.png", "height": case["image_size_hw"][0], "width": case["image_size_hw"][1],
                               "image_grid_thw": case["image_grid_thw"], "image_tokens": case["image_tokens"]}]
    write_dump(out, tensors, meta)
    return len(tensors), sorted(have - used)


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        print(convert(argv[0], argv[1]))
    except InputError as e:
        print(f"fixture_to_dump.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"fixture_to_dump.py: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


def convert(src, out):
    """The fixture folder src as a dump in out; -> the line that says what was written."""
    taps = os.path.join(src, "taps")
    if os.path.isdir(taps) and any(f.startswith("model.language_model.") for f in os.listdir(taps)):
        n, unmapped = vl_to_dump(src, out)
        return (f"wrote {out}: {n} tensors (ZAYA1-VL golden, official module paths of the tower, decoder renamed "
                f"model.language_model.X -> model.X); unmapped taps: {len(unmapped)}")
    conv = Converter(src)
    conv.convert()
    n = conv.write(out)
    return (f"wrote {out}: {n} tensors ({conv.kind}: {conv.layout} layout, {conv.precision}, "
            f"{'token by token, ' if conv.decode else ''}{conv.L} layers, {conv.T} positions, "
            f"skip_expert {'zero' if conv.layout == 'native' else 'passthrough'}); unmapped taps: {len(conv.unmapped)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
