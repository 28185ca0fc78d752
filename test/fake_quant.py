"""fake_quant.py - a small numpy stand-in for a quantized port's weights (used by the tests of issue 41).

    /usr/bin/python3 test/fake_quant.py CKPT_DIR q8_0|q4_0 PORT.safetensors [--groups experts,attention]

Reads a native-layout checkpoint folder's model.safetensors, quantizes the chosen matrices as ggml does
and writes their dequantized values (float32) under the same HF names: what a port writes after
dequantizing its own weights, for export_weights.py --weights.
  Q8_0 (ggml quantize_row_q8_0_ref): blocks of 32 along the input dimension, d = max|x| / 127,
       q = round(x / d) (half away from zero), value = q x fp16(d).
  Q4_0 (ggml quantize_row_q4_0_ref): blocks of 32, d = (the signed value of largest magnitude) / -8,
       q = min(15, trunc(x / d + 8.5)), value = (q - 8) x fp16(d).
A row shorter than 32 or not a multiple of it (the compact fixture: hidden 16, expert width 24) is
split into the largest block length <= 32 that divides it: ggml itself would refuse such a row.
"""
import json
import struct
import sys

import numpy as np

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


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: {name: array}; written as F32, F16 or BF16 (BF16 truncates: give bf16 values)."""
    header, blobs, off = {}, [], 0
    for name, v in tensors.items():
        v = np.ascontiguousarray(v, np.float32)
        raw = (v.astype(np.float16).tobytes() if dtype == "F16" else
               (v.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else v.tobytes())
        header[name] = {"dtype": dtype, "shape": list(v.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def block_len(cols):
    return max(b for b in range(1, 33) if cols % b == 0)


def quantize(w, qtype):
    """The dequantized values of w (float32, any shape; blocks along the last dimension)."""
    w = np.asarray(w, np.float32)
    qk = block_len(w.shape[-1])
    x = w.reshape(-1, qk)
    if qtype == "q8_0":
        amax = np.abs(x).max(axis=1, keepdims=True)
        d = amax / np.float32(127)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
        xs = x * inv
        q = np.trunc(xs + np.copysign(np.float32(0.5), xs))           # roundf: half away from zero
    elif qtype == "q4_0":
        idx = np.abs(x).argmax(axis=1)                                # the first of equal magnitudes, as ggml's `<`
        mx = x[np.arange(len(x)), idx][:, None]
        d = mx / np.float32(-8)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
        q = np.minimum(15, np.trunc(x * inv + np.float32(8.5)).astype(np.int32).astype(np.int8)) - 8
    else:
        raise ValueError(qtype)
    dh = d.astype(np.float16).astype(np.float32)
    return (q.astype(np.float32) * dh).reshape(w.shape)


def quantized_port(ckpt_tensors, qtype, groups=("experts", "attention")):
    suffixes = tuple(s for g in groups for s in GROUPS[g])
    return {n: quantize(v, qtype) for n, v in ckpt_tensors.items() if n.startswith("model.layers.") and n.endswith(suffixes)}


if __name__ == "__main__":
    ckpt, qtype, out = sys.argv[1:4]
    groups = sys.argv[5].split(",") if len(sys.argv) > 5 and sys.argv[4] == "--groups" else ("experts", "attention")
    t = quantized_port(read_safetensors(ckpt + "/model.safetensors"), qtype, groups)
    write_safetensors(out, t)
    print(f"wrote {out}: {len(t)} tensors in {qtype}")
