"""/max-tokens N: the most tokens a reply generates, for the run (as --max-tokens), and a notice where a reply
stopped at it (the grey stats line's "stopped: length" was the only sign, and nothing in the app raised it); the
status line's live speed."""

from __future__ import annotations

import threading

import pytest

from ssd_chat.tui.reply_actions import length_cut_notice
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, rendered, send, settle, wait_for

SIZE = (120, 40)


def _notices(app) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.mark.asyncio
async def test_max_tokens_sets_the_next_replies_limit_and_a_reply_cut_by_it_says_what_to_do(tmp_path):
    engine = FakeEngine()  # (six tokens a reply)
    app = make_app(engine, tmp_path)  # (--max-tokens 64)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/max-tokens")
        assert errors(app)[-1] == "/max-tokens takes the most tokens a reply generates, at least 1 (now 64)"
        await send(app, pilot, "first")
        assert engine.calls[-1][1].max_tokens == 64 and length_cut_notice(64) not in _notices(app)
        await send(app, pilot, "/max-tokens 3")
        assert app.query_one(PromptArea).text == "" and _notices(app)[-1] == "replies generate at most 3 tokens"
        await send(app, pilot, "second")
        assert engine.calls[-1][1].max_tokens == 3
        assert app.session.messages[-1].content == "".join(engine.words[:3])
        assert app.session.messages[-1].stats.finish_reason == "length"
        assert _notices(app)[-1] == length_cut_notice(3)
        assert "/max-tokens N raises the limit" in length_cut_notice(3)
        await pilot.press("ctrl+n")  # the run's: a new chat takes it, as a reopened one does
        await settle(app, pilot)
        await send(app, pilot, "third")
        assert engine.calls[-1][1].max_tokens == 3


@pytest.mark.asyncio
@pytest.mark.parametrize(("typed", "error"), [
    ("/max-tokens 0", "/max-tokens takes the most tokens a reply generates, at least 1; got 0"),
    ("/max-tokens -5", "/max-tokens takes the most tokens a reply generates, at least 1; got -5"),
    ("/max-tokens 2.5", "/max-tokens takes a whole number (ASCII digits, as 4); got '2.5'"),
    ("/max-tokens lots", "/max-tokens takes a whole number (ASCII digits, as 4); got 'lots'"),
    ("/max-tokens 100001", "/max-tokens takes at most the context limit of 100,000 tokens; got 100,001"),
])
async def test_a_max_tokens_the_engine_would_refuse_is_refused_and_stays_in_the_input(typed, error, tmp_path):
    engine = FakeEngine()  # (its context: 100,000 tokens)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, typed)
        assert errors(app)[-1] == error
        assert app.query_one(PromptArea).text == typed
        assert app.session.max_tokens == app.session.settings.max_tokens == 64
        await send(app, pilot, "/max-tokens 100000")  # the limit itself is taken
        assert app.session.max_tokens == 100_000


class _Gate:
    """Lets `free` deltas through, then holds the rest until set (FakeEngine's gate)."""

    def __init__(self, free: int) -> None:
        self.free, self.event = free, threading.Event()

    def wait(self, timeout: float) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return self.event.wait(timeout)

    def set(self) -> None:
        self.event.set()


@pytest.mark.asyncio
async def test_the_status_line_shows_the_reply_speed_while_it_streams(tmp_path):
    """Under 90 columns the panel steps aside, and nothing showed the speed until the reply's end."""
    gate = _Gate(free=1)  # (two deltas of the six tokens: then held)
    engine = FakeEngine(gate=gate)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(80, 30)) as pilot:
        await settle(app, pilot)
        await send_unsettled(app, pilot, "hi")
        await wait_for(pilot, lambda: app.live_tok_s > 0, what="a live speed")
        status = rendered(app.query_one("#status"))
        assert f"replying… {app.live_tok_s} tok/s · Esc stops" in status
        assert app.live_tok_s == round(app.buffer.stats.snapshot().tok_s)
        gate.set()
        await settle(app, pilot)
        assert "tok/s" not in rendered(app.query_one("#status")) and app.live_tok_s == 0


async def send_unsettled(app, pilot, text: str) -> None:
    app.query_one(PromptArea).text = text
    await pilot.press("enter")
