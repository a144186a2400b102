"""Chat history: conversations, their settings and per-turn stats in one SQLite file.

The file lives in the user's data directory (platformdirs' ``user_data_dir("ssd-chat")``), or in
``$SSD_CHAT_DATA`` when that is set (tests point it at a temporary directory). Every write commits at
once, so a crash never loses more than the turn in flight.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from platformdirs import user_data_dir

from ssd_chat import history_drafts
from ssd_chat.history_drafts import Draft, EditDraft
from ssd_chat.history_search import ConversationSummary, connect, list_all, search
from ssd_chat.turn_stats import TurnStats

DATA_ENV = "SSD_CHAT_DATA"
DB_NAME = "history.sqlite3"
UNTITLED = "New chat"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    PRIMARY KEY (conversation_id, position)
);
"""


@dataclass(frozen=True)
class ChatSettings:
    """What a conversation decodes with; saved with it and restored on reopen."""

    mode: str = "ar"
    k: int = 4
    fanout: tuple[int, ...] | None = None
    temperature: float = 0.7
    top_p: float = 1.0  # (1 and 0: off, as chats saved before these two settings sampled)
    top_k: int = 0
    max_tokens: int = 512
    system: str | None = None
    seed: int | None = None  # sampled replies from this seed (the same reply in every mode, and at a regen); None: new

    @classmethod
    def from_dict(cls, data: dict) -> ChatSettings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        fanout = values.get("fanout")
        if fanout is not None:  # (a list as saved; one number from a hand-edited file: settings_fit checks it)
            values["fanout"] = (fanout,) if isinstance(fanout, int | float | str) else tuple(fanout)
        return cls(**values)


@dataclass(frozen=True)
class ChatMessage:
    role: str                       # system | user | assistant
    content: str
    stats: TurnStats | None = None  # assistant replies only


@dataclass
class Conversation:
    id: int | None
    title: str = UNTITLED
    settings: ChatSettings = field(default_factory=ChatSettings)
    messages: list[ChatMessage] = field(default_factory=list)


class ChatChanged(Exception):
    """HistoryStore.save: the stored chat's turns are no longer those the save's changes were made to (another window
    or process saved it since), so writing them would lose that window's turns."""


@dataclass(frozen=True)
class Deleted:
    """A deleted conversation, as HistoryStore.restore puts it back."""

    conversation: Conversation
    created: float
    updated: float
    draft: Draft = field(default_factory=Draft)  # what its last quit kept unsent (save_draft)


def default_db_path() -> Path:
    root = os.environ.get(DATA_ENV) or user_data_dir("ssd-chat", appauthor=False)
    return Path(root) / DB_NAME


class HistoryStore:
    """Conversations in SQLite. One store per thread: the TUI uses it from the UI thread only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(self.path)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(_SCHEMA + history_drafts.SCHEMA)
        history_drafts.migrate(self._db)

    def close(self) -> None:
        self._db.close()

    def save(self, conversation: Conversation, base: Conversation | None = None) -> int:
        """Insert or update `conversation`; returns (and sets) its id. `base`: the conversation as this caller last
        loaded or saved it. Only what differs from it is written (the turns from the first that changed), and
        nothing at all when nothing does (`updated` kept: the chats list keeps its order); turns another window or
        process added or changed since are kept where this save changes no turn. Where it does, ChatChanged is
        raised and nothing is written: this save's turns were made on turns the history no longer holds. Without
        a base the whole conversation is written, over what is stored."""
        now = time.time()
        with self._db:
            if conversation.id is None:
                cur = self._db.execute(
                    "INSERT INTO conversations (title, created, updated, settings) VALUES (?, ?, ?, ?)",
                    (conversation.title, now, now, json.dumps(asdict(conversation.settings))),
                )
                conversation_id = int(cur.lastrowid)
                self._write_messages(conversation_id, conversation.messages)
            else:
                conversation_id = conversation.id
                self._db.execute("BEGIN IMMEDIATE")  # read and write as one: another process's save waits
                self._update(conversation, base, now)
        conversation.id = conversation_id  # once committed: a write that failed leaves it unsaved (None)
        return conversation_id

    def _update(self, conversation: Conversation, base: Conversation | None, now: float) -> None:
        conversation_id = conversation.id
        settings = json.dumps(asdict(conversation.settings))
        if self._db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
            # deleted meanwhile (another window's picker): still open here, it comes back
            self._db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            self._db.execute(
                "INSERT INTO conversations (id, title, created, updated, settings) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, conversation.title, now, now, settings),
            )
            self._write_messages(conversation_id, conversation.messages)
            return
        turns = base is None or conversation.messages != base.messages
        stored = self._messages(conversation_id) if turns else []  # (read only where this save writes turns)
        if turns and base is not None and stored != base.messages:
            raise ChatChanged(f"chat {conversation_id} changed since it was loaded")
        changed = {"title": base is None or conversation.title != base.title,
                   "settings": base is None or conversation.settings != base.settings}
        if not (turns or any(changed.values())):
            return
        values = {"title": conversation.title, "settings": settings}
        columns = [name for name in values if changed[name]]
        self._db.execute(f"UPDATE conversations SET {''.join(f'{c} = ?, ' for c in columns)}updated = ? WHERE id = ?",
                         (*[values[c] for c in columns], now, conversation_id))
        if turns:  # from the first turn that differs from the stored ones
            same = next((i for i, (a, b) in enumerate(zip(stored, conversation.messages, strict=False)) if a != b),
                        min(len(stored), len(conversation.messages)))
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND position >= ?",
                             (conversation_id, same))
            self._write_messages(conversation_id, conversation.messages[same:], same)

    def _write_messages(self, conversation_id: int, messages: list[ChatMessage], start: int = 0) -> None:
        self._db.executemany(
            "INSERT INTO messages (conversation_id, position, role, content, stats) VALUES (?, ?, ?, ?, ?)",
            [(conversation_id, i, m.role, m.content, None if m.stats is None else json.dumps(asdict(m.stats)))
             for i, m in enumerate(messages, start)],
        )

    def _messages(self, conversation_id: int) -> list[ChatMessage]:
        rows = self._db.execute(
            "SELECT role, content, stats FROM messages WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        ).fetchall()
        return [ChatMessage(role, content, None if stats is None else TurnStats.from_dict(json.loads(stats)))
                for role, content, stats in rows]

    def load(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT title, settings FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            return None
        return Conversation(conversation_id, row[0], ChatSettings.from_dict(json.loads(row[1])),
                            self._messages(conversation_id))

    def save_draft(self, conversation_id: int, text: str, edit: EditDraft | None = None) -> None:
        """`text`, typed in the chat app and not sent, as the conversation's draft, with the `edit` of its last prompt
        under way, if any (history_drafts), which makes it the latest conversation (the one --resume opens: the user
        was in it last). Nothing to keep ("" and no edit) is refused: drop_draft removes a draft."""
        if not text and edit is None:
            raise ValueError("save_draft: an empty draft (drop_draft removes the chat's draft)")
        with self._db:
            history_drafts.write(self._db, conversation_id, Draft(text, edit))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def drop_draft(self, conversation_id: int) -> None:
        """Remove the conversation's draft, if any (its place in the list stays)."""
        with self._db:
            self._db.execute("DELETE FROM drafts WHERE conversation_id = ?", (conversation_id,))

    def drop_if_empty(self, conversation_id: int, new_chat: ChatSettings) -> bool:
        """Delete the conversation where it holds nothing of its own (saved for a draft alone, which went back into
        the input): no message, no draft, no title (UNTITLED) and `new_chat`'s settings, those a new chat starts with
        (max_tokens aside: the run's, not a chat's). A title or settings it was given (/rename, the picker's rename,
        /temp, a named chat /clear emptied) keep it: they went with it, at the next quit with the input empty.
        Returns whether it did. One transaction: turns, a draft, a title or settings another window saved keep it."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "SELECT title, settings FROM conversations WHERE id = ?"
                " AND NOT EXISTS (SELECT 1 FROM messages WHERE conversation_id = ?)"
                " AND NOT EXISTS (SELECT 1 FROM drafts WHERE conversation_id = ?)", (conversation_id,) * 3).fetchone()
            if row is None or row[0] != UNTITLED:
                return False
            settings = ChatSettings.from_dict(json.loads(row[1]))
            if replace(settings, max_tokens=new_chat.max_tokens) != new_chat:
                return False
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return True

    def draft(self, conversation_id: int) -> Draft:
        """The conversation's draft (Draft(): none)."""
        return history_drafts.read(self._db, conversation_id)

    def list(self) -> list[ConversationSummary]:
        """Every conversation, the most recently updated first."""
        return list_all(self._db)

    def search(self, text: str) -> list[ConversationSummary]:
        """The conversations where every word of `text` (its first MAX_SEARCH_WORDS) is in the title or a message (any
        case), the most recently updated first, each with the first message that holds the first word where the
        title does not. No words: every conversation."""
        return search(self._db, text)

    def latest(self) -> Conversation | None:
        summaries = self.list()
        return self.load(summaries[0].id) if summaries else None

    def restore(self, deleted: Deleted) -> bool:
        """Put a deleted conversation back as it was: its id (no other took it: ids are AUTOINCREMENT), its times.
        False, and nothing written, where it is back already: a save in another window that had it open (a reply, a
        quit's draft) brought it back since, with that window's turns and draft, the later ones."""
        c = deleted.conversation
        with self._db:
            cur = self._db.execute("INSERT OR IGNORE INTO conversations (id, title, created, updated, settings)"
                                   " VALUES (?, ?, ?, ?, ?)",
                                   (c.id, c.title, deleted.created, deleted.updated, json.dumps(asdict(c.settings))))
            if not cur.rowcount:
                return False
            self._write_messages(c.id, c.messages)
            if not deleted.draft.is_empty:  # (not save_draft: the chat keeps its place in the list)
                history_drafts.write(self._db, c.id, deleted.draft)
        return True

    def rename(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> Deleted | None:
        """Delete a conversation; returns what `restore` needs to put it back (None: there was none)."""
        conversation = self.load(conversation_id)
        times = self._db.execute("SELECT created, updated FROM conversations WHERE id = ?",
                                 (conversation_id,)).fetchone()
        draft = self.draft(conversation_id)  # (the delete's cascade takes it)
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return None if conversation is None or times is None else Deleted(conversation, *times, draft)


def one_line(text: str) -> str:
    """`text` on one line, each run of whitespace (a line break too) one space: a title (the status line and the
    chats picker show one line)."""
    return " ".join(text.split())


def title_from(prompt: str, limit: int = 48) -> str:
    """A conversation title from its first prompt: the first line, cut at a word."""
    line = one_line(prompt.strip().split("\n", 1)[0])
    if len(line) <= limit:
        return line or UNTITLED
    return line[:limit].rsplit(" ", 1)[0] + "…"
