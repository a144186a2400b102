"""While the user reads and types, the engine prefills what the next prompt will follow: a resumed or reopened chat's
turns and a new system prompt (ChatApp.warm_cache; the engine process's side: test_engine_process)."""

from __future__ import annotations

import threading

import pytest

from ssd_chat.tui.screens.chats import ChatsScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, first_delta, make_app, send, settle, wait_for

SIZE = (120, 40)


async def _quit(app, pilot) -> None:
    await pilot.press("ctrl+q")
    await wait_for(pilot, lambda: not app.is_running, what="the app to exit")


@pytest.mark.asyncio
async def test_a_resumed_chat_and_a_new_system_prompt_are_prefilled_before_the_next_prompt(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert engine.warmed == []  # a new chat, no system prompt: the engine cached the template's opening itself
        await send(app, pilot, "hi")
        await send(app, pilot, "/system Be brief.")
        conversation = app.session.engine_messages(app.session.window)
        assert engine.warmed == [conversation] and conversation[0] == {"role": "system", "content": "Be brief."}
        assert [m["role"] for m in conversation] == ["system", "user", "assistant"]
        await send(app, pilot, "/system")  # removed: the turns without it
        assert engine.warmed[-1] == app.session.engine_messages(app.session.window) and len(engine.warmed) == 2
        await send(app, pilot, "/system Be brief.")
        await send(app, pilot, "/new")
        await send(app, pilot, "a later chat")
        before = len(engine.warmed)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the chats picker")
        await pilot.press("down", "enter")  # the older chat, reopened: its turns
        await settle(app, pilot)
        assert len(engine.warmed) == before + 1 and engine.warmed[-1][1] == {"role": "user", "content": "hi"}
        await _quit(app, pilot)
    resumed = FakeEngine()
    app = make_app(resumed, tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert resumed.warmed == [app.session.engine_messages(app.session.window)] and resumed.warmed[0]
        await _quit(app, pilot)


@pytest.mark.asyncio
async def test_a_warm_up_asked_for_while_a_reply_runs_is_sent_once_it_ends(tmp_path):
    engine = FakeEngine()
    engine.gate = threading.Event()  # each delta after the first waits
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot, "hi")
        assert app.busy
        app.query_one(PromptArea).text = "/system Be brief."
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.settings.system == "Be brief.", what="the system prompt")
        assert engine.warmed == [] and app.warm_due  # (the reply's request holds the engine)
        engine.gate.set()
        await settle(app, pilot)
        conversation = app.session.engine_messages(app.session.window)
        assert engine.warmed == [conversation] and not app.warm_due  # the system prompt, "hi" and its reply
        assert [m["role"] for m in conversation] == ["system", "user", "assistant"]
        await _quit(app, pilot)
