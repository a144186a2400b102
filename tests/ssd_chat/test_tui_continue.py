"""/continue: the last reply goes on, in its own turn and view (the length limit cut it, say): the engine gets the
conversation with that reply left open (continue_reply), and what it writes is added to the reply, in the chat and
the history. Stopped or refused before its first token, the reply stays as it was."""

from __future__ import annotations

import threading

import pytest

from ssd_chat.tui.reply_actions import length_cut_notice
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import AssistantMessage
from tests.ssd_chat.tui_fakes import FakeEngine, dies_mid_reply, make_app, rendered, send, settle, wait_for

SIZE = (120, 40)


def _notices(app) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.mark.asyncio
async def test_continue_adds_to_the_last_reply_in_the_chat_and_the_history(tmp_path):
    engine = FakeEngine()  # (six tokens a reply: "Hello from the **fake** engine.")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/max-tokens 3")
        await send(app, pilot, "hi")
        cut = "".join(engine.words[:3])
        assert app.session.messages[-1].content == cut and _notices(app)[-1] == length_cut_notice(3)
        assert "/continue writes more of it" in length_cut_notice(3)
        await send(app, pilot, "/continue")
        assert engine.continued == [False, True]
        assert engine.calls[-1][0][-2:] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": cut}]
        longer = cut + cut  # (the fake writes its words from the start again)
        assert [m.content for m in app.session.messages] == ["hi", longer]
        views = app.query(AssistantMessage)
        assert len(views) == 1 and views.last().text == longer
        line = rendered(views.last().query_one(".reply-stats"))
        assert " · 3 tokens · " in line and line.endswith(" · stopped: length")  # (the continuation's figures)
        saved = app.session.store.load(app.session.conversation.id)
        assert [m.content for m in saved.messages] == ["hi", longer]
        assert saved.messages[-1].stats.generated_tokens == 3  # (the continuation's figures)
        await send(app, pilot, "next")  # the conversation goes on from the longer reply
        assert engine.calls[-1][0][-3:-1] == [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": longer}]
        assert engine.continued[-1] is False


@pytest.mark.asyncio
async def test_continue_needs_a_reply(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/continue")
        assert _notices(app)[-1] == "no reply to continue yet" and not engine.calls


@pytest.mark.asyncio
async def test_continue_stopped_before_its_first_token_leaves_the_reply_as_it_was(tmp_path):
    gate = threading.Event()
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        view = app.query(AssistantMessage).last()
        line = rendered(view.query_one(".reply-stats"))
        engine.gate, engine.prefill_chunks = gate, 1  # (it reads the prompt until the gate opens)
        app.query_one(PromptArea).text = "/continue"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.prefill is not None, what="the prompt's reading")
        assert rendered(view.query_one(".reply-stats")) == "continuing…"
        await pilot.press("escape")
        gate.set()
        await settle(app, pilot)
        assert _notices(app)[-1] == "stopped before the reply went on"
        assert [m.content for m in app.session.messages] == ["hi", "".join(engine.words)]
        assert view.text == "".join(engine.words) and rendered(view.query_one(".reply-stats")) == line
        assert app.query_one(PromptArea).text == ""


@pytest.mark.asyncio
async def test_a_continue_the_engine_dies_in_keeps_what_it_wrote_and_one_refused_keeps_the_reply(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        reply = "".join(engine.words)
        engine.crash_after = 0  # refused before its first token: the reply as it was
        await send(app, pilot, "/continue")
        assert _notices(app)[-1] == "not continued: the engine failed: the draft process was killed"
        assert [m.content for m in app.session.messages] == ["hi", reply]
        dies_mid_reply(engine, after=2)  # dies mid-way: what it wrote stays, added to the reply
        await send(app, pilot, "/continue")
        text = app.session.messages[-1].content
        assert len(app.session.messages) == 2 and text.startswith(reply) and len(text) > len(reply)
        assert app.query(AssistantMessage).last().text == text
        assert app.session.store.load(app.session.conversation.id).messages[-1].content == text


@pytest.mark.asyncio
async def test_a_continue_that_adds_nothing_leaves_the_reply_and_its_figures(tmp_path):
    """/continue on a whole reply: an end of turn at once rewrote the reply's figures as "1 token"."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        view = app.query(AssistantMessage).last()
        line, stats = rendered(view.query_one(".reply-stats")), app.session.messages[-1].stats
        engine.words = [""]  # (one token, no text: the end of the turn)
        await send(app, pilot, "/continue")
        assert _notices(app)[-1] == "the reply had nothing more to add"
        assert app.session.messages[-1].stats == stats and rendered(view.query_one(".reply-stats")) == line


@pytest.mark.asyncio
async def test_the_palette_continues_the_reply_and_lists_the_turns(tmp_path):
    from ssd_chat.tui.screens.turns import TurnsScreen

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/max-tokens 3")
        await send(app, pilot, "hi")
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        commands["Continue the reply"].callback()
        await settle(app, pilot)
        assert engine.continued[-1] is True and len(app.session.messages) == 2
        app.call_later(commands["Turns"].callback)  # (as the palette runs it: in the app's own loop)
        await wait_for(pilot, lambda: isinstance(app.screen, TurnsScreen), what="the turns")
