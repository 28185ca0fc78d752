#!/usr/bin/env python3
"""quant_sensitivity.py - which tensors quantization hurts: quantize ONE group of tensors at a time, run
zaya.c on the result, and measure against the exact model (KL divergence, top-1 agreement, perplexity).

    /usr/bin/python3 tools/quant_sensitivity.py CKPT_DIR (--ids 2,818,... | --random-ids N | -i TEXT)
        [--types Q8_0,Q4_0,Q4_K,INT4-pal] [--groups conv,router,attention,experts,embed]
        [--work DIR] [--dtype bf16|fp32] [--zaya ./zaya] [--threads N] [--out TABLE.md]

CKPT_DIR is a native-layout checkpoint folder (export_weights.py reads it). For every (group, type) the
group's matrices are quantized and dequantized to float32 by tools/quants.py (Q8_0, Q4_0, Q4_K as
ggml's reference quantizers, i.e. llama-quantize without an imatrix; INT4-pal as Core ML's 4-bit
per-grouped-channel palettization, groups of 32 output channels, as coremltools computes it on an fp16
model: kmeans1d or, for groups under 10,000 values, scikit-learn's KMeans with 1 thread, bit for bit),
written under their HF names to
WORK/port.safetensors, exported with `export_weights.py CKPT WORK/q.bin --weights WORK/port.safetensors`
and run by `zaya WORK/q.bin --ids ... -n 0 --dump ... --dump-filter '^logits$'`. The exact model is the
checkpoint's own blob, run on the same ids. Everything else stays as the checkpoint has it.

Groups (HF names, docs/architecture.md 2.2; only weight matrices, never biases, norms or scales):
  conv       self_attn.qkv_proj.conv_qk_depthwise.weight [C,1,t0], conv_qk_grouped.weight [C,d,t1];
             each output channel's kernel is one row (d*t values): the depthwise row (t0 = 2 values) is
             shorter than any block and is kept exact
  router     mlp.gate.down_proj.weight, mlp.gate.router_mlp.{fc1,fc2,out_proj}.weight
  attention  self_attn.qkv_proj.{q_proj,k_proj,v_proj_current,v_proj_delayed}.weight, self_attn.o_proj.weight
  experts    mlp.experts.gate_up_proj [E,2I,H], mlp.experts.down_proj [E,H,I] (E matrices each)
  embed      model.embed_tokens.weight: the embedding and the tied LM head
A matrix whose row length is not a multiple of the type's block (32; 256 for Q4_K) or, for INT4-pal,
whose output channels are not a multiple of 32, is kept exact and counted under "kept" (llama.cpp
falls back to another type for such tensors).

Per (group, type), positions t = 0..T-1 of the ids, P = exact model's softmax, Q = quantized:
  KLD      mean over t of KL(P_t || Q_t) in nats (max over t beside it), over the blob's logits
  top-1    % of positions where argmax Q_t = argmax P_t
  PPL x    perplexity of ids[1:] under Q divided by that under P (t = 0..T-2 predict the next id)
  w-NMSE   sum (w_q - w)^2 / sum w^2 over the group's quantized matrices
A row "none" (nothing quantized) checks the pipeline: KLD 0, 100 % top-1, ratio 1. Deterministic: the
same command prints the same table. Exit 2 on a usage or input error, with what was wrong.

llama-quantize's own mixes (--gguf-mixes): instead of groups, whole GGUFs made by the real tool.

    /usr/bin/python3 tools/quant_sensitivity.py NATIVE_CKPT --random-ids 64 --gguf-base BASE.gguf \
        --legacy LEGACY_CKPT --llama-quantize llama.cpp/build/bin/llama-quantize \
        --gguf-mixes "Q8_0,Q5_K_M,Q4_K_M,IQ4_XS,Q4_K_M:attn_q=q8_0;attn_k=q8_0" [--work DIR] [--out T.md]

BASE.gguf is the port's converter's BF16 (or F32) GGUF of LEGACY_CKPT (the same weights as NATIVE_CKPT,
in the legacy layout the converter reads). Each mix is `TYPE` (llama-quantize's ftype: its own per-tensor
choices, e.g. Q4_K_M's Q6_K for the tied embedding and some ffn_down) or `TYPE:PATTERN=type;...` (its
--tensor-type overrides, PATTERN a regex on the GGUF tensor name). Each is quantized by llama-quantize
(no imatrix), dequantized by ggml itself (`llama-quantize --allow-requantize MIX.gguf F32`: its to_float, the
values export_weights.py's GGUF reader gives bit for bit, without Python's time), exported with
`export_weights.py MIX-F32.gguf --tokenizer LEGACY_CKPT` (float32 blob), run by zaya.c and compared with
the exact model: the quantization of the weights alone (the replay of ggml's arithmetic is not involved). `size` is the GGUF's tensor bytes; `8B size` projects it to
the model's full depth (the per-layer tensors times 40 / layers, the global ones as they are); `bpw` its
bits per weight; `types` how many tensors llama-quantize gave each ggml type.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import quants  # noqa: E402
import vl_checkpoint  # noqa: E402

GROUPS = {
    "conv": r"\.self_attn\.qkv_proj\.conv_qk_(depthwise|grouped)\.weight$",
    "router": r"\.mlp\.gate\.(down_proj|router_mlp\.(fc1|fc2|out_proj))\.weight$",
    "attention": r"\.self_attn\.(qkv_proj\.(q_proj|k_proj|v_proj_current|v_proj_delayed)|o_proj)\.weight$",
    "experts": r"\.mlp\.experts\.(gate_up_proj|down_proj)$",
    "embed": r"^model\.embed_tokens\.weight$",
}
ST_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def fail(what, hint=None):
    print(f"quant_sensitivity.py: error: {what}" + (f"\n  hint: {hint}" if hint else ""), file=sys.stderr)
    sys.exit(2)


class Checkpoint:
    """The safetensors tensors of a checkpoint folder (single file or shards + index), read on demand."""

    def __init__(self, folder):
        idx = os.path.join(folder, "model.safetensors.index.json")
        if os.path.isfile(idx):
            files = sorted(set(json.load(open(idx))["weight_map"].values()))
        elif os.path.isfile(os.path.join(folder, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            fail(f"{folder}: no model.safetensors or model.safetensors.index.json",
                 "give a native-layout checkpoint folder")
        self.where = {}
        for fn in files:
            path = os.path.join(folder, fn)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + n, info)

    def get(self, name):
        path, base, info = self.where[name]
        a, b = info["data_offsets"]
        if info["dtype"] not in ST_NP:
            fail(f"{path}: {name} is {info['dtype']}", "a float checkpoint (F32, F16, BF16) is needed")
        v = np.fromfile(path, ST_NP[info["dtype"]], count=(b - a) // np.dtype(ST_NP[info["dtype"]]).itemsize,
                        offset=base + a)
        if info["dtype"] == "BF16":
            v = (v.astype(np.uint32) << 16).view(np.float32)
        return v.astype(np.float32).reshape(info["shape"])


def write_safetensors(path, tensors):
    """{name: float32 array} -> a safetensors file of F32 tensors (names sorted)."""
    arrays = {name: np.ascontiguousarray(a, np.float32) for name, a in tensors.items()}
    vl_checkpoint.write_safetensors(path, [(name, "F32", arrays[name].shape, arrays[name]) for name in sorted(arrays)])


def quantize_group(ck, group, qtype):
    """-> ({name: fake-quantized float32}, kept names, weight NMSE)."""
    pat = re.compile(GROUPS[group])
    out, kept, num, den = {}, [], 0.0, 0.0
    for name in sorted(n for n in ck.where if pat.search(n)):
        w = ck.get(name)
        shape = w.shape
        if group == "conv":
            w = w.reshape(shape[0], -1)           # one output channel's kernel = one row
        try:
            if qtype == "INT4-pal" and w.ndim == 3:   # [E, out, in]: E linear layers
                wq = np.stack([quants.fake_quant(w[e], qtype) for e in range(w.shape[0])])
            else:
                wq = quants.fake_quant(w, qtype)
        except quants.NotQuantizable:
            kept.append(name)
            continue
        d = wq.astype(np.float64) - w
        num += float(np.sum(d * d))
        den += float(np.sum(w.astype(np.float64) ** 2))
        out[name] = wq.reshape(shape)
    return out, kept, (num / den if den else float("nan"))


def run(cmd, what):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stderr.strip()[-2000:]}")
    return r


def logits_of(args, blob, dump):
    shutil.rmtree(dump, ignore_errors=True)
    cmd = [args.zaya, blob, "-n", "0", "--dump", dump, "--dump-filter", "^logits$"]
    cmd += ["-i", args.text] if args.text is not None else ["--ids", ",".join(map(str, args.id_list))]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    run(cmd, "zaya")
    index = json.load(open(os.path.join(dump, "index.json")))
    return np.load(os.path.join(dump, "logits.npy")).astype(np.float64), index["tokens"]


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def metrics(lp_exact, lq, ids):
    p = np.exp(lp_exact)
    kl = np.sum(p * (lp_exact - lq), axis=1)
    top1 = 100.0 * np.mean(np.argmax(lp_exact, 1) == np.argmax(lq, 1))
    nxt = np.asarray(ids[1:])
    nll_e = -np.mean(lp_exact[np.arange(len(nxt)), nxt]) if len(nxt) else 0.0
    nll_q = -np.mean(lq[np.arange(len(nxt)), nxt]) if len(nxt) else 0.0
    return float(np.mean(kl)), float(np.max(kl)), top1, float(np.exp(nll_q - nll_e)), float(np.exp(nll_e))


def export(args, blob, weights=None):
    cmd = [sys.executable, os.path.join(ROOT, "export_weights.py"), args.ckpt, blob, "--dtype", args.dtype]
    if weights:
        cmd += ["--weights", weights]
    run(cmd, "export_weights.py")


def gguf_rows(args, lpe, ids, head_only=False):
    """llama-quantize's mixes: (header, rows)."""
    sys.path.insert(0, ROOT)
    import gguf
    head = ("| mix | overrides | types | size MB | 8B size GB | bpw | mean KLD | max KLD | top-1 % | PPL ratio | s |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    if head_only:
        return head, []
    print(head, flush=True)
    rows = []
    for spec in [m for m in args.gguf_mixes.split(",") if m]:
        t0 = time.time()
        ftype, _, over = spec.partition(":")
        overrides = [o for o in over.split(";") if o]
        out = os.path.join(args.work_dir, "mix.gguf")
        cmd = [args.llama_quantize]
        for o in overrides:
            cmd += ["--tensor-type", o]
        run(cmd + [args.gguf_base, out, ftype, str(args.threads or 2)], "llama-quantize")
        g = gguf.GGUFFile(out)
        count, size, per_layer, numel = {}, 0, 0, 0
        for t in g.tensors.values():
            count[t.type] = count.get(t.type, 0) + 1
            size += t.nbytes
            numel += t.numel
            if t.name.startswith("blk."):
                per_layer += t.nbytes
        half = g.kv.get("zaya.block_count")
        layers = half // 2 if isinstance(half, int) else 1
        full = size - per_layer + per_layer * 40 / layers
        g.f.close()
        # ggml's own dequantization (to_float) to an F32 GGUF: the values export_weights.py's reader gives
        # bit for bit (test/test_gguf.py), at the disk's speed instead of Python's
        f32 = os.path.join(args.work_dir, "mix-f32.gguf")
        run([args.llama_quantize, "--allow-requantize", out, f32, "F32", str(args.threads or 2)], "llama-quantize F32")
        os.remove(out)
        blob = os.path.join(args.work_dir, "q.bin")
        run([sys.executable, os.path.join(ROOT, "export_weights.py"), f32, blob, "--tokenizer", args.legacy,
             "--dtype", "fp32"], "export_weights.py")
        os.remove(f32)
        lq, _ = logits_of(args, blob, os.path.join(args.work_dir, "dump_q"))
        os.remove(blob)
        # the GGUF keeps the tokenizer's rows only (262,147 of 262,272): both sides over those logits
        lp = lpe if lq.shape[1] == lpe.shape[1] else log_softmax(args.exact_logits[:, :lq.shape[1]])
        args.gguf_vocab = lq.shape[1]
        kld, kmax, top1, ratio, _ = metrics(lp, log_softmax(lq), ids)
        types = ", ".join(f"{n} {t}" for t, n in sorted(count.items(), key=lambda kv: -kv[1]))
        line = (f"| {ftype} | {'; '.join(overrides) or '-'} | {types} | {size / 1e6:.0f} | {full / 1e9:.2f} | "
                f"{8 * size / numel:.2f} | {kld:.4e} | {kmax:.4e} | {top1:.1f} | {ratio:.5f} | "
                f"{time.time() - t0:.0f} |")
        rows.append(line)
        print(line, flush=True)
    return head, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids")
    src.add_argument("--random-ids", type=int, metavar="N", help="N uniform random ids below vocab_size (--seed)")
    src.add_argument("-i", dest="text", help="a text (zaya.c encodes it as <bos> + text)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--types", default=",".join(quants.TYPES))
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--work", default=None, help="scratch folder for the blobs and dumps (default CKPT/../qs_work)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                    help="blob dtype of the untouched tensors (bf16 is exact for a bf16 checkpoint; the "
                         "quantized tensors are stored exactly in any case)")
    ap.add_argument("--zaya", default=os.path.join(ROOT, "zaya"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--no-baseline", action="store_true", help="leave out the 'none' row")
    ap.add_argument("--gguf-mixes", default=None, help="llama-quantize mixes, e.g. Q4_K_M,Q4_K_M:attn_v=q8_0 "
                    "(needs --gguf-base, --legacy, --llama-quantize); replaces the group rows")
    ap.add_argument("--gguf-base", default=None, help="the port's converter's BF16/F32 GGUF of --legacy")
    ap.add_argument("--legacy", default=None, help="the legacy-layout checkpoint the GGUF was converted from")
    ap.add_argument("--llama-quantize", default=None, help="llama.cpp's llama-quantize binary")
    args = ap.parse_args()

    if not os.path.isdir(args.ckpt):
        fail(f"checkpoint folder {args.ckpt} not found")
    if not os.path.isfile(args.zaya):
        fail(f"{args.zaya} not found", "make zaya, or give --zaya PATH")
    types = [t for t in args.types.split(",") if t]
    groups = [g for g in args.groups.split(",") if g]
    for t in types:
        if t not in quants.TYPES:
            fail(f"unknown type {t!r}", "one of " + ", ".join(quants.TYPES))
    for g in groups:
        if g not in GROUPS:
            fail(f"unknown group {g!r}", "one of " + ", ".join(GROUPS))
    cfg = json.load(open(os.path.join(args.ckpt, "config.json")))
    args.id_list = None
    if args.ids is not None:
        try:
            args.id_list = [int(x) for x in args.ids.split(",")]
        except ValueError:
            fail(f"--ids {args.ids!r}: not comma-separated integers")
    elif args.random_ids is not None:
        if args.random_ids < 2:
            fail("--random-ids needs at least 2 ids")
        vocab = cfg["vocab_size"]
        if args.gguf_mixes and args.gguf_base and os.path.exists(args.gguf_base):   # the GGUF's rows: 262,147
            sys.path.insert(0, ROOT)
            import gguf
            g = gguf.GGUFFile(args.gguf_base)
            vocab = min(vocab, g.tensors["token_embd.weight"].ne[1])
            g.f.close()
        args.id_list = [int(x) for x in np.random.default_rng(args.seed).integers(0, vocab, args.random_ids)]
    work = args.work or os.path.join(os.path.dirname(os.path.abspath(args.ckpt)), "qs_work")
    os.makedirs(work, exist_ok=True)

    ck = Checkpoint(args.ckpt)
    exact_blob = os.path.join(work, "exact.bin")
    export(args, exact_blob)
    le, ids = logits_of(args, exact_blob, os.path.join(work, "dump_exact"))
    lpe = log_softmax(le)
    os.remove(exact_blob)

    if args.gguf_mixes:
        for opt in ("gguf_base", "legacy", "llama_quantize"):
            if not getattr(args, opt) or not os.path.exists(getattr(args, opt)):
                fail(f"--gguf-mixes needs --{opt.replace('_', '-')} (an existing path)")
        args.work_dir = work
        args.exact_logits = le
        head, rows = gguf_rows(args, lpe, ids)
        ppl = metrics(lpe, lpe, ids)[4]
        foot = (f"\n{len(ids)} ids; exact model's perplexity on them {ppl:.4f}; KLD in nats over the GGUF's "
                f"{getattr(args, 'gguf_vocab', le.shape[1])} logits (its vocabulary); GGUFs by llama-quantize "
                "(no imatrix), read back as ggml dequantizes them.")
        print(foot)
        if args.out:
            with open(args.out, "w") as f:
                f.write(head + "\n" + "\n".join(rows) + "\n" + foot + "\n")
        return

    rows = []
    head = ("| group | type | matrices (kept exact) | weight NMSE | mean KLD | max KLD | top-1 % | PPL ratio | s |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(head, flush=True)
    plan = ([("none", "-")] if not args.no_baseline else []) + [(g, t) for g in groups for t in types]
    for group, qtype in plan:
        t0 = time.time()
        blob = os.path.join(work, "q.bin")
        if group == "none":
            tensors, kept, nmse = {}, [], 0.0
            export(args, blob)
        else:
            tensors, kept, nmse = quantize_group(ck, group, qtype)
            port = os.path.join(work, "port.safetensors")
            if tensors:
                write_safetensors(port, tensors)
                export(args, blob, port)
                os.remove(port)
            else:
                blob = None
        if blob:
            lq, _ = logits_of(args, blob, os.path.join(work, "dump_q"))
            os.remove(blob)
            kld, kmax, top1, ratio, _ = metrics(lpe, log_softmax(lq), ids)
        else:
            kld, kmax, top1, ratio, nmse = 0.0, 0.0, 100.0, 1.0, float("nan")
        line = (f"| {group} | {qtype} | {len(tensors)} ({len(kept)}) | {nmse:.3e} | {kld:.4e} | {kmax:.4e} | "
                f"{top1:.1f} | {ratio:.5f} | {time.time() - t0:.0f} |")
        rows.append(line)
        print(line, flush=True)
    ppl = metrics(lpe, lpe, ids)[4]
    foot = (f"\n{len(ids)} ids; exact model's perplexity on them {ppl:.4f}; KLD in nats over the blob's "
            f"{le.shape[1]} logits; types quantize-then-dequantize (tools/quants.py).")
    print(foot)
    if args.out:
        with open(args.out, "w") as f:
            f.write(head + "\n" + "\n".join(rows) + "\n" + foot + "\n")


if __name__ == "__main__":
    main()
