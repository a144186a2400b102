"""Log records while the chat app has the terminal, where a handler writing to the terminal would write over its
screen: the engine's lines (INFO and up) go to the loading screen, or once loaded to notifications
(ChatApp.on_engine_log_line); any other logger's warnings and errors become one-line notifications (a preferences
file that cannot be written, say), their tracebacks left to the handlers that do not write to the terminal
(pytest's, a log file's), which stay."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from textual.app import App
from textual.message import Message

from ssd_chat.tui.engine_server import ENGINE_LOGGER
from ssd_chat.tui.screens.loading import ForwardToApp


@dataclass
class LogNotice(Message):
    """A warning or an error logged in the app's process: one line for a notification."""

    line: str
    error: bool


class ToNotifications(logging.Handler):
    def __init__(self, app: App) -> None:
        super().__init__(logging.WARNING)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().strip().split("\n", 1)[0]  # (no traceback on the screen)
        self.app.post_message(LogNotice(line, record.levelno >= logging.ERROR))


def _on_the_terminal(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # (a closed stream)
        return False


class LogRouting:
    """Installed while the app runs (on_mount), taken off as it ends (on_unmount): the loggers as they were."""

    def __init__(self, app: App) -> None:
        self.engine_handler = ForwardToApp(app)
        self.notices = ToNotifications(app)
        self._saved: tuple[int, bool, list[logging.Handler]] | None = None

    def install(self) -> None:
        engine_log, root = logging.getLogger(ENGINE_LOGGER), logging.getLogger()
        self._saved = (engine_log.level, engine_log.propagate, root.handlers[:])
        engine_log.addHandler(self.engine_handler)
        engine_log.setLevel(logging.INFO)
        engine_log.propagate = False
        root.handlers = [h for h in root.handlers if not _on_the_terminal(h)] + [self.notices]

    def remove(self) -> None:
        if self._saved is None:
            return
        engine_log = logging.getLogger(ENGINE_LOGGER)
        engine_log.removeHandler(self.engine_handler)
        engine_log.setLevel(self._saved[0])
        engine_log.propagate = self._saved[1]
        logging.getLogger().handlers = self._saved[2]
        self._saved = None
