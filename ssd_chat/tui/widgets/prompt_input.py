"""The multi-line prompt: Enter sends, Shift+Enter or Ctrl+J inserts a newline (or, with `--enter newline`, Enter
inserts a newline and Ctrl+S sends; Ctrl+S sends in both), Tab completes a slash command, PageUp / PageDown scroll
the conversation. Below it, a hint line lists the commands matching what is typed."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static, TextArea

from ssd_chat.tui.commands import complete, completions

NEWLINE_KEYS = ("shift+enter", "ctrl+j")
SEND_KEYS = ("ctrl+s", "ctrl+enter")  # send whatever Enter does (Ctrl+Enter where the terminal tells it from Enter)


def key_hints(enter_sends: bool) -> tuple[tuple[str, str], ...]:
    """The prompt's send and newline keys, for the help screen."""
    if enter_sends:
        return ("Enter, Ctrl+S", "send the prompt"), ("Shift+Enter / Ctrl+J", "new line in the prompt")
    return ("Ctrl+S (Ctrl+Enter)", "send the prompt"), ("Enter / Ctrl+J", "new line in the prompt (--enter newline)")


def placeholder(enter_sends: bool) -> str:
    keys = "Enter sends, Shift+Enter or Ctrl+J: newline" if enter_sends else "Ctrl+S sends, Enter: newline"
    return f"Message ({keys}, /help: commands)"
PAGE_KEYS = {"pageup": -1, "pagedown": 1}  # scroll the conversation (the prompt is a few lines at most)


class PromptArea(TextArea):
    """A TextArea whose Enter submits instead of breaking the line (unless `enter_sends` is off: then Ctrl+S)."""

    enter_sends = True

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class PageConversation(Message):
        direction: int  # -1 up, 1 down

    async def _on_key(self, event: events.Key) -> None:
        if event.key in SEND_KEYS or (event.key == "enter" and self.enter_sends):
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS or event.key == "enter":
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

    def __init__(self, *, enter_sends: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.enter_sends = enter_sends

    def compose(self) -> ComposeResult:
        yield Static("", id="completions")
        area = PromptArea(id="prompt", soft_wrap=True, show_line_numbers=False, compact=True,
                          placeholder=placeholder(self.enter_sends))
        area.enter_sends = self.enter_sends
        yield area

    def set_enter_sends(self, enter_sends: bool) -> None:
        self.enter_sends = self.area.enter_sends = enter_sends
        self.area.placeholder = placeholder(enter_sends)

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
