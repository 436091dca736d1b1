"""Tests for the GGUF export (hone/weights/gguf_write.py, gguf_quant.py, gguf_vocab.py,
hone/export.py's gguf format).

- Every family hone loads, as a tiny random model (widths multiples of 256 so every type
  applies): the f32 file reads back through hone with the same logits (1e-5) and config, and its
  tokenizer encodes like the model's; each quantised type stays within its stated bound.
- Quantised blocks are decoded by a dequantisation written here from ggml's block layouts
  (ggml-common.h), independently of hone and of `gguf.quants`: it must agree with what the
  reader decodes, and each value must lie within the type's rounding bound of the source weight.
- llama.cpp's layouts are checked against code written here: Q/K rows permuted for arch llama,
  Gemma norms stored as 1 + w, experts stacked [E, out, in].
- transformers (5.x) reads llama, qwen2, qwen3, gemma2 and gemma3 GGUF files: same logits.
- Bad input is refused before a file appears, and a failure half-way leaves nothing behind.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from hone.cli import main
from hone.errors import InputError
from hone.export import export_gguf
from hone.models.config import MoE, ModelConfig, RopeScaling
from hone.models.transformer import Transformer
from hone.tokenizer import Tokenizer
from hone.weights import gguf_quant
from hone.weights.assemble import hf_tensors
from hone.weights.gguf_format import open_gguf
from hone.weights.loading import load_model

BASE = dict(vocab_size=264, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=64, max_position_embeddings=64)
GEMMA = dict(activation="gelu_tanh", norm_offset=1.0, embed_scale=True, tie_embeddings=True)
FAMILIES = {
    "llama": dict(family="llama"),
    "qwen2": dict(family="qwen2", attention_bias=True, rope_theta=1e6),
    "qwen3": dict(family="qwen3", qk_norm=True, tie_embeddings=True),
    "gemma": dict(family="gemma", **GEMMA),
    "gemma2": dict(family="gemma2", **GEMMA, post_norms=True, sliding_window=4,
                   layer_types=("sliding", "global"), attn_logit_softcap=50.0,
                   final_logit_softcap=30.0),
    "gemma3_text": dict(family="gemma3_text", **GEMMA, post_norms=True, qk_norm=True,
                        sliding_window=4, layer_types=("sliding", "sliding"), rope_theta=1e6,
                        rope_local_theta=1e4),
    "qwen3_moe": dict(family="qwen3_moe", qk_norm=True, moe=MoE(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, mlp_only_layers=(1,))),
    "mixtral": dict(family="mixtral", moe=MoE(num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=512)),
    "qwen2_moe": dict(family="qwen2_moe", attention_bias=True, moe=MoE(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=False,
        shared_expert_intermediate_size=256)),
}
TOK = Tokenizer.byte_level()
IDS = jnp.array([TOK.encode("Hello there, general Kenobi! 123 and more text")], jnp.int32)

# Relative RMS error of each type's rounding on Gaussian weights (measured once, see
# docs/guides/export.md); q4_k_m is mostly Q4_K. Logits may move by at most BOUND times that,
# relative to their RMS: a tiny model stacks about 16 matrices, whose independent errors add
# to about 4x (sqrt 16); routed models get twice the room, as a rounding can flip a near-tie in
# the top-k routing.
WEIGHT_ERROR = {"f16": 2.1e-4, "bf16": 1.7e-3, "q8_0": 5.4e-3, "q4_k_m": 7.2e-2}
BOUND = {False: 8.0, True: 16.0}


def tiny(name: str, seed: int = 0, **changes) -> Transformer:
    """A random model of family `name`: every weight N(0, 0.05), norms 1 + N(0, 0.05), routers
    scaled by 10 (clear top-k margins)."""
    cfg = ModelConfig(**{**BASE, **FAMILIES[name], **changes})
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    key = jax.random.key(seed)
    leaves = []
    for i, (path, var) in enumerate(nnx.to_flat_state(state)):
        x = 0.05 * jax.random.normal(jax.random.fold_in(key, i), var.shape, var.dtype)
        x = x + (1.0 if path[-1] == "scale" and not cfg.norm_offset else 0.0)
        leaves.append((path, var.replace(x * (10.0 if path[-1] == "router" else 1.0))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def logits(model) -> np.ndarray:
    return np.asarray(model(IDS))  # [1, T, V]


# ---- 1, 3: every family, f32 exact, the quantised types within their bounds -----------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_round_trips(name, tmp_path):
    model = tiny(name)
    ref = logits(model)
    path = export_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    back = load_model(path)
    assert np.abs(logits(back) - ref).max() <= 1e-5
    assert back.config.family == name and back.config.moe == model.config.moe
    again = Tokenizer.from_gguf(path)
    text = "<|im_start|>user\nnaïve 123<|im_end|>"
    assert again.encode(text) == TOK.encode(text)
    assert (again.chat_template, again.bos_id, again.eos_id, again.eos_ids) == (
        TOK.chat_template, TOK.bos_id, TOK.eos_id, TOK.eos_ids)

    routed = model.config.moe is not None
    scale = np.sqrt(np.mean(ref ** 2))
    for quant, eps in WEIGHT_ERROR.items():
        out = logits(load_model(export_gguf(model, TOK, tmp_path / f"{quant}.gguf", quant)))
        error = np.sqrt(np.mean((out - ref) ** 2)) / scale
        assert error <= BOUND[routed] * eps, (quant, error)
        assert error >= 0.1 * eps, (quant, error)  # the file really holds the rounded type


# ---- 2: the blocks against a dequantisation written from ggml's layouts ---------------------

def _f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def hand_q8_0(raw: np.ndarray) -> np.ndarray:
    """block_q8_0: fp16 d, then 32 int8 q; x = d * q."""
    blocks = raw.reshape(-1, 34)
    return (_f16(blocks[:, :2].copy()) * blocks[:, 2:].view(np.int8)).reshape(-1)


def hand_q4_k(raw: np.ndarray) -> np.ndarray:
    """block_q4_K (dequantize_row_q4_K): fp16 d, fp16 dmin, 12 scale bytes, 128 code bytes."""
    out = []
    for b in raw.reshape(-1, 144):
        d, dmin, s, qs = _f16(b[0:2].copy())[0], _f16(b[2:4].copy())[0], b[4:16], b[16:]
        for j in range(8):  # get_scale_min_k4
            if j < 4:
                sc, m = s[j] & 63, s[j + 4] & 63
            else:
                sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)
                m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
            q = qs[32 * (j // 2):32 * (j // 2) + 32]
            q = q & 0xF if j % 2 == 0 else q >> 4
            out.append(d * sc * q.astype(np.float32) - dmin * m)
    return np.concatenate(out)


def hand_q6_k(raw: np.ndarray) -> np.ndarray:
    """block_q6_K (dequantize_row_q6_K): 128 ql, 64 qh, 16 int8 scales, fp16 d."""
    out = []
    for b in raw.reshape(-1, 210):
        ql, qh, sc, d = b[:128], b[128:192], b[192:208].view(np.int8), _f16(b[208:].copy())[0]
        y = np.zeros(256, np.float32)
        for half in range(2):
            l_, h_, s_ = ql[64 * half:], qh[32 * half:], sc[8 * half:]
            for i in range(32):
                k = i // 16
                q = [((l_[i] & 0xF) | (((h_[i] >> 0) & 3) << 4)),
                     ((l_[i + 32] & 0xF) | (((h_[i] >> 2) & 3) << 4)),
                     ((l_[i] >> 4) | (((h_[i] >> 4) & 3) << 4)),
                     ((l_[i + 32] >> 4) | (((h_[i] >> 6) & 3) << 4))]
                for seg in range(4):
                    y[128 * half + 32 * seg + i] = d * s_[k + 2 * seg] * (int(q[seg]) - 32)
        out.append(y)
    return np.concatenate(out)


def _blocks_bound(x: np.ndarray, qtype: QT) -> np.ndarray:
    """The largest error each value's rounding allows, from its source block [n] -> [n]."""
    if qtype == QT.F16:
        return 2.0 ** -11 * np.abs(x) + 2.0 ** -24
    if qtype == QT.BF16:
        return 2.0 ** -8 * np.abs(x)
    if qtype == QT.Q8_0:  # half a step of d = max|x| / 127, plus d's own fp16 rounding
        b = x.reshape(-1, 32)
        return np.repeat(np.abs(b).max(1) / 127 * (0.5 + 127 * 2.0 ** -11), 32)
    b = x.reshape(-1, 256)
    if qtype == QT.Q4_K:  # a tenth of the block's range (1.5 steps of a 4-bit min/max grid)
        rng = b.max(1) - np.minimum(b.min(1), 0)
        return np.repeat(rng / 10, 256)
    return np.repeat(np.abs(b).max(1) / 20, 256)  # Q6_K: 1.5 steps of 6 bits


HAND = {QT.Q8_0: hand_q8_0, QT.Q4_K: hand_q4_k, QT.Q6_K: hand_q6_k,
        QT.F16: lambda raw: raw.view(np.float16).astype(np.float32),
        QT.BF16: lambda raw: (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)}


@pytest.mark.parametrize("quant", ["f16", "bf16", "q8_0", "q4_k_m"])
def test_blocks_decode_to_the_weights(quant, tmp_path):
    model = tiny("qwen2")  # NEOX rotary: no row permutation, so rows compare directly
    hf = hf_tensors(model)
    path = export_gguf(model, TOK, tmp_path / "m.gguf", quant)
    seen = set()
    with open_gguf(path) as f:
        for name, hname in [("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                            ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"),
                            ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
                            ("output.weight", "lm_head.weight"),
                            ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight")]:
            info = f.tensors[name]
            raw = f.tensor_bytes(info).copy()
            source = hf[hname].reshape(-1)
            ours = HAND[info.qtype](raw) if info.qtype != QT.F32 else raw.view(np.float32)
            theirs = dequantize(raw.reshape(info.shape[0], -1), info.qtype).reshape(-1)
            np.testing.assert_array_equal(ours, theirs)  # the layout the readers decode
            assert (np.abs(ours - source) <= _blocks_bound(source, info.qtype)
                    if info.qtype != QT.F32 else ours == source).all(), name
            seen.add(info.qtype)
    expected = {"f16": {QT.F16, QT.F32}, "bf16": {QT.BF16, QT.F32},
                "q8_0": {QT.Q8_0, QT.F32}, "q4_k_m": {QT.Q4_K, QT.Q6_K, QT.F32}}[quant]
    assert seen == expected


def test_q4_k_m_mix_is_llama_cpps():
    """Q6_K for the output and for attn_v / ffn_down in llama.cpp's `use_more_bits` layers."""
    plan = [gguf_quant.plan_type(f"blk.{i}.ffn_down.weight", (8, 256), "q4_k_m", i, 32)
            for i in range(32)]
    more = [i for i, t in enumerate(plan) if t == QT.Q6_K]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert gguf_quant.plan_type("output.weight", (8, 256), "q4_k_m", None, 32) == QT.Q6_K
    assert gguf_quant.plan_type("blk.3.attn_q.weight", (8, 256), "q4_k_m", 3, 32) == QT.Q4_K
    assert gguf_quant.plan_type("blk.3.ffn_gate_inp.weight", (8, 256), "q8_0", 3, 32) == QT.F32


# ---- 1: llama.cpp's layouts, written here independently --------------------------------------

def test_layouts_are_llama_cpps(tmp_path):
    def read(path):
        with open_gguf(path) as f:
            return {n: dequantize(f.tensor_bytes(i).reshape(i.shape[0], -1) if len(i.shape) > 1
                                  else f.tensor_bytes(i), i.qtype).reshape(i.shape)
                    for n, i in f.tensors.items()}, dict(f.metadata)

    llama = tiny("mixtral")
    hf = hf_tensors(llama)
    got, meta = read(export_gguf(llama, TOK, tmp_path / "l.gguf", "f32"))
    q = hf["model.layers.1.self_attn.q_proj.weight"]  # [N*H, D]: per head (half, i) -> (i, half)
    n, h = 4, 64
    want = np.stack([q.reshape(n, 2, h // 2, -1)[:, 0], q.reshape(n, 2, h // 2, -1)[:, 1]],
                    axis=2).reshape(q.shape)
    np.testing.assert_array_equal(got["blk.1.attn_q.weight"], want)
    np.testing.assert_array_equal(got["blk.0.ffn_down_exps.weight"][3],
                                  hf["model.layers.0.block_sparse_moe.experts.3.w2.weight"])
    assert got["blk.0.ffn_gate_exps.weight"].shape == (4, 512, 256)
    assert meta["general.architecture"] == "llama" and meta["llama.expert_count"] == 4

    gemma = tiny("gemma3_text")
    hf = hf_tensors(gemma)
    got, meta = read(export_gguf(gemma, TOK, tmp_path / "g.gguf", "f32"))
    np.testing.assert_array_equal(got["blk.1.attn_k_norm.weight"],
                                  hf["model.layers.1.self_attn.k_norm.weight"] + 1)
    np.testing.assert_array_equal(got["blk.0.ffn_norm.weight"],
                                  hf["model.layers.0.pre_feedforward_layernorm.weight"] + 1)
    np.testing.assert_array_equal(got["blk.0.attn_q.weight"],  # NEOX rotary: HF's row order
                                  hf["model.layers.0.self_attn.q_proj.weight"])
    assert "output.weight" not in got and meta["gemma3.attention.sliding_window"] == 4
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.bos_token_id"] == 257


# ---- 3: transformers' GGUF loader --------------------------------------------------------------

# transformers 5 ignores `attention.key_length` for qwen3 (it takes its default head_dim 128)
# and `query_pre_attn_scalar` is not in the file for Gemma 2/3 (its default is 256): models
# with those head sizes. It cannot read gemma, mixtral (loaded as dense llama), qwen2moe or
# qwen3moe files (expert widths are not mapped).
TRANSFORMERS = {"llama": {}, "qwen2": {}, "qwen3": dict(num_heads=2, num_kv_heads=1, head_dim=128),
                "gemma2": dict(num_heads=1, num_kv_heads=1, head_dim=256),
                "gemma3_text": dict(num_heads=1, num_kv_heads=1, head_dim=256)}


@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformers_reads_the_export(name, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = tiny(name, **TRANSFORMERS[name])
    export_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        out = theirs(torch.tensor(np.asarray(IDS), dtype=torch.long)).logits.numpy()
    assert np.abs(out - logits(model)).max() <= 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    assert tok("Hi there, 42")["input_ids"] == TOK.encode("Hi there, 42")


# ---- 4: refused before anything is written; nothing half-written stays ----------------------

def _left(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path))


def test_refusals_write_nothing(tmp_path):
    narrow = tiny("llama", hidden_size=80, num_heads=2, num_kv_heads=1, head_dim=40)
    with pytest.raises(InputError, match="not a multiple of the Q8_0 block of 32"):
        export_gguf(narrow, TOK, tmp_path / "m.gguf", "q8_0")
    with pytest.raises(InputError, match="f32, f16, bf16, q8_0, q4_k_m"):
        export_gguf(tiny("llama"), TOK, tmp_path / "m.gguf", "q2_k")
    with pytest.raises(InputError, match="has no GGUF layout"):
        export_gguf(tiny("llama", family="falcon"), TOK, tmp_path / "m.gguf", "f32")
    # Gemma 3's llama.cpp layout has every sixth layer global: another pattern is refused.
    with pytest.raises(InputError, match="layer_types"):
        export_gguf(tiny("gemma3_text", layer_types=("sliding", "global")), TOK,
                    tmp_path / "m.gguf", "f32")
    with pytest.raises(InputError, match="rope scaling 'llama3'"):
        export_gguf(tiny("llama", rope_scaling=RopeScaling()), TOK, tmp_path / "m.gguf", "f32")
    assert _left(tmp_path) == []


def test_a_failure_half_way_leaves_nothing(tmp_path, monkeypatch):
    model = tiny("llama")
    path = export_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    before = path.read_bytes()
    calls = []

    def fail_late(x, qtype):
        calls.append(qtype)
        if len(calls) > 5:
            raise OSError("disk full")
        return x

    import hone.weights.gguf_write as gw
    monkeypatch.setattr(gw, "encode", fail_late)
    with pytest.raises(OSError, match="disk full"):
        export_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    assert _left(tmp_path) == ["m.gguf"] and path.read_bytes() == before  # the old file kept
    monkeypatch.undo()

    def refuse(written):
        assert written.exists() and written.parent == tmp_path  # a sibling temporary file
        raise InputError("no")

    with pytest.raises(InputError, match="no"):
        gw.write_gguf(model, tmp_path / "n.gguf", "f32", {}, check=refuse)
    assert _left(tmp_path) == ["m.gguf"]


# ---- the command line: a LoRA run merged first, and any model load_model takes --------------

def test_cli_exports_a_lora_run_and_a_preset(tmp_path, capsys):
    from pathlib import Path

    from hone.export import load_run_model
    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    assert main(["sft", "--config", str(root / "configs/tiny/sft.yaml"), f"run_dir={run}",
                 "train.max_steps=3", "model.lora.rank=4", "train.lr=1e-2", "log.sinks=[jsonl]",
                 "data.eval_path=null"]) == 0
    trained, tok, _ = load_run_model(run)
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "r.gguf"),
                 "--format", "gguf", "--quant", "f32"]) == 0
    ids = jnp.array([tok.encode("12 + 7 =")], jnp.int32)
    back = load_model(tmp_path / "r.gguf")
    assert np.abs(np.asarray(back(ids)) - np.asarray(trained(ids))).max() <= 1e-5
    assert main(["export", "--model", "tiny", "--out", str(tmp_path / "t.gguf"),
                 "--format", "gguf", "--quant", "q4_k_m"]) == 2
    assert "not a multiple of the Q6_K block of 256" in capsys.readouterr().err
    assert main(["export", "--model", "tiny", "--out", str(tmp_path / "t.gguf"),
                 "--format", "gguf", "--quant", "q8_0"]) == 0
    assert main(["export", "--model", "tiny", "--out", str(tmp_path / "h"),
                 "--quant", "q8_0"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.gguf", "run", "t.gguf"]
