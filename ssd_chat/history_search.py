"""Searching the chat history: every word of a search in a conversation's title or messages, in any case
(Unicode's case folding), and the Searcher that runs searches off the UI thread."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

MAX_SEARCH_WORDS = 8  # a search's words past these are not looked for (each is a condition: a paste was thousands)


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    updated: float
    num_messages: int
    match: str = ""  # a search's: the first message that matched, around the match ("" when the title did)


def connect(path: Path) -> sqlite3.Connection:
    """A connection to a history file, with the case-folding function searches use."""
    db = sqlite3.connect(path)
    db.create_function("folded", 1, _folded, deterministic=True)
    return db


class Searcher:
    """Searches a history file off the UI thread, each search on a connection of its own (a connection belongs to
    the thread that made it); a newer search, or `interrupt()`, stops the one in flight (SQLite's interrupt)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._running: set[sqlite3.Connection] = set()

    def search(self, text: str) -> list[ConversationSummary] | None:
        """HistoryStore.search's answer, or None where a newer search or `interrupt()` stopped this one."""
        self.interrupt()
        db = connect(self.path)
        with self._lock:
            self._running.add(db)
        try:
            return search(db, text)
        except sqlite3.OperationalError as e:
            if "interrupted" in str(e):
                return None
            raise
        finally:
            with self._lock:
                self._running.discard(db)
            db.close()

    def interrupt(self) -> None:
        with self._lock:
            for db in self._running:
                db.interrupt()


def list_all(db: sqlite3.Connection) -> list[ConversationSummary]:
    rows = db.execute(
        "SELECT c.id, c.title, c.updated, COUNT(m.position) FROM conversations c"
        " LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
    ).fetchall()
    return [ConversationSummary(*row) for row in rows]


def search(db: sqlite3.Connection, text: str) -> list[ConversationSummary]:
    """HistoryStore.search's answer (no words: every conversation)."""
    words = list(dict.fromkeys(_folded(text).split()))[:MAX_SEARCH_WORDS]
    if not words:
        return list_all(db)
    holds = ("(instr(folded(c.title), ?) OR EXISTS (SELECT 1 FROM messages w WHERE w.conversation_id = c.id"
             " AND instr(folded(w.content), ?)))")
    rows = db.execute(
        "SELECT c.id, c.title, c.updated, (SELECT COUNT(*) FROM messages n WHERE n.conversation_id = c.id),"
        " (SELECT content FROM messages m WHERE m.conversation_id = c.id AND instr(folded(m.content), ?)"
        "  ORDER BY m.position LIMIT 1)"
        f" FROM conversations c WHERE {' AND '.join([holds] * len(words))} ORDER BY c.updated DESC, c.id DESC",
        [words[0], *(w for word in words for w in (word, word))],
    ).fetchall()
    return [ConversationSummary(i, title, updated, n, excerpt(content, words[0])
                                if content is not None and words[0] not in _folded(title) else "")
            for i, title, updated, n, content in rows]


def first_match(texts: list[str], search: str) -> int | None:
    """The index of the first of `texts` (a conversation's messages) that holds the search's first word, as the
    chats list's excerpt shows it (`search`); None: none does, or the search has no words."""
    words = _folded(search).split()
    return None if not words else next((i for i, text in enumerate(texts) if words[0] in _folded(text)), None)


def _folded(text: str | None) -> str:
    """Text for a search that ignores case (Unicode's case folding: "Straße" holds "STRASSE")."""
    return "" if text is None else text.casefold()


def excerpt(content: str, word: str, width: int = 60) -> str:
    """A line of `content` around the first place that holds `word` (any case), cut at `width` characters."""
    line = " ".join(content.split())
    folded = line.casefold()  # (where folding changed the length, "ß" -> "ss", its places are not the line's)
    at = max(0, folded.find(word) if len(folded) == len(line) else line.lower().find(word))
    start = max(0, min(at - width // 3, len(line) - width))
    if start and (space := line.find(" ", start, at)) >= 0:  # from a word's start
        start = space + 1
    text = line[start:start + width]
    return ("…" if start else "") + text + ("…" if start + width < len(line) else "")
