#!/usr/bin/env python3
"""local_tiers.py - the two-tier layer-local verdict (prototype of zaya_compare/local.py's tiers; numpy).

    /usr/bin/python3 bench/local_tiers.py PORT_DUMP --model MODEL.bin [--json OUT]

Each layer of the port is recomputed by zaya.c from the port's own input to it (./zaya --replay), once per
legitimate placement (PLACEMENTS) and once in float32. Then, for every tap of every layer:

Tier 1 (a port that rounds where the official bf16 code rounds): the port's tap against zaya.c's replay at
the official placement, element by element in bf16 ulps of the replay's value. The tap agrees when at most
TIER1_FRACTION of its elements are more than TIER1_ULPS ulps away. The port "computes like the official
bf16 code" when every tap agrees with one of the two official placements (torch 1.13 or current torch);
else the first tap (execution order) that agrees with neither is named.

Tier 2 (a port that rounds elsewhere): the local envelope of a tap is the largest distance (rel L2) of a
legitimate placement's replay from the float32 replay; the port's local error is its distance from the
float32 replay; the tap is within when error <= TIER2_FACTOR x envelope. The report names the placement
the port is closest to and the first tap out of the envelope.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The legitimate placements zaya.c can run (docs/bf16.md): name -> --precision value.
OFFICIAL = {"official bf16 (torch 1.13)": "bf16-torch1.13", "official bf16 (torch >= 2.1)": "bf16"}
PLACEMENTS = dict(OFFICIAL, **{"vLLM (fp32 residual scaling and norms)": "bf16+fp32-residual+fp32-norm",
                               "fp32 LM head (vLLM zaya_high_prec)": "bf16-torch1.13+fp32-logits"})
TIER1_ULPS = 2          # an element agrees within this many bf16 ulps of the replay's value
TIER1_FRACTION = 0.01   # a tap agrees when at most this fraction of its elements are further
TIER1_WRONG = 0.5       # a tap is wrong (not another rounding) when more than this fraction is further
TIER2_FACTOR = 2.0      # a tap is within when its local error <= this x the placements' envelope
FLOOR = 1e-6            # rel L2 floor (float32 noise of a replay)
NEAR_TIE = 0.02


def file_of(d, name):
    return os.path.join(d, name.replace(":", "~") + ".npy")


def load(d, name):
    p = file_of(d, name)
    return np.load(p) if os.path.exists(p) else None


def tap_names(d):
    with open(os.path.join(d, "index.json")) as f:
        return [t["name"] for t in json.load(f)["tensors"]]


def layer_of(name):
    if name.startswith("model.layers."):
        return int(name.split(".")[2])
    return None


def run_replay(model, port, out, precision):
    cmd = [os.path.join(ROOT, "zaya"), model, "--replay", port, "--dump", out, "--precision", precision]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-800:]}")
    return out


def replays(model, port, base=None):
    base = base or port.rstrip("/") + "_replay"
    out = {"fp32": run_replay(model, port, base + "_fp32", "fp32")}
    for label, prec in PLACEMENTS.items():
        out[label] = run_replay(model, port, base + "_" + prec.replace("+", "_"), prec)
    return out


def ulps(port, ref):
    """|port - ref| in bf16 ulps of ref (rows: [T, ...]); a value far below its row's rms counts at rms/256."""
    ref = ref.reshape(ref.shape[0], -1).astype(np.float64)
    port = port.reshape(ref.shape).astype(np.float64)
    rms = np.sqrt(np.mean(ref * ref, axis=1, keepdims=True))
    mag = np.maximum(np.abs(ref), np.maximum(rms / 256, 1e-30))
    ulp = np.exp2(np.floor(np.log2(mag)) - 7)
    return np.abs(port - ref) / ulp


def rel(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), FLOOR * math.sqrt(max(b.size, 1))))


def judged_rows(name, flips_near, T):
    """positions judged for a tap: after the router, the near-tie flipped positions of its layer are left out."""
    after = name.endswith(("mlp.experts", "post_mlp_residual_scale", "mlp.gate:router_weight"))
    rows = [t for t in range(T) if not (after and t in flips_near)]
    return rows


def analyse(port, reps, near_tie=NEAR_TIE):
    names = [n for n in tap_names(reps["fp32"]) if os.path.exists(file_of(port, n))]
    names = [n for n in names if layer_of(n) is not None or n in ("model.norm", "logits")]
    names = [n for n in names if ":" not in n.split(".")[-1] or n.endswith((":router_probs", ":router_state", ":query",
                                                                               ":key", ":value", ":query_after_rope",
                                                                               ":key_after_rope", ":router_weight",
                                                                               ":query_residual", ":key_residual"))]
    with open(os.path.join(port, "index.json")) as f:
        T = len(json.load(f)["tokens"])
    taps = []
    first1, first2, wrong, official_start = None, None, None, None
    closeness = {label: 0.0 for label in PLACEMENTS}
    for name in names:
        layer = layer_of(name)
        p = load(port, name)
        if name.endswith("router_indices"):
            # routing: a flip against every official replay that is not a near-tie is an error
            flips = {}
            for label in OFFICIAL:
                r = load(reps[label], name).ravel()
                sc = load(reps[label], f"model.layers.{layer}.mlp.gate:router_scores")
                top2 = np.sort(sc, axis=1)[:, -2:] if sc is not None else None
                flips[label] = [(t, float(top2[t, 1] - top2[t, 0]) if top2 is not None else 1.0)
                                for t in range(T) if int(p.ravel()[t]) != int(r[t])]
            best = min(flips.values(), key=len)
            bad = [t for t, m in best if m >= near_tie]
            taps.append({"name": name, "layer": layer, "routing": True, "flips": best, "bad": bad})
            if bad and first1 is None:
                first1 = (name, f"routes {len(bad)} position(s) differently, not at a near-tie")
            if bad and first2 is None:
                first2 = (name, f"routes {len(bad)} position(s) differently, not at a near-tie")
            if bad and wrong is None and official_start:
                wrong = first2
            continue
        if np.issubdtype(p.dtype, np.integer):
            continue
        near = set()
        ri = next((t for t in taps if t.get("routing") and t["layer"] == layer), None)
        if ri:
            near = {t for t, m in ri["flips"]}
        rows = judged_rows(name, near, T)
        if not rows:
            continue
        pr = p.reshape(p.shape[0], -1)[rows]
        f32 = load(reps["fp32"], name).reshape(pr.shape[0] if False else p.shape[0], -1)[rows]
        t1 = {}
        for label in OFFICIAL:
            u = ulps(pr, load(reps[label], name).reshape(p.shape[0], -1)[rows])
            t1[label] = (int((u > TIER1_ULPS).sum()), int(u.size), float(u.max()))
        t1_best = min(t1, key=lambda k: t1[k][0])
        beyond, size, umax = t1[t1_best]
        ok1 = beyond <= TIER1_FRACTION * size
        wrong1 = beyond > TIER1_WRONG * size
        env = {label: rel(load(reps[label], name).reshape(p.shape[0], -1)[rows], f32) for label in PLACEMENTS}
        envelope = max(max(env.values()), FLOOR)
        err = rel(pr, f32)
        dist = {label: rel(pr, load(reps[label], name).reshape(p.shape[0], -1)[rows]) for label in PLACEMENTS}
        for label in PLACEMENTS:
            closeness[label] += dist[label] / envelope
        ratio = err / envelope
        ok2 = ratio <= TIER2_FACTOR
        if official_start is None:
            official_start = ok1      # the port's first tap rounds like the official code: tier 1 judges
        if wrong1 and official_start and wrong is None:
            wrong = (name, f"{beyond} of {size} elements more than {TIER1_ULPS} bf16 ulps from the official bf16 replay "
                           f"(a port that rounds like the official code: more than {TIER1_WRONG:.0%} is an error)")
        taps.append({"name": name, "layer": layer, "tier1": t1, "tier1_ok": ok1, "tier1_variant": t1_best,
                     "envelope": envelope, "envelope_by": env, "error": err, "ratio": ratio, "tier2_ok": ok2,
                     "closest": min(dist, key=dist.get)})
        if not ok1 and first1 is None:
            first1 = (name, f"{beyond} of {size} elements more than {TIER1_ULPS} bf16 ulps from the official bf16 "
                            f"replay (at most {TIER1_FRACTION:.0%}; largest {umax:.3g} ulps)")
        if not ok2 and first2 is None:
            first2 = (name, f"local error {err:.3g} = {ratio:.3g} x the placements' envelope {envelope:.3g} "
                            f"(limit {TIER2_FACTOR:g}x)")
    closest = min(closeness, key=closeness.get) if closeness else None
    order = {t["name"]: i for i, t in enumerate(taps)}
    located = min([x for x in (wrong, first2) if x], key=lambda x: order[x[0]], default=None)
    return {"taps": taps, "tier1_first": first1, "tier1_wrong": wrong, "tier2_first": first2, "closest": closest,
            "located": located,
            "max_ratio": max([t["ratio"] for t in taps if "ratio" in t] or [0.0]),
            "max_beyond_frac": max([t["tier1"][t["tier1_variant"]][0] / t["tier1"][t["tier1_variant"]][1]
                                    for t in taps if "tier1" in t] or [0.0])}


def report(res, out=sys.stdout):
    layers = sorted({t["layer"] for t in res["taps"] if t["layer"] is not None})
    print("tier 1: the port against zaya.c's official-bf16 replay, elements beyond "
          f"{TIER1_ULPS} bf16 ulps; tier 2: local error / the placements' envelope", file=out)
    print(f"{'layer':>5}  {'tier 1 worst tap (beyond / elements)':>44}  {'tier 2 worst ratio (tap)':>36}", file=out)
    for L in layers + [None]:
        ts = [t for t in res["taps"] if t["layer"] == L and "tier1" in t]
        if not ts:
            continue
        w1 = max(ts, key=lambda t: t["tier1"][t["tier1_variant"]][0] / t["tier1"][t["tier1_variant"]][1])
        b, n, _ = w1["tier1"][w1["tier1_variant"]]
        w2 = max(ts, key=lambda t: t["ratio"])
        short = lambda nm: nm.split(".", 3)[3] if nm.startswith("model.layers.") else nm
        print(f"{'-' if L is None else L:>5}  {short(w1['name']) + f' {b}/{n}':>44}  "
              f"{short(w2['name']) + ' ' + format(w2['ratio'], '.3g') + 'x':>36}", file=out)
    if res["tier1_first"] is None:
        print("TIER 1: computes like the official bf16 code (every tap within "
              f"{TIER1_ULPS} ulps on all but {TIER1_FRACTION:.0%} of its elements)", file=out)
    else:
        print(f"TIER 1: departs from the official bf16 code first at {res['tier1_first'][0]}: {res['tier1_first'][1]}",
              file=out)
    print(f"closest legitimate placement: {res['closest']}", file=out)
    if res["tier2_first"] is None:
        print(f"TIER 2: every tap within the legitimate placements' envelope (largest ratio {res['max_ratio']:.3g}x, "
              f"limit {TIER2_FACTOR:g}x)", file=out)
    else:
        print(f"TIER 2: FIRST LOCAL ERROR at {res['tier2_first'][0]}: {res['tier2_first'][1]}", file=out)


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("port")
    ap.add_argument("--model", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = analyse(a.port, replays(a.model, a.port))
    report(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0 if res["tier1_first"] is None or res["tier2_first"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
