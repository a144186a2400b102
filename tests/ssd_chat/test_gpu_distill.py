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
def hf_decode(gd):
    """scripts/hf_decode.py, gpu_distill's batched decoding (gd put scripts/ on the path)."""
    return importlib.import_module("hf_decode")


@pytest.fixture(scope="module")
def tiny_target(tiny_llama_dir):
    from ssd_chat.distill_model import load_target

    return load_target(tiny_llama_dir)


def test_left_padded_batch_decodes_each_prompt_as_alone(hf_decode, tiny_target):
    prompts = [[5, 9, 13], [7, 2, 8, 31, 4, 6, 19], [11]]
    batched = hf_decode.decode(tiny_target, prompts, 12, pad_id=0)
    for prompt, row in zip(prompts, batched, strict=True):
        ids = torch.tensor([prompt])
        for _ in range(12):  # no cache, no padding: the plain greedy continuation
            ids = torch.cat([ids, tiny_target(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert row == ids[0, len(prompt):].tolist()


def test_rows_end_at_their_stop_token(hf_decode, tiny_target):
    prompts = [[5, 9, 13], [7, 2, 8]]
    full = hf_decode.decode(tiny_target, prompts, 10, pad_id=0)
    stop = full[0][3]  # a token row 0 writes: it must end there, stop included
    rows = hf_decode.decode(tiny_target, prompts, 10, pad_id=0, stop_id=stop)
    for whole, row in zip(full, rows, strict=True):
        cut = whole.index(stop) + 1 if stop in whole else len(whole)
        assert row == whole[:cut]


def test_top_p_samples_stay_in_the_nucleus(hf_decode):
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, -2.0]]).repeat(200, 1)
    generator = torch.Generator().manual_seed(0)
    tokens = hf_decode._pick(logits, 1.0, 0.5, generator)
    assert set(tokens.tolist()) == {0}  # token 0 alone holds 0.7 > 0.5 of the mass
    tokens = hf_decode._pick(logits, 1.0, 0.9, generator)
    assert set(tokens.tolist()) == {0, 1}  # 0.70 + 0.26: the next ones are outside
    assert hf_decode._pick(logits[:1], 0.0, 1.0, None).tolist() == [0]


def test_held_out_runs_are_banned(gd):
    banned = gd.held_out_shingles()
    assert ("explain", "in", "two", "sentences", "why") in banned  # chat.jsonl's second prompt
    assert all(len(run) == importlib.import_module("make_self_prompts").SHINGLE for run in banned)
    assert gd.shares_run("Please EXPLAIN in two sentences why cats nap.", banned)
    assert not gd.shares_run("Explain in three sentences why", banned)


def test_the_shipped_gpu_self_prompts_stay_clear_of_the_held_out_sets(gd):
    from ssd_chat.prompts import PROMPTS_DIR, load_prompts

    texts = [messages[-1]["content"] for messages in load_prompts(PROMPTS_DIR / "distill-gpu-self.jsonl")]
    banned = gd.held_out_shingles()
    assert len(texts) > 10_000 and len(set(texts)) == len(texts)
    assert not [text for text in texts if gd.shares_run(text, banned)]


def test_self_prompts_are_sampled_and_filtered(gd, tiny_target, tiny_llama_dir):
    from engine.startup import load_tokenizer

    tokenizer = load_tokenizer(tiny_llama_dir)
    kept = gd.self_prompts(tiny_target, tokenizer, 4, batch=8, seed=0, pad_id=0, stop_id=1, clock=gd.Clock(60),
                           until_s=0.5)  # the first batch always runs; a random model rarely writes a keepable one
    assert len(kept) <= 4 and all(gd.keep(text) for text in kept)


def test_smoke_run_writes_drafts_that_load_and_learn(tiny_llama_dir, tmp_path):
    """Two drafts, the second trained after the first is saved (which must leave the target as it was)."""
    out = tmp_path / "out"
    own = tmp_path / "self.jsonl"
    own.write_text("".join(json.dumps({"prompt": f"Write a short note about topic number {i}."}) + "\n"
                           for i in range(3)) + json.dumps({"prompt": "Explain in two sentences why snow melts."}))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_distill.py"), "--smoke", "--target", str(tiny_llama_dir),
         "--out", str(out), "--max-prompts", "40", "--self-prompts-file", str(own), "--reply-batch",
         "16", "--max-tokens", "24", "--eval-prompts", "4", "--head-vocab", "200", "--layers", "1,2", "--batch-size",
         "4", "--budget-s", "5", "--prompts-s", "2", "--replies-s", "60", "--min-steps", "150"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    # 40 prompts, 4 held out, plus the file's prompts but the one that shares a run with a held-out prompt
    assert summary["self_prompts"] == 3 and summary["train_examples"] == 36 + 3
    assert [d["layers"] for d in summary["drafts"]] == [1, 2]
    from ssd_chat.distill_model import load_hf_draft

    for draft in summary["drafts"]:
        assert draft["steps"] >= 150
        model = load_hf_draft(out / f"draft-L{draft['layers']}", tiny_llama_dir)
        assert model.config.num_hidden_layers == draft["layers"]
    assert summary["drafts"][0]["agreement"] > summary["drafts"][0]["agreement_before"]  # (2 layers: the target)
