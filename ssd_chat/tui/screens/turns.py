"""This chat's turns, one row each (its prompt and the start of its reply): Enter shows one in the conversation, d
twice deletes it (its prompt and its reply), Esc goes back. /undo and F4 reach the last turn only; this reaches any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ssd_chat.history import ChatMessage, one_line
from ssd_chat.tui.screens import selected_key

PREVIEW = 60  # characters of a prompt's and a reply's first line in the list


@dataclass(frozen=True)
class TurnChoice:
    """What to do with the turn that starts at message `index`: "show" it, or "delete" it."""

    action: str
    index: int


def turn_rows(messages: list[ChatMessage]) -> list[tuple[int, str, str]]:
    """(the index of the turn's prompt, the prompt's start, the reply's start) for each turn."""
    rows = []
    for i, message in enumerate(messages):
        if message.role == "user":
            reply = messages[i + 1].content if i + 1 < len(messages) and messages[i + 1].role == "assistant" else ""
            rows.append((i, _preview(message.content), _preview(reply)))
    return rows


def _preview(text: str) -> str:
    line = one_line(text)
    return line if len(line) <= PREVIEW else line[: PREVIEW - 1] + "…"


class TurnsScreen(ModalScreen[TurnChoice | None]):
    """Dismisses with what to do with a turn (None: nothing)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Back"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, messages: list[ChatMessage]) -> None:
        super().__init__(classes="modal", id="turns")
        self.rows = turn_rows(messages)
        self.armed: int | None = None  # the turn a first `d` asked about: a second `d` deletes it

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box wide"):
            yield Static(Text.assemble(("Turns", "bold"), "  Enter show · d d delete (prompt and reply) · Esc back"))
            yield DataTable(id="turns-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("#", "you", "assistant")
        for number, (index, prompt, reply) in enumerate(self.rows, start=1):
            table.add_row(str(number), Text(prompt), Text(reply, style="dim"), key=str(index))  # (as typed: no markup)
        table.move_cursor(row=len(self.rows) - 1)  # (the latest, as /undo's)
        table.focus()

    @on(DataTable.RowSelected)
    def _show(self, event: DataTable.RowSelected) -> None:
        self.dismiss(TurnChoice("show", int(event.row_key.value)))

    def action_delete(self) -> None:
        selected = selected_key(self.query_one(DataTable))
        if selected is None:
            return
        if self.armed != selected:  # one keystroke must not lose a turn
            self.armed = selected
            number = next(n for n, (index, _, _) in enumerate(self.rows, start=1) if index == selected)
            self.app.notify(f"press d again to delete turn {number} (its prompt and its reply)", timeout=4)
            return
        self.dismiss(TurnChoice("delete", selected))

    def on_key(self, event) -> None:
        if event.key != "d":
            self.armed = None  # a delete is two `d`s in a row
