"""--envelope: is a port's drift from fp32 bf16 rounding or a bug? (compare.py PORT FP32 --envelope BF16)

EnvelopeCheck judges the port's row distances from the fp32 reference against those of known-good bf16
runs of the same ids; envelope_report() prints it; main(args) is the view compare.py calls.
"""
import json
import math
import re
import sys

import numpy as np

from .dumps import Dump, InputError, guarded, need_router_indices
from .endtoend import Comparison
from .metrics import fmt, fsum, row_errors, row_metrics, topk_ids
from .names import ATOL, FLOOR_REL, LOGITS_ATOL, STATE_SUFFIXES, TOPK_RE, kind_of, layer_of

# Precision envelope: is it bf16 or a bug? (docs/compare.md, "Is it bf16 or a bug?")
#
# A bf16 port cannot agree with the fp32 reference within fp32 tolerances, and two legitimate bf16 runs
# differ from each other about as much as each differs from fp32 (docs/bf16.md). So the port's distance
# from fp32 is judged, row by row, against the distance of known-good bf16 runs of the same ids: the
# ENVELOPE (zaya.c --precision bf16, or the official bf16 run) and optionally a SPREAD run (another
# legitimate bf16 execution, e.g. the official token-by-token run). For a tensor with rows t:
#
#   d_X(t)   = ||X_t - F_t|| / max(||F_t||, FLOOR_REL * rowrms(F), ATOL * sqrt(n))   (the row error above)
#   env(t)   = max(d_E(t), d_S(t), ENV_SMOOTH * rms_t d_E, ENV_SMOOTH * rms_t d_S, rtol of the kind)
#   ratio(t) = d_P(t) / env(t);   tensor ratio = rms_t d_P / max(rms_t d_E, rms_t d_S, rtol)
#
# A row exceeds the envelope when ratio(t) > ENV_ROW_K, or when the tensor ratio > ENV_TENSOR_K and
# ratio(t) > ENV_TENSOR_K. Tensors with one value per position (router weight, margins) are too coarse in
# bf16 to judge alone (a 1-ulp change of a probability is 0.4 %): they are judged through the tensors
# they feed and the routing flips. Routing: bf16 moves router margins (on the fixture by up to 0.01 in
# layer 0 and 0.14 in layer 5), so a port flip is a near-tie when its fp32 margin is below
# max(--near-tie, ENV_FLIP_K x the largest margin change an envelope run shows in that layer), else a
# bug. A row downstream of routing flips (compare.py's shadow: the flipped position, later positions in
# later layers) is judged against the envelope runs with exactly the same upstream flips as the port
# (same layer, position, expert; or none), and not judged when no run shares them; rows downstream of
# a run's own flips are left out of its smoothing scale. Logits rows use max |a - b| over the fp32 top-k ids (floor
# LOGITS_ATOL). Caches (state tensors) are judged through the K/V rows.
#
# The limits come from legitimate bf16 runs on the compact fixture (hidden 16, so 16-wide rows: the
# noisiest a ZAYA model has), judged with the official whole-prompt bf16 run (golden_bf16) as the
# envelope and no spread: the official token-by-token run (golden_bf16/decode) and a torch 1.13 replica
# of the official bf16 forward (it reproduces golden_bf16 bit for bit) switched to torch >= 2.1's
# formulas (docs/bf16.md: SiLU rounded once, Python scalars in fp32, qk-norm accumulated in fp32; each
# alone and together) or rounding x-hat once less in RMSNorm. Largest row ratio 3.91 (o_proj, layer 3),
# largest tensor ratio 1.72, largest flip margin / margin change 0.77 (layer 3, margin 0.036). The limits
# ENV_ROW_K = 6, ENV_TENSOR_K = 3 and ENV_FLIP_K = 1.5 are 1.5-2 times these; the injected porter bugs
# of test/test_precision.py and the same bugs propagated through that replica exceed them 10-300 times
# at the tensor where they enter. ENV_SMOOTH = 1 (the envelope row is at least the envelope's rms over
# rows) keeps a row where the envelope run happened to land next to fp32 from becoming a pinhole. Bugs
# inside these limits are not distinguishable end to end; the step-by-step replay is the tool for them.
ENV_ROW_K = 6.0
ENV_TENSOR_K = 3.0
ENV_SMOOTH = 1.0
ENV_FLIP_K = 1.5    # bf16 near-tie: fp32 margin < 1.5 x the envelope's largest margin change in that layer
ENV_FAR = 0.1       # every tensor ratio below this: the port is an fp32 run, far below the envelope
ENV_NOT_JUDGED = (":router_margin", ":router_scores", ".mlp.gate.router_indices") + STATE_SUFFIXES


def env_row_dists(side, ref, name):
    """(row errors d(t) of side's tensor against ref's, sum (a-b)^2, sum b^2); compare.py's row error."""
    sa, a = side.load(name)
    sb, b = ref.load(name)
    if not sb or not sa or sa[0] != sb[0] or math.prod(sa) != math.prod(sb):
        raise InputError(f"{side.label} {name}: shape {list(sa)}, FP32 reference {list(sb)}\n  hint: all dumps "
                         f"must hold the same prompt, token-major [T, ...] (docs/compare.md)")
    rows, n = sb[0], math.prod(sb[1:]) if len(sb) > 1 else 1
    sq_d, sq_b = row_metrics(a.reshape(rows, n), b.reshape(rows, n))[:2]
    tot_d, tot_b = fsum(sq_d), fsum(sq_b)
    floor = max(FLOOR_REL * math.sqrt(tot_b / rows), ATOL * math.sqrt(n))
    return row_errors(sq_d, sq_b, floor), tot_d, tot_b


def env_logits_rows(side):
    """A dump's logits: a [T, V] array (full), or per position {id: logit} (its largest top-k), or None."""
    if side.has("logits"):
        shape, data = side.load("logits")
        return data.reshape(shape[0], -1)
    ks = sorted({int(m.group(1)) for m in map(TOPK_RE.match, side.order) if m})
    for k in reversed(ks):
        if side.has(f"logits:top{k}_ids") and side.has(f"logits:top{k}_values"):
            si, ids = side.load(f"logits:top{k}_ids")
            _, vals = side.load(f"logits:top{k}_values")
            ids, vals = ids.reshape(si[0], -1).tolist(), vals.reshape(si[0], -1).tolist()
            return [dict(zip(i, v)) for i, v in zip(ids, vals)]
    return None


def env_logits_ids(ref_rows, k=16):
    """Per position: the reference's top-k ids, descending (ties: lowest id first)."""
    return [sorted(b, key=lambda i: -b[i])[:k] if isinstance(b, dict) else topk_ids(b, k) for b in ref_rows]


def env_logits_dists(rows, ref_rows, ref_ids):
    """Per position: max |a - b| over the reference's top-k ids that both sides hold (inf when none)."""
    out = []
    for a, b, ids in zip(rows, ref_rows, ref_ids):
        if isinstance(a, dict):
            common = [i for i in ids if i in a]
            va = np.array([a[i] for i in common], dtype=np.float64)
        else:
            common = [i for i in ids if i < len(a)]
            va = a[common].astype(np.float64)
        vb = np.array([b[i] for i in common], dtype=np.float64) if isinstance(b, dict) else b[common].astype(np.float64)
        out.append(float(np.abs(va - vb).max()) if common else math.inf)
    return np.array(out)


def env_margins(side, layer):
    """Top-1 minus top-2 biased router score per position (from :router_margin or :router_scores), or None."""
    p = f"model.layers.{layer}.mlp.gate"
    if side.has(p + ":router_margin"):
        return side.load(p + ":router_margin")[1].reshape(-1).astype(np.float64)
    if side.has(p + ":router_scores"):
        shape, data = side.load(p + ":router_scores")
        s = np.sort(data.reshape(-1, shape[-1]).astype(np.float64), axis=1)
        return s[:, -1] - s[:, -2]
    return None


def rms_of(d, mask):
    """Root mean square of d over the rows of a boolean mask (0 when none)."""
    n = int(mask.sum())
    return math.sqrt(fsum(np.square(d[mask])) / n) if n else 0.0


class EnvelopeCheck:
    """Judges PORT's distance from FP32 against the ENVELOPE's (and SPREAD's), tensor by tensor, row by row."""

    def __init__(self, port, ref, env, spread, near_tie):
        self.port, self.ref, self.env, self.spread, self.near_tie = port, ref, env, spread, near_tie
        self.runs = [("ENVELOPE", env)] + ([("SPREAD", spread)] if spread else [])
        # routing flips (and the rows downstream of them) of each run against the fp32 reference
        self.cmp = {}
        for label, side in [("PORT", port)] + self.runs:
            c = Comparison(side, ref, "fp32", 1.0, near_tie)
            c.run()
            if c.errors:
                raise InputError(f"{label} {side.folder}: " + c.errors[0])
            self.cmp[label] = c
        self.results, self.not_judged, self.scalar_rows = [], [], []
        self._keys, self._share = {}, {}
        # bf16 moves router margins: a port flip is a bf16 near-tie when its fp32 margin is below
        # ENV_FLIP_K times the largest margin change an envelope run shows in that layer
        self.margin_move = {}
        for label, side in self.runs:
            c = self.cmp[label]
            for layer, _, _ in c.routing:
                a, b = env_margins(side, layer), env_margins(ref, layer)
                ia, ib = (x.load(f"model.layers.{layer}.mlp.gate.router_indices")[1].reshape(-1) for x in (side, ref))
                if a is None or b is None:
                    continue
                m = min(len(a), len(b), len(ia), len(ib))
                same = ia[:m] == ib[:m]
                moved = np.abs(a[:m] - b[:m])[same]
                self.margin_move[layer] = max([self.margin_move.get(layer, 0.0)] + moved.tolist())
        for label in self.cmp:
            for f in self.cmp[label].flips:
                limit = max(near_tie, ENV_FLIP_K * self.margin_move.get(f["layer"], 0.0))
                if f["label"] == "BUG" and f["margin"] is not None and f["margin"] < limit:
                    f["label"] = "bf16 near-tie"

    def flip_keys(self, label, exec_idx, name, rows):
        """Per row: the routing flips of run `label` (vs FP32) upstream of it, as (layer, position, choice)
        (the rows compare.py's shadowed() leaves out: the flipped position, and later positions in later layers).
        The same upstream flips give the same list object (memoised)."""
        layer = layer_of(name)
        state = name.endswith(STATE_SUFFIXES)
        up = [(f, layer is None or layer > f["layer"] or state) for f in self.cmp[label].flips if exec_idx > f["exec"]]
        memo = (label, rows, tuple((id(f), later) for f, later in up))
        if memo not in self._keys:
            keys = []
            for pos in range(rows):
                keys.append(frozenset((f["layer"], f["position"], f["test"]) for f, later in up
                                      if pos == f["position"] or (pos > f["position"] and later)))
            self._keys[memo] = (keys, np.array([not k for k in keys], dtype=bool))
        return self._keys[memo]

    def shares(self, keys, pkeys):
        """Per row: does a run have exactly the port's upstream flips?"""
        memo = (id(keys), id(pkeys))
        if memo not in self._share:
            self._share[memo] = np.array([k == p for k, p in zip(keys, pkeys)], dtype=bool)
        return self._share[memo]

    def judge(self, exec_idx, name, kind, rtol, d_port, dists, port_rel, others_rel):
        """dists = [(label, d(t) array)] of the envelope runs; fills one result. A row is judged against the
        runs whose upstream routing flips are the port's (same layer, position, expert; or none), and not
        judged when no run shares them."""
        rows = len(d_port)
        pkeys, _ = self.flip_keys("PORT", exec_idx, name, rows)
        smooth, usable_any, best = rtol, np.zeros(rows, bool), np.full(rows, -np.inf)
        for label, d in dists:
            keys, no_flip = self.flip_keys(label, exec_idx, name, rows)
            smooth = max(smooth, ENV_SMOOTH * rms_of(d, no_flip))
            usable = self.shares(keys, pkeys) & np.isfinite(d)
            usable_any |= usable
            best = np.where(usable, np.maximum(best, d), best)
        # after routing flips the port and the envelope runs may not share: those rows are not judged
        judged = np.flatnonzero(usable_any)
        env_rows = np.maximum(smooth, best)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_a = d_port / env_rows
        ratio = [None] * rows
        for t in judged.tolist():
            ratio[t] = float(ratio_a[t])
        # the tensor ratio compares the same rows on both sides
        t_ratio = rms_of(d_port, usable_any) / max(rtol, rms_of(best, usable_any))
        r = ratio_a[judged]
        bad_mask = ~np.isfinite(r) | (r > ENV_ROW_K) | ((t_ratio > ENV_TENSOR_K) & (r > ENV_TENSOR_K))
        bad = judged[bad_mask].tolist()
        worst = int(judged[np.argmax(r)]) if judged.size else None
        self.results.append({
            "name": name, "exec": exec_idx, "kind": kind, "port_rel_l2": port_rel,
            "envelope_rel_l2": others_rel.get("ENVELOPE"), "spread_rel_l2": others_rel.get("SPREAD"),
            "tensor_ratio": t_ratio, "max_ratio": ratio[worst] if worst is not None else None,
            "max_ratio_pos": worst, "bad": bad, "first_bad": bad[0] if bad else None,
            "shadowed": rows - len(judged), "after_flips": sum(1 for t in judged.tolist() if pkeys[t]),
            "row_ratios": ratio})

    def run(self):
        logits_done = False
        for exec_idx, name in enumerate(self.ref.order):
            is_logits = name == "logits" or TOPK_RE.match(name)
            if is_logits:
                if not logits_done:
                    logits_done = True
                    self.run_logits(exec_idx)
                continue
            if not self.port.has(name):
                continue
            have = [(label, side) for label, side in self.runs if side.has(name)]
            dtype = self.ref.entries[name].get("dtype", "float32")
            if name.endswith(ENV_NOT_JUDGED) or dtype != "float32" or not have:
                if not name.endswith(ENV_NOT_JUDGED) and dtype == "float32":
                    self.not_judged.append(name)
                continue
            if math.prod(self.ref.entries[name].get("shape", [0, 0])[1:]) == 1:
                self.scalar_rows.append(name)   # one value per position: too coarse in bf16 to judge alone
                continue
            kind, rtol = kind_of(name)
            d_port, pd, pb = env_row_dists(self.port, self.ref, name)
            dists, rel = [], {}
            for label, side in have:
                d, sd, sb = env_row_dists(side, self.ref, name)
                dists.append((label, d))
                rel[label] = math.sqrt(sd / sb) if sb else None
            self.judge(exec_idx, name, kind, rtol, d_port, dists, math.sqrt(pd / pb) if pb else None, rel)

    def run_logits(self, exec_idx):
        ref_rows = env_logits_rows(self.ref)
        port_rows = env_logits_rows(self.port)
        if ref_rows is None or port_rows is None:
            return
        ref_ids = env_logits_ids(ref_rows)
        dists = []
        for label, side in self.runs:
            rows = env_logits_rows(side)
            if rows is not None:
                dists.append((label, env_logits_dists(rows, ref_rows, ref_ids)))
        if not dists:
            self.not_judged.append("logits")
            return
        name = next(n for n in self.ref.order if n == "logits" or TOPK_RE.match(n))
        name = "logits" if name == "logits" else re.sub(r"_ids$", "_values", name)
        port_dists = env_logits_dists(port_rows, ref_rows, ref_ids)
        self.judge(exec_idx, name, "logits", LOGITS_ATOL, port_dists, dists, None, {})
        self.results[-1].update(port_max_abs=float(port_dists.max()),
                                envelope_max_abs=float(dists[0][1].max()))

    def exceeded(self):
        """(position, exec, name, ratio or None, flip or None) of the first row past the envelope, or None."""
        cands = [(r["first_bad"], r["exec"], r["name"], r["row_ratios"][r["first_bad"]], None)
                 for r in self.results if r["bad"]]
        cands += [(f["position"], f["exec"], f"model.layers.{f['layer']}.mlp.gate.router_indices", None, f)
                  for f in self.cmp["PORT"].flips if f["label"] == "BUG"]
        return min(cands, key=lambda c: (c[0], c[1])) if cands else None

    def layer_rows(self):
        by = {r["name"]: r for r in self.results}
        out = []
        for i in sorted({layer_of(r["name"]) for r in self.results if layer_of(r["name"]) is not None}):
            o = by.get(f"model.layers.{i}.post_mlp_residual_scale", {})
            mine = [r for r in self.results if layer_of(r["name"]) == i and r["max_ratio"] is not None]
            worst = max(mine, key=lambda r: r["max_ratio"], default=None)
            out.append({"layer": i, "port": o.get("port_rel_l2"), "envelope": o.get("envelope_rel_l2"),
                        "spread": o.get("spread_rel_l2"), "tensor_ratio": o.get("tensor_ratio"),
                        "rows": len(o["row_ratios"]) if o else None,
                        "judged": len(o["row_ratios"]) - o["shadowed"] if o else None,
                        "worst": worst and (worst["name"], worst["max_ratio"], worst["max_ratio_pos"])})
        return out


def envelope_report(e, verbose):
    p, r = e.port, e.ref
    def desc(d):
        prec = d.index.get("precision")
        return f"{d.folder}: {d.producer()}" + (f", precision {prec}" if prec else "")
    print(f"PORT     {desc(p)}")
    print(f"FP32     {desc(r)}")
    for label, side in e.runs:
        print(f"{label:8s} {desc(side)}")
    print(f"mode: precision envelope: row ratio = the port's row distance from FP32 / the envelope's "
          f"(docs/compare.md); limits: row {ENV_ROW_K:g}x, tensor {ENV_TENSOR_K:g}x")
    for label, side in e.runs:
        if side.index.get("precision") not in (None, "bf16"):
            print(f"note: {label} says precision {side.index.get('precision')}: the envelope should be a bf16 run")
    has_spread = e.spread is not None
    print("\nper layer (port, envelope: rel L2 of the layer output against FP32 over all rows; judged ratio: the "
          "port's row distances / the envelope's,\nRMS over the judged rows only (rows after routing flips no envelope "
          "run shares are left out), so it is not port / envelope when rows are left out):")
    print(f"{'layer':>5s} {'port':>10s} {'envelope':>10s}" + (f" {'spread':>10s}" if has_spread else "")
          + f" {'judged rows':>11s} {'judged ratio':>12s}  largest row ratio (tensor, position)")
    for row in e.layer_rows():
        w = row["worst"]
        judged = f"{row['judged']}/{row['rows']}" if row["rows"] is not None else "-"
        print(f"{row['layer']:5d} {fmt(row['port']):>10s} {fmt(row['envelope']):>10s}"
              + (f" {fmt(row['spread']):>10s}" if has_spread else "")
              + f" {judged:>11s} {fmt(row['tensor_ratio'], '.2f'):>12s}  " + (f"{w[1]:.2f} ({w[0]}, {w[2]})" if w else "-"))
    if e.margin_move:
        print(f"bf16 near-tie: a flip at an fp32 margin below max({e.near_tie:g}, {ENV_FLIP_K:g} x the largest margin "
              f"change of an envelope run in that layer): " + ", ".join(
                  f"layer {l} {max(e.near_tie, ENV_FLIP_K * m):.3g}" for l, m in sorted(e.margin_move.items())))
    for label in ["PORT"] + [lbl for lbl, _ in e.runs]:
        c = e.cmp[label]
        agree, total = sum(a for _, a, _ in c.routing), sum(n for _, _, n in c.routing)
        if not total:
            continue
        flips = ", ".join(f"layer {f['layer']} position {f['position']} margin {fmt(f['margin'], '.3g')} "
                          f"({f['label']})" for f in c.flips)
        print(f"routing {label.lower()} vs FP32: {agree}/{total} agree" + (f"; flips: {flips}" if flips else ""))
    for label in ["PORT"] + [lbl for lbl, _ in e.runs]:
        L = e.cmp[label].logits
        if L:
            print(f"logits {label.lower()} vs FP32: top-1 agree {L['top1_agree']}/{L['positions']}, "
                  f"max|a-b| {fmt(L['max_abs'])}")
    shown = [x for x in e.results if verbose or x["bad"]]
    if shown:
        print(f"\n{'tensor':58s} {'port relL2':>10s} {'env relL2':>10s} {'t.ratio':>7s} {'max row':>8s} "
              f"{'at':>4s} {'1st bad':>7s}")
        for x in shown[:len(shown) if verbose else 20]:
            print(f"{x['name']:58s} {fmt(x['port_rel_l2']):>10s} {fmt(x['envelope_rel_l2']):>10s} "
                  f"{fmt(x['tensor_ratio'], '.2f'):>7s} {fmt(x['max_ratio'], '.2f'):>8s} "
                  f"{fmt(x['max_ratio_pos'], 'd'):>4s} {fmt(x['first_bad'], 'd'):>7s}")
        if not verbose and len(shown) > 20:
            print(f"... {len(shown) - 20} more tensors past the envelope (--verbose lists every tensor)")
    if e.scalar_rows:
        print(f"\nnot judged alone, one value per position (judged through the tensors they feed) "
              f"({len(e.scalar_rows)}): " + ", ".join(e.scalar_rows[:4]) + (" ..." if len(e.scalar_rows) > 4 else ""))
    if e.not_judged:
        print(f"\nnot judged (no envelope run has them) ({len(e.not_judged)}): " + ", ".join(e.not_judged[:8])
              + (" ..." if len(e.not_judged) > 8 else ""))
    n_after = sum(x["after_flips"] for x in e.results)
    n_skip = sum(x["shadowed"] for x in e.results)
    print(f"\njudged {len(e.results)} tensors against the envelope; {n_after} rows after the port's routing flips "
          f"judged against an envelope run that made the same flips; {n_skip} rows after flips the port and the "
          f"envelope runs do not share (not judged)")
    first = e.exceeded()
    if first:
        pos, ex, name, ratio, flip = first
        if flip:
            print(f"VERDICT: exceeds it first at {name}, position {pos}: routing flip (PORT {flip['test']}, "
                  f"FP32 {flip['ref']}) at margin {fmt(flip['margin'], '.4g')} >= {e.near_tie:g}, not a near-tie")
        else:
            print(f"VERDICT: exceeds it first at {name}, position {pos}, by {ratio:.3g}x "
                  f"(limit {ENV_ROW_K:g}x per row, {ENV_TENSOR_K:g}x for a whole tensor)")
        prev = [x["name"] for x in e.results if x["exec"] < ex]
        if prev:
            print(f"  every tensor before it is within the envelope at positions <= {pos}; look at the computation "
                  f"between {prev[-1]} and {name} (docs/bf16.md says where bf16 rounds there)")
        return 1
    judged = [x for x in e.results if x["max_ratio"] is not None]
    if not judged:
        print("VERDICT: nothing to judge (no tensor in PORT, FP32 and the envelope together)")
        return 2
    w = max(judged, key=lambda x: x["max_ratio"])
    far = max(x["tensor_ratio"] for x in judged) < ENV_FAR
    n_rows = sum(len(x["row_ratios"]) for x in e.results)
    unjudged = (f" ({100.0 * n_skip / n_rows:.0f} % of rows not judged: after routing flips no envelope run shares; "
                f"a --spread run with the port's flips judges them)" if n_skip and n_rows else "")
    print("VERDICT: within the bf16 envelope" + (" (far below it: as close to FP32 as an fp32 run)" if far else "")
          + unjudged + f"; largest row ratio {w['max_ratio']:.3g}x at {w['name']}, position {w['max_ratio_pos']} "
          f"(limit {ENV_ROW_K:g}x)")
    return 0


def main(args):
    """compare.py PORT FP32 --envelope BF16 [--spread BF16_OTHER]: is the port's drift bf16 or a bug?"""
    if args.tol_scale != 1.0 or args.weights or args.strict:
        print("compare.py: --tol-scale, --weights and --strict do not apply with --envelope (its limits are "
              "measured, docs/compare.md §8)", file=sys.stderr)
        return 2
    def judge():
        dumps = [Dump(args.test_dir, "PORT"), Dump(args.ref_dir, "FP32"), Dump(args.envelope, "ENVELOPE")]
        if args.spread:
            dumps.append(Dump(args.spread, "SPREAD"))
        ref = dumps[1]
        toks = [(d.label, d.tokens) for d in dumps if d.tokens is not None]
        for label, t in toks[1:]:
            if t != toks[0][1]:
                raise InputError(f"{label} and {toks[0][0]} are dumps of different prompts ({len(t)} vs "
                                 f"{len(toks[0][1])} tokens)\n  hint: dump every run with the same --ids")
        for d in dumps:
            if d.tokens is None and toks:
                d.tokens = toks[0][1]
        for d in dumps:
            need_router_indices(d, "--envelope")
        e = EnvelopeCheck(dumps[0], ref, dumps[2], dumps[3] if args.spread else None, args.near_tie)
        e.run()
        return e

    e, rc = guarded(judge)
    if rc:
        return rc
    rc = envelope_report(e, args.verbose)
    if args.json:
        try:
            with open(args.json, "w") as f:
                first = e.exceeded()
                json.dump({"mode": "envelope", "port": e.port.folder, "fp32": e.ref.folder,
                           "envelope": e.env.folder, "spread": e.spread.folder if e.spread else None,
                           "limits": {"row": ENV_ROW_K, "tensor": ENV_TENSOR_K, "smooth": ENV_SMOOTH},
                           "tensors": e.results, "layers": e.layer_rows(), "not_judged": e.not_judged,
                           "flips": {k: c.flips for k, c in e.cmp.items()},
                           "verdict": "exceeds" if first else "within",
                           "first": first and {"name": first[2], "position": first[0], "ratio": first[3]}},
                          f, indent=1, default=str)
        except OSError as err:
            print(f"compare.py: cannot write {args.json}: {err.strerror}", file=sys.stderr)
            return 2
    return rc


