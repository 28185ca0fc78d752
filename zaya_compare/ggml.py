"""The step check of a GGUF port's products: is a product's output what ggml's arithmetic gives on the port's OWN
input to it? (--local on the blob `export_weights.py MODEL.gguf` wrote; docs/compare.md §9)

The layer-local replay recomputes a whole layer from the port's input to the layer. After a real difference
(the port's F16 grouped conv), the input of a later product differs slightly from the replay's, and ggml's CPU
backend quantizes that input to the weight type's vec_dot_type (Q8_K, Q8_0, Q8_1, F16, BF16) before the
product: a small input difference moves whole quantization steps, so the product's local error grows x5-x20
although the port computes the product exactly as ggml does. Judged on its own input, the step is legitimate.

For each product tap (and the two CCA convolutions) whose input the port dumped, this recomputes ggml's product (float64) from that input:
the input quantized exactly as ggml does for the weight's ggml type (the quantizers of ggml_round.c, here in
numpy: bit for bit the same values; with --precision fp32 plain float32 inputs), times the blob's weights (the
GGUF's, as ggml dequantizes them), plus Q8_1's second-scale term for Q4_1 / Q5_1 weights; the bias and, for
the router MLP's act_fn taps, the official GELU (or ggml's F16-table GELU with +ggml-gelu) after it. The
port's value is legitimate within float32 accumulation of the product (LAMBDA sqrt(n) u32 sum |w||x|, as
legit.py) and 1 ulp of its storage. Inside mlp.experts the SwiGLU output is quantized again for down_proj
from values the port computed in float32: where an element lies within its float32 rounding bound of a
quantization boundary (or a block's scale can move), the step it may flip is added to the bound (an
interval: the quantizer is monotone). A tap departs as in legit.py: more than STEP_FRACTION of its elements
past their bound, or the rms of its errors over their predicted standard deviation above Z_LIMIT.

check_layer(ctx, layer, names) -> {tap name: result dict as legit.check_tap's, with `model` (what was
recomputed)}; taps not modelled or without their inputs are left out (the ratio rule judges them).
"""
import math
import struct

import numpy as np

from gguf import GGML_TYPE_NAMES

from . import legit
from .legit import LAMBDA, U32

# ggml type ids (ggml.h) and the vec_dot_type of each weight type (ggml-cpu.c type_traits_cpu)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 9, 15, 30
VEC_DOT = {F16: F16, BF16: BF16, Q4_0: Q8_0, Q5_0: Q8_0, Q8_0: Q8_0, 20: Q8_0, 39: Q8_0, Q4_1: Q8_1, Q5_1: Q8_1,
           **{t: Q8_K for t in (10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29, 34, 35)}}
VEC_NAMES = {F32: "F32", F16: "F16", BF16: "BF16", Q8_0: "Q8_0", Q8_1: "Q8_1", Q8_K: "Q8_K"}


def ggml_types(path):
    """{tensor name: ggml type} of a blob's tensors that record one (the name field's tail, docs/blob-format.md)."""
    with open(path, "rb") as f:
        h = f.read(64)
        diroff, = struct.unpack_from("<Q", h, 24)
        n, = struct.unpack_from("<I", h, 32)
        f.seek(diroff)
        d = f.read(192 * n)
    out = {}
    for i in range(n):
        e = 192 * i
        name = d[e:e + 128].split(b"\0")[0].decode(errors="replace")
        t, = struct.unpack_from("<I", d, e + 124)
        if len(name) < 124 and 0 < t <= 64:
            out[name] = t - 1
    return out


# ---- ggml's activation quantizers (ggml_round.c), float32 in, the values the blocks stand for out ----

def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def bf16(x):
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7fffffff) > 0x7f800000
    r = np.where(nan, (b | 0x400000) & 0xffff0000, (b + 0x7fff + ((b >> 16) & 1)) & 0xffff0000)
    return r.astype(np.uint32).view(np.float32)


def q8_0(x, x86=True, scale=None):
    """Q8_0 / Q8_1 blocks of 32 along the last axis: (values, stored scale dh, float32 d, int q before saturation).
    scale: use these stored scales (dh, id) per block instead of the block's own (the flip interval)."""
    b = np.asarray(x, dtype=np.float32).reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(b).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if x86:
            inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        else:
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        dh = f16(d)
        if scale is not None:
            dh, inv = scale
        v = (b * inv[..., None]).astype(np.float32)
        if x86:
            q = np.rint(v.astype(np.float64))
        else:
            q = np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)
    bad = ~np.isfinite(q) | (q < -2.0 ** 31) | (q >= 2.0 ** 31)
    q = np.where(bad, -2.0 ** 31, q)          # cvtps_epi32 / cvttss2si of an invalid value: INT32_MIN
    if x86:
        qs = np.clip(q, -128, 127) + 0.0      # the packs saturate; + 0.0: an integer has no negative zero
    else:
        qs = (np.mod(q + 128, 256) - 128) + 0.0   # (int8_t) keeps the low byte
    y = (qs * dh[..., None]).astype(np.float32)
    return y.reshape(x.shape), dh, d, inv, q


def q8_1_s_excess(x, x86=True):
    """Q8_1: per block, s - sum of the values the block stands for (ggml_round_row_s)."""
    y, dh, d, _, q = q8_0(x, x86)
    if x86:
        s32 = (q.astype(np.int64) & 0xffffffff).sum(axis=-1) & 0xffffffff
    else:
        s32 = ((np.mod(q + 128, 256) - 128).astype(np.int64) & 0xffffffff).sum(axis=-1) & 0xffffffff
    isum = np.where(s32 >= 2 ** 31, s32 - 2 ** 32, s32).astype(np.float32)
    s = f16((d * isum).astype(np.float32))
    return s.astype(np.float64) - y.reshape(s.shape + (32,)).astype(np.float64).sum(axis=-1)


def q8_k(x, scale=None):
    """Q8_K blocks of 256 (quantize_row_q8_K_ref): (values, d, iscale). scale = (d, iscale) to impose."""
    b = np.asarray(x, dtype=np.float32).reshape(x.shape[:-1] + (-1, 256))
    i = np.abs(b).argmax(axis=-1)
    mx = np.take_along_axis(b, i[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    if scale is not None:
        d, iscale = scale
    v = np.minimum(np.rint((b * iscale[..., None]).astype(np.float32).astype(np.float64)), 127) + 0.0
    y = (d[..., None] * v.astype(np.float32)).astype(np.float32)
    return y.reshape(x.shape), d, iscale


def quantize(x, wtype, x86=True):
    """x [T, n] float32 as ggml's vec_dot_type of weight type wtype holds it (None: plain float32)."""
    v = VEC_DOT.get(wtype) if wtype is not None else None
    x = np.asarray(x, dtype=np.float32)
    if v in (Q8_0, Q8_1) and x.shape[-1] % 32 == 0:
        return q8_0(x, x86)[0]
    if v == Q8_K and x.shape[-1] % 256 == 0:
        return q8_k(x)[0]
    if v == F16:
        return f16(x)
    if v == BF16:
        return bf16(x)
    return x


def quantize_interval(h, e, wtype, x86=True):
    """(values, flip) of float32 values h [T, n] known within e (float64 >= 0): ggml's quantized values of h and,
    per element, the largest change of its quantized value for an input anywhere in [h - e, h + e] (the
    quantizers are monotone at a fixed scale; a block's scale moves with its largest element, within the
    same interval: that relative change times the value is added)."""
    v = VEC_DOT.get(wtype) if wtype is not None else None
    h = np.asarray(h, dtype=np.float32)
    if v in (Q8_0, Q8_1) and h.shape[-1] % 32 == 0:
        y, dh, d, inv, _ = q8_0(h, x86)
        bs = 32
    elif v == Q8_K and h.shape[-1] % 256 == 0:
        y, d, iscale = q8_k(h)
        bs = 256
    elif v in (F16, BF16):
        r = f16 if v == F16 else bf16
        y = r(h)
        lo, hi = r((h - e).astype(np.float32)), r((h + e).astype(np.float32))
        return y, np.maximum(np.abs(hi - y), np.abs(y - lo)).astype(np.float64) + 2 * np.abs(y) * U32
    else:
        return h, np.asarray(e, dtype=np.float64)
    blocks = h.reshape(h.shape[:-1] + (-1, bs))
    eb = np.asarray(e, dtype=np.float64).reshape(blocks.shape)
    amax = np.abs(blocks).max(axis=-1).astype(np.float64)
    rel = (eb.max(axis=-1) + 1e-45) / np.maximum(amax, 1e-38)        # the block's largest value known within rel
    if bs == 32:   # the stored half scale may round the other way: its largest relative step
        d_lo, d_hi = f16((amax * (1 - rel) / 127).astype(np.float32)), f16((amax * (1 + rel) / 127).astype(np.float32))
        rel = rel + np.abs(d_hi.astype(np.float64) - d_lo) / np.maximum(dh.astype(np.float64), 1e-38)
        scale = (dh, inv)
        qf = lambda z: q8_0(z, x86, scale)[0]     # noqa: E731
    else:
        scale = (d, iscale)
        qf = lambda z: q8_k(z, scale)[0]          # noqa: E731
    # an input moved by e, and by the scale's relative change (the quantized value v / scale moves by v rel)
    e_tot = (eb + np.abs(blocks) * rel[..., None]).reshape(h.shape)
    lo, hi = qf((h - e_tot).astype(np.float32)), qf((h + e_tot).astype(np.float32))
    flip = np.maximum(np.abs(hi.astype(np.float64) - y), np.abs(y.astype(np.float64) - lo))
    flip = flip + (np.abs(y).reshape(blocks.shape) * rel[..., None]).reshape(h.shape)
    return y, flip


# ---- GELU: the official one (erf) and ggml's (tanh from an F16 table, ggml_round.c ggml_gelu) ----

_TABLE = []


def gelu_ggml(x):
    if not _TABLE:
        f = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(all="ignore"):
            g = np.float32(0.5) * f * (np.float32(1) + np.tanh(np.float32(0.79788456080286535587989211986876) * f
                                                             * (np.float32(1) + np.float32(0.044715) * f * f)))
        _TABLE.append(f16(g.astype(np.float32)))
    x = np.asarray(x, dtype=np.float32)
    y = _TABLE[0][x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, y)).astype(np.float32)


# ---- the step models ----

class Ctx:
    """What the models read: the port's taps and the blob (legit.Ctx), the blob's ggml types, the placement."""

    def __init__(self, port, blob_path, precision):
        self.lc = legit.Ctx(port, legit.Blob(blob_path), U32)
        self.types = ggml_types(blob_path)
        flags = (precision or "fp32").split("+")
        self.ggml = "ggml" in flags or "ggml-ref" in flags      # the products' inputs rounded as ggml's
        self.x86 = "ggml-ref" not in flags
        self.gelu = "ggml-gelu" in flags
        self.conv = "ggml-conv" in flags

    def wtype(self, layer, module):
        """The ggml type the placement quantizes the input for, or None (plain float32)."""
        if not self.ggml:
            return None
        name = f"model.layers.{layer}.{module}"
        return self.types.get(name + ".weight", self.types.get(name))

    def what(self, t):
        return "float32" if t is None else f"{GGML_TYPE_NAMES.get(t, t)} weights, {VEC_NAMES.get(VEC_DOT.get(t), 'F32')} input"


def product(ctx, layer, module, x):
    """ggml's product of module's weight with input x [T, n]: (y, bound, sd, model) in float64, or None."""
    blob = ctx.lc.blob
    W = blob.raw(f"model.layers.{layer}.{module}.weight")
    if x is None or W is None or W.ndim != 2 or W.shape[1] != x.shape[1]:
        return None
    t = ctx.wtype(layer, module)
    xq = quantize(x.astype(np.float32), t, ctx.x86).astype(np.float64)
    Wd = legit.f64(W)
    y = xq @ Wd.T
    bound = LAMBDA * math.sqrt(W.shape[1]) * U32 * (np.abs(xq) @ np.abs(Wd).T)
    if t is not None and VEC_DOT.get(t) == Q8_1 and x.shape[1] % 32 == 0:
        m = Wd.reshape(Wd.shape[0], -1, 32).min(axis=-1)        # the block minimum (q = 0), as kernels.c
        y = y + q8_1_s_excess(x.astype(np.float32), ctx.x86) @ m.T
    b = ctx.lc.w(layer, module + ".bias")
    if b is not None:
        bound = bound + U32 * np.abs(y)
        y = y + b
    return y, bound, bound / LAMBDA, ctx.what(t)


def linear_step(ctx, layer, tap):
    module, src = legit.LINEARS[tap]
    return product(ctx, layer, module, ctx.lc.tap(f"model.layers.{layer}.{src}"))


def act_step(ctx, layer, fc):
    """act_fn:fc1 / act_fn:fc2: the product (with its bias), then the GELU: the official erf GELU, or with
    +ggml-gelu ggml's F16-table one (the interval of the table over the product's bound)."""
    src = "mlp.gate.router_mlp.norm" if fc == "fc1" else "mlp.gate.router_mlp.act_fn:fc1"
    got = product(ctx, layer, f"mlp.gate.router_mlp.{fc}", ctx.lc.tap(f"model.layers.{layer}.{src}"))
    if got is None:
        return None
    z, bz, _, what = got
    if ctx.gelu:
        y = gelu_ggml(z).astype(np.float64)
        lo, hi = gelu_ggml((z - bz).astype(np.float32)), gelu_ggml((z + bz).astype(np.float32))
        bound = np.maximum(np.abs(hi - y), np.abs(y - lo)) + np.abs(y) * 2.0 ** -10
        return y, bound, bound / math.sqrt(3), what + ", ggml's F16-table GELU"
    y = legit.gelu(z)
    phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    slope = np.abs(0.5 * (1 + legit.erf(z / math.sqrt(2))) + z * phi)
    bound = slope * bz + 8 * U32 * (np.abs(z) + 1e-30)
    return y, bound, np.sqrt(np.square(slope * bz / LAMBDA) + np.square(8 * U32 * np.abs(z)) / 3), what + ", erf GELU"


def experts_step(ctx, layer):
    """mlp.experts of top-1 routing: w D q(SiLU(G q(x)) * U q(x)), q ggml's quantization for each weight's type,
    with the flip interval of the SwiGLU output's quantization for down_proj."""
    p = f"model.layers.{layer}."
    lc = ctx.lc
    h, wt = lc.tap(p + "post_attention_layernorm"), lc.tap(p + "mlp.gate:router_weight")
    GUs, Ds = lc.blob.raw(f"{p}mlp.experts.gate_up_proj"), lc.blob.raw(f"{p}mlp.experts.down_proj")
    if h is None or wt is None or GUs is None or Ds is None or not lc.port.has(p + "mlp.gate.router_indices"):
        return None
    idx = np.asarray(lc.port.load(p + "mlp.gate.router_indices")[1]).reshape(-1)[:h.shape[0]]
    E, I, H = GUs.shape[0], GUs.shape[1] // 2, GUs.shape[2]
    t_gu, t_d = ctx.wtype(layer, "mlp.experts.gate_up_proj"), ctx.wtype(layer, "mlp.experts.down_proj")
    xq = quantize(h.astype(np.float32), t_gu, ctx.x86).astype(np.float64)
    y, bound, sd = np.full_like(h, np.nan), np.zeros_like(h), np.zeros_like(h)
    for e in sorted({int(x) for x in idx if 0 <= x < E}):
        rows = np.flatnonzero(idx == e)
        GU, D = legit.f64(GUs[e]), legit.f64(Ds[e])
        x = xq[rows]
        gu = x @ GU.T
        egu = LAMBDA * math.sqrt(H) * U32 * (np.abs(x) @ np.abs(GU).T)
        if t_gu is not None and VEC_DOT.get(t_gu) == Q8_1:
            gu = gu + q8_1_s_excess(h[rows].astype(np.float32), ctx.x86) @ GU.reshape(2 * I, -1, 32).min(axis=-1).T
        g, up, eg, eu = gu[:, :I], gu[:, I:], egu[:, :I], egu[:, I:]
        sig = 1.0 / (1.0 + np.exp(-g))
        act = g * sig
        hid = act * up
        dsil = np.abs(sig * (1 + g * (1 - sig)))
        e_hid = dsil * eg * np.abs(up) + np.abs(act) * eu + 6 * U32 * np.abs(hid)
        hq, flip = quantize_interval(hid.astype(np.float32), e_hid, t_d, ctx.x86)
        hq = hq.astype(np.float64)
        m = hq @ D.T
        if t_d is not None and VEC_DOT.get(t_d) == Q8_1:
            m = m + q8_1_s_excess(hid.astype(np.float32), ctx.x86) @ D.reshape(D.shape[0], -1, 32).min(axis=-1).T
        w = wt[rows, :1]
        y[rows] = w * m
        b_sum = LAMBDA * math.sqrt(I) * U32 * (np.abs(hq) @ np.abs(D).T)
        b_flip = flip @ np.abs(D).T
        bound[rows] = np.abs(w) * (b_sum + b_flip) + U32 * np.abs(y[rows])
        sd[rows] = np.sqrt(np.square(np.abs(w) * b_sum / LAMBDA) + np.square(np.abs(w) * b_flip) / 3
                           + np.square(U32 * y[rows]) / 3)
    what = f"{ctx.what(t_gu)}; SwiGLU output as {ctx.what(t_d)}" if ctx.ggml else "float32"
    return y, bound, sd, what


def conv_depthwise_step(ctx, layer):
    """conv_qk_depthwise: a_j[c] = b0[c] + sum_m w0[c, m] u_{j-t0+1+m}[c], u = [q_proj, k_proj] (the port's taps; zeros
    before position 0: the dump starts there), in float32 (the port's ssm_conv)."""
    p = f"model.layers.{layer}.self_attn.qkv_proj."
    q, k = ctx.lc.tap(p + "q_proj"), ctx.lc.tap(p + "k_proj")
    w, b = ctx.lc.w(layer, "self_attn.qkv_proj.conv_qk_depthwise.weight"), \
        ctx.lc.w(layer, "self_attn.qkv_proj.conv_qk_depthwise.bias")
    if q is None or k is None or w is None or b is None:
        return None
    u = np.concatenate([q, k], axis=1)
    T, C = u.shape
    w = w.reshape(C, -1)
    t0 = w.shape[1]
    seq = np.concatenate([np.zeros((t0 - 1, C)), u], axis=0)
    terms = np.stack([w[:, m] * seq[m:m + T] for m in range(t0)])
    y = b + terms.sum(axis=0)
    bound = 2 * t0 * U32 * (np.abs(terms).sum(axis=0) + np.abs(b))
    return y, bound, bound / LAMBDA, "float32"


def conv_grouped_step(ctx, layer):
    """conv_qk_grouped from the port's conv_qk_depthwise tap (a_{-1} .. before position 0 = the depthwise bias: the
    dump starts at position 0): z_t[o] = b1[o] + sum_k sum_i w1[o, i, k] a_{t-t1+1+k}[g d + i], o in group g; with
    +ggml-conv the kernel and a rounded to F16 first (the port's cast and im2col)."""
    p = f"model.layers.{layer}.self_attn.qkv_proj."
    a, w = ctx.lc.tap(p + "conv_qk_depthwise"), ctx.lc.w(layer, "self_attn.qkv_proj.conv_qk_grouped.weight")
    b, b0 = ctx.lc.w(layer, "self_attn.qkv_proj.conv_qk_grouped.bias"), \
        ctx.lc.w(layer, "self_attn.qkv_proj.conv_qk_depthwise.bias")
    d = ctx.lc.blob.d
    if a is None or w is None or b is None or b0 is None or a.shape[1] % d:
        return None
    T, C = a.shape
    w = w.reshape(C, d, -1)
    t1 = w.shape[2]
    seq = np.concatenate([np.repeat(b0[None, :], t1 - 1, axis=0), a], axis=0)
    if ctx.conv:
        seq, w = f16(seq).astype(np.float64), f16(w).astype(np.float64)
    G = C // d
    y, mag = np.zeros((T, C)), np.zeros((T, C))
    for k in range(t1):
        x = seq[k:k + T].reshape(T, G, d)                      # a_{t-t1+1+k}, by group
        wk = w[:, :, k].reshape(G, d, d)                       # [group, output in group, input in group]
        y += np.einsum("tgi,goi->tgo", x, wk).reshape(T, C)
        mag += np.einsum("tgi,goi->tgo", np.abs(x), np.abs(wk)).reshape(T, C)
    bound = LAMBDA * math.sqrt(d * t1) * U32 * mag + U32 * np.abs(y)
    return y + b, bound, bound / LAMBDA, "F16 kernel and input (+ggml-conv)" if ctx.conv else "float32"


STEPS = {
    **{k: (lambda k: lambda c, i: linear_step(c, i, k))(k) for k in legit.LINEARS},
    "self_attn.qkv_proj.conv_qk_depthwise": conv_depthwise_step,
    "self_attn.qkv_proj.conv_qk_grouped": conv_grouped_step,
    "mlp.gate.router_mlp.act_fn:fc1": lambda c, i: act_step(c, i, "fc1"),
    "mlp.gate.router_mlp.act_fn:fc2": lambda c, i: act_step(c, i, "fc2"),
    "mlp.experts": experts_step,
}


def check_tap(ctx, name, rows=None):
    """The step check of one layer tap (see the module's docstring), or None when not modelled / inputs missing."""
    short = name.split(".", 3)[3] if name.startswith("model.layers.") else None
    if short not in STEPS:
        return None
    layer = int(name.split(".")[2])
    try:
        got = STEPS[short](ctx, layer)
    except (ValueError, IndexError, KeyError):
        return None
    port = ctx.lc.tap(name)
    if got is None or port is None or got[0].shape != port.shape:
        return None
    exact, extra, sd, what = got
    r = legit.judge(ctx.lc, short, exact, extra, sd, port, rows)
    if r is None:
        return None
    r["model"] = what
    r["departs"] = r["past"] > legit.STEP_FRACTION * r["judged"] or r["rms"] > legit.Z_LIMIT
    return r
