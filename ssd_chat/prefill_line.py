"""A long prompt's prefill on a terminal, for the plain mode and `ask`: one line on stderr, rewritten in place
after each chunk ("reading the prompt: 1,280 / 4,442 tokens"), erased when the reply starts or the request ends.
Nothing when stderr is not a terminal: a pipe or a log file keeps only the replies and the stats lines."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from engine.outputs import Event, PrefillProgress, ThreadsChanged

ERASE = "\r\x1b[K"  # back to the line's start, erase to its end


class PrefillLine:
    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        """enabled None: when `stream` (stderr by default) is a terminal."""
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.shown = False

    def update(self, event: Event) -> None:
        """Show a PrefillProgress; any other event (the reply's first tokens) but a thread count erases the line."""
        if not self.enabled:
            return
        if isinstance(event, PrefillProgress):
            text = f"reading the prompt: {event.done:,} / {event.total:,} tokens (Ctrl-C stops)"
            self.stream.write(ERASE + text[: _columns(self.stream) - 1])  # a wrapped line could not be rewritten
            self.stream.flush()
            self.shown = True
        elif not isinstance(event, ThreadsChanged):
            self.clear()

    def clear(self) -> None:
        if self.shown:
            self.stream.write(ERASE)
            self.stream.flush()
            self.shown = False


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no terminal size to read (a test's stream)
        return 80


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False
