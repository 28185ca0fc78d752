#!/usr/bin/env python3
"""coreml_fixtures.py - record coremltools' own palettization for the tests (needs coremltools and, for
groups under 10,000 values or an fp32 model, scikit-learn; not run by tests).

    /work/venv/bin/python tools/coreml_fixtures.py test/fixtures/coreml/palettized.safetensors [--mlpackage DIR]
    /work/venv/bin/python tools/coreml_fixtures.py test/fixtures/coreml/palettized_small.safetensors --small

Builds an ML program (iOS18) with one linear layer per case, palettizes it with
coremltools.optimize.coreml.palettize_weights(OpPalettizerConfig(mode="kmeans", nbits=4,
granularity="per_grouped_channel", group_size=32)) - the seeds' Core ML port's setting - and reads back each
constexpr_lut_to_dense op's table and indices.

Default cases (fp16, every group >= 10,000 values: coremltools' kmeans1d path): CASE.weight (the fp16 weight
given to coremltools) and CASE.palettized (table[group][index], fp16, what the model computes with).
--mlpackage also saves the first palettized model (for tools/coreml_weights.py).

--small: cases whose groups go to scikit-learn's KMeans (fp16 groups of 32 to 9,999 values, ties, fewer distinct
values than 16, 99 % zeros, a constant group, the ZAYA1-8B router MLP's 256 x 256 fc1 / fc2, fp32 models) and
one at exactly 10,000 (kmeans1d): CASE.weight (fp16 or fp32), CASE.group (group size along axis 0) and, for
sklearn's OpenMP thread counts T = 1 and 2 (threadpoolctl), CASE.tT.lut [groups, 16] (the weight's dtype) and
CASE.tT.indices [out, in] (uint8); the t2 pair only where 2 threads gave another result than 1. And, with 1
thread, the other settings a port may ship (metadata "modes": mode kmeans / uniform / unique, nbits 2, 3, 6, 8,
per_tensor as group 0; CASE.group then holds the output channels).
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


def small_cases():
    """(name, weight, group size, dtype): group sizes in values = group * in."""
    rng = np.random.default_rng(4801)
    f16, f32 = np.float16, np.float32
    yield "normal_32x1", rng.standard_normal((32, 1)) * 0.02, 32, f16                 # 32 values, k = 16
    yield "normal_8x25", rng.standard_normal((8, 25)) * 0.02, 8, f16                  # 200
    yield "student_t3_64x64", rng.standard_t(3, (64, 64)) * 0.02, 32, f16             # 2,048 x 2
    normal = rng.standard_normal((9, 1111)) * 0.02
    yield "outliers_9x1111", normal * np.where(rng.random((9, 1111)) < 0.01, 30, 1), 9, f16
    yield "ties_32x96", np.round(rng.standard_normal((32, 96)) * 6) / 300, 32, f16    # ~40 distinct values
    yield "few_distinct_32x40", rng.integers(-5, 6, (32, 40)) / 100, 32, f16          # 11 distinct < 16
    yield "threshold_16x625", rng.standard_normal((16, 625)) * 0.02, 16, f16          # 10,000: kmeans1d
    s = 1 / np.sqrt(256)
    yield "router_fc1_256x256", rng.uniform(-s, s, (256, 256)), 32, f16              # 8,192 per group
    yield "router_fc2_256x256", rng.standard_normal((256, 256)) * 0.02, 32, f16
    yield "fp32_normal_32x64", rng.standard_normal((32, 64)) * 0.02, 32, f32          # fp32 model: sklearn in f32
    yield "fp32_student_t3_32x320", rng.standard_t(3, (32, 320)) * 0.02, 32, f32      # 10,240 but fp32: sklearn
    pruned = rng.standard_normal((32, 160)) * 0.05 * (rng.random((32, 160)) < 0.01)   # 99 % zeros
    yield "mostly_zero_32x160", pruned, 32, f16
    yield "constant_32x64", np.zeros((32, 64)), 32, f16                                # one value: 16 equal centers


def mode_cases():
    """(name, fp16 weight, config): other settings a Core ML port may ship; group 0 = per_tensor."""
    rng = np.random.default_rng(4802)
    yield "nbits2_32x64", rng.standard_normal((32, 64)) * 0.02, {"mode": "kmeans", "nbits": 2, "group": 32}
    yield "nbits8_32x64", rng.standard_t(3, (32, 64)) * 0.02, {"mode": "kmeans", "nbits": 8, "group": 32}
    yield "nbits8_32x320", rng.standard_normal((32, 320)) * 0.02, {"mode": "kmeans", "nbits": 8, "group": 32}
    yield "nbits3_32x320", rng.standard_normal((32, 320)) * 0.02, {"mode": "kmeans", "nbits": 3, "group": 32}
    yield "per_tensor_48x64", rng.standard_normal((48, 64)) * 0.02, {"mode": "kmeans", "nbits": 4, "group": 0}
    yield "per_tensor_48x256", rng.standard_normal((48, 256)) * 0.02, {"mode": "kmeans", "nbits": 6, "group": 0}
    yield "uniform4_64x96", rng.standard_normal((64, 96)) * 0.02, {"mode": "uniform", "nbits": 4, "group": 32}
    yield "uniform8_32x64", rng.standard_t(3, (32, 64)) * 0.02, {"mode": "uniform", "nbits": 8, "group": 0}
    yield "unique_64x40", rng.integers(-20, 21, (64, 40)) / 256, {"mode": "unique", "nbits": None, "group": 32}


def palettize(name, w, group=32, mlpackage=None, mode="kmeans", nbits=4):
    """w [out, in] (fp16: an fp16 model, fp32: an fp32 one) -> (lut [groups, 16], indices [out, in]) from
    coremltools itself (a one-layer program)."""
    fp16 = w.dtype == np.float16
    dt = types.fp16 if fp16 else types.fp32

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, w.shape[1]), dtype=dt)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=x, weight=w, name=name)
    m = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                   compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32, skip_model_load=True)
    gran = {"granularity": "per_grouped_channel", "group_size": group} if group else {"granularity": "per_tensor"}
    op = ct.optimize.coreml.OpPalettizerConfig(mode=mode, nbits=nbits, weight_threshold=1, **gran)
    pm = ct.optimize.coreml.palettize_weights(m, ct.optimize.coreml.OptimizationConfig(global_config=op))
    if mlpackage:
        pm.save(mlpackage)
    spec = pm.get_spec()
    p = load_mil(spec, specification_version=spec.specificationVersion, file_weights_dir=pm.weights_dir)
    for f in p.functions.values():
        for o in f.operations:
            if o.op_type == "constexpr_lut_to_dense" and tuple(o.outputs[0].shape) == w.shape:   # not the bias
                lut = np.asarray(o.lut.val)
                return lut.reshape(lut.shape[0], -1), np.asarray(o.indices.val)
    raise SystemExit(f"{name}: coremltools wrote no constexpr_lut_to_dense")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mlpackage", default=None)
    ap.add_argument("--small", action="store_true", help="the scikit-learn cases (see the docstring)")
    a = ap.parse_args()
    tensors = {}
    meta = {"coremltools": ct.__version__}
    if a.small:
        import sklearn
        from threadpoolctl import threadpool_limits
        meta["scikit-learn"] = sklearn.__version__
        meta["numpy"] = np.__version__
        meta["config"] = json.dumps({"mode": "kmeans", "nbits": 4, "granularity": "per_grouped_channel",
                                     "group_size": "CASE.group", "weight_threshold": 1})
        n = 0
        for name, w, group, dt in small_cases():
            w = w.astype(dt)
            tensors[name + ".weight"] = w
            tensors[name + ".group"] = np.array([group], np.int32)
            for t in (1, 2):
                with threadpool_limits(limits=t, user_api="openmp"):
                    lut, idx = palettize(name, w, group)
                lut, idx = lut.astype(dt), idx.astype(np.uint8)
                if t == 2 and np.array_equal(lut, tensors[f"{name}.t1.lut"]) and \
                        np.array_equal(idx, tensors[f"{name}.t1.indices"]):
                    continue                                      # 2 threads: the same result
                tensors[f"{name}.t{t}.lut"] = lut
                tensors[f"{name}.t{t}.indices"] = idx
            n += 1
        modes = {}
        for name, w, cfg in mode_cases():
            w = w.astype(np.float16)
            with threadpool_limits(limits=1, user_api="openmp"):
                lut, idx = palettize(name, w, cfg["group"], mode=cfg["mode"], nbits=cfg["nbits"])
            tensors[name + ".weight"] = w
            tensors[name + ".group"] = np.array([cfg["group"] or w.shape[0]], np.int32)
            tensors[name + ".t1.lut"] = lut.astype(np.float16)
            tensors[name + ".t1.indices"] = idx.astype(np.uint8)
            modes[name] = cfg
            n += 1
        meta["modes"] = json.dumps(modes)
    else:
        meta["config"] = json.dumps({"mode": "kmeans", "nbits": 4, "granularity": "per_grouped_channel",
                                     "group_size": 32, "compute_precision": "FLOAT16"})
        named = {n: w.astype(np.float16) for n, w in cases()}
        for i, (name, w) in enumerate(named.items()):
            groups, idx = palettize(name, w, 32, a.mlpackage if a.mlpackage and i == 0 else None)
            rows = np.repeat(np.arange(groups.shape[0]), 32)
            tensors[name + ".weight"] = w
            tensors[name + ".palettized"] = groups[rows[:, None], idx].astype(np.float16)
        n = len(named)
    from safetensors.numpy import save_file
    save_file(tensors, a.out, metadata=meta)
    print(f"wrote {a.out}: {n} cases, {', '.join(f'{k} {v}' for k, v in meta.items() if k not in ('config', 'modes'))}")


if __name__ == "__main__":
    main()
