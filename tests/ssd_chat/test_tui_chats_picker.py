"""The chats picker (Ctrl+O): opening, renaming, deleting and bringing back chats, and searching their titles and
messages off the UI thread."""

from __future__ import annotations

import sqlite3
import time

import pytest
from textual.widgets import DataTable

from ssd_chat.history import HistoryStore
from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.widgets.transcript import Transcript
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


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


@pytest.mark.asyncio
async def test_a_picker_title_is_one_line_and_all_spaces_changes_nothing(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "About bananas")
        chat_id, store = app.session.conversation.id, app.session.store
        for typed, want in (("   ", "About bananas"), ("  Two\n  lines ", "Two lines")):
            await pilot.press("ctrl+o")
            await pilot.pause()
            await pilot.press("home", "r")
            await pilot.pause()
            app.screen.query_one("Input").value = typed
            await pilot.press("enter")
            await pilot.pause()
            assert store.load(chat_id).title == want
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="picker closed")


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


@pytest.mark.asyncio
async def test_undoing_a_delete_of_a_chat_another_window_brought_back_says_so(tmp_path):
    """Another window with the chat open brought it back (its quit kept a draft): u failed with "the chat history
    could not be changed (UNIQUE constraint failed: conversations.id)", and again at each u."""
    from ssd_chat.history import ChatSettings
    from ssd_chat.tui.session import ChatSession

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Keep me")
        kept = app.session.conversation.id
        await pilot.press("ctrl+n")
        await send(app, pilot, "Other")
        store = HistoryStore(tmp_path / "history.sqlite3")
        there = ChatSession(HistoryStore(store.path), ChatSettings())
        there.open(there.store.load(kept))
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("down", "d", "d")
        await wait_for(pilot, lambda: store.load(kept) is None, what="the delete")
        there.keep_draft("typed there")
        await pilot.press("u")
        await wait_for(pilot, lambda: "is back already" in list(app._notifications)[-1].message, what="the undo")
        assert not [n for n in app._notifications if n.severity == "error"]
        assert store.draft(kept).text == "typed there" and app.screen.query_one(DataTable).row_count == 2
        assert app.screen.deleted is None


@pytest.mark.asyncio
async def test_a_chat_opened_from_a_search_shows_the_message_that_matched(tmp_path):
    """Enter on a search's match opened the chat at its end, the matched message screens above and unmarked."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        for i in range(9):  # (turns enough to fill several screens; the match in the middle)
            await send(app, pilot, ("Where do penguins live?\n" if i == 4 else f"turn {i}\n") + "filler line\n" * 6)
        await pilot.press("ctrl+n")
        await send(app, pilot, "another chat")
        await pilot.press("ctrl+o")
        await pilot.press("slash")
        await type_text(pilot, "PENGUINS")
        table = app.screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the penguins chat")
        await pilot.press("enter", "enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="chat opened")
        transcript = app.query_one(Transcript)
        views = list(transcript.children)
        match = views[len(views) - 18 + 8]  # (the fifth prompt: the earliest ones may not be shown yet)
        assert "penguins" in str(match.render())
        await wait_for(pilot, lambda: 0 <= match.virtual_region.y - transcript.scroll_y <= 1,
                       what="the match scrolled to the top")
        assert 0 < transcript.scroll_y < transcript.max_scroll_y  # (not the chat's end)
        assert [m.has_class("found") for m in transcript.children] == [m is match for m in transcript.children]
        await pilot.press("ctrl+o")  # opened without a search: at its end, nothing marked
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="chat opened")
        await pilot.pause()
        assert not any(m.has_class("found") for m in app.query_one(Transcript).children)
