"""vl_checkpoint.py - the ZAYA1-VL fixture checkpoint from its two committed parts (standard library only).

The compact ZAYA1-VL of test/fixtures/vl/ shares its language model with test/fixtures/checkpoint_native/
(the real 262,272-token vocabulary is 8 MB of embedding, committed once): vl/extra.safetensors holds only
the vision tower (model.visual.*) and the decoder's vision LoRA pairs. compose() writes the whole checkpoint
in the layout of the official Zaya1VLForConditionalGeneration (transformers PR #46011):
    model.X                                   -> model.language_model.X
    model.norm.weight                         -> model.language_model.final_norm.weight
    ...mlp.gate.router_mlp.norm.weight        -> ...mlp.gate.router_mlp.rmsnorm_eda.weight
plus the extra tensors as they are, and config.json = vl/config.json.

    python3 tools/vl_checkpoint.py test/fixtures OUT_DIR
    python3 tools/vl_checkpoint.py --zyphra OUT_DIR ZYPHRA_DIR    # the same in Zyphra's layout (the hub's)
"""
import json
import os
import shutil
import struct
import sys


def read_safetensors(path):
    """-> (header dict without __metadata__, raw bytes of the data section)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, not a safetensors file (hint: restore test/fixtures)")
    n = struct.unpack("<Q", blob[:8])[0]
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header of {n} bytes runs past the end of the file ({len(blob)} bytes): truncated")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    for name, e in header.items():
        a, b = e["data_offsets"]
        if b > len(data):
            raise ValueError(f"{path}: tensor {name} ends at byte {b} of a {len(data)}-byte data section: truncated")
    return header, data


def text_to_vl_name(name):
    if name == "model.norm.weight":
        return "model.language_model.final_norm.weight"
    name = name.replace(".mlp.gate.router_mlp.norm.", ".mlp.gate.router_mlp.rmsnorm_eda.")
    assert name.startswith("model."), name
    return "model.language_model." + name[len("model."):]


def relabel_in_place(path, relabel, chunk=1 << 26):
    """Give the safetensors file at path the header relabel(header) (names, shapes, offsets into the same data
    section: renames, or a stacked tensor described as its slices), in place: the new header is written and
    the data section moved behind it (copied from its end backwards, `chunk` bytes at a time), so a
    full-size file is relabelled with no second copy on disk and little memory. Returns the new header."""
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        n = struct.unpack("<Q", f.read(8))[0]
        if 8 + n > size:
            raise ValueError(f"{path}: header of {n} bytes runs past the end of the file ({size} bytes): truncated")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        new = relabel(header)
        if meta is not None:
            new["__metadata__"] = meta
        h = json.dumps(new, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        h += b" " * max(0, n - len(h))                # a shorter header is padded to the old length
        shift, end = len(h) - n, size
        while shift and end > 8 + n:                  # move the data section `shift` bytes on, last chunk first
            start = max(8 + n, end - chunk)
            f.seek(start)
            buf = f.read(end - start)
            f.seek(start + shift)
            f.write(buf)
            end = start
        f.seek(0)
        f.write(struct.pack("<Q", len(h)) + h)
    new.pop("__metadata__", None)
    return new


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, data) in file order; data is the raw bytes, an array (written as its
    bytes), or a byte count alone: a file of only its header (no data; export_weights.py --dry-run's input)."""
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        nbytes = data if isinstance(data, int) else data.nbytes if hasattr(data, "nbytes") else len(data)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, data in tensors:
            if hasattr(data, "tofile"):
                data.tofile(f)
            elif not isinstance(data, int):
                f.write(data)


def compose(fixtures, out, vl_dir=None):
    vl_dir = vl_dir or os.path.join(fixtures, "vl")
    os.makedirs(out, exist_ok=True)
    tensors = []
    for part, rename in ((os.path.join(fixtures, "checkpoint_native", "model.safetensors"), text_to_vl_name),
                         (os.path.join(vl_dir, "extra.safetensors"), lambda n: n)):
        header, data = read_safetensors(part)
        for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
            e = header[name]
            a, b = e["data_offsets"]
            tensors.append((rename(name), e["dtype"], e["shape"], data[a:b]))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    shutil.copyfile(os.path.join(vl_dir, "config.json"), os.path.join(out, "config.json"))
    for tok in ("tokenizer.json.gz", "tokenizer_config.json.gz"):
        src = os.path.join(fixtures, "tokenizer", tok)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out, tok))
    return out


# Zyphra's own layout (the hub checkpoint's; the input of the pull request's convert_zaya1_vl_weights_to_hf.py),
# written here by inverting that script's renames: model.layers.{i}.attn.* / .mlp.* blocks holding the fork's names,
# experts and their LoRA pairs one tensor per expert, the vision tower under vision_tower.*, a flat config.json.
ZYPHRA_BLOCK = (   # transformers' leaf (after model.language_model.layers.{i}.) -> Zyphra's (after model.layers.{i}.)
    ("self_attn.qkv_proj.conv_qk_depthwise.", "attn.self_attn.qkv.conv_qk.0."),
    ("self_attn.qkv_proj.conv_qk_grouped.", "attn.self_attn.qkv.conv_qk.1."),
    ("self_attn.qk_norm.temp", "attn.self_attn.qkv.temp"),
    ("self_attn.qkv_proj.q_proj.", "attn.self_attn.qkv.linear_q."),
    ("self_attn.qkv_proj.k_proj.", "attn.self_attn.qkv.linear_k."),
    ("self_attn.qkv_proj.v_proj_current.", "attn.self_attn.qkv.val_proj1."),
    ("self_attn.qkv_proj.v_proj_delayed.", "attn.self_attn.qkv.val_proj2."),
    ("self_attn.qkv_proj.q_lora_a.", "attn.self_attn.qkv.lora_linear_q.0."),
    ("self_attn.qkv_proj.q_lora_b.", "attn.self_attn.qkv.lora_linear_q.1."),
    ("self_attn.qkv_proj.k_lora_a.", "attn.self_attn.qkv.lora_linear_k.0."),
    ("self_attn.qkv_proj.k_lora_b.", "attn.self_attn.qkv.lora_linear_k.1."),
    ("self_attn.qkv_proj.v_current_lora_a.", "attn.self_attn.qkv.lora_val_proj1.0."),
    ("self_attn.qkv_proj.v_current_lora_b.", "attn.self_attn.qkv.lora_val_proj1.1."),
    ("self_attn.qkv_proj.v_delayed_lora_a.", "attn.self_attn.qkv.lora_val_proj2.0."),
    ("self_attn.qkv_proj.v_delayed_lora_b.", "attn.self_attn.qkv.lora_val_proj2.1."),
    ("self_attn.o_lora_a.", "attn.self_attn.lora_linear_o.0."),
    ("self_attn.o_lora_b.", "attn.self_attn.lora_linear_o.1."),
    ("self_attn.", "attn.self_attn."),
    ("input_layernorm.", "attn.input_norm."),
    ("post_attention_layernorm.", "mlp.input_norm."),
    ("post_attention_residual_scale.", "mlp.res_scale."),
    ("mlp.gate.router_mlp.rmsnorm_eda.", "mlp.zaya_block.router.rmsnorm_eda."),
    ("mlp.gate.router_mlp.fc1.", "mlp.zaya_block.router.router_mlp.0."),
    ("mlp.gate.router_mlp.fc2.", "mlp.zaya_block.router.router_mlp.2."),
    ("mlp.gate.router_mlp.out_proj.", "mlp.zaya_block.router.router_mlp.4."),
    ("mlp.gate.", "mlp.zaya_block.router."),
)
ZYPHRA_EXPERTS = {"gate_up_proj": "linear_fc1", "down_proj": "linear_fc2",
                  "lora_gate_up_proj_a": "lora_fc1.0", "lora_gate_up_proj_b": "lora_fc1.1",
                  "lora_down_proj_a": "lora_fc2.0", "lora_down_proj_b": "lora_fc2.1"}


def zyphra_name(name, n_layers):
    """transformers' ZAYA1-VL name -> (Zyphra's name, or its format with {e} for per-expert tensors)."""
    if name.startswith("model.visual."):
        return "vision_tower." + name[len("model.visual."):]
    lm = "model.language_model."
    assert name.startswith(lm) or name.startswith("lm_head."), name
    rest = name[len(lm):]
    fixed = {"embed_tokens.weight": "model.embed_tokens.weight", "final_norm.weight": "model.final_norm.weight"}
    if rest in fixed:
        return fixed[rest]
    if rest.startswith("input_hidden_states_"):
        return "model.layers.0.attn.res_scale.hidden_states_" + rest[len("input_hidden_states_"):]
    i, leaf = rest[len("layers."):].split(".", 1)
    i = int(i)
    if leaf.startswith("post_mlp_residual_scale."):
        tail = leaf[len("post_mlp_residual_scale."):]
        return f"model.res_scale.{tail}" if i == n_layers - 1 else f"model.layers.{i + 1}.attn.res_scale.{tail}"
    if leaf.startswith("mlp.experts."):
        return f"model.layers.{i}.mlp.zaya_block.experts.local_experts.{{e}}.{ZYPHRA_EXPERTS[leaf[12:]]}.weight"
    for old, new in ZYPHRA_BLOCK:
        if leaf.startswith(old):
            return f"model.layers.{i}.{new}{leaf[len(old):]}"
    raise ValueError(f"no Zyphra name for {name}")


def zyphra_config(cfg):
    """A transformers Zaya1VLConfig dict -> Zyphra's flat config.json (the fork's keys at the top level)."""
    t, v = cfg["text_config"], dict(cfg["vision_config"], model_type="qwen2_5_vl")
    rope = t["rope_parameters"]["hybrid"]
    flat = {"architectures": ["Zaya1VLForConditionalGeneration"], "model_type": "zaya1_vl",
            "num_hidden_layers": t["num_hidden_layers"], "hidden_size": t["hidden_size"],
            "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
            "num_query_groups": t["num_key_value_heads"], "head_dim": t["head_dim"], "vocab_size": t["vocab_size"],
            "num_experts": t["num_experts"], "ffn_hidden_size": 2 * t["moe_intermediate_size"],
            "zaya_mlp_expansion": t["router_hidden_size"], "norm_epsilon": t["rms_norm_eps"],
            "moe_router_topk": t["num_experts_per_tok"], "rope_theta": rope["rope_theta"],
            "rope_pct": rope.get("partial_rotary_factor", 1.0), "cca": True, "cca_time0": t["cca_time0"],
            "cca_time1": t["cca_time1"], "activation_func": "swiglu", "gated_linear_unit": True,
            "zaya_use_mod": True, "zaya_use_eda": True, "scale_residual_merge": True,
            "max_position_embeddings": t["max_position_embeddings"], "bos_token_id": t["bos_token_id"],
            "eos_token_id": t["eos_token_id"], "pad_token_id": t["pad_token_id"],
            "tie_word_embeddings": cfg.get("tie_word_embeddings", True), "vision_lora": t["vision_lora"],
            "vision_lora_rank_attn": t["vision_lora_rank_attn"], "vision_lora_rank_mlp": t["vision_lora_rank_mlp"],
            "image_token_id": cfg["image_token_id"], "vision_start_token_id": cfg["vision_start_token_id"],
            "vision_end_token_id": cfg["vision_end_token_id"], "vision_config": v}
    if "hybrid_sliding" in t.get("layer_types", []):   # the fork's per-half-layer windows (keys - 1), its RoPE
        flat["swa_layers"] = [w for lt in t["layer_types"] for w in
                              ((t["sliding_window"] - 1 if lt == "hybrid_sliding" else 0), 0)]
        flat["swa_rotary_base"] = t["rope_parameters"]["hybrid_sliding"]["rope_theta"]
    return flat


def to_zyphra(src, out):
    """Writes the checkpoint in folder `src` (transformers' layout, one model.safetensors) in Zyphra's layout."""
    os.makedirs(out, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    n_layers = cfg["text_config"]["num_hidden_layers"]
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    tensors = []
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        e = header[name]
        a, b = e["data_offsets"]
        z = zyphra_name(name, n_layers)
        if "{e}" not in z:
            tensors.append((z, e["dtype"], e["shape"], data[a:b]))
            continue
        per = (b - a) // e["shape"][0]
        tensors += [(z.format(e=k), e["dtype"], e["shape"][1:], data[a + k * per:a + (k + 1) * per])
                    for k in range(e["shape"][0])]
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(zyphra_config(cfg), f, indent=2)
    for name in os.listdir(src):
        if name.startswith("tokenizer"):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--zyphra":       # a composed checkpoint in Zyphra's layout
        print(to_zyphra(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(compose(sys.argv[1], sys.argv[2]))
