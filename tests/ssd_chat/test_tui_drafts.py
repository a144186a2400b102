"""A quit keeps the unsent input with the chat as its draft: text typed and not sent, and a prompt queued behind a
closing compare that the quit put back in the input, come back in the input with `--resume` (and from Ctrl+O)."""

from __future__ import annotations

import pytest

from ssd_chat.history import ChatMessage, HistoryStore
from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import Transcript, UserMessage
from tests.ssd_chat.test_tui_compare_queue import _queued
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


async def _quit(app, pilot) -> None:
    await pilot.press("ctrl+q")
    await wait_for(pilot, lambda: not app.is_running, what="the app to exit")


async def _resumed_input(tmp_path) -> tuple[str, list[str]]:
    """A --resume run's input once loaded, and its transcript's prompts; it quits with the input emptied."""
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        text, prompts = area.text, [str(u.render()) for u in app.query(UserMessage)]
        area.clear()
        await _quit(app, pilot)
    return text, prompts


@pytest.mark.asyncio
async def test_text_typed_and_not_sent_comes_back_with_resume(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        await send(app, pilot, "/new")
        await send(app, pilot, "a later chat")  # (the latest chat: the draft's goes before it)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats picker")
        await pilot.press("down", "enter")  # "hi", the older chat
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="the chat to open")
        await type_text(pilot, "half a thought")
        await pilot.press("shift+enter")
        await type_text(pilot, "/k 2 too")
        await _quit(app, pilot)
    assert await _resumed_input(tmp_path) == ("half a thought\n/k 2 too", ["hi"])  # (as typed: no // added)
    assert await _resumed_input(tmp_path) == ("", ["hi"])  # taken out as it went in, and none kept at a blank quit


@pytest.mark.asyncio
async def test_a_new_chat_with_nothing_but_typed_text_is_kept_for_it_until_the_text_is_back(tmp_path):
    """Saved for its draft alone, a chat goes once the draft is back in the input: it stayed in Ctrl+O's list as an
    empty "New chat" (0 messages) once the input was cleared."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "an earlier chat")
        await send(app, pilot, "/new")
        await type_text(pilot, "not sent")
        await _quit(app, pilot)
    store = HistoryStore(tmp_path / "history.sqlite3")
    listed = [(c.title, c.num_messages) for c in store.list()]
    assert listed == [("New chat", 0), ("an earlier chat", 2)]  # (its first prompt names it, as a new chat's does)
    assert await _resumed_input(tmp_path) == ("not sent", [])  # (the input cleared before its quit)
    assert [(c.title, c.num_messages) for c in store.list()] == [("an earlier chat", 2)]



@pytest.mark.asyncio
async def test_a_chat_with_nothing_but_typed_text_keeps_a_title_and_settings_it_was_given(tmp_path):
    """Named and set before any turn, then kept for its draft at a quit, the chat went with the draft as it came
    back in the input: a quit with the input cleared lost its title and settings."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/rename Tea for two")
        await send(app, pilot, "/temp 0.5")
        await type_text(pilot, "not sent")
        await _quit(app, pilot)
    assert await _resumed_input(tmp_path) == ("not sent", [])  # (the input cleared before its quit)
    store = HistoryStore(tmp_path / "history.sqlite3")
    [chat] = store.list()
    assert (chat.title, chat.num_messages) == ("Tea for two", 0)
    assert store.load(chat.id).settings.temperature == 0.5 and store.draft(chat.id).is_empty

@pytest.mark.asyncio
async def test_a_prompt_queued_behind_a_closing_compare_is_kept_at_a_quit(tmp_path):
    async with _queued(tmp_path) as (app, _engine, pilot, go_on, area):
        stop = app.action_stop

        def stop_then_end_the_restore() -> None:  # the restore ends once the quit asked the compare to stop
            stop()
            go_on.set()

        app.action_stop = stop_then_end_the_restore
        await _quit(app, pilot)
        assert area.text == "next one"
    assert await _resumed_input(tmp_path) == ("next one", ["hi"])


@pytest.mark.asyncio
async def test_opening_a_chat_from_the_picker_brings_its_draft_back(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        await type_text(pilot, "unsent")
        await _quit(app, pilot)
    app = make_app(FakeEngine(), tmp_path)  # (no --resume: a new chat)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "typed here")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats picker")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="the chat to open")
        area = app.query_one(PromptArea)
        assert area.text == "unsent" and "Ctrl+Z brings back" in list(app._notifications)[-1].message
        await pilot.press("ctrl+z")
        assert area.text == "typed here"


@pytest.mark.asyncio
async def test_a_quit_in_an_unchanged_edit_keeps_what_was_typed_before_it(tmp_path):
    """F4 puts the last prompt in the input: a quit then saved that prompt as the draft (--resume offered it again,
    to send as a new turn) and lost what was typed before F4, which Esc, a new chat or another chat give back."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        await type_text(pilot, "half a thought")
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.query_one(PromptArea).text == "hi", what="the edit")
        await _quit(app, pilot)
    assert await _resumed_input(tmp_path) == ("half a thought", ["hi"])



async def _quit_in_a_changed_edit(tmp_path) -> None:
    """A chat "hi", "half a thought" typed, then F4 and the edit changed to "hi there"; then a quit."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        await type_text(pilot, "half a thought")
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.query_one(PromptArea).text == "hi", what="the edit")
        await type_text(pilot, " there")
        await _quit(app, pilot)


@pytest.mark.asyncio
async def test_a_quit_in_a_changed_edit_keeps_the_edit_and_what_was_typed_before_it(tmp_path):
    """One draft slot kept the edit and lost the text typed before F4: now the chat reopens in the edit, and Esc (or
    sending it) gives that text back."""
    await _quit_in_a_changed_edit(tmp_path)
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        assert area.text == "hi there" and app.current_edit() is not None
        assert [v.has_class("replaced") for v in app.query_one(Transcript).children] == [True, True]
        assert "editing the last prompt" in rendered(app.query_one("#status"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: area.text == "half a thought", what="the text typed before F4")
        assert [str(u.render()) for u in app.query(UserMessage)] == ["hi"]
        area.clear()
        await _quit(app, pilot)


@pytest.mark.asyncio
async def test_a_kept_edit_whose_prompt_is_no_longer_the_last_follows_the_text(tmp_path):
    """Another window added a turn since: the edit would replace that one, so it goes in the input after the text."""
    await _quit_in_a_changed_edit(tmp_path)
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat = store.latest()
    chat.messages += [ChatMessage("user", "from there"), ChatMessage("assistant", "ok")]
    store.save(chat)
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.query_one(PromptArea).text == "half a thought\n\nhi there" and app.current_edit() is None


@pytest.mark.asyncio
async def test_a_kept_edit_goes_on_in_the_chat_opened_from_the_picker(tmp_path):
    await _quit_in_a_changed_edit(tmp_path)
    app = make_app(FakeEngine(), tmp_path)  # (no --resume: a new chat)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "typed here")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats picker")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="the chat to open")
        area = app.query_one(PromptArea)
        assert area.text == "hi there" and app.current_edit() is not None
        notice = list(app._notifications)[-1].message
        assert notice.startswith("your edit of the last prompt is back") and "Ctrl+Z brings back" in notice
        await pilot.press("escape")
        await wait_for(pilot, lambda: area.text == "half a thought", what="the text typed before F4")


@pytest.mark.asyncio
async def test_a_quit_from_the_picker_after_deleting_the_open_chat_does_not_bring_it_back(tmp_path):
    """d d on the open chat, then Ctrl+Q with the picker still open and text in the input: the quit saved that text
    with the open chat, and the save put the deleted chat back, every turn of it. The text goes to a new chat, as
    once the picker had closed."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "delete me")
        await type_text(pilot, "not sent")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats picker")
        await pilot.press("d", "d")
        store = HistoryStore(tmp_path / "history.sqlite3")
        await wait_for(pilot, lambda: not store.list(), what="the delete")
        await _quit(app, pilot)
    assert [(c.title, c.num_messages) for c in store.list()] == [("New chat", 0)]
    assert await _resumed_input(tmp_path) == ("not sent", [])
