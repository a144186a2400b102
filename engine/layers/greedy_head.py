"""The LM head of a greedy step, screened: only the products that may be a row's largest run the float32 kernel.

A greedy step needs one thing from the head: each row's argmax. SmolLM2-135M's head is 49,152 columns of 8-bit
values (engine/layers/panel8.py), 1.7 ms of a 11 ms one-row step on one core and 3.6 ms of a five-row verify. The
same product with the activations rounded to 8 bits (q8's integer dot products) takes 1.2 and 1.4 ms, and a
rigorous bound on its distance from the float32 product (engine/kernels/q8_gemm.cpp: q8_screen8) leaves about 10 of
the head's 1536 panels of 32 columns that may hold the largest float32 product; those run the float32 kernel,
every other column is -inf (engine/kernels/panel_gemm.cpp: panel8_screened). Every row's argmax, ties included, is
the full product's, so greedy tokens are unchanged (tested against the full head, and AR = SD = SSD end to end).

It takes the target's head on a CPU with q8's code (x86 with AVX2 or AVX-512 VNNI), where the head runs the 8-bit
panels in float32 (not --cpu-matmul q8, whose head is already the 8-bit product), for the steps whose every
request is greedy, on one tensor-parallel rank. Sampled steps need every logit and keep the full head.
``SSD_CHAT_GREEDY_HEAD=0`` turns it off.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from engine.layers import native, panel8

ENV = "SSD_CHAT_GREEDY_HEAD"


def logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    """hidden [rows, D] -> logits [rows, V] whose argmax per row is the full head's (the candidates' exact values,
    -inf elsewhere), or None where the screened head does not apply (the caller runs the full head)."""
    if not applies(head, hidden):
        return None
    return panel8.screened(head.packed, hidden, head._screen[1])[0]


def applies(head: nn.Module, hidden: torch.Tensor) -> bool:
    """Whether `hidden`'s rows can take `head`'s screened product (see the module's doc). What depends on the head
    alone is decided once for its packed copy and kept on it, with the bound sums: (packed, sums or None)."""
    if os.environ.get(ENV, "1") == "0":
        return False
    screen = _screen(head)
    rows = hidden.shape[0]
    return (screen[1] is not None and hidden.device.type == "cpu" and hidden.dtype == torch.float32
            and hidden.dim() == 2 and head.packed_min_rows <= rows <= head.packed_rows)


def prepare(head: nn.Module) -> None:
    """Decide what `applies` keeps on the head now, at load, not in a reply's first greedy step (SmolLM2-135M's bound
    sums: 57 ms of a 2-vCPU Zen 1's, a quarter of the first reply's time to its first token)."""
    if os.environ.get(ENV, "1") != "0":
        _screen(head)


def _screen(head: nn.Module) -> tuple[object, torch.Tensor | None]:
    """(packed, its bound sums or None), made once per packed copy and kept on the head."""
    packed = getattr(head, "packed", None)
    screen = head.__dict__.get("_screen")
    if screen is None or screen[0] is not packed:
        head._screen = screen = (packed, _bound_sums(head))
    return screen


def _bound_sums(head: nn.Module) -> torch.Tensor | None:
    """panel8.bound_sums of the head's 8-bit panels ([panels, K / 32] floats: 110 KB for SmolLM2's), or None where
    the head cannot be screened: no float32 8-bit panels, a sharded head, or no q8 code on this CPU."""
    packed, tp = getattr(head, "packed", None), getattr(head, "tp", None)
    if not isinstance(packed, panel8.Panel8) or packed.q8 or (tp is not None and tp.size > 1):
        return None
    return panel8.bound_sums(packed) if native.q8_available() else None
