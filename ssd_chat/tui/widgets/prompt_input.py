"""The multi-line prompt: Enter sends, Shift+Enter or Ctrl+J inserts a newline (or, with `--enter newline`, Enter
inserts a newline and Ctrl+S sends; Ctrl+S sends in both), Tab completes a slash command, Up / Down on the first /
last line recall the chat's earlier prompts, PageUp / PageDown scroll the conversation. Below it, a hint line
lists the commands matching what is typed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static, TextArea

from ssd_chat.tui.commands import complete, completions

NEWLINE_KEYS = ("shift+enter", "ctrl+j")
PAGE_KEYS = {"pageup": -1, "pagedown": 1}  # scroll the conversation (the prompt is a few lines at most)
RECALL_KEYS = {"up": -1, "down": 1}  # on the prompt's first / last line: the chat's earlier prompts
SEND_KEYS = ("ctrl+s", "ctrl+enter")  # send whatever Enter does (Ctrl+Enter where the terminal tells it from Enter)


def send_key(enter_sends: bool) -> str:
    """The key that sends the prompt (Ctrl+S sends in both modes)."""
    return "Enter" if enter_sends else "Ctrl+S"


def key_hints(enter_sends: bool) -> tuple[tuple[str, str], ...]:
    """The prompt's send and newline keys, for the help screen."""
    if enter_sends:
        return ("Enter, Ctrl+S", "send the prompt"), ("Shift+Enter / Ctrl+J", "new line in the prompt")
    return ("Ctrl+S (Ctrl+Enter)", "send the prompt"), ("Enter / Ctrl+J", "new line in the prompt (--enter newline)")


def placeholder(enter_sends: bool, width: int | None = None) -> str:
    """The empty prompt's hint: the longest of its forms that fits on one row of `width` cells (None: the whole)."""
    send = f"{send_key(enter_sends)} sends"
    newline = ("Shift+Enter or Ctrl+J", "Ctrl+J") if enter_sends else ("Enter", "Enter")
    forms = (f"Message ({send}, {newline[0]}: newline, /help: commands)",
             f"Message ({send}, {newline[1]}: newline, /help: commands)",
             f"Message ({send}, /help: commands)", f"Message ({send})", "Message")
    return next((form for form in forms if width is None or len(form) < width), forms[-1])  # (a cell for the cursor)


class PromptArea(TextArea):
    """A TextArea whose Enter submits instead of breaking the line (unless `enter_sends` is off: then Ctrl+S), and
    whose Up and Down on its first and last line go through the chat's earlier prompts (`earlier`, oldest first)."""

    enter_sends = True
    earlier: Callable[[], list[str]] = staticmethod(lambda: [])
    _recalled: tuple[int, str] | None = None  # the earlier prompt shown: its index and text

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class PageConversation(Message):
        direction: int  # -1 up, 1 down

    def on_resize(self) -> None:
        self.fit_placeholder()

    def fit_placeholder(self) -> None:
        self.placeholder = placeholder(self.enter_sends, self.content_size.width or None)

    async def _on_key(self, event: events.Key) -> None:
        if event.key in SEND_KEYS or (event.key == "enter" and self.enter_sends):
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))  # (a send the app takes clears the input, and the recall)
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
        if event.key in RECALL_KEYS and self._recall(RECALL_KEYS[event.key]):
            event.stop()
            event.prevent_default()
            return
        if event.key == "tab":
            event.stop()
            event.prevent_default()
            completed = complete(self.text)
            if completed is not None:
                self.put(completed, undoable=False)
            return
        await super()._on_key(event)

    def _recall(self, step: int) -> bool:
        """Up (-1) or Down (+1) through the earlier prompts, from an empty prompt or one recalled and not changed
        since (typed text is never replaced), on the first line going up, the last going down: the first or last
        line on the screen (a long line wraps, and Up on its second row moves the cursor). Whether it did."""
        at_edge = self.navigator.is_first_wrapped_line if step < 0 else self.navigator.is_last_wrapped_line
        if not at_edge(self.cursor_location):
            return False
        prompts = self.earlier()
        at = self._recalled  # (still the prompt at its place: the list changes with a send, a new or opened chat)
        if at is not None and self.text == at[1] and at[0] < len(prompts) and prompts[at[0]] == at[1]:
            index = at[0] + step
        elif self.text == "" and step < 0 and prompts:
            index = len(prompts) - 1
        else:
            return False
        if index < 0:  # the oldest: it stays
            return True
        text = prompts[index] if index < len(prompts) else ""  # past the newest: empty again
        self.put(text, undoable=True)
        self._recalled = (index, text) if text else None
        return True

    def put(self, text: str, *, undoable: bool) -> None:
        """All of the prompt's text replaced by `text` (Ctrl+Z takes it back where `undoable`), the cursor at its
        end; a recall under way ends (Up and Down start again from an empty prompt)."""
        self._recalled = None
        if undoable:
            self.replace(text, (0, 0), self.document.end, maintain_selection_offset=False)
        else:
            self.text = text
        self.move_cursor(self.document.end)


class PromptInput(Vertical):
    """The prompt and its slash-command hints."""

    def __init__(self, *, enter_sends: bool = True, earlier: Callable[[], list[str]] | None = None,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self._first_enter_sends = enter_sends  # (the area's, once composed)
        self.earlier = earlier or (lambda: [])

    def compose(self) -> ComposeResult:
        yield Static("", id="completions")
        area = PromptArea(id="prompt", soft_wrap=True, show_line_numbers=False, compact=True,
                          placeholder=placeholder(self._first_enter_sends))
        area.enter_sends, area.earlier = self._first_enter_sends, self.earlier
        yield area

    @property
    def enter_sends(self) -> bool:
        return self.area.enter_sends

    def set_enter_sends(self, enter_sends: bool) -> None:
        self.area.enter_sends = enter_sends
        self.area.fit_placeholder()

    @property
    def area(self) -> PromptArea:
        return self.query_one(PromptArea)

    @property
    def text(self) -> str:
        return self.area.text

    def set_text(self, text: str) -> None:
        self.area.put(text, undoable=False)
        self.area.focus()

    def take(self, sent: str) -> str:
        """Clear a line the app took (`sent`, as the send key found it), keeping what was typed after it: keys that
        came in the same burst as the send key reach the input before the app takes the line. Returns that."""
        now = self.text
        rest = now[len(sent):] if now.startswith(sent) else ""
        self.set_text(rest)
        return rest

    def bring_back(self, text: str) -> bool:
        """Put `text` (a prompt that got no answer) in the input. What was typed there meanwhile stays one Ctrl+Z
        away (replace_text): whether there was any (the caller says so)."""
        if self.text == text:  # there already (and its undo history with it)
            return False
        typed = bool(self.text.strip())
        if typed:
            self.replace_text(text)
        else:
            self.set_text(text)
        return typed

    def replace_text(self, text: str) -> None:
        """set_text, as an edit Ctrl+Z takes back (set_text clears the undo history)."""
        self.area.put(text, undoable=True)
        self.area.focus()

    @on(TextArea.Changed, "#prompt")
    def _show_completions(self) -> None:
        hints = self.query_one("#completions", Static)
        matches = completions(self.area.text)
        # (as Text, not markup: "/chats [TEXT]" lost its "[TEXT]")
        hints.update(Text("   ").join(Text.assemble((m.usage, "bold"), " ", m.help) for m in matches[:4]))
        hints.display = bool(matches)
