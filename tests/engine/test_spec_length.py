"""The adaptive draft length: the k with the most expected tokens per second, and the engine using it."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.outputs import StepStats
from engine.sequence import Sequence, StepOutput
from engine.spec_length import PROBE_EVERY, RoundCost, RowCostFit, best_k, expected_tokens
from engine.spec_policy import AcceptanceEstimate, SpecPolicy
from tests.conftest import make_tiny_model_dir
from tests.engine.processes import DRAFT_CORE

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_best_k_grows_with_acceptance_and_shrinks_with_cost():
    cpu = RoundCost(row_cost=0.13)
    ks = [best_k(8, a, cpu) for a in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert ks == sorted(ks) and ks[0] == 1 and ks[-1] >= 6
    assert best_k(4, 0.8, cpu) == 4 and best_k(4, 0.5, cpu) == 2  # this CPU: 1 row 48 ms, 5 rows 73 ms
    assert best_k(4, 0.5, RoundCost(row_cost=0.0)) == 4  # free rows: always the full k
    drafting = RoundCost(row_cost=0.13)
    drafting.update(num_rows=5, verify_s=0.152, num_drafted=4, draft_s=0.08)  # v1 = 0.1 s, 20 ms per draft token
    assert drafting.verify_one_row_s == pytest.approx(0.1) and drafting.draft_per_token_s == pytest.approx(0.02)
    assert best_k(4, 0.6, drafting) < best_k(4, 0.6, cpu)  # the target waits for drafts: fewer of them


def test_k_zero_wins_only_when_no_draft_length_pays():
    cost = RoundCost(row_cost=0.12)
    cost.update(num_rows=5, verify_s=0.148, num_drafted=4, draft_s=0.024)  # v1 0.1 s, 6 ms per drafted token
    assert best_k(4, 0.8, cost, min_k=0) == 4
    assert best_k(4, 0.05, cost, min_k=0) == 0  # a draft that is almost never right: a plain step is faster
    assert best_k(4, 0.05, cost) == 1  # without k = 0, the cheapest round
    rate = {k: expected_tokens(0.3, k) / cost.seconds(k) for k in range(5)}
    assert best_k(4, 0.3, cost, min_k=0) == max(rate, key=rate.get)


def test_round_cost_is_a_moving_average():
    cost = RoundCost(row_cost=0.0)
    cost.update(num_rows=3, verify_s=1.0, num_drafted=2, draft_s=0.0)
    cost.update(num_rows=3, verify_s=2.0, num_drafted=2, draft_s=1.0)
    assert cost.verify_one_row_s == pytest.approx(0.8 * 1.0 + 0.2 * 2.0)
    assert cost.draft_per_token_s == pytest.approx(0.2 * 0.5)
    cost.update(num_rows=1, verify_s=9.0, num_drafted=0, draft_s=0.0)  # a plain round: the one-row step, no drafts
    assert cost.verify_one_row_s == pytest.approx(0.8 * 1.2 + 0.2 * 9.0)
    assert cost.draft_per_token_s == pytest.approx(0.2 * 0.5)
    first = RoundCost(row_cost=0.0)
    first.update(num_rows=1, verify_s=1.0, num_drafted=0, draft_s=0.0)
    first.update(num_rows=3, verify_s=1.0, num_drafted=2, draft_s=1.0)
    assert first.draft_per_token_s == pytest.approx(0.5)  # the first drafting measured is taken as it is


def test_plain_rounds_price_k_zero_at_what_a_one_row_step_costs():
    """The verify line extrapolated to one row can be far below a real one-row step (a CPU's packed few-row
    GEMM beating its one-row kernel, or one slow 5-row round tilting the line): the plain rounds SD runs measure
    it, so k = 0 stops looking cheap where it is not. Measured on an AMD EPYC: 1 row 38 ms, 2 rows 35 ms."""
    cost = RoundCost(row_cost=0.12)
    for _ in range(20):
        cost.update(num_rows=2, verify_s=0.035, num_drafted=1, draft_s=0.004)
    cost.update(num_rows=5, verify_s=0.097, num_drafted=4, draft_s=0.006)  # one slow round
    assert cost.fit.value > 0.5 and best_k(4, 0.6, cost, min_k=0) == 0  # extrapolated: a plain step looks cheap
    for _ in range(PROBE_EVERY):
        cost.update(num_rows=1, verify_s=0.038, num_drafted=0, draft_s=0.0)
    assert cost.fit.value < 0.5 and cost.verify_one_row_s > 0.033  # measured, not extrapolated
    assert best_k(4, 0.6, cost, min_k=0) > 0
    assert best_k(4, 0.05, cost, min_k=0) == 0  # a draft that is almost never right still loses to a plain step


def test_the_row_cost_is_fitted_to_the_measured_verify_times():
    rng = random.Random(0)
    cost = RoundCost(row_cost=0.12)
    prior_k = best_k(4, 0.6, cost)
    for i in range(200):  # a device where each further row costs 40% of a 50 ms one-row verify, with 3% noise
        rows = 2 + i % 4
        cost.update(rows, 0.05 * (1 + 0.4 * (rows - 1)) * rng.uniform(0.97, 1.03), rows - 1, 0.0)
    assert cost.fit.value == pytest.approx(0.4, abs=0.03)
    assert cost.verify_one_row_s == pytest.approx(0.05, rel=0.05)
    assert best_k(4, 0.6, cost) < prior_k  # rows cost more than the prior said: fewer drafts


def test_the_row_cost_keeps_its_prior_until_the_rows_vary():
    fit = RowCostFit(prior=0.12)
    assert fit.value == 0.12
    for _ in range(100):
        fit.add(3, 0.09)  # always 3 rows: the line's slope cannot be told from its level
    assert fit.value == pytest.approx(0.12)
    fit = RowCostFit(prior=0.12)
    for i in range(100):
        fit.add(2 + i % 2, 0.05 if i % 2 else 0.06)  # more rows measured faster (noise): clamped at 0
    assert fit.value == 0.0
    fit = RowCostFit(prior=0.12)
    for i in range(100):
        fit.add(2 + 3 * (i % 2), 0.1 if i % 2 else 0.01)  # a line through zero before one row: rows dominate
    assert fit.value == 1.0


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_a_weak_draft_drafts_fewer_tokens_and_output_stays_exact(tiny_llama_dir, tmp_path, mode, monkeypatch):
    # A random draft of another seed almost never agrees with the target: its acceptance falls to about 0.
    # The rounds' costs are a fixed model of this CPU's (a 10 ms one-row verify, 12% more a row, 2 ms a drafted
    # token), so the choices follow the acceptance alone: measured under a loaded machine's noise, the fitted row cost
    # could dip below the decayed prior's acceptance and a one-token draft win a round or two.
    measured = RoundCost.update

    def modelled(cost, num_rows, verify_s, num_drafted, draft_s):
        measured(cost, num_rows, 0.010 * (1 + 0.12 * (num_rows - 1)), num_drafted, 0.002 * num_drafted)

    monkeypatch.setattr(RoundCost, "update", modelled)
    other = make_tiny_model_dir(tmp_path, seed=7)
    with LLM(str(tiny_llama_dir), draft=str(other), max_model_len=256, block_size=4) as llm:
        llm.speculation = SpeculationConfig(mode="ar")
        ar = llm.generate(["The quick brown fox"], GREEDY)[0].token_ids
        drafted = {}
        for adaptive in (True, False):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=adaptive)
            events = list(llm.stream("The quick brown fox", GREEDY))
            assert events[-1].output.token_ids == ar
            drafted[adaptive] = [e.num_drafted for e in events if isinstance(e, StepStats)]
    assert drafted[False][:20] == [4] * 20  # fixed k (rounds near max_tokens are cut short)
    assert drafted[True][0] == 4  # nothing measured yet: the prior (0.8) asks for the full k
    # then none is worth drafting: a plain step pays best, with a drafted probe round every PROBE_EVERY-th
    tail = drafted[True][-2 * PROBE_EVERY:]
    assert tail.count(0) >= 2 * (PROBE_EVERY - 1) - 1 and 0 < sum(tail) <= 2 * max(tail)


@pytest.mark.parametrize("where", ["in-process", "draft process"])
def test_ssd_pauses_and_its_probes_come_from_the_cache(tiny_llama_dir, where, monkeypatch):
    # Acceptance held at 0.05 (a draft the policy thinks useless) and the draft the target itself: SSD runs plain
    # steps, and every PROBE_EVERY-th round drafts, from branches the draft pre-drafted during the plain step before
    # it (the target's token is among the draft's top ones), so the probes are cache hits. The plain rounds of a
    # draft process get no answer (a quiet round); the output stays AR's. The round costs are a fixed model (as above:
    # the tiny model's rows cost next to nothing, and a one-token draft at 0.05 could pay).
    monkeypatch.setattr(AcceptanceEstimate, "value", property(lambda self: 0.05))
    measured = RoundCost.update

    def modelled(cost, num_rows, verify_s, num_drafted, draft_s):
        measured(cost, num_rows, 0.010 * (1 + 0.12 * (num_rows - 1)), num_drafted, 0.002 * num_drafted)

    monkeypatch.setattr(RoundCost, "update", modelled)
    device = {"in-process": None, "draft process": DRAFT_CORE}[where]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    with LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=256, block_size=4, draft_device=device,
             threads=1) as llm:
        llm.speculation = SpeculationConfig(mode="ar")
        ar = llm.generate(["The quick brown fox"], params)[0].token_ids
        llm.speculation = SpeculationConfig(mode="ssd", k=4)
        events = list(llm.stream("The quick brown fox", params))
    assert events[-1].output.token_ids == ar
    steps = [e for e in events if isinstance(e, StepStats)]
    assert all(s.cache_hit is None for s in steps if s.num_drafted == 0)  # a plain step: no hit, no miss
    assert [s.num_drafted for s in steps].count(0) >= len(steps) * (PROBE_EVERY - 1) / PROBE_EVERY - 2
    probes = [s for s in steps[1:] if s.num_drafted > 0]  # (the first round drafts: nothing measured yet)
    assert len(probes) >= 4 and all(s.cache_hit for s in probes), [(s.num_drafted, s.cache_hit) for s in steps]
    spec = events[-1].output.stats.spec
    assert spec.num_plain_steps == sum(s.num_drafted == 0 for s in steps) and spec.num_plain_steps > 0
    if device is not None:  # the draft process idles through the plain steps: told with the next answer, not lost
        assert spec.draft_idle_s > 0.5 * spec.verify_time_s, (spec.draft_idle_s, spec.verify_time_s)
    assert spec.num_cache_hits == sum(bool(s.cache_hit) for s in steps)
    assert spec.cache_hit_rate == spec.num_cache_hits / (len(steps) - spec.num_plain_steps)  # of the drafted rounds
    misses = spec.num_misses
    assert misses == len(steps) - spec.num_plain_steps - spec.num_cache_hits
    assert spec.wait_s_on_hit * spec.num_cache_hits + (spec.wait_s_on_miss or 0) * misses + spec.draft_time_plain_s \
        == pytest.approx(spec.draft_time_s)
    assert spec.tau_on_hit * spec.num_cache_hits + (spec.tau_on_miss or 0) * misses + spec.num_plain_steps \
        == pytest.approx(spec.num_emitted)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_a_verify_never_runs_more_rows_than_reproduce_one_row_decoding(tiny_llama_dir, mode):
    # On the CPU, only verifies of up to ROW_KERNEL_ROWS rows give one-row decoding's bits (the row attention
    # kernel); a 33-row verify ran SDPA, and under --cpu-matmul q8 --k 32 --fixed-k SmolLM2's SD reply left AR's
    # at its 13th token. The draft is the target itself: it drafts as much as it may, all accepted.
    from engine.attention.sdpa import ROW_KERNEL_ROWS

    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    with LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=256) as llm:
        llm.speculation = SpeculationConfig(mode="ar")
        ar = llm.generate(["The quick brown fox"], params)[0].token_ids
        llm.speculation = SpeculationConfig(mode=mode, k=32, adaptive_k=False)
        rows = []
        run = llm.core.runner.run
        llm.core.runner.run = lambda chunks, **kw: rows.append(sum(c.end - c.start for c in chunks)) or run(chunks,
                                                                                                             **kw)
        events = list(llm.stream("The quick brown fox", params))
    assert events[-1].output.token_ids == ar
    drafted = [e.num_drafted for e in events if isinstance(e, StepStats)]
    assert max(drafted) == ROW_KERNEL_ROWS - 1 == llm.config.max_draft  # (what the chat app's status line shows)
    assert max(rows[1:]) <= ROW_KERNEL_ROWS  # every step after the prompt's
    spec = events[-1].output.stats.spec  # a position per token a round can draft (a 32nd was never drafted)
    assert len(spec.drafted_per_position) == len(spec.per_position_acceptance) == llm.config.max_draft


def test_an_ssd_round_with_nothing_cached_does_not_count_as_drafting_cost():
    # A request's first SSD round (hit None) also waits for the draft process to finish its prompt: that wait is not
    # what a drafted token costs, and counted as one it would stop the drafting for a while. SD's rounds all count.
    def round_of(hit, wait_s):
        stats = StepStats(1, num_drafted=2, num_accepted=1, verify_time_s=0.010, draft_time_s=wait_s, cache_hit=hit)
        return {Sequence(1, [1, 2], GREEDY): StepOutput([5, 6], [], 3, num_drafted=2, num_accepted=1, stats=stats)}

    policy = SpecPolicy("cpu")
    policy.measured("ssd", round_of(None, 0.5))
    assert policy.round_cost["ssd"].draft_per_token_s is None and policy.round_cost["ssd"].verify_one_row_s
    policy.measured("ssd", round_of(True, 0.002))
    assert policy.round_cost["ssd"].draft_per_token_s == pytest.approx(0.001)
    policy.measured("sd", round_of(None, 0.5))
    assert policy.round_cost["sd"].draft_per_token_s == pytest.approx(0.25)
