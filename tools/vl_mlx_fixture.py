#!/usr/bin/env python3
"""vl_mlx_fixture.py - what mlx-vlm's own convert writes for the compact ZAYA1-VL fixture (test/fixtures/vl_export/).

    /work/venv/bin/python tools/vl_mlx_fixture.py [--fixtures test/fixtures] [--out test/fixtures/vl_export]

Needs mlx (mlx-cpu) and mlx-vlm (its zaya1_vl model). The fixture checkpoint (tools/vl_checkpoint.py) is written in
Zyphra's layout (the hub's, which mlx-vlm's zaya1_vl loads) and converted by mlx_vlm.convert twice: as it is (bf16)
and with -q (4-bit affine, group 32: only the matrices whose rows are a multiple of 32 are quantized). Recorded:
- mlx_vlm.json: mlx-vlm's version, the unquantized folder's config.json and every tensor's name, dtype and shape
  (its names: language_model.model.layers.{i}.attn/.mlp, stacked experts and expert LoRA pairs, MLX's Conv1d
  [C, kernel, in] and Conv3d [D, T, P, P, C] layouts), and the -q folder's `quantization`;
- mlx_vlm_q.safetensors: the -q folder's packed weights with their scales and biases (nothing else);
- mlx_vlm_dequantized.safetensors: mx.dequantize of each of them (what an MLX bf16 model multiplies by).
"""
import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile

import mlx.core as mx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vl_checkpoint  # noqa: E402


def header(path):
    h, _ = vl_checkpoint.read_safetensors(path)
    return {n: [e["dtype"], e["shape"]] for n, e in sorted(h.items())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=os.path.join(HERE, "..", "test", "fixtures"))
    ap.add_argument("--out", default=os.path.join(HERE, "..", "test", "fixtures", "vl_export"))
    args = ap.parse_args()
    import mlx_vlm
    from mlx_vlm.convert import convert
    with tempfile.TemporaryDirectory() as tmp:
        pr = vl_checkpoint.compose(args.fixtures, os.path.join(tmp, "pr"))
        zy = vl_checkpoint.to_zyphra(pr, os.path.join(tmp, "zy"))
        for name in os.listdir(zy):            # mlx-vlm reads the tokenizer files uncompressed
            if name.endswith(".gz"):
                with gzip.open(os.path.join(zy, name)) as f, open(os.path.join(zy, name[:-3]), "wb") as g:
                    shutil.copyfileobj(f, g)
                os.remove(os.path.join(zy, name))
        plain, quant = os.path.join(tmp, "mlx"), os.path.join(tmp, "mlx_q")
        convert(zy, mlx_path=plain)
        convert(zy, mlx_path=quant, quantize=True, q_group_size=32, q_bits=4)
        cfg_q = json.load(open(os.path.join(quant, "config.json")))
        rec = {"mlx_vlm": mlx_vlm.__version__, "mlx": mx.__version__,
               "config": json.load(open(os.path.join(plain, "config.json"))),
               "tensors": header(os.path.join(plain, "model.safetensors")),
               "quantization": cfg_q["quantization"]}
        with open(os.path.join(args.out, "mlx_vlm.json"), "w") as f:
            json.dump(rec, f, indent=0, sort_keys=True)
        w = mx.load(os.path.join(quant, "model.safetensors"))
        q = cfg_q["quantization"]
        packed, deq = {}, {}
        for n in sorted(w):
            if w[n].dtype == mx.uint32:
                base = n[:-len(".weight")]
                for k in (n, base + ".scales", base + ".biases"):
                    packed[k] = w[k]
                deq[n] = mx.dequantize(w[n], w[base + ".scales"], w[base + ".biases"], group_size=q["group_size"],
                                       bits=q["bits"])
        mx.save_safetensors(os.path.join(args.out, "mlx_vlm_q.safetensors"), packed)
        mx.save_safetensors(os.path.join(args.out, "mlx_vlm_dequantized.safetensors"), deq)
        print(f"mlx-vlm {mlx_vlm.__version__}: {len(rec['tensors'])} tensors; {len(deq)} quantized matrices "
              f"-> {args.out}")


if __name__ == "__main__":
    main()
