#!/usr/bin/env python3
"""test_dims.py - ./zaya against an independent pure-Python reference on odd dimensions.

    make zaya build/test_decode && python3 test/test_dims.py

1. The reference itself (test/ref_forward.py, written from the spec, not from zaya.c) is first checked
   against the official goldens of test/fixtures: native + skip zero vs golden/, legacy +
   skip passthrough vs golden_zyphra/ (layer outputs, router indices, final norm, top-16 logits).
2. Small checkpoints with odd dimensions are generated with tools/make_checkpoint.py in both hub
   layouts (native and legacy), exported with export_weights.py, run with ./zaya --dump and with
   ref_forward.py, and every tensor both dumps hold is compared: relative L2 <= 1e-5 (denominator at
   least 1e-2 * sqrt(n), a floor for near-zero tensors), integer tensors (router indices) identical.
   A failure names the first divergent tensor in execution order, its worst position and the dims.
   Also: every biased router margin of the reference >= 1e-4 (else the seed is a near-tie and must be
   changed, never the tolerance), both layouts export identical tensors and give bit-identical logits,
   token-by-token prefill (--batch 1), --skip-expert passthrough on a config where the skip class wins,
   prompts shorter than the conv state and longer than the sliding window, a greedy continuation
   of ./zaya (cached decode) equal to the reference's full-sequence argmax, and zaya_forward's decode
   path bit-identical to its batch path at 1, 2 and 3 threads (build/test_decode).
   Config d: odd KV heads (3), attention_bias and lm_head_bias in both layouts; config f (native only:
   the legacy schema has one rotary fraction): one KV head, per-type partial rotary and theta.
3. Prompts shorter than the conv state, greedy decoding (above).
4. The ZAYA1-base schema (tools/make_checkpoint.py --layout base): against ref_forward.py (router norm
   epsilon 1e-6, the fork's default), and with layernorm_epsilon = norm_epsilon the same tensors, config
   and bit-identical logits as the native checkpoint of the same seed.
5. A window of 257 keys over a 300-token prompt (the ring wraps across two prefill batches), both layouts.
6. make_checkpoint.py --preset 74b --dry-run (config + every tensor's shape, no weights) in the three
   schemas (legacy: all 120 half-layers): the exporter's config conversion and tensor plan accept it.
The checkpoints carry the fixture tokenizer cut to its first 1000 ids (the forward pass does not use it;
exporting the full one costs ~4 s per blob). Runs in ~16 s on 2 cores.
Build products go to build/dims/. Prints `PASS name` / `FAIL name: detail`; exit status 1 on any FAIL.
"""
import json
import math
import os
import shutil
import struct
import subprocess

from harness import ROOT, check, finish, need_fixtures, tokenizer_dir, read_npy

OUT = os.path.join(ROOT, "build", "dims")
REL_TOL, ABS_FLOOR, MIN_MARGIN = 1e-5, 1e-2, 1e-4

# (name, make_checkpoint.py flags, what the config is meant to exercise)
CONFIGS = [
    ("a", ["--hidden", "96", "--layers", "3", "--heads", "6", "--kv-heads", "2", "--head-dim", "32",
           "--partial-rotary", "0.25", "--cca-time0", "3", "--cca-time1", "2", "--experts", "3",
           "--moe-intermediate", "40", "--router-hidden", "24", "--vocab", "1000",
           "--layer-types", "hybrid,hybrid_sliding,hybrid", "--sliding-window", "3",
           "--rope-theta", "10000", "--rope-theta-sliding", "500", "--seed", "1"],
     "g=3, rot 8 of 32, conv kernels 3/2 (state 3), window 3"),
    ("b", ["--hidden", "50", "--layers", "3", "--heads", "2", "--kv-heads", "2", "--head-dim", "16",
           "--partial-rotary", "1.0", "--cca-time0", "2", "--cca-time1", "3", "--experts", "5",
           "--moe-intermediate", "27", "--router-hidden", "13", "--vocab", "997",
           "--layer-types", "hybrid_sliding", "--sliding-window", "2", "--skip-bias", "0.04",
           "--rope-theta", "5000000", "--rope-theta-sliding", "10000", "--seed", "3"],
     "g=1, full rotary, conv kernels 2/3, all layers window 2, skip class wins sometimes, odd vocab"),
    ("c", ["--hidden", "60", "--layers", "2", "--heads", "4", "--kv-heads", "4", "--head-dim", "24",
           "--partial-rotary", "0.5", "--cca-time0", "2", "--cca-time1", "2", "--experts", "2",
           "--moe-intermediate", "33", "--router-hidden", "17", "--vocab", "1000",
           "--layer-types", "hybrid,hybrid_sliding", "--sliding-window", "5",
           "--rope-theta", "10000", "--rope-theta-sliding", "10000", "--seed", "2"],
     "nkv 4 (2 current + 2 delayed value heads), g=1, head_dim 24, rot 12"),
    ("d", ["--hidden", "48", "--layers", "2", "--heads", "6", "--kv-heads", "3", "--head-dim", "16",
           "--partial-rotary", "0.5", "--cca-time0", "2", "--cca-time1", "3", "--experts", "3",
           "--moe-intermediate", "20", "--router-hidden", "12", "--vocab", "1000",
           "--layer-types", "hybrid,hybrid_sliding", "--sliding-window", "7", "--attention-bias", "--lm-head-bias",
           "--rope-theta", "10000", "--rope-theta-sliding", "500", "--seed", "5"],
     "odd nkv 3 (value head 1 = current channels 16-23 + delayed 0-7), attention_bias, lm_head_bias, window 7"),
]
# native only: options the legacy schema cannot express
NATIVE_ONLY = [
    ("f", ["--hidden", "40", "--layers", "2", "--heads", "4", "--kv-heads", "1", "--head-dim", "20",
           "--partial-rotary", "0.2", "--partial-rotary-sliding", "1.0", "--cca-time0", "3", "--cca-time1", "3",
           "--experts", "2", "--moe-intermediate", "18", "--router-hidden", "10", "--vocab", "1000",
           "--layer-types", "hybrid_sliding,hybrid", "--sliding-window", "9", "--lm-head-bias",
           "--rope-theta", "100000", "--rope-theta-sliding", "700", "--seed", "4"],
     "nkv 1 (one value head: 10 current + 10 delayed channels), per-type partial rotary (4 and 20 of 20) "
     "and theta, lm_head_bias only"),
]
# ZAYA1-base schema (Zyphra fork, branch zaya): the same weights as a native checkpoint
BASE_FLAGS = ["--hidden", "96", "--layers", "3", "--heads", "4", "--kv-heads", "2", "--head-dim", "12",
              "--partial-rotary", "0.5", "--experts", "3", "--moe-intermediate", "20", "--router-hidden", "12",
              "--vocab", "1000", "--layer-types", "hybrid_sliding", "--sliding-window", "5", "--rope-theta", "10000",
              "--rope-theta-sliding", "10000", "--attention-bias", "--seed", "7"]
IDS = [2, 17, 996, 512, 0, 45, 300, 301, 7, 88, 650, 3, 3, 3, 420, 777, 1, 106, 250, 995]   # T = 20
GREEDY = 6


# ----------------------------------------------------------------------------------------------
# helpers

def load_dump(d):
    with open(os.path.join(d, "index.json")) as f:
        idx = json.load(f)
    return {t["name"]: t for t in idx["tensors"]}, [t["name"] for t in idx["tensors"]]


def tensor(d, entry):
    return read_npy(os.path.join(d, entry["file"]))


def run_all(cmds):
    """Runs commands (lists) in parallel in the repo root; [(rc, stdout, stderr)] in order."""
    procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in cmds]
    out = []
    for p in procs:
        o, e = p.communicate()
        out.append((p.returncode, o.decode("utf-8", "replace"), e.decode("utf-8", "replace")))
    return out


def one(cmd):
    return run_all([cmd])[0]


def ref(ckpt, ids, out, *extra):
    shutil.rmtree(out, ignore_errors=True)
    return ["python3", "test/ref_forward.py", ckpt, "--ids", ",".join(map(str, ids)), "--out", out, *extra]


def zaya(blob, ids, out, *extra):
    shutil.rmtree(out, ignore_errors=True)
    return ["./zaya", blob, "--ids", ",".join(map(str, ids)), "--dump", out, *extra]


def rel_err(a, b):
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b))
    return num / max(den, ABS_FLOOR * math.sqrt(len(b)))


def compare(test_dir, ref_dir, label, dims):
    """Every tensor in both dumps: the first divergent one (in the reference's order) is reported."""
    ta, _ = load_dump(test_dir)
    tb, order = load_dump(ref_dir)
    common = [n for n in order if n in ta]
    bad, worst = [], (0.0, "")
    for name in common:
        sa, a = tensor(test_dir, ta[name])
        sb, b = tensor(ref_dir, tb[name])
        if sa != sb:
            bad.append(f"{name}: shape {list(sa)} vs reference {list(sb)}")
            continue
        if tb[name]["dtype"] == "int32":
            diff = [t for t, (x, y) in enumerate(zip(a, b)) if x != y]
            if diff:
                bad.append(f"{name}: {len(diff)} of {len(b)} differ, first at position {diff[0]} "
                           f"(zaya {a[diff[0]]}, reference {b[diff[0]]})")
            continue
        e = rel_err(a, b)
        worst = max(worst, (e, name))
        if not e <= REL_TOL:           # also catches NaN
            row = len(b) // sb[0] if sb and sb[0] else len(b)
            per = [rel_err(a[t * row:(t + 1) * row], b[t * row:(t + 1) * row]) for t in range(len(b) // row)]
            first = next((t for t, v in enumerate(per) if not v <= REL_TOL), 0)
            worst_t = max(range(len(per)), key=lambda t: per[t] if per[t] == per[t] else math.inf)
            bad.append(f"{name} {list(sb)}: rel L2 {e:.3g}; first position off {first} (rel {per[first]:.3g}), "
                       f"worst position {worst_t} (rel {per[worst_t]:.3g})")
    check(len(common) >= 20 and not bad,
          f"{label}: {len(common)} tensors of ./zaya --dump match ref_forward.py (rel L2 <= {REL_TOL:g}, "
          f"router indices exact; worst {worst[0]:.2g} at {worst[1]})",
          f"[{dims}] first divergence: {bad[0]}; {len(bad) - 1} more" if bad else
          f"only {len(common)} tensors in common")
    return not bad


def router_facts(ref_dir, E):
    """(smallest biased top-1/top-2 margin, [(layer, position)] of it, per-layer count of skip picks)."""
    t, order = load_dump(ref_dir)
    small, skips = (math.inf, None), []
    for name in order:
        if name.endswith(":router_margin"):
            _, m = tensor(ref_dir, t[name])
            i = min(range(len(m)), key=lambda k: m[k])
            small = min(small, (m[i], (name.split(".")[2], i)))
        if name.endswith(".router_indices"):
            _, idx = tensor(ref_dir, t[name])
            skips.append(sum(1 for v in idx if v == E))
    return small, skips


def blob_tensors(path):
    """{name: raw data bytes} and the config part of the header (bytes 128..512) of a zaya blob."""
    with open(path, "rb") as f:
        b = f.read()
    n, dir_off = struct.unpack_from("<I", b, 32)[0], struct.unpack_from("<Q", b, 24)[0]
    out = {}
    for k in range(n):
        e = dir_off + 192 * k
        name = b[e:e + 128].split(b"\0")[0].decode()
        off, size = struct.unpack_from("<QQ", b, e + 168)
        out[name] = b[off:off + size]
    return out, b[128:512]


def small_tokenizer(src, out, n=1000):
    """The fixture tokenizer cut to its first n ids (no chat template): the forward pass does not use the
    tokenizer, and exporting the full 262k-piece one costs ~4 s per blob on a small machine."""
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    vocab = {p: i for p, i in tj["model"]["vocab"].items() if i < n}
    pair = [m if isinstance(m, list) else m.split(" ") for m in tj["model"]["merges"]]
    tj["model"]["vocab"] = vocab
    tj["model"]["merges"] = [m for m in pair if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tj["added_tokens"] = [a for a in tj["added_tokens"] if a["id"] < n]
    cfg.pop("chat_template", None)
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items() if int(k) < n}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    return out


def experts(flags):
    return int(flags[flags.index("--experts") + 1])


def main():
    # ------------------------------------------------------------------------------------------
    # 0. build and fixtures

    FX = need_fixtures()
    TOKDIR = tokenizer_dir()
    os.makedirs(OUT, exist_ok=True)
    rc, _, err = one(["make", "zaya", "build/test_decode"])
    check(rc == 0 and os.path.exists(os.path.join(ROOT, "zaya")), "make zaya build/test_decode", err.strip()[-500:])
    if rc != 0:
        finish()

    # ------------------------------------------------------------------------------------------
    # 1. the reference against the official code

    with open(os.path.join(FX, "index.json")) as f:
        PROMPT = json.load(f)["prompt"]["ids"]
    T0 = len(PROMPT)
    LOGIT_POS = [0, T0 - 1]
    jobs = [("native", "golden", "zero"), ("legacy", "golden_zyphra", "passthrough")]
    res = run_all([ref(os.path.join(FX, f"checkpoint_{lay}"), PROMPT, os.path.join(OUT, f"pub_{lay}"),
                       "--skip-expert", mode, "--logits", ",".join(map(str, LOGIT_POS))) for lay, _, mode in jobs])
    for (lay, gold, mode), (rc, _, err) in zip(jobs, res):
        label = f"ref_forward.py on checkpoint_{lay} (skip {mode}) vs {gold}"
        if not check(rc == 0, f"{label}: runs", err.strip()[-500:]):
            continue
        d, g = os.path.join(OUT, f"pub_{lay}"), os.path.join(FX, gold)
        t, _ = load_dump(d)
        (L, T, H), hs = read_npy(os.path.join(g, "hidden_states.npy"))
        errs = [rel_err(tensor(d, t[f"model.layers.{i}.post_mlp_residual_scale"])[1], hs[i * T * H:(i + 1) * T * H])
                for i in range(L)]
        check(max(errs) <= 3e-6, f"{label}: layer outputs within rel L2 3e-6 (worst {max(errs):.2g})",
              f"per layer {[f'{e:.2g}' for e in errs]}")
        _, ri = read_npy(os.path.join(g, "router_indices.npy"))
        bad = [(i, p) for i in range(L) for p, v in enumerate(tensor(d, t[f"model.layers.{i}.mlp.gate.router_indices"])[1])
               if v != ri[i * T + p]]
        check(not bad, f"{label}: router indices identical", f"{len(bad)} differ, first (layer, position) {bad[:3]}")
        e = rel_err(tensor(d, t["model.norm"])[1], read_npy(os.path.join(g, "final_norm.npy"))[1])
        check(e <= 3e-6, f"{label}: model.norm within rel L2 3e-6 ({e:.2g})", f"rel L2 {e:.3g}")
        (_, K), tid = read_npy(os.path.join(g, "logits_top16_ids.npy"))
        _, tval = read_npy(os.path.join(g, "logits_top16_values.npy"))
        (_, V), lg = tensor(d, t["logits:rows"])
        ok, detail = True, ""
        for r, p in enumerate(LOGIT_POS):
            row = lg[r * V:(r + 1) * V]
            top = sorted(range(V), key=lambda v: -row[v])[:K]
            err = max(abs(row[v] - x) for v, x in zip(tid[p * K:(p + 1) * K], tval[p * K:(p + 1) * K]))
            if top != list(tid[p * K:(p + 1) * K]) or err > 1e-4:
                ok, detail = False, f"position {p}: top-{K} {top[:5]}... vs {list(tid[p * K:p * K + 5])}..., max err {err:.3g}"
        check(ok, f"{label}: top-{K} logits at positions {LOGIT_POS} (ids equal, values within 1e-4)", detail)

    # ------------------------------------------------------------------------------------------
    # 2. odd dimensions: generate both layouts, export, dump

    TOKSMALL = small_tokenizer(TOKDIR, os.path.join(OUT, "tokenizer_1000"))
    gen, exp = [], []
    layouts = {name: ("native", "legacy") for name, _, _ in CONFIGS}
    layouts.update({name: ("native",) for name, _, _ in NATIVE_ONLY})
    for name, flags, _ in CONFIGS + NATIVE_ONLY:
        for lay in layouts[name]:
            gen.append(["python3", "tools/make_checkpoint.py", os.path.join(OUT, f"{name}_{lay}"), "--layout", lay,
                        *flags, "--tokenizer-dir", TOKSMALL, "--force", "--quiet"])
            exp.append(["python3", "export_weights.py", os.path.join(OUT, f"{name}_{lay}"),
                        os.path.join(OUT, f"{name}_{lay}.bin"), "--chat-format", "none"])
    for c, (rc, _, err) in zip(gen, run_all(gen)):
        check(rc == 0, f"make_checkpoint {os.path.basename(c[2])}", err.strip()[-500:])
    for c, (rc, _, err) in zip(exp, run_all(exp)):
        check(rc == 0, f"export_weights {os.path.basename(c[2])}", err.strip()[-500:])

    for name, flags, what in CONFIGS + NATIVE_ONLY:
        dims = f"config {name}: {what}; " + " ".join(f.lstrip("-") for f in flags)
        E = experts(flags)
        win = int(flags[flags.index("--sliding-window") + 1])
        both = layouts[name] == ("native", "legacy")
        ck = {lay: os.path.join(OUT, f"{name}_{lay}") for lay in ("native", "legacy")}
        blob = {lay: ck[lay] + ".bin" for lay in ck}
        if not all(os.path.exists(blob[lay]) for lay in layouts[name]):
            check(False, f"config {name}: blobs exist", "export failed")
            continue

        if both:
            ta, ha = blob_tensors(blob["native"])
            tb, hb = blob_tensors(blob["legacy"])
            check(ta == tb and ha == hb, f"config {name}: native and legacy exports hold identical tensors and config",
                  f"names only in one: {sorted(set(ta) ^ set(tb))[:4]}, differing data: "
                  f"{[n for n in ta if n in tb and ta[n] != tb[n]][:4]}, config equal {ha == hb}")

        d = {k: os.path.join(OUT, f"{name}_{k}") + "_dump" for k in
             ("zaya", "zaya_legacy", "zaya_b1", "zaya_pt", "ref", "ref_legacy", "ref_pt")}
        jobs = {"zaya": zaya(blob["native"], IDS, d["zaya"]),
                "zaya_legacy": zaya(blob["legacy"], IDS, d["zaya_legacy"]),
                "zaya_b1": zaya(blob["native"], IDS, d["zaya_b1"], "--batch", "1"),
                "zaya_pt": zaya(blob["native"], IDS, d["zaya_pt"], "--skip-expert", "passthrough"),
                "ref": ref(ck["native"], IDS, d["ref"]),
                "ref_legacy": ref(ck["legacy"], IDS, d["ref_legacy"]),
                "ref_pt": ref(ck["native"], IDS, d["ref_pt"], "--skip-expert", "passthrough")}
        if not both:
            del jobs["zaya_legacy"], jobs["ref_legacy"]
        results = run_all(list(jobs.values()))
        ok = [check(rc == 0 and "runtime error" not in err, f"config {name}: {k} dump runs", err.strip()[-500:])
              for k, (rc, _, err) in zip(jobs, results)]
        if not all(ok):
            continue

        check(len(IDS) > win, f"config {name}: prompt of {len(IDS)} tokens is longer than the sliding window {win}")
        (margin, where), skips = router_facts(d["ref"], E)
        check(margin >= MIN_MARGIN, f"config {name}: every biased router margin >= {MIN_MARGIN:g} "
              f"(smallest {margin:.2g}, layer {where[0]} position {where[1]})",
              f"margin {margin:.3g} at layer {where[0]} position {where[1]}: a near-tie, choose another --seed")
        compare(d["zaya"], d["ref"], f"config {name} (native blob, skip zero)", dims)
        compare(d["zaya_b1"], d["ref"], f"config {name} (--batch 1: token-by-token prefill)", dims)

        # both layouts: the reference reads them alike, and ./zaya gives the same bits
        if both:
            la = tensor(d["zaya"], load_dump(d["zaya"])[0]["logits"])[1]
            lb = tensor(d["zaya_legacy"], load_dump(d["zaya_legacy"])[0]["logits"])[1]
            check(la == lb, f"config {name}: native and legacy blobs give bit-identical ./zaya logits")
            ra, rb = load_dump(d["ref"])[0], load_dump(d["ref_legacy"])[0]
            diff = [n for n in ra if n not in rb or tensor(d["ref"], ra[n]) != tensor(d["ref_legacy"], rb[n])]
            check(not diff and len(ra) == len(rb), f"config {name}: ref_forward.py reads both layouts to identical tensors",
                  f"differ: {diff[:4]}")

        # skip expert
        if name == "b":
            check(any(skips) and not all(s == len(IDS) for s in skips),
                  f"config {name}: the skip class wins at some tokens (per layer {skips} of {len(IDS)})",
                  "no skip (or only skips): the passthrough check below proves nothing; change --skip-bias/--seed")
        compare(d["zaya_pt"], d["ref_pt"], f"config {name} (--skip-expert passthrough, skips per layer {skips})", dims)

    # ------------------------------------------------------------------------------------------
    # 3. short prompts (shorter than the conv state of config a: K = 3) and cached greedy decoding

    name, flags, what = CONFIGS[0]
    dims = f"config {name}: {what}"
    for ids in ([2], [2, 5]):
        dz, dr = os.path.join(OUT, f"short{len(ids)}_zaya"), os.path.join(OUT, f"short{len(ids)}_ref")
        r1, r2 = run_all([zaya(os.path.join(OUT, f"{name}_native.bin"), ids, dz), ref(os.path.join(OUT, f"{name}_native"), ids, dr)])
        if check(r1[0] == 0 and r2[0] == 0, f"config {name}: prompt of {len(ids)} token(s) runs", (r1[2] + r2[2]).strip()[-500:]):
            compare(dz, dr, f"config {name}: prompt of {len(ids)} token(s) (shorter than the conv state)", dims)

    for name, flags, what in CONFIGS + NATIVE_ONLY:
        blob, ck = os.path.join(OUT, f"{name}_native.bin"), os.path.join(OUT, f"{name}_native")
        for mode in ("zero", "passthrough") if name == "b" else ("zero",):
            # generation (no tap, N threads) = --dump (a tap, 1 thread, token by token), bit for bit
            for r in run_all([["env", f"ZAYA_THREADS={t}", "build/test_decode", blob, ",".join(map(str, IDS)),
                               str(GREEDY), *(["passthrough"] if mode == "passthrough" else [])] for t in (1, 2, 3)]):
                check(r[0] == 0 and r[1].startswith("PASS"), f"config {name}: " + (r[1].strip()[5:].replace(OUT + "/", "") or "test_decode runs"),
                      (r[1] + r[2]).strip()[-500:])
            rc, out, err = one(["./zaya", blob, "--ids", ",".join(map(str, IDS)), "-n", str(GREEDY), "-t", "0",
                                "--print-ids", "--skip-expert", mode])
            try:
                gen = [int(x) for x in out.strip().split(",")]
            except ValueError:
                gen = []
            if not check(rc == 0 and len(gen) == GREEDY, f"config {name}: ./zaya greedy {GREEDY} tokens (skip {mode})",
                         f"rc {rc}, output {out.strip()[:200]!r}, {err.strip()[-300:]}"):
                continue
            full = IDS + gen[:-1]
            dr = os.path.join(OUT, f"{name}_greedy_{mode}")
            pos = list(range(len(IDS) - 1, len(full)))
            rc, _, err = one(ref(ck, full, dr, "--skip-expert", mode, "--logits", ",".join(map(str, pos))))
            if not check(rc == 0, f"config {name}: ref_forward.py on prompt + continuation runs", err.strip()[-500:]):
                continue
            (n, V), lg = tensor(dr, load_dump(dr)[0]["logits:rows"])
            want, near = [], []
            for r in range(n):
                row = lg[r * V:(r + 1) * V]
                top = sorted(range(V), key=lambda v: -row[v])[:2]
                want.append(top[0])
                near.append(row[top[0]] - row[top[1]])
            check(gen == want, f"config {name}: cached greedy decode of ./zaya (skip {mode}) = argmax of the reference's "
                  f"full forward over prompt + continuation (window {flags[flags.index('--sliding-window') + 1]}, "
                  f"{len(full)} positions)",
                  f"zaya {gen}, reference {want}, reference top-1 margins {[f'{m:.2g}' for m in near]}")
    base_schema(TOKSMALL)
    long_window(TOKSMALL)
    preset_74b()
    finish()


LONG_FLAGS = ["--hidden", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--experts", "2",
              "--moe-intermediate", "12", "--router-hidden", "8", "--vocab", "1000", "--layer-types", "s,h",
              "--sliding-window", "257", "--attention-bias", "--seed", "12"]


def long_window(tok):
    """5. A window of 257 keys and a 300-token prompt: the sliding layer's ring wraps, and the window spans
    two prefill batches (ZAYA_BATCH 256); in both layouts (legacy swa_layers 256)."""
    ids = [(7 * i * i + 3 * i + 2) % 1000 for i in range(300)]
    dims = "long window: " + " ".join(f.lstrip("-") for f in LONG_FLAGS)
    ck = {lay: os.path.join(OUT, f"long_{lay}") for lay in ("native", "legacy")}
    res = run_all([["python3", "tools/make_checkpoint.py", ck[lay], "--layout", lay, *LONG_FLAGS, "--tokenizer-dir", tok,
                    "--force", "--quiet"] for lay in ck])
    res += run_all([["python3", "export_weights.py", ck[lay], ck[lay] + ".bin", "--chat-format", "none"] for lay in ck])
    if not check(all(r[0] == 0 for r in res), "long window: generate and export both layouts",
                 " | ".join(r[2].strip()[-300:] for r in res if r[0])):
        return
    d = {k: os.path.join(OUT, f"long_{k}_dump") for k in ("zaya", "zaya_legacy", "ref")}
    res = run_all([zaya(ck["native"] + ".bin", ids, d["zaya"]), zaya(ck["legacy"] + ".bin", ids, d["zaya_legacy"]),
                   ref(ck["native"], ids, d["ref"], "--logits", "299")])
    if not check(all(r[0] == 0 for r in res), "long window: dumps run", " | ".join(r[2].strip()[-300:] for r in res)):
        return
    (margin, where), _ = router_facts(d["ref"], 2)
    check(margin >= MIN_MARGIN, f"long window: every biased router margin >= {MIN_MARGIN:g} (smallest {margin:.2g})",
          f"margin {margin:.3g} at layer {where[0]} position {where[1]}: a near-tie, choose another --seed")
    compare(d["zaya"], d["ref"], "long window (257 keys, 300 tokens: the ring wraps across two prefill batches)", dims)
    compare(d["zaya_legacy"], d["ref"], "long window, legacy blob (swa_layers 256)", dims)


def base_schema(tok):
    """4. The ZAYA1-base schema: against the reference, and the same blob as its native equivalent."""
    dims = "ZAYA1-base schema: " + " ".join(f.lstrip("-") for f in BASE_FLAGS)
    ck = {k: os.path.join(OUT, f"base_{k}") for k in ("base", "base_eps", "native")}
    extra = {"base": ["--layout", "base"], "base_eps": ["--layout", "base", "--base-layernorm-epsilon", "1e-05"],
             "native": ["--layout", "native"]}
    res = run_all([["python3", "tools/make_checkpoint.py", ck[k], *BASE_FLAGS, *extra[k], "--tokenizer-dir", tok,
                    "--force", "--quiet"] for k in ck])
    res += run_all([["python3", "export_weights.py", ck[k], ck[k] + ".bin", "--chat-format", "none"] for k in ck])
    if not check(all(r[0] == 0 for r in res), "ZAYA1-base schema: generate and export (base, base with "
                 "layernorm_epsilon 1e-5, native)", " | ".join(r[2].strip()[-300:] for r in res if r[0])):
        return
    with open(os.path.join(ck["base"], "config.json")) as f:
        cfg = json.load(f)
    check(cfg["zaya_layers"][:2] == ["a", 3] and cfg["num_attention_heads"] == 8 and cfg["cca_num_q_heads"][0] == 4
          and "layernorm_epsilon" not in cfg and "head_dim" not in cfg and cfg["num_hidden_layers"] == 120,
          "ZAYA1-base schema: config has zaya_layers (6 half-layers), 2 x the query heads in num_attention_heads, "
          "no head_dim, no layernorm_epsilon (router norm epsilon 1e-6, the fork's default), num_hidden_layers 120 "
          "(as ZAYA1-base's; the fork ignores it)", str(cfg)[:300])
    ta, ha = blob_tensors(ck["native"] + ".bin")
    tb, hb = blob_tensors(ck["base_eps"] + ".bin")
    check(ta == tb and ha == hb, "ZAYA1-base schema (layernorm_epsilon = norm_epsilon): the same tensors and config "
          "as the native export", f"names only in one: {sorted(set(ta) ^ set(tb))[:4]}, differing data: "
          f"{[n for n in ta if n in tb and ta[n] != tb[n]][:4]}, config equal {ha == hb}")
    tc, hc = blob_tensors(ck["base"] + ".bin")
    eps = struct.unpack_from("<f", hc, 248 - 128)[0]
    check(tc == ta and abs(eps - 1e-6) < 1e-12 and hc[:120] == ha[:120],
          "ZAYA1-base schema without layernorm_epsilon: same tensors, router_norm_eps 1e-6 in the header",
          f"router_norm_eps {eps}, tensors equal {tc == ta}")
    d = {k: ck[k] + "_dump" for k in ("base", "base_eps", "native")}
    dr = ck["base"] + "_ref"
    res = run_all([zaya(ck[k] + ".bin", IDS, d[k]) for k in d] + [ref(ck["base"], IDS, dr)])
    if not check(all(r[0] == 0 for r in res), "ZAYA1-base schema: dumps run", " | ".join(r[2].strip()[-300:] for r in res)):
        return
    la = tensor(d["native"], load_dump(d["native"])[0]["logits"])[1]
    lb = tensor(d["base_eps"], load_dump(d["base_eps"])[0]["logits"])[1]
    check(la == lb, "ZAYA1-base schema: bit-identical ./zaya logits to the native equivalent")
    compare(d["base"], dr, "ZAYA1-base schema (router norm epsilon 1e-6, biases, every layer sliding)", dims)


def preset_74b():
    """6. make_checkpoint.py --preset 74b at small depth (--dry-run: config and every tensor's shape, no
    weights): each layout's config converts to the 74B shape and the exporter's tensor plan matches."""
    import sys
    sys.path.insert(0, ROOT)
    import export_weights as ew
    for lay, layers in (("native", 2), ("legacy", 60), ("base", 1)):     # legacy: the whole 120 half-layers
        out = os.path.join(OUT, f"p74b_{lay}")
        rc, _, err = one(["python3", "tools/make_checkpoint.py", out, "--preset", "74b", "--layers", str(layers),
                          "--layout", lay, "--dry-run", "--tokenizer-dir", "none", "--force", "--quiet"]
                         + (["--layer-types", "hybrid"] if lay == "base" else []))
        if not check(rc == 0, f"make_checkpoint --preset 74b --layers {layers} --layout {lay} --dry-run", err[-500:]):
            continue
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            shapes = json.load(f)["metadata"]["shapes"]

        class Shapes:                    # stands in for the safetensors files: names and shapes only
            path = out
            tensors = {n: ("BF16", tuple(s), 0, 0) for n, s in shapes.items()}
        where = {n: Shapes for n in shapes}
        try:
            layout = ew.detect_layout(cfg, where)
            c = ew.native_config(cfg, "config.json") if layout == "native" else ew.legacy_to_native_config(cfg, "config.json")
            ew.check_config_limits(c, "config.json")
            plan = ew.plan_tensors(c, layout, where)
            err = ""
        except ew.ExportError as e:
            c, plan, err = None, [], str(e)
        if not check(c is not None, f"74B-shaped {lay} config and tensors pass the exporter's checks", err[:500]):
            continue
        want = {"hidden_size": 4096, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
                "num_experts": 24, "moe_intermediate_size": 4096, "router_hidden_size": 256, "vocab_size": 262272,
                "num_hidden_layers": layers}
        got = {k: c[k] for k in want}
        sliding = (c["layer_types"] == [("hybrid_sliding", "hybrid")[i % 2] for i in range(layers)]
                   and c["sliding_window"] == 4097)
        check(got == want and (sliding or lay == "base") and c["partial_rotary_factor"]["hybrid"] == 0.5,
              f"74B-shaped {lay}: {layers} layer(s) of hidden 4096, 16/2 heads of 128, 24 experts x 4096, router 256"
              + ("" if lay == "base" else ", every other layer sliding with a window of 4097 (legacy swa_layers 4096)"),
              f"{got}, layer types {c['layer_types']}, window {c['sliding_window']}")
        if lay == "legacy":
            check(cfg["swa_layers"] == [4096, 0, 0, 0] * (layers // 2) and cfg["num_hidden_layers"] == 120,
                  "74B-shaped legacy: 120 half-layers, swa_layers 4096 on every other attention half-layer",
                  f"{cfg['num_hidden_layers']} half-layers, swa_layers {str(cfg.get('swa_layers'))[:80]}")
        check(len(plan) == len({p[0] for p in plan}) and plan[0][1] == (262272, 4096)
              and any(p[0].endswith("mlp.experts.gate_up_proj") and p[1] == (24, 8192, 4096) for p in plan),
              f"74B-shaped {lay}: the exporter plans {len(plan)} tensors (embedding [262272, 4096], experts "
              "[24, 8192, 4096])", str([p[:2] for p in plan[:3]]))


if __name__ == "__main__":
    main()
