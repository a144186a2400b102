"""scripts/ab_decode.py end to end on a tiny model: every variant runs each repeat and is compared with the first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_decode.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)  # HF_HUB_OFFLINE from conftest


@pytest.mark.slow  # compiles the tiny pair's graphs
def test_ab_decode_reports_every_variant_and_their_tokens(tiny_llama_dir):
    proc = _run("--target", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--mode", "sd", "--variants",
                "eager,compile-panel", "--repeats", "2", "--limit", "2", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("sd ")]
    assert len(rows) == 2 and all(line.endswith("tokens = eager's: True") for line in rows)  # compiled = eager
    assert all(len(re.search(r"\(([\d. ]+)\)", line).group(1).split()) == 2 for line in rows)  # one rate a repeat


def test_ab_decode_runs_the_avx2_build_and_no_kernels_beside_the_default(tiny_llama_dir):
    """The AVX2 build's tokens are the default build's (the same bits); none of our kernels: MKL's / oneDNN's."""
    proc = _run("--target", str(tiny_llama_dir), "--mode", "ar", "--variants", "eager,avx2,no-kernels", "--repeats",
                "1", "--limit", "2", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("ar ")}
    assert set(rows) == {"eager", "avx2", "no-kernels"}
    assert rows["avx2"].endswith("tokens = eager's: True")
    assert all(float(re.search(r"median +([\d.]+)", line).group(1)) > 0 for line in rows.values())


def test_ab_decode_refuses_an_unknown_variant(tiny_llama_dir):
    proc = _run("--target", str(tiny_llama_dir), "--variants", "eager,turbo")
    assert proc.returncode == 2 and "unknown variant 'turbo'" in proc.stderr
