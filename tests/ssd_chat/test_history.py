"""The SQLite history store, without a UI: saving, listing, search, titles and stats lines, drafts."""

from __future__ import annotations

import sqlite3

import pytest

from ssd_chat.history import (
    DATA_ENV,
    ChatMessage,
    ChatSettings,
    Conversation,
    Draft,
    EditDraft,
    HistoryStore,
    TurnStats,
    default_db_path,
    title_from,
)
from tests.ssd_chat.tea_chat import STATS, tea_chat


def test_save_load_list_rename_delete(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    first = tea_chat()
    first_id = store.save(first)
    assert first.id == first_id
    second = Conversation(None, "Other", ChatSettings(), [ChatMessage("user", "hi")])
    store.save(second)
    loaded = store.load(first_id)
    assert loaded == first  # settings (tuple fan-out), messages and per-turn stats round-trip
    assert [s.title for s in store.list()] == ["Other", "Tea"]  # most recent first

    first.messages.append(ChatMessage("user", "again"))
    store.save(first)  # an update rewrites the turns, keeps the id
    assert [s.num_messages for s in store.list() if s.id == first_id] == [3]
    assert store.latest().id == first_id

    store.rename(first_id, "Tea time")
    assert store.load(first_id).title == "Tea time"
    store.delete(first_id)
    assert store.load(first_id) is None
    assert [s.title for s in store.list()] == ["Other"]
    store.close()
    reopened = HistoryStore(tmp_path / "h.sqlite3")  # persisted on disk
    assert [s.title for s in reopened.list()] == ["Other"]


def test_a_deleted_chat_brought_back_has_its_draft_again(tmp_path):
    """Ctrl+O's `u` after `d d`: the chat came back without the text its last quit had kept unsent (the delete's
    cascade took it, and restore wrote the turns alone)."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat_id = store.save(tea_chat())
    store.save_draft(chat_id, "half a thought")
    store.restore(store.delete(chat_id))
    assert store.draft(chat_id).text == "half a thought"


def test_a_failed_save_leaves_a_new_conversation_unsaved(tmp_path):
    """A write that fails after the conversation's row went in (its messages: a full disk) is rolled back: the
    conversation keeps no id, so the next save inserts it (it updated the rolled-back id, and failed for good)."""
    path = tmp_path / "h.sqlite3"
    store = HistoryStore(path)
    other = sqlite3.connect(path)
    with other:
        other.execute("CREATE TRIGGER full BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    conversation = tea_chat()
    with pytest.raises(sqlite3.Error, match="disk full"):
        store.save(conversation)
    assert conversation.id is None and store.list() == []
    with other:
        other.execute("DROP TRIGGER full")
    other.close()
    saved_id = store.save(conversation)
    assert store.load(saved_id) == conversation


def test_a_chat_deleted_by_another_window_is_saved_again_by_the_one_that_has_it_open(tmp_path):
    """Two apps on one history: one deletes the chat the other has open; the other's next save puts it back (it
    failed on the messages' foreign key, every save after too)."""
    here, there = HistoryStore(tmp_path / "h.sqlite3"), HistoryStore(tmp_path / "h.sqlite3")
    conversation = tea_chat()
    saved_id = here.save(conversation)
    there.delete(saved_id)
    conversation.messages.append(ChatMessage("user", "still here?"))
    assert here.save(conversation) == saved_id
    assert there.load(saved_id) == conversation and [s.id for s in there.list()] == [saved_id]


def test_the_data_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "history.sqlite3"
    store = HistoryStore()
    assert store.path.is_file()


def test_titles_and_stats_lines():
    assert title_from("  Write a haiku\nabout tea") == "Write a haiku"
    assert title_from("word " * 30).endswith("…") and len(title_from("word " * 30)) <= 49
    assert title_from("   ") == "New chat"
    line = STATS.line()
    assert line == ("41.2 tok/s · TTFT 81 ms · 12 tokens · prefix reused 16/30 · ssd tau 2.75 · accepted 50%"
                    " · cache hits 80%")
    assert TurnStats("ar", 10, 0.1, 2, 5, 0, "cancelled").line().endswith("· stopped: cancelled")
    stopped_in_prefill = TurnStats("sd", 0.0, 21.98, 0, 4478, 48, "cancelled", tau=0.0, acceptance_rate=0.0)
    assert stopped_in_prefill.line() == "0 tokens · prefix reused 48/4478 · stopped: cancelled"  # no speed, TTFT, tau
    at_once = TurnStats("sd", 0.0, 0.05, 1, 30, 0, "stop", tau=0.0, acceptance_rate=0.0)  # an end of turn at once
    assert at_once.line() == "TTFT 50 ms · 1 token · prefix reused 0/30"  # no 0.0 tok/s, no tau 0.00


def test_search_finds_every_word_in_titles_and_messages_in_any_case(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    tea = store.save(tea_chat())  # "Tea": a haiku about tea, with a code block
    rivers = store.save(Conversation(None, "Rivers", ChatSettings(), [
        ChatMessage("user", "Name three long rivers."),
        ChatMessage("assistant", "The Nile, the Amazon and the Yangtze. " + "They flow far. " * 10 + "Straße."),
    ]))
    assert [s.id for s in store.search("")] == [rivers, tea]  # no words: every chat, as list() gives them
    assert [s.id for s in store.search("  ")] == [rivers, tea]
    assert [s.id for s in store.search("AMAZON")] == [rivers]
    assert [s.id for s in store.search("tea")] == [tea]  # in the title and the messages
    assert [s.id for s in store.search("print")] == [tea]  # in its code block
    assert [s.id for s in store.search("print nile")] == []  # every word in one chat: each is in another
    assert [s.id for s in store.search("nile yangtze")] == [rivers]
    assert [s.id for s in store.search("strasse")] == [rivers]  # Unicode case folding
    assert store.search("%") == [] and store.search("_") == []  # no LIKE wildcards
    hit = store.search("yangtze")[0]
    assert hit.title == "Rivers" and hit.num_messages == 2
    assert "Yangtze" in hit.match and hit.match.startswith("…") and len(hit.match) <= 62
    assert store.search("long")[0].match == "Name three long rivers."  # the first message that holds it
    assert store.search("haiku")[0].match == "Write a haiku about tea."
    assert store.search("rivers")[0].match == ""  # the title holds it: nothing more to show


def test_excerpt_cuts_around_the_word():
    from ssd_chat.history_search import excerpt

    assert excerpt("short  line\nhere", "line") == "short line here"
    long = "a " * 50 + "needle" + " b" * 50
    cut = excerpt(long, "needle", width=30)
    assert cut.startswith("…") and cut.endswith("…") and "needle" in cut and len(cut) == 32
    assert excerpt("needle" + " b" * 40, "needle", width=20).startswith("needle")


def test_a_pasted_search_of_thousands_of_words_is_answered(tmp_path):
    """Each word is a condition: a long paste failed ("Expression tree is too large"). Past MAX_SEARCH_WORDS the
    words are not looked for."""
    from ssd_chat.history_search import MAX_SEARCH_WORDS

    store = HistoryStore(tmp_path / "h.sqlite3")
    tea = store.save(tea_chat())
    assert [s.id for s in store.search("tea haiku " + "word " * 3000)] == []  # "word" is one of the first words
    assert [s.id for s in store.search("tea " * 3000 + "haiku")] == [tea]  # repeats count once
    eight = "tea haiku cup steam over the python print"  # each in the tea chat
    assert len(eight.split()) == MAX_SEARCH_WORDS
    assert [s.id for s in store.search(eight + " nosuchword")] == [tea]  # the ninth word is not looked for


def test_a_searcher_answers_as_the_store_and_stops_when_interrupted(tmp_path, monkeypatch):
    """The chats picker searches off the UI thread with a Searcher: the store's answer, on its own connection; an
    interrupt (a newer keystroke's search) stops a search in flight, which then answers None."""
    import threading

    from ssd_chat import history_search as history

    store = HistoryStore(tmp_path / "h.sqlite3")
    for _ in range(20):  # rows to go after the held one (SQLite looks for an interrupt as it steps)
        store.save(tea_chat())
    searcher = history.Searcher(store.path)
    assert searcher.search("haiku") == store.search("haiku") and searcher.search("") == store.list()

    started, go, answers = threading.Event(), threading.Event(), []
    fold = history._folded

    def held_fold(text):  # a row's fold (not the search text's) waits: the query is in flight
        if text != "haiku":
            started.set()
            assert go.wait(10)
        return fold(text)

    monkeypatch.setattr(history, "_folded", held_fold)
    worker = threading.Thread(target=lambda: answers.append(searcher.search("haiku")))
    worker.start()
    assert started.wait(10)
    searcher.interrupt()
    go.set()
    worker.join(10)
    assert answers == [None]
    monkeypatch.setattr(history, "_folded", fold)
    assert searcher.search("haiku") == store.search("haiku")  # the next one is answered


def test_a_draft_is_kept_with_its_chat_and_makes_it_the_latest(tmp_path):
    """The chat app's unsent input at a quit (HistoryStore.save_draft): --resume opens the latest chat, so the chat
    with the draft becomes it; drop_draft removes the draft, and deleting the chat deletes its draft."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    older = store.save(Conversation(None, "older", messages=[ChatMessage("user", "a")]))
    newer = store.save(Conversation(None, "newer", messages=[ChatMessage("user", "b")]))
    assert store.latest().id == newer and store.draft(older).text == ""
    store.save_draft(older, "typed\nnot sent")
    assert store.draft(older).text == "typed\nnot sent" and store.latest().id == older
    with pytest.raises(ValueError, match="drop_draft"):  # (it deleted the draft: a call that did two things)
        store.save_draft(older, "")
    assert store.draft(older).text == "typed\nnot sent"
    updated = [s.updated for s in store.list()]
    store.drop_draft(older)
    assert store.draft(older).is_empty and [s.updated for s in store.list()] == updated  # (the list's order stays)
    store.save_draft(newer, "x")
    store.delete(newer)
    assert store._db.execute("SELECT COUNT(*) FROM drafts").fetchone()[0] == 0


def test_a_draft_keeps_an_edit_beside_the_text_and_an_older_file_takes_it(tmp_path):
    """A quit in a changed edit (F4) keeps the edit and what the input held before F4 (one text lost one of them); a
    history file made before drafts had the edit's columns gets them, its drafts kept."""
    path = tmp_path / "h.sqlite3"
    old = sqlite3.connect(path)
    with old:
        old.executescript("CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,"
                          " created REAL NOT NULL, updated REAL NOT NULL, settings TEXT NOT NULL);"
                          " CREATE TABLE drafts (conversation_id INTEGER PRIMARY KEY, text TEXT NOT NULL);"
                          " INSERT INTO conversations VALUES (1, 'Old', 0, 0, '{}');"
                          " INSERT INTO drafts VALUES (1, 'kept before');")
    old.close()
    store = HistoryStore(path)
    assert store.draft(1) == Draft("kept before")
    chat_id = store.save(tea_chat())
    store.save_draft(chat_id, "typed before F4", EditDraft("Write a haiku about coffee.", 0))
    assert store.draft(chat_id) == Draft("typed before F4", EditDraft("Write a haiku about coffee.", 0))
    store.save_draft(chat_id, "", EditDraft("only the edit", 0))  # (nothing typed before F4)
    assert store.draft(chat_id) == Draft("", EditDraft("only the edit", 0))
    store.restore(store.delete(chat_id))
    assert store.draft(chat_id) == Draft("", EditDraft("only the edit", 0))


def test_two_windows_that_open_an_older_file_at_once_both_take_the_edit_columns(tmp_path):
    """The other window adds the columns between this one's look at the table and its ALTER: that window's history
    was off ("duplicate column name: edit")."""
    from ssd_chat import history_drafts

    path = tmp_path / "h.sqlite3"
    old = sqlite3.connect(path)
    old.executescript("CREATE TABLE drafts (conversation_id INTEGER PRIMARY KEY, text TEXT NOT NULL);")
    old.close()

    class LooksFirst:  # this window's connection: the other window migrates right after its look at the table
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def execute(self, sql: str, *args):
            rows = self.db.execute(sql, *args).fetchall()
            if sql.startswith("PRAGMA"):
                other = sqlite3.connect(path)
                history_drafts.migrate(other)
                other.close()
            return iter(rows)

        def __enter__(self):
            return self.db.__enter__()

        def __exit__(self, *exc):
            return self.db.__exit__(*exc)

    db = sqlite3.connect(path)
    history_drafts.migrate(LooksFirst(db))
    assert [row[1] for row in db.execute("PRAGMA table_info(drafts)")] == ["conversation_id", "text", "edit",
                                                                           "edit_at"]
    db.close()
    assert HistoryStore(path).draft(1).is_empty
