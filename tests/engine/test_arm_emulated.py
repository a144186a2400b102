"""The engine on an emulated AArch64 machine (scripts/arm_emulated.sh: an ARM Python and torch under qemu-user):
it builds and takes the NEON kernels, runs its fused layers, a verify's rows get the logits of one-row decode
steps, and SD's greedy tokens are AR's. Skipped where that environment is not set up (as in CI): about two
minutes here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.engine.test_spec_decode import noisy_copy

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("ARM_ROOT", "/opt/ssd-chat-arm"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT / "sysroot/usr/bin/python3.11").exists() or shutil.which("qemu-aarch64") is None,
                       reason="needs the emulated ARM environment: scripts/arm_emulated.sh setup"),
]

RUN = """
import json, platform, sys
import torch
from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import fused, native
from tests.engine.test_fused import step_logits

model, draft = sys.argv[1:3]
rows_fused = []
forward = fused.forward
fused.forward = lambda *a, **k: (rows_fused.append(a[2].shape[0]), forward(*a, **k))[1]
ids = list(range(3, 19))
with LLM(model, max_model_len=128, enable_prefix_caching=False) as llm:
    step_logits(llm.core.runner, ids, 0, 8)
    verify = step_logits(llm.core.runner, ids, 8, 5)
    decode = torch.cat([step_logits(llm.core.runner, ids, 8 + i, 1) for i in range(5)])
greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
prompts = ["def add(a, b):", "The quick brown fox"]
with LLM(model, max_model_len=256) as llm:
    ar = [o.token_ids for o in llm.generate(prompts, greedy)]
with LLM(model, draft=draft, max_model_len=256, speculation=SpeculationConfig(mode="sd", adaptive_k=False)) as llm:
    sd = llm.generate(prompts, greedy)
print(json.dumps({"machine": platform.machine(), "isa": native.isa(), "rows_fused": rows_fused,
                  "verify_is_decode": torch.equal(verify, decode), "ar": ar, "sd": [o.token_ids for o in sd],
                  "accepted": sum(o.stats.spec.num_accepted for o in sd),
                  "drafted": sum(o.stats.spec.num_drafted for o in sd)}))
"""


def test_the_engine_on_emulated_arm_takes_neon_and_stays_exact(wide_heads_dir, tmp_path):
    draft = noisy_copy(wide_heads_dir, tmp_path / "draft", scale=0.05)  # k = 4: about 40% accepted
    done = subprocess.run([str(REPO / "scripts/arm_emulated.sh"), "python", "-c", RUN, str(wide_heads_dir),
                           str(draft)], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["machine"] == "aarch64" and seen["isa"] == "neon"
    assert 5 in seen["rows_fused"] and 1 in seen["rows_fused"]  # the verify and the decode steps took the fused layers
    assert seen["verify_is_decode"]
    assert seen["sd"] == seen["ar"] and len(seen["ar"][0]) == 24
    assert 0 < seen["accepted"] < seen["drafted"]  # both the accept and the reject path ran
