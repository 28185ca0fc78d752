"""--quant: is it the quantization or a bug, and where? (compare.py --quant PORT --model PORTWEIGHTS.bin --exact EXACT.bin)

A quantized port cannot agree with the exact model: its weights differ. zaya.c on the port's own weights
(a blob made by export_weights.py --weights PORT.safetensors, or from the port's GGUF) computes the exact
model on those weights, so per layer this view sets side by side:
  weights alone  zaya.c on the port's weights vs zaya.c on the exact checkpoint, same ids (end to end):
                 what the quantization alone does;
  port           the port's dump vs zaya.c on the exact checkpoint (end to end): what the port does;
  quant local    what quantization adds in that layer alone (zaya.c exact, replayed from the inputs of
                 zaya.c on the port's weights);
  port local     the port vs zaya.c on the port's weights replayed from the port's own input to each layer
                 (local.py's replay): what the port's computation adds, quantization taken out.
The verdict is local.py's judgment on the port's own weights: "as close to the exact model as its weights
allow", or "layer L, TAP adds error the weights do not explain", or (diagnose.py) "the port's weights are not
those of PORTWEIGHTS.bin" when the products that read weights are where it departs. The runs go to PREFIX_exact,
PREFIX_weights, PREFIX_quant_local and PREFIX_replay_fp32 (PREFIX: --replay-out, default PORT_quant).
"""
import os
import subprocess

import numpy as np

from . import local
from .diagnose import GGML_PRODUCTS, diagnose
from .dumps import Dump, InputError, declared_weights, guarded
from .metrics import common_vocabulary, fmt, logits_rows_stats
from .names import LAYER_OUTPUT


def add_arguments(ap):
    ap.add_argument("--quant", action="store_true", help="TEST_DIR is a quantized port's dump, --model the port's weights "
                    "in a blob (export_weights.py --weights), --exact the checkpoint's blob: per layer, what the "
                    "weights alone do beside what the port does, and where the port adds error (docs/compare.md §10)")
    ap.add_argument("--exact", metavar="EXACT.bin", help="with --quant: the exact checkpoint's blob")


def wants(args):
    return args.quant


def run_zaya(cmd):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    zaya = os.path.join(root, "zaya")
    try:
        p = subprocess.run([zaya] + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        raise InputError(f"cannot run {zaya}: {e.strerror}\n  hint: build it with make")
    if p.returncode != 0:
        raise InputError(f"{zaya} {' '.join(cmd)} failed:\n{p.stderr.strip()[-800:]}")


def blob_facts(path):
    """(weight format 'fp32' / 'bf16' / 'int8', provenance dict) of a zaya.c blob's header, or (None, {})."""
    import json
    import struct
    try:
        with open(path, "rb") as f:
            h = f.read(1024)
        fmt_code, = struct.unpack_from("<I", h, 36)
        prov = h[512:1024].split(b"\0")[0].decode("utf-8", "replace")
        try:
            prov = json.loads(prov)
        except ValueError:
            prov = {}
        return {0: "fp32", 1: "bf16", 2: "int8"}.get(fmt_code), prov if isinstance(prov, dict) else {}
    except (OSError, struct.error):
        return None, {}


def weights_notes(model):
    """What the port's weights blob does not hold (said before the verdict): an int8 blob (zaya.c's own int8
    groups, the embedding too: the port's weights only if the port is zaya.c int8), and the matrices that
    export_weights.py --weights left at the checkpoint's values."""
    fmt_, prov = blob_facts(model)
    notes = []
    if fmt_ == "int8":
        notes.append(f"note: {model} stores its matrices as zaya.c's int8 groups (the embedding and LM head too): these "
                     "are the port's weights only if the port is zaya.c int8; write a port's own weights with\n"
                     "  python3 export_weights.py CKPT PORTWEIGHTS.bin --weights PORT.safetensors (stored exactly)")
    if prov.get("kept"):
        notes.append(f"note: {model} keeps these matrices at the checkpoint's values (not in the port's weights): "
                     f"{prov['kept']}\n"
                     "  if the port quantizes them, a local error where they are used is the "
                     "quantization, not the port's code: add them to --weights")
    return notes, prov.get("kept", "")


def kept_in_layer(kept, layer, tap):
    """Whether provenance `kept` ("o_proj:1-5,experts.gate_up_proj:0-5,...") holds the matrix of layer `layer`'s tap."""
    for item in (kept or "").rstrip(".").split(","):
        name, _, layers = item.partition(":")
        if not name or (tap.split(".")[-1] != name and name.split(".")[0] not in tap.split(".")):
            continue
        for part in layers.replace("layers ", "").split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and int(lo) <= layer <= int(hi or lo):
                return True
    return False


def logits_summary(a, b):
    """(top-1 agreement count, rows, mean KL(P_b || P_a)) of two dumps' logits, or None."""
    if not (a.has("logits") and b.has("logits")):
        return None
    sa, x = a.load("logits")
    _, y = b.load("logits")
    x, y = common_vocabulary(x.reshape(sa[0], -1), y.reshape(sa[0], -1))
    ia, ib, kl = logits_rows_stats(x, y, k=1)
    return sum(p[0] == q[0] for p, q in zip(ia, ib)), len(ia), float(kl.mean())


def margins(d, layer):
    """Per position the router margin (best - second-best :router_scores) of a dump's layer, or None."""
    name = f"model.layers.{layer}.mlp.gate:router_scores"
    if not d.has(name):
        return None
    shape, sc = d.load(name)
    sc = np.sort(sc.reshape(shape[0], -1).astype(np.float64), axis=1)
    return sc[:, -1] - sc[:, -2]


def routing_lines(port, exact, weights, near_tie):
    """The port's routing flips against the exact model (end to end), each labelled by what can legitimately move
    its margin here: float32 rounding (--near-tie: a near-tie) or the port's weights (a flip the weights explain:
    the weights alone flip it too, or its exact margin is under the largest margin change the weights alone cause
    in that layer); otherwise a flip to check."""
    lines, n_layers = [], 1 + max([int(n.split(".")[2]) for n in exact.order if n.startswith("model.layers.")] or [-1])
    for layer in range(n_layers):
        name = f"model.layers.{layer}.mlp.gate.router_indices"
        if not (port.has(name) and exact.has(name)):
            continue
        a, b = port.load(name)[1].reshape(-1), exact.load(name)[1].reshape(-1)
        w = weights.load(name)[1].reshape(-1) if weights.has(name) else None
        m = min(a.size, b.size)
        flips = np.flatnonzero(a[:m] != b[:m]).tolist()
        me, mw = margins(exact, layer), margins(weights, layer)
        move = float(np.abs(mw - me).max()) if me is not None and mw is not None and mw.shape == me.shape else None
        for t in flips:
            mg = float(me[t]) if me is not None else None
            if mg is not None and mg < near_tie:
                label = f"near-tie: margin {mg:.4g} < {near_tie:g} (--near-tie, what float32 rounding moves)"
            elif w is not None and t < w.size and w[t] == a[t]:
                label = (f"a flip the weights explain: margin {fmt(mg, '.4g')}, and zaya.c on the port's weights "
                         f"routes it to {int(w[t])} too")
            elif mg is not None and move is not None and mg < move:
                label = (f"a flip the weights explain: margin {mg:.4g} < {move:.4g}, the largest margin change the "
                         f"weights alone cause in layer {layer}")
            else:
                label = (f"a flip to check: margin {fmt(mg, '.4g')} >= {fmt(move, '.4g')}, the largest margin change the "
                         f"weights alone cause in layer {layer}, and >= {near_tie:g} (--near-tie)")
            lines.append(f"  layer {layer} position {t}: port {int(a[t])}, exact {int(b[t])} -> {label}")
    return lines


def quant_main(args):
    if not args.model or not args.exact:
        raise InputError("--quant needs the port's weights and the exact model: compare.py --quant PORT_DUMP "
                         "--model PORTWEIGHTS.bin --exact EXACT.bin\n  hint: make PORTWEIGHTS.bin with "
                         "python3 export_weights.py CKPT PORTWEIGHTS.bin --weights PORT.safetensors")
    for path, what in ((args.model, "--model"), (args.exact, "--exact")):
        if not os.path.isfile(path):
            raise InputError(f"{what} {path}: no such file\n  hint: a zaya.c blob (export_weights.py)")
    if os.path.samefile(args.model, args.exact):
        raise InputError(f"--model and --exact are the same file ({args.model})\n  hint: --model is the port's weights "
                         "(export_weights.py CKPT OUT.bin --weights PORT.safetensors), --exact the checkpoint's")
    local.need_own_weights(args, "--quant")
    port0 = Dump(args.test_dir, "PORT")
    dw = declared_weights(port0)
    if dw:
        print(f"PORT's weights, declared by its map: {dw['type']}" + (f" ({dw['note']})" if dw.get("note") else ""))
    if not port0.tokens:
        raise InputError(f"{args.test_dir}: index.json has no `tokens`\n  hint: the view runs zaya.c on the port's ids")
    prefix = (args.replay_out or args.test_dir.rstrip("/") + "_quant")
    ids = ",".join(map(str, port0.tokens))
    exact_dir, weights_dir, qlocal_dir = prefix + "_exact", prefix + "_weights", prefix + "_quant_local"
    # the logits ([T, vocab], the largest tensor by far) only when the port dumped its own
    only = [] if port0.has("logits") else ["--dump-filter", "^model"]
    run_zaya([args.exact, "--ids", ids, "--dump", exact_dir] + only)
    run_zaya([args.model, "--ids", ids, "--dump", weights_dir] + only)
    run_zaya([args.exact, "--replay", weights_dir, "--dump", qlocal_dir] + only)
    args.replay_out, args.reference, args.ref_dir = prefix + "_replay", exact_dir, None
    port, replay, env, exact = local.open_dumps(args)       # runs ./zaya PORTWEIGHTS --replay PORT
    weights, qlocal = Dump(weights_dir, "WEIGHTS"), Dump(qlocal_dir, "QUANT_LOCAL")
    print(f"PORT    {port.folder}: {port.producer()}")
    print(f"EXACT   {exact.folder}: zaya.c on the checkpoint ({args.exact})")
    print(f"WEIGHTS {weights.folder}: zaya.c on the port's weights ({args.model})")
    print(f"REPLAY  {replay.folder}: zaya.c on the port's weights, each layer from the port's own input to it")
    rs = replay.index.get("replay", {}).get("router_state_from_port") or []
    computed = [i for i, v in enumerate(rs) if i > 0 and not v]
    if computed:
        print(f"note: the port's dump has no mlp.gate:router_state (the EDA state) for layers {computed}: their router "
              f"starts from zaya.c's state of the layer before, so a layer whose own computation is right can show a local "
              f"error and routing flips there; dump :router_state to judge each router on the port's own state")
    rows, first, names = local.judge_layers(args, port, replay, env, exact)
    print("\nper layer (rel L2 of the layer output; end to end against zaya.c on the exact checkpoint; local = from the"
          "\nsame input to the layer):")
    print(f"{'layer':>5}  {'weights alone':>13}  {'port':>9}  {'port vs weights':>15}  {'quant local':>11}  "
          f"{'port local':>10}  worst tap of the port (local error / its tolerance)")
    qlocal_by_layer = {}
    for layer, out, _, worst, flips, near, _ in rows:
        name = f"model.layers.{layer}.{LAYER_OUTPUT}"
        w = local.local_error(weights, exact, name)
        p = local.local_error(port, exact, name)
        pw = local.local_error(port, weights, name)
        q = qlocal_by_layer[layer] = local.local_error(weights, qlocal, name)
        tap = f"{worst[0].split('.', 3)[3]} {worst[1] / worst[3]:.2g}x" if worst and worst[1] > 0 else "-"
        print(f"{layer:>5}  {fmt(w):>13}  {fmt(p):>9}  {fmt(pw):>15}  {fmt(q):>11}  {fmt(out[1]) if out else '-':>10}  {tap}")
    if first:
        print("  (worst tap = the tap with the largest local error / tolerance in the layer; the verdict names the first "
              "tap past its tolerance in execution order: the taps after it inherit its error)")
    notes, kept = weights_notes(args.model)
    for n in notes:
        print(n)
    if first and kept_in_layer(kept, first[0], first[1]):
        print(f"  the first local error, {first[1]}, is a step whose matrix the port's weights left at the checkpoint's "
              f"values in layer {first[0]}")
    flips = routing_lines(port, exact, weights, args.near_tie)
    if flips:
        print("routing flips of the port against the exact model (end to end; the local verdict below judges each "
              "layer on the port's weights):\n" + "\n".join(flips))
    lw, lp = logits_summary(weights, exact), logits_summary(port, exact)
    if lw and lp:
        print(f"logits vs exact: weights alone top-1 {lw[0]}/{lw[1]}, KL {lw[2]:.3g}; port top-1 {lp[0]}/{lp[1]}, "
              f"KL {lp[2]:.3g}")
    local.write_json(args, dict(local.layers_json("quant", 1 if first else 0, first, rows),
                                quant_local={str(k): v for k, v in qlocal_by_layer.items()}))
    src = ((replay.index.get("model") or {}).get("provenance") or {}).get("source") or ""
    d = diagnose(rows, first, port, names, bf16_judged=env is not None,
                 gguf=src if src.lower().endswith(".gguf") else None)
    if d.verdict == "weights":
        print(f"\nVERDICT: the port's weights are not those of {args.model}:\n  " + "\n  ".join(d.weight_lines())
              + "\n  hint: --model must hold exactly the weights the port computes with (export_weights.py MODEL.gguf "
              "OUT.bin for a GGUF, --weights PORT.safetensors for a dequantized dump of them)")
        return 1
    if first:
        layer, name, e, gate, ee = first
        evidence = "".join(f"\n  {ln}" for ln in (d.code_lines() if d.verdict != "products" else
                                                   d.weight_lines("the GGUF's") + [GGML_PRODUCTS]))
        print(f"\nVERDICT: layer {layer}, {name} adds error the weights do not explain{evidence}\n"
              f"  on its own weights the port's local error there is {fmt(e)} (tolerance {fmt(gate)}"
              + local.where(port, replay, rows, first)
              + (f", 3 x the bf16 envelope {fmt(ee)}" if ee is not None else "") + "); quantization alone adds "
              f"{fmt(qlocal_by_layer.get(layer))} to that layer's output\n"
              f"  compare.py --local {args.test_dir} --model {args.model} --verbose lists every tap")
        return 1
    print("\nVERDICT: the port is as close to the exact model as its weights allow (every layer recomputes from the "
          "port's inputs on the port's weights within tolerance" + (", the bf16 envelope" if env else "") + ")")
    return 0


def main(args):
    """compare.py --quant PORT --model PORTWEIGHTS.bin --exact EXACT.bin [--bf16] [--replay-out PREFIX]."""
    if args.local:
        print("compare.py: --quant and --local are two views; give one", file=__import__("sys").stderr)
        return 2
    result, rc = guarded(lambda: quant_main(args))
    return rc or result
