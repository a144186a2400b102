"""The TUI on the real engine (a tiny random model as its own draft), and the real `ssd-chat` command
in a real terminal under tmux (skipped where tmux is absent)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.outputs import RequestFinished
from ssd_chat.history import ChatSettings, HistoryStore
from ssd_chat.tui.app import ChatApp
from ssd_chat.tui.screens.compare import CompareScreen
from ssd_chat.tui.screens.loading import LoadingScreen
from ssd_chat.tui.widgets.transcript import AssistantMessage
from tests.ssd_chat.tui_fakes import rendered, send, settle, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.asyncio
async def test_the_app_on_the_real_engine(tiny_llama_dir, tmp_path, monkeypatch):
    model = str(tiny_llama_dir)
    llm = LLM(target=model)
    expected = [e for e in llm.chat([{"role": "user", "content": "Paris is"}],
                                    SamplingParams(temperature=0, max_tokens=8))][-1]
    llm.close()
    assert isinstance(expected, RequestFinished)

    loading_lines: list[str] = []
    add_line = LoadingScreen.add_line

    def record(screen: LoadingScreen, line: str) -> None:
        loading_lines.append(line)
        add_line(screen, line)

    monkeypatch.setattr(LoadingScreen, "add_line", record)
    settings = ChatSettings(mode="ssd", k=3, temperature=0.0, max_tokens=8)
    fixed = SpeculationConfig(mode="ssd", k=3, adaptive_k=False)  # (adaptive, a reply this short may all pause)
    app = ChatApp(lambda: LLM(target=model, draft=model, speculation=fixed), settings=settings,
                  store=HistoryStore(tmp_path / "h.sqlite3"), target=model, draft=model, export_dir=tmp_path,
                  speculation=fixed)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None, timeout=60, what="the models to load")
        assert any(line.startswith("loading draft") for line in loading_lines)
        await send(app, pilot, "Paris is")
        reply = app.query(AssistantMessage).last()
        assert reply.text == expected.output.text  # greedy SSD == greedy AR, through the whole UI
        assert "cache hits" in rendered(app.query_one("#spec"))
        assert "target" in rendered(app.query_one("#layout")) and "draft" in rendered(app.query_one("#layout"))
        await pilot.press("ctrl+r")
        await settle(app, pilot, timeout=60)
        assert isinstance(app.screen, CompareScreen)
        assert "token-identical: yes" in rendered(app.screen.query_one("#compare-status"))
        await pilot.press("escape")
        await app.action_quit()


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_screen(session: str, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-t", session, "-p")
        if re.search(pattern, screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never showed up; the screen:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_ssd_chat_in_a_real_terminal(tiny_llama_dir, tmp_path):
    session = f"ssd-chat-test-{os.getpid()}"
    env = {"HF_HUB_OFFLINE": "1", "SSD_CHAT_DATA": str(tmp_path / "data"), "TERM": "xterm-256color",
           "PYTHONPATH": str(REPO_ROOT)}
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    command = (f"cd {REPO_ROOT} && env -u COLUMNS -u LINES {exports} {sys.executable} -m ssd_chat"
               f" --target {tiny_llama_dir} --draft {tiny_llama_dir} --mode sd --k 3 --temperature 0 --max-tokens 12;"
               f" echo EXIT=$?; sleep 30")
    _tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "45", command)
    try:
        _wait_screen(session, r"Message \(Enter sends", timeout=90)
        _tmux("send-keys", "-t", session, "Paris is", "Enter")
        _wait_screen(session, r"12 tokens · prefix reused", timeout=60)
        screen = _wait_screen(session, r"SD  tau", timeout=30)  # the stats panel can repaint a frame later (CI)
        assert "you" in screen and "Paris is" in screen and "12 tokens · prefix reused" in screen
        assert "SD  tau" in screen and "accepted 100%" in screen  # the panel, read off the terminal
        assert "device layout" in screen and "TP=1" in screen
        _tmux("send-keys", "-t", session, "C-q")
        screen = _wait_screen(session, r"EXIT=\d+", timeout=30)
        assert "EXIT=0" in screen and "Traceback" not in screen
        history = HistoryStore(tmp_path / "data" / "history.sqlite3")
        assert [s.title for s in history.list()] == ["Paris is"]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
