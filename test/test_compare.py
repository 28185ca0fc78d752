#!/usr/bin/env python3
"""test_compare.py - compare.py on synthetic dumps and on the fixture goldens (test/fixtures).

    python3 test/test_compare.py            (from the repo root; reads the goldens of test/fixtures)

Synthetic dumps (small, odd dimensions) check: identical dumps agree (exit 0); a perturbed tensor is
named as the FIRST DIVERGENCE at the right position, a perturbation below tolerance is not; a routing
flip at a small reference margin is a near-tie and the rows it explains are reported "after routing
flip", one at a large margin is a BUG (exit 1); an unrelated divergence next to a near-tie flip is still
found; int8 mode gates on cosine; full logits vs a top-k reference; missing folder, corrupt .npy, bad
index.json, shape mismatch and different prompts give exit 2 with a message and no traceback.
Fixture: tools/fixture_to_dump.py converts golden/ and golden_zyphra/; golden vs itself agrees; golden_zyphra
vs golden names the first divergence at the MoE output of the first token routed to the skip expert
(the earliest position, and at it the first layer, from router_indices.npy) and says it is expected
from the different skip_expert modes. A missing fixture is a FAIL, never a skip.
Output: one `PASS name` / `FAIL name: detail` line per check; exit status 1 if any check failed.
"""
import array
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
import compare  # noqa: E402
from harness import FIXTURES, check, finish  # noqa: E402


def run(*args):
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# ---- synthetic dumps ----
L, H, NQ, NKV, D, E, R, V, T = 3, 10, 3, 1, 6, 5, 7, 300, 6
C = (NQ + NKV) * D


def shape_of(name):
    per = {"self_attn.qkv_proj.q_proj": [NQ * D], "self_attn.qkv_proj.k_proj": [NKV * D],
           "self_attn.qkv_proj.conv_qk_depthwise": [C], "self_attn.qkv_proj.conv_qk_grouped": [C],
           "self_attn.qkv_proj.v_proj_current": [NKV * D // 2], "self_attn.qkv_proj.v_proj_delayed": [NKV * D // 2],
           "self_attn:attn_output": [NQ * D], "mlp.gate.router_mlp": [E + 1], "mlp.gate:router_probs": [E + 1],
           "mlp.gate:router_scores": [E + 1], "mlp.gate.router_indices": [], "mlp.gate:router_weight": [],
           "mlp.gate:router_margin": []}
    if name == "logits":
        return [T, V]
    if not name.startswith("model.layers."):
        return [T, H]
    suffix = name.split(".", 3)[3]
    if suffix in per:
        return [T] + per[suffix]
    if suffix.startswith("mlp.gate.") and suffix != "mlp.gate.router_indices" or suffix.startswith("mlp.gate:"):
        return [T, R]
    if suffix.endswith(("query", "query_residual", "query_after_rope")):
        return [T, NQ, D]
    if suffix.endswith(("key", "key_residual", "key_after_rope", ":value")):
        return [T, NKV, D]
    if suffix.endswith(":conv_state"):
        return [2, C]
    if suffix.endswith(":delayed_value_state"):
        return [NKV * D // 2]
    if suffix.endswith(("_cache",)):
        return [T, NKV, D]
    return [T, H]


def synthetic(margins):
    """name -> (shape, array) for a whole dump; margins: {(layer, pos): top-1 margin} (default 0.3)."""
    rng = random.Random(7)
    out = {}
    for name in compare.execution_order(L):
        if name.endswith(":router_margin"):
            continue
        shape = shape_of(name)
        n = math.prod(shape)
        if name.endswith(":router_scores"):
            layer = int(name.split(".")[2])
            rows = []
            for t in range(T):
                row = [rng.uniform(0.0, 0.1) for _ in range(E + 1)]
                best = (t + layer) % (E + 1)
                row[best] = max(row) + margins.get((layer, t), 0.3)
                rows += row
            out[name] = (shape, array.array("f", rows))
        elif name.endswith(".router_indices"):
            sc = out[name.replace(".router_indices", ":router_scores")][1]
            idx = [max(range(E + 1), key=lambda e: sc[t * (E + 1) + e]) for t in range(T)]
            out[name] = (shape, array.array("i", idx))
        else:
            out[name] = (shape, array.array("f", (rng.gauss(0, 1) for _ in range(n))))
    return out


def write(folder, tensors, **meta):
    base = {"producer": {"program": "test_compare.py"}, "weight_format": {"dtype": "fp32", "group_size": 0},
            "skip_expert": "zero", "tokens": list(range(2, 2 + T))}
    base.update(meta)
    names = [n for n in compare.execution_order(L) if n in tensors] + [n for n in tensors if n not in compare.execution_order(L)]
    compare.write_dump(folder, [(n, tensors[n][0], tensors[n][1]) for n in names], base)
    return folder


def perturb(tensors, name, pos, delta, index=0):
    shape, data = tensors[name]
    data = array.array(data.typecode, data)
    n = math.prod(shape[1:]) if len(shape) > 1 else 1
    data[pos * n + index] += delta
    t = dict(tensors)
    t[name] = (shape, data)
    return t


def first_line(out):
    return next((l for l in out.splitlines() if l.startswith("FIRST DIVERGENCE")), "(no FIRST DIVERGENCE line)")


def synthetic_checks(tmp):
    ref_t = synthetic({(1, 2): 0.005})
    ref = write(os.path.join(tmp, "ref"), ref_t)
    rc, out, err = run("compare.py", ref, ref)
    check(rc == 0 and "RESULT: AGREE" in out, "identical dumps agree (exit 0)", f"exit {rc}: {out[-400:]}{err[-400:]}")

    name = "model.layers.1.self_attn.o_proj"
    d = write(os.path.join(tmp, "pert"), perturb(ref_t, name, 3, 0.05, index=4))
    rc, out, err = run("compare.py", d, ref, "--json", os.path.join(tmp, "pert.json"))
    check(rc == 1 and first_line(out) == f"FIRST DIVERGENCE: {name} at position 3",
          "a perturbed tensor is the FIRST DIVERGENCE at its position (exit 1)", f"exit {rc}: {first_line(out)}")
    try:
        with open(os.path.join(tmp, "pert.json")) as f:
            js = json.load(f)
        row = next(r for r in js["tensors"] if r["name"] == name)
        ok = js["first_divergence"] == {"name": name, "position": 3} and row["max_at"] == [3, 4] and \
            abs(row["max_abs"] - 0.05) < 1e-6
    except (OSError, ValueError, StopIteration, KeyError) as e:
        ok, row = False, e
    check(ok, "--json: first divergence, max abs error and its location [position, index]", str(row)[:300])

    d = write(os.path.join(tmp, "tiny"), perturb(ref_t, name, 3, 1e-7))
    rc, out, err = run("compare.py", d, ref)
    check(rc == 0, "a perturbation below tolerance (1e-7) agrees", f"exit {rc}: {first_line(out)}")

    # a near-tie routing flip at layer 1 position 2, with the downstream rows it explains perturbed
    flip = perturb(ref_t, "model.layers.1.mlp.gate.router_indices", 2, 1)
    flip = perturb(flip, "model.layers.1.mlp.experts", 2, 0.5)
    flip = perturb(flip, "model.layers.1.post_mlp_residual_scale", 2, 0.5)
    flip = perturb(flip, "model.layers.2.input_layernorm", 4, 0.5)     # later layer, later position
    flip = perturb(flip, "model.layers.2.mlp.experts", 2, 0.5)
    d = write(os.path.join(tmp, "flip_tie"), flip)
    rc, out, err = run("compare.py", d, ref)
    check(rc == 0 and "-> near-tie" in out and "after routing flip (near-tie)" in out and "FIRST DIVERGENCE" not in out,
          "a routing flip at margin 0.005 is a near-tie; its downstream rows are 'after routing flip' (exit 0)",
          f"exit {rc}: {out[-700:]}")

    # the same flip plus an unrelated divergence at an earlier position of a later layer
    d = write(os.path.join(tmp, "flip_other"), perturb(flip, "model.layers.2.self_attn.o_proj", 1, 0.5))
    rc, out, err = run("compare.py", d, ref)
    check(rc == 1 and first_line(out) == "FIRST DIVERGENCE: model.layers.2.self_attn.o_proj at position 1",
          "a divergence the near-tie flip cannot explain (earlier position) is still found", first_line(out))
    # and a divergence at the flip position in the same layer but BEFORE the router
    d = write(os.path.join(tmp, "flip_before"), perturb(flip, "model.layers.1.post_attention_layernorm", 2, 0.5))
    rc, out, err = run("compare.py", d, ref)
    check(rc == 1 and first_line(out) == "FIRST DIVERGENCE: model.layers.1.post_attention_layernorm at position 2",
          "a divergence upstream of the flip in the same layer is not excused", first_line(out))

    big = synthetic({})
    bigref = write(os.path.join(tmp, "ref_big"), big)
    d = write(os.path.join(tmp, "flip_bug"), perturb(big, "model.layers.1.mlp.gate.router_indices", 2, 1))
    rc, out, err = run("compare.py", d, bigref)
    check(rc == 1 and "-> BUG" in out and "margin 0.3" in out and
          first_line(out) == "FIRST DIVERGENCE: model.layers.1.mlp.gate.router_indices at position 2",
          "a routing flip at margin 0.3 is a BUG and the first divergence (exit 1)", f"exit {rc}: {out[-500:]}")

    # the reference gives :router_margin instead of :router_scores (fixture style)
    nosc = {n: v for n, v in ref_t.items() if not n.endswith(":router_scores")}
    for layer in range(L):
        m = [0.005 if (layer, t) == (1, 2) else 0.3 for t in range(T)]
        nosc[f"model.layers.{layer}.mlp.gate:router_margin"] = ([T], array.array("f", m))
    ref_m = write(os.path.join(tmp, "ref_margin"), nosc)
    test_m = {n: v for n, v in flip.items() if not n.endswith(":router_scores")}
    rc, out, err = run("compare.py", write(os.path.join(tmp, "flip_m"), test_m), ref_m)
    check(rc == 0 and "margin 0.005 (reference) -> near-tie" in out,
          "the margin is read from a reference :router_margin too", f"exit {rc}: {out[-400:]}")

    # int8 mode: judged by cosine per row
    scaled = dict(ref_t)
    shape, data = ref_t[name]
    scaled[name] = (shape, array.array("f", (v * 1.01 for v in data)))   # cos = 1, rel L2 = 1e-2
    d = write(os.path.join(tmp, "int8"), scaled, weight_format={"dtype": "int8", "group_size": 32})
    rc8, out8, _ = run("compare.py", d, ref)
    rc32, out32, _ = run("compare.py", d, ref, "--weights", "fp32")
    check(rc8 == 0 and "mode: int8" in out8 and rc32 == 1, "int8 weights (from index.json) are gated on cosine, "
          "--weights fp32 on relative L2", f"int8 exit {rc8}, fp32 exit {rc32}")

    # logits: the reference keeps only the top-5 (ids + values)
    shape, lg = ref_t["logits"]
    topk = {n: v for n, v in ref_t.items() if n != "logits"}
    ids, vals = array.array("i"), array.array("f")
    for t in range(T):
        row = lg[t * V:(t + 1) * V]
        best = sorted(range(V), key=lambda i: -row[i])[:5]
        ids.extend(best)
        vals.extend(row[i] for i in best)
    topk["logits:top5_ids"], topk["logits:top5_values"] = ([T, 5], ids), ([T, 5], vals)
    ref_k = write(os.path.join(tmp, "ref_topk"), topk)
    rc, out, err = run("compare.py", ref, ref_k)
    check(rc == 0 and "top-1 agree 6/6" in out and "KL skipped" in out and "only in" not in out,
          "full logits vs a top-5 reference: ids and values compared, KL skipped", f"exit {rc}: {out[-400:]}")
    t_argmax = ids[3 * 5]
    d = write(os.path.join(tmp, "logit_pert"), perturb(ref_t, "logits", 3, -1.0, index=t_argmax))
    rc, out, err = run("compare.py", d, ref_k)
    check(rc == 1 and first_line(out).startswith("FIRST DIVERGENCE: logits:top5_values at position 3"),
          "a wrong logit is found against a top-k reference", first_line(out))
    rc, out, err = run("compare.py", d, ref)
    check(rc == 1 and "KL(P_ref || P_test)" in out and first_line(out) == "FIRST DIVERGENCE: logits at position 3",
          "full logits: max abs gate and KL", first_line(out))

    # input errors: exit 2, a message, never a traceback
    def bad(label, args, needle):
        rc, out, err = run("compare.py", *args)
        check(rc == 2 and "Traceback" not in out + err and needle in err,
              f"{label}: exit 2 with a message", f"exit {rc}: {(out + err)[-300:]}")
    bad("missing folder", [os.path.join(tmp, "nope"), ref], "does not exist")
    corrupt = shutil.copytree(ref, os.path.join(tmp, "corrupt"))
    path = os.path.join(corrupt, "model.layers.0.mlp.experts.npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    bad("truncated .npy", [corrupt, ref], "model.layers.0.mlp.experts.npy")
    with open(os.path.join(corrupt, "model.layers.0.mlp.experts.npy"), "wb") as f:
        f.write(b"not a numpy file")
    bad("not an .npy", [corrupt, ref], "not a NumPy")
    broken = shutil.copytree(ref, os.path.join(tmp, "broken"))
    with open(os.path.join(broken, "index.json"), "w") as f:
        f.write("{ not json")
    bad("bad index.json", [broken, ref], "not valid JSON")
    wrong = dict(ref_t)
    wrong["model.layers.0.mlp.experts"] = ([T, H + 1], array.array("f", [0.0] * (T * (H + 1))))
    bad("shape mismatch", [write(os.path.join(tmp, "wrongshape"), wrong), ref], "shape mismatch")
    bad("different prompts", [write(os.path.join(tmp, "otherprompt"), ref_t, tokens=[9] * T), ref], "different prompts")
    bad("bad option", [ref, ref, "--tol-scale", "-1"], "tol-scale")


def fixture_checks(tmp):
    fx = FIXTURES
    if not check(os.path.isdir(os.path.join(fx, "golden")) and os.path.isdir(os.path.join(fx, "golden_zyphra")),
                 "fixtures present", f"{fx}/golden and golden_zyphra not found"):
        return
    g, z = os.path.join(tmp, "golden"), os.path.join(tmp, "golden_zyphra")
    for src, out in ((os.path.join(fx, "golden"), g), (os.path.join(fx, "golden_zyphra"), z)):
        rc, o, e = run("tools/fixture_to_dump.py", src, out)
        check(rc == 0 and os.path.exists(os.path.join(out, "index.json")), f"fixture_to_dump.py {os.path.basename(src)}",
              f"exit {rc}: {(o + e)[-400:]}")
    with open(os.path.join(g, "index.json")) as f:
        gi = json.load(f)
    with open(os.path.join(z, "index.json")) as f:
        zi = json.load(f)
    check(gi["skip_expert"] == "zero" and zi["skip_expert"] == "passthrough", "skip_expert zero (golden) / passthrough (zyphra)",
          f"{gi['skip_expert']} / {zi['skip_expert']}")
    check(not [n for n in gi.get("notes", []) if "differs" in n or "missing" in n],
          "adapter: every conv tap matches the grouped output rebuilt from other taps", str(gi.get("notes"))[:300])
    rc, out, err = run("compare.py", g, g)
    check(rc == 0 and "RESULT: AGREE" in out, "compare.py golden vs golden agrees", f"exit {rc}: {(out + err)[-400:]}")

    # where should golden_zyphra (passthrough) first differ from golden (zero)? at the MoE output of the
    # earliest position any layer routes to the skip expert, in the first such layer
    shape, ri = compare.read_npy(os.path.join(fx, "golden", "router_indices.npy"))
    nl, nt = shape
    E = next(t["shape"][-1] - 1 for t in gi["tensors"] if t["name"].endswith(".mlp.gate.router_mlp"))
    skips = [(t, layer) for layer in range(nl) for t in range(nt) if ri[layer * nt + t] == E]
    t0, l0 = min(skips)
    rc, out, err = run("compare.py", z, g)
    want = f"FIRST DIVERGENCE: model.layers.{l0}.mlp.experts at position {t0}"
    check(rc == 1 and first_line(out) == want and "different skip_expert modes" in out,
          f"golden_zyphra vs golden: {want[len('FIRST DIVERGENCE: '):]} (first skip token), expected from the skip modes",
          f"exit {rc}: {first_line(out)}")
    # routing may differ only downstream of that token (a later position, in a later layer): the hidden
    # states differ from there on; compare.py must count exactly the flips the two router_indices show
    _, rz = compare.read_npy(os.path.join(fx, "golden_zyphra", "router_indices.npy"))
    flips = [(layer, t) for layer in range(nl) for t in range(nt) if ri[layer * nt + t] != rz[layer * nt + t]]
    early = [(layer, t) for layer, t in flips if layer <= l0 or t <= t0]
    line = next((l for l in out.splitlines() if l.startswith("routing: top-1 agreement")), "")
    agree = line.split()[3] if line else "?/?"
    check(agree == f"{nl * nt - len(flips)}/{nl * nt}" and not early,
          f"golden_zyphra vs golden: routing identical up to the first skip token; its {len(flips)} flips are all "
          f"downstream of it (later layer and position)", f"{line or out[-300:]}; flips (layer, position) {flips}")


def main():
    tmp = tempfile.mkdtemp(prefix="zaya_test_compare_")
    try:
        synthetic_checks(tmp)
        fixture_checks(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    finish()
