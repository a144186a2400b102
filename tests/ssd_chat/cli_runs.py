"""Helpers of the CLI tests: the real entry point in a fresh process, and the engine's own greedy reply."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import LLM, SamplingParams
from engine.outputs import RequestFinished

REPO_ROOT = Path(__file__).resolve().parents[2]
BUFFERED_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout as a user's: buffered


def greedy_chat(model_dir: Path, prompt: str, max_tokens: int):
    llm = LLM(target=str(model_dir))
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        events = list(llm.chat([{"role": "user", "content": prompt}], params))
    finally:
        llm.close()
    assert isinstance(events[-1], RequestFinished)
    return events[-1].output


def run_ssd_chat(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real entry point in a fresh process: the exit code and stderr the user sees."""
    return subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args], cwd=REPO_ROOT, input=stdin, capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, timeout=120,
    )
