"""Compare on the real engine and its prefix cache: every row starts from the same cached prompt, and the
chat's last reply is still cached afterwards (the rows write their replies where it was)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from engine.config import SpeculationConfig
from engine.llm import LLM
from engine.outputs import RequestFinished, RequestOutput
from engine.sampling_params import SamplingParams
from ssd_chat.tui.compare import decoding, replay_params, run_compare
from tests.ssd_chat.tui_fakes import FakeEngine

SAMPLED = SamplingParams(temperature=0.8, max_tokens=40, seed=1, ignore_eos=True)
PROMPT = [{"role": "user", "content": "Tell me a story about a cat who lives on a boat and a dog who does not."}]


def _finish(events) -> RequestOutput:
    return [e for e in events if isinstance(e, RequestFinished)][-1].output


@pytest.fixture
def llm(tiny_llama_dir):
    model = str(tiny_llama_dir)
    engine = LLM(target=model, draft=model, speculation=SpeculationConfig(mode="sd", k=3))
    yield engine
    engine.close()


def _recorded(llm: LLM) -> list[RequestOutput]:
    """Every request's output from now on (the compare's warm-ups, rows and restore)."""
    outputs: list[RequestOutput] = []
    chat = llm.chat

    def recording(messages, params=None, *, cancel=None):
        for event in chat(messages, params, cancel=cancel):
            if isinstance(event, RequestFinished):
                outputs.append(event.output)
            yield event

    llm.chat = recording  # type: ignore[method-assign]
    return outputs


def test_the_next_turn_after_a_compare_reuses_the_reply_as_it_would_without_one(llm):
    reply = _finish(llm.chat(PROMPT, SAMPLED)).text
    conversation = [*PROMPT, {"role": "assistant", "content": reply}]
    following = [*conversation, {"role": "user", "content": "And then?"}]
    old, new = llm.encode_chat(conversation), llm.encode_chat(following)
    common = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), len(old))
    block = llm.config.block_size
    report = run_compare(llm, PROMPT, max_tokens=24, cancel=threading.Event(), keep=conversation)
    assert [r.mode for r in report.rows] == ["ar", "sd", "ssd"] and report.identical
    stats = _finish(llm.chat(following, SAMPLED)).stats
    assert common >= 3 * block  # (the reply shares whole blocks with the next turn)
    assert stats.reused_prefix_tokens == common // block * block  # every whole block of the shared prefix
    assert stats.spec is not None and stats.spec.draft_reused_prefix_tokens == stats.reused_prefix_tokens


def test_every_row_reads_the_same_cached_prompt_even_on_a_cold_cache(llm):
    """A prompt never sent (a resumed chat): without the warm-up, AR (first) would prefill all of it."""
    outputs = _recorded(llm)
    report = run_compare(llm, PROMPT, max_tokens=24, cancel=threading.Event())
    rows = outputs[-3:]
    assert [r.stats.mode for r in rows] == ["ar", "sd", "ssd"] and report.identical
    prompt_tokens = rows[0].stats.prompt_tokens
    assert prompt_tokens > 2 * llm.config.block_size
    assert {r.stats.prefill_tokens for r in rows} == {prompt_tokens % llm.config.block_size or llm.config.block_size}
    assert [o.stats.generated_tokens for o in outputs[:3]] == [2, 2, 2]  # the warm-ups: a step after the prefill


def test_a_sampled_chat_compares_one_seeded_reply_in_every_mode(llm):
    """A chat that samples replays at its own sampling, one seed for every row: the coupled race gives AR's reply in
    SD and SSD too (and a greedy chat replays greedily)."""
    outputs = _recorded(llm)
    unseeded = replace(SAMPLED, seed=None)
    params = replay_params(unseeded, 24)
    assert (params.temperature, params.sampler, params.max_tokens) == (0.8, "coupled", 24) and params.seed is not None
    assert replay_params(unseeded, 24).seed != params.seed  # a fresh seed each compare...
    assert replay_params(SAMPLED, 24).seed == SAMPLED.seed  # ...unless the chat has one (/seed): its reply again
    assert replay_params(SamplingParams(temperature=0.0), 24).is_greedy and replay_params(None, 24).is_greedy
    report = run_compare(llm, PROMPT, max_tokens=24, cancel=threading.Event(), params=params)
    assert [r.mode for r in report.rows] == ["ar", "sd", "ssd"] and report.identical
    rows = outputs[3:6]  # (after the three warm-ups)
    assert {o.stats.mode for o in rows} == {"ar", "sd", "ssd"} and all(o.stats.generated_tokens == 24 for o in rows)
    greedy = run_compare(llm, PROMPT, max_tokens=24, cancel=threading.Event())
    assert greedy.rows[0].token_ids != report.rows[0].token_ids  # (the test tells sampled replays from greedy ones)
    assert decoding(params) == f"sampled at 0.8, seed {params.seed}" and decoding(replay_params(None, 8)) == "greedy"


def test_a_reply_the_context_limit_cut_is_not_put_back():
    """QA: a compare after a reply that filled the context failed at its end (the restore's prompt, with the next
    turn's header, passed the limit), with no verdict though every row had finished."""
    engine = FakeEngine(max_model_len=40)
    prompt = [{"role": "user", "content": "hi"}]
    full = [*prompt, {"role": "assistant", "content": "word " * 34}]  # 5 + 37 tokens: over the context
    report = run_compare(engine, prompt, max_tokens=8, cancel=threading.Event(), keep=full)
    assert [r.mode for r in report.rows] == ["ar", "sd", "ssd"] and report.identical
    assert len(engine.calls) == 6  # three warm-ups, three rows: no restore
    run_compare(engine, prompt, max_tokens=8, cancel=threading.Event(), keep=[*prompt, full[1] | {"content": "ok"}])
    assert len(engine.calls) == 13 and len(engine.calls[-1][0]) == 2  # one that fits is put back

