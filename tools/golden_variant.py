#!/usr/bin/env python3
"""golden_variant.py - the official ZAYA code with ONE code difference in every layer, dumped like a port.

    python3 tools/golden_variant.py CKPT_DIR --variant NAME (--ids 2,818,... | --prompt TEXT) --out DIR
        [--dtype fp32|bf16] [--mode prefill|decode] [--keep-logits]

A stand-in for a port whose weights are the checkpoint's but whose code differs in one step that every
layer runs: tools/golden_hf.py's hooks and dump format (docs/compare.md), after monkeypatching
transformers' modeling_zaya so that every layer computes the variant. `compare.py --local DIR --model
CKPT.bin` (--bf16 for a bf16 run) must then name that step in the first layer it applies to
(test/test_diagnose.py runs it on recorded dumps). Variants:

  conv_f16          the grouped CCA conv rounds its kernel and input to F16 (llama.cpp's port does)
  router_gelu_tanh  the router MLP's two GELUs are the tanh approximation
  rope_sliding      the hybrid_sliding layers rotate with the hybrid layers' RoPE base (a GGUF holds one)
  no_residual_bias  post_attention_residual_scale leaves out residual_bias
  none              the official code unchanged

--dtype bf16 loads the checkpoint as from_pretrained(dtype=torch.bfloat16). Without --keep-logits the
dump keeps model:input_scaled and the layers' taps only (what --local reads; the logits are 40 MB).
Needs torch and a transformers with models/zaya (never the tests).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import golden_hf  # noqa: E402
from zaya_compare.names import LAYER_STATE  # noqa: E402

LAYER_STATE_T = tuple(LAYER_STATE)

VARIANTS = {
    "conv_f16": "the grouped CCA conv (conv_qk_grouped) rounds its kernel and its input to F16, as llama.cpp's port does",
    "router_gelu_tanh": "the router MLP's GELUs (after fc1 and fc2) are the tanh approximation",
    "rope_sliding": "the hybrid_sliding layers use the hybrid layers' rope_theta",
    "no_residual_bias": "post_attention_residual_scale leaves out residual_bias",
    "none": "the official code unchanged",
}


def patch(variant, torch, modeling):
    """Monkeypatches modeling_zaya so that every layer computes the variant."""
    F = torch.nn.functional
    if variant == "conv_f16":
        init = modeling.ZayaCCAProjection.__init__

        def init_f16(self, config, layer_idx):
            init(self, config, layer_idx)
            conv = self.conv_qk_grouped

            def forward(x, conv=conv):
                w = conv.weight.to(torch.float16).to(x.dtype)
                return F.conv1d(x.to(torch.float16).to(x.dtype), w, conv.bias, conv.stride, conv.padding,
                                conv.dilation, conv.groups)
            conv.forward = forward
        modeling.ZayaCCAProjection.__init__ = init_f16
    elif variant == "router_gelu_tanh":
        init = modeling.ZayaRouterMLP.__init__

        def init_tanh(self, *a, **k):
            init(self, *a, **k)
            self.act_fn = torch.nn.GELU(approximate="tanh")
        modeling.ZayaRouterMLP.__init__ = init_tanh
    elif variant == "rope_sliding":
        compute = modeling.ZayaRotaryEmbedding.compute_default_rope_parameters

        def compute_one_base(config, device=None, layer_type=None, **kwargs):
            import copy
            cfg = copy.deepcopy(config)
            for t in cfg.rope_parameters:
                cfg.rope_parameters[t] = dict(cfg.rope_parameters[t], rope_theta=config.rope_parameters["hybrid"]["rope_theta"])
            return compute(cfg, device, layer_type=layer_type, **kwargs)
        modeling.ZayaRotaryEmbedding.compute_default_rope_parameters = staticmethod(compute_one_base)
    elif variant == "no_residual_bias":
        def forward(self, hidden_states, residual):
            hidden_states = (hidden_states + self.hidden_states_bias) * self.hidden_states_scale
            return hidden_states + residual * self.residual_scale
        init = modeling.ZayaDecoderLayer.__init__

        def init_nobias(self, config, layer_idx):
            init(self, config, layer_idx)
            m = self.post_attention_residual_scale
            m.forward = forward.__get__(m)
        modeling.ZayaDecoderLayer.__init__ = init_nobias


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids")
    src.add_argument("--prompt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="prefill")
    ap.add_argument("--keep-logits", action="store_true")
    args = ap.parse_args(argv)
    import torch
    from transformers.models.zaya import modeling_zaya
    patch(args.variant, torch, modeling_zaya)
    load = modeling_zaya.ZayaForCausalLM.from_pretrained

    def load_exact(*a, **k):   # golden_hf.main puts the checkpoint's balancing_biases back after loading
        if args.dtype == "bf16":
            k["dtype"] = torch.bfloat16
        return load(*a, **k)
    modeling_zaya.ZayaForCausalLM.from_pretrained = load_exact
    rc = golden_hf.main([args.ckpt, "--out", args.out, "--mode", args.mode]
                        + (["--ids", args.ids] if args.ids else ["--prompt", args.prompt]))
    if rc:
        return rc
    path = os.path.join(args.out, "index.json")
    index = json.load(open(path))
    index["producer"]["program"] = (f"tools/golden_variant.py --variant {args.variant} --dtype {args.dtype} "
                                    f"(transformers ZayaForCausalLM, monkeypatched: {VARIANTS[args.variant]})")
    if args.dtype == "bf16":
        index["weight_format"] = {"dtype": "bf16", "group_size": 0, "note": "from_pretrained(dtype=torch.bfloat16)"}
    if not args.keep_logits:
        keep = [t for t in index["tensors"] if t["name"] == "model:input_scaled"
                or (t["name"].startswith("model.layers.") and not t["name"].endswith(LAYER_STATE_T))]
        for t in index["tensors"]:
            if t not in keep:
                os.remove(os.path.join(args.out, t["file"]))
        index["tensors"] = keep
    json.dump(index, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
