"""Decoding modes and settings against the fake engine: Ctrl+G, the palette and /mode, AR alone without a draft,
the run's own options, and /k /fanout /temp /system reaching the next request (bad values are one notification)."""

from __future__ import annotations

import threading

import pytest

from engine.config import SpeculationConfig
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import (
    FakeEngine,
    errors,
    first_delta,
    make_app,
    rendered,
    send,
    settle,
    type_text,
    wait_for,
)

SIZE = (120, 40)


def _first_command(app) -> str:
    found = app.screen.query("CommandList")
    if not found or not found.first().option_count:
        return ""
    prompt = found.first().get_option_at_index(0).prompt
    return getattr(prompt, "plain", str(prompt))


@pytest.mark.asyncio
async def test_the_run_options_hold_for_every_reply_and_mode(tmp_path):
    engine = FakeEngine()
    run = SpeculationConfig(mode="sd", backup="fast", adaptive_k=False, lookup=False)  # --backup fast --fixed-k ...
    app = make_app(engine, tmp_path, speculation=run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ssd" and engine.speculation.backup == "fast"
        await send(app, pilot, "/k 2")
        await send(app, pilot, "again")
        assert engine.speculation.k == 2 and engine.speculation.backup == "fast"
        assert engine.speculation.adaptive_k is False and engine.speculation.lookup is False


@pytest.mark.asyncio
async def test_modes_switch_by_key_palette_and_slash(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "sd"
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ssd"
        assert "SSD" in rendered(app.query_one("#status"))
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ssd"  # the engine decoded in the new mode
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ar"

        await send(app, pilot, "/mode sd")
        assert app.session.settings.mode == "sd"
        await send(app, pilot, "/mode turbo")
        assert app.session.settings.mode == "sd" and errors(app)[-1] == "/mode takes ar, sd or ssd; got 'turbo'"
        assert app.query_one(PromptArea).text == "/mode turbo"  # kept for fixing

        await pilot.press("ctrl+p")
        await pilot.pause()
        await type_text(pilot, "Mode SSD")
        await wait_for(pilot, lambda: "Mode: SSD" in _first_command(app),
                       what="palette match")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.settings.mode == "ssd", what="palette mode switch")
        await send(app, pilot, "again")
        assert engine.calls[-1][2] == "ssd"


@pytest.mark.asyncio
async def test_without_a_draft_only_ar_is_available(tmp_path):
    engine = FakeEngine(draft=None)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "ar"
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ar"
        await send(app, pilot, "/mode ssd")
        assert "needs a draft model" in errors(app)[-1]
        assert "no reply yet" in rendered(app.query_one("#spec"))  # no mode before the chat's first reply
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ar"
        assert "AR: no drafts" in rendered(app.query_one("#spec"))


@pytest.mark.asyncio
async def test_k_fanout_temp_and_system_reach_the_next_request(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/k 3")
        await send(app, pilot, "/fanout 1,2,2,1")
        await send(app, pilot, "/temp 0.5")
        await send(app, pilot, "/system You are terse.")
        await send(app, pilot, "hi")
        messages, params, mode = engine.calls[-1]
        assert messages[0] == {"role": "system", "content": "You are terse."}
        assert params.temperature == 0.5
        assert engine.speculation.k == 3 and engine.speculation.fanout == (1, 2, 2, 1) and mode == "ssd"
        assert "k 3 · fan-out 1,2,2,1" in rendered(app.query_one("#layout"))
        assert "system You are terse." in rendered(app.query_one("#layout"))

        for bad, message in [("/k 0", "/k takes the most draft tokens per step, 1-32; got 0"),
                             ("/k many", "/k takes a whole number"), ("/fanout 1,2", "k+1 = 4"),
                             ("/temp -1", "/temp takes a temperature from 0 to 100, 0 = greedy; got -1"),
                             ("/frobnicate", "unknown command /frobnicate"), ("/k", "/k takes the most draft tokens "
                             "per step, 1-32 (now 3)"), ("/temp", "(now 0.5)"), ("/mode", "ar, sd or ssd (now ssd)")]:
            await send(app, pilot, bad)
            assert message in errors(app)[-1], bad
        assert app.session.settings.k == 3 and app.session.settings.temperature == 0.5

        await send(app, pilot, "/system")
        assert "system prompt removed (it was: You are terse.)" in [n.message for n in app._notifications][-1]
        assert "system none" in rendered(app.query_one("#layout"))
        await send(app, pilot, "again")
        assert engine.calls[-1][0][0]["role"] == "user"
        await send(app, pilot, "/system")
        assert "no system prompt to remove" in [n.message for n in app._notifications][-1]


@pytest.mark.asyncio
async def test_top_p_and_top_k_reach_the_next_request_and_show_where_they_apply(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/top-p 0.9")
        await send(app, pilot, "/top-k 20")
        assert "temp 0 ·" in rendered(app.query_one("#status"))  # greedy: the filters change nothing, not shown
        await send(app, pilot, "/temp 0.2")
        assert "temp 0.2 top-p 0.9 top-k 20 ·" in rendered(app.query_one("#status"))
        assert "temp 0.2 · top-p 0.9 · top-k 20" in " ".join(rendered(app.query_one("#layout")).split())
        await send(app, pilot, "hi")
        params = engine.calls[-1][1]
        assert (params.temperature, params.top_p, params.top_k) == (0.2, 0.9, 20)
        for bad, message in [("/top-p 0", "/top-p takes a mass in (0, 1], 1 = off; got 0"),
                             ("/top-p 1e400", "/top-p 1e400 is above the largest number it can hold; it takes a "
                                              "mass in (0, 1], 1 = off"),
                             ("/top-p x", "/top-p takes a number"),
                             ("/temp 1e400", "/temp 1e400 is above the largest number it can hold; it takes a "
                                             "temperature from 0 to 100, 0 = greedy"),
                             ("/top-k -1", "/top-k takes a number of tokens, 0 = off; got -1"),
                             ("/top-p", "(now 0.9)"), ("/top-k", "(now 20)")]:
            await send(app, pilot, bad)
            assert errors(app)[-1] == message if "got" in message else message in errors(app)[-1], bad
            assert "top_" not in errors(app)[-1]  # (the engine's field names: SamplingParams(top_p=...))
        await send(app, pilot, "/top-p 1")
        await send(app, pilot, "/top-k 0")
        assert "temp 0.2 ·" in rendered(app.query_one("#status"))
        await send(app, pilot, "again")
        assert (engine.calls[-1][1].top_p, engine.calls[-1][1].top_k) == (1.0, 0)


@pytest.mark.asyncio
async def test_a_seed_reaches_every_request_and_shows_where_it_applies(tmp_path):
    """/seed N: every reply samples from seed N (the same reply in every mode, and at a regen), saved with the chat."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        assert engine.calls[-1][1].seed is None  # by default a new seed each reply (the engine draws it)
        await send(app, pilot, "/seed 42")
        assert "seed" not in rendered(app.query_one("#status"))  # greedy: a seed changes nothing, not shown
        assert "once /temp is above 0" in [n.message for n in app._notifications][-1]
        await send(app, pilot, "greedy one")
        assert app.session.messages[-1].stats.settings.seed is None  # (a greedy reply sampled from no seed)
        await send(app, pilot, "/temp 0.2")
        assert "temp 0.2 seed 42 ·" in rendered(app.query_one("#status"))
        assert "temp 0.2 · seed 42" in " ".join(rendered(app.query_one("#layout")).split())
        await send(app, pilot, "again")
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/regen")
        assert [(c[1].seed, c[1].temperature) for c in engine.calls[-2:]] == [(42, 0.2), (42, 0.2)]
        assert app.session.settings.seed == 42  # (saved with the chat: ChatSettings)
        replies = [m.stats for m in app.session.messages if m.role == "assistant"]
        assert [st.settings.seed for st in replies] == [None, None, 42]  # each reply's own: greedy, then seed 42
        for bad, message in [("/seed -1", "/seed takes a whole number from 0 to 2^63-1, last (the last reply's) "
                                          "or off (a new seed each reply); got '-1'"),
                             ("/seed 9223372036854775808", "/seed takes a whole number from 0 to 2^63-1"),
                             ("/seed x", "/seed takes a whole number from 0 to 2^63-1, last (the last reply's) "
                                         "or off (a new seed each reply); got 'x'"),
                             ("/seed", "(now 42; the last reply's: 42)")]:
            await send(app, pilot, bad)
            assert message in errors(app)[-1], (bad, errors(app)[-1])
        assert app.session.settings.seed == 42
        await send(app, pilot, "/seed OFF")
        assert app.session.settings.seed is None
        await send(app, pilot, "/seed 5")
        await send(app, pilot, "/seed none")
        assert app.session.settings.seed is None
        await send(app, pilot, "more")
        assert engine.calls[-1][1].seed is None and "seed" not in rendered(app.query_one("#status"))
        drawn = app.session.messages[-1].stats.settings.seed  # the seed the engine drew: the reply's own
        assert drawn == 1000 + len(engine.calls) and f"seed {drawn}" in app.session.messages[-1].stats.settings.text()
        await send(app, pilot, "/seed")
        assert errors(app)[-1].endswith(f"(now off; the last reply's: {drawn})")
        await send(app, pilot, "/seed last")  # that reply's seed, pinned: a regen gives it again
        await send(app, pilot, "/regen")
        assert app.session.settings.seed == drawn and engine.calls[-1][1].seed == drawn
        await send(app, pilot, "/temp 0")
        await send(app, pilot, "greedy")
        await send(app, pilot, "/seed last")
        assert errors(app)[-1] == "/seed last: the last reply sampled from no seed (greedy, or no reply yet)"


@pytest.mark.asyncio
async def test_the_status_line_and_the_panel_show_the_k_a_round_drafts_at_most(tmp_path):
    """/k 32 on the CPU showed "k 32", where the engine drafts at most 31 a round (EngineConfig.max_draft)."""
    from engine.config import CPU_MAX_DRAFT

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/k 32")
        assert app.session.settings.k == 32 and engine.config.max_draft == CPU_MAX_DRAFT == 31
        assert f"· k {CPU_MAX_DRAFT} ·" in rendered(app.query_one("#status"))
        assert f"SD · k {CPU_MAX_DRAFT}" in rendered(app.query_one("#layout"))
        await send(app, pilot, "/k 8")  # under the cap: as set
        assert "· k 8 ·" in rendered(app.query_one("#status"))
        engine.config.on_cuda = True  # no cap: k's own
        await send(app, pilot, "/k 32")
        assert "· k 32 ·" in rendered(app.query_one("#status")) and "SD · k 32" in rendered(app.query_one("#layout"))


@pytest.mark.asyncio
async def test_the_panel_has_a_row_per_position_a_round_can_draft(tmp_path):
    """/k 32 on the CPU sized the per-position acceptance by 32, where a round drafts at most 31: the last read "–"."""
    from engine.config import CPU_MAX_DRAFT

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/k 32")
        await send(app, pilot, "hi")
        positions = rendered(app.query_one("#positions")).splitlines()
        assert len(positions) == CPU_MAX_DRAFT and positions[-1].split()[0] == str(CPU_MAX_DRAFT)
        histogram = rendered(app.query_one("#histogram")).splitlines()
        assert len(histogram) == CPU_MAX_DRAFT + 1  # accepted 0..31
        engine.gate = threading.Event()  # the live panel too: sized so before the reply ends
        await first_delta(app, pilot)
        assert app.buffer is not None and app.buffer.stats.snapshot().k == CPU_MAX_DRAFT
        engine.gate.set()
        await settle(app, pilot)


@pytest.mark.asyncio
async def test_a_top_k_past_the_vocabulary_is_refused_and_a_started_one_is_turned_off(tmp_path):
    """`/top-k 100000` was taken though the model has 49152 tokens (it filters nothing: it is top-k off); so was
    `--top-k 100000`, which the app learns of only once the engine has loaded."""
    from ssd_chat.history import ChatSettings

    engine = FakeEngine()
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="sd", temperature=0.5, top_k=100000))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.top_k == 0 and app.run_settings.top_k == 0  # off, as it worked
        notice = [n.message for n in app._notifications if n.severity == "warning"][-1]
        assert "vocabulary of 49152 (0 turns it off); got 100000): it uses the default top-k 0 now" in notice
        for typed in ("/top-k 100000", "/top-k 49152"):
            await send(app, pilot, typed)
            assert errors(app)[-1] == ("/top-k takes fewer tokens than the model's vocabulary of 49152 (0 turns it "
                                       f"off); got {typed.split()[1]}")
            assert app.query_one(PromptArea).text == typed and app.session.settings.top_k == 0
        app.query_one(PromptArea).text = ""
        await send(app, pilot, "/top-k 49151")
        await send(app, pilot, "hi")
        assert engine.calls[-1][1].top_k == 49151


@pytest.mark.asyncio
async def test_sampling_numbers_show_as_typed(tmp_path):
    """`/top-p 1e-9` showed as 1e-09 (Python's :g) in the status line, the panel and the export, and 0.123456789
    as 0.123457."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/temp 0.123456789")
        await send(app, pilot, "/top-p 1e-9")
        assert "temp 0.123456789 top-p 1e-9 ·" in rendered(app.query_one("#status"))
        assert "temp 0.123456789 · top-p 1e-9" in " ".join(rendered(app.query_one("#layout")).split())
        await send(app, pilot, "/top-p")
        assert errors(app)[-1].endswith("(now 1e-9)")
        await send(app, pilot, "hi")
        await send(app, pilot, f"/export {tmp_path / 'tiny.md'}")
        assert "temperature 0.123456789, top-p 1e-9, max tokens" in (tmp_path / "tiny.md").read_text()


@pytest.mark.asyncio
async def test_a_chat_saved_with_a_refused_fanout_reopens_with_the_default_and_a_notice(tmp_path):
    """A chat saved with /fanout 99999999999999999999 (taken before the fan-out had a limit): --resume reopened it
    with that value, and every reply failed. It reopens with the default fan-out, saved, and a notice saying so."""
    from ssd_chat.history import ChatMessage, ChatSettings, Conversation, HistoryStore

    store = HistoryStore(tmp_path / "history.sqlite3")
    bad = ChatSettings(mode="ssd", k=3, fanout=(99999999999999999999,), temperature=0.0)
    turns = [ChatMessage("user", "hi"), ChatMessage("assistant", "yo")]
    saved = store.save(Conversation(None, "Wide chat", bad, turns))
    store.close()
    engine = FakeEngine()
    app = make_app(engine, tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.conversation.id == saved
        s = app.session.settings
        assert (s.mode, s.k, s.fanout, s.temperature) == ("ssd", 3, None, 0.0)  # only the fan-out changed
        notice = [n.message for n in app._notifications if n.severity == "warning"][-1]
        assert notice.startswith("this chat's settings are refused (/fanout takes counts from 0 to 256 ")
        assert notice.endswith("it uses the default fan-out now (/fanout sets it)")
        await send(app, pilot, "more")
        assert engine.calls[-1][2] == "ssd" and engine.speculation.fanout is None and not errors(app)
        assert app.session.messages[-1].role == "assistant"
    store = HistoryStore(tmp_path / "history.sqlite3")
    assert store.load(saved).settings.fanout is None  # the fix is saved
    # a k+1 fan-out reopened with another --k (--resume --k 3) failed every reply too
    store.save(Conversation(None, "Five", ChatSettings(mode="ssd", k=4, fanout=(1, 2, 2, 1, 4)), turns))
    store.close()
    app = make_app(engine, tmp_path, settings=ChatSettings(k=3), resume=True, given=frozenset({"k"}))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert (app.session.settings.k, app.session.settings.fanout) == (3, None)
        assert [n.message for n in app._notifications if n.severity == "warning"][-1].startswith(
            "this chat's settings are refused (/fanout takes one count or k+1 = 4 of them")
