"""History in the app: every reply is saved with its settings and stats; the chats screen reopens,
renames and deletes; --resume opens the latest conversation; new chat starts an empty one."""

from __future__ import annotations

import sqlite3
import time

import pytest
from textual.widgets import DataTable

from ssd_chat.history import ChatSettings, HistoryStore
from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.widgets.transcript import AssistantMessage, UserMessage
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


@pytest.mark.asyncio
async def test_replies_are_saved_and_chats_reopen_rename_and_delete(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "First chat")
        first_id = app.session.conversation.id
        assert first_id is not None
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not app.query(UserMessage) and app.session.conversation.id is None
        await send(app, pilot, "Second chat")

        store = HistoryStore(tmp_path / "history.sqlite3")
        saved = store.load(first_id)
        assert saved.title == "First chat" and saved.settings.mode == "ssd"
        assert saved.messages[1].stats.mode == "ssd" and saved.messages[1].stats.cache_hit_rate == 0.5
        assert [s.title for s in store.list()] == ["Second chat", "First chat"]

        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ChatsScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        await pilot.press("down", "r")  # rename "First chat"
        await pilot.pause()
        app.screen.query_one("Input").value = ""
        await type_text(pilot, "Renamed")
        await pilot.press("enter")
        await pilot.pause()
        assert store.load(first_id).title == "Renamed"
        await pilot.press("enter")  # open it
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="chat opened")
        assert app.session.conversation.id == first_id
        assert [str(u.render()) for u in app.query(UserMessage)] == ["First chat"]
        assert "ssd tau" in rendered(app.query(AssistantMessage).last().query_one(".reply-stats"))

        await send(app, pilot, "more")  # continue the reopened chat: history goes to the engine
        assert [m["content"] for m in engine.calls[-1][0]][:2] == ["First chat", "Hello from the **fake** engine."]
        assert len(store.load(first_id).messages) == 4

        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("home", "d")  # the open one (most recent first): one d only asks
        await pilot.pause()
        assert store.load(first_id) is not None
        await pilot.press("down", "d", "up", "d")  # a d on another row asks about that one
        await pilot.pause()
        assert store.load(first_id) is not None and len(store.list()) == 2
        await pilot.press("d")  # a second d in a row deletes
        await pilot.pause()
        assert store.load(first_id) is None
        await pilot.press("escape")
        await pilot.pause()
        assert app.session.conversation.id is None and not app.query(UserMessage)


@pytest.mark.asyncio
async def test_a_history_that_takes_no_write_keeps_the_chat_going(tmp_path):
    """A read-only history file (a full disk, a file locked by another program): the reply stays and the chat goes
    on, with one notification (the app died with a traceback when it saved the reply)."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    store = app.session.store
    store._db.close()
    store._db = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        assert [m.content for m in app.session.messages if m.role == "user"] == ["first", "second"]
        assert len(app.query(AssistantMessage)) == 2 and app.query(AssistantMessage).last().text
        errors = [n.message for n in app._notifications if n.title == "not saved"]
        assert len(errors) == 1 and "readonly" in errors[0] and "/export" in errors[0]
        assert app.session.conversation.id is None


@pytest.mark.asyncio
async def test_the_picker_says_when_the_history_takes_no_change(tmp_path):
    """Renaming or deleting in the picker with a read-only history file: a notification, the chat still listed (the
    app died with a traceback)."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Keep me")
        store = app.session.store
        store._db.close()
        store._db = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)
        await pilot.press("ctrl+o")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        await pilot.press("d", "d")
        await pilot.press("r")
        await pilot.pause()
        await type_text(pilot, "x")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ChatsScreen) and table.row_count == 1
        assert str(table.get_row_at(0)[2]).endswith("Keep me")
        errors = [n.message for n in app._notifications if "could not be changed" in n.message]
        assert len(errors) == 2 and all("readonly" in e for e in errors)


def test_an_unreadable_history_file_reaches_the_app(tmp_path, monkeypatch):
    """run_tui with a history file that is not SQLite: the app runs without history and knows why (the warning went
    to the terminal behind the app's screen, seen only after quitting)."""
    from ssd_chat.history import DATA_ENV
    from ssd_chat.tui import run_tui
    from ssd_chat.tui.app import ChatApp

    (tmp_path / "history.sqlite3").write_bytes(b"not a database" * 100)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    seen = []
    monkeypatch.setattr(ChatApp, "run", lambda app: seen.append((app.session.store, app.history_off)))
    run_tui(FakeEngine, settings=ChatSettings(), target="fake-target", draft=None)
    store, reason = seen[0]
    assert store is None and reason == f"{tmp_path / 'history.sqlite3'}: file is not a database"


@pytest.mark.asyncio
async def test_the_app_says_when_the_history_is_off(tmp_path):
    """Without a history (an unreadable file), the app says so once loaded, and Ctrl+O says why it opens nothing."""
    from ssd_chat.tui.app import ChatApp

    app = ChatApp(FakeEngine, settings=ChatSettings(mode="sd", temperature=0.0), store=None, target="fake-target",
                  history_off="/data/history.sqlite3: file is not a database")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert not isinstance(app.screen, ChatsScreen)
        told = [n.message for n in app._notifications if n.title == "no history"]
        assert told == 2 * ["the chat history is off (/data/history.sqlite3: file is not a database): this run saves "
                            "no chat"]


@pytest.mark.asyncio
async def test_a_search_with_brackets_that_finds_nothing_says_so_as_typed(tmp_path):
    """"no chat holds “x[/]”": the search as typed (read as markup, it crashed the app)."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hello")
        await send(app, pilot, "/chats x[/]")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the picker")
        none = app.screen.query_one("#chats-none")
        await wait_for(pilot, lambda: none.display, what="the no-match line")
        assert rendered(none) == "no chat holds “x[/]”"


@pytest.mark.asyncio
async def test_resume_opens_the_latest_chat_with_its_settings(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/k 2")
        await send(app, pilot, "remember me")
    engine = FakeEngine()
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="ar", k=4, max_tokens=3), resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert [str(u.render()) for u in app.query(UserMessage)] == ["remember me"]
        assert app.session.settings.k == 2 and app.session.settings.mode == "sd"
        await send(app, pilot, "and now")
        assert [m["content"] for m in engine.calls[0][0]] == ["remember me", "Hello from the **fake** engine.",
                                                             "and now"]
        # --max-tokens is the run's: the reopened chat (saved with 64) and a new one take this run's 3
        assert engine.calls[0][1].max_tokens == 3
        await send(app, pilot, "/new")
        await send(app, pilot, "fresh")
        assert engine.calls[1][1].max_tokens == 3
    # settings given on the command line win over the chat's (--resume --mode ar --temperature 0.3); the rest stay
    settings = ChatSettings(mode="ar", k=4, temperature=0.3, max_tokens=3)
    app = make_app(FakeEngine(), tmp_path, settings=settings, resume=True, given=frozenset({"mode", "temperature"}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        s = app.session.settings
        assert (s.mode, s.temperature, s.k) == ("ar", 0.3, 2)
        assert "AR" in rendered(app.query_one("#status"))


@pytest.mark.asyncio
async def test_a_reopened_chat_shows_its_last_replys_figures_in_the_panel(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "first")
        live = (rendered(app.query_one("#tok-s")), rendered(app.query_one("#speed")), rendered(app.query_one("#spec")),
                rendered(app.query_one("#prefix")))
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        speed, spec = rendered(app.query_one("#speed")), rendered(app.query_one("#spec"))
        assert (rendered(app.query_one("#tok-s")), speed, rendered(app.query_one("#prefix"))) == (
            live[0], live[1], live[3])  # what the history keeps: tok/s, TTFT, tokens, prefix reuse
        assert " 0 tokens" not in speed
        assert spec.splitlines()[:2] == live[2].splitlines()[:2]  # SSD tau, acceptance, cache hits
        assert rendered(app.query_one("#histogram")) == "–"  # live only: not in the history
        await send(app, pilot, "/clear")
        assert "no reply yet" in rendered(app.query_one("#spec"))


@pytest.mark.asyncio
async def test_renaming_the_open_chat_in_the_picker_sticks(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "About bananas")
        chat_id = app.session.conversation.id
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("home", "r")
        await pilot.pause()
        app.screen.query_one("Input").value = ""
        await type_text(pilot, "Renamed")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("escape")  # back to the same chat, then another turn saves it
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="picker closed")
        assert "Renamed" in rendered(app.query_one("#status"))
        await send(app, pilot, "more")
        assert HistoryStore(tmp_path / "history.sqlite3").load(chat_id).title == "Renamed"


def test_the_chats_list_says_when_in_few_columns():
    from ssd_chat.tui.screens.chats import when

    now = time.mktime((2026, 12, 5, 10, 30, 0, 0, 0, -1))
    assert when(time.mktime((2026, 12, 5, 9, 41, 0, 0, 0, -1)), now) == "09:41"
    assert when(time.mktime((2026, 11, 28, 17, 2, 0, 0, 0, -1)), now) == "Nov 28 17:02"
    assert when(time.mktime((2025, 3, 1, 8, 0, 0, 0, 0, -1)), now) == "2025-03-01"


@pytest.mark.asyncio
async def test_the_chats_picker_searches_titles_and_messages(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "About bananas")
        bananas = app.session.conversation.id
        await pilot.press("ctrl+n")
        await send(app, pilot, "Rivers of Europe")
        await pilot.press("ctrl+n")
        await send(app, pilot, "Something else")

        await pilot.press("ctrl+o")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3 and app.focused is table
        await pilot.press("slash")
        await type_text(pilot, "FAKE")  # the fake engine's reply, in every chat: shown where it matched
        await wait_for(pilot, lambda: "**fake** engine" in str(table.get_row_at(0)[2]), what="the search's rows")
        assert table.row_count == 3 and all("**fake** engine" in str(table.get_row_at(i)[2]) for i in range(3))
        await type_text(pilot, " banana")  # every word: "fake" and "banana" (a title)
        await wait_for(pilot, lambda: table.row_count == 1, what="one chat")
        assert str(table.get_row_at(0)[2]).startswith("About bananas")
        await type_text(pilot, "zz")
        await wait_for(pilot, lambda: table.row_count == 0, what="no chat")
        assert "no chat holds" in rendered(app.screen.query_one("#chats-none"))
        await pilot.press("escape")  # clears the search: every chat again
        await wait_for(pilot, lambda: table.row_count == 3, what="every chat")
        assert app.screen.query_one("Input").value == ""
        await type_text(pilot, "bananas")
        await wait_for(pilot, lambda: table.row_count == 1, what="the bananas chat")
        await pilot.press("enter")  # to the list, then Enter opens the match
        await pilot.pause()
        assert app.focused is table
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="chat opened")
        assert app.session.conversation.id == bananas

        await send(app, pilot, "/chats rivers")  # the picker, searching already
        assert isinstance(app.screen, ChatsScreen)
        assert app.screen.query_one(DataTable).row_count == 1
        await pilot.press("escape")  # the list has the focus: Esc goes back
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="picker closed")
        assert app.session.conversation.id == bananas


async def two_chats_in_the_picker(app, pilot, first: str, second: str) -> DataTable:
    """Two chats, `first` and `second`, and the chats picker open on them; returns its list."""
    await settle(app, pilot)
    await send(app, pilot, first)
    await pilot.press("ctrl+n")
    await send(app, pilot, second)
    await pilot.press("ctrl+o")
    await pilot.pause()
    return app.screen.query_one(DataTable)


@pytest.mark.asyncio
async def test_a_slow_search_neither_blocks_typing_nor_shows_late(tmp_path, monkeypatch):
    """Searches run off the UI thread: one held up keeps the field and the list live, and its answer, late for the
    text in the field by then, is dropped."""
    import threading

    from ssd_chat import history_search

    release, answered = threading.Event(), threading.Event()
    real = history_search.search

    def search(db, text):
        if text == "rivers":
            assert release.wait(10)
            found = real(db, text)
            answered.set()
            return found
        return real(db, text)

    monkeypatch.setattr(history_search, "search", search)
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        table = await two_chats_in_the_picker(app, pilot, "About bananas", "Rivers of Europe")
        await pilot.press("slash")
        await type_text(pilot, "rivers")  # its search is held up
        await pilot.press(*["backspace"] * 6)
        await type_text(pilot, "bananas")
        await wait_for(pilot, lambda: table.row_count == 1, what="the bananas chat, with the rivers search held")
        assert app.screen.query_one("Input").value == "bananas" and not answered.is_set()
        release.set()
        await wait_for(pilot, answered.is_set, what="the held search's answer")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        assert table.row_count == 1 and str(table.get_row_at(0)[2]).startswith("About bananas")


@pytest.mark.asyncio
async def test_the_picker_closes_on_a_second_esc_and_a_delete_can_be_undone(tmp_path):
    """After a search, the third Esc closed the picker: the second only moved the focus, and what was typed next went
    into the list, where two d's delete. Now Esc clears, Esc closes; a delete needs two d's in a row, and u undoes."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Keep me")
        kept = app.session.conversation
        await pilot.press("ctrl+n")
        await send(app, pilot, "Other")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("slash")
        await type_text(pilot, "keep")
        await pilot.press("escape", "escape")  # clears, then closes
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="picker closed")

        store = HistoryStore(tmp_path / "history.sqlite3")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("down", "d", "x", "d")  # not in a row: asks twice, deletes nothing
        await pilot.pause()
        assert len(store.list()) == 2
        await pilot.press("d")
        await wait_for(pilot, lambda: store.load(kept.id) is None, what="the delete")
        await pilot.press("u")
        await wait_for(pilot, lambda: store.load(kept.id) is not None, what="the undelete")
        back = store.load(kept.id)
        assert (back.title, back.messages) == ("Keep me", kept.messages)
        assert app.screen.query_one(DataTable).row_count == 2
        assert store.list()[1].id == kept.id  # in its place: its times are its own
        await pilot.press("down", "enter")  # it opens as before
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="chat opened")
        assert app.session.conversation.id == kept.id and app.session.messages[0].content == "Keep me"


@pytest.mark.asyncio
async def test_a_search_answered_before_a_delete_does_not_bring_the_chat_back(tmp_path, monkeypatch):
    """A search read before a delete and answered after it showed the deleted chat again."""
    import threading

    from ssd_chat import history_search

    read, release = threading.Event(), threading.Event()
    real = history_search.list_all

    def list_all(db):  # the empty search's rows, read, then held
        rows = real(db)
        if threading.current_thread() is not threading.main_thread():
            read.set()
            assert release.wait(10)
        return rows

    monkeypatch.setattr(history_search, "list_all", list_all)
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        table = await two_chats_in_the_picker(app, pilot, "Keep me", "Other")
        await pilot.press("slash", "k", "backspace")  # the empty search: read off the UI thread, held
        await wait_for(pilot, read.is_set, what="the held search's read")
        await pilot.press("down", "d", "d")  # to the list, delete the first chat
        await wait_for(pilot, lambda: table.row_count == 1, what="the delete")
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        assert table.row_count == 1


@pytest.mark.asyncio
async def test_a_chat_saved_in_ssd_opens_in_ar_where_no_draft_is_loaded(tmp_path):
    """--resume fell back to AR; Ctrl+O kept SSD, every send was refused, and Ctrl+G could not leave it."""
    from ssd_chat.history import ChatMessage, Conversation

    store = HistoryStore(tmp_path / "history.sqlite3")
    saved = store.save(Conversation(None, "Fast chat", ChatSettings(mode="ssd", k=6),
                                    [ChatMessage("user", "hi"), ChatMessage("assistant", "hello")]))
    engine = FakeEngine(draft=None)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.conversation.id == saved, what="the chat opened")
        assert app.session.settings.mode == "ar" and "AR" in rendered(app.query_one("#status"))
        assert any("needs a draft model: using AR" in n.message for n in app._notifications)
        await send(app, pilot, "more")
        assert engine.calls[-1][2] == "ar" and app.session.messages[-1].role == "assistant"


@pytest.mark.asyncio
async def test_the_picker_searches_a_text_once(tmp_path, monkeypatch):
    """`/chats TEXT` searched on opening and again, off the UI thread, for the field's first value; a space typed
    searched again for the same words."""
    from ssd_chat.history_search import Searcher

    calls = []
    real = Searcher.search
    monkeypatch.setattr(Searcher, "search", lambda self, text: (calls.append(text), real(self, text))[1])
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "About rivers")
        await send(app, pilot, "/chats rivers")
        await pilot.press("slash", "end", "space")  # (focusing the field selects its text: end keeps it)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert calls == [] and app.screen.query_one(DataTable).row_count == 1
        await type_text(pilot, "x")
        await wait_for(pilot, lambda: app.screen.query_one(DataTable).row_count == 0, what="the new search")
        assert calls == ["rivers x"]
