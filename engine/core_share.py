"""Which cores and torch threads an engine's own process steps with, over its life.

At start the process is pinned to the target leader's cores (``--target-devices cpu:N``) where it has some. An
unpinned target beside SSD's draft process (the chat app's layout: SD on every core, SSD's draft process on one)
leaves the draft's cores while SSD runs, or its threads would wait for the busy draft's core; AR and SD, a lost
draft process and close() give every core back. Pinning is process-wide: one such engine per process.

torch's (OpenMP's) thread count belongs to the thread that set it, so every step first restores the count this
engine chose (`sync_thread`): the chat app runs each reply on whichever worker thread is free. With `adapt`, that
count is lowered while other programs use the process's cores (engine.cpu_contention).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from engine.affinity import pin, usable
from engine.cpu_contention import ThreadGovernor
from engine.outputs import ThreadsChanged
from engine.placement import Placement, crowding, off_the_draft

if TYPE_CHECKING:
    from engine.request import RequestState

log = logging.getLogger(__name__)


class CoreShare:
    def __init__(self, placement: Placement, adapt: bool = False, companions: tuple[int, ...] = ()) -> None:
        """`companions`: the pids of processes whose work is the engine's own (ThreadGovernor's)."""
        self.placement, self.adapt, self.companions = placement, adapt, companions
        self.affinity = usable()  # the cores this process had before any pin
        self.cores = self.affinity  # the cores it steps on now
        self.governor: ThreadGovernor | None = None  # (adapt, and several threads: the count while others are busy)
        self.carried: int | None = None  # a lowered count a governor had, for the next one to start on
        self.steps = self.steps_on_fewer = 0  # steps, and those on fewer threads than step_threads (for the bench)
        if (warning := crowding(placement, self.affinity)) is not None:
            log.warning(warning)
        self.threads = self.step_threads = self.before = torch.get_num_threads()  # (before: the process's, for close)
        self.yielded = False  # the target is off SSD's draft cores for now

    def pin_leader(self) -> None:
        """Pin this process to the target leader's cores, with its thread count (the placement's, or one a core)."""
        leader = self.placement.target[0]
        self._pin(leader.cores, self.placement.threads_for(leader) or torch.get_num_threads())
        self.threads = self.step_threads

    def share(self, ssd: bool) -> None:
        """Off the draft process's cores while `ssd` (SSD runs, its draft process serving), on every core else."""
        if ssd == self.yielded:
            return
        room = off_the_draft(self.placement, self.affinity, self.threads)
        if room is not None:
            self._pin(*(room if ssd else (self.affinity, self.threads)))
            self.yielded = ssd

    def restore(self) -> None:
        """Every core this process had before the engine, and the thread count it had (an engine on two threads
        left the process on two: the next engine there with threads=None took them, and the governor with them)."""
        pinned = self.yielded or self.placement.target[0].cores is not None
        self.yielded = False
        self._pin(self.affinity if pinned else None, self.before)

    @property
    def threads_now(self) -> int:
        """The thread count steps run with now: the governor's, else the engine's."""
        return self.step_threads if self.governor is None else self.governor.threads

    def tell(self, state: RequestState) -> None:
        """A ThreadsChanged for a request where steps run on another count than the one it last heard (a new one
        presumes every thread): the governor's changes, and a new governor (_pin: SSD's draft process lost mid-reply
        gives every core back) that starts on every thread after the old one had told it of fewer."""
        now = (self.threads_now, self.step_threads)
        heard = state.threads_heard or (now[1], now[1])
        if now != heard and (now[0] < now[1] or heard[0] < heard[1]):  # (not for a new count of all threads)
            state.events.append(ThreadsChanged(state.request_id, *now))
            state.threads_heard = now

    def sync_thread(self) -> None:
        """The calling thread steps with the engine's thread count (it may not be the thread that set it), or the
        governor's where other programs use the cores."""
        threads = self.step_threads if self.governor is None else self.governor.tick()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.steps += 1
        self.steps_on_fewer += threads < self.step_threads

    def stepped(self) -> None:
        """After each step (the governor's pauses are from a step's end)."""
        if self.governor is not None:
            self.governor.done()

    def idle(self) -> None:
        """The engine has no requests (its load began or ended, the last reply ended, a mode was switched between
        replies): ThreadGovernor.idle."""
        if self.governor is not None:
            self.governor.idle()

    def _pin(self, cores: set[int] | tuple[int, ...] | None, threads: int | None) -> None:
        """engine.affinity.pin, remembering the thread count every step must run with."""
        pin(cores, threads)
        if cores is not None:
            self.cores = set(cores)
        if threads is not None:
            self.step_threads = threads
        # A new governor (a mode switch, SSD and back, each row of a compare) starts on the count the last one had
        # lowered to: beside a busy program every thread would run its first half second 4-5x slower (in the chat
        # app, whose UI is one more runnable thread, far more); where the load has gone, half a second gives it back
        if self.governor is not None:
            self.carried = self.governor.threads if self.governor.threads < self.governor.most else None
        self.governor = (ThreadGovernor.where_useful(self.cores, self.step_threads, self.carried, self.companions)
                         if self.adapt else None)
