#!/usr/bin/env python3
"""test_formats.py - golden data in the forms porters use (docs/golden-formats.md).

    make zaya && python3 test/test_formats.py

On the compact fixture (native checkpoint, fp32) and its prompt:
- streaming --dump DIR: the same bytes whatever the batch size (--batch 1, 5, 256 make the taps arrive
  in different interleavings); every .npy is exactly the NumPy 1.0 file of its content; index.json's
  stats are those of the data; --dump-filter keeps a subset with the same bytes;
- a dump that did not finish is recognisably incomplete: a run that fails on a file (a folder standing
  where logits.npy goes) or is killed by the file-size limit (SIGXFSZ) leaves no index.json (an earlier
  run's is removed first), a killed .safetensors run leaves a header length of 0; compare.py says
  "incomplete" for those, for a safetensors file cut short and for one whose header was zeroed;
- --dump FILE.safetensors, read back with the reader below (written from the format's spec, standard
  library only): the header is valid per the spec, tensors and names in index.json's order, every
  tensor byte for byte the .npy dump's data, __metadata__ holding index.json's fields; the file is the
  same for every batch size; compare.py npy vs safetensors (both ways) -> AGREE;
- --kld-base FILE -f CORPUS --ctx 10, decoded with a reader written from llama.cpp's perplexity.cpp:
  "_logits_", n_ctx, n_vocab (the tokenizer's 262147, not the 262272 logits), n_chunk = tokens / n_ctx
  (and --chunks), the corpus ids (<bos> + text without its last newline), the exact file size, every
  row's pad 0; every row's dequantized log-probs equal the log-softmax (over the first n_vocab logits)
  of ./zaya --dump's logits of the same chunk (first token replaced by <bos>) within half a
  quantization step, log-probs below max - 16 stored as 0 at the row's floor (also on a copy of the blob
  whose final norm is doubled to make logits span more than 16); the printed
  [1]x,[2]y,... perplexities and the Final estimate equal those computed from the dumped logits.
"""
import array
import json
import math
import os
import resource
import shutil
import signal
import struct
import sys

from harness import BUILD, ROOT, check, finish, need_fixtures, prompt_ids, read_npy, run

sys.path.insert(0, ROOT)
import compare  # noqa: E402  (tensor_stats, file_name)

FX = need_fixtures("checkpoint_native")
OUT = os.path.join(BUILD, "formats")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
BLOB = os.path.join(OUT, "native.bin")
rc, _, err = run([sys.executable, "export_weights.py", FX, BLOB])
if not check(rc == 0, "export the native fixture (fp32, with its tokenizer)", err[-400:]):
    finish()
IDS = ",".join(map(str, prompt_ids()))


def zaya(*args, **kw):
    return run(["./zaya", BLOB, *args], **kw)


def npy_parts(path):
    """(header bytes, data bytes) of a NumPy 1.0 file."""
    with open(path, "rb") as f:
        raw = f.read()
    hlen = struct.unpack("<H", raw[8:10])[0]
    return raw[:10 + hlen], raw[10 + hlen:]


def numpy_file(shape, data):
    """The bytes numpy.save writes (format 1.0): the header dict with repr(shape), spaces and a newline up to
    a multiple of 64 bytes, then the data."""
    descr = "<i4" if data.typecode == "i" else "<f4"
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    h += " " * (63 - (10 + len(h)) % 64) + "\n"
    body = array.array(data.typecode, data)
    if sys.byteorder == "big":
        body.byteswap()
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode("latin1") + body.tobytes()


def folder_bytes(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


# ---------------------------------------------------------------------------------------------
# A reader of safetensors written from the format's spec (huggingface/safetensors README "Format"):
# 8 bytes N (u64 little-endian), N bytes of UTF-8 JSON {name: {dtype, shape, data_offsets: [begin, end]},
# "__metadata__": {str: str}} (may end in spaces), then the byte buffer the offsets point into, which
# the tensors cover exactly; little-endian, C order.

ST_SIZE = {"F32": 4, "I32": 4}


def read_safetensors(path):
    """(N, [(name, dtype, shape, bytes)] in header order, metadata); raises ValueError on a violation."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("shorter than 8 bytes")
    n = struct.unpack("<Q", raw[:8])[0]
    if n == 0 or 8 + n > len(raw):
        raise ValueError(f"header length {n} in a file of {len(raw)} bytes")
    text = raw[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise ValueError("header does not start with '{'")

    def pairs(items):
        keys = [k for k, _ in items]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(items)
    header = json.loads(text, object_pairs_hook=pairs)
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ValueError("__metadata__ is not string -> string")
    buf = raw[8 + n:]
    spans, tensors = [], []
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{name}: keys {sorted(info)}")
        b, e = info["data_offsets"]
        if e - b != math.prod(info["shape"]) * ST_SIZE[info["dtype"]]:
            raise ValueError(f"{name}: {e - b} bytes for {info['dtype']} {info['shape']}")
        spans.append((b, e))
        tensors.append((name, info["dtype"], info["shape"], buf[b:e]))
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise ValueError(f"hole or overlap at {b} (expected {pos})")
        pos = e
    if pos != len(buf):
        raise ValueError(f"the tensors cover {pos} of the {len(buf)} buffer bytes")
    return n, tensors, meta


# ---------------------------------------------------------------------------------------------
# Streaming npy dumps: the same bytes whatever the batch size; each file as NumPy writes it

D = {b: os.path.join(OUT, f"dump_b{b}") for b in (256, 5, 1)}
for b, d in D.items():
    rc, _, err = zaya("--ids", IDS, "--dump", d, "--batch", str(b), "--threads", "1" if b == 5 else "2")
    check(rc == 0 and os.path.exists(os.path.join(d, "index.json")), f"--dump DIR --batch {b} runs", err[-400:])
ref = folder_bytes(D[256])
for b in (5, 1):
    got = folder_bytes(D[b])
    diff = sorted(k for k in set(ref) | set(got) if ref.get(k) != got.get(k))
    check(not diff and len(ref) > 200, f"--dump at --batch {b} is byte-identical to --batch 256 ({len(ref)} files)",
          f"differ: {diff[:5]}")
with open(os.path.join(D[256], "index.json")) as f:
    index = json.load(f)
T = len(prompt_ids())
bad_file, bad_stats, npy = [], [], {}
for e in index["tensors"]:
    path = os.path.join(D[256], e["file"])
    shape, data = read_npy(path)
    npy[e["name"]] = (shape, data, npy_parts(path)[1])
    with open(path, "rb") as g:
        if g.read() != numpy_file(shape, data) or list(shape) != e["shape"]:
            bad_file.append(e["name"])
    s = compare.tensor_stats(data)
    for k in ("min", "max", "mean", "rms"):
        want = None if s[k] is None else float(f"{s[k]:.9g}")
        if not (want == e["stats"][k] or (want is not None and abs(want - e["stats"][k]) <= 2e-9 * max(1.0, abs(want)))):
            bad_stats.append((e["name"], k, e["stats"][k], want))
    if (s["nan"], s["inf"]) != (e["stats"]["nan"], e["stats"]["inf"]):
        bad_stats.append((e["name"], "nan/inf"))
names = [e["name"] for e in index["tensors"]]
check(not bad_file, f"every .npy of the dump is the NumPy 1.0 file of its content, shape as index.json says "
      f"({len(names)} tensors)", f"{bad_file[:5]}")
check(not bad_stats, "index.json's stats are those of the data (min, max, mean, rms, nan, inf)", f"{bad_stats[:5]}")
check(index["tokens"] == prompt_ids() and npy["logits"][0][0] == T and names[0] == "model.embed_tokens"
      and names[-1].endswith("self_attn:value_cache"),
      "index.json: the prompt ids, [T, ...] tensors in execution order, state tensors last", f"{names[:3]} {names[-2:]}")

flt = os.path.join(OUT, "dump_filter")
rc, _, err = zaya("--ids", IDS, "--dump", flt, "--dump-filter", r"^logits$|layers\.1\.mlp")
with open(os.path.join(flt, "index.json")) as f:
    fnames = [e["name"] for e in json.load(f)["tensors"]]
want = [n for n in names if n == "logits" or "layers.1.mlp" in n]
same = all(npy_parts(os.path.join(flt, compare.file_name(n)))[1] == npy[n][2] for n in fnames)
check(rc == 0 and fnames == want and same, f"--dump-filter keeps {len(want)} tensors, in order, with the same bytes",
      f"{fnames} vs {want}; {err[-300:]}")

# ---------------------------------------------------------------------------------------------
# One .safetensors file: the spec's reader gets the npy dump's tensors byte for byte

S = {b: os.path.join(OUT, f"dump_b{b}.safetensors") for b in (256, 1)}
for b, p in S.items():
    rc, _, err = zaya("--ids", IDS, "--dump", p, "--batch", str(b))
    check(rc == 0, f"--dump FILE.safetensors --batch {b} runs", err[-400:])
with open(S[256], "rb") as f, open(S[1], "rb") as g:
    check(f.read() == g.read(), "the .safetensors dump is byte-identical at --batch 1 and 256")
try:
    n, tensors, meta = read_safetensors(S[256])
    problem = None
except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    n, tensors, meta, problem = 0, [], {}, str(e)
check(problem is None, "the .safetensors dump is valid per the spec (header, offsets covering the buffer exactly, "
      "str -> str metadata, file length)", problem)
check(n % 8 == 0, "its header length is a multiple of 8 (the data starts 8-byte aligned)", f"N = {n}")
st_names = [t[0] for t in tensors]
check(st_names == names, "it holds the npy dump's tensor names, in index.json's order",
      f"{len(st_names)} vs {len(names)}: {[x for x in st_names if x not in names][:3]}")
bad = [name for name, dtype, shape, data in tensors
       if name not in npy or tuple(shape) != tuple(npy[name][0]) or data != npy[name][2]
       or dtype != ("I32" if npy[name][1].typecode == "i" else "F32")]
check(tensors and not bad, f"every tensor (dtype, shape, bytes) equals the npy dump's ({len(tensors)} tensors)", f"{bad[:5]}")
try:
    fields = {k: (v if k == "skip_expert" else json.loads(v)) for k, v in meta.items()}
except ValueError as e:
    fields = {"error": str(e)}
entries = [{k: v for k, v in e.items() if k != "file"} for e in index["tensors"]]
check(fields.get("tensors") == entries and all(fields.get(k) == index[k] for k in
      ("format_version", "producer", "model", "weight_format", "skip_expert", "tokens")),
      "__metadata__ holds index.json's fields (each as JSON text; tensors without `file`)",
      f"{sorted(fields)}; tokens {fields.get('tokens', [])[:4]}")

# compare.py reads either form on either side (a short prompt: the logits comparison is the slow part)
short = {"npy": os.path.join(OUT, "short"), "st": os.path.join(OUT, "short.safetensors")}
for p in short.values():
    rc, _, err = zaya("--ids", ",".join(map(str, prompt_ids()[:6])), "--dump", p)
    check(rc == 0, f"--dump {os.path.basename(p)} of the first 6 prompt ids", err[-300:])
for a, b in (("npy", "st"), ("st", "npy"), ("st", "st")):
    rc, out, err = run([sys.executable, "compare.py", short[a], short[b]])
    check(rc == 0 and "RESULT: AGREE" in out and f"compared {len(names)} tensors: {len(names)} ok" in out
          and "max|a-b| 0 at" in out, f"compare.py {a} {b} -> AGREE, every tensor compared (the logits identical)",
          f"exit {rc}: {(out + err)[-400:]}")

# ---------------------------------------------------------------------------------------------
# Incomplete dumps: never taken for whole ones


def says_incomplete(label, path):
    rc, out, err = run([sys.executable, "compare.py", path, D[256]])
    check(rc == 2 and "incomplete" in err and "hint" in err and "Traceback" not in out + err,
          f"compare.py: {label} -> incomplete (exit 2, with a hint)", f"exit {rc}: {(out + err)[-400:]}")


# a run that fails at a tensor file: an earlier run's index.json is gone, none is written
stale = shutil.copytree(D[256], os.path.join(OUT, "dump_failed"))
os.remove(os.path.join(stale, "logits.npy"))
os.makedirs(os.path.join(stale, "logits.npy"))
rc, _, err = zaya("--ids", IDS, "--dump", stale)
check(rc == 1 and "logits.npy" in err and "hint" in err and not os.path.exists(os.path.join(stale, "index.json")),
      "a run failing at logits.npy exits 1 naming it, and the earlier index.json is removed", f"exit {rc}: {err[-300:]}")
says_incomplete("a folder whose run failed", stale)


def limit_files(ignore_signal):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))   # logits.npy needs 38 MB
        if ignore_signal:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return preexec


killed = os.path.join(OUT, "dump_killed")
rc, _, err = zaya("--ids", IDS, "--dump", killed, preexec_fn=limit_files(False))
check(rc == -signal.SIGXFSZ and not os.path.exists(os.path.join(killed, "index.json")),
      "a run killed (SIGXFSZ) while writing leaves .npy files and no index.json", f"exit {rc}: {err[-200:]}")
says_incomplete("a folder whose run was killed", killed)
rc, _, err = zaya("--ids", IDS, "--dump", killed, preexec_fn=limit_files(True))
check(rc == 1 and "cannot write" in err and "logits" in err and not os.path.exists(os.path.join(killed, "index.json")),
      "a write error (EFBIG) stops the run with exit 1 naming the tensor, and no index.json", f"exit {rc}: {err[-300:]}")
killed_st = os.path.join(OUT, "killed.safetensors")
rc, _, err = zaya("--ids", IDS, "--dump", killed_st, preexec_fn=limit_files(False))
with open(killed_st, "rb") as f:
    head = f.read(8)
check(rc == -signal.SIGXFSZ and head == bytes(8), "a .safetensors run killed while writing leaves a header length of 0",
      f"exit {rc}, first bytes {head!r}")
says_incomplete("a .safetensors file whose run was killed", killed_st)
with open(S[256], "rb") as f:
    whole = f.read()
for label, data in (("a .safetensors file cut short by 1000 bytes", whole[:-1000]),
                    ("a .safetensors file cut inside its header", whole[:n // 2]),
                    ("a .safetensors file of 5 bytes", whole[:5]),
                    ("a .safetensors file whose header length is zeroed", bytes(8) + whole[8:])):
    cut = os.path.join(OUT, "cut.safetensors")
    with open(cut, "wb") as f:
        f.write(data)
    says_incomplete(label, cut)

# ---------------------------------------------------------------------------------------------
# --kld-base: llama-perplexity's KL-divergence base, read back as perplexity.cpp's kl_divergence() does

CORPUS = os.path.join(OUT, "corpus.txt")
TEXT = ("The keeper of the old lighthouse climbed the spiral stairs every evening. He wiped the salt from the "
        "great lens, trimmed the wick and lit the lamp, and the beam swept across the dark water until dawn.")
with open(CORPUS, "w") as f:
    f.write(TEXT + "\n")
N_CTX = 10
# the corpus ids as llama-perplexity makes them: <bos> + the text without its last newline (= -i TEXT)
rc, _, err = zaya("-i", TEXT, "--dump", os.path.join(OUT, "corpus_ids"), "--dump-filter", "^model.norm$")
with open(os.path.join(OUT, "corpus_ids", "index.json")) as f:
    corpus_ids = json.load(f)["tokens"]
BOS = corpus_ids[0]
n_chunk = len(corpus_ids) // N_CTX
check(rc == 0 and n_chunk >= 3 and any(corpus_ids[c * N_CTX] != BOS for c in range(1, n_chunk)),
      f"the corpus has {len(corpus_ids)} tokens: {n_chunk} chunks of {N_CTX}, later chunks not starting with <bos>",
      err[-300:])
tok_json = need_fixtures("tokenizer", "tokenizer.json.gz")
import gzip  # noqa: E402
with gzip.open(tok_json, "rt", encoding="utf-8") as f:
    tj = json.load(f)
N_VOCAB = max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]]) + 1

KLD = os.path.join(OUT, "zaya.kld")
rc, out, info = zaya("--kld-base", KLD, "-f", CORPUS, "--ctx", str(N_CTX))
check(rc == 0 and not os.path.exists(KLD + ".partial"), f"--kld-base FILE -f CORPUS --ctx {N_CTX} runs", info[-400:])
FIRST = N_CTX // 2
PER = N_CTX - 1 - FIRST                 # scored positions per chunk: FIRST .. N_CTX-2
NV = 2 * ((N_VOCAB + 1) // 2) + 4      # uint16 per row: scale, min_log_prob (2 floats), n_vocab values, pad


def read_kld(path):
    """perplexity.cpp's reader: magic, n_ctx (uint32), n_vocab, n_chunk (int32), tokens, then per chunk
    (n_ctx - 1 - n_ctx/2) rows of nv uint16."""
    with open(path, "rb") as f:
        raw = f.read()
    magic = raw[:8]
    n_ctx, n_vocab, chunks = struct.unpack("<Iii", raw[8:20])
    toks = list(struct.unpack(f"<{chunks * n_ctx}i", raw[20:20 + 4 * chunks * n_ctx]))
    rows = raw[20 + 4 * chunks * n_ctx:]
    return magic, n_ctx, n_vocab, chunks, toks, rows, len(raw)


magic, n_ctx, n_vocab, chunks, toks, rows, size = read_kld(KLD)
check(magic == b"_logits_" and n_ctx == N_CTX and n_vocab == N_VOCAB == 262147 and chunks == n_chunk,
      f"header: _logits_, n_ctx {N_CTX}, n_vocab = the tokenizer's {N_VOCAB} (not 262272), n_chunk = "
      f"{len(corpus_ids)} // {N_CTX} = {n_chunk}", f"{magic!r} {n_ctx} {n_vocab} {chunks}")
check(toks == corpus_ids[:n_chunk * N_CTX], "the token ids are the corpus's (<bos> + text), not replaced by <bos>",
      f"{toks[:14]} vs {corpus_ids[:14]}")
check(size == 20 + 4 * n_chunk * N_CTX + n_chunk * PER * NV * 2,
      f"file size: header + ids + {n_chunk} chunks x {PER} rows x {NV} uint16 (the second half scored)", f"{size}")


def log_softmax_check(label, logits_row, qrow, target):
    """Max |dequantized - log-softmax| in quantization steps, and a list of problems; and the NLL."""
    x = logits_row[:N_VOCAB]
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    scale, min_lp = struct.unpack("<ff", struct.pack("<4H", *qrow[:4]))
    q = qrow[4:4 + N_VOCAB]
    floor = max(min(x), m - 16)
    tol = 2e-6 * (1 + abs(min_lp))      # float32 rounding of min_log_prob and of the row's arithmetic
    worst, problems = 0.0, []
    if abs(scale - (m - floor) / 65535) > 1e-6 * scale:
        problems.append(f"scale {scale} vs {(m - floor) / 65535}")
    for i, v in enumerate(x):
        lp = v - lse
        if v > floor:
            d = abs(scale * q[i] + min_lp - lp)
            worst = max(worst, d / scale)
            if d > 0.5 * scale + tol:
                problems.append(f"id {i}: {scale * q[i] + min_lp} vs {lp}")
        elif q[i] != 0 or lp > min_lp + tol:
            problems.append(f"id {i} below the floor: q {q[i]}, log p {lp} vs min {min_lp}")
    if qrow[4 + N_VOCAB:] != array.array("H", [0] * (NV - 4 - N_VOCAB)):
        problems.append("pad not 0")
    return worst, problems[:3], lse - x[target]


nll, worst_all, problems, printed_chunks = [], 0.0, [], []
for c in range(n_chunk):
    chunk = corpus_ids[c * N_CTX:(c + 1) * N_CTX]
    model_in = [BOS] + chunk[1:]
    d = os.path.join(OUT, f"kld_chunk{c}")
    rc, _, err = zaya("--ids", ",".join(map(str, model_in)), "--dump", d, "--dump-filter", "^logits$")
    (t_, V), lg = read_npy(os.path.join(d, "logits.npy"))
    for j in range(PER):
        p = FIRST + j
        off = ((c * PER) + j) * NV * 2
        qrow = array.array("H", rows[off:off + NV * 2])
        if sys.byteorder == "big":
            qrow.byteswap()
        w, probs, v = log_softmax_check(f"chunk {c} position {p}", lg[p * V:(p + 1) * V], qrow, chunk[p + 1])
        worst_all = max(worst_all, w)
        problems += [f"chunk {c} pos {p}: {x}" for x in probs]
        nll.append(v)
    printed_chunks.append(math.exp(sum(nll) / len(nll)))
check(not problems, f"every row ({n_chunk * PER} rows x {N_VOCAB} ids) dequantizes to the log-softmax of ./zaya's "
      f"logits (first n_vocab) of the <bos>-started chunk, within half a step (worst {worst_all:.3f} steps)",
      "; ".join(problems[:4]))

progress = [p for p in out.strip().split(",") if p]
got = [float(p.split("]")[1]) for p in progress] if all("]" in p for p in progress) else []
check(len(got) == n_chunk and all(abs(a - b) <= 1e-5 * b for a, b in zip(got, printed_chunks))
      and [p.split("]")[0] for p in progress] == [f"[{i + 1}" for i in range(n_chunk)],
      "the printed [1]x,[2]y,... perplexities equal exp(mean NLL) of the dumped logits, chunk by chunk",
      f"{out.strip()} vs {[round(x, 4) for x in printed_chunks]}")
mean = sum(nll) / len(nll)
sd = math.sqrt((sum(v * v for v in nll) / len(nll) - mean * mean) / (len(nll) - 1))
final = [ln for ln in info.splitlines() if ln.startswith("Final estimate: PPL = ")]
try:
    ppl, pm = map(float, final[0][len("Final estimate: PPL = "):].split(" +/- "))
except (IndexError, ValueError):
    ppl = pm = float("nan")
check(abs(ppl - math.exp(mean)) <= 1e-5 * ppl and abs(pm - sd * math.exp(mean)) <= 1e-3 * pm,
      "the Final estimate (PPL +/- its standard error) equals the one of the dumped logits",
      f"{final} vs {math.exp(mean):.4f} +/- {sd * math.exp(mean):.5f}")

# logits wider than 16: the final norm's weight doubled in a copy of the blob (tensor data is not
# in the header's CRC), so that rows have log-probs below max - 16, stored as q = 0 at the row's floor
WIDE = os.path.join(OUT, "wide.bin")
shutil.copyfile(BLOB, WIDE)
with open(WIDE, "r+b") as f:
    head = f.read(64)
    n, dir_off = struct.unpack_from("<I", head, 32)[0], struct.unpack_from("<Q", head, 24)[0]
    f.seek(dir_off)
    directory = f.read(192 * n)
    for i in range(n):
        e = directory[192 * i:192 * (i + 1)]
        if e[:128].rstrip(b"\0") == b"model.norm.weight":
            off, nbytes = struct.unpack_from("<QQ", e, 168)
            f.seek(off)
            w = array.array("f", f.read(nbytes))
            f.seek(off)
            f.write(array.array("f", [2 * v for v in w]).tobytes())
KLDW = os.path.join(OUT, "wide.kld")
rc, out, info = run(["./zaya", WIDE, "--kld-base", KLDW, "-f", CORPUS, "--ctx", str(N_CTX), "--chunks", "1"])
magic, n_ctx, n_vocab, chunks, toks, rows, size = read_kld(KLDW)
d = os.path.join(OUT, "wide_chunk0")
rc2, _, err2 = run(["./zaya", WIDE, "--ids", ",".join(map(str, corpus_ids[:N_CTX])), "--dump", d, "--dump-filter", "^logits$"])
(t_, V), lg = read_npy(os.path.join(d, "logits.npy"))
problems, clamped = [], 0
for j in range(PER):
    qrow = array.array("H", rows[j * NV * 2:(j + 1) * NV * 2])
    if sys.byteorder == "big":
        qrow.byteswap()
    x = lg[(FIRST + j) * V:(FIRST + j) * V + N_VOCAB]
    top = max(x)
    clamped += sum(1 for v in x if v < top - 16)
    problems += log_softmax_check("wide", lg[(FIRST + j) * V:(FIRST + j + 1) * V], qrow, corpus_ids[FIRST + j + 1])[1]
check(rc == 0 and rc2 == 0 and clamped > 1000 and not problems,
      f"logits spanning more than 16 (final norm x 2): {clamped} log-probs below max - 16 are stored as the floor, "
      f"the rest within half a step", f"{problems[:3]} {info[-200:]} {err2[-200:]}")

# --chunks and an odd n_ctx: the same layout rules
KLD2 = os.path.join(OUT, "zaya2.kld")
rc, out, err = zaya("--kld-base", KLD2, "-f", CORPUS, "--ctx", "9", "--chunks", "2")
magic, n_ctx, n_vocab, chunks, toks, rows, size = read_kld(KLD2)
check(rc == 0 and (n_ctx, chunks) == (9, 2) and toks == corpus_ids[:18] and size == 20 + 4 * 18 + 2 * (9 - 1 - 4) * NV * 2
      and out.count("[") == 2, "--ctx 9 --chunks 2: two chunks of 9, positions 4..7 scored", f"{n_ctx} {chunks} {size} {out!r}")

finish()
