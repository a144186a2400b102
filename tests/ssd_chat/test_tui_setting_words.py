"""The chat app's words for a refused setting are the command line's (setting_words): `/mode xyz` said "unknown mode
'xyz': ar, sd or ssd" where `--mode xyz` said "--mode takes ar, sd or ssd"; a number past a float's range was taken
(`/temp 1e-400` ran greedy: float() reads 0); /fanout was checked against the chat's k, not the k the engine drafts
(/k 32 on the CPU drafts 31: 33 counts were taken); /help calls the default fan-out none, which /fanout refused."""

from __future__ import annotations

import pytest

from engine.config import CPU_MAX_DRAFT
from ssd_chat.history import ChatSettings
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, rendered, send, settle

SIZE = (120, 40)


@pytest.mark.asyncio
async def test_mode_takes_any_case_and_refuses_in_the_command_lines_words(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode XYZ")
        assert errors(app)[-1] == "/mode takes ar, sd or ssd; got 'XYZ'"
        for typed, mode in (("SSD", "ssd"), ("Ar", "ar"), ("sd", "sd")):
            await send(app, pilot, f"/mode {typed}")
            assert app.session.settings.mode == mode
        assert len(errors(app)) == 1


@pytest.mark.asyncio
async def test_a_number_past_a_floats_range_is_refused_not_read_as_inf_or_0(tmp_path):
    app = make_app(FakeEngine(), tmp_path, settings=ChatSettings(mode="sd", temperature=0.7, max_tokens=64))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        for typed, message in [
            ("/temp 1e-400", "/temp 1e-400 is below the smallest number it can hold; 0 turns sampling off (greedy)"),
            ("/temp 1e400", "/temp 1e400 is above the largest number it can hold; it takes a temperature from 0 to "
                            "100, 0 = greedy"),
            ("/top-p 1E-400", "/top-p 1E-400 is below the smallest number it can hold; it takes a mass in (0, 1], "
                              "1 = off"),
        ]:
            await send(app, pilot, typed)
            assert errors(app)[-1] == message
        assert app.session.settings.temperature == 0.7
        await send(app, pilot, "/temp -0")  # (0: greedy, shown as 0, not -0)
        assert app.session.settings.temperature == 0 and "temp 0 ·" in rendered(app.query_one("#status"))
        await send(app, pilot, "/top-p -0")
        assert errors(app)[-1] == "/top-p takes a mass in (0, 1], 1 = off; got 0"


@pytest.mark.asyncio
async def test_fanout_counts_are_checked_against_the_k_the_engine_drafts(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/k 32")  # the CPU drafts 31
        await send(app, pilot, "/fanout " + ",".join(["1"] * (CPU_MAX_DRAFT + 2)))
        assert errors(app)[-1].startswith(f"/fanout takes one count or k+1 = {CPU_MAX_DRAFT + 1} of them")
        await send(app, pilot, "/fanout " + ",".join(["2"] * (CPU_MAX_DRAFT + 1)))
        assert app.session.settings.fanout == (2,) * (CPU_MAX_DRAFT + 1) and len(errors(app)) == 1
        await send(app, pilot, "hi")  # the engine takes it: its k is the one drafted
        assert engine.speculation.k == CPU_MAX_DRAFT and engine.speculation.fanout == (2,) * (CPU_MAX_DRAFT + 1)
        assert len(errors(app)) == 1
        engine.config.on_cuda = True  # no cap: k+1 = 33
        await send(app, pilot, "/fanout " + ",".join(["1"] * 33))
        assert app.session.settings.fanout == (1,) * 33 and len(errors(app)) == 1


@pytest.mark.asyncio
async def test_a_resumed_chats_fanout_fits_the_k_drafted_on_reopening(tmp_path):
    """A chat saved with k 32 and 32 counts (k+1 for the 31 drafted) stays as saved."""
    from ssd_chat.history import Conversation, HistoryStore

    saved = ChatSettings(mode="ssd", k=32, fanout=(1,) * (CPU_MAX_DRAFT + 1), temperature=0.0)
    HistoryStore(tmp_path / "history.sqlite3").save(Conversation(None, "Old", saved, []))
    app = make_app(FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.fanout == saved.fanout
        assert not [n for n in app._notifications if n.severity == "warning"]


@pytest.mark.asyncio
@pytest.mark.parametrize("typed", ["/fanout none", "/fanout None", "/fanout default", "/fanout"])
async def test_fanout_none_is_the_default_as_help_says(tmp_path, typed):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/fanout 3")
        assert "fan-out 3" in rendered(app.query_one("#layout"))
        await send(app, pilot, typed)
        assert app.session.settings.fanout is None and not errors(app)
        assert "fan-out default" in rendered(app.query_one("#layout"))
        await send(app, pilot, "/fanout nothing")
        assert errors(app)[-1] == ("/fanout takes whole numbers (ASCII digits) separated by commas, or none for the "
                                   "default; got 'nothing'")


@pytest.mark.asyncio
async def test_k_keeps_a_fanout_that_fits_it_and_says_when_one_goes(tmp_path):
    """/k set the fan-out back to the default without a word: a one-count fan-out, which fits any k, went too."""
    app = make_app(FakeEngine(), tmp_path, settings=ChatSettings(mode="sd", temperature=0.0, max_tokens=64))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/fanout 2")
        await send(app, pilot, "/k 8")
        assert (app.session.settings.k, app.session.settings.fanout) == (8, (2,))
        await send(app, pilot, "/fanout 1,2,2,1,1,1,1,1,1")
        await send(app, pilot, "/k 8")  # (the same k: its k+1 counts still fit)
        assert app.session.settings.fanout == (1, 2, 2, 1, 1, 1, 1, 1, 1)
        await send(app, pilot, "/k 3")
        assert (app.session.settings.k, app.session.settings.fanout) == (3, None)
        assert "fan-out back to the default" in list(app._notifications)[-1].message
        assert not errors(app)
