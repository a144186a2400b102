"""scripts/attention_calls.py end to end on a small shape: a line of times for each row count, one a thread count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.layers import panel

ROOT = Path(__file__).parents[2]


@pytest.mark.skipif(not panel.available(), reason="needs the CPU kernels (AVX-512, AVX2 or NEON and a compiler)")
@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
def test_attention_calls_times_every_row_count_at_every_thread_count(half):
    args = ["--keys", "300", "--layers", "2", "--rows", "1,5,17", "--threads", "1,2", "--repeats", "2"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "attention_calls.py"), *args,
                           *(["--half"] if half else [])], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert ("half cache" if half else "float32 cache") in lines[0]
    assert lines[1].split() == ["rows", "1", "thread", "2", "threads"]
    table = [line.split() for line in lines[2:]]
    assert [row[0] for row in table] == ["1", "5", "17"]
    assert all(len(row) == 3 and all(float(ms) > 0 for ms in row[1:]) for row in table)
