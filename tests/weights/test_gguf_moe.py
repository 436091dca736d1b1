"""GGUF files of the mixture-of-experts families (hone/weights/gguf_moe.py): each tiny random
transformers model of test_moe.py, written as llama.cpp's converter lays it out (stacked
`ffn_*_exps` experts, the router as `ffn_gate_inp`, Qwen2-MoE's `*_shexp` shared expert,
Mixtral as arch `llama` with its Q/K rows permuted), loads with transformers' fp32 logits; an
expert tensor of the wrong size is refused naming the file and the tensor.

The writer here is written from the gguf package's tensor names and llama.cpp's declared
shapes, independently of the reader.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from reference import TOL, batch, hf_logits, max_diff_on_real_tokens
from safetensors.numpy import load_file
from test_moe import logits_of, moe_reference

import hone
from hone.errors import InputError
from hone.weights.gguf import read_gguf

ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}

# HF name inside a layer -> llama.cpp's (both Qwen's mlp.* and Mixtral's block_sparse_moe.*)
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    **{f"self_attn.{x}_proj.{kind}": f"attn_{y}.{kind}" for x, y in
       [("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")] for kind in ("weight", "bias")},
}
EXPERT = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up",
          "w2": "down"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order for arch llama: each head's rows (half, i) become (i, half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(name: str, hf: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """The HF folder's tensors under llama.cpp's names; experts stacked [E, out, in]."""
    out, experts = {}, {}
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for key, x in hf.items():
        if key in top:
            out[top[key]] = x
            continue
        _, _, i, rest = key.split(".", 3)
        if ".experts." in rest:  # mlp.experts.{e}.gate_proj.weight
            e, leaf = rest.split(".experts.")[1].split(".")[:2]
            experts.setdefault(f"blk.{i}.ffn_{EXPERT[leaf]}_exps.weight", {})[int(e)] = x
            continue
        if name == "mixtral" and rest.startswith("self_attn.q_proj"):
            x = _permute(x, config.num_attention_heads)
        elif name == "mixtral" and rest.startswith("self_attn.k_proj"):
            x = _permute(x, config.num_key_value_heads)
        out[f"blk.{i}.{LAYER[rest]}"] = x
    for key, per_expert in experts.items():
        out[key] = np.stack([per_expert[e] for e in sorted(per_expert)])
    return out


def write_gguf(path, name: str, folder: str, config, override=None) -> None:
    """A GGUF file of the reference folder with the metadata llama.cpp's converter writes."""
    arch = ARCH[name]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_expert_count(getattr(config, "num_experts", None) or config.num_local_experts)
    w.add_expert_used_count(config.num_experts_per_tok)
    if name != "mixtral":
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    if name == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    tensors = gguf_tensors(name, load_file(f"{folder}/model.safetensors"), config)
    tensors.update(override or {})
    for key, x in tensors.items():
        w.add_tensor(key, np.ascontiguousarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", list(ARCH))
def test_moe_gguf_matches_transformers(name, tmp_path):
    """fp32 logits of the GGUF file on a padded batch equal transformers' within TOL."""
    ref, folder = moe_reference(name, tmp_path)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, name, folder, ref.config)
    model = hone.load_model(str(path), dtype="float32")
    assert model.config.family == name and model.config.moe is not None
    tokens, mask, positions = batch()
    ours = logits_of(model, tokens, mask)
    assert max_diff_on_real_tokens(ours, hf_logits(ref, tokens, mask, positions), mask) <= TOL


def test_shared_gate_as_declared_and_wrong_expert_count(tmp_path):
    """llama.cpp declares the shared-expert gate [D] (HF [1, D]): both read the same. A stacked
    expert tensor with one expert too few is refused naming the file and the tensor."""
    ref, folder = moe_reference("qwen2_moe", tmp_path)
    config = ref.config
    write_gguf(tmp_path / "hf.gguf", "qwen2_moe", folder, config)
    gate = load_file(f"{folder}/model.safetensors")["model.layers.1.mlp.shared_expert_gate.weight"]
    write_gguf(tmp_path / "flat.gguf", "qwen2_moe", folder, config,
               override={"blk.1.ffn_gate_inp_shexp.weight": gate.reshape(-1)})
    (c1, t1), (c2, t2) = read_gguf(tmp_path / "hf.gguf"), read_gguf(tmp_path / "flat.gguf")
    assert c1 == c2 and c1["mlp_only_layers"] == [0, 2] and c1["norm_topk_prob"] is False
    assert t1.keys() == t2.keys()
    assert all(np.array_equal(t1[k], t2[k]) for k in t1)

    e, f, d = config.num_experts, config.moe_intermediate_size, config.hidden_size
    short = np.zeros((e - 1, f, d), np.float32)
    write_gguf(tmp_path / "short.gguf", "qwen2_moe", folder, config,
               override={"blk.1.ffn_up_exps.weight": short})
    with pytest.raises(InputError, match=r"short\.gguf.*blk\.1\.ffn_up_exps\.weight"):
        read_gguf(tmp_path / "short.gguf")
