#!/usr/bin/env python3
"""test_precision.py - the bf16 fixture and `compare.py PORT FP32 --envelope BF16 [--spread BF16_2]`.

    python3 test/test_precision.py          (from the repo root; reads test/fixtures)

Fixture: every file of test/fixtures/golden_bf16 (230, decode/ included) has the size and sha256 that
index.json -> golden_bf16 gives; fixture_to_dump.py converts golden/, golden_bf16/ and golden_bf16/decode/
(the latter two say precision bf16, the conv taps check exactly: no note).

Verdicts (FP32 = golden/, ENVELOPE = golden_bf16/, SPREAD = golden_bf16/decode/, all converted):
- legitimate runs: the official bf16 whole-prompt run and its token-by-token run are "within the bf16
  envelope" (the latter also with the envelope alone, no spread: the honest case, two different runs);
  the official fp32 run and zaya.c's fp32 dump (full logits) are within, "far below";
- injected bugs of the kinds porters make, each computed (standard library, bf16 rounding where the
  official code rounds, docs/bf16.md) from the official bf16 inputs of the step where it enters, written
  into a copy of the bf16 dump at that tensor only. Downstream tensors keep the official values, so these
  cases check WHERE the verdict points, not how far a bug grows downstream (the engine's --precision bf16
  runs with injected bugs do that):
    wrong index     the delayed value uses v_proj_delayed(h_t) instead of h_(t-1)     -> qkv_proj:value
    wrong index     residual mix pairs query head n with KV head n % kv instead of n // g -> query_residual
    missing term    layer 1's router state lacks the EDA term (previous state * scale) -> mlp.gate:router_state
    wrong constant  RoPE theta 1e4 on the hybrid layers (5e6 in the config)            -> query_after_rope
    misplaced cast  the fp32 residual stream rounded to bf16 after the attention half  -> within (its entry
                    change is one bf16 rounding, far inside the cloud: not distinguishable end to end)
  A case expecting "exceeds" passes only when the verdict names that tensor at a position the bug changed.
- routing: a flip above --near-tie's margin but inside the margin change bf16 itself shows in that layer
  is a "bf16 near-tie" and within; a flip at a layer-0 margin >= 0.03 is a bug: "exceeds it first at
  ...router_indices".
Output: one `PASS name` / `FAIL name: detail` line per check; exit status 1 if any check failed.
"""
import array
import hashlib
import json
import math
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ZAYA = os.path.join(ROOT, "zaya")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import compare  # noqa: E402
from fixture_to_dump import bf16  # noqa: E402
from harness import BUILD, check, finish, mutant, need_fixtures, run as run_cmd  # noqa: E402


def run(*args):
    """A Python script of the repository: (exit status, stdout, stderr)."""
    return run_cmd([sys.executable, *args])


def verdict(out):
    line = next((l for l in out.splitlines() if l.startswith("VERDICT:")), "")
    if line.startswith("VERDICT: within"):
        return ("within", None, None)
    if line.startswith("VERDICT: exceeds it first at "):
        rest = line[len("VERDICT: exceeds it first at "):]
        name, _, pos = rest.partition(", position ")
        try:
            return ("exceeds", name, int(pos.split(",")[0].split(":")[0]))
        except ValueError:
            return ("exceeds", name, None)
    return (None, None, None)


def check_verdict(label, port, expected, fp32, envelope, spread=None):
    args = ["compare.py", port, fp32, "--envelope", envelope] + (["--spread", spread] if spread else [])
    rc, out, err = run(*args)
    kind, name, pos = verdict(out)
    tail = (out + err)[-700:]
    if expected[0] == "within":
        ok = rc == 0 and kind == "within" and (len(expected) < 2 or expected[1] in out)
        return check(ok, f"{label}: within the bf16 envelope", f"exit {rc}, verdict {kind} {name} {pos}:\n{tail}"), out
    want_name, positions = expected[1], expected[2] if len(expected) > 2 else None
    ok = rc == 1 and kind == "exceeds" and name == want_name and (positions is None or pos in positions)
    return check(ok, f"{label}: exceeds the envelope first at {want_name}",
                 f"exit {rc}, verdict {kind} {name} position {pos} (allowed {sorted(positions) if positions else 'any'})"
                 f":\n{tail}"), out


# ---- editing a converted dump ----
class Edit:
    """A copy of a dump folder whose tensors can be read and replaced (same shapes)."""

    def __init__(self, src, dst):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        self.dir = dst
        with open(os.path.join(dst, "index.json")) as f:
            self.index = json.load(f)

    def load(self, name):
        return compare.read_npy(os.path.join(self.dir, compare.file_name(name)))

    def save(self, name, shape, data):
        compare.write_npy(os.path.join(self.dir, compare.file_name(name)), shape, array.array("f", data))

    def replace(self, name, compute):
        """Tensor `name` replaced by compute(shape, values) (the same shape); returns (name, the values before)."""
        shape, before = self.load(name)
        self.save(name, shape, compute(shape, before))
        return name, before

    def changed_rows(self, name, before):
        shape, after = self.load(name)
        n = len(after) // shape[0]
        return {t for t in range(shape[0]) if after[t * n:(t + 1) * n] != before[t * n:(t + 1) * n]}


def bug_delayed_value(e, L, cfg):
    """value[t] = [v_proj_current(h_t), v_proj_delayed(h_t)]: the delayed half not shifted by one token."""
    P = f"model.layers.{L}.self_attn.qkv_proj"
    _, vd = e.load(P + ".v_proj_delayed")

    def compute(shape, value):
        T, w = shape[0], len(value) // shape[0]
        half = w // 2
        out = array.array("f", value)
        for t in range(T):
            out[t * w + half:(t + 1) * w] = vd[t * half:(t + 1) * half]
        return out
    return e.replace(P + ":value", compute)


def bug_gqa_index(e, L, cfg):
    """query_residual[n] = (q[n] + k[n % kv]) / 2 instead of k[n // g] (the residual mix's KV head)."""
    P = f"model.layers.{L}.self_attn.qkv_proj"
    _, q = e.load(P + ".q_proj")
    _, k = e.load(P + ".k_proj")
    nkv = cfg["num_key_value_heads"]

    def compute(shape, qr):
        T, nq, d = shape
        out = []
        for t in range(T):
            for n in range(nq):
                s = [q[(t * nq + n) * d + i] + k[(t * nkv + n % nkv) * d + i] for i in range(d)]
                out.extend(x * 0.5 for x in bf16(s))              # rnd(q + k), * 0.5 exact
        return out
    return e.replace(P + ":query_residual", compute)


def bug_missing_eda(e, L, cfg):
    """Layer L >= 1: router state = down_proj alone (the previous state * router_states_scale dropped)."""
    G = f"model.layers.{L}.mlp.gate"
    _, dp = e.load(G + ".down_proj")
    return e.replace(G + ":router_state", lambda shape, st: dp)


def bug_rope_theta(e, L, cfg):
    """RoPE on a hybrid layer with theta 1e4 (the sliding layers' value) instead of its own."""
    A = f"model.layers.{L}.self_attn"
    shape, qn = e.load(A + ".qk_norm:query")
    before = e.load(A + ":query_after_rope")[1]
    T, nq, d = shape
    rope = cfg["rope_parameters"][cfg["layer_types"][L]]
    rot = int(d * rope.get("partial_rotary_factor", 1.0))
    half = rot // 2
    inv = array.array("f", [1.0 / (1e4 ** (2 * i / rot)) for i in range(half)])
    out = array.array("f", qn)
    for t in range(T):
        ang = array.array("f", [t * f for f in inv]) * 2          # cat(freqs, freqs), fp32
        cos, sin = bf16(math.cos(a) for a in ang), bf16(math.sin(a) for a in ang)
        for h in range(nq):
            b = (t * nq + h) * d
            v = qn[b:b + rot]
            rh = [-v[j + half] for j in range(half)] + [v[j] for j in range(half)]
            x, y = bf16(v[j] * cos[j] for j in range(rot)), bf16(rh[j] * sin[j] for j in range(rot))
            out[b:b + rot] = bf16(x[j] + y[j] for j in range(rot))
    e.save(A + ":query_after_rope", shape, out)
    return A + ":query_after_rope", before


def bug_bf16_residual(e, L, cfg):
    """The fp32 residual stream stored in bf16 after the attention half (a cast in the wrong place)."""
    return e.replace(f"model.layers.{L}.post_attention_residual_scale", lambda shape, r: bf16(r))


def flip_route(e, L, pos, choice):
    """The port routes position `pos` of layer L to expert `choice` (router_indices only)."""
    name = f"model.layers.{L}.mlp.gate.router_indices"
    path = os.path.join(e.dir, compare.file_name(name))
    shape, ri = compare.read_npy(path)
    ri[pos] = choice
    compare.write_npy(path, shape, ri)
    return name


def routing_cases(F, E, S, tmp, cfg):
    """A flip at an fp32 margin at or above --near-tie's but inside the margin change bf16 itself shows in that
    layer (the official bf16 run against the fp32 one) is a bf16 near-tie; of those, the one with the smallest
    margin relative to that change. A flip at layer 0's smallest fp32 margin >= 0.03, outside bf16's change
    there, is a bug."""
    def margins(d, L):
        return compare.read_npy(os.path.join(d, compare.file_name(f"model.layers.{L}.mlp.gate:router_margin")))[1]

    def indices(d, L):
        return compare.read_npy(os.path.join(d, compare.file_name(f"model.layers.{L}.mlp.gate.router_indices")))[1]

    E_ = cfg["num_experts"]
    near = []   # (margin / bf16's margin change in the layer, layer, position)
    for L in range(cfg["num_hidden_layers"]):
        mf, me, rf, re_ = margins(F, L), margins(E, L), indices(F, L), indices(E, L)
        move = max(abs(a - b) for a, b in zip(mf, me))
        near += [(mf[t] / move, L, t) for t in range(len(mf)) if compare.NEAR_TIE <= mf[t] < move and rf[t] == re_[t]]
    if check(bool(near), "the fixture has a position inside bf16's margin change and above --near-tie",
             "no such position: the near-tie case cannot be built from this fixture"):
        _, L, pos = min(near)
        m, r = margins(F, L), indices(E, L)
        e = Edit(E, os.path.join(tmp, "flip_bf16_near_tie"))
        flip_route(e, L, pos, (int(r[pos]) + 1) % E_)
        _, out = check_verdict(f"routing flip at layer {L} position {pos} (fp32 margin {m[pos]:.3g}): a bf16 near-tie",
                               e.dir, ("within",), F, E, S)
        check("bf16 near-tie" in out, "the flip is labelled a bf16 near-tie", out[-600:])
    m0, r0 = margins(F, 0), indices(F, 0)
    pos = min((t for t in range(len(m0)) if m0[t] >= 0.03), key=lambda t: m0[t])   # small, but 3x bf16's move
    e = Edit(E, os.path.join(tmp, "flip_bug"))
    name = flip_route(e, 0, pos, (int(r0[pos]) + 1) % E_)
    check_verdict(f"routing flip at layer 0 position {pos} (fp32 margin {m0[pos]:.3g}): a bug", e.dir,
                  ("exceeds", name, {pos}), F, E, S)


BUGS = [  # (label, function, layer, expected verdict kind)
    ("wrong index: delayed value not shifted", bug_delayed_value, 0, "exceeds"),
    ("wrong index: residual mix KV head n % kv", bug_gqa_index, 0, "exceeds"),
    ("missing term: no EDA in layer 1's router state", bug_missing_eda, 1, "exceeds"),
    ("wrong constant: RoPE theta 1e4 on hybrid layer 1", bug_rope_theta, 1, "exceeds"),
    ("misplaced cast: residual stream rounded to bf16 (layer 0)", bug_bf16_residual, 0, "within"),
]


def fixture_hashes():
    with open(need_fixtures("index.json")) as f:
        index = json.load(f)
    sec = index.get("golden_bf16", {})
    files = sec.get("files", {})
    bad = []
    for rel, info in files.items():
        path = os.path.join(need_fixtures(), rel)
        if not os.path.exists(path):
            bad.append(f"{rel} missing")
            continue
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != info.get("sha256"):
            bad.append(f"{rel}: sha256 {hashlib.sha256(data).hexdigest()[:12]}..., index.json {str(info.get('sha256'))[:12]}...")
    on_disk = sum(len(fs) for _, _, fs in os.walk(need_fixtures("golden_bf16")))
    check(files and not bad and on_disk == len(files), f"golden_bf16: {len(files)} files, each with index.json's sha256",
          f"{len(files)} indexed, {on_disk} on disk; " + "; ".join(bad[:5]) +
          "\n  hint: restore with `git checkout -- test/fixtures` (a file cut short or edited is not the fixture)")
    return index


# Bugs of the kinds porters make, put into zaya.c itself (test/harness.py mutant()) and run in bf16 with the
# fixture's torch rounding: every downstream tensor is the buggy engine's own. (label, name, zaya.c edits,
# expected): expected is ("within",) or ("exceeds", tensor name, set of allowed positions or None).
ENGINE_BUGS = [
    ("engine bf16, wrong index: the delayed value is this token's v_proj_delayed", "delayed_index",
     [("""        memcpy(v + (size_t)t * VD + half, delayed_value, sizeof(float) * (size_t)half);
        memcpy(delayed_value, vd + (size_t)t * half, sizeof(float) * (size_t)half);""",
       """        memcpy(delayed_value, vd + (size_t)t * half, sizeof(float) * (size_t)half);
        memcpy(v + (size_t)t * VD + half, delayed_value, sizeof(float) * (size_t)half);""")],
     ("exceeds", "model.layers.0.self_attn.qkv_proj:value", None)),
    ("engine bf16, wrong index: RoPE pairs (2j, 2j+1) instead of (j, j+rot/2)", "rope_pairs",
     [("                const float x0 = x[j], x1 = x[j + half];", "                const float x0 = x[2 * j], x1 = x[2 * j + 1];"),
      ("""                x[j] = held(b, held(b, x0 * cos_t[j]) - held(b, x1 * sin_t[j]));
                x[j + half] = held(b, held(b, x1 * cos_t[j]) + held(b, x0 * sin_t[j]));""",
       """                x[2 * j] = held(b, held(b, x0 * cos_t[j]) - held(b, x1 * sin_t[j]));
                x[2 * j + 1] = held(b, held(b, x1 * cos_t[j]) + held(b, x0 * sin_t[j]));""")],
     ("exceeds", "model.layers.0.self_attn:query_after_rope", None)),
    ("engine bf16, wrong constant: attention scaled by 1/d instead of d^-1/2", "attn_scale",
     [("const float scale = scalar(b, 1.0f / sqrtf((float)d));", "const float scale = scalar(b, 1.0f / (float)d);")],
     ("exceeds", "model.layers.0.self_attn:attn_output", None)),
    ("engine bf16, missing term: layer 1's EDA without the previous state", "no_eda_l1",
     [("rho[i] = states_scale ? held(b,", "rho[i] = states_scale && b->layer != 1 ? held(b,")],
     ("exceeds", "model.layers.1.mlp.gate:router_state", None)),
    ("engine bf16, misplaced cast: RMSNorm's x/rms not rounded before the weight (not distinguishable end to end)",
     "norm_cast", [("o[i] = held(b, w[i] * held_unless(b, moved, held_unless(b, moved, xt[i]) * inv_rms));",
                    "o[i] = held(b, w[i] * (held_unless(b, moved, xt[i]) * inv_rms));")], ("within",)),
]


def engine_cases(blob, ids, tmp, F, E, S):
    """zaya.c's own bf16 runs (both torch variants) are within; each ENGINE_BUGS mutant is named where it enters."""
    runs = [(f"zaya.c --precision {p}", ZAYA, p, ("within",)) for p in ("bf16", "bf16-torch1.13")]
    for label, name, edits, expected in ENGINE_BUGS:
        runs.append((label, mutant(name, edits), "bf16-torch1.13", expected))
    for label, zaya, precision, expected in runs:
        if not zaya:
            continue
        out = os.path.join(tmp, "engine_" + (os.path.basename(os.path.dirname(zaya)) if zaya != ZAYA else precision))
        shutil.rmtree(out, ignore_errors=True)
        rc, _, err = run_cmd([zaya, blob, "--ids", ids, "--dump", out, "--precision", precision])
        if check(rc == 0, f"{label}: dumps", err[-300:]):
            check_verdict(label, out, expected, F, E, S)


def main():
    index = fixture_hashes()
    cfg = index["config"]
    tmp = os.path.join(BUILD, "precision")
    os.makedirs(tmp, exist_ok=True)
    dumps = {}
    for src, want in (("golden", "fp32"), ("golden_bf16", "bf16"), ("golden_bf16/decode", "bf16")):
        out = os.path.join(tmp, src.replace("/", "_"))
        shutil.rmtree(out, ignore_errors=True)
        rc, o, e = run("tools/fixture_to_dump.py", need_fixtures(src), out)
        ok = rc == 0 and os.path.exists(os.path.join(out, "index.json"))
        info = {}
        if ok:
            with open(os.path.join(out, "index.json")) as f:
                info = json.load(f)
        check(ok and info.get("precision") == want and not info.get("notes"),
              f"fixture_to_dump.py {src}: precision {want}, no notes",
              f"exit {rc}, precision {info.get('precision')}, notes {info.get('notes')}: {(o + e)[-300:]}")
        dumps[src] = out if ok else None
    if None in dumps.values():
        finish()            # the verdicts below need all three dumps
    F, E, S = dumps["golden"], dumps["golden_bf16"], dumps["golden_bf16/decode"]

    # legitimate runs
    check_verdict("official bf16 whole prompt (envelope + spread)", E, ("within",), F, E, S)
    _, out = check_verdict("official bf16 token by token (envelope + spread)", S, ("within",), F, E, S)
    # rows after routing flips are judged against the run that made the same flips (here: all of them)
    m = re.search(r"(\d+) rows after the port's routing flips judged .*?; (\d+) rows after flips the port and", out)
    check(m and int(m.group(1)) > 0 and int(m.group(2)) == 0,
          "rows after the token-by-token run's routing flips are judged against the run that made them",
          m.group(0) if m else out[-400:])
    check_verdict("official bf16 token by token against the whole-prompt envelope alone", S, ("within",), F, E)
    check_verdict("official fp32 run", F, ("within", "far below"), F, E, S)

    # injected bugs
    for label, fn, layer, kind in BUGS:
        e = Edit(E, os.path.join(tmp, "bug_" + fn.__name__))
        name, before = fn(e, layer, cfg)
        changed = e.changed_rows(name, before)
        if not check(bool(changed), f"{label}: the injection changes {name}", "no row changed"):
            continue
        if kind == "within":
            check_verdict(label + " (not distinguishable end to end)", e.dir, ("within",), F, E, S)
        else:
            check_verdict(label, e.dir, ("exceeds", name, changed), F, E, S)

    routing_cases(F, E, S, tmp, cfg)

    # zaya.c in fp32 (the bf16 checkpoint's exact weights): within, far below
    if check(os.path.exists(ZAYA), "./zaya is built", "hint: run `make` (make test builds it)"):
        blob = os.path.join(tmp, "fx_bf16.bin")
        rc, o, e = run("export_weights.py", need_fixtures("checkpoint_native"), blob, "--dtype", "bf16")
        ours = os.path.join(tmp, "zaya_fp32")
        shutil.rmtree(ours, ignore_errors=True)
        ids = ",".join(map(str, index["prompt"]["ids"]))
        rc2, _, err2 = run_cmd([ZAYA, blob, "--ids", ids, "--dump", ours])
        if check(rc == 0 and rc2 == 0, "zaya.c dumps the fixture prompt", (o + e + err2)[-400:]):
            check_verdict("zaya.c fp32 dump", ours, ("within", "far below"), F, E, S)
            engine_cases(blob, ids, tmp, F, E, S)

    # usage errors: a message and exit 2, never a traceback
    rc, out, err = run("compare.py", E, F, "--spread", S)
    check(rc == 2 and "--spread needs --envelope" in err, "--spread without --envelope: exit 2 with a message",
          f"exit {rc}: {(out + err)[-300:]}")
    rc, out, err = run("compare.py", E, F, "--envelope", E, "--tol-scale", "10")
    check(rc == 2 and "do not apply with --envelope" in err, "--tol-scale with --envelope: exit 2 with a message",
          f"exit {rc}: {(out + err)[-300:]}")
    rc, out, err = run("compare.py", E, F, "--envelope", os.path.join(tmp, "no_such_dump"))
    check(rc == 2 and "does not exist" in err and "Traceback" not in err, "missing envelope folder: exit 2 with a message",
          f"exit {rc}: {(out + err)[-300:]}")
    other = Edit(S, os.path.join(tmp, "other_prompt"))
    other.index["tokens"] = [9] * len(other.index["tokens"])
    with open(os.path.join(other.dir, "index.json"), "w") as f:
        json.dump(other.index, f)
    rc, out, err = run("compare.py", E, F, "--envelope", other.dir)
    check(rc == 2 and "different prompts" in err, "envelope of another prompt: exit 2 with a message",
          f"exit {rc}: {(out + err)[-300:]}")
    finish()


if __name__ == "__main__":
    main()
