"""A failure inside the engine (a bug, a broken model: a RuntimeError from the sampler, a model file torch cannot
read), as one line for the user instead of a traceback: `the engine failed (RuntimeError: ...)`, or while it
loads `the engine failed to load (...)`.

`engine_failures()` marks where the engine runs (plain.print_stream, where `ask` and the plain mode stream a
reply; the plain mode's whole turn; `bench`'s run) and turns such an exception into EngineFailed; `loaded()`
builds an engine under it (`ask` and the plain mode's load). The plain mode tells a reply's failure and goes on
with the chat; `ask`, `bench` and a failed load (cli_options.user_errors) tell it and exit with
EXIT_ENGINE_FAILED. `-v` logs the traceback. What is no failure of the engine passes unchanged: the user's (an
EngineError: a model not found, a prompt too long, a bad value; a BenchInputError: an unusable prompt file; exit
2), a reader gone (where the block writes to stdout or a terminal, any OSError: the pipe's own exit), a
KeyboardInterrupt, and anything raised once a stop signal came (the run ends with that signal's exit code,
stop_signals).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from engine.errors import EngineError
from ssd_chat import stop_signals
from ssd_chat.prompts import BenchInputError

log = logging.getLogger(__name__)
EXIT_ENGINE_FAILED = 1  # (a user error is 2: cli_options.EXIT_USER_ERROR)
FAILED = "failed"
FAILED_TO_LOAD = "failed to load"
P = ParamSpec("P")
T = TypeVar("T")


class EngineFailed(Exception):
    """An exception from inside the engine, told as one line; the original is its __cause__."""

    def __init__(self, cause: Exception, what: str = FAILED) -> None:
        super().__init__(f"the engine {what} ({type(cause).__name__}: {cause})")


@contextmanager
def engine_failures(what: str = FAILED, *, writes: bool = True) -> Iterator[None]:
    """Raise EngineFailed (`the engine WHAT (...)`) from an exception inside the `with` block that is no user error,
    lost reader or stop. `writes`: the block writes to stdout or a terminal, so that any OSError is the reader or
    the terminal gone; where it writes none (a load, the bench's run: its progress on stderr, whose broken pipe rich
    ends itself), an OSError is the engine's, a BrokenPipeError too (a pipe or socket to a process of its own: no
    reader of ours went away; were stderr's, the error line's write would meet it and end the run as SIGPIPE)."""
    try:
        yield
    except (EngineError, BenchInputError, EngineFailed):
        raise
    except Exception as error:
        if writes and isinstance(error, OSError):  # (the reader or the terminal gone: main ends it, as SIGPIPE)
            raise
        if stop_signals.received() is not None:  # (an error on the way out of a stopped run: main() ends it)
            raise
        log.info("the engine %s", what, exc_info=True)  # (-v: the traceback, for a bug report)
        raise EngineFailed(error, what) from error


def loaded(make: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """make(*args, **kwargs), the engine it builds (cli.LLM), a failure while it loads told as EngineFailed."""
    with engine_failures(FAILED_TO_LOAD, writes=False):
        return make(*args, **kwargs)
