"""Which CPU cores this process may run on, and pinning it to some of them where the OS can: Linux (per thread,
sched_setaffinity). macOS has no such call: there every core counts as usable, pinning only sets torch's thread
count and the OS places the threads, so ``cpu:0`` and ``cpu:1`` (``--target-devices``, ``--draft-device``) say how
many cores each side's threads get, not which ones."""

from __future__ import annotations

import contextlib
import functools
import logging
import os

log = logging.getLogger(__name__)


def can_pin() -> bool:
    """Whether this OS pins threads to cores (Linux: yes; macOS: no)."""
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def usable() -> set[int]:
    """The cores this process may run on now: its affinity where the OS has one, else every core."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def pin(cores: tuple[int, ...] | set[int] | None, threads: int | None) -> None:
    """Pin this whole process (every thread it has now, and so every thread they start) to `cores` where the OS
    can, and set torch's intra-op threads. Linux affinity is per thread, and the engine may run in a UI worker
    thread."""
    if cores is not None:
        if can_pin():
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                    os.sched_setaffinity(int(tid), set(cores))
        else:
            _cannot_pin()
    if threads is not None:
        import torch  # here: the chat app's process reads its cores (ssd_chat.defaults) without torch

        torch.set_num_threads(threads)


@functools.cache
def _cannot_pin() -> None:
    log.info("this OS does not pin threads to cores: cpu:N placements set thread counts only")
