"""Stepping with fewer threads while another program works on the engine's cores.

The threads of a step meet at each of its parallel parts. When another program holds one of their cores, every
meeting waits for the OS to run the thread it put aside, and on two cores a step takes 4-5x as long: one thread
is then 2-3x faster than two (README, "A busy CPU"). Linux's /proc/stat counts each core's busy time, all programs
and the hypervisor's steal together, and the process knows its own CPU time (its spinning threads included): the
difference is what others took from the engine's cores. Every half second of stepping the governor turns that
into a thread count, up to the engine's own.

Each core others use `DROP_AT` of (0.3 of a core, 1.3 of two, ...) costs a thread, and the engine takes it back
once they use less than `BACK_AT` of it. Both are low because the engine's spinning threads crowd the others out
while it steps on every core: on the 2-vCPU VM (2026-12-06) a busy loop got 0.70 of a core there and 1.00 beside
one thread, a load of half a core 0.37 and 0.49; one thread was the faster from loads of about 0.4 of a core on
(beside a duty-cycle load of 10 ms periods). The gap between the two keeps a load near them from flipping the
count every window.

Exactness does not depend on it: every CPU kernel sums each output in one order on any thread count (the kernels'
tests check 1 and 2 threads; tests/engine/test_cpu_contention.py a generation whose count changes every step).
Where /proc/stat is missing (macOS) the governor is off: the engine keeps its count.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

log = logging.getLogger(__name__)

WINDOW_S = 0.5  # seconds of stepping per measurement
DROP_AT = 0.3  # of a core that others use: the engine gives that core up
BACK_AT = 0.2  # ... and takes it back once they use less
IDLE_S = 0.25  # a pause between steps this long starts a new window (the engine was idle, not busy)
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat's user, nice, system, irq, softirq, steal (guest is in user)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's units a second


@dataclass(frozen=True)
class Sample:
    wall: float  # seconds, monotonic
    busy: float  # core-seconds every program (and the hypervisor's steal) spent on the cores so far
    ours: float  # CPU seconds this process spent so far, every thread


def read_sample(cores: Collection[int]) -> Sample | None:
    """The busy time of `cores` and this process's CPU time now; None where /proc/stat can't be read."""
    wall, ours = time.monotonic(), time.process_time()
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    busy, wanted = 0, {b"cpu%d" % c for c in cores}
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted:
            busy += sum(int(parts[1 + i]) for i in _BUSY_FIELDS if 1 + i < len(parts))
    return Sample(wall, busy / _TICKS, ours)


def others_use(start: Sample, end: Sample) -> float:
    """The cores' worth of time others took from the cores between two samples, at least 0."""
    return max(0.0, (end.busy - start.busy) - (end.ours - start.ours)) / (end.wall - start.wall)


def threads_for(others: float, cores: int, now: int, most: int) -> int:
    """The thread count on `cores` cores stepping with `now` threads (at most `most`) while others use `others`
    cores' worth: fewer once they use DROP_AT of a core more, more once they use BACK_AT of one less."""
    fewer = cores - math.floor(others + 1 - DROP_AT)  # the cores they leave, a core counted from DROP_AT of it
    more = cores - math.floor(others + 1 - BACK_AT)
    if fewer < now:
        return max(1, fewer)
    if more > now:
        return min(most, more)
    return now


class ThreadGovernor:
    """The thread count each step runs with, lowered while other programs hold the engine's cores (see above)."""

    def __init__(self, cores: Collection[int], most: int, *,
                 read: Callable[[Collection[int]], Sample | None] = read_sample,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cores, self.most, self.threads = tuple(cores), most, most
        self._read, self._clock = read, clock
        self._start: Sample | None = None
        self._last_step = float("-inf")

    @classmethod
    def where_useful(cls, cores: Collection[int], most: int) -> ThreadGovernor | None:
        """A governor for a process stepping with `most` threads on `cores`, or None where it has nothing to do:
        one thread, more threads than cores (asked for: the count is kept), or no /proc/stat."""
        if not 2 <= most <= len(cores) or read_sample(cores) is None:
            return None
        return cls(cores, most)

    def tick(self) -> int:
        """Called before each step: the thread count for it."""
        now = self._clock()
        if now - self._last_step > IDLE_S:  # the first step, or after a pause: measure from here
            self._start = self._read(self.cores)
        self._last_step = now
        start = self._start
        if start is None or now - start.wall < WINDOW_S:
            return self.threads
        end = self._read(self.cores)
        if end is None:
            return self.threads
        self._start = end
        others = others_use(start, end)
        chosen = threads_for(others, len(self.cores), self.threads, self.most)
        if chosen != self.threads:
            log.info("stepping with %d of %d threads: other programs use %.2f of the engine's %d cores",
                     chosen, self.most, others, len(self.cores))
            self.threads = chosen
        return self.threads
