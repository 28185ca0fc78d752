#!/usr/bin/env python3
"""golden_hf.py - dump the official transformers ZAYA forward pass in our golden-dump format.

    python3 tools/golden_hf.py CKPT_DIR (--ids 2,818,... | --prompt TEXT) --out DIR [--mode decode|prefill]

Loads transformers' ZayaForCausalLM from a native hub checkpoint folder in float32 with eager attention,
registers forward hooks on the modules whose outputs we dump, runs the prompt and writes DIR/index.json
plus one .npy per tensor, with the names and shapes of docs/compare.md, so that
`python3 compare.py ZAYA_DUMP DIR` compares zaya.c (or any port) with the official code.

--mode decode (default): one token per forward call with the model's cache, like ./zaya's token loop;
--mode prefill: one full-sequence forward. index.json `run` says which. The upstream code always gives a
skip-routed token a zero MoE output (skip_expert "zero").

Every tensor is a hooked module output except these, computed here and marked "computed" in index.json:
- model:input_scaled            the input of model.layers.0 (forward pre-hook)
- self_attn:attn_output         the input of o_proj (forward pre-hook)
- self_attn:query/key_after_rope  outputs of modeling_zaya.apply_rotary_pos_emb (wrapped while running)
- qkv_proj:query_residual / :key_residual  (q_proj[n] + k_proj[n // g]) / 2 and its mean per KV head,
  from the q_proj/k_proj outputs in Python (query exact; key within 1 ulp of torch's mean)
- mlp.gate:router_probs / :router_scores  softmax(router logits) and + balancing_biases, with the same
  torch ops as ZayaRouter.forward; mlp.gate.router_indices is the RAW top-1 class (the router's own
  output is masked: a skip token gets index 0 and weight 0), recovered as E where the router returned
  index 0 with weight 0
- the state after the run (conv state, delayed value, K/V caches) read from the cache object.
After loading, the checkpoint's values are put back into the buffers it stores (restore_buffers: transformers
5.24 resets the routers' balancing_biases after loading, which moves the router scores and the routing).
torch and transformers are imported inside main(); the naming and writing code (Recorder, install_hooks)
is tested without them by test/test_golden_hf.py against a stub module tree.
"""
import argparse
import array
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from compare import execution_order, write_dump  # noqa: E402


def as_list(x):
    """A torch tensor (or a nested list, in the tests) as nested Python lists."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        return x.tolist()
    return x


def flatten(x):
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (list, tuple)):
        return list(x)                       # a row of numbers (fast path for 262272-wide logits)
    if isinstance(x, (list, tuple)):
        out = []
        for v in x:
            out.extend(flatten(v))
        return out
    return [x]


def dims(x):
    d = []
    while isinstance(x, (list, tuple)):
        d.append(len(x))
        x = x[0] if x else None
    return d


class Recorder:
    """Collects rows per tensor name: token-major, one call may add S rows (S = tokens in the call)."""

    def __init__(self):
        self.rows = {}       # name -> list of flat rows
        self.trail = {}      # name -> trailing shape
        self.ints = set()
        self.state = {}      # name -> (shape, flat values)
        self.computed = {}   # name -> how it was obtained, if not a module output
        self.layer = None    # the decoder layer running now (set by a pre-hook on self_attn)
        self.tokens_in_call = 1
        self.v_delayed_seen = set()

    def add(self, name, rows, is_int=False, how=None):
        """rows: nested list [S, ...] (batch dimension already removed)."""
        trail = dims(rows[0]) if rows and isinstance(rows[0], list) else []
        if name in self.trail and self.trail[name] != trail:
            raise ValueError(f"{name}: rows of shape {trail} after rows of shape {self.trail[name]}")
        self.trail[name] = trail
        code = "i" if is_int else "f"
        self.rows.setdefault(name, []).extend(array.array(code, flatten(r)) for r in rows)
        if is_int:
            self.ints.add(name)
        if how:
            self.computed[name] = how

    def add_state(self, name, nested, how):
        self.state[name] = (dims(nested), flatten(nested))
        self.computed[name] = how

    def tensors(self, n_layers):
        order = execution_order(n_layers)
        known = [n for n in order if n in self.rows or n in self.state]
        extra = [n for n in list(self.rows) + list(self.state) if n not in order]
        out = []
        for name in known + extra:
            if name in self.state:
                shape, flat = self.state[name]
            else:
                rows = self.rows[name]
                shape, flat = [len(rows)] + self.trail[name], [v for r in rows for v in r]
            data = array.array("i" if name in self.ints else "f", flat)
            if name not in self.state and len(data) != len(rows) * max(1, len(rows[0])):
                raise ValueError(f"{name}: rows of different lengths")
            info = {"computed": self.computed[name]} if name in self.computed else {}
            out.append((name, shape, data, info))
        return out

    def write(self, out_dir, n_layers, meta):
        write_dump(out_dir, self.tensors(n_layers), meta)


def drop_batch(x):
    x = as_list(x)
    return x[0]


def residuals(q_rows, k_rows, nq, nkv, d):
    """query_residual [S, nq, d] and key_residual [S, nkv, d] from q_proj [S, nq*d] and k_proj [S, nkv*d]."""
    g = nq // nkv
    f32 = lambda v: array.array("f", v).tolist()  # noqa: E731
    qres, kres = [], []
    for q, k in zip(q_rows, k_rows):
        heads = [f32([(q[n * d + i] + k[(n // g) * d + i]) * 0.5 for i in range(d)]) for n in range(nq)]
        qres.append(heads)
        kres.append([f32([sum(heads[j * g + r][i] for r in range(g)) / g for i in range(d)]) for j in range(nkv)])
    return qres, kres


def residuals_in(torch, dtype):
    """residuals() as a model loaded in `dtype` computes them (modeling_zaya's ZayaCCAProjection: q + k in that
    dtype, then * 0.5, the mean per KV head in torch): for a bf16 model, the float32 arithmetic of residuals()
    is not what the model computes, and a port's step check would judge it as the port's."""
    def mix(q_rows, k_rows, nq, nkv, d):
        S, g = len(q_rows), nq // nkv
        q = torch.tensor(q_rows, dtype=dtype).view(S, nq, d)
        k = torch.tensor(k_rows, dtype=dtype).view(S, nkv, d).repeat_interleave(g, dim=1)
        qres = (q + k) * 0.5
        return qres.float().tolist(), qres.view(S, nkv, g, d).mean(dim=-2).float().tolist()
    return mix


def restore_buffers(torch, model, ckpt):
    """Puts the checkpoint's values back into the model's buffers that it stores (the routers'
    balancing_biases): transformers 5.24's _init_weights resets that buffer after loading (its last entry
    to -1), which moves the router scores and the routing. Returns the names restored."""
    import glob
    from safetensors import safe_open
    buffers, restored = dict(model.named_buffers()), []
    for path in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if name in buffers:
                    with torch.no_grad():
                        buffers[name].copy_(f.get_tensor(name).to(buffers[name].dtype))
                    restored.append(name)
    return restored


def install_hooks(model, rec, n_layers, n_experts, nq, nkv, d, mix=residuals):
    """Registers the hooks on a ZayaForCausalLM (or a stub with the same module paths). mix computes the
    residual mix's taps from the q_proj / k_proj outputs (residuals, or residuals_in for a bf16 model)."""
    mods = dict(model.named_modules())
    handles = []

    def out_hook(path, name, pick=None, how=None):
        def hook(module, inputs, output):
            rec.add(name, drop_batch(output if pick is None else output[pick]), how=how)
        handles.append(mods[path].register_forward_hook(hook))

    def transposed_conv_hook(path, name):
        # Conv1d output [B, C, n] -> its last S columns as rows [S, C] (S = tokens of this call; the
        # depthwise conv also outputs a_(t-1) columns for the left padding / cached state: dropped)
        def hook(module, inputs, output):
            cols = drop_batch(output)
            n, S = len(cols[0]), rec.tokens_in_call
            rec.add(name, [[col[t] for col in cols] for t in range(n - S, n)])
        handles.append(mods[path].register_forward_hook(hook))

    out_hook("model.embed_tokens", "model.embed_tokens")

    def input_scaled(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        rec.add("model:input_scaled", drop_batch(x), how="input of model.layers.0 (forward pre-hook)")
    handles.append(mods["model.layers.0"].register_forward_pre_hook(input_scaled, with_kwargs=True))

    for i in range(n_layers):
        P = f"model.layers.{i}"
        A, Q, G = f"{P}.self_attn", f"{P}.self_attn.qkv_proj", f"{P}.mlp.gate"

        def attn_pre(module, args, kwargs, i=i):
            rec.layer = i
        handles.append(mods[A].register_forward_pre_hook(attn_pre, with_kwargs=True))
        out_hook(f"{P}.input_layernorm", f"{P}.input_layernorm")
        for proj in ("q_proj", "k_proj", "v_proj_current"):
            out_hook(f"{Q}.{proj}", f"{Q}.{proj}")

        def v_delayed(module, inputs, output, P=P, Q=Q):
            # the first call of each forward is this token's projection; upstream calls it a second time on
            # a zero vector (the t = -1 input) when the cache has no state yet
            if P not in rec.v_delayed_seen:
                rec.v_delayed_seen.add(P)
                rec.add(f"{Q}.v_proj_delayed", drop_batch(output))
        handles.append(mods[f"{Q}.v_proj_delayed"].register_forward_hook(v_delayed))
        transposed_conv_hook(f"{Q}.conv_qk_depthwise", f"{Q}.conv_qk_depthwise")
        transposed_conv_hook(f"{Q}.conv_qk_grouped", f"{Q}.conv_qk_grouped")

        def qkv_out(module, inputs, output, P=P, Q=Q):
            query, key, value = (drop_batch(o) for o in output)
            qres, kres = mix(rec.rows[f"{Q}.q_proj"][-len(query):], rec.rows[f"{Q}.k_proj"][-len(query):],
                                   nq, nkv, d)
            how = "(q_proj[n] + k_proj[n // g]) / 2 from the q_proj/k_proj outputs"
            rec.add(f"{Q}:query_residual", qres, how=how)
            rec.add(f"{Q}:key_residual", kres, how="mean of the query residuals of each KV head")
            rec.add(f"{Q}:query", query)
            rec.add(f"{Q}:key", key)
            rec.add(f"{Q}:value", value)
        handles.append(mods[Q].register_forward_hook(qkv_out))

        def qkv_pre(module, args, kwargs, P=P):
            rec.v_delayed_seen.discard(P)
        handles.append(mods[Q].register_forward_pre_hook(qkv_pre, with_kwargs=True))
        out_hook(f"{A}.qk_norm", f"{A}.qk_norm:query", pick=0)
        out_hook(f"{A}.qk_norm", f"{A}.qk_norm:key", pick=1)

        def o_pre(module, args, kwargs, A=A):
            x = args[0] if args else kwargs["input"]
            rec.add(f"{A}:attn_output", drop_batch(x), how="input of o_proj (forward pre-hook)")
        handles.append(mods[f"{A}.o_proj"].register_forward_pre_hook(o_pre, with_kwargs=True))
        out_hook(f"{A}.o_proj", f"{A}.o_proj")
        out_hook(f"{P}.post_attention_residual_scale", f"{P}.post_attention_residual_scale")
        out_hook(f"{P}.post_attention_layernorm", f"{P}.post_attention_layernorm")
        out_hook(f"{G}.down_proj", f"{G}.down_proj")
        for sub in ("norm", "fc1", "fc2"):
            out_hook(f"{G}.router_mlp.{sub}", f"{G}.router_mlp.{sub}")

        def act_out(module, inputs, output, G=G, calls=[]):   # noqa: B006  (one act_fn, called on fc1 then fc2)
            calls.append(1)
            rec.add(f"{G}.router_mlp.act_fn:" + ("fc1" if len(calls) % 2 else "fc2"), drop_batch(output))
        handles.append(mods[f"{G}.router_mlp.act_fn"].register_forward_hook(act_out))
        out_hook(f"{G}.router_mlp", f"{G}.router_mlp")

        def gate_out(module, inputs, output, G=G):
            logits, weight, index, state = output
            if hasattr(logits, "softmax"):       # torch: the same ops as ZayaRouter.forward
                probs = logits.softmax(dim=-1)
                scores = probs.detach().float() + module.balancing_biases
            else:                                # stub tensors in the tests
                import math
                probs = []
                for row in logits:
                    m = max(row)
                    e = [math.exp(v - m) for v in row]
                    probs.append([v / sum(e) for v in e])
                scores = [[p + b for p, b in zip(row, module.balancing_biases)] for row in probs]
            how = "computed from the router logits with the ops of ZayaRouter.forward"
            rec.add(f"{G}:router_state", drop_batch(state), how="router output 3 (post-EDA, pre-norm state)")
            rec.add(f"{G}:router_probs", as_list(probs), how="softmax(router logits): " + how)
            rec.add(f"{G}:router_scores", as_list(scores), how="router_probs + balancing_biases: " + how)
            w = [r[0] for r in as_list(weight)]
            idx = [r[0] for r in as_list(index)]
            raw = [n_experts if (j == 0 and x == 0) else j for j, x in zip(idx, w)]
            rec.add(f"{G}.router_indices", raw, is_int=True,
                    how="raw top-1: the router's masked index, E where it returned index 0 with weight 0")
            rec.add(f"{G}:router_weight", w)
        handles.append(mods[G].register_forward_hook(gate_out))

        def experts_out(module, inputs, output, P=P):
            rec.add(f"{P}.mlp.experts", as_list(output))          # [B*S, H] with B = 1
        handles.append(mods[f"{P}.mlp.experts"].register_forward_hook(experts_out))
        out_hook(f"{P}.post_mlp_residual_scale", f"{P}.post_mlp_residual_scale")
    out_hook("model.norm", "model.norm")
    return handles


def wrap_rope(modeling, rec):
    """Records apply_rotary_pos_emb's outputs ([B, heads, S, d] -> rows [S, heads, d]) for the running layer."""
    original = modeling.apply_rotary_pos_emb

    def wrapped(q, k, cos, sin, *args, **kwargs):
        q_embed, k_embed = original(q, k, cos, sin, *args, **kwargs)
        P = f"model.layers.{rec.layer}.self_attn"
        how = "output of modeling_zaya.apply_rotary_pos_emb (wrapped)"
        rec.add(f"{P}:query_after_rope", drop_batch(q_embed.transpose(1, 2)), how=how)
        rec.add(f"{P}:key_after_rope", drop_batch(k_embed.transpose(1, 2)), how=how)
        return q_embed, k_embed
    modeling.apply_rotary_pos_emb = wrapped
    return original


def record_state(cache, rec, n_layers):
    """Conv state [K, C], delayed value [nkv*d/2], K/V caches [T', nkv, d] of every layer after the run."""
    for i in range(n_layers):
        P = f"model.layers.{i}"
        layer = cache.layers[i] if hasattr(cache, "layers") else None
        conv = getattr(layer, "conv_states", None)
        if conv is not None:
            cs = drop_batch(conv[0])                                  # [C, K]
            rec.add_state(f"{P}.self_attn.qkv_proj:conv_state", [list(col) for col in zip(*cs)],
                          "cache conv_states[0] transposed to [K, C] (raw pre-conv q/k, oldest first)")
        rs = getattr(layer, "recurrent_states", None)
        if rs is not None:
            rec.add_state(f"{P}.self_attn.qkv_proj:delayed_value_state", drop_batch(rs[0]),
                          "cache recurrent_states[0]: v_proj_delayed of the last token")
        for attr, name in (("keys", "key_cache"), ("values", "value_cache")):
            t = getattr(layer, attr, None)
            if t is not None:
                kv = drop_batch(t)                                    # [nkv, T', d]
                rec.add_state(f"{P}.self_attn:{name}", [list(r) for r in zip(*kv)],
                              f"cache layer .{attr} transposed to [T', nkv, d]")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Dump the official transformers ZAYA forward (docs/compare.md).")
    ap.add_argument("ckpt")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids, e.g. 2,818,2255")
    src.add_argument("--prompt", help="text; encoded as BOS + tokenizer(text, add_special_tokens=False)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    args = ap.parse_args(argv)
    try:
        import torch
        import transformers
        from transformers.models.zaya import modeling_zaya
    except ImportError as e:
        print(f"golden_hf.py: needs torch and a transformers with ZAYA support ({e})\n"
              f"  hint: pip install torch 'transformers>=5' on a machine with a package index", file=sys.stderr)
        return 2
    if not os.path.isdir(args.ckpt):
        print(f"golden_hf.py: {args.ckpt} is not a checkpoint folder", file=sys.stderr)
        return 2
    if args.ids:
        try:
            ids = [int(x) for x in args.ids.split(",")]
        except ValueError:
            print(f"golden_hf.py: --ids must be comma-separated integers, got {args.ids!r}", file=sys.stderr)
            return 2
    else:
        tok = transformers.AutoTokenizer.from_pretrained(args.ckpt)
        ids = [tok.bos_token_id] + tok(args.prompt, add_special_tokens=False)["input_ids"]

    model = modeling_zaya.ZayaForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32,
                                                          attn_implementation="eager")
    model.eval()
    restore_buffers(torch, model, args.ckpt)
    cfg = model.config
    rec = Recorder()
    dtype = next(model.parameters()).dtype   # float32 here; another when a caller loads it otherwise (golden_variant)
    install_hooks(model, rec, cfg.num_hidden_layers, cfg.num_experts, cfg.num_attention_heads,
                  cfg.num_key_value_heads, cfg.head_dim,
                  mix=residuals if dtype == torch.float32 else residuals_in(torch, dtype))
    wrap_rope(modeling_zaya, rec)
    logits, cache = [], None
    with torch.no_grad():
        chunks = [ids[t:t + 1] for t in range(len(ids))] if args.mode == "decode" else [ids]
        for chunk in chunks:
            rec.tokens_in_call = len(chunk)
            out = model(input_ids=torch.tensor([chunk]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.extend(as_list(out.logits.float())[0])
    rec.add("logits", logits)
    record_state(cache, rec, cfg.num_hidden_layers)
    commit = None
    try:
        import subprocess
        commit = subprocess.run(["git", "-C", os.path.dirname(transformers.__file__), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    meta = {
        "producer": {"program": "tools/golden_hf.py (transformers ZayaForCausalLM)",
                     "version": transformers.__version__, "commit": commit, "torch": torch.__version__},
        "model": {"path": os.path.abspath(args.ckpt), "source_layout": "native"},
        "weight_format": {"dtype": "fp32", "group_size": 0, "note": "checkpoint loaded with dtype=torch.float32"},
        "skip_expert": "zero",
        "tokens": ids,
        "run": ("token by token with the cache (one forward call per token)" if args.mode == "decode"
                else "one full-sequence forward"),
        "attention": "eager",
    }
    rec.write(args.out, cfg.num_hidden_layers, meta)
    print(f"wrote {args.out}: {len(rec.rows) + len(rec.state)} tensors, {len(ids)} tokens ({meta['run']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
