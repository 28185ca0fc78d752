"""The step check: is a port's tap legitimate arithmetic on the port's own inputs? (docs/compare.md §9)

For a tap whose inputs the port dumped, the exact value is recomputed in float64 from those inputs and
the model's parameters (read from the blob the replays use); the port's value is legitimate where it is
within a rounding-error bound of the arithmetic a port may legitimately use:

  bound = 1 ulp of the tap's storage type at the exact value (fp32, bf16 or fp16: read from the port's
          values) + every rounding of an intermediate at the run's low precision (unit roundoff u; bf16
          u = 2^-8) propagated to the output (the official code rounds there; a port that does not is more
          exact, never less legitimate) + float32 accumulation of a product of length n: LAMBDA sqrt(n) u32
          sum |w||x| (Higham and Mary's probabilistic bound, with LAMBDA well above its constant).

A step computed more exactly than the official code passes by construction; a step that computes
something else (another constant, a missing term, another index, an angle cast to bf16, a tanh GELU
where the official code uses erf) moves elements past the bound. A tap departs when more than
STEP_FRACTION of its elements are past their bound, or when its errors are larger than legitimate rounding
on the whole: the rms over elements of (port - exact) / sd, sd the standard deviation the same model
predicts (each rounding uniform within its half-ulp, independent), exceeds Z_LIMIT (a product scaled by 2 %
stays inside every element's bound but not inside the statistics of rounding). What it cannot see: a bug smaller than the rounding it
allows (e.g. a product scaled by less than about an ulp), a tap whose inputs the port did not dump, the
attention and convolution steps (not modelled: tier 2 judges them).

Parts: Blob (the blob's header and small tensors, float32 / bf16 only), storage_ulp(), the step models
(STEPS: short tap name -> function(ctx, layer) -> (exact, bound) or None), check_tap().
"""
import math
import struct

import numpy as np

from .names import VL_STEPS

U32 = 2.0 ** -24        # float32 unit roundoff
U_BF16 = 2.0 ** -8      # bf16 unit roundoff (8 significant bits)
LAMBDA = 4.0            # Higham-Mary: |error| <= lambda sqrt(n) u sum|w||x| with high probability (lambda ~ 1)
STEP_FRACTION = 0.001   # a tap departs when more than this fraction of its elements are past their bound,
Z_LIMIT = 2.0           # ... or when the rms of its errors over their predicted standard deviation exceeds this


class Blob:
    """A zaya.c blob's config and its float32 / bf16 tensors (docs/blob-format.md); None for other dtypes."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            h = f.read(1024)
            if h[:8] != b"ZAYABLOB":
                raise ValueError(f"{path} is not a zaya.c blob")
            diroff, = struct.unpack_from("<Q", h, 24)
            n, = struct.unpack_from("<I", h, 32)
            f.seek(diroff)
            d = f.read(192 * n)
        (self.vocab, self.hidden, self.n_layers, self.nq, self.nkv, self.d, self.n_experts, _, self.inter,
         self.router_hidden, self.t0, self.t1, self.window, _) = struct.unpack_from("<14I", h, 128)
        self.rot = struct.unpack_from("<2I", h, 212)
        self.eps, = struct.unpack_from("<f", h, 220)
        self.theta = struct.unpack_from("<2f", h, 224)
        rne, = struct.unpack_from("<f", h, 248)
        self.router_eps = rne or self.eps
        self.layer_types = list(h[256:256 + self.n_layers])
        self.dir = {}
        for i in range(n):
            e = 192 * i
            name = d[e:e + 128].split(b"\0")[0].decode(errors="replace")
            dtype, nd = struct.unpack_from("<II", d, e + 128)
            shape = struct.unpack_from("<4Q", d, e + 136)[:nd]
            off, size = struct.unpack_from("<QQ", d, e + 168)
            self.dir[name] = (dtype, shape, off, size)
        self.cache = {}

    def raw(self, name):
        """The tensor as stored, mapped (float32, or bf16 as uint16: f64() converts a slice), or None when it is
        absent or of another dtype (int8, FP8, MXFP4: the step check does not judge products of those)."""
        if name not in self.dir or self.dir[name][0] not in (0, 1):
            return None
        dtype, shape, off, size = self.dir[name]
        return np.memmap(self.path, dtype="<f4" if dtype == 0 else "<u2", mode="r", offset=off, shape=tuple(shape))

    def get(self, name):
        """float64 copy of a small float32 or bf16 tensor (cached), or None."""
        if name not in self.cache:
            x = self.raw(name)
            self.cache[name] = None if x is None else f64(x)
        return self.cache[name]


def f64(x):
    """float64 of a float32 array or of bf16 bits held as uint16."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def storage_of(x):
    """'bf16', 'fp16' or 'fp32': the narrowest type that holds every value of x exactly."""
    x = np.asarray(x, dtype=np.float32)
    fin = x[np.isfinite(x)]
    if not fin.size or np.all((fin.view(np.uint32) & 0xFFFF) == 0):
        return "bf16"
    if np.all(fin.astype(np.float16).astype(np.float32) == fin):
        return "fp16"
    return "fp32"


def storage_ulp(exact, storage):
    """One ulp of `storage` at each value of exact (float64 array)."""
    mag = np.abs(exact)
    _, e = np.frexp(np.maximum(mag, 1e-38))          # mag = m 2^e, m in [0.5, 1)
    bits = {"bf16": 8, "fp16": 11, "fp32": 24}[storage]
    ulp = np.ldexp(1.0, e - bits)
    if storage == "fp16":
        ulp = np.maximum(ulp, 2.0 ** -24)             # fp16 subnormals
    elif storage == "bf16":
        ulp = np.maximum(ulp, 2.0 ** -133)
    return ulp


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


# ---- the step models: each returns (exact, bound) [T, n] from the port's own inputs, or None ----

class Ctx:
    """What a step model reads: the port's taps (float64 [T, n]), the blob's parameters, the run's u."""

    def __init__(self, port, blob, u):
        self.port, self.blob, self.u = port, blob, u

    def tap(self, name):
        if not self.port.has(name):
            return None
        shape, x = self.port.load(name)
        if not shape:
            return None
        return np.asarray(x, dtype=np.float64).reshape(shape[0], -1)

    def w(self, layer, name):
        return self.blob.get(f"model.layers.{layer}.{name}" if layer is not None else name)

    def layer_input(self, layer):
        return self.tap("model:input_scaled") if layer == 0 else self.tap(f"model.layers.{layer - 1}.post_mlp_residual_scale")


def residual_scaling(ctx, layer, which):
    p = f"model.layers.{layer}."
    branch = ctx.tap(p + ("self_attn.o_proj" if which == "post_attention_residual_scale" else "mlp.experts"))
    res = ctx.layer_input(layer) if which == "post_attention_residual_scale" else ctx.tap(p + "post_attention_residual_scale")
    prm = [ctx.w(layer, f"{which}.{k}") for k in ("hidden_states_bias", "hidden_states_scale", "residual_bias",
                                                 "residual_scale")]
    if branch is None or res is None or any(x is None for x in prm):
        return None
    hb, hs, rb, rs = prm
    s1 = branch + hb
    s2 = s1 * hs
    r2 = (res + rb) * rs
    exact = s2 + r2
    u = ctx.u
    # the branch's sum and product rounded at the run's precision; the residual side and the total in float32
    bound = u * (np.abs(s1) * np.abs(hs) + np.abs(s2)) + 3 * U32 * (np.abs(res + rb) * np.abs(rs) + np.abs(r2) + np.abs(exact))
    return exact, bound


def eda(ctx, layer):
    p = f"model.layers.{layer}."
    down = ctx.tap(p + "mlp.gate.down_proj")
    if down is None:
        return None
    if layer == 0:
        return down, np.zeros_like(down)
    prev, scale = ctx.tap(f"model.layers.{layer - 1}.mlp.gate:router_state"), ctx.w(layer, "mlp.gate.router_states_scale")
    if prev is None or scale is None:
        return None
    prod = prev * scale
    return down + prod, ctx.u * np.abs(prod)


def gelu_step(ctx, layer, fc):
    x = ctx.tap(f"model.layers.{layer}.mlp.gate.router_mlp.{fc}")
    if x is None:
        return None
    return gelu(x), 8 * U32 * (np.abs(x) + 1e-30)


def router_probs(ctx, layer):
    x = ctx.tap(f"model.layers.{layer}.mlp.gate.router_mlp")
    if x is None:
        return None
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    return p, 16 * U32 * p


def router_scores(ctx, layer):
    p, b = ctx.tap(f"model.layers.{layer}.mlp.gate:router_probs"), ctx.w(layer, "mlp.gate.balancing_biases")
    if p is None or b is None:
        return None
    # the biases are float32 in the checkpoint; transformers loading in bf16 rounds them (a bf16 buffer)
    return p + b, U32 * (np.abs(p) + np.abs(b)) + ctx.u * np.abs(b)


def router_weight(ctx, layer):
    p = ctx.tap(f"model.layers.{layer}.mlp.gate:router_probs")
    if p is None or not ctx.port.has(f"model.layers.{layer}.mlp.gate.router_indices"):
        return None
    idx = np.asarray(ctx.port.load(f"model.layers.{layer}.mlp.gate.router_indices")[1]).reshape(-1)[:p.shape[0]]
    w = p[np.arange(p.shape[0]), np.minimum(idx, p.shape[1] - 1)]
    skip = idx >= p.shape[1] - 1
    # at the skip class upstream writes 0, Zyphra's fork P[skip]: both legitimate
    port_w = ctx.tap(f"model.layers.{layer}.mlp.gate:router_weight")
    if port_w is not None:
        w = np.where(skip & (np.abs(port_w.reshape(-1)) == 0), 0.0, w)
    return w.reshape(-1, 1), np.zeros((w.size, 1))


def value(ctx, layer):
    p = f"model.layers.{layer}.self_attn.qkv_proj."
    vc, vd = ctx.tap(p + "v_proj_current"), ctx.tap(p + "v_proj_delayed")
    if vc is None or vd is None:
        return None
    b = ctx.w(layer, "self_attn.qkv_proj.v_proj_delayed.bias")
    first = b[None, :] if b is not None else np.zeros((1, vd.shape[1]))
    prev = np.concatenate([first, vd[:-1]], axis=0)
    exact = np.concatenate([vc, prev], axis=1)
    return exact, np.zeros_like(exact)


def query_residual(ctx, layer):
    p = f"model.layers.{layer}.self_attn.qkv_proj."
    q, k = ctx.tap(p + "q_proj"), ctx.tap(p + "k_proj")
    if q is None or k is None:
        return None
    B = ctx.blob
    T, g = q.shape[0], B.nq // B.nkv
    q3, k3 = q.reshape(T, B.nq, B.d), k.reshape(T, B.nkv, B.d)
    s = q3 + np.repeat(k3, g, axis=1)
    return (s * 0.5).reshape(T, -1), (ctx.u * np.abs(s) * 0.5).reshape(T, -1)


def key_residual(ctx, layer):
    qr = ctx.tap(f"model.layers.{layer}.self_attn.qkv_proj:query_residual")
    if qr is None:
        return None
    B = ctx.blob
    T, g = qr.shape[0], B.nq // B.nkv
    q4 = qr.reshape(T, B.nkv, g, B.d)
    exact = q4.mean(axis=2)
    return exact.reshape(T, -1), (ctx.u * np.abs(q4).sum(axis=2) / g * 2).reshape(T, -1)


def assembly(ctx, layer, which):
    p = f"model.layers.{layer}.self_attn.qkv_proj"
    z, r = ctx.tap(p + ".conv_qk_grouped"), ctx.tap(p + (":query_residual" if which == "query" else ":key_residual"))
    if z is None or r is None:
        return None
    nqd = ctx.blob.nq * ctx.blob.d
    z = z[:, :nqd] if which == "query" else z[:, nqd:]
    if z.shape != r.shape:
        return None
    return z + r, np.zeros_like(r)


def rope(ctx, layer, which):
    x = ctx.tap(f"model.layers.{layer}.self_attn.qk_norm:{which}")
    if x is None:
        return None
    B = ctx.blob
    typ = B.layer_types[layer] if layer < len(B.layer_types) else 0
    rot, theta = B.rot[typ], B.theta[typ]
    T = x.shape[0]
    x3 = x.reshape(T, -1, B.d)
    half = rot // 2
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)))).astype(np.float32)
    ang = (np.arange(T, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)   # the float32 angle: official
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x3[..., :half], x3[..., half:rot]
    out = x3.copy()
    out[..., :half] = a * c - b * s
    out[..., half:rot] = b * c + a * s
    bnd = np.zeros_like(x3)
    # cos and sin rounded, each product rounded (the sum's rounding is the storage ulp)
    mag = np.abs(a * c) + np.abs(b * s) + np.abs(b * c) + np.abs(a * s)
    bnd[..., :half] = 2 * ctx.u * (np.abs(a * c) + np.abs(b * s)) + 2 * U32 * mag
    bnd[..., half:rot] = 2 * ctx.u * (np.abs(b * c) + np.abs(a * s)) + 2 * U32 * mag
    return out.reshape(T, -1), bnd.reshape(T, -1)


def rmsnorm(ctx, x, w, eps):
    """RMSNorm of x [T, n] with weight w: the input cast to the run's precision (the official code casts the
    float32 residual), x / rms rounded, times the weight rounded."""
    if x is None or w is None:
        return None
    rms = np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    xh = x / rms
    exact = xh * w
    return exact, ctx.u * 3 * np.abs(xh) * np.abs(w) + LAMBDA * math.sqrt(x.shape[1]) * U32 * np.abs(exact)


def norm_step(ctx, layer, which):
    p = f"model.layers.{layer}."
    if which == "input_layernorm":
        x = ctx.layer_input(layer)
    elif which == "post_attention_layernorm":
        x = ctx.tap(p + "post_attention_residual_scale")
    else:
        x = ctx.tap(p + "mlp.gate:router_state")
        return rmsnorm(ctx, x, ctx.w(layer, "mlp.gate.router_mlp.norm.weight"), ctx.blob.router_eps)
    return rmsnorm(ctx, x, ctx.w(layer, which + ".weight"), ctx.blob.eps)


LINEARS = {   # tap -> (weight, bias or None, input tap)
    "self_attn.qkv_proj.q_proj": ("self_attn.qkv_proj.q_proj", "input_layernorm"),
    "self_attn.qkv_proj.k_proj": ("self_attn.qkv_proj.k_proj", "input_layernorm"),
    "self_attn.qkv_proj.v_proj_current": ("self_attn.qkv_proj.v_proj_current", "input_layernorm"),
    "self_attn.qkv_proj.v_proj_delayed": ("self_attn.qkv_proj.v_proj_delayed", "input_layernorm"),
    "self_attn.o_proj": ("self_attn.o_proj", "self_attn:attn_output"),
    "mlp.gate.down_proj": ("mlp.gate.down_proj", "post_attention_layernorm"),
    "mlp.gate.router_mlp.fc1": ("mlp.gate.router_mlp.fc1", "mlp.gate.router_mlp.norm"),
    "mlp.gate.router_mlp.fc2": ("mlp.gate.router_mlp.fc2", "mlp.gate.router_mlp.act_fn:fc1"),
    "mlp.gate.router_mlp": ("mlp.gate.router_mlp.out_proj", "mlp.gate.router_mlp.act_fn:fc2"),
}


def linear(ctx, layer, tap):
    module, src = LINEARS[tap]
    x, W, b = ctx.tap(f"model.layers.{layer}.{src}"), ctx.blob.raw(f"model.layers.{layer}.{module}.weight"), \
        ctx.w(layer, module + ".bias")
    if x is None or W is None or W.ndim != 2 or W.shape[1] != x.shape[1]:
        return None
    W = f64(W)
    y = x @ W.T
    mag = np.abs(x) @ np.abs(W).T
    bound = LAMBDA * math.sqrt(W.shape[1]) * U32 * mag
    if b is not None:
        bound = bound + ctx.u * np.abs(y)          # the product rounded before the bias is added
        y = y + b
    return y, bound


def experts(ctx, layer):
    p = f"model.layers.{layer}."
    h, wt = ctx.tap(p + "post_attention_layernorm"), ctx.tap(p + "mlp.gate:router_weight")
    GUs, Ds = ctx.blob.raw(f"{p}mlp.experts.gate_up_proj"), ctx.blob.raw(f"{p}mlp.experts.down_proj")
    if h is None or wt is None or GUs is None or Ds is None or not ctx.port.has(p + "mlp.gate.router_indices"):
        return None
    idx = np.asarray(ctx.port.load(p + "mlp.gate.router_indices")[1]).reshape(-1)
    E, I = GUs.shape[0], GUs.shape[1] // 2
    y, bound, sd = np.full_like(h, np.nan), np.zeros_like(h), np.zeros_like(h)
    u = ctx.u
    # the skip class (e = E: 0 upstream, P[skip] h in Zyphra's fork) is not judged here; the chosen experts one at
    # a time, float64, read from the mapped blob
    for e in sorted({int(x) for x in idx[:h.shape[0]] if 0 <= x < E}):
        GU, D = f64(GUs[e]), f64(Ds[e])
        for t in np.flatnonzero(idx[:h.shape[0]] == e):
            expert_row(u, I, GU, D, h[t], float(wt[t, 0]), t, y, bound, sd)
    return y, bound, sd


def expert_row(u, I, GU, D, x, w, t, y, bound, sd):
    """One position's expert output w D (SiLU(gate) up), [gate; up] = GU x, with its bound and standard deviation,
    into row t of y, bound and sd."""
    gu = GU @ x
    g, up = gu[:I], gu[I:]
    sig = 1.0 / (1.0 + np.exp(-g))
    act = g * sig
    hid = act * up
    m = D @ hid
    y[t] = w * m
    # gate and up rounded (relative u, through SiLU's slope), SiLU rounded (torch 1.13: three roundings), the
    # product rounded; float32 sums; the down product and the weight's product rounded. The hidden values'
    # rounding errors are independent: through down_proj they add up as a root sum of squares
    dsil = np.abs(sig * (1 + g * (1 - sig)))
    e_hid = u * (np.abs(g) * dsil * np.abs(up) + 4 * np.abs(act * up) + np.abs(hid)) \
        + LAMBDA * math.sqrt(GU.shape[1]) * U32 * (np.abs(GU[:I]) @ np.abs(x) * dsil * np.abs(up))
    bound[t] = abs(w) * (LAMBDA * np.sqrt(np.square(D) @ np.square(e_hid)) + u * np.abs(m)
                         + LAMBDA * math.sqrt(I) * U32 * (np.abs(D) @ np.abs(hid))) + u * np.abs(y[t])
    # the standard deviation of the same errors, each uniform within its rounding (variance e^2 / 3)
    var_hid = (u * u / 3) * (np.square(g * dsil * up) + 5 * np.square(hid))
    sd[t] = np.sqrt(w * w * (np.square(D) @ var_hid + np.square(u * m) / 3) + np.square(u * y[t]) / 3)


STEPS = {
    "input_layernorm": lambda c, i: norm_step(c, i, "input_layernorm"),
    "post_attention_layernorm": lambda c, i: norm_step(c, i, "post_attention_layernorm"),
    "mlp.gate.router_mlp.norm": lambda c, i: norm_step(c, i, "router"),
    "self_attn.qkv_proj:query_residual": query_residual,
    "self_attn.qkv_proj:key_residual": key_residual,
    "self_attn.qkv_proj:query": lambda c, i: assembly(c, i, "query"),
    "self_attn.qkv_proj:key": lambda c, i: assembly(c, i, "key"),
    "self_attn.qkv_proj:value": value,
    "self_attn:query_after_rope": lambda c, i: rope(c, i, "query"),
    "self_attn:key_after_rope": lambda c, i: rope(c, i, "key"),
    "post_attention_residual_scale": lambda c, i: residual_scaling(c, i, "post_attention_residual_scale"),
    "post_mlp_residual_scale": lambda c, i: residual_scaling(c, i, "post_mlp_residual_scale"),
    "mlp.gate:router_state": eda,
    "mlp.gate.router_mlp.act_fn:fc1": lambda c, i: gelu_step(c, i, "fc1"),
    "mlp.gate.router_mlp.act_fn:fc2": lambda c, i: gelu_step(c, i, "fc2"),
    "mlp.gate:router_probs": router_probs,
    "mlp.gate:router_scores": router_scores,
    "mlp.gate:router_weight": router_weight,
    "mlp.experts": experts,
    **{k: (lambda k: lambda c, i: linear(c, i, k))(k) for k in LINEARS},
}


def check_tap(ctx, name, rows=None):
    """The step check of one layer tap: None when it is not modelled or an input is missing, else a dict:
    storage (of the port's values), judged (elements), past (elements past their bound), worst (the largest
    |port - exact| / bound), at (position of the worst element)."""
    short = name.split(".", 3)[3] if name.startswith("model.layers.") else None
    layer = int(name.split(".")[2]) if short else None
    if short not in STEPS:
        return None
    got = STEPS[short](ctx, layer)
    port = ctx.tap(name)
    if got is None or port is None:
        return None
    exact, extra = got[:2]
    # the standard deviation of the legitimate error besides the storage rounding: a model's own, or its bound
    # taken as a uniform error (variance bound^2 / 3; a product's bound is LAMBDA standard deviations)
    sd = got[2] if len(got) > 2 else extra / (LAMBDA if short in LINEARS else math.sqrt(3))
    if exact.shape != port.shape:
        return None
    return judge(ctx, short, exact, extra, sd, port, rows)


def judge(ctx, short, exact, extra, sd, port, rows=None):
    """The port's values of step `short` against the exact ones, within storage rounding + extra (per element,
    standard deviation sd), on the positions it can be judged at (rows, or all; not where a ZAYA1-VL image
    position adds an untapped LoRA): None when none is left, else check_tap's dict."""
    keep = np.isfinite(exact).all(axis=1)
    image = set(getattr(ctx.port, "image_positions", ()))
    if short == "self_attn.qkv_proj:value":     # the delayed half of t is v_proj_delayed of t - 1
        image |= {t + 1 for t in image}
    image = sorted(t for t in image if t < len(keep))
    if image and short in VL_STEPS:   # ZAYA1-VL: at image positions the vision LoRA (no tap) adds to this step's input
        keep[image] = False
    if rows is not None:
        sel = np.zeros(len(keep), dtype=bool)
        sel[[t for t in rows if t < len(keep)]] = True
        keep &= sel
    storage = storage_of(port)
    ex, pr, ext, sde = exact[keep], port[keep], extra[keep], sd[keep]
    if not ex.size:
        return None
    ulp = storage_ulp(ex, storage)
    ratio = np.abs(pr - ex) / (ulp + ext)
    ratio[np.isnan(pr)] = np.inf
    at = int(np.argmax(ratio)) if ratio.size else 0
    z = (pr - ex) / np.sqrt(np.square(ulp) / 12 + np.square(sde))
    rms = float(np.sqrt(np.mean(np.square(z)))) if np.all(np.isfinite(z)) else float("inf")
    return {"storage": storage, "judged": int(ratio.size), "past": int((ratio > 1).sum()), "rms": rms,
            "worst": float(ratio.max()), "at": int(np.flatnonzero(keep)[at // ex.shape[1]])}
