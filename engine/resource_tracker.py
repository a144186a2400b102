"""Starting multiprocessing's resource tracker, where an app may have replaced sys.stderr.

Its own module, without torch: the chat app's process starts it before it starts the engine's process (and before
Textual replaces sys.stderr), and imports no torch itself (engine.distributed, which uses it too, does).
"""

from __future__ import annotations

import sys


def ensure_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (every spawned process and shared-memory block uses it) if it is not
    running. Its start passes sys.stderr's file descriptor to the tracker process, and fails ("bad value(s) in
    fds_to_keep") when an app has put a stream whose fileno() is -1 in sys.stderr, as Textual does while it runs:
    then the process's real stderr goes instead."""
    from multiprocessing import resource_tracker

    stderr = sys.stderr
    try:
        replaced = stderr is not None and stderr.fileno() < 0 and sys.__stderr__ is not None
    except (AttributeError, OSError, ValueError):  # no descriptor at all: the tracker start copes with that
        replaced = False
    if replaced:
        sys.stderr = sys.__stderr__
    try:
        resource_tracker.ensure_running()
    finally:
        if replaced:
            sys.stderr = stderr
