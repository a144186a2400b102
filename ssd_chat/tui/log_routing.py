"""Log records while the chat app has the terminal, where a handler writing to the terminal would write over its
screen (Textual draws on stderr itself): the engine's lines (INFO and up) go to the loading screen, or once loaded
to notifications (ChatApp.on_engine_log_line); any other logger's warnings and errors become one-line
notifications (a preferences file that cannot be written, say). What the terminal's handlers would have printed
(a traceback with -v) is held and printed once the app has given the terminal back (`release`, in run_tui);
handlers off the terminal (pytest's, a log file's) keep getting every record."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from textual.app import App
from textual.message import Message

from engine.outputs import not_also_an_event
from ssd_chat.tui.engine_server import ENGINE_LOGGER
from ssd_chat.tui.screens.loading import EngineLogLine

HELD_RECORDS = 1000  # the most records held for the terminal while the app runs (the newest kept)


@dataclass
class LogNotice(Message):
    """A warning or an error logged in the app's process: one line for a notification."""

    line: str
    error: bool


class ToApp(logging.Handler):
    """Posts each record's message (not its traceback) to the app as a message of its own (post_message is safe
    from any thread): the engine's lines as EngineLogLine, other warnings and errors as one-line LogNotice."""

    def __init__(self, app: App, level: int, engine: bool) -> None:
        super().__init__(level)
        self.app, self.engine = app, engine
        self.addFilter(not_also_an_event)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if self.engine:
                self.app.post_message(EngineLogLine(text))
            else:
                self.app.post_message(LogNotice(text.strip().split("\n", 1)[0], record.levelno >= logging.ERROR))
        except Exception:
            self.handleError(record)


class Held(logging.Handler):
    """The records the terminal's handlers would have printed, kept for after the app (the newest HELD_RECORDS)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: deque[logging.LogRecord] = deque(maxlen=HELD_RECORDS)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def on_the_terminal(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # (a closed stream)
        return False


class LogRouting:
    """`install` as the app starts (on_mount); `remove` as it ends (on_unmount: no more notifications, the
    terminal's handlers still held off, Textual still drawing); `release` once it has given the terminal back."""

    def __init__(self, app: App) -> None:
        self.engine_handler = ToApp(app, logging.INFO, engine=True)
        self.notices = ToApp(app, logging.WARNING, engine=False)
        self.held: Held | None = None
        self._saved: list[logging.Handler] | None = None
        self._engine_state: tuple[int, bool] | None = None

    def install(self) -> None:
        engine_log, root = logging.getLogger(ENGINE_LOGGER), logging.getLogger()
        self._engine_state = (engine_log.level, engine_log.propagate)
        engine_log.addHandler(self.engine_handler)
        engine_log.setLevel(logging.INFO)
        engine_log.propagate = False
        self._saved = root.handlers[:]
        terminal = [h for h in self._saved if on_the_terminal(h)]
        self.held = Held(min(h.level for h in terminal)) if terminal else None
        root.handlers = [h for h in self._saved if h not in terminal] + [self.notices]
        if self.held is not None:
            root.addHandler(self.held)

    def remove(self) -> None:
        if self._engine_state is None:
            return
        engine_log = logging.getLogger(ENGINE_LOGGER)
        engine_log.removeHandler(self.engine_handler)
        engine_log.setLevel(self._engine_state[0])
        engine_log.propagate = self._engine_state[1]
        self._engine_state = None
        root = logging.getLogger()
        root.handlers = [h for h in root.handlers if h is not self.notices]
        if self.held is None:  # nothing held off: the handlers as they were
            self.release()

    def release(self) -> None:
        """The terminal's handlers back, and what they were held from printed now."""
        if self._saved is None:
            return
        logging.getLogger().handlers, self._saved = self._saved, None
        held, self.held = self.held, None
        for record in held.records if held is not None else ():
            for handler in logging.getLogger().handlers:
                if on_the_terminal(handler) and record.levelno >= handler.level:
                    handler.handle(record)
