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


def test_first_divergence_and_the_margin_where_a_mode_left_ar(tmp_path):
    from tests.engine.test_gpu import _gpu_check

    gc = _gpu_check()
    assert gc.first_divergence([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 7], [6, 8]]) == [None, 1, 1]
    pair = gc.build_pair(tmp_path, gc.SMOKE_TARGET, gc.SMOKE_DRAFT, damping=0.05, smoke=True, device="cpu")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair / "target")
    prompt_ids = [tok.encode(p) for p in gc.PROMPTS[:2]]
    hf = gc.hf_row(pair / "target", prompt_ids, "cpu", __import__("torch").float32, 6)
    ar = hf["outputs"]  # transformers' own greedy tokens: at any position its chosen token has the top logit
    other = [list(ar[0]), [*ar[1][:3], (ar[1][3] + 1) % 300, *ar[1][4:]]]
    margins = hf["margins"](ar, other)
    assert margins[0] is None
    assert margins[1]["at"] == 3 and margins[1]["gap"] >= 0 and margins[1]["spacing"] > 0
    assert margins[1]["ar_logit"] - margins[1]["other_logit"] == margins[1]["gap"]


def test_gpu_profile_smoke(tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_profile.py"), "--smoke", "--json", str(out),
         "--out-dir", str(tmp_path / "pair")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    for rows in (1, 5):
        forward = report[f"forward_{rows}"]
        assert forward["ms"] > 0 and forward["kernels"] and all(k["us_per_step"] > 0 for k in forward["kernels"])
    shapes = {tuple(r["shape"]) for r in report["linear"]}
    assert (128, 64) in shapes and {r["rows"] for r in report["linear"]} == {1, 5}  # SMOKE_TARGET's fused qkv
    assert "of the copy bandwidth" in proc.stdout
