"""The plain comparison: TEST against REF, row by row, and the FIRST DIVERGENCE (compare.py TEST REF).

Comparison runs it (tensor by tensor in the reference's execution order: float rows against the
tolerances of names.py, router_indices as routing flips judged by the reference's margins, logits full
or top-k); report() prints it; main(args) is the view compare.py calls.
"""
import json
import math
import sys

import numpy as np

from .dumps import same_model, Dump, InputError, guarded, position_text, declared_weights
from .metrics import cosine, cosines, fmt, fsum, logits_rows_stats, row_errors, row_metrics, topk_ids, unravel
from .names import (ATOL, COS_INT8, COS_INT8_ROW, FLOOR_REL, LOGITS_ATOL, LOGITS_TOPK_ATOL_INT8, STATE_SUFFIXES,
                    TOPK_RE, is_vision, kind_of, layer_of)


class Comparison:
    def __init__(self, test, ref, mode, scale, near_tie):
        self.test, self.ref, self.mode, self.scale, self.near_tie = test, ref, mode, scale, near_tie
        self.T = len(ref.tokens) if ref.tokens is not None else None
        self.results = []      # one dict per compared tensor, in execution order
        self.flips = []        # routing flips: dicts with layer, position, exec index, margin, label
        self.routing = []      # per layer: (layer, agree, total)
        self.logits = None     # logits summary
        self.errors = []       # input errors (shape mismatch, bad files)
        self.notes = []
        self.skip_differs = (test.skip in ("zero", "passthrough") and ref.skip in ("zero", "passthrough")
                             and test.skip != ref.skip)
        self.ref_skip_rows = {}  # layer -> set of positions the reference routes to the skip expert

    # ---- helpers ----
    def positions_of(self, name, shape):
        """The position of each row of a tensor: token-major tensors row t = position t; state tensors
        hold the last rows of the run (conv state, caches), a 1-D state is the last position."""
        if name.endswith(STATE_SUFFIXES):
            if len(shape) < 2:
                return [self.T - 1 if self.T else 0], math.prod(shape)
            rows = shape[0]
            base = (self.T or rows) - rows
            return [base + r for r in range(rows)], math.prod(shape[1:])
        rows = shape[0] if shape else 1
        return list(range(rows)), math.prod(shape[1:]) if len(shape) > 1 else 1

    def shadow_mask(self, exec_idx, name, positions):
        """Per row position: is it downstream of a routing flip (the flipped position at later tensors, and
        later positions in later layers or in the states)?"""
        pos = np.asarray(positions, dtype=np.int64)
        mask = np.zeros(pos.shape, dtype=bool)
        layer = layer_of(name)
        later_layer_of = {}
        for f in self.flips:
            if exec_idx <= f["exec"]:
                continue
            later = later_layer_of.setdefault(f["layer"], layer is None or layer > f["layer"]
                                              or name.endswith(STATE_SUFFIXES))
            mask |= pos == f["position"]
            if later:
                mask |= pos > f["position"]
        return mask

    def shadowed(self, exec_idx, name, pos):
        """Is row `pos` of this tensor downstream of a routing flip (and which flip)?"""
        layer = layer_of(name)
        for f in self.flips:
            if exec_idx <= f["exec"]:
                continue
            later_layer = layer is None or layer > f["layer"] or name.endswith(STATE_SUFFIXES)
            if pos == f["position"] or (pos > f["position"] and later_layer):
                return f
        return None

    def margin_of(self, layer, pos):
        """The reference's top-1 router margin at (layer, pos), from :router_scores or :router_margin."""
        for side in (self.ref, self.test):
            p = f"model.layers.{layer}.mlp.gate"
            if side.has(p + ":router_scores"):
                shape, data = side.load(p + ":router_scores", keep=True)
                row = np.sort(data.reshape(-1, shape[-1])[pos].astype(np.float64))
                return float(row[-1] - row[-2]), ("reference" if side is self.ref else "TEST (reference has none)")
            if side.has(p + ":router_margin"):
                shape, data = side.load(p + ":router_margin", keep=True)
                return float(data.reshape(-1)[pos]), ("reference" if side is self.ref else "TEST (reference has none)")
        return None, "no :router_scores or :router_margin in either dump"

    def n_experts(self, layer):
        for name in (":router_probs", ":router_scores", ".router_mlp"):
            full = f"model.layers.{layer}.mlp.gate{name}"
            for side in (self.ref, self.test):
                if side.has(full):
                    return side.entries[full].get("shape", [0, 1])[-1] - 1
        return None

    # ---- one tensor ----
    def compare(self, exec_idx, name):
        try:
            sa, a = self.test.load(name)
            sb, b = self.ref.load(name)
        except InputError as e:
            self.errors.append(str(e))
            return
        if list(sa) != list(sb):
            same_rows = sa and sb and sa[0] == sb[0] and math.prod(sa) == math.prod(sb)
            if not same_rows:
                self.errors.append(f"{name}: shape mismatch, TEST {list(sa)} vs REF {list(sb)}\n"
                                   f"  hint: both dumps must hold the same prompt, token-major [T, ...] "
                                   f"(docs/compare.md lists every shape)")
                return
            self.notes.append(f"{name}: TEST {list(sa)} vs REF {list(sb)} differ in the trailing axes; "
                              f"compared row by row")
        a, b = a.reshape(-1), b.reshape(-1)
        is_int = a.dtype.kind in "iu" or b.dtype.kind in "iu"
        kind, rtol = ("integer", 0.0) if is_int else kind_of(name)
        positions, n = self.positions_of(name, sb)
        res = {"name": name, "shape": list(sb), "kind": kind, "exec": exec_idx, "bad": [],
               "shadowed": 0, "excluded": 0}
        if name.endswith(".mlp.gate.router_indices"):
            self.routing_check(exec_idx, name, a, b, res)
        elif is_int:
            rows = len(positions)
            differ = (a.reshape(rows, n) != b.reshape(rows, n)).any(axis=1) if rows and n else np.zeros(rows, bool)
            bad = [positions[r] for r in np.flatnonzero(differ).tolist()]
            diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
            res.update(max_abs=int(diff.max()) if diff.size else 0, rel_l2=None)
            res["bad"] = bad
        else:
            self.float_check(exec_idx, name, kind, rtol, sb, positions, n, a, b, res)
        # rows downstream of a routing flip, and skip-mode rows, are not divergences
        shadow = self.shadow_mask(exec_idx, name, res["bad"]) if res["bad"] else np.zeros(0, bool)
        keep = [p for p, s in zip(res["bad"], shadow.tolist()) if not s]
        res["shadowed"] += int(shadow.sum())
        res["bad"] = keep
        res["first_bad"] = keep[0] if keep else None
        if keep:
            res["status"] = "DIVERGED"
        elif res.get("agree", 0) < b.size and "agree" in res:
            res["status"] = "near-tie routing flip"
        elif res["shadowed"]:
            res["status"] = "after routing flip (near-tie)" if all(
                f["label"] == "near-tie" for f in self.flips) else "after routing flip"
        else:
            res["status"] = "ok"
        self.results.append(res)
        return res

    def float_check(self, exec_idx, name, kind, rtol, shape, positions, n, a, b, res):
        rows = len(positions)
        pos = np.asarray(positions, dtype=np.int64)
        exclude = set()
        if self.skip_differs and name.endswith(":router_weight"):
            exclude = self.ref_skip_rows.get(layer_of(name), set())
            res["excluded"] = len(exclude)
        sq_d, sq_b, sq_a, dot, mx, mi = row_metrics(a.reshape(rows, n), b.reshape(rows, n))
        tot_d, tot_b = fsum(sq_d), fsum(sq_b)
        floor = max(FLOOR_REL * math.sqrt(tot_b / max(rows, 1)), ATOL * self.scale * math.sqrt(n))
        # the whole-tensor cosine (int8 gate) leaves out rows a routing flip or the skip mode explains
        judged = ~np.isin(pos, list(exclude)) if exclude else np.ones(rows, bool)
        clean = judged & ~self.shadow_mask(exec_idx, name, pos)
        cos_tensor = cosine(fsum(sq_a[clean]), fsum(sq_b[clean]), fsum(dot[clean]))
        # int8: a row fails below COS_INT8_ROW, or below COS_INT8 when the whole tensor is below COS_INT8
        cos_gate = 1 - (1 - COS_INT8) * self.scale
        if cos_tensor >= cos_gate:
            cos_gate = 1 - (1 - COS_INT8_ROW) * self.scale
        finite = np.isfinite(sq_d)
        err = row_errors(sq_d, sq_b, floor)
        cos = np.where(finite, cosines(sq_a, sq_b, dot), -1.0)
        worst, worst_at, cos_min, cos_at, worst_err, worst_err_at = -1.0, 0, 2.0, 0, 0.0, 0
        idx = np.flatnonzero(judged)
        if idx.size:
            r = idx[np.argmax(mx[idx])]
            if mx[r] > worst:
                worst, worst_at = float(mx[r]), int(r) * n + int(mi[r])
            r = idx[np.argmin(cos[idx])]
            if cos[r] < cos_min:
                cos_min, cos_at = float(cos[r]), positions[r]
            r = idx[np.argmax(err[idx])]
            if err[r] > worst_err:
                worst_err, worst_err_at = float(err[r]), positions[r]
        if self.mode == "int8":
            is_bad = (cos < cos_gate) | ~finite
        elif kind == "logits":
            is_bad = mx > LOGITS_ATOL * self.scale
        else:
            is_bad = err > rtol * self.scale
        bad = [positions[r] for r in np.flatnonzero(is_bad & judged).tolist()]
        at = unravel(worst_at, [rows] + list(shape[1:]) if len(shape) > 1 else [rows])
        at[0] = positions[at[0]] if at and at[0] < len(positions) else at[0]
        res.update(max_abs=max(worst, 0.0), max_at=at, rel_l2=math.sqrt(tot_d / tot_b) if tot_b else
                   (0.0 if tot_d == 0 else math.inf), cos_min=cos_min if cos_min <= 1.5 else 1.0,
                   cos_min_pos=cos_at, row_err_max=worst_err, row_err_pos=worst_err_at, cos=cos_tensor,
                   tol=(f"cos>={1 - (1 - COS_INT8) * self.scale:g} (tensor), "
                        f">={1 - (1 - COS_INT8_ROW) * self.scale:g} (row)" if self.mode == "int8" else
                        f"max|d|<={LOGITS_ATOL * self.scale:g}" if kind == "logits" else f"rowerr<={rtol * self.scale:g}"))
        res["nmse"] = res["rel_l2"] ** 2 if math.isfinite(res["rel_l2"]) else math.inf
        res["bad"] = bad

    def routing_check(self, exec_idx, name, a, b, res):
        layer = layer_of(name)
        E = self.n_experts(layer)
        if E is not None:
            self.ref_skip_rows[layer] = set(np.flatnonzero(b == E).tolist())
        m = min(a.size, b.size)
        differ = np.flatnonzero(a[:m] != b[:m]).tolist()
        agree, bad = m - len(differ), []
        for t in differ:
            margin, source = self.margin_of(layer, t)
            label = "near-tie" if margin is not None and margin < self.near_tie else "BUG"
            self.flips.append({"layer": layer, "position": t, "exec": exec_idx, "test": int(a[t]), "ref": int(b[t]),
                               "margin": margin, "margin_source": source, "label": label})
            if label == "BUG":
                bad.append(t)
        self.routing.append((layer, agree, int(b.size)))
        res.update(max_abs=None, rel_l2=None, agree=agree, bad=bad)

    # ---- logits ----
    def compare_logits(self, exec_idx):
        """Full logits on both sides, or a top-k representation (`logits:topK_ids/values`) on one or both."""
        def rep(side):
            if side.has("logits"):
                return "full", None
            ks = sorted({int(m.group(1)) for m in map(TOPK_RE.match, side.order) if m})
            for k in reversed(ks):
                if side.has(f"logits:top{k}_ids") and side.has(f"logits:top{k}_values"):
                    return "topk", k
            return None, None
        (rt, kt), (rr, kr) = rep(self.test), rep(self.ref)
        if rt is None or rr is None:
            return
        try:
            if rt == "full" and rr == "full":
                res = self.compare(exec_idx, "logits")
                if res is None:
                    return
                return self.logits_full_stats(res)
            return self.logits_topk(exec_idx, rt, kt, rr, kr)
        except InputError as e:
            self.errors.append(str(e))

    def logits_full_stats(self, res):
        sa, a = self.test.load("logits")
        sb, b = self.ref.load("logits")
        T, V = sb[0], math.prod(sb[1:])
        ia, ib, kls = logits_rows_stats(a.reshape(T, V), b.reshape(T, V), 16)
        top1 = sum(x[0] == y[0] for x, y in zip(ia, ib))
        ov = {k: sum(len(set(x[:k]) & set(y[:k])) / k for x, y in zip(ia, ib)) for k in (5, 16)}
        self.logits = {"representation": "full vs full", "positions": T, "top1_agree": top1,
                       "top5_overlap": ov[5] / T, "top16_overlap": ov[16] / T,
                       "kl_mean": fsum(kls) / T, "kl_max": float(kls.max()), "kl_max_pos": int(kls.argmax()),
                       "max_abs": res["max_abs"], "max_at": res["max_at"]}

    def logits_topk(self, exec_idx, rt, kt, rr, kr):
        def rows(side, kind, k):
            if kind == "full":
                shape, data = side.load("logits")
                return shape[0], [(None, row) for row in data.reshape(shape[0], -1)]
            si, ids = side.load(f"logits:top{k}_ids")
            sv, vals = side.load(f"logits:top{k}_values")
            if list(si) != list(sv) or len(si) != 2:
                raise InputError(f"{side.label} logits:top{k}_ids {list(si)} and _values {list(sv)} must both be [T, {k}]")
            return si[0], list(zip(ids.tolist(), vals.tolist()))
        Ta, ra = rows(self.test, rt, kt)
        Tb, rb = rows(self.ref, rr, kr)
        if Ta != Tb:
            raise InputError(f"logits: TEST has {Ta} positions, REF {Tb}")
        k = min(x for x in (kt, kr) if x)
        name = f"logits:top{kr}_values" if rr == "topk" else "logits"
        res = {"name": name, "shape": [Tb, k], "kind": "logits", "exec": exec_idx, "bad": [], "shadowed": 0,
               "excluded": 0}
        atol = (LOGITS_TOPK_ATOL_INT8 if self.mode == "int8" else LOGITS_ATOL) * self.scale
        top1, ov5, ovk, worst, worst_at, common_min, bad = 0, 0.0, 0.0, 0.0, [0, 0], k, []
        for t in range(Tb):
            (ia, va), (ib, vb) = ra[t], rb[t]
            if ia is None:           # test full: its own top-k, and its values at the reference ids
                ia = topk_ids(va, k)
                la = {i: float(va[i]) for i in ia + ib}
            else:
                la = dict(zip(ia, va))
            if ib is None:
                ib = topk_ids(vb, k)
                lb = {i: float(vb[i]) for i in ia + ib}
            else:
                lb = dict(zip(ib, vb))
            ia, ib = ia[:k], ib[:k]
            top1 += ia[0] == ib[0]
            ov5 += len(set(ia[:5]) & set(ib[:5])) / min(5, k)
            ovk += len(set(ia) & set(ib)) / k
            common = [i for i in ib if i in la]
            common_min = min(common_min, len(common))
            row_worst = 0.0
            for i in common:
                d = abs(la[i] - lb[i])
                if d > row_worst or d != d:
                    row_worst = d
                if d > worst or d != d:
                    worst, worst_at = d, [t, i]
            if row_worst > atol or row_worst != row_worst or (rt == rr == "topk" and ia[0] != ib[0]):
                bad.append(t)
        res.update(max_abs=worst, max_at=worst_at, rel_l2=None, tol=f"max|d|<={atol:g} on the top-{k} ids",
                   bad=bad)
        shadow = self.shadow_mask(exec_idx, name, bad).tolist() if bad else []
        keep = [p for p, s in zip(bad, shadow) if not s]
        res["shadowed"] = len(bad) - len(keep)
        res["bad"] = keep
        res["first_bad"] = keep[0] if keep else None
        res["status"] = "DIVERGED" if keep else ("after routing flip" if res["shadowed"] else "ok")
        self.results.append(res)
        self.logits = {"representation": f"{'full' if rt == 'full' else f'top-{kt}'} (TEST) vs "
                                          f"{'full' if rr == 'full' else f'top-{kr}'} (REF)",
                       "positions": Tb, "top1_agree": top1, "top5_overlap": ov5 / Tb, f"top{k}_overlap": ovk / Tb,
                       "max_abs": worst, "max_at": worst_at, "common_ids_min": common_min,
                       "kl": f"skipped: the {'reference' if rr == 'topk' else 'test'} has only top-{k} logits"}

    # ---- everything ----
    def run(self):
        names = [n for n in self.ref.order if self.test.has(n)]
        logits_names = {n for n in self.ref.order + self.test.order if n == "logits" or TOPK_RE.match(n)}
        logits_done = False
        for idx, name in enumerate(self.ref.order):
            if name in logits_names:
                if not logits_done:
                    logits_done = True
                    self.compare_logits(idx)
                continue
            if self.test.has(name):
                self.compare(idx, name)
        if not logits_done and logits_names:
            self.compare_logits(len(self.ref.order))
        self.only_test = [n for n in self.test.order if not self.ref.has(n) and n not in logits_names]
        self.only_ref = [n for n in self.ref.order if not self.test.has(n) and n not in logits_names]
        if not names and not self.logits:
            self.errors.append("the two dumps have no tensor name in common\n  hint: names are HF module "
                               "paths (docs/compare.md); convert fixture goldens with tools/fixture_to_dump.py")

    def first_divergence(self):
        """Earliest (position, execution index) of a bad row that no routing flip explains. ZAYA1-VL: the vision
        tower runs before every position, so a vision tensor past tolerance comes first (its rows are patches)."""
        best = None
        for r in self.results:
            if r["bad"]:
                key = (-1 if is_vision(r["name"]) else r["first_bad"], r["exec"])
                if best is None or key < best[0]:
                    best = (key, r)
        return best[1] if best else None

    def layer_table(self):
        """Per layer: rel L2 of its output, of its input, and the difference (what the layer adds)."""
        by_name = {r["name"]: r for r in self.results}
        rows, prev = [], by_name.get("model:input_scaled")
        layers = sorted({layer_of(r["name"]) for r in self.results if layer_of(r["name"]) is not None})
        for i in layers:
            out = by_name.get(f"model.layers.{i}.post_mlp_residual_scale")
            rin = prev["rel_l2"] if prev and prev.get("rel_l2") is not None else None
            rout = out["rel_l2"] if out and out.get("rel_l2") is not None else None
            worst = max((r for r in self.results if layer_of(r["name"]) == i and r.get("row_err_max") is not None),
                        key=lambda r: r["row_err_max"], default=None)
            rows.append({"layer": i, "input_rel_l2": rin, "output_rel_l2": rout,
                         "added": (rout - (rin or 0.0)) if rout is not None else None,
                         "worst_tensor": worst["name"] if worst else None,
                         "worst_row_err": worst["row_err_max"] if worst else None})
            prev = out
        return rows



def vision_rows(res):
    """What the rows of a vision tower tensor are (HF Zaya1VLVisionModel's order)."""
    name, rows = res["name"], res["shape"][0] if res.get("shape") else 0
    if name.endswith("rotary_pos_emb"):
        return f"the rotary table's position, of {rows}"
    if name in ("model.visual", "model.visual.patch_embed"):
        return f"{'image feature' if name == 'model.visual' else 'patch'} in image order, of {rows}"
    return f"{'merged patch' if '.merger.mlp' in name or name == 'model.visual.merger' else 'patch'} in window order " \
           f"(HF get_window_index), of {rows}"


def report(c, verbose):
    t, r = c.test, c.ref
    print(f"TEST {t.folder}: {t.producer()}, weights {t.weights}, skip_expert {t.skip}")
    print(f"REF  {r.folder}: {r.producer()}, weights {r.weights}, skip_expert {r.skip}")
    print(f"mode: {c.mode} (tolerance scale {c.scale:g}); per-row error = ||a-b|| / max(||b||, "
          f"{FLOOR_REL:g}*rowrms(b), {ATOL:g}*sqrt(n)); NMSE = sum((a-b)^2)/sum(b^2) (not llama.cpp's MSE/Var(b))")
    if c.skip_differs:
        print(f"note: skip_expert differs (TEST {t.skip}, REF {r.skip}): at tokens routed to the skip expert the "
              f"MoE output differs by definition; :router_weight rows of those tokens are not compared")
    for n in c.notes:
        print("note: " + n)

    head = f"{'tensor':58s} {'shape':>14s} {'max|a-b|':>9s} {'at':>14s} {'relL2':>9s} {'NMSE':>9s} {'cos min':>10s} {'1st bad':>7s}  status"
    shown = [x for x in c.results if verbose or x["status"] != "ok"]
    if shown:
        print("\n" + head)
        limit = len(shown) if verbose else 40
        for x in shown[:limit]:
            at = ",".join(map(str, x.get("max_at") or [])) or "-"
            cos = fmt(x.get("cos_min"), ".7f")
            status = x["status"]
            if x["kind"] == "integer" and "agree" in x:
                status += f" ({x['agree']}/{x['shape'][0]} agree)"
            if x.get("excluded"):
                status += f" ({x['excluded']} skip-token rows not compared)"
            print(f"{x['name']:58s} {str(x['shape']).replace(' ', ''):>14s} {fmt(x.get('max_abs')):>9s} {at:>14s} "
                  f"{fmt(x.get('rel_l2')):>9s} {fmt(x.get('nmse')):>9s} {cos:>10s} {fmt(x.get('first_bad'), 'd'):>7s}  {status}")
        if len(shown) > limit:
            print(f"... {len(shown) - limit} more tensors past tolerance (--verbose lists every tensor)")
    print(f"\ncompared {len(c.results)} tensors: {sum(x['status'] == 'ok' for x in c.results)} ok, "
          f"{sum(x['status'] == 'DIVERGED' for x in c.results)} diverged, "
          f"{sum(x['status'].startswith('after') for x in c.results)} only after routing flips")

    table = c.layer_table()
    if table:
        print("\nper layer (rel L2 of the layer output; added = output minus input, input = previous layer output "
              "or model:input_scaled):")
        print(f"{'layer':>5s} {'input':>10s} {'output':>10s} {'added':>10s}  {'routing':>9s}  worst row error (tensor)")
        routing = {l: (a, n) for l, a, n in c.routing}
        for row in table:
            a, n = routing.get(row["layer"], (None, None))
            rt = f"{a}/{n}" if a is not None else "-"
            print(f"{row['layer']:5d} {fmt(row['input_rel_l2']):>10s} {fmt(row['output_rel_l2']):>10s} "
                  f"{fmt(row['added']):>10s}  {rt:>9s}  {fmt(row['worst_row_err'])} ({row['worst_tensor']})")

    if c.routing:
        agree = sum(a for _, a, _ in c.routing)
        total = sum(n for _, _, n in c.routing)
        print(f"\nrouting: top-1 agreement {agree}/{total} (layer, position) pairs over {len(c.routing)} layers")
        dw = declared_weights(t)
        quantized = (dw["quantized"] if dw else False) or str(t.weights) == "int8"
        for f in c.flips:
            m = fmt(f["margin"], ".4g")
            print(f"  flip layer {f['layer']} position {f['position']}: TEST {f['test']} REF {f['ref']}, "
                  f"margin {m} ({f['margin_source']}) -> {f['label']}"
                  + (f" (< {c.near_tie:g}, --near-tie: what float32 rounding moves)" if f["label"] == "near-tie" else
                     f" (>= {c.near_tie:g}, --near-tie: what float32 rounding moves, or unknown)" + (
                         "; TEST's weights are quantized, so this is a flip to check: compare.py --quant says whether "
                         "its weights explain it" if quantized else "")))
    if c.logits:
        L = c.logits
        print(f"\nlogits ({L['representation']}): top-1 agree {L['top1_agree']}/{L['positions']}, "
              + ", ".join(f"{k.replace('_overlap', '')} overlap {v:.3f}" for k, v in L.items() if k.endswith("_overlap"))
              + f", max|a-b| {fmt(L['max_abs'])} at {L['max_at']}")
        if "kl_mean" in L:
            print(f"  KL(P_ref || P_test): mean {L['kl_mean']:.3g}, max {L['kl_max']:.3g} at position {L['kl_max_pos']}")
        else:
            print(f"  KL {L['kl']}")

    if c.only_ref or c.only_test:
        print()
        for label, names in (("only in REF", c.only_ref), ("only in TEST", c.only_test)):
            if names:
                more = f" ... (+{len(names) - 8})" if len(names) > 8 and not verbose else ""
                print(f"{label} ({len(names)}): " + ", ".join(names if verbose else names[:8]) + more)

    first = c.first_divergence()
    print()
    if first and is_vision(first["name"]):
        print(f"FIRST DIVERGENCE: {first['name']} (the vision tower), row {first['first_bad']} ({vision_rows(first)})")
        prev = [x for x in c.results if x["exec"] < first["exec"]]
        print("  the vision tower runs before the decoder: every decoder tensor after it follows from it; "
              + (f"every tower tensor before it agrees: look at the computation between {prev[-1]['name']} and "
                 f"{first['name']}" if prev else "it is the tower's first tensor: look at the pixels and the patch "
                 "embedding (test/test_vl.py checks the preprocessing)"))
    elif first:
        t0 = first["first_bad"]
        print(f"FIRST DIVERGENCE: {first['name']} at position {t0}"
              + (", an image position" if t0 in c.test.image_positions else ""))
        prev = [x for x in c.results if x["exec"] < first["exec"]]
        if prev:
            print(f"  every tensor before it agrees at positions <= {t0} and all tensors agree at positions < {t0}; "
                  f"look at the computation between {prev[-1]['name']} and {first['name']}")
        layer = layer_of(first["name"])
        if c.skip_differs and layer is not None and t0 in c.ref_skip_rows.get(layer, ()):
            print(f"  expected: REF routes position {t0} of layer {layer} to the skip expert and the dumps use "
                  f"different skip_expert modes ({c.test.skip} vs {c.ref.skip})")
        earliest = min((x for x in c.results if x["bad"]), key=lambda x: x["exec"])
        if earliest is not first:
            print(f"  (earliest tensor in execution order past tolerance: {earliest['name']}, first bad position "
                  f"{earliest['first_bad']})")
    bugs = [f for f in c.flips if f["label"] == "BUG"]
    verdict = "DIVERGED" if first or bugs else "AGREE"
    if first and is_vision(first["name"]):
        verdict += f" at {first['name']}, row {first['first_bad']} of the vision tower"
    elif first:
        verdict += f" at {first['name']}, {position_text(c.test, first['first_bad'])}"
    elif bugs:
        verdict += f" at model.layers.{bugs[0]['layer']}.mlp.gate.router_indices, {position_text(c.test, bugs[0]['position'])}"
    extra = f" ({len(c.flips)} near-tie routing flip(s))" if c.flips and not bugs else ""
    print(f"RESULT: {verdict}{extra}")



def main(args):
    """compare.py TEST REF: the plain comparison. Exit 0 agree, 1 divergence, 2 input error."""
    if not args.ref_dir:
        print("compare.py: give TEST_DIR and REF_DIR (or --local PORT_DUMP REPLAY_DUMP)", file=sys.stderr)
        return 2

    def compare_dumps():
        test = Dump(args.test_dir, "TEST")
        ref = Dump(args.ref_dir, "REF")
        same_model(test, ref)   # first: two models differ in every shape, the prompts may too
        if test.tokens is not None and ref.tokens is not None and test.tokens != ref.tokens:
            diff = next((i for i, (x, y) in enumerate(zip(test.tokens, ref.tokens)) if x != y),
                        min(len(test.tokens), len(ref.tokens)))
            raise InputError(f"the dumps are of different prompts: {len(test.tokens)} vs {len(ref.tokens)} tokens, "
                             f"first difference at position {diff}\n  hint: dump both with the same --ids")
        if ref.tokens is None:
            ref.tokens = test.tokens
        mode = args.weights or ("int8" if "int8" in (str(test.weights), str(ref.weights)) else "fp32")
        c = Comparison(test, ref, mode, args.tol_scale, args.near_tie)
        c.run()
        if c.errors:   # a truncated or unreadable tensor: the error first, and no verdict on the rest
            raise InputError(f"{len(c.errors)} input error(s), so there is no verdict:\n"
                             + "\n".join("  " + e for e in c.errors[:10])
                             + (f"\n  ... {len(c.errors) - 10} more" if len(c.errors) > 10 else "")
                             + "\n  hint: the dump is cut short or corrupt (a full disk, an interrupted copy); "
                               "write it again; a shape mismatch: see its hint")
        return test, ref, mode, c
    result, rc = guarded(compare_dumps)
    if rc:
        return rc
    test, ref, mode, c = result
    report(c, args.verbose)
    bf16 = [f"{d.label} {d.folder}" for d in (test, ref) if str(d.index.get("precision") or "fp32") != "fp32"]
    if bf16 and (c.first_divergence() or c.flips):
        print(f"hint: {' and '.join(bf16)} says precision bf16 (index.json): a bf16 run differs from fp32 from layer 0 on "
              f"by design; the plain tolerances are fp32's. To tell bf16 from a bug: compare.py PORT FP32_REF --envelope "
              f"BF16_RUN (docs/compare.md §8), or compare.py --local PORT --model MODEL.bin --bf16 (§9)")
    elif c.first_divergence() or any(f["label"] == "BUG" for f in c.flips):
        print("hint: end to end an error carries into every later layer, and routing flips follow it. Where it enters: "
              "compare.py --local TEST --model MODEL.bin (docs/compare.md §9, each layer recomputed from the port's own "
              "input). A quantized port differs from layer 0 on by design (its weights are not REF's), its flips too: "
              "compare.py --quant TEST --model PORTWEIGHTS.bin --exact EXACT.bin (§10)")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump({"test": test.folder, "ref": ref.folder, "mode": mode, "tol_scale": args.tol_scale,
                           "tensors": c.results, "layers": c.layer_table(), "flips": c.flips,
                           "routing": [{"layer": l, "agree": a, "total": n} for l, a, n in c.routing],
                           "logits": c.logits, "only_ref": c.only_ref, "only_test": c.only_test,
                           "first_divergence": (lambda f: f and {"name": f["name"], "position": f["first_bad"]})(
                               c.first_divergence()), "errors": c.errors}, f, indent=1, default=str)
        except OSError as e:
            print(f"compare.py: cannot write {args.json}: {e.strerror}", file=sys.stderr)
            return 2
    if c.errors:
        print("\nINPUT ERRORS:", file=sys.stderr)
        for e in c.errors:
            print("compare.py: " + e, file=sys.stderr)
        return 2
    failed = c.first_divergence() or any(f["label"] == "BUG" for f in c.flips) or (
        args.strict and (c.only_ref or c.only_test))
    return 1 if failed else 0
