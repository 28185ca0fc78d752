#!/usr/bin/env python3
"""compare.py - compare two golden-tensor dumps and name the first divergence.

    python3 compare.py TEST_DIR REF_DIR [--tol-scale X] [--weights fp32|int8] [--near-tie M]
                       [--strict] [--verbose] [--json OUT]
    python3 compare.py PORT_DIR FP32_DIR --envelope BF16_DIR [--spread BF16_DIR2] [--near-tie M] [--verbose]
                       [--json OUT]           (is it bf16 or a bug? docs/compare.md §8)
    python3 compare.py --local PORT_DIR REPLAY_DIR | --local PORT_DIR --model MODEL.bin [--bf16]
                       [--reference REF_DIR] [--replay-out PREFIX]   (which layer introduces the error)
    python3 compare.py --quant PORT_DIR --model PORTWEIGHTS.bin --exact EXACT.bin [--bf16] [--replay-out PREFIX]
                       (a quantized port: its quantization beside its computation, docs/compare.md §10)

A dump is a folder with index.json and one NumPy .npy file per tensor (docs/compare.md), or one
.safetensors file holding the same tensors with index.json's fields in its __metadata__
(docs/golden-formats.md); either form on either side. Written by `./zaya MODEL.bin --ids ... --dump DIR`
(or `--dump FILE.safetensors`), by tools/golden_hf.py (the official transformers code), by
tools/fixture_to_dump.py (the shared fixture goldens) or by any other port. A dump that is incomplete (a
folder without index.json, which ./zaya writes last; a safetensors file whose header is not written yet
or that is cut short) is an input error, never compared in part. Tensors are matched by name and
compared in the reference's execution order. The report names the FIRST DIVERGENCE (the earliest
position at which any tensor is past its tolerance, and at that position the first tensor in execution
order), the error each layer adds, routing agreement with the reference's router margins (near-tie or
BUG), and logits agreement (top-1, top-5/16 overlap, KL). The tolerances are in zaya_compare/names.py
and docs/compare.md.

Exit status: 0 the dumps agree, 1 divergence, 2 usage or input error (message, never a traceback).
Needs numpy (Debian: apt-get install python3-numpy).

This file is the command line only: the work is in the package zaya_compare/ beside it (docs/compare.md,
"compare.py's parts"). Each view is a module with main(args) -> exit status, and optionally
add_arguments(parser) for its own options and wants(args) to claim a command line; VIEWS lists them in
the order they are asked, the plain comparison last.
"""
import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The dump format's readers and writers, for the tools and tests that import them from here (standard
# library only: importing compare does not need numpy).
from zaya_compare.dumps import (Incomplete, InputError, file_name, read_npy, tensor_stats,  # noqa: E402,F401
                                write_dump, write_npy)
from zaya_compare.names import NEAR_TIE, execution_order, kind_of, layer_of  # noqa: E402,F401

# (module of zaya_compare, wants(args)): the first view whose test is true runs
VIEWS = [
    ("quant", lambda a: a.quant),
    ("local", lambda a: a.local),
    ("envelope", lambda a: a.envelope is not None),
    ("endtoend", lambda a: True),
]


def parser(views):
    ap = argparse.ArgumentParser(description="Compare two golden-tensor dumps (docs/compare.md).")
    ap.add_argument("test_dir")
    ap.add_argument("ref_dir", nargs="?")
    ap.add_argument("--local", action="store_true", help="TEST_DIR is a port's dump, REF_DIR zaya.c's --replay of it: "
                    "the error each layer introduces (docs/compare.md)")
    ap.add_argument("--model", help="with --local: run ./zaya MODEL --replay TEST_DIR itself (into TEST_DIR_replay_*)")
    ap.add_argument("--replay-out", help="with --model: the replays' prefix: PREFIX_fp32 (and PREFIX_bf16) "
                    "(default TEST_DIR_replay)")
    ap.add_argument("--precision", metavar="P", help="with --local --model: the replay's ./zaya --precision, e.g. "
                    "fp32+ggml for a quantized GGUF that llama.cpp runs on its CPU backend (ggml's roundings)")
    ap.add_argument("--bf16", action="store_true", help="with --local --model: the port runs in bf16; also replay in "
                    "bf16 for the envelope")
    ap.add_argument("--reference", help="with --local: a reference dump of the same ids, for the end-to-end column")
    ap.add_argument("--tol-scale", type=float, default=1.0, help="multiply every tolerance by X")
    ap.add_argument("--weights", choices=["fp32", "int8"], help="gate kind (default: from index.json weight_format)")
    ap.add_argument("--near-tie", type=float, default=NEAR_TIE, help=f"router margin of a near-tie (default {NEAR_TIE})")
    ap.add_argument("--strict", action="store_true", help="tensors present on one side only are failures")
    ap.add_argument("--verbose", action="store_true", help="list every tensor")
    ap.add_argument("--json", metavar="OUT", help="also write every metric as JSON")
    ap.add_argument("--envelope", metavar="BF16_DUMP", help="precision mode: TEST_DIR is a port, REF_DIR the fp32 "
                    "reference, BF16_DUMP a known-good bf16 run of the same ids; is the port's drift bf16 or a bug? "
                    "With --local: zaya.c's bf16 replay of TEST_DIR (--precision bf16), the local envelope")
    ap.add_argument("--spread", metavar="BF16_DUMP2", help="with --envelope: another legitimate bf16 run "
                    "(e.g. token by token) that widens the envelope")
    for module in views:
        if hasattr(module, "add_arguments"):
            module.add_arguments(ap)
    return ap


def main(argv=None):
    from zaya_compare import dumps
    if dumps.np is None:
        print(f"compare.py: numpy is missing for {sys.executable}\n  hint: {dumps.NEED_NUMPY}", file=sys.stderr)
        return 2
    views = [(importlib.import_module("zaya_compare." + name), wants) for name, wants in VIEWS]
    ap = parser([m for m, _ in views])
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.spread and not args.envelope:
        print("compare.py: --spread needs --envelope", file=sys.stderr)
        return 2
    if not (args.tol_scale > 0):
        print("compare.py: --tol-scale must be > 0", file=sys.stderr)
        return 2
    module = next(m for m, wants in views if getattr(m, "wants", wants)(args))
    return module.main(args)


if __name__ == "__main__":
    sys.exit(main())
