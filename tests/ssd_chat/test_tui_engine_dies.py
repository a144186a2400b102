"""An engine process that dies while it works (a reply, a comparison) is told ONCE: the failure's own notice says
how the process ended and what to do, and the app's watch of the process (_watch_engine) then adds nothing."""

from __future__ import annotations

import pytest

from ssd_chat.tui.chat_actions import ENGINE_STOPPED
from ssd_chat.tui.reply_actions import PARTIAL_KEPT
from tests.ssd_chat.tui_fakes import FakeEngine, dies_mid_reply, make_app, rendered, send, settle

SIZE = (120, 40)


def _errors(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications if n.severity == "error"]


@pytest.mark.asyncio
async def test_an_engine_dying_mid_reply_is_told_once(tmp_path):
    engine = dies_mid_reply(FakeEngine())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Hi")
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        app._watch_engine()  # (its next check, now that nothing runs)
        assert _errors(app) == [("reply cut", ENGINE_STOPPED + PARTIAL_KEPT)]  # (its first tokens stay)


@pytest.mark.asyncio
async def test_an_engine_dying_mid_compare_is_told_once(tmp_path):
    """The comparison's failure said the error it met, then the watch said the process stopped: two notices of one
    death."""
    engine = FakeEngine()
    engine.alive = True
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Hi")
        dies_mid_reply(engine)  # its SD row dies after two deltas
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        app._watch_engine()
        assert _errors(app) == [("compare failed", ENGINE_STOPPED)]


@pytest.mark.asyncio
async def test_a_mode_that_needs_the_lost_draft_process_is_refused_until_restart(tmp_path):
    """QA pass 10: /mode ssd after the draft process died said "mode SSD" and the status line SSD, and only the next
    reply said it ran as AR."""
    engine = FakeEngine(warning="the draft process died: continuing in AR")  # (an EngineWarning, draft_lost)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ar")
        await send(app, pilot, "hi")
        assert app.draft_lost
        for change in ("/mode ssd", "ctrl+g"):
            await (send(app, pilot, change) if change.startswith("/") else pilot.press(change))
            assert app.session.settings.mode == "ar", change
            assert "the draft process is gone" in [n.message for n in app._notifications][-1]
        assert "AR" in rendered(app.query_one("#status"))
