"""SSD: the speculation cache really hits, misses fall back just in time, and greedy output equals AR."""

from __future__ import annotations

import itertools

import pytest

from engine import LLM, FinishReason, SamplingParams, TokenDelta
from engine.config import SpeculationConfig
from engine.errors import InvalidParameterError
from engine.outputs import TokenSource
from engine.sequence import Sequence
from engine.spec_policy import AcceptanceEstimate, adaptive_fanout, default_fanout
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True)


@pytest.fixture(scope="module")
def mild_draft_dir(tiny_llama_dir, tmp_path_factory):
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("ssd") / "mild", scale=0.1, seed=3)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, mild_draft_dir) -> LLM:
    return LLM(str(tiny_llama_dir), draft=str(mild_draft_dir), max_model_len=256, block_size=4)


def ar_outputs(llm: LLM, params=GREEDY) -> list[list[int]]:
    llm.speculation = SpeculationConfig(mode="ar")
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize(("k", "fanout"), [(1, None), (2, (1,)), (4, None), (4, (3, 2, 2, 1, 4)), (6, (2,))])
def test_greedy_ssd_equals_ar(llm, k, fanout):
    want = ar_outputs(llm)
    llm.speculation = SpeculationConfig(mode="ssd", k=k, fanout=fanout, adaptive_k=False)  # (adaptive: may pause)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == want
    hits = sum(o.stats.spec.num_cache_hits for o in outs)
    steps = sum(o.stats.spec.num_steps for o in outs)
    assert 0 < hits < steps  # both hits and misses happened


def test_correlated_pair_hits_every_round_after_the_first(tiny_llama_dir):
    # float32: the draft is the target (int8 weights draw other tokens at the random model's near-ties: on a Zen 1,
    # whose int8 drafts run on fbgemm, 8 hits in 10 rounds)
    same = LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=256, block_size=4, draft_weights="float32")
    # (adaptive, the in-process SSD may pause: it builds its cache in the target's time, and k = 0 can pay best)
    same.speculation = SpeculationConfig(mode="ssd", k=3, adaptive_k=False)
    events = list(same.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True)))
    out = events[-1].output
    spec = out.stats.spec
    assert spec.num_cache_hits == spec.num_steps - 1  # the first round has no cache yet
    sources = [s for e in events if isinstance(e, TokenDelta) for s in e.sources]
    assert TokenSource.ACCEPTED_HIT in sources and TokenSource.ACCEPTED_MISS not in sources


def test_the_lookups_token_is_a_candidate_after_all_accepted(tiny_llama_dir, mild_draft_dir, monkeypatch):
    """After all k accepted, a greedy request's context-lookup token gets a branch of its own beside the draft's
    top F_K (where they differ); with F_K = 0 there is no branch at all (an empty cache stays empty). The
    lookup is replaced by a fixed rule (a tiny random model's text seldom repeats itself)."""
    fresh = LLM(str(tiny_llama_dir), draft=str(mild_draft_dir), max_model_len=256, block_size=4)
    drafter, k = fresh.core.drafter, 4
    seq = Sequence(998, [5, 9, 33, 71, 5, 9, 33, 8, 5, 9, 33, 71, 5], GREEDY)
    drafter.start([seq])
    seq.token_ids.append(7)  # the target's first token
    try:
        proposal = drafter.propose({seq: k}, None)[seq]
        keys = {}
        for guess in (11, 12):
            monkeypatch.setattr(drafter.lookups, "guess", lambda *_, g=guess: g)
            for lookup, width in ((False, 1), (True, 1), (True, 0)):
                drafter.build_cache({seq: proposal}, (0,) * k + (width,), None, lookup=lookup)
                keys[guess, lookup, width] = set(drafter.cache[seq.seq_id])
    finally:
        drafter.finish(seq)
        fresh.close()
    top = keys[11, False, 1]
    assert len(top) == 1 and all(j == k for j, _ in top)  # only the draft's top token after all accepted
    guess = 11 if (k, 11) not in top else 12
    assert keys[guess, True, 1] == top | {(k, guess)}
    assert keys[11, True, 0] == keys[12, True, 0] == set()


def test_forced_misses_still_exact(llm):
    want = ar_outputs(llm)
    # an empty cache: every round misses (the lookup on: its branch after all accepted needs F_K > 0 too)
    llm.speculation = SpeculationConfig(mode="ssd", k=3, fanout=(0,))
    events = [list(llm.stream(p, GREEDY)) for p in PROMPTS]
    outs = [e[-1].output for e in events]
    assert [o.token_ids for o in outs] == want
    assert all(o.stats.spec.num_cache_hits == 0 for o in outs)
    sources = {s for e in events for d in e if isinstance(d, TokenDelta) for s in d.sources}
    assert TokenSource.ACCEPTED_MISS in sources and TokenSource.ACCEPTED_HIT not in sources


def test_near_the_context_limit(tiny_llama_dir, mild_draft_dir):
    small = LLM(str(tiny_llama_dir), draft=str(mild_draft_dir), max_model_len=30, block_size=4, k=4)
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    prompt = list(range(1, 12))
    small.speculation = SpeculationConfig(mode="ssd", k=4)
    got = small.generate([prompt], params)[0]
    small.speculation = SpeculationConfig(mode="ar")
    want = small.generate([prompt], params)[0]
    assert got.token_ids == want.token_ids and got.finish_reason is FinishReason.CONTEXT


def test_cancel_frees_scratch_and_cache(llm):
    llm.speculation = SpeculationConfig(mode="ssd", k=4)
    drafter = llm.core.drafter
    stream = llm.stream("Paris is", SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))
    for _ in range(4):
        next(stream)
    assert drafter.region and drafter.blocks.num_free_blocks < len(drafter.blocks.blocks)
    stream.close()
    assert not drafter.region and not drafter.cache and not drafter.seqs
    assert len(drafter.free_regions) == llm.config.max_num_seqs
    assert drafter.blocks.num_free_blocks == len(drafter.blocks.blocks)


def test_default_fanout_is_geometric_with_a_large_all_accepted_share():
    f = default_fanout(4, budget=15)
    assert len(f) == 5 and all(a >= b for a, b in itertools.pairwise(f[:4])) and f[4] >= f[0]
    with pytest.raises(InvalidParameterError):
        SpeculationConfig(mode="ssd", k=4, fanout=(1, 2))


def test_fanout_follows_the_measured_acceptance():
    weak, strong = AcceptanceEstimate(), AcceptanceEstimate()
    assert weak.value == strong.value == AcceptanceEstimate.PRIOR
    for _ in range(30):
        weak.update(4, 0)    # rejected at the first token every round
        strong.update(4, 4)  # all accepted every round
        strong.update(0, 0)  # no draft (e.g. at the context limit): no evidence
    assert weak.value < 0.05 and strong.value > 0.95
    low, high = adaptive_fanout(4, [weak]), adaptive_fanout(4, [strong])
    assert low == default_fanout(4, acceptance=0.1) and high == default_fanout(4, acceptance=0.9)
    assert low[0] > high[0] and low[4] < high[4]  # rejections more likely: more candidates for t* at k = 0
    assert adaptive_fanout(4, []) == default_fanout(4)  # nothing measured: the prior
    mixed = AcceptanceEstimate()
    mixed.update(4, 1)  # one accepted, then a rejection
    assert mixed.value == pytest.approx((0.9 * 3.2 + 1) / (0.9 * 4 + 2))


def test_draft_kv_stays_right_where_branches_no_longer_fit(tiny_llama_dir):
    """Close to the context limit the cache answers but no new branches fit: the glue pass must still run,
    or the draft's KV goes stale (with draft == target every token would then no longer be accepted)."""
    same = LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=42, block_size=4, mode="ssd", k=4,
               draft_weights="float32")  # float32: the draft computes exactly what the target does
    out = same.generate([list(range(1, 16))], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason is FinishReason.CONTEXT
    assert out.stats.spec.acceptance_rate == 1.0


def test_hit_and_miss_figures_add_up(llm):
    llm.speculation = SpeculationConfig(mode="ssd", k=4, adaptive_k=False)
    out = llm.generate(["The quick brown fox"], GREEDY)[0]
    spec = out.stats.spec
    plain = spec.num_plain_steps  # the last step: one token left to emit, nothing to draft
    hits, misses = spec.num_cache_hits, spec.num_steps - plain - spec.num_cache_hits
    assert hits > 0 and misses > 0 and spec.num_misses == misses
    assert spec.tau_on_hit * hits + spec.tau_on_miss * misses + plain == pytest.approx(spec.num_emitted)
    assert spec.ideal_tok_s > 0
    assert 0 < spec.draft_time_on_hit_s < spec.draft_time_s
    assert spec.wait_s_on_hit * hits + spec.wait_s_on_miss * misses + spec.draft_time_plain_s \
        == pytest.approx(spec.draft_time_s)
    assert set(spec.to_dict()) >= {"tau", "acceptance_rate", "cache_hit_rate", "tau_on_hit", "tau_on_miss",
                                   "wait_s_on_hit", "wait_s_on_miss"}
