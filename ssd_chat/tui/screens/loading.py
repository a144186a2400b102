"""Shown while the models load (seconds to minutes): the engine's log lines, a step count and the
elapsed time, so the terminal never looks frozen."""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Center, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Log, ProgressBar, Static

from ssd_chat.tui.typed_behind import TypedLine, type_into
from ssd_chat.tui.widgets.prompt_input import PromptArea


class EngineLogLine(Message):
    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class LoadingScreen(Screen):
    """One progress step per model ("loading ..." log line), then ready."""

    def __init__(self, target: str, draft: str | None) -> None:
        super().__init__(id="loading")
        self.target, self.draft = target, draft
        self.started = time.monotonic()

    def compose(self) -> ComposeResult:
        with Center(), Vertical(id="loading-box"):
            pair = self.target if self.draft is None else f"{self.target} + draft {self.draft}"
            yield Static(Text.assemble(("ssd-chat", "bold"), f"  loading {pair}"), id="loading-title")  # (no markup)
            yield ProgressBar(total=2 if self.draft is None else 3, show_eta=False, id="loading-progress")
            yield Static("", id="loading-elapsed")
            yield TypedLine("in the prompt once loaded", id="loading-typed")
            yield Log(id="loading-log", max_lines=200)

    def on_mount(self) -> None:
        self.set_interval(0.25, self._tick)
        self.add_line("starting the engine")
        self._show_typed(self._prompt())  # (--resume's draft, there before the load: typing adds to it)

    def on_screen_resume(self) -> None:
        """Back on top after a dialog opened during the load (help, palette): leave if the engine is ready."""
        if getattr(self.app, "engine", None) is not None:
            self.dismiss()

    def on_key(self, event: events.Key) -> None:
        """Typing while the models load goes into the prompt, there once they are (it was lost)."""
        area = self._prompt()
        if event.key in ("escape", "ctrl+z"):  # Esc clears the input, as in the chat, and Ctrl+Z, as its notice says,
            event.stop()                       # brings it back: the line here shows either (it kept the text)
            if event.key == "escape":
                self.app.action_escape()
            else:
                area.action_undo()
            self._show_typed(area)
        # (the prompt that waits to come back is not edited blind)
        elif type_into(area, event, make_room=lambda: self._make_room(area), can_delete=not self._waiting(area)):
            event.stop()
            self._show_typed(area)

    def on_paste(self, event: events.Paste) -> None:
        area = self._prompt()
        self._make_room(area)
        area.insert(event.text)
        event.stop()
        self._show_typed(area)

    def _show_typed(self, area: PromptArea) -> None:
        """What waits in the prompt (its last line, the end of it where long), so that typing blind is not blind: what
        was typed, and what it adds to (--resume's draft); not the prompt that waits to come back, which what is
        typed replaces (_make_room)."""
        self.query_one(TypedLine).show("" if self._waiting(area) else area.text)

    def _waiting(self, area: PromptArea) -> bool:
        """Whether the input holds the prompt that waits to come back (/restart from the palette leaves it there)."""
        restore = getattr(self.app, "prompt_to_restore", None)
        return bool(restore) and area.text == restore

    def _make_room(self, area: PromptArea) -> None:
        """That prompt makes way, undoably, for what is typed now: it comes back once loaded, with the typing one
        Ctrl+Z away (it was glued on)."""
        if self._waiting(area):
            area.put("", undoable=True)

    def _prompt(self) -> PromptArea:
        """The chat screen's prompt (a prompt /restart or --resume brings back goes there once loaded, and what was
        typed meanwhile stays one Ctrl+Z away: PromptInput.bring_back)."""
        return self.app.screen_stack[0].query_one(PromptArea)

    def _tick(self) -> None:
        self.query_one("#loading-elapsed", Static).update(f"{time.monotonic() - self.started:.1f} s")

    def add_line(self, line: str) -> None:
        self.query_one(Log).write_line(line)
        if line.startswith("loading"):
            self.query_one(ProgressBar).advance(1)
