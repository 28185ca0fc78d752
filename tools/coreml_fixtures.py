#!/usr/bin/env python3
"""coreml_fixtures.py - record coremltools' own INT4 palettization for test/test_quant_sensitivity.py (needs
coremltools; not run by tests).

    /work/venv/bin/python tools/coreml_fixtures.py test/fixtures/coreml/palettized.safetensors [--mlpackage DIR]

Builds an fp16 ML program (iOS18) with one linear layer per case, palettizes it with
coremltools.optimize.coreml.palettize_weights(OpPalettizerConfig(mode="kmeans", nbits=4,
granularity="per_grouped_channel", group_size=32)) - the seeds' Core ML port's setting - and reads back each
constexpr_lut_to_dense op's table and indices. Writes CASE.weight (the fp16 weight given to coremltools) and
CASE.palettized (table[group][index], fp16, what the model computes with). Every group holds >= 10,000
values (coremltools' kmeans1d path). --mlpackage also saves the palettized model (for tools/coreml_weights.py).
"""
import argparse
import json

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.frontend.milproto.load import load as load_mil
from coremltools.converters.mil.mil import types


def cases():
    rng = np.random.default_rng(48)
    yield "normal_64x320", rng.standard_normal((64, 320)) * 0.02
    yield "student_t3_32x512", rng.standard_t(3, (32, 512)) * 0.02
    yield "coarse_64x384", np.round(rng.standard_normal((64, 384)) * 40) / 2000      # many repeated values
    yield "outliers_32x416", rng.standard_normal((32, 416)) * 0.02 * np.where(rng.random((32, 416)) < 0.002, 50, 1)


def palettize(name, w, mlpackage=None):
    """fp16 w [out, in] -> (lut [groups, 16], indices [out, in]) from coremltools itself (a one-layer program)."""
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, w.shape[1]), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=x, weight=w, name=name)
    m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                   compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    op = ct.optimize.coreml.OpPalettizerConfig(mode="kmeans", nbits=4, granularity="per_grouped_channel",
                                               group_size=32)
    pm = ct.optimize.coreml.palettize_weights(m, ct.optimize.coreml.OptimizationConfig(global_config=op))
    if mlpackage:
        pm.save(mlpackage)
    spec = pm.get_spec()
    p = load_mil(spec, specification_version=spec.specificationVersion, file_weights_dir=pm.weights_dir)
    for f in p.functions.values():
        for o in f.operations:
            if o.op_type == "constexpr_lut_to_dense":
                lut = np.asarray(o.lut.val)
                return lut.reshape(lut.shape[0], -1), np.asarray(o.indices.val)
    raise SystemExit(f"{name}: coremltools wrote no constexpr_lut_to_dense")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mlpackage", default=None)
    a = ap.parse_args()
    named = {n: w.astype(np.float16) for n, w in cases()}
    tensors = {}
    for i, (n, w) in enumerate(named.items()):
        groups, idx = palettize(n, w, a.mlpackage if a.mlpackage and i == 0 else None)   # lut [out / 32, 16]
        rows = np.repeat(np.arange(groups.shape[0]), 32)
        deq = groups[rows[:, None], idx].astype(np.float16)
        tensors[n + ".weight"] = w
        tensors[n + ".palettized"] = deq
    meta = {"coremltools": ct.__version__, "config": json.dumps({"mode": "kmeans", "nbits": 4,
            "granularity": "per_grouped_channel", "group_size": 32, "compute_precision": "FLOAT16"})}
    from safetensors.numpy import save_file
    save_file(tensors, a.out, metadata=meta)
    print(f"wrote {a.out}: {len(named)} cases, coremltools {ct.__version__}")


if __name__ == "__main__":
    main()
