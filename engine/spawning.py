"""What a child process starts with: the resource tracker it shares, its cores, and no Ctrl-C or hangup.

No torch here: the chat app's process starts its engine's process with these, and imports no torch itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from engine import interrupts
from engine.affinity import can_pin


def ensure_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (every spawned process and shared-memory block uses it) if it is not
    running. Its start passes sys.stderr's file descriptor to the tracker process, and fails ("bad value(s) in
    fds_to_keep") when an app has put a stream whose fileno() is -1 in sys.stderr, as Textual does while it runs:
    then the process's real stderr goes instead. It starts with SIGHUP blocked (`interrupts_blocked`): a closed
    terminal ended it with the rest of the process group, leaving SSD's shared-memory block in /dev/shm."""
    from multiprocessing import resource_tracker

    stderr = sys.stderr
    try:
        replaced = stderr is not None and stderr.fileno() < 0 and sys.__stderr__ is not None
    except (AttributeError, OSError, ValueError):  # no descriptor at all: the tracker start copes with that
        replaced = False
    if replaced:
        sys.stderr = sys.__stderr__
    try:
        with interrupts_blocked():
            resource_tracker.ensure_running()
    finally:
        if replaced:
            sys.stderr = stderr


@contextlib.contextmanager
def started_on(cores: tuple[int, ...] | None):
    """Around a child process's start: the calling thread's affinity is `cores`, which the child inherits from its
    first instruction (Linux), so that its imports run on its own cores. Pinned only once they were done, a draft
    process's 1.4 s of imports ran on the leader's core, beside the target's load."""
    if cores is None or not can_pin():
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def interrupts_blocked():
    """Around a child process's start: SIGINT and SIGHUP blocked, so the child starts with them blocked (the mask
    survives exec). A Ctrl-C in the terminal, or its closing (the shell passes its SIGHUP to its job), reaches the
    whole process group; the leader takes it and stops its children (a draft process still importing torch printed
    a traceback and was reported as failed; ssd_chat.stop_signals). SIGTERM stays open: multiprocessing's exit
    stops a daemon child with it. The caller's own start is not cut short by any of the three either
    (`interrupts.held`: an interrupt between the child's spawn and the writing of its start-up data left the child
    a traceback, "Ran out of input")."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    with interrupts.held():
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGHUP})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start(proc, cores: tuple[int, ...] | None = None) -> None:
    """proc.start() on `cores`, with interrupts blocked; a Ctrl-C held during the start kills the child (it must
    not outlive the start) and is then raised."""
    try:
        with started_on(cores), interrupts_blocked():
            proc.start()
    except BaseException:
        if proc.pid is not None:
            proc.kill()
            proc.join(5.0)
        raise


def killed_by(code: int) -> str:
    """How a child whose exit code is `code` < 0 ended: "killed by SIGKILL" (or "killed by signal N", unnamed)."""
    with contextlib.suppress(ValueError):
        return f"killed by {signal.Signals(-code).name}"
    return f"killed by signal {-code}"
