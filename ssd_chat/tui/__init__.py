"""The Textual chat app. `run_tui` opens it; the models load inside it, behind a loading screen."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
import termios
from collections.abc import Callable, Iterator

from engine.config import SpeculationConfig
from engine.errors import EngineError
from engine.spawning import ensure_resource_tracker
from ssd_chat import stop_signals
from ssd_chat.history import ChatSettings, HistoryStore, default_db_path
from ssd_chat.tui import child_stderr
from ssd_chat.tui.engine_worker import ChatEngine

log = logging.getLogger(__name__)


def run_tui(load_engine: Callable[[], ChatEngine], *, settings: ChatSettings, target: str, draft: str | None,
            resume: bool = False, speculation: SpeculationConfig | None = None,
            given: frozenset[str] = frozenset(), enter_sends: bool | None = None) -> int:
    """Run the app until the user quits; returns its exit code. Raises EngineError when the models did not
    load (the caller prints the one-line message)."""
    from ssd_chat.tui.app import ChatApp  # textual loads only when the TUI is used

    history_off = None
    try:
        store = HistoryStore()
    except (OSError, sqlite3.Error) as err:
        history_off = f"{default_db_path()}: {err}"
        log.warning("chat history disabled: %s", history_off)
        store = None
    ensure_resource_tracker()  # now, while sys.stderr is the terminal's (Textual replaces it while it runs)
    app = ChatApp(load_engine, settings=settings, store=store, target=target, draft=draft, resume=resume,
                  speculation=speculation, given=given, enter_sends=enter_sends, history_off=history_off)
    try:
        with stop_signals.pythons_ctrl_c():
            app.run()
    finally:
        app.log_routing.release()  # (what -v would have printed over the screen: now)
        child_stderr.release()  # (what the engine process wrote to its stderr: a failure's traceback, say)
    if app.load_error is not None:
        raise EngineError(app.load_error)
    return app.return_code or 0


@contextlib.contextmanager
def keys_reach_the_app() -> Iterator[None]:
    """Until the app has the terminal: its flow control (IXON) off, so that a Ctrl+Q pressed while the app still
    starts waits in the input for the app (which quits on it) instead of being taken by the terminal as XON
    (it was lost: the app loaded to "ready"). The terminal's settings are restored after."""
    try:
        fd = sys.stdin.fileno()
        before = termios.tcgetattr(fd)
    except (AttributeError, OSError, ValueError, termios.error):  # not a terminal
        yield
        return
    changed = list(before)
    changed[0] &= ~termios.IXON  # iflag
    with contextlib.suppress(termios.error):
        termios.tcsetattr(fd, termios.TCSANOW, changed)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, before)


__all__ = ["keys_reach_the_app", "run_tui"]
