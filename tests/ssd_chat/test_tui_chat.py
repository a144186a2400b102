"""The chat flow against the scripted fake engine: type, send, stream, stop (Esc, a quit), refused prompts, and a
settings change mid-reply."""

from __future__ import annotations

import threading

import pytest

from engine.errors import PromptTooLongError
from engine.outputs import FinishReason
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import AssistantMessage, UserMessage
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
    lands between two chunks. Stopped before its first token, the reply leaves no turn (an empty reply stayed in
    the chat, and went to the model with every later prompt): the prompt is back in the input, as when refused."""
    from ssd_chat.history import HistoryStore

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        figures = rendered(app.query_one("#speed"))
        engine.gate, engine.prefill_chunks = threading.Event(), 3
        app.query_one(PromptArea).text = "a very long prompt"
        await pilot.press("enter")
        status = app.query_one("#status")
        await wait_for(pilot, lambda: "reading the prompt: 512 / 1,636 tokens… Esc stops" in rendered(status),
                       what="the prefill's progress")
        await pilot.press("escape")
        engine.gate.set()
        await settle(app, pilot)
        assert "ready" in rendered(status) and "reading" not in rendered(status)
        assert [m.content for m in app.session.messages] == ["first", REPLY]
        assert [str(u.render()) for u in app.query(UserMessage)] == ["first"]
        assert [a.text for a in app.query(AssistantMessage)] == [REPLY]
        assert app.query_one(PromptArea).text == "a very long prompt"
        assert any("stopped before the reply began" in n.message for n in app._notifications)
        assert rendered(app.query_one("#speed")) == figures
        saved = HistoryStore(tmp_path / "history.sqlite3").load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["first", REPLY]
        engine.gate, engine.prefill_chunks = None, 0
        await pilot.press("enter")
        await settle(app, pilot)
        assert [m["content"] for m in engine.calls[-1][0]] == ["first", REPLY, "a very long prompt"]


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


async def test_a_refused_prompt_gives_the_panel_back_the_last_replys_figures(tmp_path):
    """The panel showed the refused request's empty live figures ("0.0", "TTFT – · 0 tokens") with the app
    ready, as it does while a reply starts."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        figures = rendered(app.query_one("#speed")), rendered(app.query_one("#tok-s"))
        assert "6 tokens" in figures[0]
        checked = threading.Event()

        def refuse(*args, **kwargs):  # the engine refuses once the panel shows the request's live figures
            assert checked.wait(5)
            raise PromptTooLongError("the prompt has 9209 tokens but the context limit is 8192: shorten it")

        engine.chat = refuse
        app.submit("a very long prompt")
        await wait_for(pilot, lambda: " 0 tokens" in rendered(app.query_one("#speed")), what="live figures")
        checked.set()
        await settle(app, pilot)
        assert any(n.title == "not sent" for n in app._notifications)
        assert (rendered(app.query_one("#speed")), rendered(app.query_one("#tok-s"))) == figures


@pytest.mark.asyncio
async def test_a_reply_the_context_limit_cut_says_what_to_do(tmp_path):
    """Its stats line said "stopped: context" and no more (ask and the plain mode print a line on stderr)."""
    engine = FakeEngine(ends=FinishReason.CONTEXT)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        notices = [n.message for n in app._notifications]
        assert any(n.startswith("the reply stopped at the context limit of 100,000 tokens: a next prompt")
                   for n in notices), notices
        await send(app, pilot, "go on")
        assert sum("context limit" in n.message for n in app._notifications) == 2
        engine.ends = None
        await send(app, pilot, "again")
        assert sum("context limit" in n.message for n in app._notifications) == 2  # (a reply that ended: none)
