#!/usr/bin/env python3
"""test_trace.py - `./zaya --trace POS` prints the same numbers as `--dump`, and its explanations are right.

On the compact fixture (test/fixtures, exported to build/test/trace_native.bin) and on a checkpoint of other dimensions
(tools/make_checkpoint.py: 6 query / 2 KV heads of 32, CCA kernels 3+2, 3 experts, window 3, vocab 1000;
build/test/trace_odd.bin), for several positions (the first, one inside and one after the sliding
window, the last):
  - every step line (name, shape, L2 norm, min, max, first 4 values) equals the --dump row of that
    position (relative 1e-5: the trace prints %.6g), the steps come in the order of the dump's
    index.json (execution order), and every dumped tensor has its line;
  - self_attn:attn_weights (not dumped) equals softmax(q k / sqrt(d)) recomputed from the dumped
    query_after_rope and key_after_rope rows over the printed window; the window is [POS-w+1, POS] on
    sliding layers and [0, POS] on full ones; the top-3 keys of every head are the 3 largest;
  - the router table: probabilities sum to 1 and equal router_probs, scores equal router_scores, the
    chosen class equals router_indices (and "SKIP" is said exactly when it is the skip class);
  - the LM head's top-5 ids equal the 5 largest logits of the dump row;
  - --trace-layer N prints exactly the full trace's lines of layer N plus the model-level ones;
    --batch 1 and -i TEXT (the fixture) print the same trace; no line is longer than 120 columns;
  - refused: a position outside the prompt, --trace with --dump, --trace-layer out of range.
"""
import math
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, BUILD, check, finish, need_fixtures, tokenizer_dir, prompt_ids, read_npy, run  # noqa: E402

REL = 1e-5
MAIN = re.compile(r"^(\S+)\s+(\[[0-9,]*\])\s+(\S+)\s+(\S+)\s+(\S+)\s+(.*)$")


def close(printed, value, rel=REL):
    return abs(printed - value) <= rel * abs(value) + 1e-30 or (math.isnan(printed) and math.isnan(value))


def parse_trace(text):
    """[(full name, shape, norm, min, max, first values, [explanation lines])] in print order."""
    steps, layer = [], None
    for line in text.splitlines():
        if line.startswith("#") or line.startswith("("):
            continue
        m = re.match(r"^== model\.layers\.(\d+):", line)
        if m:
            layer = int(m.group(1))
            continue
        if line.startswith(" " * 40) and steps:          # wrapped first values
            steps[-1][5].extend(float(v) for v in line.split())
            continue
        if line.startswith("    ") and steps:            # an explanation of the step above
            steps[-1][6].append(line.strip())
            continue
        m = MAIN.match(line)
        if not m:
            raise ValueError(f"unparsable trace line: {line!r}")
        name = m.group(1)
        if not (name.startswith("model") or name == "logits"):
            name = f"model.layers.{layer}.{name}"
        shape = tuple(int(x) for x in m.group(2)[1:-1].split(",") if x)
        steps.append((name, shape, float(m.group(3)), float(m.group(4)), float(m.group(5)),
                      [float(v) for v in m.group(6).split()], []))
    return steps


def load_dump(folder):
    import json
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    tensors = {}
    order = []
    for t in index["tensors"]:
        shape, data = read_npy(os.path.join(folder, t["file"]))
        tensors[t["name"]] = (shape, data)
        order.append(t["name"])
    return tensors, order


def row(tensors, name, pos):
    shape, data = tensors[name]
    n = 1
    for s in shape[1:]:
        n *= s
    return shape[1:], list(data[pos * n:(pos + 1) * n])


def check_position(label, blob, ids, pos, tensors, order, config):
    rc, out, err = run(["./zaya", blob, "--ids", ",".join(map(str, ids)), "--trace", str(pos)])
    if not check(rc == 0, f"{label} pos {pos}: ./zaya --trace runs", err.strip()[-300:]):
        return None
    too_long = [l for l in out.splitlines() if len(l) > 120]
    check(not too_long, f"{label} pos {pos}: every line fits in 120 columns", too_long[:1])
    try:
        steps = parse_trace(out)
    except ValueError as e:
        check(False, f"{label} pos {pos}: trace parses", str(e))
        return None

    # 1. every step equals the dump row
    bad, seen = [], []
    for name, shape, norm, mn, mx, first, _ in steps:
        if name.endswith("self_attn:attn_weights"):
            continue
        seen.append(name)
        if name not in tensors:
            bad.append(f"{name}: not in the dump")
            continue
        dshape, vals = row(tensors, name, pos)
        if tuple(dshape) != shape:
            bad.append(f"{name}: shape {shape} vs dump {tuple(dshape)}")
            continue
        fvals = [float(v) for v in vals]
        ref = (math.sqrt(sum(v * v for v in fvals)), min(fvals), max(fvals))
        for what, p, v in zip(("norm", "min", "max"), (norm, mn, mx), ref):
            if not close(p, v):
                bad.append(f"{name}: {what} {p} vs dump {v!r}")
        if len(first) != min(4, len(fvals)):
            bad.append(f"{name}: {len(first)} first values printed")
        for i, p in enumerate(first):
            if not close(p, fvals[i]):
                bad.append(f"{name}: value {i} {p} vs dump {fvals[i]!r}")
    check(not bad, f"{label} pos {pos}: {len(seen)} step lines equal the --dump rows (norm, min, max, first 4; rel {REL})",
          "; ".join(bad[:4]))
    per_position = [n for n in order if not n.endswith(("conv_state", "delayed_value_state", "key_cache", "value_cache"))]
    check(seen == per_position, f"{label} pos {pos}: the steps come in the dump's execution order, none missing",
          f"first difference: {next(((a, b) for a, b in zip(seen, per_position) if a != b), (len(seen), len(per_position)))}")

    # 2. attention weights recomputed from the dumped q and k
    L, nq, nkv, d = config["layers"], config["nq"], config["nkv"], config["d"]
    att_bad = []
    att_steps = [s for s in steps if s[0].endswith("self_attn:attn_weights")]
    check(len(att_steps) == L, f"{label} pos {pos}: one self_attn:attn_weights line per layer", f"{len(att_steps)} of {L}")
    for name, shape, norm, mn, mx, first, notes in att_steps:
        layer = int(name.split(".")[2])
        sliding = config["types"][layer] == "hybrid_sliding"
        lo = max(0, pos - config["window"] + 1) if sliding else 0
        if shape != (nq, pos - lo + 1):
            att_bad.append(f"layer {layer}: shape {shape}, expected ({nq}, {pos - lo + 1})")
            continue
        want_window = f"window [{lo}, {pos}]" if sliding else f"every position [0, {pos}]"
        if not any(want_window in n for n in notes):
            att_bad.append(f"layer {layer}: no '{want_window}' in {notes[:1]}")
        _, q = row(tensors, f"model.layers.{layer}.self_attn:query_after_rope", pos)
        keys = [row(tensors, f"model.layers.{layer}.self_attn:key_after_rope", t)[1] for t in range(lo, pos + 1)]
        probs = []
        for n in range(nq):
            kv = n // (nq // nkv)
            s = [sum(q[n * d + i] * k[kv * d + i] for i in range(d)) / math.sqrt(d) for k in keys]
            mxs = max(s)
            e = [math.exp(x - mxs) for x in s]
            probs.append([x / sum(e) for x in e])
        flat = [p for r in probs for p in r]
        ref = (math.sqrt(sum(p * p for p in flat)), min(flat), max(flat))
        for what, p, v in zip(("norm", "min", "max"), (norm, mn, mx), ref):
            if not close(p, v, 1e-4):
                att_bad.append(f"layer {layer}: {what} {p} vs recomputed {v}")
        for i, p in enumerate(first):
            if not close(p, flat[i], 1e-4):
                att_bad.append(f"layer {layer}: value {i} {p} vs recomputed {flat[i]}")
        head_lines = [n for n in notes if n.startswith("head ")]
        if len(head_lines) != nq:
            att_bad.append(f"layer {layer}: {len(head_lines)} head lines")
            continue
        for n, hl in enumerate(head_lines):
            got = [(int(a), float(b)) for a, b in re.findall(r"pos (\d+) \".*?\" ([0-9.]+)", hl)]
            want = sorted(range(len(probs[n])), key=lambda j: (-probs[n][j], j))[:3]
            got_w = [probs[n][g[0] - lo] if 0 <= g[0] - lo < len(probs[n]) else -1.0 for g in got]
            if len(got) != len(want) or any(abs(a - probs[n][j]) > 1e-7 for a, j in zip(got_w, want)):
                att_bad.append(f"layer {layer} head {n}: top {got} vs {[(lo + j, round(probs[n][j], 4)) for j in want]}")
                continue
            for kpos, w in got:
                if abs(w - probs[n][kpos - lo]) > 6e-5:
                    att_bad.append(f"layer {layer} head {n}: weight of pos {kpos} {w} vs {probs[n][kpos - lo]}")
    check(not att_bad, f"{label} pos {pos}: attention weights = softmax(q.k/sqrt(d)) over the window, top-3 per head",
          "; ".join(att_bad[:3]))

    # 3. the router table and choice
    r_bad = []
    E = config["experts"]
    for layer in range(L):
        step = next((s for s in steps if s[0] == f"model.layers.{layer}.mlp.gate.router_indices"), None)
        if step is None:
            r_bad.append(f"layer {layer}: no router_indices line")
            continue
        notes = step[6]
        probs = [float(x) for n in notes if n.startswith("prob ") for x in n.split()[1:]]
        scores = [float(x) for n in notes if n.startswith("= score ") for x in n.split()[2:]]
        choice = next((n for n in notes if n.startswith("choice:")), "")
        _, dprobs = row(tensors, f"model.layers.{layer}.mlp.gate:router_probs", pos)
        _, dscores = row(tensors, f"model.layers.{layer}.mlp.gate:router_scores", pos)
        _, dind = row(tensors, f"model.layers.{layer}.mlp.gate.router_indices", pos)
        if len(probs) != E + 1 or abs(sum(probs) - 1.0) > 1e-5 * (E + 1):
            r_bad.append(f"layer {layer}: probabilities {probs} (sum {sum(probs)})")
        if len(probs) == E + 1 and not all(close(p, v) for p, v in zip(probs, dprobs)):
            r_bad.append(f"layer {layer}: probs {probs} vs dump {list(dprobs)}")
        if len(scores) != E + 1 or not all(close(p, v) for p, v in zip(scores, dscores)):
            r_bad.append(f"layer {layer}: scores {scores} vs dump {list(dscores)}")
        m = re.match(r"choice: (?:class|expert) (\d+)", choice)
        if not m or int(m.group(1)) != dind[0]:
            r_bad.append(f"layer {layer}: '{choice}' vs dump router_indices {dind[0]}")
        elif ("SKIP" in choice) != (dind[0] == E):
            r_bad.append(f"layer {layer}: skip said wrongly in '{choice}'")
    check(not r_bad, f"{label} pos {pos}: router probabilities sum to 1 and equal the dump; choice = router_indices",
          "; ".join(r_bad[:3]))

    # 4. the LM head's top 5
    step = next((s for s in steps if s[0] == "logits"), None)
    got = [int(m.group(1)) for n in (step[6] if step else []) for m in [re.match(r"top \d: id\s+(\d+)", n)] if m]
    _, logits = row(tensors, "logits", pos)
    want = sorted(range(len(logits)), key=lambda v: (-logits[v], v))[:5]
    check(got == want, f"{label} pos {pos}: LM head top-5 ids = the 5 largest logits of the dump", f"{got} vs {want}")
    return out


def check_blob(label, blob, ids, positions, config, text=None):
    dump = os.path.join(BUILD, f"trace_dump_{label}")
    shutil.rmtree(dump, ignore_errors=True)
    rc, _, err = run(["./zaya", blob, "--ids", ",".join(map(str, ids)), "--dump", dump])
    if not check(rc == 0, f"{label}: ./zaya --dump runs", err.strip()[-300:]):
        return
    tensors, order = load_dump(dump)
    full = {}
    for pos in positions:
        full[pos] = check_position(label, blob, ids, pos, tensors, order, config)

    pos = positions[-2]
    layer = config["layers"] - 1 if config["layers"] > 1 else 0
    if full.get(pos):
        idarg = ",".join(map(str, ids))
        rc, out, err = run(["./zaya", blob, "--ids", idarg, "--trace", str(pos), "--trace-layer", str(layer)])
        keep, cur = [], None
        for line in full[pos].splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r"^== model\.layers\.(\d+):", line)
            if m:
                cur = int(m.group(1))
            if line.startswith("model.norm"):
                cur = None
            if cur is None or cur == layer:
                keep.append(line)
        got = [l for l in out.splitlines() if not l.startswith("#") and not l.startswith("(")]
        check(rc == 0 and got == keep, f"{label} pos {pos}: --trace-layer {layer} = that layer's lines + the model-level ones",
              next((f"{a!r} vs {b!r}" for a, b in zip(got, keep) if a != b), f"{len(got)} vs {len(keep)} lines; {err[-200:]}"))
        rc, out1, err = run(["./zaya", blob, "--ids", idarg, "--trace", str(pos), "--batch", "1"])
        check(rc == 0 and out1 == full[pos], f"{label} pos {pos}: --batch 1 prints the same trace", err[-200:])
        if text is not None:
            rc, out2, err = run(["./zaya", blob, "-i", text, "--trace", str(pos)])
            check(rc == 0 and out2 == full[pos], f"{label} pos {pos}: -i TEXT prints the same trace as --ids", err[-200:])


def main():
    import json
    native = need_fixtures("checkpoint_native")
    tokdir = tokenizer_dir()
    os.makedirs(BUILD, exist_ok=True)
    rc, _, err = run(["make", "zaya"])
    if not check(rc == 0, "make zaya", err[-300:]):
        finish()

    blob = os.path.join(BUILD, "trace_native.bin")
    rc, _, err = run([sys.executable, "export_weights.py", native, blob])
    if check(rc == 0, "export the fixture", err[-300:]):
        with open(os.path.join(native, "config.json")) as f:
            cfg = json.load(f)
        with open(need_fixtures("index.json")) as f:
            text = json.load(f)["prompt"]["text"]
        config = {"layers": cfg["num_hidden_layers"], "nq": cfg["num_attention_heads"], "nkv": cfg["num_key_value_heads"],
                  "d": cfg["head_dim"], "types": cfg["layer_types"], "window": cfg["sliding_window"],
                  "experts": cfg["num_experts"]}
        ids = prompt_ids()
        # 0: zero-padded conv state; 4: window (5) just full, skip expert in layers 1 and 2; 22: slid window,
        # skip expert in layer 2; last
        check_blob("fixture", blob, ids, [0, 4, 22, len(ids) - 1], config, text)

    odd_dir = os.path.join(BUILD, "trace_odd_ckpt")
    odd = os.path.join(BUILD, "trace_odd.bin")
    rc, _, err = run([sys.executable, "tools/make_checkpoint.py", odd_dir, "--hidden", "96", "--layers", "3", "--heads", "6",
                      "--kv-heads", "2", "--head-dim", "32", "--experts", "3", "--moe-intermediate", "40",
                      "--router-hidden", "24", "--vocab", "1000", "--layer-types", "hybrid,hybrid_sliding",
                      "--sliding-window", "3", "--cca-time0", "3", "--tokenizer-dir", tokdir, "--force", "--quiet"])
    if check(rc == 0, "make the odd-dimension checkpoint", err[-300:]):
        rc, _, err = run([sys.executable, "export_weights.py", odd_dir, odd])
        if check(rc == 0, "export the odd-dimension checkpoint", err[-300:]):
            with open(os.path.join(odd_dir, "config.json")) as f:
                cfg = json.load(f)
            config = {"layers": cfg["num_hidden_layers"], "nq": cfg["num_attention_heads"],
                      "nkv": cfg["num_key_value_heads"], "d": cfg["head_dim"], "types": cfg["layer_types"],
                      "window": cfg["sliding_window"], "experts": cfg["num_experts"]}
            ids = [2, 818, 255, 63, 64, 54, 506, 324, 313, 141, 913, 506, 700]
            check_blob("odd", odd, ids, [0, 1, 2, 6, len(ids) - 1], config)

    # refusals
    if os.path.exists(blob):
        for args, what, want in ((["--ids", "2,818", "--trace", "2"], "a position outside the prompt", "not a position"),
                                 (["--ids", "2,818", "--trace", "1", "--dump", os.path.join(BUILD, "trace_x")],
                                  "--trace with --dump", "cannot be combined"),
                                 (["--ids", "2,818", "--trace", "1", "--trace-layer", "99"], "--trace-layer out of range",
                                  "not a layer"),
                                 (["--ids", "2,818", "--trace-layer", "1"], "--trace-layer without --trace", "needs --trace")):
            rc, out, err = run(["./zaya", blob] + args)
            check(rc != 0 and want in err and not out, f"refused: {what}", f"rc {rc}, stderr {err.strip()[:200]!r}")
    finish()


if __name__ == "__main__":
    main()
