"""Stepping with fewer threads while another program works on the engine's cores.

The threads of a step meet at each of its parallel parts. When another program holds one of their cores, every
meeting waits for the OS to run the thread it put aside, and on two cores a step takes 4-5x as long: one thread
is then 2-3x faster than two (README, "A busy CPU"). Linux's /proc/stat counts each core's busy time, all programs
and the hypervisor's steal together, and the process knows its own CPU time (its spinning threads included): the
difference is what others took from the engine's cores. Every half second of stepping the governor turns that
into the cores left free and steps with about that many threads, up to the engine's own count. It changes only
when the free cores are more than `MARGIN` past the half-way point between two counts, so a load of about half a
core (where one thread and two are as fast: tested beside a duty-cycle load) does not flip it every window.

Exactness does not depend on it: every CPU kernel sums each output in one order on any thread count (the kernels'
tests check 1 and 2 threads; tests/engine/test_cpu_contention.py a generation whose count changes every step).
Where /proc/stat is missing (macOS) the governor is off: the engine keeps its count.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

log = logging.getLogger(__name__)

WINDOW_S = 0.5  # seconds of stepping per measurement
MARGIN = 0.1  # cores past the half-way point between two thread counts before the count changes
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


def free_cores(start: Sample, end: Sample, cores: int) -> float:
    """The cores others left free between two samples: `cores` less what others used (in cores), at least 0."""
    wall = end.wall - start.wall
    others = max(0.0, (end.busy - start.busy) - (end.ours - start.ours)) / wall
    return max(0.0, cores - others)


def threads_for(free: float, now: int, most: int) -> int:
    """The thread count for `free` cores, stepping with `now`: the nearest count in 1..most once `free` is more than
    MARGIN past the half-way point to another count, else `now`."""
    if abs(free - now) <= 0.5 + MARGIN:
        return now
    return max(1, min(most, round(free)))


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
        free = free_cores(start, end, len(self.cores))
        chosen = threads_for(free, self.threads, self.most)
        if chosen != self.threads:
            log.info("stepping with %d of %d threads: other programs leave %.1f of the engine's %d cores free",
                     chosen, self.most, free, len(self.cores))
            self.threads = chosen
        return self.threads
