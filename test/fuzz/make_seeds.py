#!/usr/bin/env python3
"""make_seeds.py OUT_DIR - tiny valid zaya.c blobs (a few KB) as the seed corpus of fuzz_blob.

The blobs are written with export_weights.py's own header/directory code (pack_header, pack_entry,
expected_tensors, tensor_nbytes), so they are what the exporter would write for a tiny ZAYA-shaped
checkpoint: fp32, bf16 and int8 variants, one and two layers, sliding and full attention, and
format version 2 blobs with FP8 (bf16 / f16 scales) or MXFP4 experts, with random weights (fixed seed). No tokenizer section (the tokenizer has its own fuzzer,
fuzz_tokenizer.c); the header's tokenizer fields are still fuzzed. Standard library only.
"""
import os
import random
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import export_weights as ew  # noqa: E402


def config(layers, types, vocab=24, hidden=8, heads=2, kv=2, head_dim=4, experts=2, inter=4, router=4, window=3,
           t0=2, t1=2, prf=0.5, max_pos=64):
    return {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": head_dim, "num_experts": experts, "num_experts_per_tok": 1,
            "moe_intermediate_size": inter, "router_hidden_size": router, "cca_time0": t0, "cca_time1": t1,
            "rms_norm_eps": 1e-5, "layer_types": types, "sliding_window": window, "max_position_embeddings": max_pos,
            "bos_token_id": 2, "pad_token_id": 0, "eos_token_ids": [1],
            "rope_theta": {"hybrid": 10000.0, "hybrid_sliding": 10000.0},
            "partial_rotary_factor": {"hybrid": prf, "hybrid_sliding": prf}}


def blob(c, wformat, seed, group=4, experts=None, scale_field=1):
    """experts: None, or 'fp8_e4m3_rows' / 'mxfp4' for the expert tensors (format version 2; MXFP4 needs
    rows of multiples of 32); scale_field: the FP8 scale dtype in the entry's field 188."""
    rng = random.Random(seed)
    group_pref = group
    plan = ew.expected_tensors(c)
    data_off = ew.align(ew.HEADER_SIZE + ew.DIR_ENTRY_SIZE * len(plan), ew.PAGE)
    entries, chunks, pos = [], [], data_off
    for name, shape, kind in plan:
        dtype = wformat if kind == "matrix" else "fp32"
        if experts and ".mlp.experts." in name:
            dtype = experts
        g = 0
        if dtype == "int8":   # the largest of group, 4, 2, 1 that divides the rows (as the exporter does)
            g = next(k for k in (group_pref, 4, 2, 1) if shape[-1] % k == 0)
        numel = 1
        for d in shape:
            numel *= d
        if dtype == "fp8_e4m3_rows":   # no NaN byte (0x7f / 0xff), padding, one fp32 scale per row
            g, rows = scale_field, numel // shape[-1]
            nbytes = ew.align(numel, ew.ALIGN) + 4 * rows
            q = bytes(b if b & 0x7F != 0x7F else 0 for b in (rng.randrange(256) for _ in range(numel)))
            raw = q.ljust(ew.align(numel, ew.ALIGN), b"\0") + struct.pack(f"<{rows}f", *(rng.uniform(0.001, 0.02) for _ in range(rows)))
        elif dtype == "mxfp4":          # packed E2M1 pairs, padding, one E8M0 byte per 32 values
            g, nbytes = 32, ew.align(numel // 2, ew.ALIGN) + numel // 32
            raw = bytes(rng.randrange(256) for _ in range(numel // 2)).ljust(ew.align(numel // 2, ew.ALIGN), b"\0") + \
                bytes(rng.randrange(118, 126) for _ in range(numel // 32))
        elif dtype == "fp32":
            nbytes = ew.tensor_nbytes(shape, dtype, g)
            raw = struct.pack(f"<{numel}f", *(rng.gauss(0, 0.5) for _ in range(numel)))
        elif dtype == "bf16":
            nbytes = ew.tensor_nbytes(shape, dtype, g)
            raw = b"".join(struct.pack("<f", rng.gauss(0, 0.5))[2:] for _ in range(numel))
        else:
            nbytes = ew.tensor_nbytes(shape, dtype, g)
            q = bytes(rng.randrange(256) for _ in range(numel)).ljust(ew.align(numel, ew.ALIGN), b"\0")
            raw = q + struct.pack(f"<{numel // g}f", *(rng.uniform(0.001, 0.02) for _ in range(numel // g)))
        assert len(raw) == nbytes
        entries.append(ew.pack_entry(name, dtype, shape, pos, nbytes, zlib.crc32(raw), g))
        chunks.append((pos, raw))
        pos = ew.align(pos + nbytes, ew.ALIGN)
    out = bytearray(pos)
    for off, raw in chunks:
        out[off:off + len(raw)] = raw
    header = ew.pack_header(c, "native", wformat, group if wformat == "int8" else 0, len(entries), data_off, pos, 0, pos,
                            {"exporter": "test/fuzz/make_seeds.py"}, 2 if experts else 1)
    directory = b"".join(entries)
    struct.pack_into("<I", header, 12, zlib.crc32(directory, zlib.crc32(bytes(header))))
    out[:ew.HEADER_SIZE] = header
    out[ew.HEADER_SIZE:ew.HEADER_SIZE + len(directory)] = directory
    return bytes(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {"l1_fp32": (config(1, ["hybrid"]), "fp32"),
             "l2_bf16": (config(2, ["hybrid_sliding", "hybrid"]), "bf16"),
             "l1_int8": (config(1, ["hybrid_sliding"], hidden=8, inter=8), "int8"),
             "l2_fp32_gqa": (config(2, ["hybrid", "hybrid_sliding"], heads=4, kv=2, experts=3, window=2), "fp32"),
             # odd widths: SIMD tails, int8 groups of 5 (stored in order) and of 8 (interleaved blocks of 64)
             "l1_int8_g5": (config(1, ["hybrid"], hidden=20, head_dim=12, inter=10, router=6), "int8", 5),
             "l1_int8_g8": (config(1, ["hybrid_sliding"], hidden=64, inter=8, vocab=16), "int8", 8),
             "l1_bf16_odd": (config(1, ["hybrid_sliding"], hidden=19, head_dim=12, inter=7, router=5, window=1), "bf16"),
             # other shapes of the architecture: conv kernels 1 and 3, full rotary, one expert, 3 query heads
             # per KV head, a context of 2 positions, 3 layers
             "l3_fp32_shapes": (config(3, ["hybrid", "hybrid_sliding", "hybrid_sliding"], heads=6, kv=2, head_dim=2,
                                       experts=1, t0=1, t1=3, prf=1.0, window=2, max_pos=2), "fp32"),
             "l1_fp32_conv3": (config(1, ["hybrid"], t0=3, t1=1, experts=4, inter=3, router=3, vocab=5), "fp32"),
             # format version 2: FP8 experts (bf16 scales; f16 scales, rows of 20) and MXFP4 experts (rows of 32)
             "v2_l1_bf16_fp8": (config(1, ["hybrid"], hidden=20, inter=20), "bf16", 4, "fp8_e4m3_rows", 1),
             "v2_l2_int8_fp8_f16": (config(2, ["hybrid", "hybrid_sliding"], hidden=8, inter=8), "int8", 4,
                                    "fp8_e4m3_rows", 5),
             "v2_l1_int8_mxfp4": (config(1, ["hybrid_sliding"], hidden=32, inter=32, vocab=16), "int8", 8, "mxfp4")}
    for i, (name, (c, fmt, *g)) in enumerate(sorted(seeds.items())):
        b = blob(c, fmt, i, *g)
        with open(os.path.join(out, f"seed_{name}.bin"), "wb") as f:
            f.write(b)
        print(f"wrote {out}/seed_{name}.bin: {len(b)} bytes")


if __name__ == "__main__":
    main()
