"""vl_checkpoint.py - the ZAYA1-VL fixture checkpoint from its two committed parts (standard library only).

The compact ZAYA1-VL of test/fixtures/vl/ shares its language model with test/fixtures/checkpoint_native/
(the real 262,272-token vocabulary is 8 MB of embedding, committed once): vl/extra.safetensors holds only
the vision tower (model.visual.*) and the decoder's vision LoRA pairs. compose() writes the whole checkpoint
in the layout of the official Zaya1VLForConditionalGeneration (transformers PR #46011):
    model.X                                   -> model.language_model.X
    model.norm.weight                         -> model.language_model.final_norm.weight
    ...mlp.gate.router_mlp.norm.weight        -> ...mlp.gate.router_mlp.rmsnorm_eda.weight
plus the extra tensors as they are, and config.json = vl/config.json.

    python3 tools/vl_checkpoint.py test/fixtures OUT_DIR
"""
import json
import os
import shutil
import struct
import sys


def read_safetensors(path):
    """-> (header dict without __metadata__, raw bytes of the data section)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, not a safetensors file (hint: restore test/fixtures)")
    n = struct.unpack("<Q", blob[:8])[0]
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header of {n} bytes runs past the end of the file ({len(blob)} bytes): truncated")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    for name, e in header.items():
        a, b = e["data_offsets"]
        if b > len(data):
            raise ValueError(f"{path}: tensor {name} ends at byte {b} of a {len(data)}-byte data section: truncated")
    return header, data


def text_to_vl_name(name):
    if name == "model.norm.weight":
        return "model.language_model.final_norm.weight"
    name = name.replace(".mlp.gate.router_mlp.norm.", ".mlp.gate.router_mlp.rmsnorm_eda.")
    assert name.startswith("model."), name
    return "model.language_model." + name[len("model."):]


def rename_in_place(path, rename, chunk=1 << 26):
    """Rename every tensor of the safetensors file at path, in place: the new header is written and the data
    section moved behind it (copied from its end backwards, `chunk` bytes at a time), so a full-size file is
    renamed with no second copy on disk and little memory."""
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        n = struct.unpack("<Q", f.read(8))[0]
        if 8 + n > size:
            raise ValueError(f"{path}: header of {n} bytes runs past the end of the file ({size} bytes): truncated")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        new = {rename(k): v for k, v in header.items()}
        if meta is not None:
            new["__metadata__"] = meta
        h = json.dumps(new, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        h += b" " * max(0, n - len(h))                # a shorter header is padded to the old length
        shift, end = len(h) - n, size
        while shift and end > 8 + n:                  # move the data section `shift` bytes on, last chunk first
            start = max(8 + n, end - chunk)
            f.seek(start)
            buf = f.read(end - start)
            f.seek(start + shift)
            f.write(buf)
            end = start
        f.seek(0)
        f.write(struct.pack("<Q", len(h)) + h)
    return new


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, raw in tensors:
            f.write(raw)


def compose(fixtures, out, vl_dir=None):
    vl_dir = vl_dir or os.path.join(fixtures, "vl")
    os.makedirs(out, exist_ok=True)
    tensors = []
    for part, rename in ((os.path.join(fixtures, "checkpoint_native", "model.safetensors"), text_to_vl_name),
                         (os.path.join(vl_dir, "extra.safetensors"), lambda n: n)):
        header, data = read_safetensors(part)
        for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
            e = header[name]
            a, b = e["data_offsets"]
            tensors.append((rename(name), e["dtype"], e["shape"], data[a:b]))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    shutil.copyfile(os.path.join(vl_dir, "config.json"), os.path.join(out, "config.json"))
    for tok in ("tokenizer.json.gz", "tokenizer_config.json.gz"):
        src = os.path.join(fixtures, "tokenizer", tok)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out, tok))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(compose(sys.argv[1], sys.argv[2]))
