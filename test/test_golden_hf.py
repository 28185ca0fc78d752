#!/usr/bin/env python3
"""test_golden_hf.py - golden_hf.py's hooks, names and writing, against a stub of the HF module tree.

    python3 test/test_golden_hf.py

torch and transformers are not needed: a stub model has the real ZayaForCausalLM module paths and
fires the hooks golden_hf.install_hooks registers, with nested-list "tensors" in the shapes the upstream
modules return (qkv_proj -> [B,S,heads,d] x3, Conv1d -> [B,C,n], router -> (logits [B*S,E+1],
weight [B*S,1], index [B*S,1], state [B,S,R]), experts -> [B*S,H], apply_rotary_pos_emb -> [B,heads,S,d]).
Every value is a deterministic function of (tensor, position, index), so a token-by-token run and a
full-sequence run of the stub must give identical dumps. Checks: every name of compare.execution_order
(except :router_margin, which only the fixture has) is written, in execution order, with the shapes of
docs/compare.md; conv a_(-1) columns and the second v_proj_delayed call are dropped; the raw skip index
is recovered; query/key residuals are right; compare.py agrees dump vs itself and decode vs prefill.
Output: one `PASS name` / `FAIL name: detail` line per check; exit status 1 if any check failed.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import compare  # noqa: E402
import golden_hf  # noqa: E402
from harness import check, finish, temp_dir  # noqa: E402


# stub dimensions: deliberately unlike the fixture (head_dim != hidden / heads, 3 query heads per KV head)
L, H, NQ, NKV, D, E, R, V = 2, 6, 3, 1, 4, 3, 5, 9
C = (NQ + NKV) * D
TOKENS = [2, 7, 4, 8]
SKIP_AT = (1, 2)        # (layer, position) the stub router sends to the skip expert


def val(name, t, i):
    """Deterministic float32-representable stub value of tensor `name` at position t, flat index i."""
    h = sum(ord(c) for c in name) % 97
    return ((h * 31 + t * 17 + i * 7) % 101 - 50) / 64.0


def rows(name, ts, n):
    return [[val(name, t, i) for i in range(n)] for t in ts]


def heads(name, ts, nh):
    return [[[val(name, t, h * D + i) for i in range(D)] for h in range(nh)] for t in ts]


class FakeTensor:
    """Just enough of a 4-D torch tensor for golden_hf.wrap_rope: transpose(1, 2) and tolist()."""

    def __init__(self, x):
        self.x = x

    def transpose(self, a, b):
        assert (a, b) == (1, 2)
        return FakeTensor([[[self.x[bi][h][s] for h in range(len(self.x[bi]))] for s in range(len(self.x[bi][0]))]
                           for bi in range(len(self.x))])

    def detach(self):
        return self

    def cpu(self):
        return self

    def tolist(self):
        return self.x


class Module:
    def __init__(self, **attrs):
        self.hooks, self.pre = [], []
        self.__dict__.update(attrs)

    def register_forward_hook(self, fn):
        self.hooks.append(fn)

    def register_forward_pre_hook(self, fn, with_kwargs=False):
        self.pre.append(fn)

    def call(self, args, output):
        for fn in self.pre:
            fn(self, args, {})
        for fn in self.hooks:
            fn(self, args, output)


class StubModel:
    def __init__(self):
        paths = ["model.embed_tokens", "model.norm"]
        for i in range(L):
            P = f"model.layers.{i}"
            paths += [P, f"{P}.input_layernorm", f"{P}.self_attn", f"{P}.self_attn.qkv_proj",
                      f"{P}.self_attn.qk_norm", f"{P}.self_attn.o_proj", f"{P}.post_attention_residual_scale",
                      f"{P}.post_attention_layernorm", f"{P}.mlp.gate", f"{P}.mlp.gate.down_proj",
                      f"{P}.mlp.gate.router_mlp", f"{P}.mlp.experts", f"{P}.post_mlp_residual_scale"]
            paths += [f"{P}.self_attn.qkv_proj.{p}" for p in
                      ("q_proj", "k_proj", "v_proj_current", "v_proj_delayed", "conv_qk_depthwise", "conv_qk_grouped")]
            paths += [f"{P}.mlp.gate.router_mlp.{p}" for p in ("norm", "fc1", "fc2", "act_fn")]
        self.mods = {p: Module(balancing_biases=[0.0] * E + [-0.5]) for p in paths}
        self.modeling = Module(apply_rotary_pos_emb=lambda q, k, cos, sin: (q, k))

    def named_modules(self):
        return iter(self.mods.items())

    def forward(self, ts, first):
        """Fires the hooks for the positions `ts` in upstream execution order (batch 1)."""
        m = self.mods
        one = lambda x: [x]  # noqa: E731  (add the batch dimension)
        m["model.embed_tokens"].call((), one(rows("model.embed_tokens", ts, H)))
        for i in range(L):
            P, A, Q, G = (f"model.layers.{i}", f"model.layers.{i}.self_attn", f"model.layers.{i}.self_attn.qkv_proj",
                          f"model.layers.{i}.mlp.gate")
            x = one(rows(f"{P}:in", ts, H))
            if i == 0:
                m[P].call((one(rows("model:input_scaled", ts, H)),), None)
            m[A].call((x,), None)
            m[f"{P}.input_layernorm"].call((x,), one(rows(f"{P}.input_layernorm", ts, H)))
            for fn in m[Q].pre:
                fn(m[Q], (x,), {})
            q, k = rows(f"{Q}.q_proj", ts, NQ * D), rows(f"{Q}.k_proj", ts, NKV * D)
            m[f"{Q}.q_proj"].call((x,), one(q))
            m[f"{Q}.k_proj"].call((x,), one(k))
            # conv outputs, channel-first; the depthwise one has one extra column in front (a_(t-1)):
            # from the left padding in a full-sequence call, from the cached state in a decode call
            dw = [[-999.0] + [val(f"{Q}.conv_qk_depthwise", t, c) for t in ts] for c in range(C)]
            m[f"{Q}.conv_qk_depthwise"].call((None,), one(dw))
            gr = [[val(f"{Q}.conv_qk_grouped", t, c) for t in ts] for c in range(C)]
            m[f"{Q}.conv_qk_grouped"].call((None,), one(gr))
            m[f"{Q}.v_proj_current"].call((x,), one(rows(f"{Q}.v_proj_current", ts, NKV * D // 2)))
            m[f"{Q}.v_proj_delayed"].call((x,), one(rows(f"{Q}.v_proj_delayed", ts, NKV * D // 2)))
            if first:   # upstream's second call, on a zero vector
                m[f"{Q}.v_proj_delayed"].call((None,), one([[0.0] * (NKV * D // 2)]))
            for fn in m[Q].hooks:
                fn(m[Q], (x,), (one(heads(f"{Q}:query", ts, NQ)), one(heads(f"{Q}:key", ts, NKV)),
                                one(heads(f"{Q}:value", ts, NKV))))
            qn, kn = heads(f"{A}.qk_norm:query", ts, NQ), heads(f"{A}.qk_norm:key", ts, NKV)
            m[f"{A}.qk_norm"].call((None, None), (one(qn), one(kn)))
            bhsd = lambda hs: FakeTensor([[[s[h] for s in hs] for h in range(len(hs[0]))]])  # noqa: E731
            self.modeling.apply_rotary_pos_emb(bhsd(heads(f"{A}:query_after_rope", ts, NQ)),
                                               bhsd(heads(f"{A}:key_after_rope", ts, NKV)), None, None)
            m[f"{A}.o_proj"].call((one(rows(f"{A}:attn_output", ts, NQ * D)),), one(rows(f"{A}.o_proj", ts, H)))
            for sub in ("post_attention_residual_scale", "post_attention_layernorm"):
                m[f"{P}.{sub}"].call((None,), one(rows(f"{P}.{sub}", ts, H)))
            m[f"{G}.down_proj"].call((None,), one(rows(f"{G}.down_proj", ts, R)))
            for sub in ("norm", "fc1", "fc2"):
                m[f"{G}.router_mlp.{sub}"].call((None,), one(rows(f"{G}.router_mlp.{sub}", ts, R)))
                if sub != "norm":   # the one act_fn module, on fc1's output, then on fc2's
                    m[f"{G}.router_mlp.act_fn"].call((None,), one(rows(f"{G}.router_mlp.act_fn:{sub}", ts, R)))
            logits = rows(f"{G}.router_mlp", ts, E + 1)
            m[f"{G}.router_mlp"].call((None,), one(logits))
            index = [[0 if (i, t) == SKIP_AT else 1 + (t + i) % (E - 1)] for t in ts]
            weight = [[0.0 if (i, t) == SKIP_AT else 0.25 + t / 8] for t in ts]
            m[G].call((None,), (logits, weight, index, one(rows(f"{G}:router_state", ts, R))))
            m[f"{P}.mlp.experts"].call((None,), rows(f"{P}.mlp.experts", ts, H))
            m[f"{P}.post_mlp_residual_scale"].call((None,), one(rows(f"{P}.post_mlp_residual_scale", ts, H)))
        m["model.norm"].call((None,), one(rows("model.norm", ts, H)))


class StubLayerCache:
    def __init__(self, i):
        T = len(TOKENS)
        self.conv_states = [[[[val(f"conv{i}", k, c) for k in range(2)] for c in range(C)]]]      # [1][C, K]
        self.recurrent_states = [[[val(f"rec{i}", 0, j) for j in range(NKV * D // 2)]]]         # [1][D]
        self.keys = [[[[val(f"k{i}", t, h * D + j) for j in range(D)] for t in range(T)] for h in range(NKV)]]
        self.values = [[[[val(f"v{i}", t, h * D + j) for j in range(D)] for t in range(T)] for h in range(NKV)]]


def make_dump(out_dir, mode):
    model = StubModel()
    rec = golden_hf.Recorder()
    golden_hf.install_hooks(model, rec, L, E, NQ, NKV, D)
    golden_hf.wrap_rope(model.modeling, rec)
    T = len(TOKENS)
    calls = [[t] for t in range(T)] if mode == "decode" else [list(range(T))]
    for n, ts in enumerate(calls):
        rec.tokens_in_call = len(ts)
        model.forward(ts, first=(n == 0))
    rec.add("logits", rows("logits", range(T), V))
    cache = Module(layers=[StubLayerCache(i) for i in range(L)])
    golden_hf.record_state(cache, rec, L)
    rec.write(out_dir, L, {"producer": {"program": "test_golden_hf.py stub"}, "skip_expert": "zero",
                           "weight_format": {"dtype": "fp32", "group_size": 0}, "tokens": TOKENS, "run": mode})
    return rec


def expected_shapes(T):
    s = {"model.embed_tokens": [T, H], "model:input_scaled": [T, H], "model.norm": [T, H], "logits": [T, V]}
    per = {"input_layernorm": [T, H], "self_attn.qkv_proj.q_proj": [T, NQ * D], "self_attn.qkv_proj.k_proj": [T, NKV * D],
           "self_attn.qkv_proj.conv_qk_depthwise": [T, C], "self_attn.qkv_proj.conv_qk_grouped": [T, C],
           "self_attn.qkv_proj:query_residual": [T, NQ, D], "self_attn.qkv_proj:key_residual": [T, NKV, D],
           "self_attn.qkv_proj:query": [T, NQ, D], "self_attn.qkv_proj:key": [T, NKV, D],
           "self_attn.qkv_proj.v_proj_current": [T, NKV * D // 2], "self_attn.qkv_proj.v_proj_delayed": [T, NKV * D // 2],
           "self_attn.qkv_proj:value": [T, NKV, D], "self_attn.qk_norm:query": [T, NQ, D], "self_attn.qk_norm:key": [T, NKV, D],
           "self_attn:query_after_rope": [T, NQ, D], "self_attn:key_after_rope": [T, NKV, D],
           "self_attn:attn_output": [T, NQ * D], "self_attn.o_proj": [T, H], "post_attention_residual_scale": [T, H],
           "post_attention_layernorm": [T, H], "mlp.gate.down_proj": [T, R], "mlp.gate:router_state": [T, R],
           "mlp.gate.router_mlp.norm": [T, R], "mlp.gate.router_mlp.fc1": [T, R], "mlp.gate.router_mlp.fc2": [T, R],
           "mlp.gate.router_mlp.act_fn:fc1": [T, R], "mlp.gate.router_mlp.act_fn:fc2": [T, R],
           "mlp.gate.router_mlp": [T, E + 1], "mlp.gate:router_probs": [T, E + 1], "mlp.gate:router_scores": [T, E + 1],
           "mlp.gate.router_indices": [T], "mlp.gate:router_weight": [T], "mlp.experts": [T, H],
           "post_mlp_residual_scale": [T, H],
           "self_attn.qkv_proj:conv_state": [2, C], "self_attn.qkv_proj:delayed_value_state": [NKV * D // 2],
           "self_attn:key_cache": [T, NKV, D], "self_attn:value_cache": [T, NKV, D]}
    for i in range(L):
        s.update({f"model.layers.{i}.{k}": v for k, v in per.items()})
    return s


def main():
    tmp = temp_dir("zaya_golden_hf_")
    dec, pre = os.path.join(tmp, "decode"), os.path.join(tmp, "prefill")
    try:
        make_dump(dec, "decode")
        make_dump(pre, "prefill")
        written = [os.path.exists(os.path.join(d, "index.json")) for d in (dec, pre)]
        check(all(written), "stub runs (token by token and full sequence) write dumps with an index.json",
              f"index.json written: decode {written[0]}, prefill {written[1]}")
    except Exception as e:   # the test reports, never crashes
        check(False, "stub runs write dumps", f"{type(e).__name__}: {e}")
        return
    T = len(TOKENS)
    with open(os.path.join(dec, "index.json")) as f:
        index = json.load(f)
    names = [t["name"] for t in index["tensors"]]
    want = [n for n in compare.execution_order(L) if not n.endswith(":router_margin")]
    check(names == want, "every tensor of docs/compare.md is written, in execution order",
          f"missing {[n for n in want if n not in names][:5]}, extra {[n for n in names if n not in want][:5]}, "
          f"or out of order")
    shapes = expected_shapes(T)
    bad = [(t["name"], t["shape"], shapes.get(t["name"])) for t in index["tensors"] if t["shape"] != shapes.get(t["name"])]
    check(not bad, "shapes match docs/compare.md", str(bad[:4]))
    bad_files = []
    for t in index["tensors"]:
        fname = t["name"].replace(":", "~") + ".npy"
        try:
            shape, data = compare.read_npy(os.path.join(dec, t["file"]))
            with open(os.path.join(dec, t["file"]), "rb") as f:
                head = f.read(12)
            hlen = head[8] | head[9] << 8
            ok = (t["file"] == fname and list(shape) == t["shape"] and (10 + hlen) % 64 == 0
                  and t["dtype"] == ("int32" if data.typecode == "i" else "float32"))
        except compare.InputError:
            ok = False
        if not ok:
            bad_files.append(t["name"])
    check(not bad_files, "file names (':' -> '~'), .npy headers (64-byte aligned) and dtypes", str(bad_files[:4]))
    check(all(k in index for k in ("format_version", "producer", "skip_expert", "tokens", "weight_format")),
          "index.json has the required fields", str(sorted(index)))

    def load(d, name):
        return compare.read_npy(os.path.join(d, name.replace(":", "~") + ".npy"))[1]
    li, t0 = SKIP_AT
    idx = list(load(dec, f"model.layers.{li}.mlp.gate.router_indices"))
    check(idx[t0] == E and all(0 < v < E for j, v in enumerate(idx) if j != t0),
          "raw router index: skip class E recovered from the masked (index 0, weight 0) output", str(idx))
    dw = load(pre, "model.layers.0.self_attn.qkv_proj.conv_qk_depthwise")
    check(-999.0 not in dw and dw[0] == val("model.layers.0.self_attn.qkv_proj.conv_qk_depthwise", 0, 0),
          "depthwise conv: the a_(t-1) column is dropped, rows are positions", str(list(dw[:3])))
    vd = load(dec, "model.layers.1.self_attn.qkv_proj.v_proj_delayed")
    check(len(vd) == T * NKV * D // 2 and vd[0] == val("model.layers.1.self_attn.qkv_proj.v_proj_delayed", 0, 0),
          "v_proj_delayed: this token's projection only (the zero-vector call is dropped)", str(len(vd)))
    Q = "model.layers.0.self_attn.qkv_proj"
    qres, kres = load(dec, f"{Q}:query_residual"), load(dec, f"{Q}:key_residual")
    t, n, i = 2, 2, 3
    want_q = (val(f"{Q}.q_proj", t, n * D + i) + val(f"{Q}.k_proj", t, (n // (NQ // NKV)) * D + i)) * 0.5
    want_k = sum((val(f"{Q}.q_proj", t, m * D + i) + val(f"{Q}.k_proj", t, i)) * 0.5 for m in range(NQ)) / NQ
    got_q, got_k = qres[(t * NQ + n) * D + i], kres[t * NKV * D + i]
    check(abs(got_q - want_q) < 1e-6 and abs(got_k - want_k) < 1e-6, "query/key residual formulas",
          f"{got_q} vs {want_q}, {got_k} vs {want_k}")
    rope = load(dec, "model.layers.1.self_attn:query_after_rope")
    check(rope[(1 * NQ + 2) * D + 1] == val("model.layers.1.self_attn:query_after_rope", 1, 2 * D + 1),
          "rope outputs [B,heads,S,d] stored token-major [S,heads,d]", "")
    kc = load(dec, "model.layers.0.self_attn:key_cache")
    check(kc[(3 * NKV + 0) * D + 2] == val("k0", 3, 2), "key cache [B,nkv,T,d] stored as [T,nkv,d]", "")
    cs = load(dec, "model.layers.1.self_attn.qkv_proj:conv_state")
    check(cs[1 * C + 5] == val("conv1", 1, 5), "conv state [B,C,K] stored as [K,C]", "")
    with open(os.path.join(dec, "index.json")) as f:
        computed = {t["name"] for t in json.load(f)["tensors"] if "computed" in t}
    check("model.layers.0.mlp.gate:router_probs" in computed and "model.layers.0.self_attn.o_proj" not in computed,
          "intermediates not taken from a module output are marked computed", str(sorted(computed)[:3]))

    for label, a, b in (("itself", dec, dec), ("the full-sequence run", dec, pre)):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), a, b], capture_output=True, text=True)
        check(p.returncode == 0 and "RESULT: AGREE" in p.stdout and "only in" not in p.stdout,
              f"compare.py: token-by-token stub dump vs {label} agrees (exit 0)",
              f"exit {p.returncode}: {(p.stdout + p.stderr)[-600:]}")


if __name__ == "__main__":
    main()
    finish()
