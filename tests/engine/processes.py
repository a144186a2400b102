"""Helpers of the process tests: a draft beside the tiny target, the core for SSD's draft process, a greedy run's
tokens in a mode, and a step cut by a second Ctrl-C."""

from __future__ import annotations

import time

import pytest

from engine import LLM, SamplingParams, affinity
from engine.config import SpeculationConfig
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True)
TWO_CORES = affinity.can_pin() and len(affinity.usable()) >= 2
DRAFT_CORE = "cpu:1" if TWO_CORES else "cpu:0"


@pytest.fixture(scope="module")
def draft_dir(tiny_llama_dir, tmp_path_factory):
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("proc") / "mild", scale=0.1, seed=3)


def outputs(llm: LLM, spec: SpeculationConfig, params=GREEDY) -> list[list[int]]:
    llm.speculation = spec
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def cut_step_then_close(llm: LLM) -> None:
    """A request whose step the caller's patch cuts with a KeyboardInterrupt (a second Ctrl-C): it raises it, the
    engine refuses the next request with one line, and its close takes under 5 s."""
    from engine.errors import EngineError

    try:
        with pytest.raises(KeyboardInterrupt):
            list(llm.stream(PROMPTS[0], GREEDY))
        with pytest.raises(EngineError, match="second Ctrl-C"):
            llm.generate(PROMPTS[0], GREEDY)
    finally:
        started = time.perf_counter()
        llm.close()
    assert time.perf_counter() - started < 5
