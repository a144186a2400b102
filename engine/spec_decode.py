"""One speculative-decoding step (SD or SSD): speculate -> verify -> (the core) commits.

The draft proposes up to k tokens per request; the target scores [last committed token, x1..xk] in one
forward pass (k+1 positions) and `engine.speculative` decides how many drafts it accepts and which
token it emits after them. Nothing here touches committed state: the proposal and the verification
run as speculative chunks, and the returned StepOutput tells the core what to commit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from engine.drafter import Drafter, Proposal
from engine.outputs import StepStats, TokenSource
from engine.runner import Chunk, ModelRunner
from engine.sequence import Sequence, StepOutput
from engine.speculative import Rows, verify_coupled, verify_greedy, verify_sampled
from engine.ssd import SsdDrafter

if TYPE_CHECKING:
    from engine.remote_drafter import RemoteDrafter


def lookahead(seq: Sequence, k: int, max_model_len: int) -> int:
    """Draft tokens worth proposing: k, less near the context limit or the end of max_tokens."""
    room_in_context = max_model_len - len(seq.token_ids)  # verify runs positions up to len + k - 1
    room_in_reply = seq.params.max_tokens - seq.num_generated - 1  # the step emits up to k + 1 tokens
    return max(0, min(k, room_in_context, room_in_reply))


def sd_step(
    seqs: list[Sequence], runner: ModelRunner, drafter: Drafter, *, k: Mapping[Sequence, int],
    draft_temperature: float | None, max_model_len: int, ensure_capacity, lookup: bool = False,
) -> dict[Sequence, StepOutput]:
    """Sync SD: draft k[seq] tokens per request (with `lookup`, the context lookup's token where it has one:
    engine.lookup), then verify them."""
    wanted = {s: lookahead(s, k[s], max_model_len) for s in seqs}
    t0 = time.perf_counter()
    proposals = drafter.propose(wanted, draft_temperature, lookup)
    draft_time = time.perf_counter() - t0
    return verify(seqs, proposals, runner, ensure_capacity, draft_time=draft_time, hits={})


def ssd_step(
    seqs: list[Sequence], runner: ModelRunner, drafter: SsdDrafter | RemoteDrafter, *, k: Mapping[Sequence, int],
    fanout: tuple[int, ...], draft_temperature: float | None, max_model_len: int, ensure_capacity, backup: str = "jit",
    lookup: bool = False, ahead: Mapping[Sequence, int] | None = None,
) -> dict[Sequence, StepOutput]:
    """SSD: take the proposal from the speculation cache (or draft it on a miss), let the draft build the
    cache for this round's possible outcomes, then verify. A draft in its own process builds the cache
    while the target verifies; an in-process one builds it first (same tokens, no overlap). A request that drafts
    nothing this round (k = 0: a plain step) and has ahead[seq] > 0 gets that many drafts pre-drafted for its next
    round's likely first tokens."""
    wanted = {s: lookahead(s, k[s], max_model_len) for s in seqs}
    ahead = {s: lookahead(s, n, max_model_len - 1) for s, n in (ahead or {}).items() if n and not wanted[s]}
    t0 = time.perf_counter()
    proposals, hits = drafter.answer(wanted, draft_temperature, fanout, backup=backup, lookup=lookup, ahead=ahead)
    drafter.build_cache(proposals, fanout, draft_temperature, lookup, ahead=ahead)  # a no-op for a draft process
    draft_time = time.perf_counter() - t0
    outputs = verify(seqs, proposals, runner, ensure_capacity, draft_time=draft_time, hits=hits,
                     draft_idle=drafter.last_idle_s)
    for seq, out in outputs.items():
        out.draft_reused_tokens = drafter.pop_reused(seq)
    return outputs


def verify(
    seqs: list[Sequence], proposals: dict[Sequence, Proposal], runner: ModelRunner, ensure_capacity, *,
    draft_time: float, hits: dict[Sequence, bool | None], draft_idle: float | None = None,
) -> dict[Sequence, StepOutput]:
    """The target scores [last token, x1..xk] of every request in one forward; the rule decides."""
    t1 = time.perf_counter()
    chunks = []
    for seq in seqs:
        ensure_capacity(seq, len(seq.token_ids) + len(proposals[seq].tokens))
        chunks.append(Chunk.path(seq, seq.token_ids, proposals[seq].tokens))
    logits = runner.run(chunks, all_logits=True, greedy=all(s.params.is_greedy for s in seqs))  # [sum(k_i + 1), V]
    verify_time = time.perf_counter() - t1
    outputs, row = {}, 0
    for seq in seqs:
        proposal = proposals[seq]
        n_draft = len(proposal.tokens)
        rows = logits[row : row + n_draft + 1]  # [k_i + 1, V]
        row += n_draft + 1
        drafts = torch.tensor(proposal.tokens, dtype=torch.long)
        if seq.params.is_greedy:
            verdict = verify_greedy(drafts, rows)
        elif seq.noise_key is not None:
            verdict = verify_coupled(drafts, Rows(rows, seq.params), seq.noise_key, len(seq.token_ids))
        else:
            verdict = verify_sampled(drafts, proposal.probs or [], Rows(rows, seq.params), seq.generator)
        n_ok = verdict.num_accepted
        hit = hits.get(seq)
        accepted = {None: TokenSource.ACCEPTED, True: TokenSource.ACCEPTED_HIT, False: TokenSource.ACCEPTED_MISS}
        last = TokenSource.BONUS if n_ok == n_draft else TokenSource.RECOVERY
        outputs[seq] = StepOutput(
            tokens=[*proposal.tokens[:n_ok], verdict.next_token],
            sources=[accepted[hit]] * n_ok + [last if n_draft else TokenSource.TARGET],
            num_computed=len(seq.token_ids) + n_ok,
            num_drafted=n_draft,
            num_accepted=n_ok,
            stats=StepStats(seq.seq_id, n_draft, n_ok, verify_time_s=verify_time, draft_time_s=draft_time,
                            cache_hit=hit, draft_idle_s=draft_idle),
        )
    return outputs
