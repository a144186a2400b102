"""Typing while a screen covers the chat's prompt (the loading screen, a compare): the keys go into the prompt, where
they wait for the screen to close, and a line on the screen shows the end of what waits there, so that typing blind
is not blind. Enter that sends inserts nothing (there is nothing to send to yet): the text waits to be sent."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.widget import Widget
from textual.widgets import Static

from ssd_chat.tui.widgets.prompt_input import NEWLINE_KEYS, PromptArea

MIN_SHOWN = 6  # characters of what was typed shown however narrow the box (the line wraps there)


def type_into(area: PromptArea, event: events.Key, *, make_room: Callable[[], None] = lambda: None,
              can_delete: bool = True) -> bool:
    """`event` into `area` where it is typing: a character, a new line (Enter too, where it breaks lines), Backspace
    (only where `can_delete`). `make_room` runs before an insert. Whether it was typing (the caller stops it)."""
    if event.is_printable and event.character:
        text = event.character
    elif event.key in NEWLINE_KEYS or (event.key == "enter" and not area.enter_sends):
        text = "\n"
    elif event.key == "backspace":
        if can_delete:
            area.action_delete_left()
        return True
    else:
        return False
    make_room()
    area.insert(text)
    return True


def typed_line(text: str, width: int, until: str) -> str:
    """What waits in the prompt, on one line of `width` columns (the box's that shows it): its last line (the end of
    it, where the words around it leave too little room, and never fewer than MIN_SHOWN characters) and how many
    lines it has; "" when nothing does. `until`: when it is there to see ("in the prompt once loaded")."""
    if not text:
        return ""
    lines = text.split("\n")
    more = f" ({len(lines)} lines)" if len(lines) > 1 else ""
    head, tail = f"typed{more}: ", f"▏ ({until})"
    room = max(width - len(head) - len(tail), MIN_SHOWN)
    last = lines[-1] if len(lines[-1]) <= room else "…" + lines[-1][-(room - 1):]
    return f"{head}{last}{tail}"


class TypedLine(Static):
    """The screen's line of what waits in the prompt (typed_line's), hidden while nothing does. It keeps the text and
    draws it again whenever its box's width changes: drawn once, as the keys came, a terminal made narrower wrapped it
    over two lines, and one made wider left it short."""

    def __init__(self, until: str, *, id: str) -> None:
        super().__init__("", id=id, markup=False)
        self.until = until
        self.typed = ""

    def show(self, text: str) -> None:
        self.typed = text
        self._draw()

    def on_resize(self) -> None:
        """The box resized (the terminal did): the line fits its new width."""
        self._draw()

    def _draw(self) -> None:
        box = self.parent
        width = box.content_size.width if isinstance(box, Widget) else self.size.width
        self.update(typed_line(self.typed, width, self.until))
        self.display = bool(self.typed)
