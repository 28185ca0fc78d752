#!/usr/bin/env python3
"""coreml_weights.py - a Core ML model's palettized (and other compressed) weights as `--weights` safetensors
(needs coremltools; optional: nothing else in zaya.c uses it).

    /work/venv/bin/python tools/coreml_weights.py MODEL.mlpackage PORT.safetensors --checkpoint CKPT_DIR
                                                 [--map NAMES.json] [--all] [--check [--threads 1,2]]
    python3 export_weights.py CKPT_DIR PORTWEIGHTS.bin --weights PORT.safetensors

Reads the ML program (coremltools' MIL loader; no Core ML runtime, so it runs on Linux) and materializes
each compressed weight as the model computes with it: constexpr_lut_to_dense (palettization: table[index]),
and the other constexpr ops coremltools writes (affine / blockwise dequantization, sparse), with coremltools'
own materialized_val_inference. Each is written under its HF name (docs/architecture.md 2.2), in its own
dtype (fp16 for an fp16 model: exact), for export_weights.py --weights. A Core ML weight's name is the
converter's (e.g. `model_layers_0_self_attn_o_proj_weight_to_fp16_palettized`): the name with '.' as '_',
after removing coremltools' suffixes, is matched against the checkpoint's tensor names (--checkpoint gives
them); --map NAMES.json ({"coreml name": "HF name"}) names the others. --all also writes uncompressed fp16
weights that match. A [out, in] weight must have the HF shape (export_weights.py refuses another one); a
port that splits or stacks tensors (the experts) needs --map per piece and its own stacking.

--check: for each palettized [out, in] weight (a table per group of output channels), palettizes the
checkpoint's own tensor (cast to the weight's dtype, as the converter does) with tools/quants.py - coremltools'
kmeans palettization reproduced (kmeans1d, or scikit-learn's KMeans with --threads OpenMP threads) - with the
ML program's group size and bit width, and prints per weight whether the port's values are that result bit for
bit (`MATCH`, with the thread count) or how far they are (`DIFFER`: values that differ, max |difference|).
A DIFFER means another source tensor, another palettization setting (uniform, per-channel scale, vector
palettization, a custom table, an earlier quantization), another coremltools / scikit-learn, or scikit-learn run
with 3 threads or more (not repeatable: docs/quantization.md). Exits 1 when any weight differs.
"""
import argparse
import json
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SUFFIXES = re.compile(r"(_palettized|_quantized|_sparsified|_to_fp16|_to_fp32|_cast_fp16|_\d+)+$")


def expected_names(ckpt):
    import export_weights
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    names = sorted(export_weights.open_checkpoint(ckpt))
    layout = export_weights.detect_layout(cfg, names)
    to_native = export_weights.native_config if layout == "native" else export_weights.legacy_to_native_config
    c = to_native(cfg, ckpt)
    return {name: shape for name, shape, _ in export_weights.expected_tensors(c)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mlpackage")
    ap.add_argument("out")
    ap.add_argument("--checkpoint", required=True, help="the checkpoint folder the model was converted from")
    ap.add_argument("--map", default=None, help="JSON {coreml weight name: HF name}")
    ap.add_argument("--all", action="store_true", help="also the uncompressed weights whose names match")
    ap.add_argument("--check", action="store_true",
                    help="compare each palettized weight with tools/quants.py's palettization of the checkpoint")
    ap.add_argument("--threads", default="1,2", help="scikit-learn thread counts to try with --check (default 1,2)")
    a = ap.parse_args()
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil
    from safetensors.numpy import save_file
    model = ct.models.MLModel(a.mlpackage, skip_model_load=True)
    spec = model.get_spec()
    prog = load_mil(spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir)
    expected = expected_names(a.checkpoint)
    by_flat = {n.replace(".", "_"): n for n in expected}
    names = json.load(open(a.map)) if a.map else {}
    out, unmatched, kinds, luts = {}, [], {}, {}
    for f in prog.functions.values():
        for op in f.operations:
            if op.op_type.startswith("constexpr_"):
                value = op.materialized_val_inference()
            elif a.all and op.op_type == "const" and getattr(op.val, "val", None) is not None and op.val.val.ndim >= 2:
                value = op.val.val
            else:
                continue
            stem = SUFFIXES.sub("", op.name)     # a linear op's weight: OPNAME_weight_0_palettized
            hf = names.get(op.name) or next((by_flat[c] for c in (stem, stem[:-7], stem + "_weight")
                                             if c in by_flat), None)
            if hf is None:
                unmatched.append(op.name)
                continue
            if tuple(value.shape) != tuple(expected[hf]):
                sys.exit(f"coreml_weights.py: error: {op.name} -> {hf} has shape {list(value.shape)}, the checkpoint "
                         f"{list(expected[hf])}\n  hint: a port that transposes, splits or stacks it must undo that")
            if hf in out:
                sys.exit(f"coreml_weights.py: error: two Core ML weights map to {hf} (the second: {op.name})")
            out[hf] = np.ascontiguousarray(value)
            kinds[op.op_type] = kinds.get(op.op_type, 0) + 1
            if op.op_type == "constexpr_lut_to_dense" and value.ndim == 2:
                luts[hf] = np.asarray(op.lut.val).shape
    if not out:
        sys.exit(f"coreml_weights.py: error: no weight of {a.mlpackage} matched a tensor of {a.checkpoint}\n"
                 f"  found: {', '.join(unmatched[:5])}\n  hint: give --map NAMES.json")
    save_file(out, a.out, metadata={"source": os.path.basename(a.mlpackage.rstrip("/")), "coremltools": ct.__version__})
    print(f"wrote {a.out}: {len(out)} weights (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
          + (f"; not matched: {len(unmatched)} ({', '.join(unmatched[:3])}{' ...' if len(unmatched) > 3 else ''})"
             if unmatched else ""))
    if a.check:
        sys.exit(check(a.checkpoint, out, luts, [int(t) for t in a.threads.split(",")]))


def check(ckpt, out, luts, threads):
    """Prints MATCH / DIFFER per palettized weight (see --check); returns the exit status."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import quants
    from quant_sensitivity import Checkpoint
    ck, differ = Checkpoint(ckpt), 0
    if not luts:
        print("check: no palettized [out, in] weight to check")
        return 1
    for hf in sorted(luts):
        value, shape = out[hf], luts[hf]               # lut: [out groups, in groups, entries, vector]
        if len(shape) != 4 or shape[1] != 1 or shape[3] != 1 or value.shape[0] % shape[0]:
            print(f"SKIP {hf}: table shape {list(shape)} (only tables per group of output channels are checked)")
            continue
        group, nbits = value.shape[0] // shape[0], int(np.log2(shape[2]))
        w = ck.get(hf).astype(value.dtype)
        got = value.astype(np.float32)
        small = value.dtype != np.float16 or group * value.shape[1] < quants.KMEANS1D_MIN   # scikit-learn's path
        results = []                                   # (differing values, threads, max |difference|)
        try:
            for t in (threads if small else threads[:1]):
                mine = quants.int4_pal(w, group=group, lut_dtype=value.dtype, nbits=nbits, n_threads=t)
                results.append((int((mine.view(np.uint32) != got.view(np.uint32)).sum()), t,
                                float(np.abs(mine - got).max())))
        except quants.NotQuantizable as e:
            print(f"SKIP {hf}: {e}")
            continue
        what = f"{hf} [{value.shape[0]}, {value.shape[1]}], groups of {group}, {nbits} bits, {value.dtype}"
        same = [t for n, t, _ in results if n == 0]
        if same:
            how = (f"scikit-learn with {' or '.join(map(str, same))} thread(s)" if small
                   else "kmeans1d: groups of >= 10,000 fp16 values")
            print(f"MATCH {what}: coremltools' kmeans palettization of the checkpoint, bit for bit ({how})")
        else:
            differ += 1
            n, t, d = min(results)
            print(f"DIFFER {what}: {n} of {value.size} values differ (max |difference| {d:.3g}"
                  + (f", closest with {t} thread(s)" if small else "") + "); hint: another source tensor or setting "
                  "(see --help)")
    return 1 if differ else 0


if __name__ == "__main__":
    main()
