"""What the user sees when other programs use the engine's cores (engine.cpu_contention): the chat app's panel and
the plain mode say the engine stepped with fewer threads, the bench says which rows were measured so, and
--fixed-threads keeps every thread (the chat, `ask`, the plain mode and the bench)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from engine import LLM, SamplingParams, affinity
from engine.core_share import ThreadGovernor
from engine.outputs import FEWER_THREADS, ThreadsChanged
from ssd_chat import cli
from ssd_chat.plain import run_plain
from ssd_chat.tui.live_stats import LiveStats
from ssd_chat.tui.widgets.stats_panel import StatsPanel, _threads_note
from ssd_chat.tui.widgets.transcript import AssistantMessage
from tests.engine.test_spec_decode import noisy_copy
from tests.ssd_chat.cli_runs import REPO_ROOT
from tests.ssd_chat.plain_input import REPLY, feed
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle

runner = CliRunner()


def test_the_panel_says_while_and_after_the_engine_steps_with_fewer_threads():
    stats = LiveStats(mode="ar", k=0, started=0.0)
    stats.on_tokens(1, 0.1)
    assert _threads_note(stats.snapshot()) == ""
    stats.on_threads(ThreadsChanged(1, 1, 2))  # another program took a core
    assert "1 of 2 threads: the CPU is busy" in _threads_note(stats.snapshot())
    stats.on_threads(ThreadsChanged(1, 2, 2))  # ... and left it
    assert _threads_note(stats.snapshot()) == "\nfewer threads for a while: CPU busy"


@pytest.mark.asyncio
async def test_the_chat_apps_panel_says_a_reply_ran_on_fewer_threads(tmp_path):
    app = make_app(FakeEngine(threads=(1,)), tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        speed = str(app.query_one(StatsPanel).query_one("#speed").render())
        assert "1 of 2 threads: the CPU is busy" in speed
        stats = str(app.query(AssistantMessage).last().query_one(".reply-stats").render())
        assert stats.endswith(" · " + FEWER_THREADS)  # (the reply's own line says it too: under 90 columns the
        await pilot.resize_terminal(80, 24)  # panel steps aside)
        await send(app, pilot, "again")
        assert FEWER_THREADS in str(app.query(AssistantMessage).last().query_one(".reply-stats").render())
    async with make_app(FakeEngine(), tmp_path / "quiet").run_test(size=(120, 40)) as pilot:
        app = pilot.app
        await settle(app, pilot)
        await send(app, pilot, "hi")
        assert "threads" not in str(app.query(AssistantMessage).last().query_one(".reply-stats").render())


def test_the_plain_mode_says_a_reply_ran_on_fewer_threads(monkeypatch, capsys):
    feed(monkeypatch, ["hi", "again"])
    run_plain(FakeEngine(threads=(1, 2)), SamplingParams(temperature=0, max_tokens=32), None)
    first = capsys.readouterr()
    assert first.out == 2 * (REPLY + "\n")  # stdout keeps the replies alone
    assert first.err.count(FEWER_THREADS + "; --fixed-threads keeps them") == 2
    feed(monkeypatch, ["hi"])
    run_plain(FakeEngine(threads=(2,)), SamplingParams(temperature=0, max_tokens=32), None)  # (never fewer)
    assert "threads" not in capsys.readouterr().err


class Flipper:
    """A governor that changes the count at every step."""

    def __init__(self, cores, most: int, threads: int | None = None, companions=()) -> None:
        self.threads, self.most = most, most

    def tick(self) -> int:
        self.threads = 1 + self.threads % self.most
        return self.threads

    def done(self) -> None:
        pass

    def idle(self) -> None:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the governor reads Linux's /proc/stat")
@pytest.mark.parametrize("fixed", [False, True])
def test_the_bench_says_which_rows_ran_on_fewer_threads(fixed, tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(ThreadGovernor, "where_useful", Flipper)
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_llama_dir), "--modes", "ar", "--threads", "2", "--max-tokens", "8",
            "--limit", "1", "--json", str(out)] + (["--fixed-threads"] if fixed else [])
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["adapt_threads"] is not fixed
    share = report["results"][0]["fewer_threads_share"]
    assert share == 0 if fixed else 0.4 < share < 0.6  # (every other step)
    line = "of its steps ran on fewer threads, as other programs used the engine's cores"
    assert (line in result.stdout) is not fixed


@pytest.mark.parametrize("fixed", [False, True])
def test_ask_and_the_plain_mode_take_fixed_threads_and_say_when_they_ran_on_fewer(fixed, tiny_llama_dir, monkeypatch):
    made = []

    def recording_llm(**kwargs):
        made.append(kwargs)
        return LLM(**kwargs)

    monkeypatch.setattr(cli, "LLM", recording_llm)
    monkeypatch.setattr(ThreadGovernor, "where_useful", Flipper)  # (every other step on one thread of two)
    extra = ["--fixed-threads"] if fixed else []
    ask = ["ask", "hi", "--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "4", "--threads", "2",
           *extra]
    plain = ["--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "4", "--threads", "2", "--plain",
             *extra]
    for args in (ask, plain):
        result = runner.invoke(cli.app, args, input="hi\n")
        assert result.exit_code == 0, result.output
        assert (FEWER_THREADS + "; --fixed-threads keeps them" in result.stderr) is not fixed, result.stderr
    assert [kwargs["adapt_threads"] for kwargs in made] == [not fixed] * 2


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(affinity.usable()) < 2,
                    reason="the governor reads Linux's /proc/stat, and has nothing to drop on one core")
def test_the_busy_cpu_script_runs_end_to_end(tiny_llama_dir, tmp_path):
    """scripts/busy_cpu.py on the tiny model: a row per load, the same tokens in every round, the reply's line."""
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.3)
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "busy_cpu.py"), "--target", str(tiny_llama_dir), "--draft",
         str(draft), "--loads", "0,1", "--rounds", "2", "--limit", "1", "--max-tokens", "6", "--reply-tokens", "8"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("load ")]
    assert [row.split(":")[0] for row in rows] == ["load 0", "load 1"]
    assert all(row.endswith("tokens the same") and row.count("%)") == 2 for row in rows)
    assert proc.stdout.rstrip().splitlines()[-1].endswith(" s") and "the reply ended at" in proc.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(affinity.usable()) < 2,
                    reason="the governor reads Linux's /proc/stat, and has nothing to drop on one core")
def test_the_busy_cpu_script_takes_a_thread_a_core_it_may_use(tiny_llama_dir, monkeypatch, capsys):
    """Fewer usable cores than the machine has (taskset, a container's cpuset): a thread for each usable one, where
    one a core of the machine's left the engine no governor (more threads than cores) and the script stopped."""
    spec = importlib.util.spec_from_file_location("busy_cpu", REPO_ROOT / "scripts" / "busy_cpu.py")
    busy_cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(busy_cpu)
    monkeypatch.setattr(os, "cpu_count", lambda: 4 * len(affinity.usable()))
    monkeypatch.setattr(sys, "argv", ["busy_cpu.py", "--target", str(tiny_llama_dir), "--mode", "ar", "--loads", "0",
                                      "--rounds", "1", "--limit", "1", "--max-tokens", "4", "--reply-tokens", "4"])
    busy_cpu.main()
    out = capsys.readouterr().out
    assert f"ar, {len(affinity.usable())} threads" in out and "load 0: governor" in out
