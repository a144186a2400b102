"""The embedded default: plain ``ssd-chat`` runs SmolLM2-135M with the draft shipped in ``assets/`` under SSD,
the target on every core but the last and the draft process on the last one (core 0 and core 1 on a 2-core
machine), also when ``--mode ar`` or ``sd`` is asked for, so that switching modes in the chat compares them
on the same cores (AR and SD run on the target's cores, as in the paper's convention). Any explicit choice
wins: ``--target`` another model, ``--draft DIR``, ``--mode``, placements; ``--draft none`` runs the default
target alone (AR).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from engine.config import DEFAULT_TARGET
from engine.placement import ranges
from engine.registry import SHIPPED_DRAFT_ALIAS, SHIPPED_DRAFT_DIR

NO_DRAFT = "none"


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
    """``given`` with the embedded default filled in where the user left a choice open."""
    if given.draft is not None and given.draft.lower() == NO_DRAFT:
        return replace(given, draft=None)
    if given.target != DEFAULT_TARGET or given.draft is not None or not SHIPPED_DRAFT_DIR.is_dir():
        return given
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    split = len(cores) >= 2 and given.tp == 1 and given.target_devices is None and given.draft_device is None
    mode = given.mode or ("ssd" if split else "sd")
    if not split:
        return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode)
    return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode, target_devices=f"cpu:{ranges(cores[:-1])}",
                   draft_device=f"cpu:{cores[-1]}")

