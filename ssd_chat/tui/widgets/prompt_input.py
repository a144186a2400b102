"""The multi-line prompt: Enter sends, Shift+Enter or Ctrl+J inserts a newline, Tab completes a
slash command, PageUp / PageDown scroll the conversation. Below it, a hint line lists the commands matching
what is typed."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static, TextArea

from ssd_chat.tui.commands import complete, completions

NEWLINE_KEYS = ("shift+enter", "ctrl+j")
PAGE_KEYS = {"pageup": -1, "pagedown": 1}  # scroll the conversation (the prompt is a few lines at most)


class PromptArea(TextArea):
    """A TextArea whose Enter submits instead of breaking the line."""

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class PageConversation(Message):
        direction: int  # -1 up, 1 down

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key in PAGE_KEYS:
            event.stop()
            event.prevent_default()
            self.post_message(self.PageConversation(PAGE_KEYS[event.key]))
            return
        if event.key == "tab":
            event.stop()
            event.prevent_default()
            completed = complete(self.text)
            if completed is not None:
                self.text = completed
                self.move_cursor(self.document.end)
            return
        await super()._on_key(event)


class PromptInput(Vertical):
    """The prompt and its slash-command hints."""

    def compose(self) -> ComposeResult:
        yield Static("", id="completions")
        yield PromptArea(id="prompt", soft_wrap=True, show_line_numbers=False, compact=True,
                         placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: newline, /help: commands)")

    @property
    def area(self) -> PromptArea:
        return self.query_one(PromptArea)

    @property
    def text(self) -> str:
        return self.area.text

    def set_text(self, text: str) -> None:
        self.area.text = text
        self.area.move_cursor(self.area.document.end)
        self.area.focus()

    def replace_text(self, text: str) -> None:
        """set_text, as an edit Ctrl+Z takes back (set_text clears the undo history)."""
        self.area.replace(text, (0, 0), self.area.document.end, maintain_selection_offset=False)
        self.area.move_cursor(self.area.document.end)
        self.area.focus()

    @on(TextArea.Changed, "#prompt")
    def _show_completions(self) -> None:
        hints = self.query_one("#completions", Static)
        matches = completions(self.area.text)
        hints.update("   ".join(f"[b]{m.usage}[/b] {m.help}" for m in matches[:4]) if matches else "")
        hints.display = bool(matches)
