"""The embedded speculative pair: SmolLM2-135M with the draft shipped in ``assets/`` (``smollm2-135m-draft``).

With the default target, the shipped draft is loaded unless the user says otherwise (``--draft none``, another
``--draft``, ``--mode ar``), and the cores are split by what runs:

- plain ``ssd-chat``, ``--mode sd``: SD in one process, unpinned, on torch's default threads (one per physical
  core), the draft in the target's process: the fastest exact choice on a CPU (on the 2-core VM, real replies:
  56-58 tok/s against 41 for AR on both cores and 33-34 for SSD with a core each; README's Numbers). In the chat
  app a draft process waits, idle, pinned to the last core, so SSD stays one keystroke away; while SSD runs
  the target leaves that core to it (engine.llm's _share_cores).
- ``--mode ssd``: the target on every core but the last and the draft process on the last one (core 0 and
  core 1 on a 2-core machine); AR and SD, switched to in the chat, run on the target's cores, as in the paper.

Any explicit choice wins: ``--target`` another model, ``--draft DIR``, ``--tp``, placements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine import affinity
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


def apply_defaults(given: Layout, cores: list[int] | None = None, ssd_ready: bool = False) -> Layout:
    """``given`` with the embedded pair filled in where the user left it open. ``ssd_ready``: under SD, start
    the idle draft process anyway (the chat app, where SSD is a keystroke away; not one-shot answers)."""
    if given.draft is not None and given.draft.lower() == NO_DRAFT:
        return replace(given, draft=None)
    asks = given.draft == SHIPPED_DRAFT_ALIAS or (given.draft is None and given.mode != "ar")
    if given.target.lower() != DEFAULT_TARGET or not asks or not SHIPPED_DRAFT_DIR.is_dir():  # (aliases: any case)
        return given
    cores = sorted(affinity.usable()) if cores is None else sorted(cores)
    split = len(cores) >= 2 and given.tp == 1 and given.target_devices is None and given.draft_device is None
    mode = given.mode or "sd"
    if not split:
        return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode)
    if mode == "ssd":  # SSD's draft process gets a core of its own
        return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode, target_devices=f"cpu:{ranges(cores[:-1])}",
                       draft_device=f"cpu:{cores[-1]}")
    return replace(given, draft=SHIPPED_DRAFT_ALIAS, mode=mode, draft_device=f"cpu:{cores[-1]}" if ssd_ready else None)
