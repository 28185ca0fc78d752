#!/usr/bin/env python3
"""test_int8.py - int8 blobs stay close to the official float32 results (issue: int8 and bf16 blobs).

    make zaya && python3 test/test_int8.py

Routing is discontinuous: a tiny quantization error can flip a near-tie top-1 choice and send a
token down another expert, so int8 is judged like this on the compact fixture (test/fixtures):
- every position before the first routing flip has logit cosine >= 0.999 against the official logits;
- the first flip happens where the official biased top-1 margin is < 0.02 (larger would be a bug);
- the median cosine over all positions >= 0.999; the same top-1 token at >= 85% of positions.
The official logits are golden/final_norm.npy @ embed_tokens.T; the fp32 engine reproduces them to
~1e-5 (test_engine.py), so its logits stand in for them here (the fixture stores only the top-16).
Every flip is reported with its margin.
"""
import math
import os
import shutil
import sys

from harness import BUILD, ROOT, check, finish, need_fixtures, tokenizer_dir, prompt_ids, read_npy, run
from test_dims import small_tokenizer

FX = need_fixtures()
os.makedirs(BUILD, exist_ok=True)
IDS = ",".join(map(str, prompt_ids()))
CKPT = os.path.join(FX, "checkpoint_native")


def export_and_dump(dtype):
    blob, d = os.path.join(BUILD, f"int8test_{dtype}.bin"), os.path.join(BUILD, f"int8test_{dtype}")
    rc, out, err = run(["python3", "export_weights.py", CKPT, blob, "--dtype", dtype])
    check(rc == 0, f"export {dtype}", err[-400:])
    shutil.rmtree(d, ignore_errors=True)
    rc, _, err = run(["./zaya", blob, "--ids", IDS, "--dump", d])
    check(rc == 0, f"./zaya --dump ({dtype} blob)", err[-400:])
    return blob, d, out


fp32_blob, ref, _ = export_and_dump("fp32")
q8_blob, q8, log = export_and_dump("int8")
check("rel L2 error" in log, "the exporter reports each tensor's quantization error", log[-300:])

golden = os.path.join(FX, "golden")
(L, T), want = read_npy(os.path.join(golden, "router_indices.npy"))
_, margin = read_npy(os.path.join(golden, "router_margin.npy"))
flips = []
for l in range(L):
    got = read_npy(os.path.join(q8, f"model.layers.{l}.mlp.gate.router_indices.npy"))[1]
    flips += [(t, l, margin[l * T + t], want[l * T + t], got[t]) for t in range(T) if got[t] != want[l * T + t]]
flips.sort()
for t, l, m, a, b in flips:
    print(f"   routing flip: position {t}, layer {l}: official class {a}, int8 class {b}, official margin {m:.4f}")
first = flips[0][0] if flips else T
check(not flips or flips[0][2] < 0.02, "the first routing flip is a near-tie (official margin < 0.02)",
      f"first flip at position {flips[0][0] if flips else '-'}, margin {flips[0][2] if flips else 0:.4f}")

(_, V), a = read_npy(os.path.join(q8, "logits.npy"))
b = read_npy(os.path.join(ref, "logits.npy"))[1]
cos, same_top = [], 0
for t in range(T):
    x, y = a[t * V:(t + 1) * V], b[t * V:(t + 1) * V]
    dot = sum(p * q for p, q in zip(x, y))
    cos.append(dot / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y)))
    same_top += max(range(V), key=x.__getitem__) == max(range(V), key=y.__getitem__)
before = cos[:first]
check(min(before) >= 0.999, f"logit cosine >= 0.999 at every position before the first flip ({first} positions)",
      f"min {min(before):.5f} at position {before.index(min(before))}")
med = sorted(cos)[T // 2]
check(med >= 0.999, f"median logit cosine >= 0.999 (median {med:.5f}, min {min(cos):.5f})", f"median {med:.5f}")
check(same_top >= 0.85 * T, f"same top-1 token at >= 85% of positions ({same_top}/{T})", f"{same_top}/{T}")
# the same blob through the sanitizer build, whose kernels are the portable C ones (no -march=native):
# the AVX512-VNNI kernel does the same integer sums and float operations, so the bits must match
d_dbg = os.path.join(BUILD, "int8test_debug")
shutil.rmtree(d_dbg, ignore_errors=True)
rc, _, err = run(["./zaya_debug", q8_blob, "--ids", IDS, "--dump", d_dbg, "--dump-filter", "^logits$"])
same = rc == 0 and read_npy(os.path.join(d_dbg, "logits.npy"))[1] == a
check(same, "int8: portable C kernels (sanitizer build) give the SIMD kernels' logits bit for bit", err[-300:])
# prefill shares each int8 weight load between up to 8 tokens: same bits as token by token
d_b1 = os.path.join(BUILD, "int8test_batch1")
shutil.rmtree(d_b1, ignore_errors=True)
rc, _, err = run(["./zaya", q8_blob, "--ids", IDS, "--dump", d_b1, "--dump-filter", "^logits$", "--batch", "1"])
check(rc == 0 and read_npy(os.path.join(d_b1, "logits.npy"))[1] == a,
      "int8: batched prefill gives token-by-token logits bit for bit", err[-300:])
# two threads (rows, heads and the activations of a batch split between them): the same bits
d_t2 = os.path.join(BUILD, "int8test_threads2")
shutil.rmtree(d_t2, ignore_errors=True)
rc, _, err = run(["./zaya", q8_blob, "--ids", IDS, "--dump", d_t2, "--dump-filter", "^logits$", "--threads", "2"])
check(rc == 0 and read_npy(os.path.join(d_t2, "logits.npy"))[1] == a,
      "int8: 2 threads give the 1-thread logits bit for bit", err[-300:])


# --hugepages interleaves the int8 rows in groups (ZayaMatrix.interleaved_rows) where rows hold whole
# blocks of 8 groups, in builds with the AVX-512 VNNI kernels; the fixture's matrices mostly do not,
# so a checkpoint whose do (hidden, o_proj input and expert width 512; vocabulary 997, so the LM
# head's last row stays alone): prompt and 4 decode steps give the same bits with and without
# interleaving, at group size 64 and 32, on 1 and 2 threads; and the sanitizer build (portable
# kernels, rows left alone) too.
def interleaved_rows_case():
    tok = small_tokenizer(tokenizer_dir(), os.path.join(BUILD, "interleave_tokenizer_1000"))
    ckpt = os.path.join(BUILD, "interleave_ckpt")
    rc, _, err = run(["python3", "tools/make_checkpoint.py", ckpt, "--hidden", "512", "--layers", "2", "--heads", "4",
                      "--kv-heads", "2", "--head-dim", "128", "--experts", "3", "--moe-intermediate", "512",
                      "--router-hidden", "16", "--vocab", "997", "--seed", "5", "--skip-bias", "0.04",
                      "--tokenizer-dir", tok, "--force", "--quiet"])
    if not check(rc == 0, "make_checkpoint: dimensions whose int8 rows --hugepages interleaves", err[-400:]):
        return
    for group in ("64", "32"):
        blob = os.path.join(BUILD, f"interleave_g{group}.bin")
        rc, _, err = run(["python3", "export_weights.py", ckpt, blob, "--dtype", "int8", "--group-size", group,
                          "--chat-format", "none"])
        if not check(rc == 0, f"export it (int8, group size {group})", err[-400:]):
            continue
        dumps = {}
        for label, cmd in (("rows alone", ["./zaya", "--mmap"]), ("read in at load", ["./zaya"]),
                           ("interleaved", ["./zaya", "--hugepages"]),
                           ("interleaved, 2 threads", ["./zaya", "--hugepages", "--threads", "2"]),
                           ("--hugepages, portable kernels", ["./zaya_debug", "--hugepages"])):
            d = os.path.join(BUILD, f"interleave_g{group}_{len(dumps)}")
            shutil.rmtree(d, ignore_errors=True)
            rc, _, err = run([cmd[0], blob, *cmd[1:], "--ids", "2,17,300,45,99,512,7,8,9", "-n", "4", "-t", "0", "--dump", d])
            if check(rc == 0, f"group {group}, {label}: --dump of the prompt and 4 decode steps", err[-300:]):
                dumps[label] = d
        base = dumps.get("rows alone")
        for label, d in dumps.items():
            if label == "rows alone" or not base:
                continue
            files = sorted(f for f in os.listdir(base) if f.endswith(".npy"))
            same = files and all(read_npy(os.path.join(base, f))[1] == read_npy(os.path.join(d, f))[1] for f in files)
            check(same, f"group {group}, {label}: every dumped tensor ({len(files)}) bit for bit as with rows alone",
                  f"{base} vs {d}")


interleaved_rows_case()


# Rows that no group of 8 or more divides (ZAYA1-VL's 3420-wide vision MLP: groups of 4 would take as many
# bytes as bf16, off the fast int8 kernels) stay bf16 in an int8 blob; the others are int8 as usual.
def odd_rows_case():
    sys.path.insert(0, ROOT)
    from zaya_compare.legit import Blob
    tok = small_tokenizer(tokenizer_dir(), os.path.join(BUILD, "odd_rows_tokenizer_1000"))
    ckpt, blob = os.path.join(BUILD, "odd_rows_ckpt"), os.path.join(BUILD, "odd_rows_int8.bin")
    rc, _, err = run([sys.executable, "tools/make_checkpoint.py", ckpt, "--hidden", "64", "--layers", "1", "--heads", "2",
                      "--kv-heads", "1", "--head-dim", "32", "--experts", "2", "--moe-intermediate", "36",
                      "--router-hidden", "16", "--vocab", "1000", "--tokenizer-dir", tok, "--force", "--quiet"])
    if not check(rc == 0, "make_checkpoint: experts 36 wide (down_proj rows: groups of 4 at most)", err[-400:]):
        return
    rc, out, err = run([sys.executable, "export_weights.py", ckpt, blob, "--dtype", "int8", "--chat-format", "none"])
    if not check(rc == 0, "export it (int8)", err[-400:]):
        return
    dtypes = {n: (e[0], e[1][-1]) for n, e in Blob(blob).dir.items() if len(e[1]) >= 2 and ".conv_qk" not in n}
    odd = sorted(n for n, (_, w) in dtypes.items() if w % 8)
    check(odd and all(dtypes[n][0] == 1 for n in odd) and "kept in bf16" in out,
          f"int8 export: the {len(odd)} matrix with rows of 36 is bf16, and the log says so",
          f"{[(n, dtypes[n]) for n in odd]}")
    check(all(d == 2 for n, (d, w) in dtypes.items() if w % 8 == 0 and ".experts." in n),
          "int8 export: the experts' gate_up_proj (rows of 64) stays int8", str(dtypes))
    rc, _, err = run(["./zaya", blob, "--ids", "2,17,300,45", "-n", "2", "-t", "0"])
    check(rc == 0, "./zaya runs the blob with bf16 and int8 matrices", err[-300:])


def weight_bytes(blob):     # the file without its tokenizer section (header offset 64: its size)
    import struct
    with open(blob, "rb") as f:
        f.seek(64)
        return os.path.getsize(blob) - struct.unpack("<Q", f.read(8))[0]


ratio = os.path.getsize(q8_blob) / os.path.getsize(fp32_blob)
wratio = weight_bytes(q8_blob) / weight_bytes(fp32_blob)
print(f"   int8 / fp32 blob size: {ratio:.3f} whole files, {wratio:.3f} without the 29 MB tokenizer section "
      "(the fixture's float32 conv weights are a large share of so small a model; ZAYA1-8B, both with the tokenizer, group size 64: 9.54 / 35.39 GB = 0.270, measured with tools/make_checkpoint.py)")
odd_rows_case()
finish()
