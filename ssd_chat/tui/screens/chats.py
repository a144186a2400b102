"""The saved conversations: Enter opens one, / searches their titles and messages, r renames, d twice deletes (u
brings it back), Esc goes back."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from ssd_chat.history import Deleted, HistoryStore, one_line
from ssd_chat.history_search import ConversationSummary, Searcher
from ssd_chat.tui.screens import selected_key
from ssd_chat.tui.screens.text_prompt import TextPrompt


def when(timestamp: float, now: float | None = None) -> str:
    """A chat's last change, short: the time today, the day and time this year, else the date."""
    then, today = time.localtime(timestamp), time.localtime(now)
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    return time.strftime("%b %d %H:%M" if then.tm_year == today.tm_year else "%Y-%m-%d", then)


@dataclass(frozen=True)
class OpenChat:
    """The conversation to open, and the search its row showed a message of ("" where none: the title matched, or
    no search): the app scrolls to that message."""

    id: int
    found: str = ""


class ChatsScreen(ModalScreen[OpenChat | None]):
    """Dismisses with the conversation to open (None: stay)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("slash", "search", "Search"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("u", "undelete", "Undo delete"),
    ]

    def __init__(self, store: HistoryStore, current_id: int | None, search: str = "") -> None:
        super().__init__(classes="modal", id="chats")
        self.store, self.current_id, self.first_search = store, current_id, search
        self.armed: int | None = None  # the conversation a first `d` asked about: a second `d` deletes it
        self.deleted: Deleted | None = None  # the last chat deleted here: `u` brings it back
        self.searcher = Searcher(store.path)  # typing searches off the UI thread (0.1 s and more on a long history)
        self.generation = 0  # of the list's contents: each search and each change of the list takes the next
        self.shown: str | None = None  # the search the list shows
        self.matched: set[int] = set()  # the chats whose row shows a message that holds it

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal-box wide"):
            yield Static("[b]Chats[/b]  Enter open · / search · r rename · d d delete · u undo delete · Esc back")
            yield Input(self.first_search, placeholder="/ search titles and messages", id="chats-search")
            yield DataTable(id="chats-table", cursor_type="row", zebra_stripes=True)
            yield Static(id="chats-none")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("updated", "messages", "title")  # the title last: a narrow screen cuts it, not the others
        self.refresh_rows()
        table.focus()

    def refresh_rows(self) -> None:
        """The rows for the search in the field, now (on opening, and after a rename or a delete)."""
        search = self.query_one(Input).value.strip()
        self.generation += 1  # a search answered after this (begun before a delete, say) is out of date
        self._show(search, self.store.search(search))

    def _show(self, search: str, found: list[ConversationSummary]) -> None:
        self.shown = search
        self.matched = {summary.id for summary in found if summary.match}  # (rows that show a message's excerpt)
        table = self.query_one(DataTable)
        keep = min(table.cursor_row, max(0, len(found) - 1))
        table.clear()
        for summary in found:
            title = Text(("● " if summary.id == self.current_id else "") + summary.title)
            if summary.match:
                title.append("  " + summary.match, style="dim")
            table.add_row(when(summary.updated), str(summary.num_messages), title, key=str(summary.id))
        table.move_cursor(row=keep)
        missing = bool(search) and not found
        none = self.query_one("#chats-none", Static)
        none.update(Text(f"no chat holds “{search}”" if missing else ""))  # (as typed: "[/]" as markup crashed)
        none.display = missing

    @dataclass
    class Found(Message):
        """A search's answer, from its thread."""

        search: str
        found: list[ConversationSummary]
        generation: int

    @work(thread=True, exclusive=True, group="search")
    def _search(self, search: str, generation: int) -> None:
        found = self.searcher.search(search)  # (None: a newer keystroke's search stopped it)
        if found is not None:
            self.post_message(self.Found(search, found, generation))  # (thread-safe, and never waits on a closing app)

    @on(Found)
    def _found(self, event: Found) -> None:
        if event.generation == self.generation:  # else the list changed since, or a newer answer is coming
            self._show(event.search, event.found)

    def on_unmount(self) -> None:
        self.searcher.interrupt()

    # -- search: `/` focuses the field, typing filters, Enter or Down goes to the list, Esc clears it ----------------
    def action_search(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Changed, "#chats-search")
    def _filter(self, event: Input.Changed) -> None:
        self.armed = None
        self.generation += 1  # (an answer in flight is out of date either way)
        search = event.value.strip()
        if search == self.shown:  # the list shows it already (the field's first value, on opening; a space typed)
            self.searcher.interrupt()
            return
        self._search(search, self.generation)

    @on(Input.Submitted, "#chats-search")
    def _to_list(self) -> None:
        self.query_one(DataTable).focus()

    def on_key(self, event) -> None:
        if event.key == "down" and self.focused is self.query_one(Input):
            event.stop()
            self.query_one(DataTable).focus()
        elif event.key not in ("d", "u"):
            self.armed = None  # a delete is two `d`s in a row

    def action_back(self) -> None:
        field = self.query_one(Input)
        if self.focused is field and field.value:
            field.value = ""  # (Input.Changed lists every chat again)
        else:  # (from an empty field too: a further Esc that only moved the focus looked like nothing, and what
            self.dismiss(None)  # was typed next, meant for the chat, went into the list)

    @on(DataTable.RowSelected)
    def _open(self, event: DataTable.RowSelected) -> None:
        chat = int(event.row_key.value)
        self.dismiss(OpenChat(chat, (self.shown or "") if chat in self.matched else ""))

    def action_rename(self) -> None:
        selected = selected_key(self.query_one(DataTable))
        if selected is None:
            return
        conversation = self.store.load(selected)

        def done(title: str | None) -> None:
            title = one_line(title or "")  # as /rename makes it; all spaces: no title, no change
            if title:
                with self._history_write():
                    self.store.rename(selected, title)
                self.refresh_rows()

        self.app.push_screen(TextPrompt("New title:", conversation.title if conversation else ""), done)

    def action_delete(self) -> None:
        selected = selected_key(self.query_one(DataTable))
        if selected is None:
            return
        if self.armed != selected:  # one keystroke must not lose a conversation
            self.armed = selected
            found = self.store.load(selected)
            self.app.notify(f"press d again to delete “{found.title if found else selected}”", timeout=4)
            return
        self.armed = None
        with self._history_write():
            self.deleted = self.store.delete(selected)
            self.app.notify("conversation deleted: u brings it back", timeout=6)
        self.refresh_rows()

    def action_undelete(self) -> None:
        if self.deleted is None:
            return
        with self._history_write():
            title = self.deleted.conversation.title
            if self.store.restore(self.deleted):
                self.app.notify(f"“{title}” is back", timeout=3)
            else:  # (restore's SQLite error said "UNIQUE constraint failed", and u kept failing)
                self.app.notify(f"“{title}” is back already: another window that had it open saved it since, as it "
                                "has it", timeout=6)
            self.deleted = None
        self.refresh_rows()

    @contextmanager
    def _history_write(self) -> Iterator[None]:
        """A change of the history file; where it takes no write (read-only, full, locked), a notification (the
        app died with a traceback)."""
        try:
            yield
        except sqlite3.Error as err:
            self.app.notify(f"the chat history could not be changed ({err})", title="not saved", severity="error",
                        timeout=8)
