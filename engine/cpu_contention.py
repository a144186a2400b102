"""Stepping with fewer threads while another program works on the engine's cores.

The threads of a step meet at each of its parallel parts. When another program holds one of their cores, every
meeting waits for the OS to run the thread it put aside, and on two cores a step takes 4-5x as long: one thread
is then 2-3x faster than two (README, "A busy CPU"). Linux's /proc/stat counts each core's busy time, all programs
and the hypervisor's steal together, and the process knows its own CPU time (its spinning threads included): the
difference is what others took from the engine's cores. Every half second of stepping the governor turns that
into a thread count, up to the engine's own. On fewer threads, where a load shows whole stepping or not, a pause
between steps counts too, to give threads back (a reply shorter than a window completes none).

An idle engine (no requests) shows a load whole too, so a reply that comes after a pause of `PAUSE_READ_S` or more
takes its first step's count from the pause alone, both ways. Before, a load that began while the engine waited
cost the next reply its first half second on every thread, 4-5x slower steps: in the chat app, beside a busy loop,
a first token after 1.4-2.6 s. The reading is the pause's average: a load that stopped before the reply, for most
of the pause, costs it a window on one thread instead. The engine is idle from the start of its load (a first
request right after it, as `ask`'s, takes its count from the load, whose own work is the process's; not where the
load ends by moving the engine to other cores, as SSD's layout on 3+ cores does: a new governor), and its
companions count as its own over the pause, not as other programs: the processes it started (SSD's idle draft
process loads beside it; not their own children, as a compiler's) and `EngineConfig.companion_pids` (the chat app's
UI process, which imports and draws its first screen for about a second after the engine has loaded: 0.5 of a core
over a 4 s pause), each for the time it spent over the pause (one that ended in it: none). While the engine steps,
their work competes with the step's threads like any other's.

Each core others use `TAKEN_AT` of (0.35 of a core, 1.35 of two, ...) costs a thread. On the 2-vCPU VM
(2026-12-06, beside a load busy for a share of every 10 ms) two threads and one were about as fast at 0.4-0.5 of a
core of load (one run or the other ahead, by the VM's noise), one thread the faster from 0.75 on, two below 0.3;
and a load shows less than it is while the engine steps on every core, as its spinning threads crowd it out: a
busy loop as 0.70 of a core, half a core as 0.37, 0.4 as 0.29 (beside one thread each shows whole). So a load
drops a thread from about half a core, and the thread comes back once the load is under 0.35: loads between stay
where they are, and do not flip the count every window.

Exactness does not depend on it: every CPU kernel sums each output in one order on any thread count (the kernels'
tests check 1 and 2 threads; tests/engine/test_cpu_contention.py a generation whose count changes every step).
Where /proc/stat is missing (macOS) the governor is off: the engine keeps its count.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from engine.outputs import ALSO_AN_EVENT

log = logging.getLogger(__name__)

WINDOW_S = 0.5  # seconds of stepping per measurement
TAKEN_AT = 0.35  # of a core that others use (as measured): the engine gives that core up
IDLE_S = 0.25  # a pause this long from one step's end to the next's start starts a new window (idle, not busy)
PAUSE_READ_S = 1.0  # an idle pause this long is a measurement of its own (/proc/stat counts in 10 ms ticks)
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


def cpu_seconds(pids: Collection[int]) -> dict[int, float]:
    """The CPU seconds each of the processes `pids` spent so far (its own, every thread); a process gone is left out."""
    spent = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # (after the name, which may hold spaces)
            spent[pid] = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: the stat's 14th and 15th
        except (OSError, IndexError, ValueError):
            continue
    return spent


def children() -> set[int]:
    """The pids of this process's children (started by any of its threads), from /proc; none where it can't say."""
    pids: set[int] = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path, "rb") as f:
                pids.update(int(pid) for pid in f.read().split())
        except (OSError, ValueError):
            continue
    return pids


def grown(start: dict[int, float], end: dict[int, float]) -> float:
    """The CPU seconds processes spent between two cpu_seconds readings: those in both (a process that ended in
    between is left out, not subtracted: its whole time would read as other programs')."""
    return sum(max(0.0, spent - start[pid]) for pid, spent in end.items() if pid in start)


def others_use(start: Sample, end: Sample) -> float:
    """The cores' worth of time others took from the cores between two samples, at least 0."""
    return max(0.0, (end.busy - start.busy) - (end.ours - start.ours)) / (end.wall - start.wall)


def threads_for(others: float, cores: int, most: int) -> int:
    """The thread count (1 to `most`) on `cores` cores while others use `others` cores' worth of them: the cores
    they leave, each core counted as theirs from TAKEN_AT of it."""
    return max(1, min(most, cores - math.floor(others + 1 - TAKEN_AT)))


class ThreadGovernor:
    """The thread count each step runs with, lowered while other programs hold the engine's cores (see above)."""

    def __init__(self, cores: Collection[int], most: int, *, threads: int | None = None,
                 read: Callable[[Collection[int]], Sample | None] = read_sample,
                 clock: Callable[[], float] = time.monotonic,
                 companions: Callable[[], dict[int, float]] = dict) -> None:
        """`threads`: the count to start on (at most `most`; None: `most`). `companions`: the CPU seconds each of
        the engine's companion processes spent so far, by pid (cpu_seconds; their work over an idle pause is the
        engine's own)."""
        self.cores, self.most = tuple(cores), most
        self.threads = most if threads is None else max(1, min(most, threads))
        self._read, self._clock, self._companions = read, clock, companions
        self._start: Sample | None = None
        self._last_end = float("-inf")  # when the last step ended
        self._idle: tuple[Sample, dict[int, float]] | None = None  # when the engine went idle, until the next step

    @classmethod
    def where_useful(cls, cores: Collection[int], most: int, threads: int | None = None,
                     companions: Collection[int] = ()) -> ThreadGovernor | None:
        """A governor for a process stepping with at most `most` threads on `cores`, starting on `threads`, or None
        where it has nothing to do: one thread, more threads than cores (asked for: the count is kept), or no
        /proc/stat. `companions`: the pids of the engine's companion processes."""
        if not 2 <= most <= len(cores) or read_sample(cores) is None:
            return None
        given = set(companions)
        return cls(cores, most, threads=threads, companions=lambda: cpu_seconds((given | children()) - {os.getpid()}))

    def tick(self) -> int:
        """Called before each step: the thread count for it."""
        now = self._clock()
        idle, self._idle = self._idle, None
        if now - self._last_end > IDLE_S:  # the first step, or after a pause: measure from here
            start, self._start = self._start, self._read(self.cores)
            if idle is not None and self._start is not None and self._start.wall - idle[0].wall >= PAUSE_READ_S:
                (since, companions), end = idle, self._start
                theirs = grown(companions, self._companions())
                self._choose(others_use(since, replace(end, ours=end.ours + theirs)))
            elif self.threads < self.most and start is not None and self._start is not None:
                # On fewer threads a load shows whole, stepping or not: the steps since the window began and the
                # pause after them tell whether it has gone (replies shorter than a window, a few dozen tokens,
                # never completed one, and kept the count a load had left them)
                self._choose(others_use(start, self._start), more_only=True)
        self._last_end = now  # (until done(): a step that never reports its end is no pause)
        start = self._start
        if start is None or now - start.wall < WINDOW_S:
            return self.threads
        end = self._read(self.cores)
        if end is None:
            return self.threads
        self._start = end
        self._choose(others_use(start, end))
        return self.threads

    def _choose(self, others: float, *, more_only: bool = False) -> None:
        chosen = threads_for(others, len(self.cores), self.most)
        if chosen != self.threads and (chosen > self.threads or not more_only):
            log.info("stepping with %d of %d threads: other programs use %.2f of the engine's %d cores",
                     chosen, self.most, others, len(self.cores),
                     extra={ALSO_AN_EVENT: True})  # (it ticks in a step: each request there hears ThreadsChanged)
            self.threads = chosen

    def idle(self) -> None:
        """Called when the engine has no requests left, from the start of its load on: the next step, after a pause
        of PAUSE_READ_S or more, takes its count from the load over the pause. A later call keeps the first reading
        (the chat app sets the mode before each reply); a step in between, with no pause, drops it (a pause after
        it could be inside a request)."""
        if self._idle is None and (sample := self._read(self.cores)) is not None:
            self._idle = sample, self._companions()

    def done(self) -> None:
        """Called after each step: the time to the next one is the engine's pause, not the step's. (From the start
        of a step, a step slowed by the very programs the governor measures looked like a pause: beside a busy
        loop and the chat app's UI a verify took 0.5-0.9 s, and no window ever completed.)"""
        self._last_end = self._clock()

