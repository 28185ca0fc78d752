#!/usr/bin/env python3
"""forbid_skip.py BLOB OUT [--bias B] - a copy of a zaya.c blob whose router can never choose the skip class.

Some ports route over the E real experts only (llama.cpp's ZAYA port: top-k over probs[:E] + biases[:E],
src/models/zaya.cpp; it never picks the skip class E). Where the official router would pick the skip class
such a port differs by design, and zaya.c's replay of it would report that difference in every MoE layer
where it happens. In the copy, every layer's mlp.gate.balancing_biases[E] is B (default -1e4, far below any
probability + bias), so zaya.c's top-1 over E+1 classes equals the port's top-1 over E: the rest of the
comparison is then about the port's computation. The tensor's CRC and the header CRC are updated
(`zaya --verify` passes). Standard library only.
"""
import argparse
import shutil
import struct
import sys
import zlib


def read_directory(f, path):
    """(header, directory offset, directory, {tensor name: its entry's offset in the directory}) of an open blob."""
    hdr = bytearray(f.read(1024))
    if hdr[:8] != b"ZAYABLOB":
        raise ValueError(f"{path} is not a zaya.c blob (no ZAYABLOB magic)")
    diroff, = struct.unpack_from("<Q", hdr, 24)
    n, = struct.unpack_from("<I", hdr, 32)
    f.seek(diroff)
    d = bytearray(f.read(192 * n))
    if len(d) != 192 * n:
        raise ValueError(f"{path}: the tensor directory is cut short")
    return hdr, diroff, d, {bytes(d[192 * i:192 * i + 128]).split(b"\0")[0].decode(): 192 * i for i in range(n)}


def patch_tensor(f, d, e, off, data):
    """A tensor's new bytes at off and their CRC into directory entry e (write_header then seals the blob)."""
    f.seek(off)
    f.write(data)
    struct.pack_into("<I", d, e + 184, zlib.crc32(bytes(data)) & 0xFFFFFFFF)


def write_header(f, hdr, d, diroff):
    """The header (its CRC over header and directory) and the directory written back: the blob stays one
    `zaya --verify` accepts."""
    struct.pack_into("<I", hdr, 12, 0)
    struct.pack_into("<I", hdr, 12, zlib.crc32(bytes(hdr) + bytes(d)) & 0xFFFFFFFF)
    f.seek(0)
    f.write(hdr)
    f.seek(diroff)
    f.write(d)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("blob")
    ap.add_argument("out", help="the copy to write (may be BLOB itself: patched in place)")
    ap.add_argument("--bias", type=float, default=-1e4, help="the skip class's balancing bias (default -1e4)")
    a = ap.parse_args(argv)
    try:
        if a.out != a.blob:
            shutil.copyfile(a.blob, a.out)
        with open(a.out, "r+b") as f:
            hdr, diroff, d, entries = read_directory(f, a.blob)
            done = 0
            for name, e in entries.items():
                if not name.endswith("mlp.gate.balancing_biases"):
                    continue
                dtype, = struct.unpack_from("<I", d, e + 128)
                shape = struct.unpack_from("<4Q", d, e + 136)
                off, size = struct.unpack_from("<QQ", d, e + 168)
                if dtype != 0 or size != 4 * shape[0]:
                    raise ValueError(f"{name}: expected float32 [{shape[0]}], found dtype {dtype}, {size} bytes")
                f.seek(off)
                data = bytearray(f.read(size))
                old = struct.unpack_from("<f", data, size - 4)[0]
                struct.pack_into("<f", data, size - 4, a.bias)
                patch_tensor(f, d, e, off, data)
                done += 1
                print(f"{name}: skip-class bias {old:+.4g} -> {a.bias:g}")
            if not done:
                raise ValueError(f"{a.blob} has no mlp.gate.balancing_biases")
            write_header(f, hdr, d, diroff)
    except (OSError, ValueError) as e:
        print(f"error: {e}\n  hint: BLOB is a blob written by export_weights.py", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
