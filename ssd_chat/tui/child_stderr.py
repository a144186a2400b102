"""The chat app's engine process writes its stderr to a file, not to the terminal the app draws on: a failure's
traceback (the app shows its one line), a library's warning, a crash's last words; so do the draft process and the
TP ranks it starts, which inherit it. A line there went straight over the app's screen and garbled it.
`release` prints what they wrote once the app has given the terminal back (run_tui, after the log records
log_routing held), and removes the files; whatever is left is printed when the process exits, and removed unread
by a hangup's forced exit (stop_signals), which runs no atexit handler and has no terminal to print to."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import TextIO

from ssd_chat import stop_signals

_files: list[Path] = []  # one per engine process started (a /restart starts another)
_lock = threading.Lock()


def new_file() -> Path:
    """An empty file for one engine process's stderr, printed and removed by `release`."""
    fd, name = tempfile.mkstemp(prefix="ssd-chat-engine-", suffix=".stderr")
    os.close(fd)
    with _lock:
        _files.append(Path(name))
    return Path(name)


def redirect(path: str) -> None:
    """In the engine process, first thing: its file descriptor 2 (sys.stderr's, and its children's) to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)


def release(out: TextIO | None = None) -> None:
    """Write what the engine processes wrote to `out` (default: stderr), and remove their files."""
    with _lock:
        files, _files[:] = list(_files), []
    out = out or sys.stderr
    for path in files:
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace")
            path.unlink()
            if text:
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()


def remove() -> None:
    """Remove the files unread, without waiting on the lock (the forced exit's: the thread that holds it may be
    the stuck one)."""
    for path in list(_files):
        with contextlib.suppress(OSError):
            path.unlink()


atexit.register(release)
stop_signals.before_forced_exit(remove)
