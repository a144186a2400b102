"""Chunked prefill: a long prompt prefills a chunk a step, reports its progress, can be cancelled between chunks,
and changes no output (greedy tokens, seeded draws) in any mode."""

from __future__ import annotations

import threading

import pytest

from engine import LLM, FinishReason, PrefillProgress, RequestFinished, SamplingParams, TokenDelta
from engine.config import SpeculationConfig
from engine.draft_server import START, _Server, encode_start
from engine.errors import InvalidParameterError
from engine.sequence import Sequence
from tests.engine.processes import DRAFT_CORE
from tests.engine.test_llm import hf_greedy
from tests.engine.test_spec_decode import noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
LONG = [(7 * i + 3) % 300 + 5 for i in range(100)]  # 100 prompt tokens: 15 chunks of 7
SHORT = [5, 17, 42, 99, 7]
CHUNK = 7  # not a multiple of the block size (4): chunks end mid-block


@pytest.fixture(scope="module")
def draft_dir(tiny_llama_dir, tmp_path_factory):
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("chunked") / "mild", scale=0.1, seed=3)


@pytest.fixture(scope="module")
def chunked(tiny_llama_dir, draft_dir) -> LLM:
    return LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, prefill_chunk_tokens=CHUNK)


@pytest.fixture(scope="module")
def whole(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, prefill_chunk_tokens=256)


def _events(llm: LLM, prompt, params=GREEDY, cancel=None) -> list:
    return list(llm.stream(prompt, params, cancel=cancel))


def test_a_chunked_prompt_gives_the_tokens_of_a_whole_one_and_of_transformers(chunked, whole, tiny_llama_dir):
    chunked.speculation = SpeculationConfig(mode="ar")
    before = chunked.num_forward_tokens
    out = chunked.generate([LONG], GREEDY)[0]
    assert chunked.num_forward_tokens - before == len(LONG) + GREEDY.max_tokens - 1  # each token went through once
    assert out.token_ids == whole.generate([LONG], GREEDY)[0].token_ids
    assert out.token_ids == hf_greedy(tiny_llama_dir, LONG, GREEDY.max_tokens)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculative_modes_after_a_chunked_prefill_equal_ar(chunked, mode):
    chunked.speculation = SpeculationConfig(mode="ar")
    want = [o.token_ids for o in chunked.generate([LONG, SHORT], GREEDY)]
    chunked.speculation = SpeculationConfig(mode=mode, k=3)
    outs = chunked.generate([LONG, SHORT], GREEDY)  # batched: the short prompt waits for the long one's chunks
    assert [o.token_ids for o in outs] == want
    assert all(o.stats.spec.num_drafted > 0 for o in outs)


def test_seeded_sampling_draws_the_same_tokens_chunked_or_whole(chunked, whole):
    chunked.speculation = SpeculationConfig(mode="ar")
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=11, ignore_eos=True)
    assert chunked.generate([LONG], params)[0].token_ids == whole.generate([LONG], params)[0].token_ids


def test_a_long_prompt_reports_its_progress_a_chunk_at_a_time(chunked):
    chunked.speculation = SpeculationConfig(mode="ar")
    chunked.core.blocks.by_hash.clear()  # no prefix from the other tests
    events = _events(chunked, LONG)
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenDelta))
    assert [(p.done, p.total) for p in progress] == [(n, len(LONG)) for n in range(CHUNK, len(LONG), CHUNK)]
    assert all(isinstance(e, PrefillProgress) for e in events[:first_token])
    assert not any(isinstance(e, PrefillProgress) for e in _events(chunked, SHORT))  # one chunk: nothing to report


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_cancel_between_chunks_stops_the_prefill_and_keeps_its_prefix(chunked, mode):
    """In every mode: SD's and in-process SSD's draft prefills each chunk with the target, so it stops there too."""
    chunked.speculation = SpeculationConfig(mode=mode, k=3)
    chunked.core.blocks.by_hash.clear()
    draft = chunked.core.drafter
    draft.blocks.by_hash.clear()
    prompt = [t + 1 for t in LONG]
    cancel, events = threading.Event(), []
    before, draft_before = chunked.num_forward_tokens, draft.runner.num_forward_tokens
    for event in chunked.stream(prompt, GREEDY, cancel=cancel):
        events.append(event)
        if isinstance(event, PrefillProgress) and event.done >= 3 * CHUNK:
            cancel.set()
    out = events[-1].output
    assert out.finish_reason is FinishReason.CANCELLED and out.token_ids == []
    assert chunked.num_forward_tokens - before == 3 * CHUNK  # three chunks ran, then nothing
    assert draft.runner.num_forward_tokens - draft_before == (0 if mode == "ar" else 3 * CHUNK)
    assert chunked.core.blocks.num_free_blocks == len(chunked.core.blocks.blocks)
    assert draft.blocks.num_free_blocks == len(draft.blocks.blocks)
    again = chunked.generate([prompt], GREEDY)[0]  # the chunks' full blocks stay in the prefix cache
    assert again.stats.reused_prefix_tokens == 3 * CHUNK // 4 * 4
    if mode != "ar":  # and the draft's too
        assert again.stats.spec.draft_reused_prefix_tokens == 3 * CHUNK // 4 * 4


def test_a_draft_process_prefills_while_the_target_chunks_and_frees_all_on_cancel(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1, prefill_chunk_tokens=CHUNK) as llm:
        llm.speculation = SpeculationConfig(mode="ar")
        want, want_reversed = (o.token_ids for o in llm.generate([LONG, LONG[::-1]], GREEDY))
        llm.speculation = SpeculationConfig(mode="ssd", k=3)
        assert llm.generate([LONG], GREEDY)[0].token_ids == want
        cancel = threading.Event()
        for event in llm.stream([t + 2 for t in LONG], GREEDY, cancel=cancel):
            if isinstance(event, PrefillProgress):
                cancel.set()
            last = event
        assert isinstance(last, RequestFinished) and last.output.finish_reason is FinishReason.CANCELLED
        free, total, live = llm.remote.stats()
        assert (free, live) == (total, 0)
        # a one-token reply ends while the draft process still prefills its prompt (compare's warm-up): the next
        # requests, on the same prompt (the draft's prefix cache) and on another one, are still AR's tokens
        one = llm.generate([LONG[::-1]], SamplingParams(temperature=0.0, max_tokens=1))[0]
        assert one.token_ids == want_reversed[:1]
        assert [o.token_ids for o in (llm.generate([LONG[::-1]], GREEDY)[0], llm.generate([LONG], GREEDY)[0])] \
            == [want_reversed, want]
        free, total, live = llm.remote.stats()
        assert (free, live) == (total, 0)


def test_the_chunk_must_be_positive(tiny_llama_dir):
    with pytest.raises(InvalidParameterError, match="prefill_chunk_tokens must be >= 1"):
        LLM(str(tiny_llama_dir), prefill_chunk_tokens=0)


def test_the_draft_process_prefills_a_prompt_in_the_targets_chunks():
    calls = []

    class Recorder:  # the draft side of the draft process: records how far each call prefills
        def start(self, seqs, *, upto):
            calls.append({seq.seq_id: upto[seq] for seq in seqs})
            return {seq: 3 for seq in seqs if upto[seq] == len(seq.token_ids)}

    server = _Server(Recorder(), channel=None, prefill_chunk=CHUNK)
    msg = [START, 2]
    for seq_id, prompt in ((1, LONG), (2, SHORT)):
        msg += encode_start(Sequence(seq_id, prompt, GREEDY), draft_seed=0)
    server._start(msg)
    server.reused |= server.prefills.settle()  # (the loop runs these chunks between the leader's messages)
    # CHUNK tokens a forward, the prompts together: the short one rides with the long one's last 2 tokens
    assert calls == [{1: end} for end in range(CHUNK, len(LONG), CHUNK)] + [{1: len(LONG), 2: len(SHORT)}]
    assert server.reused == {1: 3, 2: 3}  # what the call that finished each prompt reported
