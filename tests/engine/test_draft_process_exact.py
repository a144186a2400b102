"""SSD with its draft in a process of its own stays exact on a batch that mixes greedy and sampled requests.

test_spec_step_exact.py checks the step code with an in-process SsdDrafter. With a draft process (the chat app's
default on two or more cores) the proposals take another path: RemoteDrafter (the leader's side) sends each
request's settings and a seed drawn from its generator (engine.draft_server rebuilds a generator per request from
it), and the draft process replies with every request's tokens and one q row per drafted token of the SAMPLED
requests only, all stacked into one tensor that the leader splits again in its own order. A q row given to the wrong
request, a greedy request counted among the rows, or a draft seed shared by requests leaves every greedy test (and
the in-process tests) passing, and changes the distribution of the sampled replies.

So here one real draft process (spawned by the real RemoteDrafter, serving with the real engine.draft_server loop
and an SsdDrafter, over engine.shm_channel on x86-64 and gloo for the q rows) drafts for batches where greedy
requests and sampled requests of two settings (one with temperature, top-k and top-p, one hotter and unfiltered)
are interleaved in a shuffled order, with draft lengths 0..2 that vary by request. The only stand-ins are the
models: the order-1 Markov chains of test_spec_step_exact.py, loaded in the draft process through RemoteDrafter's
`load` seam (the function the child runs before it joins the group), so that thousands of requests take seconds
where tiny real models would take minutes (and their 384-token vocabulary would leave a chi-square test of joint
outputs without enough samples). Checked: every greedy reply equals AR's (argmax after argmax: with a target
that looks at one token only, this checks that greedy requests in the batch are verified as greedy whatever the
draft process sends them), and each sampled setting's first NUM_EMIT tokens follow AR's exact joint distribution by
a chi-square test (a correct engine fails with probability P_PASS per setting; all seeds are fixed, so each run is
deterministic). About 10 s a case on two busy cores.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch

from engine import remote_drafter
from engine.distributed import RankSpec
from engine.draft_server import DraftSpec
from engine.remote_drafter import RemoteDrafter
from engine.sampling import probabilities, race, sample_next
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode import ssd_step
from engine.ssd import SsdDrafter
from tests.engine.chi_square import P_BROKEN, P_PASS, chi_square_p_value
from tests.engine.test_spec_step_exact import (
    BLOCK_SIZE,
    DRAFT_LOGITS,
    FANOUT,
    MAX_LEN,
    NUM_EMIT,
    START,
    TARGET_LOGITS,
    VOCAB,
    Blocks,
    MarkovRunner,
    draft_length,
    exact_ar_probs,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SAMPLED = (
    SamplingParams(temperature=0.8, top_k=2, top_p=0.9, max_tokens=8, ignore_eos=True),  # filtered
    SamplingParams(temperature=1.4, max_tokens=8, ignore_eos=True),  # hotter, unfiltered
)
PER_SETTING, NUM_GREEDY = 1200, 240  # requests of each sampled setting, and greedy ones, in one batch
BATCH = len(SAMPLED) * PER_SETTING + NUM_GREEDY
_ids = itertools.count()  # request ids: unique across the batches the one draft process serves


class DraftBlocks(Blocks):
    """test_spec_step_exact's block stand-in, with the two figures the draft process's STATS reply reads."""

    num_free_blocks, blocks = 0, ()


def markov_draft(spec: DraftSpec) -> tuple[SsdDrafter, DraftSpec]:
    """Runs in the draft process in place of engine.draft_server.load: the draft chain instead of a model."""
    drafter = SsdDrafter(
        MarkovRunner(DRAFT_LOGITS), DraftBlocks(), max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs
    )
    return drafter, spec


@pytest.fixture(scope="module")
def remote() -> Iterator[RemoteDrafter]:
    spec = DraftSpec(
        "markov-chain",
        num_blocks=1 << 20,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_LEN,
        max_num_seqs=BATCH,
        enable_prefix_caching=False,
        dtype="float32",
        device="cpu",
    )
    with pytest.MonkeyPatch.context() as patch:  # only the spawn reads it
        patch.setattr(remote_drafter, "load", markov_draft)
        drafter = RemoteDrafter(spec, RankSpec(1, None, 1), timeout_s=60.0)
    try:
        drafter.connect(VOCAB)
        yield drafter
    finally:
        drafter.close()


def greedy_ar(first: int) -> list[int]:
    """AR's greedy reply after prompt token `first`: argmax after argmax of the target chain."""
    out = [first]
    for _ in range(NUM_EMIT):
        out.append(int(torch.argmax(TARGET_LOGITS[out[-1]])))
    return out[1:]


def mixed_batch(seed: int, coupled: bool = False) -> list[Sequence]:
    """BATCH requests in a shuffled order: PER_SETTING of each sampled setting (prompt [START], a seed each: its
    generator's, or with `coupled` its noise key) and NUM_GREEDY greedy ones (prompts cycling over the vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in SAMPLED for _ in range(PER_SETTING)] + [GREEDY] * NUM_GREEDY
    order = torch.randperm(len(params), generator=gen).tolist()
    seqs = []
    for i in order:
        p = params[i]
        key = None if p.is_greedy else int(torch.randint(2**62, (1,), generator=gen))
        generator = None if key is None or coupled else torch.Generator().manual_seed(key)
        seqs.append(Sequence(next(_ids), [i % VOCAB if p.is_greedy else START], p, generator,
                             seed=key if coupled else None))  # (SAMPLED: coupled)
    return seqs


def run_batch(
    remote: RemoteDrafter, seqs: list[Sequence], draft_temperature: float | None, backup: str, lookup: bool,
    pauses: bool = False,
) -> dict[str, int]:
    """Decode every request to NUM_EMIT tokens as the core does (the draft process gets the prompts, the target
    samples the first token, then ssd_step rounds over the whole batch, commits, and finishes), and tally the
    rounds of sampled requests: accepted draft tokens, rounds with a rejection, cache hits and misses. `pauses`:
    every other round, the first included, drafts nothing for any request (a quiet round: the draft process does
    not answer) and pre-drafts for the next (`ahead`)."""
    target, blocks = MarkovRunner(TARGET_LOGITS), Blocks()
    remote.start(seqs, lambda seq: MAX_LEN)
    for seq in seqs:
        blocks.allocate(seq)
        seq.token_ids.append(sample_next(TARGET_LOGITS[seq.token_ids[-1]], seq))
        remote.commit(seq, 0, 0)  # (the core commits the prefill's token too: the draft process hears of it)
    tally = {"hit": 0, "miss": 0, "rejected": 0, "accepted": 0}
    active, paused = seqs, pauses
    while active:
        k = {seq: 0 if paused else draft_length(seq) for seq in active}
        paused = pauses and not paused
        outputs = ssd_step(
            active,
            target,
            remote,
            k=k,
            ahead={seq: 1 + seq.seq_id % 2 for seq in active if not k[seq]},  # pre-drafts in plain rounds
            fanout=FANOUT,
            backup=backup,
            draft_temperature=draft_temperature,
            lookup=lookup,
            max_model_len=MAX_LEN,
            ensure_capacity=blocks.ensure_capacity,
        )
        for seq, out in outputs.items():
            seq.token_ids += out.tokens
            seq.num_computed_tokens = out.num_computed
            remote.commit(seq, out.num_drafted, out.num_accepted)
            if not seq.params.is_greedy:
                tally["accepted"] += out.num_accepted
                tally["rejected"] += out.num_accepted < out.num_drafted
                if out.stats.cache_hit is not None and out.num_drafted:
                    tally["hit" if out.stats.cache_hit else "miss"] += 1
        active = []
        for seq in outputs:
            if seq.num_generated < NUM_EMIT:
                active.append(seq)
            else:
                remote.finish(seq)
    return tally


def joint_counts(seqs: list[Sequence]) -> torch.Tensor:
    """Counts [V^NUM_EMIT] of the requests' first NUM_EMIT tokens (index t1 * V^3 + t2 * V^2 + t3 * V + t4)."""
    first = torch.tensor([seq.generated_ids[:NUM_EMIT] for seq in seqs])  # [n, NUM_EMIT]
    index = (first * VOCAB ** torch.arange(NUM_EMIT - 1, -1, -1)).sum(-1)  # [n]
    return torch.bincount(index, minlength=VOCAB**NUM_EMIT)


def ar_joint(params: SamplingParams) -> torch.Tensor:
    return exact_ar_probs(torch.stack([probabilities(row, params) for row in TARGET_LOGITS]))


@pytest.mark.parametrize(("draft_temperature", "backup", "lookup", "pauses"),
                         [(None, "jit", True, False), (1.7, "fast", False, False), (None, "jit", False, True)])
def test_a_mixed_batch_through_the_draft_process_follows_ar(remote, draft_temperature, backup, lookup, pauses):
    # (lookup: the draft process proposes the context lookup's tokens where it has one, with one-hot q rows)
    seqs = mixed_batch(seed=23)
    tally = run_batch(remote, seqs, draft_temperature, backup, lookup, pauses)
    assert remote.alive and remote.stats()[2] == 0  # in step to the end, and every request finished there
    # both paths of the rejection rule, and (after the first round) proposals from the cache and from the backup
    assert tally["accepted"] > PER_SETTING / 2 and tally["rejected"] > PER_SETTING / 2, tally
    # (with pauses every drafted round is pre-drafted, over the whole fan-out: all 4 tokens, so always a hit)
    assert tally["hit"] > PER_SETTING / 10 and (tally["miss"] > PER_SETTING / 10 or pauses), tally
    for seq in seqs:
        if seq.params.is_greedy:
            assert seq.generated_ids[:NUM_EMIT] == greedy_ar(seq.token_ids[0]), seq.seq_id
    counts = [joint_counts([s for s in seqs if s.params == params]) for params in SAMPLED]
    for setting, params in zip(counts, SAMPLED, strict=True):
        assert chi_square_p_value(setting, ar_joint(params)) > P_PASS, params
    # the test can tell the settings apart: one's replies never pass for the other's
    assert chi_square_p_value(counts[1], ar_joint(SAMPLED[0])) < P_BROKEN
    assert chi_square_p_value(counts[0], ar_joint(SAMPLED[1])) < P_BROKEN


def coupled_ar(seq: Sequence) -> list[int]:
    """Coupled AR's first NUM_EMIT tokens for a sampled request: at position n the race over the filtered target row
    of the token before, keyed by the request's noise key (engine.coupling)."""
    tokens = [START]
    for _ in range(NUM_EMIT):
        tokens.append(race(probabilities(TARGET_LOGITS[tokens[-1]], seq.params), seq.noise_key, len(tokens)))
    return tokens[1:]


@pytest.mark.parametrize("pauses", [False, True])
def test_a_coupled_batch_through_the_draft_process_gives_ar_replies(remote, pauses):
    """Requests sampled by the coupled race: the draft process gets each one's noise key (in place of a generator's
    seed) and sends no q rows; every reply is coupled AR's for its key, and every greedy one AR's."""
    seqs = mixed_batch(seed=31, coupled=True)
    tally = run_batch(remote, seqs, None, "jit", True, pauses)
    assert remote.alive and remote.stats()[2] == 0
    assert tally["accepted"] > PER_SETTING / 4 and tally["rejected"] > PER_SETTING / 4, tally  # (of 2 x PER_SETTING)
    assert tally["hit"] > PER_SETTING / 10, tally
    for seq in seqs:
        expected = greedy_ar(seq.token_ids[0]) if seq.params.is_greedy else coupled_ar(seq)
        assert seq.generated_ids[:NUM_EMIT] == expected, seq.seq_id
