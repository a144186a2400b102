"""A setting changed while a reply streams: the status line and the panel show it at once, the reply keeps the
one it started with, and the notice says so, "(from the next reply)", as /mode's and Ctrl+G's did (/temp, /k,
/fanout and /system said nothing)."""

from __future__ import annotations

import threading

import pytest

from ssd_chat.reply_settings import ReplySettings
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, first_delta, make_app, send, settle

SIZE = (120, 40)


async def _type(app, pilot, line: str) -> str:
    """Enter `line` while the reply streams; returns the notice it gave."""
    app.query_one(PromptArea).text = line  # (send() would wait for the reply)
    await pilot.press("enter")
    await pilot.pause()
    assert app.busy, "the reply ended before the command"
    return [n.message for n in app._notifications][-1]


@pytest.mark.asyncio
async def test_settings_typed_mid_reply_say_they_apply_from_the_next_reply(tmp_path):
    engine = FakeEngine(gate=threading.Event())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        engine.gate.set()
        await settle(app, pilot)
        await send(app, pilot, "/system Be brief.")
        engine.gate.clear()
        started = ReplySettings.of(app.session.settings)
        await first_delta(app, pilot, "Write an essay.")
        told = [await _type(app, pilot, line) for line in ("/temp 0.5", "/top-p 1e-9", "/k 3", "/fanout 2", "/system",
                                                           "/mode ar")]
        assert told == ["temperature 0.5 (from the next reply)", "top-p 1e-9 (from the next reply)",
                        "k 3 (from the next reply)",
                        "fan-out 2 (from the next reply)",
                        "system prompt removed (from the next reply; it was: Be brief.); /system TEXT sets one",
                        "mode AR (from the next reply)"]
        assert await _type(app, pilot, "/system Be terse.") == "system prompt set (from the next reply)"
        engine.gate.set()
        await settle(app, pilot)
        messages, params, mode = engine.calls[-1]
        assert (messages[0]["content"], params.temperature, mode) == ("Be brief.", 0.0, "sd")  # as it started
        assert app.session.messages[-1].stats.settings == started != ReplySettings.of(app.session.settings)

        await send(app, pilot, "/temp 0.7")  # between replies: the status line says it, no notice
        assert app.session.settings.temperature == 0.7
        assert not any("0.7" in n.message for n in app._notifications)
        await send(app, pilot, "/system")
        assert [n.message for n in app._notifications][-1] == ("system prompt removed (it was: Be terse.); /system "
                                                                "TEXT sets one")
        await send(app, pilot, "Next.")
        messages, params, mode = engine.calls[-1]
        assert (messages[0]["role"], params.temperature, mode) == ("user", 0.7, "ar")
