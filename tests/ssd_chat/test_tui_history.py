"""History in the app: every reply is saved with its settings and stats, a history that takes no write or cannot
be read keeps the chat going, --resume opens the latest conversation with its settings and its last figures."""

from __future__ import annotations

import sqlite3

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
        assert spec.splitlines()[:3] == live[2].splitlines()[:3]  # SSD tau, acceptance, cache hits, tau on hit/miss
        assert rendered(app.query_one("#histogram")) == "–"  # live only: not in the history
        await send(app, pilot, "/clear")
        assert "no reply yet" in rendered(app.query_one("#spec"))


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
async def test_opening_the_chats_picker_writes_nothing_over_another_windows_turns(tmp_path):
    """--resume, another process adds a turn to that chat, Ctrl+O then Esc here: the turn was deleted (the picker
    saved the open chat whole), and the chat marked as just updated."""
    from ssd_chat.history import ChatMessage

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        chat_id = app.session.conversation.id
        there = HistoryStore(tmp_path / "history.sqlite3")
        chat = there.load(chat_id)
        chat.messages += [ChatMessage("user", "from there"), ChatMessage("assistant", "re: from there")]
        there.save(chat)
        updated = there.list()[0].updated
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ChatsScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert there.load(chat_id) == chat and there.list()[0].updated == updated
        await send(app, pilot, "from here")  # this window's turn goes to a copy, with a notice
        assert there.load(chat_id) == chat
        assert app.session.conversation.id != chat_id and len(there.load(app.session.conversation.id).messages) == 4
        assert any(n.title == "saved as a copy" for n in app._notifications)
        assert "first (copy)" in rendered(app.query_one("#status"))


@pytest.mark.asyncio
async def test_a_run_without_a_draft_does_not_save_its_ar_into_the_chat(tmp_path):
    """--resume --draft none fell back to AR and saved AR into the chat: the next --resume, with a draft, opened it
    in AR. A mode chosen in that run is saved."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "fast")
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat_id = store.latest().id
    engine = FakeEngine(draft=None)
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="ar", temperature=0.0, max_tokens=64), resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "ar" and any("using AR" in n.message for n in app._notifications)
        await send(app, pilot, "/temp 0.5")
        await send(app, pilot, "slow")
        assert engine.calls[-1][2] == "ar"
        saved = store.load(chat_id)
        assert (saved.settings.mode, saved.settings.temperature, len(saved.messages)) == ("ssd", 0.5, 4)
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "ssd"


def test_a_mode_chosen_over_a_fallback_is_saved(tmp_path):
    from ssd_chat.history import ChatMessage, Conversation
    from ssd_chat.tui.session import ChatSession

    store = HistoryStore(tmp_path / "history.sqlite3")
    chat_id = store.save(Conversation(None, "Fast", ChatSettings(mode="ssd"), [ChatMessage("user", "hi"),
                                                                               ChatMessage("assistant", "hello")]))
    session = ChatSession(store, ChatSettings())
    session.open(store.load(chat_id))
    session.fall_back(mode="ar")
    session.update_settings(k=2)
    assert store.load(chat_id).settings.mode == "ssd"
    session.update_settings(mode="ar")
    assert store.load(chat_id).settings.mode == "ar"


@pytest.mark.asyncio
async def test_a_new_chat_right_after_a_chat_opens_does_not_crash(tmp_path):
    # QA: Ctrl+N within 0.3 s of opening a chat crashed the app (NoMatches on .reply-stats): the reopened replies'
    # stats lines were set after a refresh, by which time Ctrl+N's rebuild had removed those replies.
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert "tok/s" in rendered(app.query(AssistantMessage).last().query_one(".reply-stats"))
        app.show_conversation()  # the chat again, then a new chat at once, with no refresh between
        app.action_new_chat()
        await wait_for(pilot, lambda: not app.query(AssistantMessage), what="the new chat's empty transcript")
        await pilot.pause()
        assert app.return_code is None and app.is_running
