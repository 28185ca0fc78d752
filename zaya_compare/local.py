"""--local: which layer introduces a port's error (compare.py --local PORT REPLAY, or --local PORT --model M).

zaya.c's --replay recomputes every layer of a port's dump from the port's own input to that layer; the
local error of a tap is the port's tensor against that recomputation. With a bf16 replay as the
envelope (--envelope), a tap may be LOCAL_BF16_FACTOR times the bf16 replay's own local error. The
parts, in order: local_error() (the metric), run_replay() (./zaya --replay), open_dumps() (inputs and
their checks), judge_layers() (the verdict per layer and tap), report().

A bf16 port with --model M --bf16 gets the two-tier verdict (docs/compare.md §9), below report():
zaya.c replays the port at every legitimate bf16 placement (PLACEMENTS) and in fp32; tier 1
(judge_tiers) sets each tap beside the replay at the official placement in bf16 ulps (a statement: up to
which step the port computes like the official code, never an error by itself); the step check
(legit.py) recomputes each tap exactly (float64) from the port's own inputs and the blob's weights and
holds it to a rounding-error bound of the arithmetic a port may legitimately use; tier 2 sets its local
error (against the fp32 replay) beside the placements' envelope (the largest local error of a legitimate
placement) and names the placement the port is closest to; report_tiers() prints them. main(args) is
the view compare.py calls.
"""
import os
import struct
import subprocess

import numpy as np

from . import ggml, legit
from .diagnose import GGML_PRODUCTS, diagnose
from .dumps import Dump, InputError, declared_weights, guarded, need_router_indices, own_weights, worst_position
from .metrics import common_vocabulary, fmt, fsum, row_metrics
from .names import ATOL, LAYER_OUTPUT, is_logits, is_vision, LAYER_STATE, VL_STEPS, execution_order, kind_of, layer_of

# A bf16 port's local error of a tap may be this many times zaya.c's local bf16 envelope (the bf16
# replay against the fp32 replay of the same inputs): docs/compare.md has the measurements (legitimate
# bf16 runs of the official code: at most 1.9x; an injected one-step bug: 5x and more).
LOCAL_BF16_FACTOR = 3.0


def local_error(port, replay, name, positions=None):
    """rel L2 of the port's tensor against the replay's (over `positions` only, if given), or None;
    for an integer tensor, the count of values that differ."""
    if not (port.has(name) and replay.has(name)):
        return None
    sa, a = port.load(name)
    sb, b = replay.load(name)
    rows = sa[0] if sa else 1
    if list(sa) != list(sb):
        if not (is_logits(name) and len(sa) == len(sb) == 2 and sa[0] == sb[0]):
            raise InputError(f"{name}: the port's shape {list(sa)} is not the replay's {list(sb)}")
        a, b = common_vocabulary(a.reshape(rows, -1), b.reshape(rows, -1), name)
    a, b = a.reshape(rows, -1), b.reshape(rows, -1)
    if positions is not None and sa:
        keep = [t for t in range(rows) if t in positions]
        a, b = a[keep], b[keep]
    if a.dtype.kind in "iu" and a.size:
        return float(np.count_nonzero(a != b))
    sq_d, sq_b = row_metrics(a, b)[:2]
    return float(np.sqrt(fsum(sq_d)) / max(np.sqrt(fsum(sq_b)), ATOL * np.sqrt(max(b.size, 1))))


def write_json(args, doc):
    """--json OUT: the view's numbers and verdict (an unwritable path is an input error, exit 2)."""
    if not getattr(args, "json", None):
        return
    import json
    clean = lambda x: None if isinstance(x, float) and not np.isfinite(x) else x   # noqa: E731
    try:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=lambda o: clean(float(o)) if isinstance(o, (np.floating, float)) else int(o))
    except OSError as e:
        raise InputError(f"cannot write --json {args.json}: {e.strerror}")


def run_replay(model, port_dir, out_dir, precision):
    """./zaya MODEL --replay PORT --dump OUT [--precision P]; raises InputError with its message."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    zaya = os.path.join(root, "zaya")
    cmd = [zaya, model, "--replay", port_dir, "--dump", out_dir] + (["--precision", precision] if precision else [])
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        raise InputError(f"cannot run {zaya}: {e.strerror}\n  hint: build it with make")
    if p.returncode != 0:
        raise InputError(f"{' '.join(cmd)} failed:\n{p.stderr.strip()[-800:]}")


def open_dumps(args):
    """(port, replay, envelope or None, reference or None); runs the replays first with --model."""
    if args.model:
        out = args.replay_out or os.path.join(args.test_dir.rstrip("/") + "_replay")
        run_replay(args.model, args.test_dir, out + "_fp32", getattr(args, "precision", None))
        args.ref_dir = out + "_fp32"
        if args.bf16:
            run_replay(args.model, args.test_dir, out + "_bf16", "bf16")
            args.envelope = out + "_bf16"
    if not args.ref_dir:
        raise InputError("--local needs the replay: compare.py --local PORT_DUMP REPLAY_DUMP, or --model MODEL.bin to run "
                         "./zaya --replay itself")
    port, replay = Dump(args.test_dir, "PORT"), Dump(args.ref_dir, "REPLAY")
    env = Dump(args.envelope, "ENVELOPE") if args.envelope else None
    ref = Dump(args.reference, "REF") if args.reference else None
    need_router_indices(port, "--local")
    replay_of(port, replay, "REPLAY", args.model, None)
    if env is not None:
        replay_of(port, env, "--envelope", args.model, "bf16")
    for other in (env, ref):
        if other is not None and other.tokens is not None and port.tokens is not None and other.tokens != port.tokens:
            raise InputError(f"{other.folder} is of other ids than the port's dump\n  hint: dump the same --ids")
    return port, replay, env, ref


def replay_of(port, d, role, model, precision):
    """Refuses d unless it is ./zaya's --replay of the port's dump (index.json's `replay` section names the
    dump it replayed, `of`; the ids must be the port's): an end-to-end run is no local reference. The bf16
    envelope (precision given) must replay this very dump; a REPLAY of another dump of the same ids stays
    allowed (test_portmap judges a mis-mapped port against the good port's replay)."""
    how = (f"./zaya {model or 'MODEL.bin'} --replay {port.folder} --dump "
           f"{port.folder.rstrip('/')}_replay_{precision or 'fp32'}" + (f" --precision {precision}" if precision else ""))
    rep = d.index.get("replay")
    if not isinstance(rep, dict):
        what = f"a {d.index.get('precision') or 'fp32'} end-to-end run ({d.producer()})"
        raise InputError(f"{role} {d.folder} is not a replay of {port.folder}: its index.json has no `replay` section, "
                         f"it is {what}\n  expected: zaya.c's recomputation of each layer from the port's own inputs "
                         f"(an end-to-end run's local error is the whole drift up to that layer, far too wide)\n"
                         f"  hint: make one with {how}")
    of = rep.get("of")
    if precision and isinstance(of, str) and os.path.exists(of) and os.path.exists(port.folder) \
            and not os.path.samefile(of, port.folder):
        raise InputError(f"{role} {d.folder} is not a replay of {port.folder}: it replays {of}\n"
                         f"  hint: make one with {how}")
    if d.tokens is not None and port.tokens is not None and d.tokens != port.tokens:
        raise InputError(f"{role} {d.folder} is not a replay of {port.folder}: its ids are not the port's "
                         f"({len(d.tokens)} vs {len(port.tokens)} positions)\n  hint: make one with {how}")
    if precision and d.index.get("precision") is None:
        raise InputError(f"{role} {d.folder} is an fp32 replay; the local envelope is a bf16 one\n"
                         f"  expected: index.json precision bf16 (or another bf16 placement), found none (fp32)\n"
                         f"  hint: make one with {how}")


def routing_flips(port, replay, layer, near_tie):
    """(positions the port and the replay route differently in a layer, those of them at a near-tie of the
    replay's router scores)."""
    p = f"model.layers.{layer}."
    flips = []
    if port.has(p + "mlp.gate.router_indices") and replay.has(p + "mlp.gate.router_indices"):
        a = port.load(p + "mlp.gate.router_indices")[1].reshape(-1)
        b = replay.load(p + "mlp.gate.router_indices")[1].reshape(-1)
        m = min(a.size, b.size)
        flips = np.flatnonzero(a[:m] != b[:m]).tolist()
    margins = {}
    if flips and replay.has(p + "mlp.gate:router_scores"):
        shape, sc = replay.load(p + "mlp.gate:router_scores")
        sc = sc.reshape(-1, shape[1])
        for t in flips:
            row = np.sort(sc[t].astype(np.float64))
            margins[t] = float(row[-1] - row[-2])
    near = {t for t in flips if margins.get(t, 1.0) < near_tie}
    return flips, near


def judge_layers(args, port, replay, env, ref):
    """(rows, first): per layer (layer, output tap row, end-to-end error, worst tap, flips, near-ties, tap rows)
    with a tap row (name, local error, bf16 envelope, tolerance, past it?); first = the first tap past its
    tolerance in execution order (layer, name, local error, tolerance, envelope), or None."""
    n_layers = 1 + max([layer_of(n) for n in replay.order if layer_of(n) is not None] or [-1])
    T = len(port.tokens or [])
    names = [n for n in execution_order(n_layers) if replay.has(n) and port.has(n)]
    order = {n: i for i, n in enumerate(execution_order(n_layers))}
    rows, first = [], None
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        # positions whose routing the port and the replay choose differently at a near-tie are left out downstream
        flips, near = routing_flips(port, replay, layer, args.near_tie)
        keep = set(range(T)) - near
        layer_rows = []
        for name in [n for n in names if n.startswith(p)]:
            after_route = order[name] > order[p + "mlp.gate.router_indices"]
            pos = keep if (after_route and near) else None
            e_port = local_error(port, replay, name, pos)
            e_env = local_error(env, replay, name, pos) if env and env.has(name) else None
            kind, rtol = kind_of(name)
            if name.endswith("router_indices"):
                bad = any(t not in near for t in flips)
                gate = 0.0
            else:
                gate = rtol * args.tol_scale
                if e_env is not None:
                    gate = max(gate, LOCAL_BF16_FACTOR * args.tol_scale * e_env)
                bad = e_port is not None and e_port > gate
            layer_rows.append((name, e_port, e_env, gate, bad))
            if bad and first is None:
                first = (layer, name, e_port, gate, e_env)
        out = next((r for r in layer_rows if r[0].endswith(LAYER_OUTPUT)), None)
        e2e = local_error(port, ref, p + LAYER_OUTPUT) if ref else None
        worst = max((r for r in layer_rows if not r[0].endswith("router_indices") and r[1] is not None and r[3] > 0),
                    key=lambda r: r[1] / r[3], default=None)
        rows.append((layer, out, e2e, worst, flips, near, layer_rows))
    return rows, first, names


def judge_tower(args, port, replay, env):
    """ZAYA1-VL: (blocks, first, judged): per vision block (block, [(name, local error, tolerance, past it?)]) for the
    tower taps the replay recomputed from the port's input to each block (./zaya --replay: the patch embedding for
    block 0, the block before after it), the first past its tolerance, and whether they are judged (fp32 only: the
    tower has no bf16 replay)."""
    judged = env is None and not getattr(args, "bf16", False)
    blocks, first = {}, None
    for name in [n for n in replay.order if is_vision(n) and n.startswith("model.visual.blocks.") and port.has(n)]:
        e, gate = local_error(port, replay, name), kind_of(name)[1] * args.tol_scale
        bad = judged and e is not None and e > gate
        blocks.setdefault(int(name.split(".")[3]), []).append((name, e, gate, bad))
        if bad and first is None:
            first = (int(name.split(".")[3]), name, e, gate)
    return sorted(blocks.items()), first, judged


def tower_report(port, replay, tower):
    """Prints the tower's table; returns the exit status of its verdict (1 at a local error in a block), or None."""
    blocks, first, judged = tower
    if not blocks:
        return None
    print("\nvision tower (each block recomputed by zaya.c from the port's input to it: its patch embedding, or the "
          "block before)" + ("" if judged else ";\n  not judged: the tower has no bf16 replay (its numbers are shown)")
          + ":")
    print(f"{'block':>5}  {'local error':>11}  worst tap (local error / its tolerance)")
    for b, taps in blocks:
        out = next((t for t in taps if t[0] == f"model.visual.blocks.{b}"), None)
        worst = max((t for t in taps if t[1] is not None), key=lambda t: t[1] / t[2], default=None)
        label = worst[0][len(f"model.visual.blocks.{b}."):] or "the block's output" if worst else ""
        w = f"{label} {worst[1] / worst[2]:.2g}x" if worst and worst[1] > 0 else "-"
        print(f"{b:>5}  {fmt(out[1]) if out else '-':>11}  {w}")
    if not first:
        return None
    b, name, e, gate = first
    sa, a = port.load(name)
    _, x = replay.load(name)
    a, x = a.reshape(sa[0], -1).astype(np.float64), x.reshape(sa[0], -1).astype(np.float64)
    at = f"; largest row error at row {int(np.argmax(np.linalg.norm(a - x, axis=1)))} (a patch, in window order)"
    prev = [t[0] for t in dict(blocks)[b]]
    before = prev[prev.index(name) - 1] if prev.index(name) > 0 else (
        "model.visual.patch_embed" if b == 0 else f"model.visual.blocks.{b - 1}")
    print(f"\nFIRST LOCAL ERROR: vision block {b}, {name}\n  local error {fmt(e)} > tolerance {fmt(gate)}{at}"
          f"\n  the vision tower runs before the decoder; every tower tap before it recomputes from the port's inputs "
          f"within tolerance; look at the port's computation between {before} and {name}")
    print("RESULT: LOCAL ERROR")
    return 1


# every layer past tolerance at its output, the largest local error at most this many times the smallest, in a
# dump without the product taps that tell weights from code (diagnose.py): no layer is blamed (on the fixture
# Q8_0 and Q4_0 spread 2.2x and 2.3x; a bug leaves the layers before it at 0)
UNIFORM_SPREAD = 10.0


def every_layer_differs(rows):
    """(smallest, largest) local error of the layer outputs when every layer is past its tolerance there by
    about the same (within UNIFORM_SPREAD), else None."""
    outs = [r[1] for r in rows]
    if len(outs) < 2 or any(o is None or o[1] is None or not o[4] for o in outs):
        return None
    errs = [o[1] for o in outs]
    return (min(errs), max(errs)) if min(errs) > 0 and max(errs) <= UNIFORM_SPREAD * min(errs) else None


def where(port, replay, rows, first):
    """"; largest at position t (token id X)": where the first local error's tap departs most (its layer's near-tie
    positions left out), for the verdict lines; "" when the dumps cannot say."""
    near = next((r[5] for r in rows if r[0] == first[0]), set())
    at = worst_position(port, replay, first[1], near)
    return f"; {'first flip' if first[1].endswith('router_indices') else 'largest row error'} at {at}" if at else ""


def step_checks(args, port, replay, env, rows):
    """{tap name: ggml.check_tap's result}: each product tap (and the experts, the router MLP's act_fn taps)
    recomputed from the port's own input to it as the replay's placement computes it (plain float32, or ggml's
    arithmetic with +ggml: the input quantized per the weight's ggml type). Only for a float32 / fp32+ggml replay
    with --model (the blob holds the weights); positions at a near-tie routing flip are left out after the
    router, as in judge_layers. {} when it cannot run."""
    prec = getattr(args, "precision", None) or replay.index.get("precision")
    if not args.model or env is not None or (prec and not prec.startswith("fp32")):
        return {}
    try:
        ctx = ggml.Ctx(port, args.model, prec)
    except (OSError, ValueError, struct.error):
        return {}
    T = len(port.tokens or [])
    out = {}
    for layer, _, _, _, flips, near, layer_rows in rows:
        for name, e, _, _, _ in layer_rows:
            if e is None or name.split(".", 3)[3] not in ggml.STEPS:
                continue
            after = name.endswith(("mlp.experts", ":router_weight"))
            res = ggml.check_tap(ctx, name, sorted(set(range(T)) - near) if after and near else None)
            if res is not None:
                out[name] = res
    return out


def first_departing(rows, steps):
    """(first, passed): the first tap past its tolerance in execution order whose step check (when it has one) departs,
    as judge_layers' first; passed: the taps past their tolerance whose step check agrees (legitimate arithmetic on the
    port's own input to them: their inputs' error, amplified by e.g. ggml's requantization), not local errors."""
    first, passed = None, []
    for layer, _, _, _, _, _, layer_rows in rows:
        for name, e, ee, gate, bad in layer_rows:
            if not bad:
                continue
            if name in steps and not steps[name]["departs"]:
                if first is None:
                    passed.append((layer, name, e, gate))
            elif first is None:
                first = (layer, name, e, gate, ee)
    return first, passed


def print_steps(args, steps):
    """The step check's lines (read by zaya_compare.portmap --steps): one per modelled tap."""
    if not steps:
        return
    prec = getattr(args, "precision", None) or "fp32"
    print(f"\nstep check (each product recomputed exactly from the port's own input to it, as the {prec} replay computes "
          f"it;\nbound: float32 accumulation + 1 storage ulp, and the quantization steps a float32 rounding of an inner "
          f"value may flip;\ndeparts: more than {legit.STEP_FRACTION:.1%} of the elements past it, or rms error / predicted "
          f"sd > {legit.Z_LIMIT:g}):")
    for name, r in steps.items():
        print(f"  step {name:60s} {'departs' if r['departs'] else 'agrees'}  {r['past']}/{r['judged']} past the bound, "
              f"largest {r['worst']:.3g}x at position {r['at']}, rms z {r['rms']:.3g} ({r['model']})")


def report(args, port, replay, env, ref, rows, first, names, steps=None, passed=()):
    """Prints the per-layer table and the verdict; returns the exit status (0 agrees, 1 a local error)."""
    T = len(port.tokens or [])
    print("\nper layer (local = the port's output of the layer vs zaya.c's recomputation from the port's input to it;"
          "\nend to end = the port vs the reference run" + (f" {ref.folder}" if ref else " (give --reference REF_DUMP)") + "):")
    head = f"{'layer':>5}  {'local error':>11}  " + (f"{'bf16 envelope':>13}  " if env else "") + \
        f"{'end to end':>10}  {'routing':>9}  worst tap (local error / its tolerance)"
    print(head)
    for layer, out, e2e, worst, flips, near, _ in rows:
        env_col = f"{fmt(out[2]) if out else '-':>13}  " if env else ""
        route = f"{T - len(flips)}/{T}" + ("*" if near else "")
        w = f"{worst[0].split('.', 3)[3]} {worst[1] / worst[3]:.2g}x" if worst and worst[1] > 0 else "-"
        print(f"{layer:>5}  {fmt(out[1]) if out else '-':>11}  {env_col}{fmt(e2e) if e2e is not None else '-':>10}  "
              f"{route:>9}  {w}")
    if any(r[5] for r in rows):
        print("  * a near-tie: the port and the replay route a position differently at a margin below "
              f"{args.near_tie} (--near-tie: what float32 rounding moves; the replay computes on the same weights);"
              " that position is left out of the layer's later taps")
    if args.verbose:
        for layer, _, _, _, _, _, layer_rows in rows:
            for name, e, ee, gate, bad in layer_rows:
                print(f"  {name:60s} local {fmt(e):>9}  env {fmt(ee):>9}  tol {fmt(gate):>9}  {'OUT' if bad else 'ok'}")
        print_steps(args, steps)
    if passed:
        print(f"\nnote: {len(passed)} tap(s) past their tolerance before any local error, each within its step check "
              f"(recomputed from the port's own input to it as the replay's placement computes it: legitimate "
              f"arithmetic amplifying its inputs' error): " + ", ".join(f"layer {la} {n.split('.', 3)[3]} {fmt(e)}"
                                                                   for la, n, e, _ in passed[:6]))
    src = ((replay.index.get("model") or {}).get("provenance") or {}).get("source") or ""
    d = diagnose(rows, first, port, names, bf16_judged=env is not None,
                 gguf=src if src.lower().endswith(".gguf") else None)
    if d.verdict == "bf16":
        layer, name, e, gate, ee = first
        print(f"\nTHE PORT COMPUTES IN BF16 ({d.bf16:.0%} of its first product's values are bf16 numbers), judged by "
              f"float32 tolerances:\n  every product departs by bf16's rounding. Judge it as a bf16 port: compare.py "
              f"--local {args.test_dir} --model {args.model or 'MODEL.bin'} --bf16 (docs/compare.md §9)\n"
              f"  (by float32 tolerances the first local error is layer {layer}, {name}: {fmt(e)} > {fmt(gate)})")
        print("RESULT: LOCAL ERROR IN EVERY LAYER (a bf16 port: pass --bf16)")
        return 1
    if d.verdict == "weights":
        print(f"\nYOUR WEIGHTS DIFFER from the replay's ({args.model or replay.folder}):\n  "
              + "\n  ".join(d.weight_lines())
              + "\n  a quantized port, or other weights. Judge the port on its own weights: --model PORTWEIGHTS.bin"
              "\n  (python3 export_weights.py CKPT PORTWEIGHTS.bin --weights PORT.safetensors, or export_weights.py"
              "\n  MODEL.gguf PORTWEIGHTS.bin), or compare.py --quant PORT --model PORTWEIGHTS.bin --exact EXACT.bin"
              "\n  (docs/compare.md §10). A port that rounds every product's input (ggml's F16/Q8 activations) looks"
              "\n  the same here; on its own weights it departs at the first product.")
        print("RESULT: LOCAL ERROR IN EVERY LAYER (the weights)")
        return 1
    if d.verdict == "products":
        layer, name, e, gate, ee = first
        print(f"\nFIRST LOCAL ERROR: layer {layer}, {name}\n  local error {fmt(e)} > tolerance {fmt(gate)}"
              f"{where(port, replay, rows, first)}\n  "
              + "\n  ".join(d.weight_lines("the GGUF's")) + f"\n  although the replay's weights are the GGUF's own ({src}, "
              f"as ggml dequantizes them): the port computes its products otherwise;\n  {GGML_PRODUCTS}")
        print("RESULT: LOCAL ERROR")
        return 1
    rc = tower_report(port, replay, judge_tower(args, port, replay, env))   # ZAYA1-VL: the tower runs first
    if rc is not None:
        return rc
    uniform = every_layer_differs(rows) if d.verdict == "unknown" else None
    if first and uniform:
        layer, name, e, gate, ee = first
        lo, hi = uniform
        print(f"\nEVERY LAYER DIFFERS LOCALLY, by about the same ({fmt(lo)} to {fmt(hi)} rel L2 at the layer outputs),"
              f"\n  and the dump has no product fed agreeing inputs (q_proj, k_proj, v_proj_*, ...) to tell other weights"
              f"\n  from other code: dump those taps, or pass the port's own weights as --model PORTWEIGHTS.bin"
              f"\n  (python3 export_weights.py CKPT PORTWEIGHTS.bin --weights PORT.safetensors) or use compare.py --quant"
              f"\n  (docs/compare.md §10).\n  If the weights are the checkpoint's, the first "
              f"local error is layer {layer}, {name} ({fmt(e)} > {fmt(gate)}{where(port, replay, rows, first)}).")
        print("RESULT: LOCAL ERROR IN EVERY LAYER")
        return 1
    if first:
        layer, name, e, gate, ee = first
        why = f"local error {fmt(e)} > tolerance {fmt(gate)}" + (f" ({LOCAL_BF16_FACTOR:g} x the bf16 envelope {fmt(ee)})"
                                                                   if ee is not None and gate > 0 else "")
        if name.endswith("router_indices"):
            why = "the port routes a position differently from the replay, not at a near-tie"
        why += where(port, replay, rows, first)
        prev = [n for n in names if n.startswith(f"model.layers.{layer}.")]
        before = prev[prev.index(name) - 1] if prev.index(name) > 0 else f"the input of layer {layer}"
        evidence = "".join(f"\n  {ln}" for ln in d.code_lines())
        step = name.split(".", 3)[-1]
        if getattr(port, "image_positions", None) and step in VL_STEPS:   # ZAYA1-VL
            evidence += f"\n  ZAYA1-VL: at the image positions this step also adds {VL_STEPS[step]}"
        print(f"\nFIRST LOCAL ERROR: layer {layer}, {name}\n  {why}{evidence}\n  every layer before it recomputes from "
              f"the port's inputs within tolerance; look at the port's computation between {before} and {name}")
        print("RESULT: LOCAL ERROR")
        return 1
    print("\nRESULT: every layer agrees locally" + (" (within the bf16 envelope)" if env else ""))
    return 0


# ---- two tiers (a bf16 port, --model M --bf16) ----

# The legitimate bf16 placements zaya.c runs (docs/bf16.md): label -> ./zaya --precision. The first two are
# the official code's (tier 1's references); all of them make tier 2's envelope.
OFFICIAL = {"official bf16, torch 1.13": "bf16-torch1.13", "official bf16, torch >= 2.1": "bf16"}
PLACEMENTS = dict(OFFICIAL, **{"vLLM: fp32 residual scaling and norms": "bf16+fp32-residual+fp32-norm",
                               "fp32 LM head (vLLM zaya_high_prec)": "bf16-torch1.13+fp32-logits"})
# Measured (docs/compare.md §9, bench/tier_margins.py): legitimate runs and one-step bugs.
TIER1_ULPS = 2          # an element agrees within this many bf16 ulps of the official replay's value
TIER1_FRACTION = 0.01   # a tap computes like the official code when at most this fraction is further
TIER2_FACTOR = 2.0      # a tap is within when its local error <= this x the placements' envelope
TIER2_FLOOR = 1e-6      # rel L2 below this is float32 noise of a replay


def bf16_ulps(port, ref):
    """|port - ref| in bf16 ulps of ref, per element of rows [T, n]; a value far below its row's rms
    (under rms/256) counts at that level, so that a sum that cancels to near zero does not count its ulps."""
    ref = np.asarray(ref, dtype=np.float64)
    rms = np.sqrt(np.mean(np.square(ref), axis=1, keepdims=True))
    mag = np.maximum(np.abs(ref), np.maximum(rms / 256, 1e-30))
    _, e = np.frexp(mag)                                  # mag = m * 2^e, m in [0.5, 1): a bf16 ulp is 2^(e - 8)
    return np.abs(port - ref) / np.ldexp(1.0, e - 8)


def tap_sums(port, reps, rows, block=1 << 22):
    """One tap's numbers over `rows` of port [T, n] and of each replay (label -> [T, n]), read a block of
    rows at a time (a 512-position logits tap is half a GB per dump): per official variant the elements
    more than TIER1_ULPS bf16 ulps off (beyond), off at all (off, > 0.5 ulp) and the largest ulps; the
    rel L2 of each placement against the fp32 replay (env), of the port against it (error) and against
    each placement (dist)."""
    sq = lambda a, b: float(np.square(a - b).sum())   # noqa: E731
    beyond, off, top = dict.fromkeys(OFFICIAL, 0), dict.fromkeys(OFFICIAL, 0), dict.fromkeys(OFFICIAL, 0.0)
    d_env, d_dist, n_rep = dict.fromkeys(PLACEMENTS, 0.0), dict.fromkeys(PLACEMENTS, 0.0), dict.fromkeys(PLACEMENTS, 0.0)
    d_err = n_fp32 = 0.0
    step = max(1, block // max(port.shape[1], 1))
    for lo in range(0, len(rows), step):
        at = rows[lo:lo + step]
        pr, rep = port[at].astype(np.float64), {lb: r[at].astype(np.float64) for lb, r in reps.items()}
        for lb in OFFICIAL:
            u = bf16_ulps(pr, rep[lb])
            beyond[lb] += int((u > TIER1_ULPS).sum())
            off[lb] += int((u > 0.5).sum())
            top[lb] = max(top[lb], float(u.max()) if u.size else 0.0)
        fp32 = rep["fp32"]
        d_err += sq(pr, fp32)
        n_fp32 += float(np.square(fp32).sum())
        for lb in PLACEMENTS:
            d_env[lb] += sq(rep[lb], fp32)
            d_dist[lb] += sq(pr, rep[lb])
            n_rep[lb] += float(np.square(rep[lb]).sum())
    size = len(rows) * port.shape[1]
    floor = TIER2_FLOOR * np.sqrt(max(size, 1))
    rel = lambda d, n: float(np.sqrt(d)) / max(float(np.sqrt(n)), floor)   # noqa: E731
    return {"beyond": beyond, "off": off, "max_ulps": top, "size": size,
            "env": {lb: rel(d_env[lb], n_fp32) for lb in PLACEMENTS}, "error": rel(d_err, n_fp32),
            "dist": {lb: rel(d_dist[lb], n_rep[lb]) for lb in PLACEMENTS}}


def tier_replays(args):
    """{label: Dump}: zaya.c's replays of the port in fp32 and at every placement (./zaya --replay)."""
    out = args.replay_out or os.path.join(args.test_dir.rstrip("/") + "_replay")
    reps = {}
    for label, prec in [("fp32", None)] + list(PLACEMENTS.items()):
        folder = out + "_" + (prec or "fp32").replace("+", "_")
        run_replay(args.model, args.test_dir, folder, prec)
        reps[label] = Dump(folder, "REPLAY")
    return reps


def judge_tiers(args, port, reps):
    """Tier 1, the step check and tier 2 over every tap the port and the replays have, in execution order.
    Returns a dict: taps (one dict per tap), tier1_first (the first tap not computed like the official code:
    (name, why); a statement), step_first (the first tap past the step check's rounding-error bound),
    tier2_first (the first tap past the envelope), closest (the placement the port is nearest), located
    (the first of the step check's and tier 2's errors)."""
    fp32 = reps["fp32"]
    n_layers = 1 + max([layer_of(n) for n in fp32.order if layer_of(n) is not None] or [-1])
    order = execution_order(n_layers)
    state = {f"model.layers.{i}.{s}" for i in range(n_layers) for s in LAYER_STATE}
    names = [n for n in order if n not in state and port.has(n) and all(r.has(n) for r in reps.values())
             and (layer_of(n) is not None or n in ("model.norm", "logits")) and not n.endswith(":router_margin")]
    try:
        ctx = legit.Ctx(port, legit.Blob(args.model), legit.U_BF16) if getattr(args, "model", None) else None
    except (OSError, ValueError):
        ctx = None
    taps, first1, step_first, first2 = [], None, None, None
    closeness = dict.fromkeys(PLACEMENTS, 0.0)
    near = {}
    for name in names:
        layer = layer_of(name)
        shape, p = port.load(name)
        if name.endswith("router_indices"):
            # against the official replay it routes most like; a flip at a near-tie of that replay is bf16's
            best = min(((routing_flips(port, reps[lb], layer, args.near_tie), lb) for lb in OFFICIAL),
                       key=lambda x: len(x[0][0]))[0]
            flips, near[layer] = best
            bad = [t for t in flips if t not in near[layer]]
            taps.append({"name": name, "layer": layer, "flips": flips, "near": sorted(near[layer]), "bad": bad})
            if bad:
                why = (f"routes {len(bad)} position(s) differently from every official replay, not at a near-tie "
                       f"(positions {bad[:5]})")
                first1 = first1 or (name, why)
                first2 = first2 or (name, why)
            continue
        if p.dtype.kind in "iu" or not shape:
            continue
        after_route = name.endswith(("mlp.experts", "post_mlp_residual_scale", ":router_weight"))
        rows = [t for t in range(shape[0]) if not (after_route and t in near.get(layer, ()))]
        if not rows:
            continue
        m = tap_sums(p.reshape(shape[0], -1), {lb: r.load(name)[1].reshape(shape[0], -1) for lb, r in reps.items()}, rows)
        variant = min(OFFICIAL, key=lambda lb: m["beyond"][lb])
        step = legit.check_tap(ctx, name, rows) if ctx else None
        beyond, size = m["beyond"][variant], m["size"]
        envelope = max(max(m["env"].values()), TIER2_FLOOR)
        error, dist = m["error"], m["dist"]
        for lb in PLACEMENTS:
            closeness[lb] += dist[lb] / envelope
        t = {"name": name, "layer": layer, "beyond": beyond, "size": size, "max_ulps": m["max_ulps"][variant],
             "variant": variant, "envelope": envelope, "error": error, "ratio": error / envelope,
             "closest": min(dist, key=dist.get), "step": step}
        taps.append(t)
        if beyond > TIER1_FRACTION * size and first1 is None:
            first1 = (name, f"{beyond} of {size} elements more than {TIER1_ULPS} bf16 ulps from zaya.c's {variant} "
                            f"replay (largest {t['max_ulps']:.3g} ulps; at most {TIER1_FRACTION:.0%} computes like it)")
        if step and step_first is None and (step["past"] > legit.STEP_FRACTION * step["judged"] or step["rms"] > legit.Z_LIMIT):
            step_first = (name, f"the step recomputed exactly (float64) from the port's own inputs: {step['past']} of "
                                f"{step['judged']} elements past the rounding-error bound of legitimate arithmetic (1 "
                                f"{step['storage']} ulp of the exact value + the roundings a bf16 port may do; largest "
                                f"{step['worst']:.3g}x its bound, at position {step['at']}; limit {legit.STEP_FRACTION:.1%} of the "
                                f"elements); errors / their predicted standard deviation: rms {step['rms']:.3g} (limit "
                                f"{legit.Z_LIMIT:g})")
        if t["ratio"] > TIER2_FACTOR and first2 is None:
            first2 = (name, f"local error {fmt(error)} = {t['ratio']:.3g} x the envelope {fmt(envelope)} of the "
                            f"legitimate placements (limit {TIER2_FACTOR:g}x)")
    pos = {n: i for i, n in enumerate(order)}
    located = min([x for x in (step_first, first2) if x], key=lambda x: pos[x[0]], default=None)
    return {"taps": taps, "fp32": fp32, "tier1_first": first1, "step_first": step_first, "tier2_first": first2,
            "closest": min(closeness, key=closeness.get) if taps else None, "located": located,
            "stepped": sum(1 for t in taps if t.get("step")),
            "max_ratio": max([t["ratio"] for t in taps if "ratio" in t] or [0.0]),
            "step_worst": max([t["step"]["worst"] for t in taps if t.get("step")] or [0.0]),
            "step_rms": max([t["step"]["rms"] for t in taps if t.get("step")] or [0.0])}


def report_tiers(args, port, ref, res):
    """Prints the per-layer table and both tiers' verdicts; returns the exit status (0 agrees, 1 a local error)."""
    short = lambda n: n.split(".", 3)[3] if n.startswith("model.layers.") else n   # noqa: E731
    T = len(port.tokens or [])
    print(f"\nper layer: tier 1 = the port against zaya.c's replay at the official bf16 placement (elements more than "
          f"{TIER1_ULPS} bf16 ulps away);\ntier 2 = the port's local error against the fp32 replay / the largest of "
          f"the legitimate placements' ({', '.join(PLACEMENTS)});\nend to end = the port vs "
          + (ref.folder if ref else "the reference run (give --reference REF_DUMP)") + ":")
    print(f"{'layer':>5}  {'local error':>11}  {'bf16 envelope':>13}  {'end to end':>10}  {'routing':>9}  "
          f"{'tier 1 worst tap (beyond/elements)':>40}  tier 2 worst tap (ratio)")
    layers = sorted({t["layer"] for t in res["taps"] if t["layer"] is not None})
    for layer in layers + [None]:
        ts = [t for t in res["taps"] if t["layer"] == layer and "ratio" in t]
        if not ts:
            continue
        out = next((t for t in ts if t["name"].endswith(LAYER_OUTPUT)), None)
        r = next((t for t in res["taps"] if t["layer"] == layer and "flips" in t), None)
        route = f"{T - len(r['flips'])}/{T}" + ("*" if r["near"] else "") if r else "-"
        e2e = local_error(port, ref, f"model.layers.{layer}.{LAYER_OUTPUT}") if ref and layer is not None else None
        w1 = max(ts, key=lambda t: t["beyond"] / t["size"])
        w2 = max(ts, key=lambda t: t["ratio"])
        print(f"{'-' if layer is None else layer:>5}  {fmt(out['error']) if out else '-':>11}  "
              f"{fmt(out['envelope']) if out else '-':>13}  {fmt(e2e) if e2e is not None else '-':>10}  {route:>9}  "
              f"{short(w1['name']) + ' ' + str(w1['beyond']) + '/' + str(w1['size']):>40}  "
              f"{short(w2['name'])} {w2['ratio']:.2g}x")
    if res["located"]:
        print("  (worst taps = the largest in the layer; FIRST LOCAL ERROR below is the first tap past its limit in "
              "execution order: the taps after it inherit its error)")
    if any(t.get("near") for t in res["taps"]):
        print("  * a near-tie: the port and the official replays route a position differently at a margin below "
              f"{args.near_tie}; that position is left out of the layer's later taps")
    if args.verbose:
        for t in res["taps"]:
            if "ratio" in t:
                st = t.get("step")
                print(f"  {t['name']:60s} tier 1 {t['beyond']:>7}/{t['size']:<7} ({t['variant']})  tier 2 {t['error']:.3g} / "
                      f"{t['envelope']:.3g} = {t['ratio']:.3g}x  closest: {t['closest']}"
                      + (f"  step: {st['past']}/{st['judged']} past the bound (largest {st['worst']:.2g}x, rms z "
                         f"{st['rms']:.2g}, {st['storage']})"
                         if st else "  step: not modelled or an input not dumped"))
    if res["tier1_first"] is None:
        print(f"\nTIER 1: computes like the official bf16 code at every tap (within {TIER1_ULPS} bf16 ulps of zaya.c's "
              f"official-placement replay on all but {TIER1_FRACTION:.0%} of its elements)")
    else:
        name, why = res["tier1_first"]
        print(f"\nTIER 1: computes like the official bf16 code up to {name}, where it departs ({why}); a statement, not an error: "
              f"other legitimate arithmetic departs from it too")
    print(f"STEP CHECK: {res['stepped']} taps recomputed exactly from the port's own inputs; "
          + ("every one within the rounding-error bound of legitimate arithmetic" if res["step_first"] is None else
             f"first past the bound: {res['step_first'][0]}") + f" (largest element {res['step_worst']:.3g}x its bound, "
          f"largest rms error / predicted sd {res['step_rms']:.3g}, limit {legit.Z_LIMIT:g})")
    print(f"TIER 2: closest legitimate placement: {res['closest']}; "
          + ("every tap within the placements' envelope" if res["tier2_first"] is None else
             f"first past the envelope: {res['tier2_first'][0]}") + f" (largest ratio {res['max_ratio']:.3g}x, "
          f"limit {TIER2_FACTOR:g}x)")
    if res["located"]:
        name, why = res["located"]
        layer = layer_of(name)
        route = next((t for t in res["taps"] if t["layer"] == layer and "flips" in t), None)
        at = worst_position(port, res["fp32"], name, set(route["near"]) if route else set())
        why += f"; {'first flip' if name.endswith('router_indices') else 'largest row error'} at {at}" if at else ""
        print(f"\nFIRST LOCAL ERROR: layer {layer}, {name}\n  {why}\n  every layer before it recomputes from the port's "
              f"inputs within tolerance")
        print("RESULT: LOCAL ERROR")
        return 1
    print("\nRESULT: every layer agrees locally (" + ("computes like the official bf16 code"
          if res["tier1_first"] is None else "legitimate arithmetic, within the bf16 envelope of the legitimate placements")
          + ")")
    return 0


def need_own_weights(args, view):
    """Raises InputError at once when the port's dump declares quantized weights (its map's `weights`) and the
    blob it is replayed on (--model, or the replay's model) does not hold the port's own weights."""
    port = Dump(args.test_dir, "PORT")
    dw = declared_weights(port)
    if not dw or not dw["quantized"]:
        return
    if args.model:
        from .quant import blob_facts
        prov, what = blob_facts(args.model)[1], f"--model {args.model}"
    elif args.ref_dir:
        model = Dump(args.ref_dir, "REPLAY").index.get("model") or {}
        prov, what = model.get("provenance") if isinstance(model, dict) else {}, f"the replay {args.ref_dir}'s model"
    else:
        return
    if own_weights(prov):
        return
    raise InputError(f"{view}: the port's weights are declared quantized ({dw['type']}"
                     + (f": {dw['note']}" if dw.get("note") else "") + f"; its map's `weights`), and {what} is not "
                     f"the port's own weights (its provenance names no --weights file and no GGUF)\n  expected: the "
                     f"values the port multiplies by, or every layer differs by the quantization, not by the port's code\n"
                     f"  hint: python3 export_weights.py MODEL.gguf PORTWEIGHTS.bin (a GGUF), or python3 export_weights.py "
                     f"CKPT PORTWEIGHTS.bin --weights PORT.safetensors (the port's dequantized weights); then compare.py "
                     f"--local {args.test_dir} --model PORTWEIGHTS.bin, or --quant ... --exact EXACT.bin (docs/compare.md §10)")


def local_main(args):
    need_own_weights(args, "--local")
    if args.model and args.bf16 and not args.envelope:
        port = Dump(args.test_dir, "PORT")
        need_router_indices(port, "--local --bf16")
        reps = tier_replays(args)
        ref = Dump(args.reference, "REF") if args.reference else None
        for other in (reps["fp32"], ref):
            if other is not None and other.tokens is not None and port.tokens is not None and other.tokens != port.tokens:
                raise InputError(f"{other.folder} is of other ids than the port's dump\n  hint: dump the same --ids")
        print(f"PORT   {port.folder}: {port.producer()}")
        print(f"REPLAY {args.replay_out or args.test_dir.rstrip('/') + '_replay'}_*: each layer recomputed by zaya.c from "
              f"the port's own input to it, in fp32 and at {len(PLACEMENTS)} legitimate bf16 placements")
        res = judge_tiers(args, port, reps)
        rc = report_tiers(args, port, ref, res)
        write_json(args, {"view": "local --bf16", "exit": rc, "located": res["located"], "tier1_first": res["tier1_first"],
                          "step_first": res["step_first"], "tier2_first": res["tier2_first"], "closest": res["closest"],
                          "taps": [{k: v for k, v in t.items()} for t in res["taps"]]})
        return rc
    port, replay, env, ref = open_dumps(args)
    print(f"PORT   {port.folder}: {port.producer()}")
    print(f"REPLAY {replay.folder}: each layer recomputed by zaya.c from the port's own input to it")
    if env:
        print(f"ENVELOPE {env.folder}: the same replay in bf16 (a legitimate bf16 layer's error: bf16 vs fp32 replay)")
    rs = replay.index["replay"].get("router_state_from_port") or []
    computed = [i for i, v in enumerate(rs) if i > 0 and not v]
    if computed:
        print(f"note: the port's dump has no :router_state for the layers before {computed}: their EDA input is zaya.c's")
    rows, _, names = judge_layers(args, port, replay, env, ref)
    steps = step_checks(args, port, replay, env, rows)
    first, passed = first_departing(rows, steps)   # the first local error the step check leaves standing
    rc = report(args, port, replay, env, ref, rows, first, names, steps, passed)
    write_json(args, dict(layers_json("local", rc, first, rows), step_check=steps))
    return rc


def layers_json(view, rc, first, rows):
    """--json of the one-tier views: per layer and tap the local error, envelope and tolerance, and the verdict."""
    return {"view": view, "exit": rc, "first_local_error": None if not first else
            {"layer": first[0], "tap": first[1], "local_error": first[2], "tolerance": first[3]},
            "layers": [{"layer": layer, "end_to_end": e2e, "flips": flips, "near_ties": sorted(near),
                        "taps": [{"name": n, "local_error": e, "envelope": ee, "tolerance": g, "past": bool(b)}
                                 for n, e, ee, g, b in taps]} for layer, _, e2e, _, flips, near, taps in rows]}


def main(args):
    """compare.py --local PORT REPLAY [--envelope BF16_REPLAY] [--reference REF]: where a port's error enters."""
    result, rc = guarded(lambda: local_main(args))
    return rc or result
