"""The low-bit panels of large weights (engine.layers.panel4 / panel8), kept on disk between starts.

Recovering SmolLM2-135M's 4- and 8-bit values from its float32 weights took about 3 s of an 8 s engine start
(2-vCPU AMD EPYC, 2026-12-04); hashing those weights takes about 0.3 s. A weight's cache entry is named by a
SHA-1 of its bytes, shape and layout, so a changed weight (another model, a one-bit edit) misses and is
compressed again; the entry holds the panels (safetensors) or a marker that the weight has no low-bit form.
Unreadable or malformed entries are rebuilt; a cache that cannot be written is skipped. The packed copy is still
checked against the plain GEMM at load (engine.layers.packed.same_products), cached or not.

Where: ``$SSD_CHAT_PANEL_CACHE``, else ``panels`` in the ssd-chat cache (``$SSD_CHAT_CACHE`` or the user cache:
``~/.cache/ssd-chat/panels``), about 112 MB for SmolLM2-135M.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import torch

from engine import interrupts
from engine.layers import panel4, panel8

log = logging.getLogger(__name__)

FORMAT = 1  # bump when Panel4's or Panel8's layout changes: old entries then miss
MIN_CACHED = 1 << 16  # weights below this many elements compress in milliseconds: not worth a file

LowBit = panel4.Panel4 | panel8.Panel8


def cache_dir() -> Path:
    if os.environ.get("SSD_CHAT_PANEL_CACHE"):
        return Path(os.environ["SSD_CHAT_PANEL_CACHE"])
    from engine import smollm2

    return smollm2.cache_root() / "panels"


def compress(weight: torch.Tensor) -> LowBit | None:
    """The weight's 4-bit panels, else its 8-bit ones, else None (panel4.compress, then panel8.compress)."""
    return panel4.compress(weight) or panel8.compress(weight)


def low_bit(weight: torch.Tensor, min_cached: int = MIN_CACHED) -> LowBit | None:
    """`compress(weight)`, read from the cache when an entry for these exact bytes exists, else computed and
    stored (weights of min_cached elements or more)."""
    key = _key(weight) if weight.numel() >= min_cached else None
    if key is None:
        return compress(weight)
    path = cache_dir() / key
    found = _read(path, weight)
    if found is not None:
        return found[0]
    result = compress(weight)
    _write(path, result)
    return result


def _key(weight: torch.Tensor) -> str | None:
    """SHA-1 of the weight's bytes in memory order, its shape and layout; None for a layout without one
    contiguous buffer (then nothing is cached)."""
    w = weight.detach()
    flipped = not w.is_contiguous()
    data = w.t() if flipped else w  # K-major weights are a transposed view of a contiguous [K, N]
    if data.dtype != torch.float32 or data.device.type != "cpu" or not data.is_contiguous():
        return None
    digest = hashlib.sha1(data.numpy().data)
    digest.update(f"{tuple(w.shape)} {'k-major' if flipped else 'n-major'} format {FORMAT}".encode())
    return digest.hexdigest()


def _read(path: Path, weight: torch.Tensor) -> tuple[LowBit | None] | None:
    """(the cached result,) or None on a miss or an entry that does not fit the weight (rebuilt)."""
    from safetensors import safe_open

    if path.with_suffix(".none").is_file():
        return (None,)
    file = path.with_suffix(".safetensors")
    if not file.is_file():
        return None
    try:
        with safe_open(str(file), "pt") as f, interrupts.held():  # (engine.interrupts: a Ctrl-C in a read)
            kind, t = f.metadata().get("kind"), {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        n, k = weight.shape
        blocks = (n // 32, k // 32, 32)
        if kind == "4" and t["q"].shape == (n // 32, k, 16) and t["d"].shape == t["m"].shape == blocks:
            return (panel4.Panel4(t["q"], t["d"], t["m"], n),)
        if kind == "8" and t["q"].shape == (n // 32, k, 32) and t["d"].shape == blocks:
            return (panel8.Panel8(t["q"], t["d"], n),)
    except Exception as e:  # any unreadable entry is rebuilt
        log.warning("rebuilding the unreadable panel cache entry %s (%s)", file, e)
        return None
    log.warning("rebuilding the panel cache entry %s: it does not fit a %s weight", file, tuple(weight.shape))
    return None


def _write(path: Path, result: LowBit | None) -> None:
    from safetensors.torch import save_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if result is None:
            path.with_suffix(".none").touch()
            return
        tensors = {"q": result.q, "d": result.d} | ({"m": result.m} if isinstance(result, panel4.Panel4) else {})
        kind = "4" if isinstance(result, panel4.Panel4) else "8"
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata={"kind": kind})
            os.replace(tmp, path.with_suffix(".safetensors"))  # whole entries only
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as e:
        log.info("the panel cache at %s is not writable (%s): compressing at every start", path.parent, e)
