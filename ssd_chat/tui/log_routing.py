"""Log records while the chat app has the terminal, where a stderr handler would write over its screen: the
engine's lines (INFO and up) go to the loading screen, or once loaded to notifications (ChatApp.on_engine_log_line);
any other logger's warnings and errors to notifications too (a preferences file that cannot be written, say)."""

from __future__ import annotations

import logging

from textual.app import App

from ssd_chat.tui.engine_server import ENGINE_LOGGER
from ssd_chat.tui.screens.loading import ForwardToApp


class LogRouting:
    """Installed while the app runs (on_mount), taken off when it ends (on_unmount): the loggers as they were."""

    def __init__(self, app: App) -> None:
        self.engine_handler = ForwardToApp(app)
        self.root_handler = ForwardToApp(app, level=logging.WARNING)
        self._saved: tuple[int, bool, list[logging.Handler]] | None = None

    def install(self) -> None:
        engine_log, root = logging.getLogger(ENGINE_LOGGER), logging.getLogger()
        self._saved = (engine_log.level, engine_log.propagate, root.handlers[:])
        engine_log.addHandler(self.engine_handler)
        engine_log.setLevel(logging.INFO)
        engine_log.propagate = False
        root.handlers = [self.root_handler]

    def remove(self) -> None:
        if self._saved is None:
            return
        engine_log = logging.getLogger(ENGINE_LOGGER)
        engine_log.removeHandler(self.engine_handler)
        engine_log.setLevel(self._saved[0])
        engine_log.propagate = self._saved[1]
        logging.getLogger().handlers = self._saved[2]
        self._saved = None
