"""Context lookup for drafts: the index, and that it only changes which tokens are drafted (greedy output stays
exactly AR's) while a repetitive reply gets more of them accepted, sampled ones too (their exactness with the
lookup's one-hot q rows: test_spec_step_exact.py and test_draft_process_exact.py)."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.drafter import Drafter
from engine.lookup import ContextIndex, Lookups, LookupTrust
from engine.sequence import Sequence
from engine.spec_decode import sd_step, ssd_step
from engine.ssd import SsdDrafter
from tests.conftest import make_tiny_model_dir
from tests.engine.test_spec_step_exact import MAX_LEN, Blocks, MarkovRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def brute_force(tokens: list[int], tail: list[int]) -> int | None:
    for n in (3, 2):
        if len(tail) < n:
            continue
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail[-n:]:
                return tokens[start + n]
    return None


def test_guess_is_the_follower_of_the_latest_longest_suffix():
    index = ContextIndex()
    tokens = [1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3]
    index.extend(tokens)
    assert index.guess(tokens, [1, 2, 3]) == 9  # the trigram's only earlier occurrence; (2, 3) last -> 7
    assert index.guess(tokens, [4, 2, 3]) == 7  # no trigram: the latest bigram with a follower
    assert index.guess(tokens, [3, 4]) is None and index.guess(tokens, [5]) is None


def test_the_incremental_index_agrees_with_a_scan():
    rng = random.Random(0)
    tokens: list[int] = []
    lookups = Lookups()
    for _ in range(400):
        tokens.append(rng.randrange(6))  # a small alphabet: many repeats
        drafted = [rng.randrange(6) for _ in range(rng.randrange(3))]
        tail = (tokens[-3:] + drafted)[-3:]
        assert lookups.guess(0, tokens, drafted) == brute_force(tokens, tail)
    lookups.drop(0)
    assert not lookups.indexes


@pytest.fixture(scope="module")
def unrelated(tiny_llama_dir, tmp_path_factory):
    """A target and an unrelated random draft: the draft alone is almost never right."""
    draft = make_tiny_model_dir(tmp_path_factory.mktemp("lookup"), seed=7)
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=256, block_size=4) as llm:
        yield llm


def _run(llm: LLM, params: SamplingParams, **spec):
    llm.speculation = SpeculationConfig(k=4, adaptive_k=False, **spec)
    return [llm.generate([p], params)[0] for p in ("The quick brown fox", "Paris is")]


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_lookup_changes_the_drafts_not_the_output(unrelated, mode):
    ar = [o.token_ids for o in _run(unrelated, GREEDY, mode="ar")]
    on, off = _run(unrelated, GREEDY, mode=mode), _run(unrelated, GREEDY, mode=mode, lookup=False)
    assert [o.token_ids for o in on] == ar == [o.token_ids for o in off]
    accepted_on = sum(o.stats.spec.num_accepted for o in on)
    accepted_off = sum(o.stats.spec.num_accepted for o in off)
    assert accepted_on > accepted_off  # a tiny random target repeats itself; the unrelated draft cannot know


def markov_rounds(mode: str, target: MarkovRunner, draft: MarkovRunner, params: SamplingParams, *, n: int,
                  prompt: list[int], rounds: int, lookup: bool) -> list[int]:
    """`rounds` SD or SSD steps of 4 drafts over `n` requests on Markov-chain stand-ins (the prefill's token 2, as
    the core samples one), each committed as the core does; the draft tokens accepted in each round."""
    drafter = Drafter(draft, Blocks()) if mode == "sd" else SsdDrafter(draft, Blocks(), max_model_len=MAX_LEN,
                                                                       max_num_seqs=n)
    seqs = [Sequence(i, list(prompt), params, None if params.is_greedy else torch.Generator().manual_seed(i))
            for i in range(n)]
    blocks = Blocks()
    drafter.start(seqs)
    for seq in seqs:
        blocks.allocate(seq)
        seq.token_ids.append(2)
    step = sd_step if mode == "sd" else functools.partial(ssd_step, fanout=(1, 1, 1, 1, 1), backup="jit")
    accepted = []
    for _ in range(rounds):
        outputs = step(seqs, target, drafter, k=dict.fromkeys(seqs, 4), draft_temperature=None,
                       max_model_len=MAX_LEN, ensure_capacity=blocks.ensure_capacity, lookup=lookup)
        for seq, out in outputs.items():
            seq.token_ids += out.tokens
            seq.num_computed_tokens = out.num_computed
            drafter.commit(seq, out.num_drafted, out.num_accepted)
        accepted.append(sum(out.num_accepted for out in outputs.values()))
    return accepted


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_sampled_requests_take_the_lookups_tokens_too(mode):
    # Order-1 Markov chains (test_spec_step_exact's stand-ins): the target walks a cycle 0 -> 1 -> ... -> V-1 -> 0
    # with p = 0.93 a step, the draft believes the reverse cycle. The prompt holds the cycle, so the lookup knows
    # the next token; each lookup token goes with a one-hot q row and is accepted with probability p(token).
    vocab, n, prompt = 6, 64, [0, 1, 2, 3, 4, 5, 0, 1]
    cycle = torch.full((vocab, vocab), -3.0)
    cycle[torch.arange(vocab), (torch.arange(vocab) + 1) % vocab] = 2.0  # [V, V]: row = the previous token
    target, draft = MarkovRunner(cycle), MarkovRunner(cycle.T.contiguous())
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    accepted = {lookup: sum(markov_rounds(mode, target, draft, params, n=n, prompt=prompt, rounds=4, lookup=lookup))
                for lookup in (True, False)}
    assert accepted[False] < n / 2 and accepted[True] > 4 * n, accepted  # 4 rounds of 4 drafts at 0.93 each


def test_lookup_reaches_a_draft_process(tiny_llama_dir, tmp_path):
    draft = make_tiny_model_dir(tmp_path, seed=7)
    with LLM(str(tiny_llama_dir), draft=str(draft), draft_device="cpu", max_model_len=256, block_size=4) as llm:
        ar = [o.token_ids for o in _run(llm, GREEDY, mode="ar")]
        on, off = _run(llm, GREEDY, mode="ssd"), _run(llm, GREEDY, mode="ssd", lookup=False)
        assert llm.remote is not None
    assert [o.token_ids for o in on] == ar == [o.token_ids for o in off]
    assert sum(o.stats.spec.num_accepted for o in on) > sum(o.stats.spec.num_accepted for o in off)


def test_skipped_draft_steps_leave_the_model_drafts_unchanged(tiny_llama_dir):
    """A drafter that skips the model where the lookup answers (and runs the skipped tokens with its next
    forward) drafts exactly what a step-by-step reference does, over two rounds with a commit between."""
    from engine.lookup import Lookups
    from engine.sequence import Sequence

    tiny = str(tiny_llama_dir)
    same = {"max_model_len": 256, "block_size": 4, "draft_weights": "float32"}  # float32: the draft is the target
    with LLM(tiny, draft=tiny, **same) as llm, LLM(tiny, max_model_len=256) as ref:
        drafter = llm.core.drafter
        seq = Sequence(999, [5, 9, 33, 71, 5, 9, 33, 8, 5, 9], GREEDY)
        drafter.start([seq])
        kinds = []
        for accepted in (3, 0):
            tokens = drafter.propose({seq: 6}, None, lookup=True)[seq].tokens
            want, lookups = [], Lookups()
            for _ in range(6):  # the reference: lookup, else the model's greedy token over the whole context
                guess = lookups.guess(0, list(seq.token_ids), want)
                kinds.append(guess is not None)
                want.append(guess if guess is not None else
                            ref.generate([seq.token_ids + want], SamplingParams(temperature=0.0, max_tokens=1))[0]
                            .token_ids[0])
            assert tokens == want
            seq.token_ids += [*tokens[:accepted], 7]  # the target accepts some, then its own token
            drafter.commit(seq, len(tokens), accepted)
        drafter.finish(seq)
    assert any(kinds) and not all(kinds)
    assert any(a and not b for a, b in itertools.pairwise(kinds))  # a model step right after a skip


def test_ssd_branches_skip_the_model_where_the_lookup_answers(tiny_llama_dir, monkeypatch):
    """SSD's branch drafting takes the lookup's token where it has one and runs the model only for the other
    steps (the skipped tokens with them): every cached branch equals a step-by-step reference, in fewer rows.
    The lookup is replaced by a fixed rule that answers about two steps in three (a tiny random model's
    branches seldom repeat the context)."""
    from engine.sequence import Sequence

    def rule(seq_id: int, committed: list[int], drafted: list[int]) -> int | None:
        last = (drafted or committed)[-1]
        return None if (len(drafted) + last) % 3 == 0 else (last * 7 + 3) % 50

    tiny = str(tiny_llama_dir)
    same = {"max_model_len": 256, "block_size": 4, "draft_weights": "float32"}  # float32: the draft is the target
    with LLM(tiny, draft=tiny, **same) as llm, LLM(tiny, max_model_len=256) as ref:
        drafter = llm.core.drafter
        monkeypatch.setattr(drafter.lookups, "guess", rule)
        seq = Sequence(999, [5, 9, 33, 71, 5, 9, 33, 8, 5, 9, 33, 71, 5], GREEDY)
        drafter.start([seq])
        k = 4
        proposal = drafter.propose({seq: k}, None, lookup=True)[seq]
        before = drafter.runner.num_forward_tokens
        drafter.build_cache({seq: proposal}, (3,), None, lookup=True)
        forwarded = drafter.runner.num_forward_tokens - before
        branches = drafter.cache[seq.seq_id]
        kinds = []  # per branch: which steps the rule answered
        for (j, t_star), branch in branches.items():
            path, kinds = [*proposal.tokens[:j], t_star], [*kinds, []]
            for _ in range(k):  # the reference: the rule, else the model's greedy token over the whole context
                guess = rule(0, seq.token_ids, path)
                kinds[-1].append(guess is not None)
                path.append(guess if guess is not None else
                            ref.generate([seq.token_ids + path], SamplingParams(temperature=0.0, max_tokens=1))[0]
                            .token_ids[0])
            assert branch.tokens == path[j + 1:], (j, t_star)
        drafter.finish(seq)
    flat = [kind for branch in kinds for kind in branch]
    assert len(branches) >= 8 and any(flat) and not all(flat)
    # a model step right after a skip within a branch: a span of several rows
    assert any(a and not b for branch in kinds for a, b in itertools.pairwise(branch))
    assert forwarded < (k + 1) + len(branches) * k  # the glue pass, then fewer rows than one per branch step


def test_trust_turns_a_wrong_lookup_off_and_keeps_probing_it():
    trust = LookupTrust()
    assert trust.consult()  # the priors: the lookup is right more often than the model
    for _ in range(6):
        trust.record(True, False)  # counting: the lookup's tokens rejected...
        trust.record(False, True)  # ...the model's accepted
    asked = [trust.consult() for _ in range(4 * LookupTrust.PROBE_EVERY)]
    assert sum(asked) == 4 and asked[LookupTrust.PROBE_EVERY - 1]  # one probe in PROBE_EVERY
    for _ in range(6):  # the text turned repetitive: the probes are accepted, the model's tokens less often
        trust.record(True, True)
        trust.record(False, False)
    assert trust.consult()


def test_a_verified_proposal_counts_up_to_its_first_rejection():
    lookups = Lookups()
    lookups.record(0, [True, False, True, True], num_accepted=1)  # lookup accepted, model rejected, two unreached
    trust = lookups.trust[0]
    assert trust.trials[True] == LookupTrust.DECAY * LookupTrust.PRIOR_TRIALS + 1
    assert trust.trials[False] == LookupTrust.DECAY * LookupTrust.PRIOR_TRIALS + 1
    assert trust.rate(True) > LookupTrust.PRIORS[True] and trust.rate(False) < LookupTrust.PRIORS[False]
    lookups.drop(0)
    assert not lookups.trust


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_a_lookup_that_is_always_wrong_stops_being_drafted(mode, monkeypatch):
    # Greedy, and the draft is the target's own chain (its tokens are always right); the lookup always proposes a
    # token the target never picks. Trusted blindly it would cost every round its drafts; measured, it drops out.
    vocab, n, prompt = 7, 8, [0, 1, 2, 3, 4, 5, 0, 1]
    cycle = torch.full((vocab, vocab), -3.0)
    cycle[torch.arange(6), (torch.arange(6) + 1) % 6] = 2.0  # a cycle over 0..5: token 6 never follows
    chain = MarkovRunner(cycle)
    monkeypatch.setattr(Lookups, "guess", lambda self, seq_id, committed, drafted: vocab - 1)
    accepted = markov_rounds(mode, chain, chain, GREEDY, n=n, prompt=prompt, rounds=12, lookup=True)
    assert accepted[0] == 0  # the first round trusts the lookup: its first token is rejected
    assert sum(accepted[-6:]) >= 0.75 * 6 * 4 * n, accepted  # then the model's tokens, but for the probes
