#!/usr/bin/env python3
"""test_quantized.py - FP8-Experts / MXFP4-Experts checkpoints: the exporter and the native blobs.

    make zaya && python3 test/test_quantized.py

A small bf16 checkpoint (tools/make_checkpoint.py: hidden 64, expert width 64, 3 experts, 2 layers,
vocab 1000; 64 is a multiple of MXFP4's 32-input groups, the compact fixture's 16 and 24 are not) is
quantized by test/make_quantized_checkpoint.py, which also writes the same model with its experts
replaced by its own unpacking of the quantized values (the bf16 weights the official code
materialises). Checked:
- pack -> unpack -> same values (the generator's self test);
- the exporter's bf16 / fp32 / int8 exports of each quantized checkpoint hold exactly the tensors of
  the same exports of the dequantized twin (FP8 with bf16 and f32 row scales, MXFP4; stacked,
  per-expert and gate_proj/up_proj names; the legacy layout), and equal the native-layout export;
- ./zaya on both blobs: the same logits bit for bit and the same greedy tokens; the experts matter
  (the logits differ from the unquantized model's);
- the native blob dtypes (docs/blob-format.md, format version 2) unpack to the same bf16 values;
- native blobs (--keep-quantized-experts: FP8 with bf16, f32 and f16 scales, MXFP4; stacked, split and
  legacy names): version 2, the experts in dtype 3 / 4 with the field at 188, the other matrices in
  --dtype; they load (also with --verify), dump and generate, and ./zaya's logits and greedy tokens
  equal those on the dequantized export bit for bit at 1 and 2 threads, and zaya_debug's (portable C
  kernels) equal ./zaya's; int8 + MXFP4 experts runs;
- the loader refuses corrupted native entries (field 188, byte size, MXFP4 rows not a multiple of 32,
  FP8 on a non-expert tensor, the new dtypes in a version-1 blob, and with --verify a NaN FP8 byte /
  E8M0 byte 255), naming the tensor, expected and found;
- the generator's --random-experts (benchmark) mode gives checkpoints that export and generate;
- refusals: each malformed checkpoint is refused with one message naming the tensor or config key,
  expected and found, exit status 1 and no traceback.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

from harness import BUILD, ROOT, check, finish, run, read_npy, tokenizer_dir

sys.path.insert(0, os.path.join(ROOT, "test"))
sys.path.insert(0, ROOT)
import export_weights as ew  # noqa: E402
import make_quantized_checkpoint as mq  # noqa: E402
from test_dims import small_tokenizer  # noqa: E402

OUT = os.path.join(BUILD, "quantized")
DIMS = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--experts", "3",
        "--moe-intermediate", "64", "--router-hidden", "16", "--vocab", "1000", "--layer-types", "hybrid,hybrid_sliding",
        "--sliding-window", "5", "--seed", "3"]
IDS = "2,17,230,45,901,66,7,388,512,9"


def sh(cmd, label):
    rc, out, err = run(cmd)
    check(rc == 0, label, (err or out).strip()[-600:])
    return rc == 0, out, err


def export(ck, blob, *flags):
    return run(["python3", "export_weights.py", ck, blob, "--chat-format", "none", *flags])


def blob_body(path):
    """Everything but the provenance (which names the source folder): header config, directory, data."""
    with open(path, "rb") as f:
        b = f.read()
    return b[:12] + b[16:512] + b[1024:]      # the CRC at 12 covers the provenance too


def zaya_logits(blob, d):
    shutil.rmtree(d, ignore_errors=True)
    rc, _, err = run(["./zaya", blob, "--ids", IDS, "--dump", d, "--dump-filter", "^logits$"])
    if rc != 0:
        return None, err
    return read_npy(os.path.join(d, "logits.npy"))[1], err


def greedy(blob):
    rc, out, err = run(["./zaya", blob, "--ids", IDS, "-n", "8", "-t", "0", "--print-ids"])
    return out.strip() if rc == 0 else f"error: {err.strip()[-200:]}"


def main():
    tokdir = tokenizer_dir()
    os.makedirs(OUT, exist_ok=True)
    rc, _, err = run(["make", "zaya"])
    if not check(rc == 0, "make zaya", err[-400:]):
        finish()

    # 1. pack -> unpack round trip (the generator's own checks, which follow compressed-tensors' code)
    p = subprocess.run([sys.executable, "test/make_quantized_checkpoint.py", "--selftest"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout.splitlines():
        check(line.startswith("PASS "), "round trip: " + line[5:].split(":")[0], line)
    check(p.returncode == 0 and "PASS" in p.stdout, "make_quantized_checkpoint.py --selftest exits 0", p.stdout[-300:])

    # 2. a small bf16 checkpoint in both layouts
    tok = small_tokenizer(tokdir, os.path.join(OUT, "tokenizer_1000"))
    base = {}
    for lay in ("native", "legacy"):
        base[lay] = os.path.join(OUT, f"base_{lay}")
        sh(["python3", "tools/make_checkpoint.py", base[lay], "--layout", lay, *DIMS, "--tokenizer-dir", tok,
            "--force", "--quiet"], f"make_checkpoint.py ({lay}, hidden 64, expert width 64)")
    base_blob = os.path.join(OUT, "base.bin")
    sh(["python3", "export_weights.py", base["native"], base_blob, "--chat-format", "none", "--dtype", "bf16"],
       "export of the unquantized model")
    base_logits, _ = zaya_logits(base_blob, os.path.join(OUT, "base_dump"))

    # 3. quantized checkpoints against their dequantized twins
    cases = [("fp8_stacked_bf16", "native", ["--format", "fp8", "--names", "stacked"]),
             ("fp8_split_f32", "native", ["--format", "fp8", "--names", "split", "--scale-dtype", "f32"]),
             ("fp8_legacy_f16", "legacy", ["--format", "fp8", "--scale-dtype", "f16"]),
             ("mxfp4_stacked", "native", ["--format", "mxfp4", "--names", "stacked"]),
             ("mxfp4_per_expert", "native", ["--format", "mxfp4", "--names", "per-expert"]),
             ("mxfp4_legacy", "legacy", ["--format", "mxfp4"])]
    blobs = {}
    for name, lay, flags in cases:
        q, dq = os.path.join(OUT, f"q_{name}"), os.path.join(OUT, f"dq_{name}")
        for d in (q, dq):
            shutil.rmtree(d, ignore_errors=True)
        ok, _, _ = sh(["python3", "test/make_quantized_checkpoint.py", base[lay], q, *flags, "--dequantized-out", dq,
                       "--quiet"], f"{name}: make_quantized_checkpoint.py")
        if not ok:
            continue
        # FP8 with f32 / f16 row scales dequantizes to f32 / f16 values, which a bf16 blob cannot hold
        wide = "--scale-dtype" in flags
        main_dtype = "fp32" if wide else "bf16"
        for dtype in ("bf16", "fp32", "int8"):
            qb, db = os.path.join(OUT, f"q_{name}_{dtype}.bin"), os.path.join(OUT, f"dq_{name}_{dtype}.bin")
            rc1, out1, err1 = export(q, qb, "--dtype", dtype)
            rc2, _, err2 = export(dq, db, "--dtype", dtype)
            if wide and dtype == "bf16":
                refused = "bf16 cannot hold exactly"
                check(rc1 == 1 and rc2 == 1 and refused in err1 and refused in err2, f"{name}: --dtype bf16 is refused "
                      "for both (the official weights are the exact products rounded to the scale's dtype)",
                      f"exit {rc1} / {rc2}: {(err1 + err2).strip()[-300:]}")
                continue
            if not check(rc1 == 0 and rc2 == 0, f"{name}: --dtype {dtype} exports of the quantized checkpoint and its "
                         "dequantized twin", (err1 or err2).strip()[-500:]):
                continue
            if dtype == main_dtype:
                check("quantized experts: " + flags[1] in out1, f"{name}: the exporter says it recognised {flags[1]} experts",
                      out1[:300])
            a, b = ew_tensors(qb), ew_tensors(db)
            diff = [n for n in a if a[n] != b.get(n)]
            check(not diff and blob_body(qb) == blob_body(db), f"{name}: --dtype {dtype}: every tensor equals the "
                  "dequantized twin's (the exporter dequantizes exactly as the official code does)",
                  f"{len(diff)} differ, first {diff[:3]}")
            blobs[(name, dtype)] = qb
        qb, db = os.path.join(OUT, f"q_{name}_{main_dtype}.bin"), os.path.join(OUT, f"dq_{name}_{main_dtype}.bin")
        if (name, main_dtype) not in blobs:
            continue
        la, erra = zaya_logits(qb, os.path.join(OUT, f"q_{name}_dump"))
        lb, errb = zaya_logits(db, os.path.join(OUT, f"dq_{name}_dump"))
        check(la is not None and la == lb, f"{name}: ./zaya logits on the quantized checkpoint's {main_dtype} export "
              "equal those on the dequantized twin's bit for bit", (erra or errb).strip()[-300:])
        check(la is not None and base_logits is not None and la != base_logits,
              f"{name}: the experts are used (logits differ from the unquantized model's)")
        ga, gb = greedy(qb), greedy(db)
        check(ga == gb and not ga.startswith("error"), f"{name}: the same 8 greedy tokens ({ga})", f"{ga} vs {gb}")

    # both layouts of one format give the same blob (same seed, same rows quantized alike)
    for fmt, nat, leg in (("mxfp4", "mxfp4_stacked", "mxfp4_legacy"),):
        a, b = blobs.get((nat, "bf16")), blobs.get((leg, "bf16"))
        check(a and b and ew_tensors(a) == ew_tensors(b), f"{fmt}: native and legacy quantized checkpoints export to "
              "the same tensors")
    fp8a, fp8b = blobs.get(("fp8_stacked_bf16", "fp32")), blobs.get(("fp8_stacked_bf16", "bf16"))
    if fp8a and fp8b:
        a, b = ew_tensors(fp8a), ew_tensors(fp8b)
        n = "model.layers.1.mlp.experts.down_proj"
        check(a[n] == ew.bf16_to_f32(b[n]), "fp8: the fp32 export holds the bf16 dequantized weights widened exactly")

    # the benchmark mode: random codes instead of quantized weights, exported and run
    for fmt in ("fp8", "mxfp4"):
        r, rb = os.path.join(OUT, f"random_{fmt}"), os.path.join(OUT, f"random_{fmt}.bin")
        ok, _, _ = sh(["python3", "test/make_quantized_checkpoint.py", base["native"], r, "--format", fmt,
                       "--random-experts", "--seed", "4", "--quiet"], f"{fmt}: --random-experts checkpoint")
        if ok and sh(["python3", "export_weights.py", r, rb, "--chat-format", "none", "--dtype", "int8"],
                     f"{fmt}: --random-experts checkpoint exports to int8")[0]:
            g = greedy(rb)
            check(len(g.split(",")) == 8, f"{fmt}: --random-experts blob generates 8 tokens ({g})", g)

    partial_reads(os.path.join(OUT, "q_mxfp4_stacked"))
    partial_reads(os.path.join(OUT, "q_fp8_split_f32"))
    for case in ("fp8_stacked_bf16", "fp8_split_f32", "fp8_legacy_f16", "mxfp4_per_expert", "mxfp4_legacy"):
        native_payloads(case)
    if os.path.isdir(os.path.join(OUT, "q_mxfp4_stacked")) and os.path.isdir(os.path.join(OUT, "q_mxfp4_legacy")):
        nat, leg = dequantized_where(os.path.join(OUT, "q_mxfp4_stacked")), dequantized_where(os.path.join(OUT, "q_mxfp4_legacy"))
        a = b"".join(ew.native_expert_chunks(nat["model.layers.1.mlp.experts.gate_up_proj"],
                                             ["model.layers.1.mlp.experts.gate_up_proj"])[3])
        srcs = [f"model.layers.3.zaya_block.experts.local_experts.{e}.linear_fc1.weight" for e in range(3)]
        b = b"".join(ew.native_expert_chunks(leg[srcs[0]], srcs)[3])
        check(a == b, "mxfp4: the native payload of layer 1's gate_up_proj is the same from the stacked and the "
              "legacy (per-expert) checkpoint")
    proposed_blob_dtypes()
    native_blobs(cases, blobs)
    refusals(base["native"])
    finish()


def ew_tensors(blob):
    """{name: raw bytes} of a blob's tensors (directory per docs/blob-format.md)."""
    with open(blob, "rb") as f:
        b = f.read()
    n = struct.unpack_from("<I", b, 32)[0]
    out = {}
    for i in range(n):
        e = b[1024 + 192 * i:1024 + 192 * (i + 1)]
        name = e[:128].rstrip(b"\0").decode()
        off, size = struct.unpack_from("<QQ", e, 168)
        out[name] = b[off:off + size]
    return out


def dequantized_where(ck):
    """The exporter's view of a quantized checkpoint: tensor name -> file, quantized experts dequantized."""
    cfg_path = os.path.join(ck, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    where = ew.open_checkpoint(ck)
    layout = ew.detect_layout(cfg, where)
    c = ew.native_config(cfg, cfg_path) if layout == "native" else ew.legacy_to_native_config(cfg, cfg_path)
    return ew.quantized_experts(cfg, cfg_path, where, layout, c, False, lambda *a: None)


def native_payloads(case):
    """docs/blob-format.md, format version 2: the payload native_expert_chunks streams from a real
    quantized checkpoint decodes (with this test's own reading of the layout) to the dequantized twin."""
    q, dq = os.path.join(OUT, f"q_{case}"), os.path.join(OUT, f"dq_{case}")
    if not (os.path.isdir(q) and os.path.isdir(dq)):
        check(False, f"{case}: native payload check has its checkpoints")
        return
    where, twin = dequantized_where(q), mq.read_checkpoint(dq)
    bad, n = [], 0
    for name, st in where.items():
        if not isinstance(st, ew.DequantizedExperts):
            continue
        code, field, nbytes, chunks = ew.native_expert_chunks(st, [name])
        blob = b"".join(chunks)
        dtype, shape = st.tensors[name][:2]
        cols = shape[-1]
        rows = st.tensors[name][3] // ew.ST_DTYPE_SIZE[dtype] // cols
        if code == 3:
            vend = ew.align(rows * cols, 64)
            scales = struct.unpack_from(f"<{rows}f", blob, vend)
            rnd = mq.ROUND[{0: "f32", 1: "bf16", 5: "f16"}[field]]
            vals = [rnd(mq.fp8_decode(blob[i]) * scales[i // cols]) for i in range(rows * cols)]
            size_ok = nbytes == len(blob) == vend + 4 * rows
        else:
            vend = ew.align(rows * cols // 2, 64)
            vals = mq.dequantize_mxfp4(blob[:rows * cols // 2], blob[vend:vend + rows * cols // 32])
            size_ok = nbytes == len(blob) == vend + rows * cols // 32 and field == 32
        want = mq.read_bytes(twin[name])
        got = mq.pack_values(vals, twin[name][1])
        n += 1
        if not size_ok or got != want:
            bad.append(name)
    check(n > 0 and not bad, f"{case}: the native payloads of its {n} expert tensors (streamed from the "
          "checkpoint) decode to the dequantized twin", f"differ: {bad[:3]}")


def partial_reads(ck):
    """The exporter streams tensors in chunks: any byte range of a dequantized tensor equals the same
    slice of the whole (ranges cutting rows and crossing module boundaries included)."""
    where = dequantized_where(ck)
    bad = []
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        st = where[name]
        size = st.tensors[name][3]
        whole = st.read(name, 0, size)
        for step in (2, 4 * 6, 130, 8190, size // 3 // 4 * 4):
            if b"".join(st.read(name, b, b + step) for b in range(0, size, step)) != whole:
                bad.append((name, step))
    check(not bad, f"{os.path.basename(ck)}: reads in pieces of 2, 24, 130, 8190 and a third of the tensor "
          "give the whole tensor's bytes", f"differ: {bad}")


def directory(blob):
    """[(entry offset, name, dtype, shape, data offset, nbytes, field 188)] of a blob and its version."""
    with open(blob, "rb") as f:
        b = f.read()
    version, n = struct.unpack_from("<I", b, 8)[0], struct.unpack_from("<I", b, 32)[0]
    out = []
    for i in range(n):
        at = 1024 + 192 * i
        e = b[at:at + 192]
        dtype, nd, *shape = struct.unpack_from("<II4Q", e, 128)
        off, nbytes, _, field = struct.unpack_from("<QQII", e, 168)
        out.append((at, e[:128].rstrip(b"\0").decode(), dtype, shape[:nd], off, nbytes, field))
    return version, out


def patched(src, dst, edits, fix_tensor_crc=None):
    """A copy of blob src with (offset, bytes) edits, the named tensor's CRC-32 and the header CRC redone."""
    import zlib
    with open(src, "rb") as f:
        b = bytearray(f.read())
    for off, raw in edits:
        b[off:off + len(raw)] = raw
    n = struct.unpack_from("<I", b, 32)[0]
    if fix_tensor_crc:
        for i in range(n):
            at = 1024 + 192 * i
            if b[at:at + 128].rstrip(b"\0").decode() == fix_tensor_crc:
                off, nbytes = struct.unpack_from("<QQ", b, at + 168)
                struct.pack_into("<I", b, at + 184, zlib.crc32(bytes(b[off:off + nbytes])))
    struct.pack_into("<I", b, 12, 0)
    struct.pack_into("<I", b, 12, zlib.crc32(bytes(b[:1024 + 192 * n])))
    with open(dst, "wb") as f:
        f.write(b)
    return dst


def native_blobs(cases, blobs):
    """--keep-quantized-experts: format version 2 blobs run by the engine, against the dequantized exports."""
    flags_of = {name: flags for name, _, flags in cases}
    natives = {}
    for name in ("fp8_stacked_bf16", "fp8_split_f32", "fp8_legacy_f16", "mxfp4_stacked", "mxfp4_legacy"):
        q = os.path.join(OUT, f"q_{name}")
        wide = "--scale-dtype" in flags_of[name]
        ref = blobs.get((name, "fp32" if wide else "bf16"))
        if not (os.path.isdir(q) and ref):
            check(False, f"{name}: native blob checks have the checkpoint and its dequantized export")
            continue
        nb = os.path.join(OUT, f"native_{name}.bin")
        rc, out, err = export(q, nb, "--dtype", "bf16", "--keep-quantized-experts")
        if not check(rc == 0 and "format version 2" in out, f"{name}: --keep-quantized-experts --dtype bf16 exports",
                     (err or out).strip()[-400:]):
            continue
        natives[name] = nb
        fp8 = name.startswith("fp8")
        field = {"f32": 0, "f16": 5}.get(flags_of[name][-1], 1) if fp8 else 32
        version, ents = directory(nb)
        experts = [e for e in ents if ".mlp.experts." in e[1]]
        others = [e for e in ents if e[1].endswith(("proj.weight", "embed_tokens.weight")) and ".mlp.gate." not in e[1]]
        numel = [e[3][0] * e[3][1] * e[3][2] for e in experts]
        sizes = [ew.align(k, 64) + 4 * k // e[3][2] if fp8 else ew.align(k // 2, 64) + k // 32 for k, e in zip(numel, experts)]
        check(version == 2 and len(experts) == 4 and all(e[2] == (3 if fp8 else 4) and e[6] == field for e in experts)
              and [e[5] for e in experts] == sizes and others and all(e[2] == 1 for e in others),
              f"{name}: version 2, experts dtype {3 if fp8 else 4} with field 188 = {field} and their byte sizes, "
              "the other matrices bf16",
              f"version {version}, experts {[(e[1], e[2], e[5], e[6]) for e in experts][:2]}, sizes {sizes[:2]}")
        ref_logits, _ = zaya_logits(ref, os.path.join(OUT, f"ref_{name}_dump"))
        for threads in ("1", "2"):
            d = os.path.join(OUT, f"native_{name}_dump")
            shutil.rmtree(d, ignore_errors=True)
            rc, _, err = run(["./zaya", nb, "--ids", IDS, "--threads", threads, "--verify", "--dump", d,
                              "--dump-filter", "^logits$"])
            got = read_npy(os.path.join(d, "logits.npy"))[1] if rc == 0 else None
            check(got is not None and got == ref_logits, f"{name}: ./zaya --verify --dump --threads {threads}: logits on "
                  f"the native blob equal those on the dequantized {'fp32' if wide else 'bf16'} export bit for bit",
                  err.strip()[-300:])
            rc, out, err = run(["./zaya", nb, "--ids", IDS, "-n", "8", "-t", "0", "--print-ids", "--threads", threads])
            want = greedy(ref)
            check(rc == 0 and out.strip() == want, f"{name}: --threads {threads}: the same 8 greedy tokens as the "
                  f"dequantized export ({want})", f"{out.strip()} vs {want}; {err.strip()[-200:]}")
    # the portable C kernels (zaya_debug: no -march, ASan + UBSan) give the same bits as the SIMD build
    debug = check(os.path.exists(os.path.join(ROOT, "zaya_debug")), "zaya_debug exists", "run: make zaya_debug")
    for name in ("fp8_legacy_f16", "mxfp4_stacked"):
        if name not in natives or not debug:
            continue
        want, _ = zaya_logits(natives[name], os.path.join(OUT, f"native_{name}_dump"))
        d = os.path.join(OUT, f"native_{name}_debug_dump")
        shutil.rmtree(d, ignore_errors=True)
        rc, _, err = run(["./zaya_debug", natives[name], "--ids", IDS, "--dump", d, "--dump-filter", "^logits$"])
        got = read_npy(os.path.join(d, "logits.npy"))[1] if rc == 0 else None
        check(got is not None and got == want, f"{name}: zaya_debug (portable C kernels, sanitizers) gives the native "
              "blob's logits bit for bit", err.strip()[-300:])
    # int8 everywhere else + native MXFP4 experts (the mix of the size argument): exports, loads, generates
    q = os.path.join(OUT, "q_mxfp4_stacked")
    if os.path.isdir(q) and "mxfp4_stacked" in natives:
        nb = os.path.join(OUT, "native_mxfp4_int8.bin")
        rc, out, err = export(q, nb, "--dtype", "int8", "--keep-quantized-experts")
        if check(rc == 0, "mxfp4: --keep-quantized-experts --dtype int8 exports", err.strip()[-300:]):
            _, ents = directory(nb)
            a, b = ew_tensors(nb), ew_tensors(natives["mxfp4_stacked"])
            ex = [e[1] for e in ents if ".mlp.experts." in e[1]]
            check(all(e[2] == 2 for e in ents if e[1].endswith("o_proj.weight")) and all(a[n] == b[n] for n in ex),
                  "mxfp4 + int8: the other matrices int8, the expert tensors the same bytes as with --dtype bf16")
            g = greedy(nb)
            check(len(g.split(",")) == 8, f"mxfp4 + int8: the native blob generates 8 tokens ({g})", g)
            want, _ = zaya_logits(nb, os.path.join(OUT, "native_mxfp4_int8_dump"))
            d = os.path.join(OUT, "native_mxfp4_int8_huge_dump")
            shutil.rmtree(d, ignore_errors=True)
            rc, _, err = run(["./zaya", nb, "--hugepages", "--ids", IDS, "--dump", d, "--dump-filter", "^logits$"])
            got = read_npy(os.path.join(d, "logits.npy"))[1] if rc == 0 else None
            check(want is not None and got == want, "mxfp4 + int8: --hugepages (int8 rows interleaved, the experts as "
                  "stored) gives the same logits bit for bit", err.strip()[-300:])
    # bench/bytes_per_token.py counts the new dtypes: 4.25 bits per MXFP4 expert weight
    if "mxfp4_stacked" in natives:
        rc, out, err = run(["python3", "bench/bytes_per_token.py", natives["mxfp4_stacked"]])
        m = dict(kv.split("=") for kv in out.split()[1:]) if rc == 0 else {}
        want = 2 * (2 * 64 * 64 + 64 * 64) * 17 // 32    # 2 layers, one expert: gate_up [128, 64] + down [64, 64]
        check(m.get("experts") == str(want), f"bytes_per_token.py: MXFP4 experts count 17/32 byte per weight ({want})",
              f"{out.strip()} {err.strip()}")
    native_refusals(natives)


def native_refusals(natives):
    """The loader refuses corrupted version-2 entries with a message naming what, where, expected, found."""
    if "fp8_stacked_bf16" not in natives or "mxfp4_stacked" not in natives:
        check(False, "native refusal checks: the native blobs exist")
        return
    fp8, mx = natives["fp8_stacked_bf16"], natives["mxfp4_stacked"]
    _, ef = directory(fp8)
    _, em = directory(mx)
    f_ex = next(e for e in ef if e[1] == "model.layers.0.mlp.experts.down_proj")
    m_ex = next(e for e in em if e[1] == "model.layers.0.mlp.experts.gate_up_proj")
    o = next(e for e in ef if e[1] == "model.layers.0.self_attn.o_proj.weight")
    u32, u64 = (lambda v: struct.pack("<I", v)), (lambda v: struct.pack("<Q", v))
    m_numel = m_ex[3][0] * m_ex[3][1] * m_ex[3][2]
    cases = [
        ("FP8 scale dtype 2 in field 188", fp8, [(f_ex[0] + 188, u32(2))], [], None,
         [f_ex[1], "scale dtype 2", "expected: 0 (f32), 1 (bf16) or 5 (f16)", "found"]),
        ("MXFP4 group 16 in field 188", mx, [(m_ex[0] + 188, u32(16))], [], None, [m_ex[1], "group 16", "expected", "found"]),
        ("FP8 byte size 64 too big", fp8, [(f_ex[0] + 176, u64(f_ex[5] + 64))], [], None,
         [f_ex[1], "byte size", f"expected: {f_ex[5]}", f"found:    {f_ex[5] + 64}"]),
        ("MXFP4 rows of 48 values", mx, [(m_ex[0] + 136 + 16, u64(48)),
                                          (m_ex[0] + 176, u64(ew.align(m_numel * 3 // 8, 64) + m_numel * 3 // 4 // 32))],
         [], None, [m_ex[1], "rows of 48", "multiple of 32", "found"]),
        ("FP8 on a non-expert tensor (o_proj)", fp8,
         [(o[0] + 128, u32(3)), (o[0] + 176, u64(ew.align(64 * 64, 64) + 4 * 64)), (o[0] + 188, u32(1))], [], None,
         [o[1], "dtype 3 (FP8)", "only for mlp.experts", "found"]),
        ("FP8 experts in a version-1 blob", fp8, [(8, u32(1))], [], None, ["dtype 3", "expected: dtype 0..2 (format version 1)"]),
        ("--verify: a NaN FP8 byte (0x7f)", fp8, [(f_ex[4] + 3, b"\x7f")], ["--verify"], f_ex[1],
         [f_ex[1], "NaN FP8 E4M3 byte 0x7f", "expert 0, row 0, column 3", "expected"]),
        ("--verify: an E8M0 byte 255", mx, [(m_ex[4] + ew.align(m_numel // 2, 64) + 5, b"\xff")], ["--verify"], m_ex[1],
         [m_ex[1], "255", "expert 0, row 2, columns 32..63", "expected: exponent bytes 0..254"]),
    ]
    for i, (label, src, edits, flags, fix, words) in enumerate(cases):
        bad = patched(src, os.path.join(OUT, f"native_bad_{i}.bin"), edits, fix)
        rc, out, err = run(["./zaya", bad, "--ids", "2,3", "-n", "1", *flags])
        ok = rc != 0 and all(w in err for w in words) and "hint" in err and "Sanitizer" not in err
        check(ok, f"loader refuses: {label}", f"exit {rc}, stderr: {err.strip()[-400:]}")
        if flags:   # the same file without --verify loads (the bytes are only checked by --verify)
            rc, _, err = run(["./zaya", bad, "--ids", "2,3", "-n", "1"])
            check(rc == 0, f"without --verify the blob of '{label}' loads (CRC-32 matches)", err.strip()[-200:])


def proposed_blob_dtypes():
    """docs/blob-format.md, format version 2: the packed bytes unpack to the exporter's dequantization."""
    import random
    rng = random.Random(5)
    rows, cols = 6, 64
    codes = bytes(rng.choice([c for c in range(256) if c & 0x7F != 0x7F]) for _ in range(rows * cols))
    scales = [mq.bf16_round(rng.uniform(1e-4, 1e-2)) for _ in range(rows)]
    blob = ew.pack_blob_fp8_rows(codes, scales)
    vals_end = ew.align(rows * cols, ew.ALIGN)
    got_scales = struct.unpack_from(f"<{rows}f", blob, vals_end)
    ok = len(blob) == vals_end + 4 * rows and blob[:rows * cols] == codes and list(got_scales) == scales
    want = b"".join(b"".join(map(ew.fp8_row_table(s, "BF16", "test").__getitem__, codes[r * cols:(r + 1) * cols]))
                    for r, s in enumerate(scales))
    mine = mq.bf16_bytes([mq.bf16_round(mq.fp8_decode(blob[i]) * got_scales[i // cols]) for i in range(rows * cols)])
    check(ok and mine == want, "dtype fp8_e4m3_rows: values, padding to 64, fp32 row scales; unpacks to the "
          "exporter's dequantization")
    packed = bytes(rng.randrange(256) for _ in range(rows * cols // 2))
    exps = bytes(rng.randrange(100, 140) for _ in range(rows * cols // 32))
    blob = ew.pack_blob_mxfp4(packed, exps)
    vend = ew.align(len(packed), ew.ALIGN)
    mine = mq.bf16_bytes(mq.dequantize_mxfp4(blob[:len(packed)], blob[vend:vend + len(exps)]))
    want = b"".join(x for g, e in enumerate(exps) for x in map(ew.mxfp4_byte_table(e, "test").__getitem__,
                                                                 packed[16 * g:16 * (g + 1)]))
    check(len(blob) == vend + len(exps) and mine == want, "dtype mxfp4: packed bytes, padding to 64, E8M0 "
          "bytes; unpacks to the exporter's dequantization")


def rewrite(src, dst, edit_tensors=None, edit_config=None):
    """A copy of checkpoint src with its tensors {name: [dtype, shape, bytes]} and config edited."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    ck = mq.read_checkpoint(src)
    t = {n: [ck[n][1], list(ck[n][2]), mq.read_bytes(ck[n])] for n in ck}
    if edit_tensors:
        edit_tensors(t)
    w = mq.SafetensorsWriter(os.path.join(dst, "model.safetensors"), [(n, v[0], v[1]) for n, v in t.items()])
    for n, v in t.items():
        w.write(v[2])
    w.close()
    if edit_config:
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        edit_config(cfg)
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f)
    return dst


def refusals(base):
    fp8, mx = os.path.join(OUT, "q_fp8_stacked_bf16"), os.path.join(OUT, "q_mxfp4_stacked")
    if not (os.path.isdir(fp8) and os.path.isdir(mx)):
        check(False, "refusal checks: quantized checkpoints exist")
        return
    L0 = "model.layers.0.mlp.experts."

    def groups(cfg):
        return cfg["quantization_config"]["config_groups"]["group_0"]

    def setw(key, val):
        return lambda cfg: groups(cfg)["weights"].__setitem__(key, val)

    def nan_code(t):
        t[L0 + "down_proj.weight"][2] = b"\x7f" + t[L0 + "down_proj.weight"][2][1:]

    def nan_scale(t):
        t[L0 + "down_proj.weight_scale"][2] = b"\xff" + t[L0 + "down_proj.weight_scale"][2][1:]

    def as_bf16(t):           # FP8 values stored as bf16
        v = t[L0 + "down_proj.weight"]
        t[L0 + "down_proj.weight"] = ["BF16", v[1], v[2] + v[2]]

    def scale_shape(t):       # one scale per tensor instead of per row
        v = t[L0 + "down_proj.weight_scale"]
        t[L0 + "down_proj.weight_scale"] = [v[0], [3, 1, 1], v[2][:6]]

    def extra(t):
        t[L0 + "down_proj.weight_zero_point"] = ["U8", [3, 64, 2], bytes(384)]

    def outside(t):
        v = t["model.layers.0.self_attn.o_proj.weight"]
        t["model.layers.0.self_attn.o_proj.weight"] = ["F8_E4M3", v[1], v[2][:len(v[2]) // 2]]

    cases = [
        ("unknown quant_method", fp8, None,
         lambda c: c["quantization_config"].__setitem__("quant_method", "gptq"), [], "unsupported quantization method"),
        ("FP8 per-tensor strategy", fp8, None, setw("strategy", "tensor"), [], "unsupported quantization scheme"),
        ("FP8 asymmetric", fp8, None, setw("symmetric", False), [], "unsupported quantization scheme"),
        ("MXFP4 group size 16", mx, None, setw("group_size", 16), [], "unsupported quantization scheme"),
        ("MXFP4 with input activations", mx, None,
         lambda c: groups(c).__setitem__("input_activations", {"num_bits": 4, "type": "float", "dynamic": True}), [],
         "MXFP4 input activations are not supported"),
        ("FP8 static input activations", fp8, None,
         lambda c: groups(c).__setitem__("input_activations", {"num_bits": 8, "type": "float", "dynamic": False}), [],
         "static FP8 input activations"),
        ("quantization_status frozen", fp8, None,
         lambda c: c["quantization_config"].__setitem__("quantization_status", "frozen"), [], "unsupported quantization status"),
        ("no quantization_config but FP8 tensors", fp8, None, lambda c: c.pop("quantization_config"), [],
         "unsupported tensor dtype"),
        ("FP8 config on an MXFP4 checkpoint", mx, None,
         lambda c: c.__setitem__("quantization_config", mq.quantization_config("fp8")), [], "quantized expert weights not found"),
        ("missing scale tensor", fp8, lambda t: t.pop(L0 + "gate_up_proj.weight_scale"), None, [],
         "missing tensor of a quantized expert"),
        ("FP8 values stored as bf16", fp8, as_bf16, None, [], "quantized expert tensor has the wrong dtype"),
        ("per-tensor scale shape", fp8, scale_shape, None, [], "quantized expert tensor has the wrong shape"),
        ("an extra weight_zero_point", mx, extra, None, [], "unsupported tensor of a quantized expert"),
        ("a quantized tensor outside the experts", fp8, outside, None, [], "a quantized tensor outside the experts"),
        ("an FP8 NaN weight byte", fp8, nan_code, None, [], "is NaN"),
        ("an E8M0 NaN scale byte (0xff)", mx, nan_scale, None, [], "0xFF is NaN"),
        ("--keep-quantized-experts: an FP8 NaN weight byte", fp8, nan_code, None, ["--keep-quantized-experts"], "is NaN"),
        ("--keep-quantized-experts: an E8M0 NaN scale byte", mx, nan_scale, None, ["--keep-quantized-experts"], "0xFF is NaN"),
    ]
    for i, (label, src, et, ec, flags, want) in enumerate(cases):
        d = rewrite(src, os.path.join(OUT, f"bad_{i}"), et, ec) if (et or ec) else src
        rc, out, err = export(d, os.path.join(OUT, f"bad_{i}.bin"), "--dtype", "bf16", *flags)
        ok = rc == 1 and want in err and "Traceback" not in err and "where:" in err
        check(ok, f"refused: {label} ({want!r})", f"exit {rc}, stderr: {err.strip()[-400:]}")
    # an MXFP4 row length that is not a multiple of 32, straight through the module check
    try:
        ew.check_quantized_module({}, "mxfp4", "m", 8, 48, 0)
        check(False, "refused: MXFP4 rows of 48 inputs", "no error")
    except ew.ExportError as e:
        check("not a multiple of 32" in str(e), "refused: MXFP4 rows of 48 inputs (not a multiple of 32)", str(e))


if __name__ == "__main__":
    main()
