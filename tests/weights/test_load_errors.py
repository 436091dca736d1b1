"""Bad checkpoints are refused at the edge with the file and the key or tensor named."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import hone
from hone.errors import InputError
from hone.models.config import PRESETS
from hone.weights.assemble import hf_tensors
from hone.weights.hf_config import config_to_hf


@pytest.fixture
def folder(tmp_path):
    """A valid tiny HF folder written by hone itself."""
    model = hone.load_model("tiny")
    return hone.save_hf(model, tmp_path / "ok")


def edit_config(folder, **changes):
    path = folder / "config.json"
    d = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    path.write_text(json.dumps(d))


def test_unsupported_model_type(folder):
    edit_config(folder, model_type="mamba")
    with pytest.raises(InputError, match=r"config\.json.*'model_type'.*mamba"):
        hone.load_model(folder)


def test_missing_config_key(folder):
    edit_config(folder, hidden_size=None)
    with pytest.raises(InputError, match=r"config\.json.*'hidden_size'.*missing"):
        hone.load_model(folder)


def test_wrong_value_type(folder):
    edit_config(folder, num_hidden_layers="two")
    with pytest.raises(InputError, match=r"'num_hidden_layers'.*expected int"):
        hone.load_model(folder)


def test_unsupported_rope_type(folder):
    edit_config(folder, rope_parameters={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(InputError, match=r"rope type 'yarn'"):
        hone.load_model(folder)


def test_tensor_with_wrong_shape(folder):
    tensors = hf_tensors(hone.load_model("tiny"))
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = np.zeros((3, 5), np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(InputError, match=r"model\.safetensors.*up_proj.*\(3, 5\)"):
        hone.load_model(folder)


def test_missing_tensor(folder):
    tensors = hf_tensors(hone.load_model("tiny"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(InputError, match=r"model\.safetensors.*'model\.norm\.weight' is missing"):
        hone.load_model(folder)


def test_truncated_safetensors(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"model\.safetensors.*truncated or corrupt"):
        hone.load_model(folder)


def test_index_pointing_at_missing_shard(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(InputError, match=r"model-00002-of-00002\.safetensors.*missing"):
        hone.load_model(folder)


def test_unknown_source():
    with pytest.raises(InputError, match=r"no-such-model.*known preset"):
        hone.load_model("no-such-model")


def test_failed_export_writes_nothing(tmp_path):
    class BrokenTokenizer:
        bos_id, eos_id, pad_id, eos_ids = 1, 2, 2, (2,)

        def save(self, out_dir):
            raise OSError("disk full")

    with pytest.raises(OSError):
        hone.save_hf(hone.load_model("tiny"), tmp_path / "export", tokenizer=BrokenTokenizer())
    assert os.listdir(tmp_path) == []


def test_sharded_export_loads_back(tmp_path):
    model = hone.load_model("tiny")
    out = hone.save_hf(model, tmp_path / "sharded", max_shard_bytes=20_000)
    assert (out / "model.safetensors.index.json").exists()
    again = hone.load_model(out)
    tokens = np.arange(12, dtype=np.int32).reshape(2, 6)
    assert np.array_equal(np.asarray(model(tokens)), np.asarray(again(tokens)))


def test_config_to_hf_names_family():
    assert config_to_hf(PRESETS["gemma3-270m"])["architectures"] == ["Gemma3ForCausalLM"]
