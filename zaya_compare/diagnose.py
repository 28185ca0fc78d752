"""Weights or code? The decision behind --local's and --quant's verdicts, from the per-layer, per-tap local errors.

A port whose WEIGHTS differ from the replay's (a quantized port judged against the checkpoint) departs at
the first product that reads each weight: in every layer q_proj, k_proj, v_proj_current and
v_proj_delayed depart although their one input, input_layernorm, agrees. A port whose CODE differs (a
cast, an approximation, a RoPE base, a missing term) departs at one step, while the steps before it,
the products that read weights among them, agree to float32 rounding: their weights are the
checkpoint's. So per layer (docs/compare.md §9):

  fed clean   a tap whose inputs (names.DEPS; a missing tap stands for its own inputs) all agree;
  departure   a tap fed clean that is past its tolerance: an error that enters at that very step;
  evidence    the products (PRODUCTS: the taps that multiply by a weight matrix or kernel) fed clean,
              agreeing or departing.

The weights differ when, in most layers and in the first layer that departs, two or more products fed
clean depart and none agrees (unless the replay's weights are the port's own GGUF's: then its products
compute otherwise, e.g. ggml's F16 / Q8_0 activations). Otherwise the first local error is named, with the evidence that the
weights are the checkpoint's (which products fed clean agree, and how closely) and in how many layers
the same step departs. diagnose() returns that decision; local.report() and quant.py print it. The
decision uses the rows of local.judge_layers() only (no new metric, no new tolerance).
"""
import numpy as np

from .metrics import fmt
from .names import DEPS, LAYER_TENSORS

# The taps that multiply by a weight matrix or kernel, in execution order: what a quantized port changes
PRODUCTS = ["self_attn.qkv_proj.q_proj", "self_attn.qkv_proj.k_proj", "self_attn.qkv_proj.conv_qk_depthwise",
            "self_attn.qkv_proj.conv_qk_grouped", "self_attn.qkv_proj.v_proj_current",
            "self_attn.qkv_proj.v_proj_delayed", "self_attn.o_proj", "mlp.gate.down_proj", "mlp.gate.router_mlp.fc1",
            "mlp.gate.router_mlp.fc2", "mlp.gate.router_mlp", "mlp.experts"]
# At least this many distinct products fed clean departing in a layer (and none agreeing) say its weights
# differ: one departing product is one step's code (or that one weight's layout), never "all the weights"
MIN_WEIGHT_DEPARTURES = 2
# A port whose products hold bf16 numbers in at least this fraction of their values computes in bf16
BF16_FRACTION = 0.9


GGML_PRODUCTS = ("ggml rounds the activations of an F16 weight to F16 and quantizes those of a quantized weight (Q8_0: "
                 "to Q8_0 blocks) (docs/compare.md §9)")


def short(name):
    return name.split(".", 3)[3] if name.startswith("model.layers.") else name


class Layer:
    """One layer's evidence: status per tap ('agree' / 'depart'), the taps fed clean and the departures."""

    def __init__(self, layer, layer_rows):
        self.layer = layer
        self.rows = {short(n): (e, gate, bad) for n, e, _, gate, bad in layer_rows
                     if not n.endswith("router_indices") and e is not None}
        self.departures = [s for s in LAYER_TENSORS if s in self.rows and self.rows[s][2] and self.fed_clean(s)]
        self.product_departures = [s for s in self.departures if s in PRODUCTS]
        self.product_agreements = [s for s in PRODUCTS if s in self.rows and not self.rows[s][2] and self.fed_clean(s)]

    def input_status(self, dep, seen=()):
        """True when the tap `dep` agrees ("" = the layer's input, the port's own); a tap the dump does not have
        stands for its own inputs."""
        if dep == "":
            return True
        if dep in self.rows:
            return not self.rows[dep][2]
        if dep in seen or dep not in DEPS:
            return False
        return all(self.input_status(d, seen + (dep,)) for d in DEPS[dep])

    def fed_clean(self, s):
        return s in DEPS and all(self.input_status(d) for d in DEPS[s])

    def weights_differ(self):
        return len(self.product_departures) >= MIN_WEIGHT_DEPARTURES and not self.product_agreements

    def inputs_of(self, s):
        """The nearest inputs of tap s the dump has, with their local errors: [(short name, error)]."""
        out = []
        for d in DEPS.get(s, []):
            if d == "":
                continue
            if d in self.rows:
                out.append((d, self.rows[d][0]))
            else:
                out += self.inputs_of(d)
        return out


class Diagnosis:
    """verdict: 'agree' (no tap past its tolerance), 'weights' (the weights differ), 'products' (every product
    departs on the port's own weights: its products compute otherwise, e.g. ggml's rounded activations), 'code'
    (a step's code differs: `first` names it), 'bf16' (an fp32 judgement of a port that computes in bf16) or
    'unknown' (the dump lacks the taps that tell)."""

    def __init__(self, verdict, layers, first, bf16=None, gguf="the replay's"):
        self.verdict, self.layers, self.first, self.bf16, self.gguf = verdict, layers, first, bf16, gguf

    @property
    def departing(self):
        return [L for L in self.layers if L.departures or any(r[2] for r in L.rows.values())]

    def same_step_layers(self, step):
        """The layers whose first departure (fed clean) is `step`."""
        return [L.layer for L in self.layers if L.departures and L.departures[0] == step]

    def weight_lines(self, whose="the checkpoint's"):
        """Where the products depart in the first departing layer (the weights case)."""
        L = next(L for L in self.layers if L.weights_differ())
        ins = sorted({d for s in L.product_departures for d, _ in L.inputs_of(s)})
        errs = [L.rows[d][0] for d in ins if d in L.rows]
        deps = ", ".join(f"{fmt(L.rows[s][0])} {s.split('.')[-1]}" for s in L.product_departures)
        alike = [x.layer for x in self.layers if x.weights_differ()]
        return [f"layer {L.layer}: every product that reads a weight departs where its inputs agree: {deps} "
                f"(tolerance {fmt(L.rows[L.product_departures[0]][1])})"
                + (f"; their inputs {', '.join(ins)} agree ({fmt(max(errs))})" if errs else
                   "; their input is the layer's input, the port's own"),
                f"the same in {len(alike)} of {len(self.layers)} layers"
                + (f" ({', '.join(map(str, alike))})" if len(alike) < len(self.layers) else "")
                + f": products that compute right on {whose} weights would agree to float32 rounding"]

    def code_lines(self):
        """The evidence that the weights are the checkpoint's, and where else the step departs (the code case)."""
        layer, name = self.first[0], self.first[1]
        s = short(name)
        L = next((x for x in self.layers if x.layer == layer), None)
        if L is None:
            return []
        out = []
        ins = [(d, e) for d, e in L.inputs_of(s)]
        before = [p for p in L.product_agreements if LAYER_TENSORS.index(p) < LAYER_TENSORS.index(s)] \
            if s in LAYER_TENSORS else []
        if ins and s in L.departures:
            out.append(f"its inputs agree ({', '.join(f'{d.split(chr(46))[-1]} {fmt(e)}' for d, e in ins)}): the error "
                       f"enters at this step")
        if before:
            top = max(L.rows[p][0] for p in before)
            out.append(f"the products before it that read weights agree to float32 rounding "
                       f"({', '.join(p.split('.')[-1] for p in before)}: at most {fmt(top)}): the weights are "
                       f"{self.gguf}; the port's code differs")
        elif L.product_agreements:
            out.append(f"products fed the same inputs agree ({', '.join(p.split('.')[-1] for p in L.product_agreements)}:"
                       f" at most {fmt(max(L.rows[p][0] for p in L.product_agreements))}): the weights are "
                       f"{self.gguf}; the port's code differs")
        same = self.same_step_layers(s)
        if len(same) > 1:
            out.append(f"the same step is where the error enters in {len(same)} of {len(self.layers)} layers "
                       f"({', '.join(map(str, same))}): code every such layer runs")
        return out


def bf16_fraction(port, names):
    """The fraction of the values of the first product tap the port has that are bf16 numbers, or None."""
    for n in names:
        if short(n) in PRODUCTS and port.has(n):
            _, a = port.load(n)
            a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
            if a.size:
                return float(np.count_nonzero((a.view(np.uint32) & 0xFFFF) == 0)) / a.size
    return None


def diagnose(rows, first, port=None, names=(), bf16_judged=False, gguf=None):
    """The decision from local.judge_layers()'s rows and first; port and names (the compared taps) let it see a
    port computing in bf16 judged by fp32 tolerances (bf16_judged: an envelope was given); gguf: the GGUF the
    replay's blob was exported from (its provenance), whose weights are then the port's own: 'products'."""
    layers = [Layer(r[0], r[6]) for r in rows]
    whose = "the GGUF's" if gguf else "the checkpoint's"     # the weights the replay multiplies by
    if first is None:
        return Diagnosis("agree", layers, None)
    if port is not None and not bf16_judged:
        frac = bf16_fraction(port, names)
        if frac is not None and frac >= BF16_FRACTION:
            return Diagnosis("bf16", layers, first, frac)
    departing = [L for L in layers if L.departures]
    weights = [L for L in departing if L.weights_differ()]
    first_layer = next((L for L in layers if L.layer == first[0]), None)
    if weights and first_layer in weights and 2 * len(weights) > len(departing):
        # with the GGUF's own weights (the replay's blob exported from it) the products themselves compute otherwise
        return Diagnosis("products" if gguf else "weights", layers, first)
    if first_layer is None or not (first_layer.product_agreements or first_layer.product_departures):
        return Diagnosis("unknown", layers, first)      # no product fed clean in the dump: no evidence either way
    return Diagnosis("code", layers, first, gguf=whose)
