"""Screens pushed over the chat: loading, help, chats (history), turns, compare, a one-line text prompt."""

from __future__ import annotations

from textual.widgets import DataTable


def selected_key(table: DataTable) -> int | None:
    """The integer key of the row under `table`'s cursor (the chats' and the turns' lists); None: no rows."""
    if not table.row_count:
        return None
    return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
