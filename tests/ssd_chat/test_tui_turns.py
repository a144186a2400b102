"""/turns: any turn of the chat, not only the last: Enter shows it in the conversation, d twice deletes it (its
prompt and its reply), in the chat and the history; the model's views (the window, each later reply's) move up
with the messages after it."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from ssd_chat.history import ChatMessage, ChatSettings, HistoryStore, TurnStats
from ssd_chat.tui.screens.turns import TurnsScreen, turn_rows
from ssd_chat.tui.session import ChatSession
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle, wait_for

SIZE = (120, 40)


def _stats(window: int) -> TurnStats:
    return TurnStats("ar", 10.0, 0.1, 5, 20, 0, "stop", window=window)


def _session(tmp_path, turns: int, windows: list[int]) -> ChatSession:
    session = ChatSession(HistoryStore(tmp_path / "h.sqlite3"), ChatSettings())
    for i in range(turns):
        session.add_prompt(f"prompt {i}")
        session.set_window(windows[i])
        session.add_reply(f"reply {i}", _stats(0))
    return session


def test_deleting_a_turn_moves_the_later_messages_and_their_views_up(tmp_path):
    session = _session(tmp_path, 4, [0, 0, 2, 4])  # (prompts at 0, 2, 4, 6; the last two saw from 2 and 4)
    assert session.delete_turn(2) == "prompt 1"
    assert [m.content for m in session.messages] == ["prompt 0", "reply 0", "prompt 2", "reply 2", "prompt 3",
                                                     "reply 3"]
    assert [m.stats.window for m in session.messages if m.role == "assistant"] == [0, 2, 2]  # (2 began in it)
    assert session.window == 2 and session.context_tokens() is None  # (the last reply's count held the turn)
    saved = session.store.load(session.conversation.id)
    assert [m.content for m in saved.messages] == [m.content for m in session.messages]
    assert [m.stats.window for m in saved.messages if m.role == "assistant"] == [0, 2, 2]
    session.pop_turn()  # /undo after it: the view the now last reply was generated with
    assert session.window == 2
    assert session.delete_turn(2) == "prompt 2"  # the last turn: as /undo
    assert session.context_tokens() == 25  # (the reply before it: its own count, 20 + 5)
    assert [m.content for m in session.messages] == ["prompt 0", "reply 0"] and session.window == 0
    session.conversation.title = "prompt 0"  # (as the first prompt named it)
    session.add_prompt("prompt 4")
    session.add_reply("reply 4", _stats(0))
    assert session.delete_turn(0) == "prompt 0"  # the first: the title it gave goes with it
    assert session.conversation.title == "prompt 4"
    assert session.store.load(session.conversation.id).title == "prompt 4"


def test_turn_rows_preview_each_prompt_and_its_reply():
    messages = [ChatMessage("user", "a\nb"), ChatMessage("assistant", "x" * 100), ChatMessage("user", "[/ c")]
    rows = turn_rows(messages)
    assert rows[0][:2] == (0, "a b") and rows[0][2].endswith("…") and len(rows[0][2]) == 60
    assert rows[1] == (2, "[/ c", "")


@pytest.mark.asyncio
async def test_turns_shows_any_turn_and_deletes_one_pressed_twice(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        for prompt in ("first", "second", "third"):
            await send(app, pilot, prompt)
        await send(app, pilot, "/turns")
        assert isinstance(app.screen, TurnsScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3 and table.cursor_row == 2  # (the latest selected, as /undo's)
        await pilot.press("up", "d", "down", "up", "d")  # not in a row: asked again
        assert len(app.session.messages) == 6 and isinstance(app.screen, TurnsScreen)
        assert "press d again to delete turn 2" in [n.message for n in app._notifications][-1]
        kept = [v for i, v in enumerate(app.query_one(Transcript).children) if i not in (2, 3)]
        await pilot.press("d")
        await wait_for(pilot, lambda: not isinstance(app.screen, TurnsScreen), what="the list closed")
        await settle(app, pilot)
        assert [m.content for m in app.session.messages if m.role == "user"] == ["first", "third"]
        assert len(app.query(AssistantMessage)) == 2
        assert list(app.query_one(Transcript).children) == kept  # (the others' views stay: their token colours too)
        assert [m.content for m in app.session.store.load(app.session.conversation.id).messages
                if m.role == "user"] == ["first", "third"]
        assert "turn deleted (its prompt: second)" in [n.message for n in app._notifications][-1]
        await send(app, pilot, "fourth")  # the model sees the chat without it
        assert [m["content"] for m in engine.calls[-1][0] if m["role"] == "user"] == ["first", "third", "fourth"]
        await send(app, pilot, "/turns")
        await pilot.press("up", "up", "enter")  # Enter: the first turn shown, nothing deleted
        await wait_for(pilot, lambda: not isinstance(app.screen, TurnsScreen), what="the list closed")
        await pilot.pause()
        assert next(iter(app.query_one(Transcript).children)).has_class("found")
        assert len(app.session.messages) == 6
