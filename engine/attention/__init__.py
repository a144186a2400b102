"""Attention backends behind one small interface (see base.py); SDPA is the reference.

The flashinfer backend (CUDA, optional `gpu` extra) is imported only when chosen, so a CPU box never needs it.
"""

from __future__ import annotations

import importlib.util

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata, SeqSpan, build_metadata
from engine.attention.sdpa import SdpaBackend
from engine.errors import InvalidParameterError

__all__ = [
    "AttentionBackend", "AttentionMetadata", "SdpaBackend", "SeqSpan", "build_metadata", "choose_backend",
    "make_backend",
]

FLASHINFER_DTYPES = (torch.bfloat16, torch.float16)


def flashinfer_installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def choose_backend(
    name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
    has_flashinfer: bool | None = None,
) -> str:
    """The backend `name` ("auto" | "sdpa" | "flashinfer") means on `device` at `dtype`; refuses what cannot work."""
    kind = torch.device(device).type
    if name == "sdpa":
        return "sdpa"
    if name not in ("auto", "flashinfer"):
        raise InvalidParameterError(f"unknown attention backend {name!r}: use auto, sdpa or flashinfer")
    installed = flashinfer_installed() if has_flashinfer is None else has_flashinfer
    if name == "auto":
        return "flashinfer" if kind == "cuda" and installed and dtype in FLASHINFER_DTYPES else "sdpa"
    if kind != "cuda":
        raise InvalidParameterError("--attention flashinfer needs a CUDA device: use --attention sdpa on the CPU")
    if not installed:
        raise InvalidParameterError("flashinfer is not installed: pip install -e '.[gpu]', or use --attention sdpa")
    if dtype not in FLASHINFER_DTYPES:
        raise InvalidParameterError(f"flashinfer needs --dtype bfloat16 or float16, got {dtype}: or use sdpa")
    return "flashinfer"


def make_backend(
    name: str = "sdpa", device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    if choose_backend(name, device, dtype) == "sdpa":
        return SdpaBackend()
    from engine.attention.flashinfer import FlashInferBackend  # CUDA only: imported when chosen

    return FlashInferBackend()
