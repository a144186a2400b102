"""Changing the last turn against the fake engine: regenerate (F5), edit (F4) and /undo, in the transcript, the
saved history and what the model sees."""

from __future__ import annotations

import threading

import pytest

from engine.errors import PromptTooLongError
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript, UserMessage
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)
REPLY = "Hello from the **fake** engine."


async def test_regenerate_and_edit_the_last_turn(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        engine.words = ["Another", " answer"]
        await pilot.press("f5")
        await settle(app, pilot)
        assert engine.calls[-1][0][-1] == {"role": "user", "content": "second"}
        assert len(engine.calls[-1][0]) == 3
        assert [m.content for m in app.session.messages] == ["first", REPLY, "second", "Another answer"]
        assert len(app.query(AssistantMessage)) == 2

        await pilot.press("f4")
        await pilot.pause()
        assert app.query_one(PromptArea).text == "second"  # the turn stays until the edit is sent
        assert [m.content for m in app.session.messages] == ["first", REPLY, "second", "Another answer"]
        views = list(app.query_one(Transcript).children)
        assert [v.has_class("replaced") for v in views] == [False, False, True, True]
        assert "editing the last prompt" in rendered(app.query_one("#status"))
        await type_text(pilot, " edited")
        await pilot.press("enter")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first", REPLY, "second edited", "Another answer"]
        assert [str(u.render()) for u in app.query(UserMessage)] == ["first", "second edited"]
        assert not any(v.has_class("replaced") for v in app.query_one(Transcript).children)
        assert engine.calls[-1][0][-1] == {"role": "user", "content": "second edited"} and len(engine.calls[-1][0]) == 3


async def test_an_edit_loses_neither_the_turn_nor_a_typed_draft(tmp_path):
    """F4 used to take the turn out of the chat and the history at once, and to overwrite what was typed: a quit
    (or a second F4) then lost them. Now the turn stays until the edit is sent, Esc cancels, and a draft comes
    back after the edit."""
    from ssd_chat.history import HistoryStore

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Say hi.")
        await send(app, pilot, "Say bye.")
        await type_text(pilot, "my draft")
        await pilot.press("f4")
        await pilot.press("f4")  # a second F4: still the same edit
        await pilot.pause()
        assert app.query_one(PromptArea).text == "Say bye."
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say bye.", REPLY]
        saved = HistoryStore(tmp_path / "history.sqlite3").load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["Say hi.", REPLY, "Say bye.", REPLY]
        await type_text(pilot, " Now")
        await pilot.press("escape")  # cancel: the draft is back, the turn unmarked
        await pilot.pause()
        assert app.query_one(PromptArea).text == "my draft" and app.edit is None
        await pilot.press("ctrl+z")  # the cancelled edit's text can be taken back
        await pilot.pause()
        assert app.query_one(PromptArea).text == "Say bye. Now"
        app.query_one(PromptArea).text = "my draft"
        assert not any(v.has_class("replaced") for v in app.query_one(Transcript).children)
        assert "ready" in rendered(app.query_one("#status"))

        await pilot.press("f4")
        app.query_one(PromptArea).text = "Say goodbye."
        await pilot.press("enter")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say goodbye.", REPLY]
        assert app.query_one(PromptArea).text == "my draft"  # back once the edit went
        await pilot.press("f4")
        await pilot.press("f5")  # a regenerate cancels the edit first: the draft comes back
        await settle(app, pilot)
        assert app.current_edit() is None and app.query_one(PromptArea).text == "my draft"
        assert not any(v.has_class("replaced") for v in app.query_one(Transcript).children)
        await pilot.press("f4")
        await pilot.press("ctrl+n")  # so does a new chat
        await pilot.pause()
        assert app.edit is None and app.query_one(PromptArea).text == "my draft"
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")  # back to the chat
        await wait_for(pilot, lambda: len(app.session.messages) == 4, what="the chat again")
        app.query_one(PromptArea).text = ""
        app.query_one(PromptArea).text = "next"
        await pilot.press("enter")  # an ordinary send: nothing replaced
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say goodbye.", REPLY, "next", REPLY]


async def test_a_sent_edit_whose_reply_fails_keeps_the_turn_and_the_edit(tmp_path):
    """The edit replaced the turn in the history before its reply came: a failed reply lost the turn, and the
    draft typed before F4 too. Now the turn stays in the history until the reply comes, and a failure brings the
    edit back (the edited prompt in the input, the turn dimmed, the draft for later)."""
    from ssd_chat.history import HistoryStore

    engine = FakeEngine(gate=threading.Event())
    app = make_app(engine, tmp_path)
    store = HistoryStore(tmp_path / "history.sqlite3")
    async with app.run_test(size=SIZE) as pilot:
        engine.gate.set()
        await settle(app, pilot)
        await send(app, pilot, "Say hi.")
        await send(app, pilot, "Say bye.")
        turns = ["Say hi.", REPLY, "Say bye.", REPLY]
        await type_text(pilot, "my draft")
        await pilot.press("f4")
        app.query_one(PromptArea).text = "Say goodbye."
        engine.gate.clear()
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text == "Hello", what="1st delta")
        assert app.query_one(PromptArea).text == "my draft"  # back in the input once the edit went
        app.change_settings(temperature=0.5)  # as /temp does: a save mid-reply
        assert [m.content for m in store.load(app.session.conversation.id).messages] == turns
        engine.error = PromptTooLongError("the prompt has 9999 tokens but the context limit is 512: shorten it")
        engine.gate.set()
        await settle(app, pilot)  # (this one succeeds: the error is for the next request)
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say goodbye.", REPLY]
        assert app.query_one(PromptArea).text == "my draft"

        await pilot.press("f4")
        app.query_one(PromptArea).text = "Say farewell."
        await pilot.press("enter")  # refused
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say goodbye.", REPLY]
        assert [m.content for m in store.load(app.session.conversation.id).messages] == app_contents(app)
        assert app.query_one(PromptArea).text == "Say farewell." and app.current_edit() is not None
        assert [v.has_class("replaced") for v in app.query_one(Transcript).children] == [False, False, True, True]
        engine.error = None
        await pilot.press("enter")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["Say hi.", REPLY, "Say farewell.", REPLY]
        assert app.query_one(PromptArea).text == "my draft"


def app_contents(app) -> list[str]:
    return [m.content for m in app.session.messages]


async def test_undo_removes_the_last_turn_everywhere(tmp_path):
    from ssd_chat.history import HistoryStore

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        await send(app, pilot, "/undo")
        assert [m.content for m in app.session.messages] == ["first", REPLY]
        assert [str(u.render()) for u in app.query(UserMessage)] == ["first"] and len(app.query(AssistantMessage)) == 1
        saved = HistoryStore(tmp_path / "history.sqlite3").load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY]
        await send(app, pilot, "third")  # the model no longer sees the removed turn
        assert [m["content"] for m in engine.calls[-1][0]] == ["first", REPLY, "third"]
        await send(app, pilot, "/undo")
        await send(app, pilot, "/undo")
        assert app.session.messages == [] and not app.query(UserMessage)
        await send(app, pilot, "/undo")
        assert any("no turn to remove" in n.message for n in app._notifications)
        assert app.session.conversation.title == "New chat"  # emptied, it is named by its next prompt again
        await send(app, pilot, "fourth")
        assert app.session.conversation.title == "fourth"


async def test_undo_gives_back_the_view_the_last_reply_had(tmp_path):
    """The context window moved at the third turn: after /undo the view is the one the second reply was generated
    with (/compare replays it), not the third's clamped to the second prompt (then /compare replayed "two" without
    "one", which its reply had seen)."""
    from ssd_chat.history import ChatSettings

    engine = FakeEngine(max_model_len=32)
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="sd", temperature=0.0, max_tokens=6))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        windows = []
        for text in ("one", "two", "three"):
            await send(app, pilot, text)
            windows.append(app.session.window)
        assert windows[0] == windows[1] == 0 < windows[2]  # (the third prompt did not fit with the first turn)
        assert len(engine.calls[1][0]) == 3 and engine.calls[1][0][0]["content"] == "one"
        await send(app, pilot, "/undo")
        assert app.session.window == 0
        assert app.session.engine_messages(app.session.window) == engine.calls[1][0] + [
            {"role": "assistant", "content": REPLY}]
        await send(app, pilot, "/rename Kept")
        await send(app, pilot, "/undo")
        await send(app, pilot, "/undo")
        assert app.session.conversation.title == "Kept"  # a chosen title stays


async def test_an_edit_stopped_before_its_reply_began_goes_on(tmp_path):
    """Esc while the engine reads an edited prompt: the edited turn is back and the edit goes on, as when the edit
    is refused (an empty reply took the turn's place)."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Say hi.")
        await pilot.press("f4")
        app.query_one(PromptArea).text = "Say hello."
        engine.gate, engine.prefill_chunks = threading.Event(), 3
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.prefill is not None, what="the prefill")
        await pilot.press("escape")
        engine.gate.set()
        await settle(app, pilot)
        assert app_contents(app) == ["Say hi.", REPLY]
        assert app.query_one(PromptArea).text == "Say hello." and app.current_edit() is not None
        assert [v.has_class("replaced") for v in app.query_one(Transcript).children] == [True, True]


async def test_a_regenerate_stopped_before_its_first_token_keeps_the_reply_it_was_to_replace(tmp_path):
    """F5 took the turn out of the chat and the history at once: Esc before the new reply's first token then left
    the prompt in the input only, and a quit lost it. Now the old reply stays until the new one comes."""
    from ssd_chat.history import HistoryStore

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.gate, engine.prefill_chunks = threading.Event(), 3
        await pilot.press("f5")
        await wait_for(pilot, lambda: "reading the prompt" in rendered(app.query_one("#status")), what="the prefill")
        saved = HistoryStore(tmp_path / "history.sqlite3").load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY]  # meanwhile the history keeps the turn
        await pilot.press("escape")
        engine.gate.set()
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first", REPLY]
        assert [str(u.render()) for u in app.query(UserMessage)] == ["first"]
        assert [a.text for a in app.query(AssistantMessage)] == [REPLY]
        assert app.query_one(PromptArea).text == ""  # nothing to resend: the turn is whole
        assert any("the reply it was to replace is back" in n.message for n in app._notifications)
        engine.gate, engine.prefill_chunks, engine.words = None, 0, ["Another", " answer"]
        await pilot.press("f5")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["first", "Another answer"]
