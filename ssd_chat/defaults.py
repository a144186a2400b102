"""The embedded speculative pair: SmolLM2-135M with the draft shipped in ``assets/`` (``smollm2-135m-draft``).

With the default target, asking for speculation (``--mode sd`` / ``--mode ssd``, or ``--draft
smollm2-135m-draft``) is enough: the shipped draft is loaded, SSD is the mode unless another is asked for,
and on two or more cores the target runs on every core but the last and the draft process on the last one
(core 0 and core 1 on a 2-core machine), so that switching modes in the chat compares them on the same
cores (AR and SD run on the target's cores, as in the paper's convention). Any explicit choice wins:
``--target`` another model, ``--draft DIR``, ``--tp``, placements; ``--draft none`` runs the target alone.

``PLAIN_RUNS_SSD`` decides what plain ``ssd-chat`` (no options) does. It is off: the shipped draft does not
yet beat AR on this CPU (tau about 1.9 on the held-out chat prompts: SSD on two cores only matches AR on one,
see README's Numbers), so plain ``ssd-chat`` runs AR on every core, the fastest exact choice. Turned on, plain
``ssd-chat`` runs the pair.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from engine.config import DEFAULT_TARGET
from engine.placement import ranges
from engine.registry import SHIPPED_DRAFT_ALIAS, SHIPPED_DRAFT_DIR

NO_DRAFT = "none"
PLAIN_RUNS_SSD = False  # turn on once the shipped draft makes SSD faster than AR (issue 5)


@dataclass(frozen=True)
class Layout:
    """The options that decide what runs where (the CLI's, before defaults)."""

    target: str
    draft: str | None
    mode: str | None
    tp: int = 1
    target_devices: str | None = None
    draft_device: str | None = None


def apply_defaults(given: Layout, cores: list[int] | None = None) -> Layout:
    """``given`` with the embedded pair filled in where the user asked for speculation and left the rest open."""
    if given.draft is not None and given.draft.lower() == NO_DRAFT:
        return replace(given, draft=None)
    asks = given.draft == SHIPPED_DRAFT_ALIAS or (given.draft is None and (
        given.mode in ("sd", "ssd") or (given.mode is None and PLAIN_RUNS_SSD)))
    if given.target != DEFAULT_TARGET or not asks or not SHIPPED_DRAFT_DIR.is_dir():
        return given
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    split = len(cores) >= 2 and given.tp == 1 and given.target_devices is None and given.draft_device is None
    mode = given.mode or ("ssd" if split else "sd")
    if not split:
        return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode)
    return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode, target_devices=f"cpu:{ranges(cores[:-1])}",
                   draft_device=f"cpu:{cores[-1]}")
