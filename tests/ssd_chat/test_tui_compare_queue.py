"""A prompt sent after Esc Esc closed a compare, while the compare still puts the chat's reply back in the prefix
cache (its restore): it waits for the restore and goes as it ends, where it was refused (and had to be sent again)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ssd_chat.tui.screens.compare import CompareScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.test_tui_compare import SIZE
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, send, settle, wait_for


def _hold_the_restore(engine: FakeEngine, started: threading.Event, go_on: threading.Event) -> None:
    """The compare's restore (its one-token request) says it `started`, then waits for `go_on` before its token (and
    fails there where the engine has an `error` by then)."""
    original_chat = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        events = original_chat(messages, params, cancel=cancel, continue_reply=continue_reply)
        if params is None or params.max_tokens != 1:
            return events

        def held():
            started.set()
            go_on.wait(10)
            if engine.error is not None:
                raise engine.error
            yield from events

        return held()

    engine.chat = chat


async def _close_a_compare_in_its_restore(app, engine, pilot) -> threading.Event:
    """Ctrl+R, Esc Esc; returns once the restore runs (the event lets it go on)."""
    started, go_on = threading.Event(), threading.Event()
    _hold_the_restore(engine, started, go_on)
    await pilot.press("ctrl+r")
    assert isinstance(app.screen, CompareScreen)
    await pilot.press("escape")
    await pilot.press("escape")
    await wait_for(pilot, lambda: not isinstance(app.screen, CompareScreen), what="the compare closed")
    await wait_for(pilot, started.is_set, what="the restore")
    assert app.busy
    return go_on


@asynccontextmanager
async def _queued(tmp_path, prompt: str | None = "next one") -> AsyncIterator[tuple]:
    """The app after a reply to "hi", a compare closed in its restore, and `prompt` sent then (queued; None: none):
    (app, engine, pilot, the restore's event, the input)."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        go_on = await _close_a_compare_in_its_restore(app, engine, pilot)
        area = app.query_one(PromptArea)
        if prompt is not None:
            area.text = prompt
            area.focus()
            await pilot.press("enter")
            await pilot.pause()
        yield app, engine, pilot, go_on, area


@pytest.mark.asyncio
async def test_a_prompt_sent_during_the_restore_goes_once_it_ends(tmp_path):
    async with _queued(tmp_path) as (app, engine, pilot, go_on, area):
        assert area.text == ""  # taken: it waits for the restore
        assert [m.content for m in app.session.messages if m.role == "user"] == ["hi"]  # not sent yet
        assert "your prompt goes next" in str(app.query_one("#status").content)
        calls = len(engine.calls)  # (the restore's call is the last)
        go_on.set()
        await wait_for(pilot, lambda: len(engine.calls) > calls, what="the prompt sent after the restore")
        await settle(app, pilot)
        restore, prompt = engine.calls[calls - 1], engine.calls[calls]
        assert restore[1].max_tokens == 1 and prompt[0][-1] == {"role": "user", "content": "next one"}
        assert [m.content for m in app.session.messages] == ["hi", "Hello from the **fake** engine.", "next one",
                                                             "Hello from the **fake** engine."]
        assert not [n for n in app._notifications if n.severity != "information"]  # no refusal, no warning
        assert app.queued_prompt is None and area.text == ""


@pytest.mark.asyncio
async def test_a_prompt_waiting_on_a_compare_that_fails_comes_back_to_the_input(tmp_path):
    async with _queued(tmp_path) as (app, engine, pilot, go_on, area):
        assert area.text == "" and app.queued_prompt == "next one"
        calls = len(engine.calls)
        engine.error = RuntimeError("the engine broke")  # the restore fails
        go_on.set()
        await settle(app, pilot)
        assert area.text == "next one" and app.queued_prompt is None
        assert [m.content for m in app.session.messages if m.role == "user"] == ["hi"]
        assert errors(app) == ["the engine broke (the prompt sent meanwhile is back in the input)"]
        assert len(engine.calls) == calls  # nothing sent after the failure


@pytest.mark.asyncio
async def test_a_command_during_the_restore_is_told_the_compare_is_ending_not_that_a_reply_runs(tmp_path):
    async with _queued(tmp_path, prompt=None) as (app, _engine, pilot, go_on, _area):
        await pilot.press("f5")
        await pilot.pause()
        warned = [n.message for n in app._notifications if n.severity == "warning"]
        assert warned and warned[-1].startswith("the compare is ending") and "a reply is running" not in warned[-1]
        go_on.set()
        await settle(app, pilot)


@pytest.mark.asyncio
async def test_esc_takes_the_waiting_prompt_back_into_the_input(tmp_path):
    async with _queued(tmp_path) as (app, engine, pilot, go_on, area):
        assert area.text == "" and app.queued_prompt == "next one"
        calls = len(engine.calls)
        await pilot.press("escape")
        await pilot.pause()
        assert area.text == "next one" and area.cursor_location == area.document.end and area.has_focus
        assert app.queued_prompt is None
        assert "your prompt is back in the input" in str(app.query_one("#status").content)
        go_on.set()
        await settle(app, pilot)
        assert len(engine.calls) == calls  # the restore ended and nothing went after it
        assert [m.content for m in app.session.messages if m.role == "user"] == ["hi"]
        assert area.text == "next one" and " ready " in str(app.query_one("#status").content)


@pytest.mark.asyncio
async def test_quitting_puts_the_waiting_prompt_back_in_the_input_as_typed_text(tmp_path):
    async with _queued(tmp_path) as (app, engine, pilot, go_on, area):
        calls = len(engine.calls)
        stop = app.action_stop

        def stop_then_end_the_restore() -> None:  # the restore ends once the quit asked the compare to stop
            stop()
            go_on.set()

        app.action_stop = stop_then_end_the_restore
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
        assert area.text == "next one" and app.queued_prompt is None  # where typed text is at a quit
    assert len(engine.calls) == calls
    assert [m.content for m in app.session.messages if m.role == "user"] == ["hi"]


@pytest.mark.asyncio
async def test_esc_keeps_what_was_typed_meanwhile_one_ctrl_z_away(tmp_path):
    async with _queued(tmp_path) as (app, _engine, pilot, go_on, area):
        await pilot.press("m", "o", "r", "e")
        await pilot.press("escape")
        await pilot.pause()
        assert area.text == "next one"
        assert "Ctrl+Z brings back what you had typed" in list(app._notifications)[-1].message
        await pilot.press("ctrl+z")
        assert area.text == "more"
        go_on.set()
        await settle(app, pilot)
