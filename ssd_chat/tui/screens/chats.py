"""The saved conversations: Enter opens one, r renames, d twice deletes, Esc goes back."""

from __future__ import annotations

import time
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ssd_chat.history import HistoryStore
from ssd_chat.tui.screens.text_prompt import TextPrompt


def when(timestamp: float, now: float | None = None) -> str:
    """A chat's last change, short: the time today, the day and time this year, else the date."""
    then, today = time.localtime(timestamp), time.localtime(now)
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    return time.strftime("%b %d %H:%M" if then.tm_year == today.tm_year else "%Y-%m-%d", then)


class ChatsScreen(ModalScreen[int | None]):
    """Dismisses with the id of the conversation to open (None: stay)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss(None)", "Back"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, store: HistoryStore, current_id: int | None) -> None:
        super().__init__(classes="modal", id="chats")
        self.store, self.current_id = store, current_id
        self.armed: int | None = None  # the conversation a first `d` asked about: a second `d` deletes it

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box wide"):
            yield Static("[b]Chats[/b]  Enter open · r rename · d d delete · Esc back")
            yield DataTable(id="chats-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("updated", "messages", "title")  # the title last: a narrow screen cuts it, not the others
        self.refresh_rows()
        table.focus()

    def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        keep = min(table.cursor_row, max(0, len(self.store.list()) - 1))
        table.clear()
        for summary in self.store.list():
            mark = "● " if summary.id == self.current_id else ""
            table.add_row(when(summary.updated), str(summary.num_messages), mark + summary.title, key=str(summary.id))
        table.move_cursor(row=keep)

    def _selected(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    @on(DataTable.RowSelected)
    def _open(self, event: DataTable.RowSelected) -> None:
        self.dismiss(int(event.row_key.value))

    def action_rename(self) -> None:
        selected = self._selected()
        if selected is None:
            return
        conversation = self.store.load(selected)

        def done(title: str | None) -> None:
            if title:
                self.store.rename(selected, title)
                self.refresh_rows()

        self.app.push_screen(TextPrompt("New title:", conversation.title if conversation else ""), done)

    def action_delete(self) -> None:
        selected = self._selected()
        if selected is None:
            return
        if self.armed != selected:  # one keystroke must not lose a conversation
            self.armed = selected
            found = self.store.load(selected)
            self.notify(f"press d again to delete “{found.title if found else selected}”", timeout=4)
            return
        self.armed = None
        self.store.delete(selected)
        self.notify("conversation deleted")
        self.refresh_rows()
