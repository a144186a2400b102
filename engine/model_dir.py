"""What a model directory must hold before the engine loads it, checked up front.

``inspect_model_dir`` reads config.json, checks the architecture is one the engine implements, finds
the safetensors weights (single file or sharded with an index), reads each file's header so a
truncated download fails here rather than half-way through loading, and checks that a tokenizer is
present. Every problem is a ``ModelFilesError`` or ``UnsupportedArchitectureError`` with a one-line fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFilesError, UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim")  # (null or absent: derived from the others)
_UNSUPPORTED_WEIGHT_GLOBS = ("*.bin", "*.pt", "*.pth", "*.gguf")


@dataclass(frozen=True)
class ModelFiles:
    """A checked model directory: its config, architecture and safetensors weight files."""

    root: Path
    config: dict
    architecture: str
    weight_files: tuple[Path, ...]


def inspect_model_dir(path: Path) -> ModelFiles:
    """Check that ``path`` holds a loadable model; raise an EngineError naming the fix if not."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ModelFilesError(f"{root} is not a directory: give a Hugging Face model directory")
    config = _read_json(root / "config.json", what="config.json")
    architecture = _architecture(config, root)
    _check_sizes(config, root)
    weight_files = _weight_files(root)
    for weight_file in weight_files:
        _check_header(weight_file)
    _check_tokenizer(root)
    return ModelFiles(root=root, config=config, architecture=architecture, weight_files=weight_files)


def _read_json(file: Path, *, what: str) -> dict:
    if not file.is_file():
        raise ModelFilesError(
            f"{file.parent} has no {what}: point at a Hugging Face model directory (config.json, "
            "*.safetensors, tokenizer files)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFilesError(f"{file} is not valid JSON ({err}): delete it and download it again") from err
    if not isinstance(data, dict):
        raise ModelFilesError(f"{file} is not a JSON object: delete it and download it again")
    return data


def _architecture(config: dict, root: Path) -> str:
    architectures = config.get("architectures") or []
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    if not isinstance(architectures, list) or not architectures:
        raise UnsupportedArchitectureError(
            f"{root / 'config.json'} names no architecture: the engine supports {supported}"
        )
    architecture = str(architectures[0])
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture {architecture} is not supported: the engine supports {supported}"
        )
    return architecture


def _check_sizes(config: dict, root: Path) -> None:
    """The sizes the model is built from are positive integers (a damaged or hand-edited config.json failed with a
    traceback half-way through loading)."""
    for key in REQUIRED_SIZES + OPTIONAL_SIZES:
        value = config.get(key)
        if value is None and key in OPTIONAL_SIZES:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            got = "nothing" if value is None else repr(value)
            raise ModelFilesError(f"{root / 'config.json'}: {key} must be a positive integer, got {got}: restore "
                                  "the model's own config.json (download it again)")


def _weight_files(root: Path) -> tuple[Path, ...]:
    index = root / WEIGHTS_INDEX
    if index.is_file():
        return _sharded_weight_files(index)
    single = root / SINGLE_WEIGHTS
    if single.is_file():
        return (single,)
    others = sorted(p.name for glob in _UNSUPPORTED_WEIGHT_GLOBS for p in root.glob(glob))
    if others:
        raise ModelFilesError(
            f"{root} has only {others[0]}-style weights, which are not supported: convert them to "
            "safetensors (e.g. load with transformers and save_pretrained) or download the safetensors files"
        )
    raise ModelFilesError(
        f"{root} has no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}: download the model's safetensors weights"
    )


def _sharded_weight_files(index: Path) -> tuple[Path, ...]:
    weight_map = _read_json(index, what=index.name).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFilesError(f"{index} has no weight_map: delete it and download the model again")
    shards = tuple(index.parent / name for name in sorted(set(weight_map.values())))
    missing = [shard.name for shard in shards if not shard.is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelFilesError(
            f"{index.parent} misses shard {missing[0]}{more} listed in {index.name}: "
            "finish the download (rerun it) and retry"
        )
    return shards


MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit (HeaderTooLarge): a damaged length read no more


def _check_header(weight_file: Path) -> None:
    """A safetensors file as its format lays it out: an 8-byte little-endian header length, a JSON header of
    tensors, and their data, which must end within the file. Read here, not by safetensors' safe_open (which
    imports torch): the CLI checks a model before torch loads (ssd_chat.cli_options.check_before_loading)."""
    try:
        size = weight_file.stat().st_size
        with open(weight_file, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or length > min(size - 8, MAX_HEADER_BYTES):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(handle.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
        if max(ends, default=0) > size - 8 - length:
            raise ValueError(f"tensor data to byte {max(ends)} of {size - 8 - length}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelFilesError(
            f"{weight_file} is truncated or corrupt ({reason}): delete it and download it again"
        ) from err


def _check_tokenizer(root: Path) -> None:
    if not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFilesError(
            f"{root} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): copy the model's tokenizer files "
            "into it or download them again"
        )
