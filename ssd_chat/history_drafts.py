"""Drafts: what the chat app's input held, unsent, at a quit, kept with its chat in the history file (the drafts
table). The text, and where the quit came in an edit of the last prompt (F4) that had changed it, the edit too: the
input then holds the edit, and what was typed before F4 waits for it to end (ssd_chat/tui/edit_actions.py), so one
text alone lost one or the other. Plain functions on the store's connection; HistoryStore's methods call them."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS drafts (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
    text TEXT NOT NULL,
    edit TEXT,
    edit_at INTEGER
);
"""


@dataclass(frozen=True)
class EditDraft:
    """A changed edit (F4) under way at a quit: the edit's text, and the position of the prompt it edits (the
    chat's last one then: it resumes only where that one still is)."""

    text: str
    at: int


@dataclass(frozen=True)
class Draft:
    text: str = ""                  # the input's unsent text, or in an edit, what it held before F4
    edit: EditDraft | None = None   # the edit, where the quit came in one that had changed the prompt

    @property
    def is_empty(self) -> bool:
        return not self.text and self.edit is None


def migrate(db: sqlite3.Connection) -> None:
    """A history file made before drafts kept an edit: the columns added (NULL in each row: no edit). Another window
    that opened the file at the same moment may add them first: its column is as good (the window's history was
    off, "duplicate column name")."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(drafts)")}
    with db:
        for name, kind in (("edit", "TEXT"), ("edit_at", "INTEGER")):
            if name in columns:
                continue
            try:
                db.execute(f"ALTER TABLE drafts ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as err:
                if "duplicate column" not in str(err):
                    raise


def read(db: sqlite3.Connection, conversation_id: int) -> Draft:
    row = db.execute("SELECT text, edit, edit_at FROM drafts WHERE conversation_id = ?",
                     (conversation_id,)).fetchone()
    if row is None:
        return Draft()
    text, edit, edit_at = row
    return Draft(text, None if edit is None else EditDraft(edit, int(edit_at or 0)))


def write(db: sqlite3.Connection, conversation_id: int, draft: Draft) -> None:
    """`draft` in place of the chat's (inside the caller's transaction)."""
    edit = draft.edit
    db.execute("INSERT OR REPLACE INTO drafts (conversation_id, text, edit, edit_at) VALUES (?, ?, ?, ?)",
               (conversation_id, draft.text, None if edit is None else edit.text, None if edit is None else edit.at))
