#!/usr/bin/env python3
"""gguf_strip.py - a small copy of a port's GGUF for the tests: every tensor byte for byte except the ones named
with --drop, every metadata key except the tokenizer's big arrays (tokens, scores, token types, merges).

    python3 tools/gguf_strip.py IN.gguf OUT.gguf [--drop token_embd.weight]

Each dropped tensor leaves a record in the metadata, so a test can put it back and prove it is the same:
  zaya_test.dropped.<name>.type / .ne / .sha256   (the ggml type, the dimensions, the SHA-256 of its bytes)
The compact fixture's GGUFs of llama.cpp's ZAYA port are 24-33 MB, almost all tokenizer arrays and the
262147 x 16 embedding; without them they are a few hundred KB (test/fixtures/gguf/README.md).
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gguf  # noqa: E402

BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--drop", action="append", default=[], help="a tensor to leave out (repeatable)")
    a = ap.parse_args()
    g = gguf.GGUFFile(a.src)
    kv = [(k, g.kv_types[k], v) for k, v in g.kv.items() if k not in BIG_ARRAYS]
    tensors = []
    for name, t in g.tensors.items():
        raw = bytes(g.raw(name))
        if name in a.drop:
            kv += [(f"zaya_test.dropped.{name}.type", "string", t.type),
                   (f"zaya_test.dropped.{name}.ne", "array[uint64]", list(t.ne)),
                   (f"zaya_test.dropped.{name}.sha256", "string", hashlib.sha256(raw).hexdigest())]
            continue
        tensors.append((name, t.type, t.ne, raw))
    missing = set(a.drop) - set(g.tensors)
    if missing:
        sys.exit(f"gguf_strip.py: no tensor {sorted(missing)} in {a.src}")
    kv.append(("zaya_test.stripped_from", "string", os.path.basename(a.src)))
    gguf.write_gguf(a.out, kv, tensors, g.alignment)
    print(f"wrote {a.out}: {len(tensors)} tensors, {len(kv)} metadata keys, {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
