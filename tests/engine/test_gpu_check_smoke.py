"""scripts/gpu_check.py end to end in --smoke mode (tiny shapes, on the CPU): its logic is tested here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--skip-tests", "--json", str(out),
         "--out-dir", str(tmp_path / "pair")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    modes = [r["mode"] for r in report["rows"]]
    assert modes == ["ar", "sd", "ssd", "hf"]
    assert report["goals"]["sd_identical"] and report["goals"]["ssd_identical"]
    assert report["bandwidth_bound_tok_s"] > 0 and report["weight_bytes"] > 0
    assert all(r["decode_tok_s"] > 0 for r in report["rows"])
    assert "of bound" in proc.stdout


def test_gpu_check_refuses_the_cpu_without_smoke():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--smoke" in proc.stderr
