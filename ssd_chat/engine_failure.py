"""A failure inside the engine while it runs a reply (a bug, a broken model: a RuntimeError from the sampler), as
one line for the user instead of a traceback: `the engine failed (RuntimeError: ...)`.

`engine_failures()` marks where the engine runs (plain.print_stream, where `ask` and the plain mode stream a
reply; the plain mode's whole turn) and turns such an exception into EngineFailed. The plain mode tells it and goes
on with the chat; `ask` (cli_options.user_errors) tells it and exits with EXIT_ENGINE_FAILED. `-v` logs the
traceback. What is no failure of the engine passes unchanged: an EngineError (the user's: a prompt too long, a bad
value: exit 2), an OSError (a reader gone: the pipe's own exit), a KeyboardInterrupt, and anything raised once a
stop signal came (the run ends with that signal's exit code, stop_signals).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from engine.errors import EngineError
from ssd_chat import stop_signals

log = logging.getLogger(__name__)
EXIT_ENGINE_FAILED = 1  # (a user error is 2: cli_options.EXIT_USER_ERROR)


class EngineFailed(Exception):
    """An exception from inside the engine, told as one line; the original is its __cause__."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"the engine failed ({type(cause).__name__}: {cause})")


@contextmanager
def engine_failures() -> Iterator[None]:
    """Raise EngineFailed from an exception inside the `with` block that is no user error, lost reader or stop."""
    try:
        yield
    except (EngineError, OSError, EngineFailed):
        raise
    except Exception as error:
        if stop_signals.received() is not None:  # (an error on the way out of a stopped run: main() ends it)
            raise
        log.info("the engine failed", exc_info=True)  # (-v: the traceback, for a bug report)
        raise EngineFailed(error) from error
