#!/usr/bin/env python3
"""tier_margins.py - the margins of the two-tier local verdict (docs/compare.md §9's table).

    /usr/bin/python3 bench/tier_margins.py FIXTURE_NAME BLOB OUT_DIR [--layers 0,2,3] [--official DUMP ...]

Legitimate runs: zaya.c's placements (PLACEMENTS of zaya_compare/local.py) and any official dumps given with
--official (e.g. tools/fixture_to_dump.py of golden_bf16 and golden_bf16/decode). One-step bugs: zaya.c built
with one change (BUGS below, each in one layer) and run at the official placement (bf16-torch1.13): a
bf16 port that rounds where the official code does, with one bug. For each run: the tier-1 verdict, the
tier-2 verdict and the end-to-end verdict of `compare.py --envelope` (FP32 = zaya.c's fp32 dump,
ENVELOPE = zaya.c's bf16-torch1.13 dump, SPREAD = zaya.c's bf16 dump, or the official dumps when given).
Prints one table row per run; --json writes them.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from zaya_compare import local as lt  # noqa: E402

SCALE_LINEAR = ("    if (bias) add_bias(y, w->rows, bias, w->rows, b->n);\n    held_rows(b, y, w->rows, w->rows, b->n);",
                "    if (bias) add_bias(y, w->rows, bias, w->rows, b->n);\n"
                "    if (b->layer == {L} && !strcmp(name, \"{TAP}\")) for (size_t k = 0; k < (size_t)b->n * w->rows; k++) y[k] *= {S}f;\n"
                "    held_rows(b, y, w->rows, w->rows, b->n);")
SCALE_EXPERTS = ("y[(size_t)idx[j] * H + i] = held(b, weight[idx[j]] * act->expert_out[(size_t)j * H + i]);",
                 "y[(size_t)idx[j] * H + i] = held(b, weight[idx[j]] * act->expert_out[(size_t)j * H + i] * (b->layer == {L} ? {S}f : 1.0f));")
# A legitimate port unlike zaya.c: every Linear output moved by +-2^-22 (a few float32 ulps) before its bf16
# rounding, as torch's own summation order does on other shapes (docs/bf16.md "What is exact")
LEGIT = {"zaya.c, Linear sums in another order": [(SCALE_LINEAR[0], SCALE_LINEAR[0].replace(
    "    held_rows(", "    for (size_t k = 0; k < (size_t)b->n * w->rows; k++) y[k] *= 1.0f + (float)((int)((k * 2654435761u) >> 30) - 1) * 0x1p-22f;\n    held_rows(", 1))]}
# legitimate runs that are no placement of tier 2's envelope: one group of steps in float32 inside a bf16 run
EXTRA_LEGIT = ["bf16-torch1.13+fp32-residual", "bf16-torch1.13+fp32-norm", "bf16+fp32-residual"]
BUGS = {
    # one step's output scaled (1, 2, 5 %)
    **{f"o_proj x{s}": ("self_attn.o_proj", [(SCALE_LINEAR[0], SCALE_LINEAR[1].replace("{TAP}", "self_attn.o_proj").replace("{S}", s))])
       for s in ("1.01", "1.02", "1.05")},
    "experts x1.02": ("mlp.experts", [(SCALE_EXPERTS[0], SCALE_EXPERTS[1].replace("{S}", "1.02"))]),
    # the kinds porters make
    "cast: RoPE angles in bf16": ("self_attn:query_after_rope", [
        ("cos_t[j] = held(b, zaya_cosf((float)pos * inv_freq));",
         "cos_t[j] = held(b, zaya_cosf(b->layer == {L} ? zaya_round_bf16((float)pos * inv_freq) : (float)pos * inv_freq));"),
        ("sin_t[j] = held(b, zaya_sinf((float)pos * inv_freq));",
         "sin_t[j] = held(b, zaya_sinf(b->layer == {L} ? zaya_round_bf16((float)pos * inv_freq) : (float)pos * inv_freq));")]),
    "constant: attention scaled by 1/d": ("self_attn:attn_output", [
        ("const float scale = scalar(b, 1.0f / sqrtf((float)d));",
         "const float scale = scalar(b, b->layer == {L} ? 1.0f / (float)d : 1.0f / sqrtf((float)d));")]),
    "missing term: post-attention residual_bias": ("post_attention_residual_scale", [
        ("(r[at] + p->residual_bias[i]) * p->residual_scale[i];",
         "(r[at] + (b->layer == {L} && !strcmp(name, \"post_attention_residual_scale\") ? 0.0f : p->residual_bias[i])) * p->residual_scale[i];")]),
    "router GELU: tanh approximation (llama.cpp's ggml_gelu)": ("mlp.gate.router_mlp.act_fn:fc1", [
        ("    for (size_t i = 0; i < n; i++) x[i] = held(b, b->placement & ZAYA_GGML_GELU ? ggml_gelu(x[i]) : gelu(x[i]));",
         "    for (size_t i = 0; i < n; i++) x[i] = held(b, b->layer == {L} ? 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * "
         "(x[i] + 0.044715f * x[i] * x[i] * x[i]))) : gelu(x[i]));")]),
    "index: delayed value of this token": ("self_attn.qkv_proj:value", [
        ("        memcpy(v + (size_t)t * VD + half, delayed_value, sizeof(float) * (size_t)half);\n",
         "        if (b->layer == {L}) memcpy(delayed_value, vd + (size_t)t * half, sizeof(float) * (size_t)half);\n"
         "        memcpy(v + (size_t)t * VD + half, delayed_value, sizeof(float) * (size_t)half);\n")]),
}


def sh(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    return p.returncode, p.stdout, p.stderr


def mutant(out, edits, layer):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in os.listdir(ROOT):
        if f.endswith((".c", ".h")):
            shutil.copy(os.path.join(ROOT, f), out)
    src = open(os.path.join(out, "zaya.c")).read()
    for old, new in edits:
        assert src.count(old) == 1, old[:80]
        src = src.replace(old, new.replace("{L}", str(layer)))
    open(os.path.join(out, "zaya.c"), "w").write(src)
    sources = [os.path.join(out, f) for f in sorted(os.listdir(out)) if f.endswith(".c") and f != "quantize.c"]
    rc, _, err = sh(["cc", "-O2", "-std=c11", "-DZAYA_COMMIT=\"mutant\"", "-o", os.path.join(out, "zaya"), *sources,
                     "-pthread", "-lm"])
    assert rc == 0, err[-500:]
    return os.path.join(out, "zaya")


def endtoend(port, F, E, S):
    cmd = [sys.executable, os.path.join(ROOT, "compare.py"), port, F, "--envelope", E] + (["--spread", S] if S else [])
    rc, out, err = sh(cmd)
    m = re.search(r"VERDICT: (.*)", out)
    v = m.group(1) if m else (out + err)[-200:]
    m = re.search(r"exceeds it first at (\S+), position", v)
    return ("within" if rc == 0 else f"exceeds at {m.group(1) if m else '?'}"), rc


def short(name):
    return name.split(".", 3)[3] if name and name.startswith("model.layers.") else name


def judge(label, port, blob, F, E, S, out, expect=None):
    args = argparse.Namespace(test_dir=port, model=blob, replay_out=os.path.join(out, "replay"), near_tie=0.02)
    res = lt.judge_tiers(args, lt.Dump(port, "PORT"), lt.tier_replays(args))
    t1, w, t2, loc = res["tier1_first"], res["step_first"], res["tier2_first"], res["located"]
    e2e, _ = endtoend(port, F, E, S)
    st = next((t["step"] for t in res["taps"] if w and t["name"] == w[0]), None)
    steps = [t["step"] for t in res["taps"] if t.get("step")]
    frac = max([x["past"] / x["judged"] for x in steps] or [0.0])
    row = {"run": label, "verdict": "pass" if loc is None else loc[0], "tier1": "like official" if t1 is None else t1[0],
           "step_error": w[0] if w else None, "tier2": "within" if t2 is None else t2[0], "tier2_max_ratio": res["max_ratio"],
           "closest": res["closest"], "e2e": e2e, "expected": expect,
           "tier1_worst": max([t["beyond"] / t["size"] for t in res["taps"] if "size" in t] or [0.0]),
           "step_past_fraction": frac, "step_worst": res["step_worst"], "step_rms": res["step_rms"]}
    at = (f"{short(w[0])}: {st['past']}/{st['judged']} past, worst {st['worst']:.3g}x, rms z {st['rms']:.3g}" if st
          else f"none; largest element {res['step_worst']:.2g}x its bound, rms z {res['step_rms']:.3g}, "
               f"past {frac:.2%}")
    print(f"| {label} | {short(t1[0]) if t1 else 'like official'} | {at} | "
          f"{short(t2[0]) if t2 else 'within'} ({res['max_ratio']:.3g}x) | {res['closest']} | "
          f"{'PASS' if loc is None else 'ERROR ' + short(loc[0])} | {e2e} |", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture")
    ap.add_argument("blob")
    ap.add_argument("out")
    ap.add_argument("--layers", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--official", nargs="*", default=[], help="LABEL=DUMP of legitimate official runs")
    ap.add_argument("--fp32", help="the fp32 reference dump (default: zaya.c's)")
    ap.add_argument("--envelope", help="end to end envelope dump (default: zaya.c bf16-torch1.13)")
    ap.add_argument("--spread", help="end to end spread dump (default: zaya.c bf16)")
    ap.add_argument("--bugs", default="all")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    zaya = os.path.join(ROOT, "zaya")
    runs = {}
    for label, prec in [("fp32", "fp32")] + list(lt.PLACEMENTS.items()):
        d = os.path.join(a.out, "zaya_" + prec.replace("+", "_"))
        if not os.path.exists(os.path.join(d, "index.json")):
            rc, _, err = sh([zaya, a.blob, "--ids", a.ids, "--dump", d, "--precision", prec])
            assert rc == 0, err
        runs[label] = d
    F = a.fp32 or runs["fp32"]
    E = a.envelope or runs["official bf16, torch 1.13"]
    S = a.spread or runs["official bf16, torch >= 2.1"]
    print(f"## {a.fixture}\n\n| run | tier 1 (statement: like official up to) | step check (first error, or the largest legitimate numbers) | tier 2 (largest ratio) | closest placement | local verdict | end to end |\n| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for spec in a.official:
        label, d = spec.split("=", 1)
        rows.append(judge(label, d, a.blob, F, E, S, a.out, "pass"))
    for label in lt.PLACEMENTS:
        rows.append(judge(f"zaya.c {lt.PLACEMENTS[label]}", runs[label], a.blob, F, E, S, a.out, "pass"))
    for prec in EXTRA_LEGIT:
        d = os.path.join(a.out, "zaya_" + prec.replace("+", "_"))
        if not os.path.exists(os.path.join(d, "index.json")):
            rc, _, err = sh([zaya, a.blob, "--ids", a.ids, "--dump", d, "--precision", prec])
            assert rc == 0, err
        rows.append(judge(f"zaya.c {prec}", d, a.blob, F, E, S, a.out, "pass"))
    for label, edits in LEGIT.items():
        z = mutant(os.path.join(a.out, "mutant"), edits, -1)
        d = os.path.join(a.out, "legit")
        shutil.rmtree(d, ignore_errors=True)
        rc, _, err = sh([z, a.blob, "--ids", a.ids, "--dump", d, "--precision", "bf16-torch1.13"])
        assert rc == 0, err
        rows.append(judge(label, d, a.blob, F, E, S, a.out, "pass"))
    layers = [int(x) for x in a.layers.split(",")]
    for bug, (tap, edits) in BUGS.items():
        if a.bugs != "all" and not re.search(a.bugs, bug):
            continue
        for L in layers:
            z = mutant(os.path.join(a.out, "mutant"), edits, L)
            d = os.path.join(a.out, f"bug_{len(rows)}")
            shutil.rmtree(d, ignore_errors=True)
            rc, _, err = sh([z, a.blob, "--ids", a.ids, "--dump", d, "--precision", "bf16-torch1.13"])
            assert rc == 0, err
            rows.append(judge(f"{bug}, layer {L}", d, a.blob, F, E, S, a.out, f"model.layers.{L}.{tap}"))
            shutil.rmtree(d, ignore_errors=True)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
