"""Every weight loader refuses a checkpoint tensor of another shape than the config gives, by name, in one line.

A narrow or a slice of a larger tensor copies without complaint: a config.json whose intermediate_size was 96
against weights of 128 loaded, and the model answered garbage.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.errors import ModelFilesError, WeightShapeError
from engine.layers.embedding import ReducedLMHead, VocabParallelEmbedding
from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from engine.layers.low_bits import int8_rows
from engine.layers.parallel import TensorParallel
from engine.loader import build_model, read_tensor

RANK1_OF_2 = TensorParallel(rank=1, size=2)  # (no collective runs while loading)


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


@pytest.mark.parametrize(("key", "value", "tensor", "found", "expected"), [
    ("intermediate_size", 96, "mlp.down_proj", (64, 128), (64, 96)),  # (it loaded, and answered garbage)
    ("num_key_value_heads", 1, "self_attn.k_proj", (32, 64), (16, 64)),
])
def test_a_config_smaller_than_the_weights(tiny_llama_dir, tmp_path, key, value, tensor, found, expected):
    other = tmp_path / "other"
    shutil.copytree(tiny_llama_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ModelFilesError) as err:
        LLM(str(other))
    line = one_line(err)
    assert f"model.safetensors: tensor model.layers.0.{tensor}.weight " in line
    assert f"has shape {found}, where config.json gives {expected}" in line and "different models" in line


def test_a_whole_tensor_of_another_shape_is_named(tiny_llama_dir, tmp_path):
    """A norm (no sharding) of the wrong size: the error names it (it said "a checkpoint tensor has shape ...")."""
    other = tmp_path / "other"
    shutil.copytree(tiny_llama_dir, other)
    tensors = load_file(other / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:32].clone()
    save_file(tensors, str(other / "model.safetensors"))
    with pytest.raises(ModelFilesError) as err:
        LLM(str(other))
    assert "tensor model.norm.weight has shape (32,), where config.json gives (64,)" in one_line(err)


@pytest.mark.parametrize(("layer", "shard_id", "good", "bad"), [
    (lambda: ColumnParallelLinear(64, 128, tp=RANK1_OF_2), None, (128, 64), (192, 64)),
    (lambda: ColumnParallelLinear(64, 128, bias=True, tp=RANK1_OF_2), "bias", (128,), (256,)),
    (lambda: MergedColumnParallelLinear(64, [128, 128], tp=RANK1_OF_2), 1, (128, 64), (160, 64)),
    (lambda: QKVParallelLinear(64, 16, 4, 2, tp=RANK1_OF_2), "q", (64, 64), (96, 64)),
    (lambda: QKVParallelLinear(64, 16, 4, 2, tp=TensorParallel(rank=3, size=4)), "k", (32, 64), (48, 64)),
    (lambda: QKVParallelLinear(64, 16, 4, 2, tp=TensorParallel(rank=3, size=4)), "v", (32, 64), (32, 63)),
    (lambda: RowParallelLinear(128, 64, tp=RANK1_OF_2), None, (64, 128), (64, 192)),
    (lambda: RowParallelLinear(128, 64, bias=True, tp=RANK1_OF_2), "bias", (64,), (96,)),
    (lambda: VocabParallelEmbedding(384, 64, tp=RANK1_OF_2), None, (384, 64), (400, 64)),
    (lambda: ReducedLMHead(384, 64), None, (10, 64), (10, 48)),
    (lambda: ReducedLMHead(384, 64), None, (384, 64), (400, 64)),
])
def test_every_loader_takes_its_shape_and_refuses_another(layer, shard_id, good, bad):
    """After TP sharding too: rank 1 of 2 (or 3 of 4, with KV heads shared by two ranks) checks the whole tensor."""
    module = layer()
    param = module.bias if shard_id == "bias" else module.weight
    shard_id = None if shard_id == "bias" else shard_id
    param.weight_loader(param, torch.randn(good), shard_id)
    with pytest.raises(WeightShapeError) as err:
        param.weight_loader(param, torch.randn(bad), shard_id)
    assert err.value.found == bad and err.value.expected == good
    assert "different models" in one_line(err)


def test_int8_scales_are_one_per_row(tmp_path):
    """A scale tensor of one value broadcast over the rows (it loaded); one of another row count."""
    q, scales = int8_rows(torch.randn(96, 64))
    for bad in (scales[:1], scales[:95], scales[:, None]):
        save_file({"w": q, "w_scale": bad.contiguous()}, str(tmp_path / "w.safetensors"))
        with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f, \
                pytest.raises(ModelFilesError) as err:
            read_tensor(f, "w")
        assert f"w_scale of shape {tuple(bad.shape)}" in one_line(err) and "(96, 64)" in one_line(err)


def test_a_borrowed_embedding_of_another_vocabulary(tiny_llama_dir, tmp_path):
    """A draft that borrows its target's embedding, from a target of a larger vocabulary (it took the first rows)."""
    cfg = {**json.loads((tiny_llama_dir / "config.json").read_text()), "embedding_from_target": True}
    tensors = load_file(tiny_llama_dir / "model.safetensors")
    embedding = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(tmp_path / "draft.safetensors"))
    save_file({"model.embed_tokens.weight": torch.cat([embedding, embedding[:16]])}, str(tmp_path / "t.safetensors"))
    with pytest.raises(ModelFilesError) as err:
        build_model(cfg, [tmp_path / "draft.safetensors"], embedding_files=[tmp_path / "t.safetensors"],
                    max_positions=64, dtype=torch.float32, device=torch.device("cpu"))
    assert f"has shape {(embedding.shape[0] + 16, 64)}, where the draft's config.json" in one_line(err)
    assert "same vocabulary and hidden size" in one_line(err)
