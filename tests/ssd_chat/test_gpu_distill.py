"""scripts/gpu_distill.py (the GPU recipe) on the CPU: its batched decoding against one-prompt decoding, its
sampling nucleus, its held-out filter, and a whole --smoke run on a tiny target ending in loadable drafts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def gd():
    spec = importlib.util.spec_from_file_location("gpu_distill", ROOT / "scripts" / "gpu_distill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_target(tiny_llama_dir):
    from ssd_chat.distill_model import load_target

    return load_target(tiny_llama_dir)


def test_left_padded_batch_decodes_each_prompt_as_alone(gd, tiny_target):
    prompts = [[5, 9, 13], [7, 2, 8, 31, 4, 6, 19], [11]]
    batched = gd.decode(tiny_target, prompts, 12, pad_id=0)
    for prompt, row in zip(prompts, batched, strict=True):
        ids = torch.tensor([prompt])
        for _ in range(12):  # no cache, no padding: the plain greedy continuation
            ids = torch.cat([ids, tiny_target(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert row == ids[0, len(prompt):].tolist()


def test_rows_end_at_their_stop_token(gd, tiny_target):
    prompts = [[5, 9, 13], [7, 2, 8]]
    full = gd.decode(tiny_target, prompts, 10, pad_id=0)
    stop = full[0][3]  # a token row 0 writes: it must end there, stop included
    rows = gd.decode(tiny_target, prompts, 10, pad_id=0, stop_id=stop)
    for whole, row in zip(full, rows, strict=True):
        cut = whole.index(stop) + 1 if stop in whole else len(whole)
        assert row == whole[:cut]


def test_top_p_samples_stay_in_the_nucleus(gd):
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, -2.0]]).repeat(200, 1)
    generator = torch.Generator().manual_seed(0)
    tokens = gd._pick(logits, 1.0, 0.5, generator)
    assert set(tokens.tolist()) == {0}  # token 0 alone holds 0.7 > 0.5 of the mass
    tokens = gd._pick(logits, 1.0, 0.9, generator)
    assert set(tokens.tolist()) == {0, 1}  # 0.70 + 0.26: the next ones are outside
    assert gd._pick(logits[:1], 0.0, 1.0, None).tolist() == [0]


def test_held_out_runs_are_banned(gd):
    banned = gd.held_out_shingles()
    assert ("explain", "in", "two", "sentences", "why") in banned  # chat.jsonl's second prompt
    assert all(len(run) == gd.SHINGLE for run in banned)


def test_smoke_run_writes_drafts_that_load_and_learn(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_distill.py"), "--smoke", "--target", str(tiny_llama_dir),
         "--out", str(out), "--max-prompts", "40", "--self-prompts", "8", "--sample-batch", "8", "--reply-batch",
         "16", "--max-tokens", "24", "--eval-prompts", "4", "--head-vocab", "200", "--layers", "1", "--batch-size",
         "4", "--budget-s", "5", "--prompts-s", "2", "--replies-s", "60", "--min-steps", "150"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    # 40 prompts, 4 held out, plus what self-prompts the tiny target wrote (usually none)
    assert 36 <= summary["train_examples"] <= 36 + summary["self_prompts"]
    (draft,) = summary["drafts"]
    assert draft["layers"] == 1 and draft["steps"] >= 150
    assert draft["agreement"] > draft["agreement_before"]
    from ssd_chat.distill_model import load_hf_draft

    model = load_hf_draft(out / "draft-L1", tiny_llama_dir)
    assert model.config.num_hidden_layers == 1
    assert json.loads((out / "draft-L1" / "config.json").read_text())["reduced_head"] is True
