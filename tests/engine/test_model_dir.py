"""inspect_model_dir: a good tiny model passes; every broken layout fails with a one-line fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.errors import EngineError, ModelFilesError, UnsupportedArchitectureError
from engine.model_dir import SUPPORTED_ARCHITECTURES, ModelFiles, inspect_model_dir


def _save_tiny_model(root: Path, *, max_shard_size: str | None = None) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=128,
    )
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    LlamaForCausalLM(config).save_pretrained(root, **kwargs)
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 128)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(root)
    return root


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return _save_tiny_model(tmp_path / "tiny")


def _one_line_error(excinfo: pytest.ExceptionInfo[EngineError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_valid_tiny_model_is_described(tiny_model: Path) -> None:
    files = inspect_model_dir(tiny_model)
    assert isinstance(files, ModelFiles)
    assert files.root == tiny_model.resolve()
    assert files.architecture == "LlamaForCausalLM"
    assert files.config["hidden_size"] == 32
    assert files.weight_files == (tiny_model.resolve() / "model.safetensors",)


def test_sharded_model_lists_every_shard(tmp_path: Path) -> None:
    root = _save_tiny_model(tmp_path / "sharded", max_shard_size="20KB")
    files = inspect_model_dir(root)
    assert len(files.weight_files) > 1
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert {p.name for p in files.weight_files} == set(index["weight_map"].values())


def test_qwen3_architecture_is_supported(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]
    (tiny_model / "config.json").write_text(json.dumps(config))
    assert inspect_model_dir(tiny_model).architecture == "Qwen3ForCausalLM"


def test_missing_config(tiny_model: Path) -> None:
    (tiny_model / "config.json").unlink()
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    assert "config.json" in _one_line_error(excinfo)


def test_invalid_config_json(tiny_model: Path) -> None:
    (tiny_model / "config.json").write_text("{not json")
    with pytest.raises(ModelFilesError, match="not valid JSON") as excinfo:
        inspect_model_dir(tiny_model)
    _one_line_error(excinfo)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("hidden_size", "abc", "got 'abc'"), ("num_attention_heads", None, "got nothing"), ("vocab_size", 0, "got 0"),
    ("head_dim", 16.5, "got 16.5"),
])
def test_a_config_size_that_is_no_positive_integer_is_named(tiny_model: Path, key: str, value: object,
                                                           said: str) -> None:
    """A damaged config.json: a one-line error naming the field (it failed with a traceback while loading)."""
    config = json.loads((tiny_model / "config.json").read_text())
    config[key] = value
    (tiny_model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    assert f"{key} must be a positive integer, {said}" in _one_line_error(excinfo)


def test_unsupported_architecture_names_it_and_the_supported_ones(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (tiny_model / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError) as excinfo:
        inspect_model_dir(tiny_model)
    message = _one_line_error(excinfo)
    assert "MistralForCausalLM" in message
    assert all(name in message for name in SUPPORTED_ARCHITECTURES)


def test_missing_weights(tiny_model: Path) -> None:
    (tiny_model / "model.safetensors").unlink()
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    assert "model.safetensors" in _one_line_error(excinfo)


def test_only_pytorch_bin_weights_suggests_converting(tiny_model: Path) -> None:
    (tiny_model / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2)}, tiny_model / "pytorch_model.bin")
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    message = _one_line_error(excinfo)
    assert "pytorch_model.bin" in message
    assert "convert" in message and "safetensors" in message


def test_missing_shard_listed_in_index(tmp_path: Path) -> None:
    root = _save_tiny_model(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((root / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[-1]
    (root / lost).unlink()
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(root)
    assert lost in _one_line_error(excinfo)


def test_truncated_safetensors_names_the_file(tiny_model: Path) -> None:
    weights = tiny_model / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size // 2)
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    message = _one_line_error(excinfo)
    assert str(weights.resolve()) in message
    assert "delete" in message and "download" in message


def test_garbage_safetensors_is_rejected(tiny_model: Path) -> None:
    save_file({"x": torch.zeros(4)}, tiny_model / "model.safetensors")  # a valid file passes ...
    inspect_model_dir(tiny_model)
    (tiny_model / "model.safetensors").write_bytes(b"\x00" * 4)  # ... four bytes do not
    with pytest.raises(ModelFilesError, match="truncated or corrupt"):
        inspect_model_dir(tiny_model)


def test_missing_tokenizer(tiny_model: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tiny_model / name).unlink()
    with pytest.raises(ModelFilesError) as excinfo:
        inspect_model_dir(tiny_model)
    assert "tokenizer" in _one_line_error(excinfo)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match="not a directory"):
        inspect_model_dir(tmp_path / "absent")
