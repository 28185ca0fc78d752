#!/usr/bin/env python3
"""official_variants.py - the official transformers ZAYA forward in bf16 / fp16, with one change, dumped.

    /work/venv/bin/python bench/official_variants.py CKPT_DIR --ids 2,818,... --out DIR VARIANT[:LAYER] ...

Runs transformers' ZayaForCausalLM (eager attention, one full-sequence forward) in the precision a variant
names and writes a dump with tools/golden_hf.py's hooks (the router MLP's two GELU outputs included). Legitimate runs and
bugs for the margins of the step check (docs/compare.md §9, bench/README.md); torch and transformers
needed (not a test):

  official        bf16, as published
  fp16            float16 storage (the official code in torch.float16)
  fp32res         bf16, both residual scalings computed in float32 (the branch not rounded), output fp32
  fp32res_bf16    the same, the output rounded to bf16 (a port with a bf16 residual stream)
  gelu_tanh:L     bf16, layer L's router GELU the tanh approximation (llama.cpp's ggml_gelu)  [a bug]
  o_proj_2pct:L   bf16, layer L's o_proj output x 1.02                                       [a bug]
  experts_2pct:L  bf16, layer L's experts output x 1.02                                      [a bug]
  no_rbias:L      bf16, layer L's post-attention residual_bias left out                      [a bug]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
sys.path.insert(0, os.path.dirname(HERE))
import golden_hf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", required=True, help="a folder; each variant is dumped into OUT/VARIANT")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    import torch
    from transformers.models.zaya import modeling_zaya
    ids = [int(x) for x in a.ids.split(",")]
    orig_scaling = modeling_zaya.ZayaResidualScaling.forward
    for spec in a.variants:
        kind, _, layer = spec.partition(":")
        layer = int(layer) if layer else None
        dtype = torch.float16 if kind == "fp16" else torch.bfloat16
        model = modeling_zaya.ZayaForCausalLM.from_pretrained(a.ckpt, dtype=dtype, attn_implementation="eager")
        model.eval()
        cfg = model.config
        modeling_zaya.ZayaResidualScaling.forward = orig_scaling
        if kind.startswith("fp32res"):
            out_bf16 = kind == "fp32res_bf16"

            def scaling(self, hidden_states, residual, out_bf16=out_bf16):
                h = (hidden_states.float() + self.hidden_states_bias.float()) * self.hidden_states_scale.float()
                r = (residual.float() + self.residual_bias.float()) * self.residual_scale.float()
                y = h + r
                return y.to(torch.bfloat16) if out_bf16 else y
            modeling_zaya.ZayaResidualScaling.forward = scaling
        L = model.model.layers[layer] if layer is not None else None
        if kind == "gelu_tanh":   # the module's own approximation switched (the hooks stay on the same module)
            L.mlp.gate.router_mlp.act_fn.approximate = "tanh"
        elif kind in ("o_proj_2pct", "experts_2pct"):
            mod = L.self_attn.o_proj if kind == "o_proj_2pct" else L.mlp.experts
            mod.register_forward_hook(lambda m, i, o: o * 1.02)
        elif kind == "no_rbias":
            with torch.no_grad():
                L.post_attention_residual_scale.residual_bias.zero_()
        rec = golden_hf.Recorder()
        golden_hf.install_hooks(model, rec, cfg.num_hidden_layers, cfg.num_experts, cfg.num_attention_heads,
                                cfg.num_key_value_heads, cfg.head_dim, mix=golden_hf.residuals_in(torch, dtype))
        golden_hf.wrap_rope(modeling_zaya, rec)
        with torch.no_grad():
            rec.tokens_in_call = len(ids)
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
        rec.add("logits", golden_hf.as_list(out.logits.float())[0])
        golden_hf.record_state(out.past_key_values, rec, cfg.num_hidden_layers)
        meta = {"producer": {"program": f"bench/official_variants.py {spec}", "torch": torch.__version__},
                "model": {"path": os.path.abspath(a.ckpt), "source_layout": "native"},
                "weight_format": {"dtype": str(dtype).split(".")[-1]}, "skip_expert": "zero", "tokens": ids,
                "run": "one full-sequence forward", "attention": "eager", "precision": "bf16"}
        folder = os.path.join(a.out, spec.replace(":", "_L"))
        rec.write(folder, cfg.num_hidden_layers, meta)
        print(f"wrote {folder}")
    modeling_zaya.ZayaResidualScaling.forward = orig_scaling


if __name__ == "__main__":
    main()
