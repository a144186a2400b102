"""The chat app's engine process keeps its stderr off the terminal the app draws on (ssd_chat.tui.child_stderr):
a failure's traceback waits in a file until the app has quit; and a killed engine process says how it died."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import SamplingParams
from engine.outputs import TokenDelta
from ssd_chat.tui import child_stderr
from ssd_chat.tui.chat_actions import engine_stopped
from ssd_chat.tui.engine_process import EngineProcess
from tests.ssd_chat.test_engine_process import _alive

MESSAGES = [{"role": "user", "content": "Paris is"}]


def test_a_failures_traceback_waits_for_the_app_to_quit_instead_of_hitting_the_screen(tiny_llama_dir, capfd):
    """QA: a failed request printed its traceback over the chat app's screen (the engine process's stderr was the
    terminal's). capfd holds this process's fd 2, which a spawned child inherits."""
    engine = EngineProcess(str(tiny_llama_dir), max_model_len=128, threads=1)
    try:
        with pytest.raises(RuntimeError, match="AttributeError"):  # (params that are not SamplingParams: a bug)
            list(engine.chat(MESSAGES, "greedy"))  # type: ignore[arg-type]
        tokens = [e for e in engine.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=4))
                  if isinstance(e, TokenDelta)]
        assert tokens  # the engine goes on
    finally:
        engine.close()
    assert "Traceback" not in capfd.readouterr().err
    out = io.StringIO()
    child_stderr.release(out)
    assert "the engine failed" in out.getvalue() and "Traceback" in out.getvalue()
    assert not child_stderr._files  # printed once, the file removed
    child_stderr.release(out)
    assert out.getvalue().count("the engine failed") == 1


def test_a_killed_engine_process_says_which_signal_killed_it(tiny_llama_dir):
    """QA: `kill -9` of the engine process mid-reply read "the engine process stopped (exit code None)": its pipe
    closes a moment before its exit status is there."""
    engine = EngineProcess(str(tiny_llama_dir), max_model_len=512, threads=1)
    try:
        stream = engine.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
        next(e for e in stream if isinstance(e, TokenDelta))
        os.kill(engine._proc.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"^the engine process was killed by SIGKILL$"):
            list(stream)
        assert engine.stop_reason == "the engine process was killed by SIGKILL"
        assert engine_stopped(engine).startswith("the engine process was killed by SIGKILL: /restart")
    finally:
        engine.close()
    child_stderr.release(io.StringIO())


def test_an_engine_process_whose_load_fails_after_its_app_died_removes_its_stderr_file(tmp_path):
    """The app dies (killed) while its engine process loads, and the load then fails (no model there): nobody is
    left to print the engine's stderr file, so the engine process removes it, as it does when its load succeeds.
    It returned quietly and left the file in /tmp."""
    script = textwrap.dedent(f"""
        import os
        from ssd_chat.tui import child_stderr
        from ssd_chat.tui.engine_process import EngineProcess
        engine = EngineProcess.start({str(tmp_path)!r}, threads=1)  # (no config.json there: its load fails)
        print(engine._proc.pid, child_stderr._files[-1], flush=True)
        os._exit(0)  # the app dies without closing it (nor printing its engine's stderr file)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})  # (returns once the engine process has ended)
    pid, stderr_file = out.stdout.split()
    assert not _alive(int(pid))
    assert not Path(stderr_file).exists()
