"""fake_quant.py - a small numpy stand-in for a quantized port's weights (used by the tests of issue 41).

    /usr/bin/python3 test/fake_quant.py CKPT_DIR q8_0|q4_0 PORT.safetensors [--groups experts,attention]

Reads a native-layout checkpoint folder's model.safetensors, quantizes the chosen matrices as ggml does
and writes their dequantized values (float32) under the same HF names: what a port writes after
dequantizing its own weights, for export_weights.py --weights.
  Q8_0 and Q4_0 as ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref (tools/quants.py), blocks along
  the input dimension.
A row shorter than 32 or not a multiple of it (the compact fixture: hidden 16, expert width 24) is
split into the largest block length <= 32 that divides it: ggml itself would refuse such a row.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import quants  # noqa: E402  (tools/quants.py: ggml's reference quantizers)

GROUPS = {
    "attention": ("self_attn.qkv_proj.q_proj.weight", "self_attn.qkv_proj.k_proj.weight",
                  "self_attn.qkv_proj.v_proj_current.weight", "self_attn.qkv_proj.v_proj_delayed.weight",
                  "self_attn.o_proj.weight"),
    "experts": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
}
ST = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header, base = json.loads(data[8:8 + n]), 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        if info["dtype"] == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            v = np.frombuffer(raw, ST[info["dtype"]]).astype(np.float32)
        out[name] = v.reshape(info["shape"])
    return out


def write_safetensors_raw(path, tensors, meta=None):
    """tensors: {name: (dtype, shape, raw bytes)}, written in that order; meta: the header's __metadata__."""
    header, blobs, off = ({"__metadata__": meta} if meta else {}), [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: {name: array}; written as F32, F16 or BF16 (BF16 truncates: give bf16 values)."""
    raw = {}
    for name, v in tensors.items():
        v = np.ascontiguousarray(v, np.float32)
        raw[name] = (dtype, v.shape, v.astype(np.float16).tobytes() if dtype == "F16" else
                     (v.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else v.tobytes())
    write_safetensors_raw(path, raw)


def block_len(cols):
    return max(b for b in range(1, 33) if cols % b == 0)


def quantize(w, qtype):
    """The dequantized values of w (float32, any shape; blocks along the last dimension): tools/quants.py's
    ggml quantizers with the block length of block_len()."""
    w = np.asarray(w, np.float32)
    return quants.fake_quant(w, {"q8_0": "Q8_0", "q4_0": "Q4_0"}[qtype], block=block_len(w.shape[-1]))


def quantized_port(ckpt_tensors, qtype, groups=("experts", "attention")):
    suffixes = tuple(s for g in groups for s in GROUPS[g])
    return {n: quantize(v, qtype) for n, v in ckpt_tensors.items() if n.startswith("model.layers.") and n.endswith(suffixes)}


if __name__ == "__main__":
    ckpt, qtype, out = sys.argv[1:4]
    groups = sys.argv[5].split(",") if len(sys.argv) > 5 and sys.argv[4] == "--groups" else ("experts", "attention")
    t = quantized_port(read_safetensors(ckpt + "/model.safetensors"), qtype, groups)
    write_safetensors(out, t)
    print(f"wrote {out}: {len(t)} tensors in {qtype}")
