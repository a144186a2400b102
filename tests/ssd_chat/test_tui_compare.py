"""Compare: the last prompt replayed greedily in every mode, a table of speeds, and the exactness verdict."""

from __future__ import annotations

import threading

import pytest
from textual.widgets import DataTable, Static

from engine.config import SpeculationConfig
from ssd_chat.tui.compare import WARM_UP_TOKENS, CompareReport, CompareRow, run_compare
from ssd_chat.tui.screens.compare import CompareScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeClock, FakeEngine, make_app, rendered, send, settle, wait_for

SIZE = (120, 40)


def _gate_the_rows(engine: FakeEngine, gate: threading.Event, modes: tuple[str, ...] = ("ar", "sd", "ssd")) -> None:
    """The compare's rows in `modes` wait for `gate` (its warm-ups and restore do not)."""
    original_chat = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        row = params is not None and params.temperature == 0 and params.max_tokens > WARM_UP_TOKENS
        engine.gate = gate if row and engine.speculation.mode in modes else None
        return original_chat(messages, params, cancel=cancel, continue_reply=continue_reply)

    engine.chat = chat


def _rows(screen: CompareScreen) -> list[list[str]]:
    table = screen.query_one(DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


@pytest.mark.asyncio
async def test_compare_replays_the_last_prompt_in_every_mode(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/temp 0.8")
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        before = len(engine.calls)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        calls = engine.calls[before:]  # a two-token warm-up per mode, the rows, the reply put back in the cache
        most = app.session.settings.max_tokens
        assert [(mode, params.max_tokens) for _, params, mode in calls] == [
            ("ar", 2), ("sd", 2), ("ssd", 2), ("ar", most), ("sd", most), ("ssd", most), ("sd", 1)]
        replays, (restore, _, _) = calls[:-1], calls[-1]
        assert all(messages[-1] == {"role": "user", "content": "second"} and len(messages) == 3
                   for messages, _, _ in replays)
        assert restore == app.session.engine_messages(app.session.window) and len(restore) == 4  # with the reply
        # at the chat's sampling (/temp 0.8, the model's top-p), one seed for every row: by the coupled race, whose
        # seeded reply is the same in every mode
        assert {(params.temperature, params.seed, params.sampler) for _, params, _ in calls} == {
            (0.8, calls[0][1].seed, "coupled")} and calls[0][1].seed is not None
        title = rendered(screen.query_one(Static))
        assert calls[0][1].top_p == 1.0 and f"(sampled at 0.8, seed {calls[0][1].seed}) the last prompt in" in title
        rows = _rows(screen)
        assert [r[0] for r in rows] == ["AR", "SD", "SSD"]
        assert rows[0][4] == "–" and rows[1][4] == "2.50" and rows[2][5] == "50%"
        assert rows[1][6] == "1.00x"
        assert "token-identical: yes" in rendered(screen.query_one("#compare-status"))
        assert engine.speculation.mode == "sd"  # restored
        assert len(app.session.messages) == 4  # the conversation is untouched
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)


@pytest.mark.asyncio
async def test_compare_flags_a_mode_that_changes_the_output(tmp_path):
    engine = FakeEngine(diverge_in="ssd")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        await send(app, pilot, "/compare")
        status = rendered(app.screen.query_one("#compare-status"))
        assert "token-identical: NO" in status and " · SSD parts from AR at token 6 " in status  # (the last of 6)
        assert " SD parts" not in status


def test_a_compare_report_says_where_each_output_parts_from_the_first():
    def row(mode, ids, cancelled=False):
        return CompareRow(mode, 1.0, 0.1, len(ids), None, None, tuple(ids), cancelled)

    report = CompareReport("p", (row("ar", [1, 2, 3, 4]), row("sd", [1, 2, 3, 4]), row("ssd", [1, 9, 3, 4])))
    assert report.identical is False and report.differences() == [("ssd", "ar", 1)]
    shorter = CompareReport("p", (row("ar", [1, 2, 3]), row("sd", [1, 2]), row("ssd", [7], cancelled=True)))
    assert shorter.differences() == [("sd", "ar", 2)]  # (a prefix: where it ends; a stopped row is no output)
    assert CompareReport("p", (row("ar", [1]), row("sd", [1]))).differences() == []


@pytest.mark.asyncio
async def test_compare_needs_a_prompt_and_can_be_stopped(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        assert any("send a prompt first" in n.message for n in app._notifications)
        await send(app, pilot, "hi")
        gate = threading.Event()
        _gate_the_rows(engine, gate)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(engine.calls) == 5, what="the AR replay (after three warm-ups)")
        await pilot.press("escape")  # stops the compare
        await pilot.pause()
        assert rendered(app.screen.query_one("#compare-status")) == "stopping…"
        gate.set()
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        assert [r[0] for r in _rows(screen)] == ["AR (stopped)"]
        assert engine.speculation.mode == "sd"
        assert len(engine.calls) == 6 and len(engine.calls[-1][0]) == 2  # the reply is put back all the same


@pytest.mark.asyncio
async def test_compare_shows_each_row_and_the_running_token_count_as_it_goes(tmp_path):
    """Live demos: AR's row is in the table while SD still runs, and the status counts SD's tokens."""
    engine, gate = FakeEngine(), threading.Event()
    original_chat = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        row = engine.speculation.mode == "sd" and params.max_tokens > WARM_UP_TOKENS
        engine.gate = gate if row else None  # SD's row: its first delta comes, the rest wait for the gate
        return original_chat(messages, params, cancel=cancel, continue_reply=continue_reply)

    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")  # the reply runs in SD: hook the gate in after it
        engine.chat = chat
        app.clock = FakeClock(step=1.0)  # every reading is past the throttle's interval
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)

        def status() -> str:
            return rendered(screen.query_one("#compare-status"))

        await wait_for(pilot, lambda: "running SD… 1 token (Esc stops)" in status(), what="SD's first token")
        assert _rows(screen) == [["AR", "100.0", "50", "6", "–", "–", "1.00x"]] and app.busy
        gate.set()
        await settle(app, pilot)
        assert [r[0] for r in _rows(screen)] == ["AR", "SD", "SSD"] and "token-identical: yes" in status()


def test_run_compare_reports_progress_a_few_times_a_second_not_per_token():
    engine = FakeEngine(words=[f" w{i}" for i in range(30)])
    prompt = [{"role": "user", "content": "hi"}]
    snapshots = []
    report = run_compare(engine, prompt, max_tokens=64, cancel=threading.Event(), on_progress=snapshots.append,
                         clock=FakeClock(step=0.1), interval_s=0.25)  # a report every third reading
    by_mode = {mode: [s for s in snapshots if s.mode == mode] for mode in ("ar", "sd", "ssd")}
    assert [s.tokens for s in by_mode["ar"]] == [0, *range(3, 31, 3)]  # one token a delta, 30 deltas
    assert [(s.mode, s.report.rows) for s in snapshots if s.tokens == 0] == [
        ("warm-up", ()), ("ar", ()), ("sd", report.rows[:1]), ("ssd", report.rows[:2])]
    for mode in ("sd", "ssd"):
        counts = [s.tokens for s in by_mode[mode]]
        assert counts == sorted(set(counts)) and 0 < counts[-1] <= 30 and len(counts) < 1 + 30 / 3
    assert all(s.report.rows == report.rows[:i] for i, m in enumerate(("ar", "sd", "ssd")) for s in by_mode[m])
    still = []  # a clock that does not move: only the three modes' starts are reported
    run_compare(FakeEngine(), prompt, max_tokens=64, cancel=threading.Event(), on_progress=still.append,
                clock=lambda: 0.0)
    assert [(s.mode, s.tokens) for s in still] == [("warm-up", 0), ("ar", 0), ("sd", 0), ("ssd", 0)]


def test_run_compare_restores_the_mode_even_when_a_mode_fails():
    engine = FakeEngine()
    engine.speculation = SpeculationConfig(mode="ssd", k=3)
    original_chat = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        if engine.speculation.mode == "sd" and params.max_tokens > WARM_UP_TOKENS:
            raise RuntimeError("the draft process was killed")
        return original_chat(messages, params, cancel=cancel, continue_reply=continue_reply)

    engine.chat = chat
    with pytest.raises(RuntimeError):
        run_compare(engine, [{"role": "user", "content": "hi"}], max_tokens=8, cancel=threading.Event())
    assert engine.speculation == SpeculationConfig(mode="ssd", k=3)
    report = run_compare(FakeEngine(draft=None), [{"role": "user", "content": "hi"}], max_tokens=8,
                         cancel=threading.Event())
    assert [r.mode for r in report.rows] == ["ar"] and report.identical is None


@pytest.mark.asyncio
async def test_compare_fits_a_60_column_terminal(tmp_path):
    """At 60 columns the long headers cut the speed-up column off: the table takes short ones there."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 30)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hello")
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        table = app.screen.query_one(DataTable)
        assert [str(c.label) for c in table.columns.values()][-1] == "vs AR"
        await pilot.pause()
        assert _rows(app.screen)[1][6] == "1.00x" and table.virtual_size.width <= table.size.width


@pytest.mark.asyncio
async def test_compare_without_a_draft_says_why_not(tmp_path):
    engine = FakeEngine(draft=None)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        before = len(engine.calls)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert not isinstance(app.screen, CompareScreen) and len(engine.calls) == before
        assert any("start with --draft" in n.message for n in app._notifications)


@pytest.mark.asyncio
async def test_a_compare_stopped_before_its_first_token_shows_no_ttft(tmp_path):
    engine = FakeEngine(prefill_chunks=1)  # the replay reads its prompt first: the gate holds it there
    gate = threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(engine.calls) == 5, what="the AR replay")
        await pilot.press("escape")
        gate.set()
        await settle(app, pilot)
        assert _rows(app.screen)[0][:4] == ["AR (stopped)", "0.0", "–", "0"]


@pytest.mark.asyncio
async def test_an_engine_failing_mid_compare_keeps_the_rows_done(tmp_path):
    engine = FakeEngine()
    original_chat = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        if engine.speculation.mode == "ssd" and params.max_tokens > WARM_UP_TOKENS:
            raise RuntimeError("the draft process was killed")
        return original_chat(messages, params, cancel=cancel, continue_reply=continue_reply)

    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        engine.chat = chat
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        assert [r[0] for r in _rows(screen)] == ["AR", "SD"]
        assert "the engine failed" in rendered(screen.query_one("#compare-status"))
        assert any("draft process was killed" in n.message for n in app._notifications)
        assert len(app.session.messages) == 2 and not app.busy


@pytest.mark.asyncio
async def test_the_compare_headers_follow_a_resize_and_esc_twice_closes_at_once(tmp_path):
    engine = FakeEngine()
    gate = threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate, ("sd",))
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(pilot, lambda: len(engine.calls) == 6, what="the SD replay")
        table = screen.query_one(DataTable)

        def headers() -> list[str]:
            return [str(c.label) for c in table.columns.values()]

        assert headers()[-1] == "speed-up vs AR"
        await pilot.resize_terminal(60, 30)
        await wait_for(pilot, lambda: headers()[-1] == "vs AR", what="the short headers")
        assert [r[0] for r in _rows(screen)] == ["AR"]  # the finished row is still there
        await pilot.resize_terminal(*SIZE)
        await wait_for(pilot, lambda: headers()[-1] == "speed-up vs AR", what="the long headers")
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("escape")  # the second Esc does not wait for the stop
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)
        gate.set()
        await settle(app, pilot)
        assert not app.busy and not isinstance(app.screen, CompareScreen)


@pytest.mark.asyncio
async def test_compare_after_the_draft_process_died_says_why_not(tmp_path):
    """QA: its SD and SSD rows ran AR under their names."""
    engine = FakeEngine(warning="the draft process died: continuing in AR")  # (an EngineWarning, draft_lost)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        before = len(engine.calls)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert not isinstance(app.screen, CompareScreen) and len(engine.calls) == before
        assert "the draft process is gone" in [n.message for n in app._notifications][-1]


@pytest.mark.asyncio
async def test_a_compare_shows_a_long_prompts_prefill_as_a_reply_does(tmp_path):
    """A long prompt prefills a chunk a step (the warm-up after --resume, where nothing is cached): a reply's status
    line counts the tokens read, and a compare said only "warming the prefix cache…" meanwhile."""
    engine, gate = FakeEngine(), threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        engine.prefill_chunks, engine.gate = 2, gate  # (each chunk after the first waits for the gate)
        app.clock = FakeClock(step=1.0)  # every reading is past the throttle's interval
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_for(pilot, lambda: "warming the prefix cache: reading the prompt: 512 / 1,124 tokens… (Esc stops)"
                       in rendered(screen.query_one("#compare-status")), what="the warm-up's prefill")
        gate.set()
        await settle(app, pilot)
        assert [r[0] for r in _rows(screen)] == ["AR", "SD", "SSD"]
        assert "token-identical: yes" in rendered(screen.query_one("#compare-status"))


@pytest.mark.asyncio
async def test_what_is_typed_during_a_compare_waits_in_the_prompt(tmp_path):
    """Keys typed while the compare's screen covered the prompt were lost: they go into the prompt now, shown on the
    compare's screen; q is a q while it runs, and closes it once it has ended."""
    engine, gate = FakeEngine(), threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate)
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await pilot.press("q", "u", "i", "z", "z", "backspace", "shift+enter", "n", "o", "w")
        area = app.query_one(PromptArea)
        assert area.text == "quiz\nnow" and app.busy and not screen.stopping  # (q did not stop it)
        typed = rendered(screen.query_one("#compare-typed"))
        assert typed.startswith("typed (2 lines): now") and "in the prompt once closed" in typed
        gate.set()
        await settle(app, pilot)
        await pilot.press("q")
        await wait_for(pilot, lambda: not isinstance(app.screen, CompareScreen), what="q to close the compare")
        assert area.text == "quiz\nnow"
