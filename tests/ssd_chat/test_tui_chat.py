"""The chat flow against the scripted fake engine: type, send, stream, cancel, errors, regenerate, edit."""

from __future__ import annotations

import threading

import pytest
from textual import events

from engine.errors import PromptTooLongError
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript, UserMessage
from tests.ssd_chat.tui_fakes import (
    FakeEngine,
    first_delta,
    make_app,
    rendered,
    send,
    settle,
    type_text,
    wait_for,
)

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)
REPLY = "Hello from the **fake** engine."


def _stats_line(app) -> str:
    return str(app.query(AssistantMessage).last().query_one(".reply-stats").render())


async def test_send_streams_the_reply_and_fills_the_panel(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.focused is app.query_one(PromptArea)
        await type_text(pilot, "Hi there")
        await pilot.press("enter")
        await settle(app, pilot)
        assert [str(u.render()) for u in app.query(UserMessage)] == ["Hi there"]
        assert app.query(AssistantMessage).last().text == REPLY
        assert engine.calls[0][0] == [{"role": "user", "content": "Hi there"}]
        assert app.query_one(PromptArea).text == ""
        assert "6 tokens" in _stats_line(app) and "sd tau" in _stats_line(app)
        panel = app.query_one(StatsPanel)
        spec = str(panel.query_one("#spec").render())
        assert spec.startswith("SD  tau 2.50")
        assert "per step: verify 4 ms · target waits 2 ms" in spec and "idle" not in spec  # SD has no draft process
        assert str(panel.query_one("#prefix").render()) == "0/10 prompt tokens reused"
        assert "fake-target on cpu (TP=1, 2 threads)" in rendered(panel.query_one("#layout"))

        await send(app, pilot, "And then?")  # the whole conversation is resent
        assert engine.calls[1][0] == [
            {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": REPLY},
            {"role": "user", "content": "And then?"},
        ]
        assert str(panel.query_one("#prefix").render()) == "8/30 prompt tokens reused"


async def test_escape_stops_the_reply_and_keeps_the_partial_text(tmp_path):
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        assert "replying" in str(app.query_one("#status").render())
        await pilot.press("escape")
        assert app.buffer is not None and app.buffer.cancel.is_set()  # the engine sees it before its next step
        gate.set()
        await settle(app, pilot)
        assert app.query(AssistantMessage).last().text == "Hello"
        assert "stopped: cancelled" in _stats_line(app)
        assert app.session.messages[-1].content == "Hello"

        engine.gate = None  # the next prompt runs normally, with the partial reply in the history
        await send(app, pilot, "again")
        assert engine.calls[1][0][-2:] == [{"role": "assistant", "content": "Hello"},
                                            {"role": "user", "content": "again"}]
        assert app.query(AssistantMessage).last().text == REPLY


async def test_a_long_prompt_shows_its_prefill_and_escape_stops_it(tmp_path):
    """The engine prefills a long prompt a chunk a step: the status line counts the prompt's tokens read, and Esc
    lands between two chunks."""
    gate = threading.Event()
    engine = FakeEngine(gate=gate, prefill_chunks=3)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.query_one(PromptArea).text = "a very long prompt"
        await pilot.press("enter")
        status = app.query_one("#status")
        await wait_for(pilot, lambda: "reading the prompt: 512 / 1,636 tokens… Esc stops" in rendered(status),
                       what="the prefill's progress")
        await pilot.press("escape")
        gate.set()
        await settle(app, pilot)
        assert app.query(AssistantMessage).last().text == ""
        assert "stopped: cancelled" in _stats_line(app)
        assert "ready" in rendered(status) and "reading" not in rendered(status)


async def test_a_refused_prompt_is_restored_and_the_transcript_stays(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.error = PromptTooLongError("the prompt has 900 tokens but the context limit is 512: shorten it")
        await send(app, pilot, "a very long prompt")
        assert app.query_one(PromptArea).text == "a very long prompt"
        assert [str(u.render()) for u in app.query(UserMessage)] == ["first"]
        assert len(app.query(AssistantMessage)) == 1
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert any("context limit is 512" in n.message for n in app._notifications)

        engine.error = None
        await pilot.press("enter")  # the restored prompt goes out as it was
        await settle(app, pilot)
        assert engine.calls[-1][0][-1] == {"role": "user", "content": "a very long prompt"}


async def test_a_refused_first_prompt_does_not_name_the_chat(tmp_path):
    engine = FakeEngine(error=PromptTooLongError("the prompt has 9000 tokens but the context limit is 8192"))
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "word " * 50)
        assert app.session.conversation.title == "New chat"
        engine.error = None
        await send(app, pilot, "Bananas, briefly")
        assert app.session.conversation.title == "Bananas, briefly"


async def test_quitting_mid_reply_keeps_the_partial_reply(tmp_path):
    from ssd_chat.history import HistoryStore

    gate = threading.Event()
    app = make_app(FakeEngine(gate=gate), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        threading.Timer(0.2, gate.set).start()  # the engine's next step, after the quit asked it to stop
        await pilot.press("ctrl+q")
    store = HistoryStore(tmp_path / "history.sqlite3")
    saved = store.load(store.latest().id)
    assert [(m.role, m.content) for m in saved.messages] == [("user", "Hi"), ("assistant", "Hello")]


async def test_a_narrow_terminal_hides_the_panel_and_keeps_the_chat(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(app, pilot)
        assert not app.query_one(StatsPanel).display or app.query_one(StatsPanel).region.width == 0
        assert app.query_one(PromptArea).region.width > 40
        await send(app, pilot, "Hi")
        assert app.query(AssistantMessage).last().text == REPLY
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert app.query_one(StatsPanel).region.width > 0


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


async def test_a_settings_change_mid_reply_saves_no_unanswered_prompt(tmp_path):
    """A settings change saves the chat; mid-reply that wrote the pending prompt, which stayed in the history when
    the reply then failed or the app died. A chat saved so by an earlier version opens with it in the input."""
    from ssd_chat.history import ChatMessage, HistoryStore

    engine = FakeEngine(gate=threading.Event())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        engine.gate.set()
        await settle(app, pilot)
        await send(app, pilot, "Name a fruit.")
        engine.gate.clear()
        await first_delta(app, pilot, "Write an essay.")
        app.query_one(PromptArea).text = "/temp 0.5"  # (send() would wait for the reply)
        await pilot.press("enter")
        await pilot.pause()
        assert app.busy
        store = HistoryStore(tmp_path / "history.sqlite3")
        saved = store.load(app.session.conversation.id)
        assert saved.settings.temperature == 0.5
        assert [m.content for m in saved.messages] == ["Name a fruit.", REPLY]
        engine.gate.set()
        await settle(app, pilot)
        assert [m.content for m in store.load(app.session.conversation.id).messages][-2:] == ["Write an essay.", REPLY]

        old = store.load(app.session.conversation.id)  # as an earlier version left it
        old.messages.append(ChatMessage("user", "never answered"))
        store.save(old)
        await pilot.press("ctrl+n")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.conversation.id == old.id, what="the old chat")
        assert app.query_one(PromptArea).text == "never answered"
        assert app.session.messages[-1].role == "assistant"
        await pilot.press("f5")  # one turn regenerated: the view matches what the model sees
        await settle(app, pilot)
        assert len(app.query(UserMessage)) == 2 and len(app.query(AssistantMessage)) == 2


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


async def test_a_refused_prompt_leaves_the_model_its_view(tmp_path):
    """A prompt too long on its own moves the window to itself, then the engine refuses it: the next prompt still
    sees the earlier turns (the window was left there, and the model had forgotten the whole chat)."""
    from ssd_chat.history import ChatSettings

    engine = FakeEngine(max_model_len=64)
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="sd", temperature=0.0, max_tokens=6))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "one")
        await send(app, pilot, "two")
        app.submit("x " * 6000)  # 6000 tokens: no turn fits beside it, and the engine refuses it
        await settle(app, pilot)
        assert any(n.title == "not sent" for n in app._notifications)
        assert not any("no longer holds" in n.message for n in app._notifications)  # (nothing left the view)
        assert app.session.window == 0
        await send(app, pilot, "three")
        assert [m["content"] for m in engine.calls[-1][0] if m["role"] == "user"] == ["one", "two", "three"]


async def test_token_colours_toggle_shows_provenance_and_a_legend(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path, settings=None)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.change_settings(mode="ssd")
        await send(app, pilot, "hi")
        reply = app.query(AssistantMessage).last()
        assert "".join(p for p, _ in reply.pieces) == REPLY
        sources = {str(s) for _, s in reply.pieces}
        assert {"target", "accepted_hit", "accepted_miss", "recovery"} <= sources
        spec = str(app.query_one(StatsPanel).query_one("#spec").render())
        assert "draft process idle 3 ms per step" in spec  # SSD: the draft's idle time beside the verify time
        await pilot.press("ctrl+t")
        await pilot.pause()
        tokens = reply.query_one(".reply-tokens")
        assert tokens.display and not reply.query_one(".reply-markdown").display
        spans = tokens.render().spans
        assert len({span.style for span in spans}) >= 3  # hit, miss, recovery in different colours
        legend = app.query_one("#legend")
        assert legend.display and "accepted, cache hit" in str(legend.render())
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert reply.query_one(".reply-markdown").display and not legend.display


async def test_the_transcript_follows_the_reply_unless_scrolled_up(tmp_path):
    """It follows a reply; PageUp / PageDown in the prompt scroll it; scrolled up, it stays put while one streams."""
    engine = FakeEngine(words=[f"line {i}\n\n" for i in range(40)])
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "long")
        transcript = app.query_one(Transcript)
        await pilot.pause()
        bottom = transcript.max_scroll_y
        assert bottom > 0 and transcript.scroll_y == bottom  # followed

        app.query_one(PromptArea).text = "typing"
        await pilot.press("pageup")
        await pilot.pause()
        assert transcript.scroll_y < bottom and app.focused is app.query_one(PromptArea)
        assert app.query_one(PromptArea).text == "typing"
        await pilot.press("pagedown", "pagedown", "pagedown")
        await pilot.pause()
        assert transcript.scroll_y == bottom

        engine.gate = gate = threading.Event()
        app.query_one(PromptArea).text = "more"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text, what="1st delta")
        for _ in range(3):  # the user scrolls up with the mouse wheel while the reply streams
            transcript.post_message(events.MouseScrollUp(transcript, 2, 2, 0, -1, 0, False, False, False))
        await pilot.pause()
        scrolled = transcript.scroll_y
        assert scrolled < transcript.max_scroll_y
        gate.set()
        await settle(app, pilot)
        assert transcript.scroll_y == scrolled < transcript.max_scroll_y


async def test_a_fast_reply_is_coalesced_into_few_renders(tmp_path, monkeypatch):
    engine = FakeEngine(words=[f"w{i} " for i in range(1500)])
    app = make_app(engine, tmp_path)
    appends: list[int] = []
    original = AssistantMessage.append

    async def counting_append(self, text, pieces):
        appends.append(len(text))
        await original(self, text, pieces)

    monkeypatch.setattr(AssistantMessage, "append", counting_append)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.session.update_settings(max_tokens=2000)
        await send(app, pilot, "go")
        assert app.query(AssistantMessage).last().text == "".join(engine.words)
        non_empty = [n for n in appends if n]
        assert len(non_empty) < 150  # 1500 deltas, one Markdown append per flush tick
    assert engine.closed  # quitting closes the engine


@pytest.mark.parametrize(("on_cuda", "budget"), [(False, True), (True, False)])
async def test_updates_are_paced_by_the_ui_cpu_only_with_a_cpu_engine(tmp_path, on_cuda, budget):
    """A CPU engine's cores are the UI's too: the reply's updates get a CPU budget (flush_pacer.py); a GPU
    engine's do not, and update every FLUSH_S."""
    from ssd_chat.tui import reply_actions

    engine = FakeEngine()
    engine.config.on_cuda = on_cuda
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "go")
        assert app.pacer.share == (reply_actions.UI_SHARE if budget else None)
        assert app.pacer.min_s == reply_actions.FLUSH_S and app.pacer.max_s == reply_actions.FLUSH_MAX_S
        assert app.query(AssistantMessage).last().text == REPLY


async def test_dialogs_fit_a_narrow_terminal(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 16)) as pilot:
        await settle(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        box = app.screen.query_one(".modal-box")
        assert box.region.right <= 60 and box.region.bottom <= 16
        assert box.max_scroll_y > 0  # the help is longer than the box: it scrolls
