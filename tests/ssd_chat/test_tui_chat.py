"""The chat flow against the scripted fake engine: type, send, stream, cancel, errors, regenerate, edit."""

from __future__ import annotations

import threading

import pytest
from textual import events
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from engine.errors import PromptTooLongError
from ssd_chat.tui.app import KEYS
from ssd_chat.tui.chat_actions import ENGINE_STOPPED
from ssd_chat.tui.screens.loading import LoadingScreen
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


async def test_a_pasted_block_keeps_its_first_line_indent(tmp_path):
    """Indented code pasted as the prompt: the blank lines around it go, its first line's indent stays (the
    whole prompt was stripped, so the first line lost its indent against the others)."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "\n  \n    if x:\n        return 1\n\n  ")
        assert engine.calls[-1][0][-1]["content"] == "    if x:\n        return 1"
        await send(app, pilot, "  //usr/bin is a path ")
        assert engine.calls[-1][0][-1]["content"] == "  /usr/bin is a path"


async def test_shift_enter_and_ctrl_j_insert_newlines(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "one")
        await pilot.press("shift+enter")
        await type_text(pilot, "two")
        await pilot.press("ctrl+j")
        await type_text(pilot, "three")
        assert app.query_one(PromptArea).text == "one\ntwo\nthree"
        assert not engine.calls
        await pilot.press("enter")
        await settle(app, pilot)
        assert engine.calls[0][0][-1]["content"] == "one\ntwo\nthree"


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


def _footer_keys(app) -> list[str]:
    """The keys the footer shows whole (a key cut by the terminal's edge, or under the command palette's key docked
    on the right, is not shown)."""
    footer = app.query_one(Footer)
    palette = [k.region for k in footer.query(".-command-palette") if k.display and k.region.width]
    right = palette[0].x if palette else footer.region.right
    return [k.key for k in footer.query(FooterKey)
            if k.region.width and "-command-palette" not in k.classes and k.region.right <= right]


async def test_an_80_column_footer_shows_every_key_and_a_60_column_one_help_first(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        every = [b.key for b in KEYS]
        assert _footer_keys(app)[:len(every)] == every
        assert app.query_one(Footer).query_one(".-command-palette").display  # beside them
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert _footer_keys(app)[:len(every)] == every  # compact: nothing cut, not even under the palette's key
        await pilot.resize_terminal(60, 24)
        await pilot.pause()
        assert _footer_keys(app)[:2] == ["escape", "f1"]


async def test_an_engine_crash_mid_reply_keeps_the_conversation(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        engine.crash_after = 2
        await send(app, pilot, "second")
        assert app.query_one(PromptArea).text == "second"
        assert len(app.query(UserMessage)) == 1 and len(app.query(AssistantMessage)) == 1
        assert any("the engine failed: the draft process was killed" in n.message for n in app._notifications)
        assert app.session.conversation.id is not None  # the first turn is saved
        saved = app.session.store.load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY]


async def test_an_engine_warning_is_a_notification_and_the_reply_goes_on(tmp_path):
    engine = FakeEngine(warning="the draft process died: continuing in AR")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        assert any("continuing in AR" in n.message for n in app._notifications)
        assert app.query(AssistantMessage).last().text == REPLY


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


async def test_the_status_line_stays_one_line_with_the_mode_and_state_first(tmp_path):
    """A long title, colours on and 40 columns: the line is cut with an ellipsis, never wrapped out of sight, and
    the mode and the reply's state are still on it."""
    gate = threading.Event()
    app = make_app(FakeEngine(gate=gate), tmp_path)
    async with app.run_test(size=(40, 12)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/rename " + "x" * 300)
        await pilot.press("ctrl+t")
        await first_delta(app, pilot)
        await pilot.pause()
        status = app.query_one("#status")
        line = status.render_line(0).text
        assert line.strip().startswith("SD · replying") and line.rstrip().endswith("…"), line
        assert status.region.height == 1
        gate.set()
        await settle(app, pilot)


async def test_dialogs_fit_a_narrow_terminal(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 16)) as pilot:
        await settle(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        box = app.screen.query_one(".modal-box")
        assert box.region.right <= 60 and box.region.bottom <= 16
        assert box.max_scroll_y > 0  # the help is longer than the box: it scrolls


async def test_quitting_during_a_step_that_never_ends_stops_the_engine_process(tmp_path, monkeypatch):
    """A cancel lands only between steps: when a step runs long, Ctrl+Q waits QUIT_WAIT_S, then kills the
    engine's process (EngineProcess.kill), and the app exits without logging the failure it causes."""
    from ssd_chat.tui import app as app_module

    monkeypatch.setattr(app_module, "QUIT_WAIT_S", 0.05)
    killed = threading.Event()

    class Prefilling(FakeEngine):
        def chat(self, messages, params=None, *, cancel=None):
            self.calls.append((messages, params, self.speculation.mode))

            def events():
                assert killed.wait(30), "the engine was not killed"
                raise RuntimeError("the engine process stopped (exit code -9)")
                yield  # a generator

            return events()

        def kill(self) -> None:
            killed.set()

    engine = Prefilling()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.query_one(PromptArea).text = "a very long prompt"
        await pilot.press("enter")
        await wait_for(pilot, lambda: engine.calls, what="the request")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert killed.is_set() and engine.closed


def dies_mid_reply(engine: FakeEngine) -> FakeEngine:
    """The engine's process is killed (kill -9, out of memory) after a reply's second delta: it is no longer alive."""
    engine.crash_after, engine.alive = 2, True
    events = engine._events

    def dying(*args, **kwargs):
        try:
            yield from events(*args, **kwargs)
        except RuntimeError:
            engine.alive = False
            raise

    engine._events = dying
    return engine


async def test_when_the_engine_process_dies_the_app_says_so_and_sends_nothing(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        dies_mid_reply(engine)
        await send(app, pilot, "second")
        assert app.query_one(PromptArea).text == "second"
        assert list(app._notifications)[-1].message == ENGINE_STOPPED
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        calls = len(engine.calls)
        app.query_one("#status").update("stale")  # the refusal below shows the state again
        await send(app, pilot, "third")
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        assert len(engine.calls) == calls and list(app._notifications)[-1].message == ENGINE_STOPPED
        assert [m.content for m in app.session.messages] == ["first", REPLY]

        fresh = FakeEngine()  # /restart: the dead engine is closed, a new one loads, the conversation stays
        app.load_engine = lambda: fresh
        await send(app, pilot, "/restart")  # typed over the refused prompt, which comes back once loaded
        assert engine.closed and app.engine is fresh
        assert app.query_one(PromptArea).text == "third"
        assert "ready" in rendered(app.query_one("#status"))
        assert [m.text for m in app.query(AssistantMessage)] == [REPLY]
        await send(app, pilot, "third")
        assert fresh.calls[0][0][-3:] == [{"role": "user", "content": "first"}, {"role": "assistant", "content": REPLY},
                                          {"role": "user", "content": "third"}]
        assert [m.content for m in app.session.messages] == ["first", REPLY, "third", REPLY]


async def test_the_prompt_a_dying_engine_was_answering_comes_back_after_restart(tmp_path):
    """The prompt goes back into the input; /restart, typed over it as the notice says, brought back only a prompt
    sent after the death, and this one was lost."""
    engine = dies_mid_reply(FakeEngine())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is 2+2?")
        assert app.query_one(PromptArea).text == "What is 2+2?" and not app.session.messages
        loaded = threading.Event()
        app.load_engine = lambda: loaded.wait(10) and FakeEngine()
        app.query_one(PromptArea).text = "/restart"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen), what="the loading screen")
        await pilot.press("a", "n", "d")  # typed while it loads: kept, one Ctrl+Z away
        loaded.set()
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        assert app.engine is not engine and area.text == "What is 2+2?"
        assert "Ctrl+Z brings back what you typed while it loaded" in [n.message for n in app._notifications][-1]
        await pilot.press("ctrl+z")
        assert area.text == "and"


async def test_an_engine_that_dies_while_idle_is_reported_at_once(tmp_path, monkeypatch):
    from ssd_chat.tui import app as app_module

    monkeypatch.setattr(app_module, "WATCH_S", 0.05)
    engine = FakeEngine()
    engine.alive = True
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        assert "ready" in rendered(app.query_one("#status"))
        engine.alive = False  # killed while nothing runs
        await wait_for(pilot, lambda: "engine stopped: /restart" in rendered(app.query_one("#status")),
                       what="the status")
        await pilot.pause(0.2)
        assert [n.message for n in app._notifications].count(ENGINE_STOPPED) == 1  # once, not every check


async def test_restart_is_refused_while_a_reply_runs_and_works_when_idle(tmp_path):
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        app.query_one(PromptArea).text = "/restart"
        await pilot.press("enter")
        assert "Esc stops it" in list(app._notifications)[-1].message and app.engine is engine
        gate.set()
        await settle(app, pilot)
        await send(app, pilot, "/restart")  # idle, and the engine alive: it restarts all the same
        assert engine.closed and app.engine is engine  # (the fake loader hands back the same fake)
        assert "ready" in rendered(app.query_one("#status"))
        engine.closed = False
        (restart,) = [c for c in app.get_system_commands(app.screen) if c.title == "Restart the engine"]
        restart.callback()  # the palette's entry does the same
        await settle(app, pilot)
        assert engine.closed and "ready" in rendered(app.query_one("#status"))



async def test_esc_with_no_reply_clears_the_input_undoably(tmp_path):
    """A refused paste of thousands of lines came back into the input with no quick way to clear it."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        pasted = "line of a long paste\n" * 2000
        app.query_one(PromptArea).text = pasted
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one(PromptArea).text == ""
        await pilot.press("ctrl+z")
        await pilot.pause()
        assert app.query_one(PromptArea).text == pasted


async def test_the_status_line_shows_the_context_the_last_reply_left(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert "ctx 0/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "first")
        first = app.session.messages[-1].stats
        await send(app, pilot, "second, a longer prompt")
        second = app.session.messages[-1].stats
        assert second.prompt_tokens > first.prompt_tokens
        used = second.prompt_tokens + second.generated_tokens
        assert f"ctx {used:,}/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "/undo")
        assert f"ctx {first.prompt_tokens + first.generated_tokens:,}/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "/new")
        assert "ctx 0/100,000" in rendered(app.query_one("#status"))


async def test_up_and_down_recall_the_chats_earlier_prompts_and_never_replace_typed_text(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        await pilot.press("up")
        assert area.text == ""  # nothing to recall yet
        await send(app, pilot, "first")
        await send(app, pilot, "second\nwith two lines")
        seen = []
        for key in ("up", "up", "up", "up", "down", "down", "down"):
            await pilot.press(key)
            seen.append(area.text)
        # up from the last line of a two-line prompt: first to its first line, then to the older prompt
        assert seen == ["second\nwith two lines", "second\nwith two lines", "first", "first", "second\nwith two lines",
                        "", ""]
        await pilot.press("up", "up", "up", "x")  # "firstx": changed, so up and down move the cursor only
        for key in ("up", "down"):
            await pilot.press(key)
            assert area.text == "firstx"
        area.text = ""
        await type_text(pilot, "a draft")
        await pilot.press("up")
        assert area.text == "a draft"


async def test_up_and_down_in_a_recalled_prompt_that_wraps_move_the_cursor_until_its_first_or_last_row(tmp_path):
    """A long prompt wraps: Up on its second row replaced it with the older prompt (it is on the first line of the
    document), and Down on its first row with the newer one (or an empty input)."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        long = " ".join(["a long prompt that wraps"] * 12)
        await send(app, pilot, "first")
        await send(app, pilot, long)
        await pilot.press("up")
        assert area.text == long and area.wrapped_document.height > 2
        await pilot.press("up")  # from its last row to the one above
        assert area.text == long and area.cursor_location[1] < len(long)
        await pilot.press("ctrl+home", "down")  # from its first row to the one below
        assert area.text == long and area.cursor_location[1] > 0
        for _ in range(area.wrapped_document.height):
            await pilot.press("up")
        assert area.text == "first"  # on the first row, up recalls the older one


async def test_a_prompt_sent_with_a_double_slash_comes_back_with_it(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        await send(app, pilot, "//etc/hosts: what is it?")
        assert engine.calls[-1][0][-1]["content"] == "/etc/hosts: what is it?"
        await pilot.press("f4")  # edited
        assert area.text == "//etc/hosts: what is it?"
        await pilot.press("escape")
        await pilot.press("up")  # recalled
        assert area.text == "//etc/hosts: what is it?"
        area.text = ""
        engine.crash_after = 1
        await send(app, pilot, "//usr: and this?")  # a failed reply puts it back
        assert area.text == "//usr: and this?"


async def test_a_recall_does_not_carry_over_to_another_chat_or_an_edit(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        for prompt in ("a1", "a2", "a3"):
            await send(app, pilot, prompt)
        await pilot.press("up", "up")
        assert area.text == "a2"
        await pilot.press("ctrl+n")  # a new chat: "a2" stays typed, and is no recall of it
        await pilot.pause()
        await pilot.press("up")
        assert area.text == "a2"
        area.text = ""
        await send(app, pilot, "b1")
        await pilot.press("up")
        assert area.text == "b1"
        await pilot.press("enter")  # the recalled prompt sent as it is
        await settle(app, pilot)
        await pilot.press("f4")  # its edit: Up and Down edit it, they recall nothing over it
        assert area.text == "b1"
        await pilot.press("up", "down")
        assert area.text == "b1"
