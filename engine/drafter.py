"""The draft model's side of speculation: its own runner, KV blocks and per-request sequences.

Invariant: a draft sequence holds the request's committed tokens, and its KV covers a prefix of them
(all but the last one or two). Proposals are run as speculative chunks and never written into the
sequence; after verification `commit` appends what the target accepted and keeps the KV of the
draft tokens that turned out right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.kv.block_manager import BlockManager
from engine.lookup import Lookups
from engine.runner import Chunk, ModelRunner
from engine.sampling import draw, probabilities, race
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


@dataclass
class Proposal:
    tokens: list[int]               # [k] draft tokens x1..xk
    probs: list[torch.Tensor] | None  # k x [V] distributions they were drawn from (None: greedy, or coupled)
    from_lookup: list[bool] = field(default_factory=list)  # [k] which came from the context lookup (where known)

    def add_guess(self, token: int, vocab_size: int) -> None:
        """Append a token proposed with certainty (the context lookup's): a request sampled by the rejection rule
        gets a one-hot q row, which keeps the rule exact: it is accepted with probability p(token), and after a
        rejection the residual norm(max(0, p - q)) is p without it (a coupled request's token is kept where it is
        the target's race winner, as a greedy one's where it is the argmax)."""
        self.tokens.append(token)
        self.from_lookup.append(True)
        if self.probs is not None:
            q = torch.zeros(vocab_size)  # [V]
            q[token] = 1.0
            self.probs.append(q)


@dataclass(frozen=True)
class CompactHead:
    """A reduced head (engine.layers.embedding.ReducedLMHead): the draft's runner gives its rows compact, [.., Vr]
    over `ids` (ascending, so an argmax breaks ties as over the full row), rather than spread over [.., V] with
    -inf elsewhere: that cost about 0.3 ms a forward, and every argmax, top-k or q of a row a pass over 49152
    tokens where 8192 hold all the draft can say."""

    ids: torch.Tensor  # [Vr] token ids, on the CPU (where the runner's logits are)
    vocab_size: int

    @staticmethod
    def of(model: object) -> CompactHead | None:
        ids = getattr(getattr(model, "lm_head", None), "vocab_ids", None)
        if not isinstance(ids, torch.Tensor) or not ids.numel():
            return None
        return CompactHead(ids.cpu(), model.args.vocab_size)

    def tokens(self, indices: torch.Tensor | list[int]) -> list[int]:
        return self.ids[indices].tolist()

    def spread(self, q: torch.Tensor) -> torch.Tensor:  # [Vr] or [V] -> [V]
        """A q row over the head's tokens spread over the vocabulary (a row over the vocabulary as it is: the
        context lookup's one-hot rows)."""
        return q if q.shape[-1] == self.vocab_size else q.new_zeros(self.vocab_size).index_copy_(0, self.ids, q)


def draft_probabilities(logits: torch.Tensor, params: SamplingParams, temperature: float | None) -> torch.Tensor:
    """q: the distribution the draft samples rows of `logits` [n, V or Vr] from, at the draft's own `temperature` (None:
    the request's; 0 is taken as 1e-5, a distribution next to the argmax) with the request's filters."""
    return probabilities(logits, params, None if temperature is None else max(temperature, 1e-5))


def draw_rows(
    proposals: list[Proposal], seqs: list[Sequence], logits: torch.Tensor, temperature: float | None,
    head: CompactHead | None = None, *, spread: bool = True, positions: list[int] | None = None,
) -> None:
    """Append each proposal's next token from its row of `logits` [n, V] (or [n, Vr] over a compact `head`): the
    argmax when its request is greedy; the winner of the coupled race over q at positions[i] (the token's place in the
    sequence) where it has a noise key (engine.coupling: the target runs the same race); else a draw from q, kept for
    the verification's rejection rule: [V], or with `spread` off the compact [Vr] (SSD's cached branches: only the one
    handed out is spread, by `CompactHead.spread`, where spreading every branch's rows cost a 49152-float row each).
    `temperature` overrides the requests' for the draft. Rows of requests that sample alike get one `probabilities`
    call; each draw takes its request's generator in row order."""
    sampled: dict[SamplingParams, list[int]] = {}
    for i, seq in enumerate(seqs):
        if not seq.params.is_greedy:
            sampled.setdefault(seq.params, []).append(i)
    q: dict[int, torch.Tensor] = {}
    for params, rows in sampled.items():
        q |= zip(rows, draft_probabilities(logits[rows], params, temperature), strict=True)  # [n, V or Vr]
    assert positions is not None or not any(seq.noise_key is not None for seq in seqs), "coupled rows need positions"
    for i, (proposal, seq) in enumerate(zip(proposals, seqs, strict=True)):
        proposal.from_lookup.append(False)
        if i not in q:
            index = int(torch.argmax(logits[i]))
        elif seq.noise_key is not None:
            index = race(q[i], seq.noise_key, positions[i], None if head is None else head.ids)
        else:
            index = draw(q[i], seq.generator)
        proposal.tokens.append(index if head is None else int(head.ids[index]))
        if proposal.probs is not None:
            proposal.probs.append(q[i] if head is None or not spread else head.spread(q[i]))


class Drafter:
    last_idle_s: float | None = None  # an in-process draft never waits for the target (see RemoteDrafter)

    def __init__(self, runner: ModelRunner, blocks: BlockManager):
        self.runner = runner
        self.blocks = blocks
        self.seqs: dict[int, Sequence] = {}  # request id -> the draft's sequence
        self.lookups = Lookups()  # context lookup (engine.lookup)
        self.frontier: dict[int, int] = {}  # request id -> positions below it have draft KV after its proposal
        self.handed_out: dict[int, list[bool]] = {}  # request id -> its last proposal's from_lookup (LookupTrust)
        self.head = CompactHead.of(runner.model)  # a reduced head: the runner gives its rows compact

    # -- admission: blocks running requests may still claim, and whether a new one fits --------------
    def admission_budget(self, running: list[Sequence], reserve_of: Callable[[Sequence], int]) -> int:
        mine = [(s, self.seqs[s.seq_id]) for s in running if s.seq_id in self.seqs]
        claim = sum(max(0, self.blocks.blocks_needed(reserve_of(s)) - len(d.block_table)) for s, d in mine)
        return self.blocks.num_free_blocks - claim

    def admit(self, seq: Sequence, reserve: int, spare: int) -> int | None:
        """Blocks to charge for `seq` (all of them: its draft blocks are taken at prefill), or None if it
        does not fit."""
        return self.blocks.blocks_needed(reserve) if self.blocks.can_allocate(seq.token_ids, reserve, spare=spare) \
            else None

    def pop_reused(self, seq: Sequence) -> int | None:
        return None  # reported by start() already

    def start(self, seqs: list[Sequence], *, upto: dict[Sequence, int] | None = None) -> dict[Sequence, int]:
        """Prefill the draft's KV for new requests (sharing cached prefixes, as the target does): all of each
        prompt, or its first upto[seq] tokens, going on from where an earlier call stopped (the target's prefill
        chunks). Returns, for each request whose prompt this call finished, the prompt tokens it reused from the
        draft's prefix cache."""
        chunks = []
        for seq in seqs:
            draft_seq = self.seqs.get(seq.seq_id)
            if draft_seq is None:
                draft_seq = self.seqs[seq.seq_id] = Sequence(seq.seq_id, list(seq.token_ids), seq.params)
                self.blocks.allocate(draft_seq)
            end = len(draft_seq.token_ids) if upto is None else upto[seq]
            if end > draft_seq.num_computed_tokens:  # (its prefix cache may hold more than the target's chunk)
                chunks.append(Chunk(draft_seq, draft_seq.num_computed_tokens, end))
        if chunks:
            self.runner.run(chunks, compact=self.head is not None)
        for c in chunks:
            c.seq.num_computed_tokens = c.end
            self.blocks.commit(c.seq)
        return {seq: self.seqs[seq.seq_id].num_cached_tokens for seq in seqs
                if upto is None or upto[seq] == len(seq.token_ids)}

    @property
    def vocab_size(self) -> int:
        return self.runner.model.args.vocab_size

    def guess(self, seq: Sequence, drafted: list[int], lookup: bool) -> int | None:
        """The context lookup's next token after `drafted` (with `lookup` on, and while its tokens are accepted at
        least as often as the model's: engine.lookup.LookupTrust), or None."""
        if not lookup:
            return None
        token = self.lookups.guess(seq.seq_id, self.seqs[seq.seq_id].token_ids, drafted)
        # (trust is asked only where the lookup has a token: its probes count the times it could answer)
        return token if token is not None and self.lookups.trusted(seq.seq_id) else None

    def propose(
        self, wanted: dict[Sequence, int], draft_temperature: float | None, lookup: bool = False
    ) -> dict[Sequence, Proposal]:
        """Draft `wanted[seq]` tokens after each request's committed tokens, all requests batched. With `lookup`,
        a request takes the context lookup's token wherever it has one (`Proposal.add_guess`), and the draft model
        skips that step: the tokens it skipped go through it with the next step it does run (several rows, one
        forward)."""
        for seq in wanted:
            self.mirror(seq)
        active = {seq: self.seqs[seq.seq_id] for seq, k in wanted.items() if k > 0}
        out = {seq: Proposal([], [] if seq.needs_q else None) for seq in wanted}
        for seq, draft_seq in active.items():
            self.blocks.ensure_capacity(draft_seq, len(seq.token_ids) + wanted[seq])
            self.frontier[seq.seq_id] = draft_seq.num_computed_tokens
        step = 0
        while active:
            run = []
            for seq in active:
                guess = self.guess(seq, out[seq].tokens, lookup)
                if guess is None:
                    run.append(seq)
                else:
                    out[seq].add_guess(guess, self.vocab_size)
            chunks = []
            for seq in run:  # positions frontier .. n + step - 1: catch-up, skipped drafts, the last draft
                draft_seq, start = active[seq], self.frontier[seq.seq_id]
                n = len(draft_seq.token_ids)  # committed; drafted token i sits at position n + i
                tokens = (*draft_seq.token_ids[start:n], *out[seq].tokens[max(start - n, 0) : step])
                chunks.append(Chunk(draft_seq, start, n + step, tokens))
                self.frontier[seq.seq_id] = n + step
            if chunks:
                logits = self.runner.run(chunks, compact=self.head is not None)  # [len(run), V or Vr]
                draw_rows([out[seq] for seq in run], run, logits, draft_temperature, self.head,
                          positions=[len(seq.token_ids) + step for seq in run])
            step += 1
            active = {s: d for s, d in active.items() if wanted[s] > step}
        for seq, proposal in out.items():
            self.handed_out[seq.seq_id] = proposal.from_lookup
        return out

    def mirror(self, seq: Sequence) -> int:
        """Copy the tokens the target committed since the draft last looked; returns the length before."""
        draft_seq = self.seqs[seq.seq_id]
        before = len(draft_seq.token_ids)
        draft_seq.token_ids.extend(seq.token_ids[before:])
        return before

    def commit(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """After verification: mirror the committed tokens and keep the KV of accepted draft tokens."""
        self.record_lookup(seq, num_drafted, num_accepted)
        draft_seq = self.seqs[seq.seq_id]
        before = self.mirror(seq)  # the committed length the proposal started from
        frontier = self.frontier.pop(seq.seq_id, None)
        if num_drafted > 0 and frontier is not None:  # KV below the frontier; right up to the accepted drafts
            draft_seq.num_computed_tokens = min(before + num_accepted, frontier)
        draft_seq.num_computed_tokens = min(draft_seq.num_computed_tokens, len(draft_seq.token_ids) - 1)
        self.blocks.commit(draft_seq)

    def record_lookup(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """Which kind of draft token (the lookup's, the model's) the verification accepted (LookupTrust)."""
        from_lookup = self.handed_out.pop(seq.seq_id, None)
        if num_drafted > 0 and from_lookup is not None and len(from_lookup) == num_drafted:
            self.lookups.record(seq.seq_id, from_lookup, num_accepted)

    def finish(self, seq: Sequence) -> None:
        self.handed_out.pop(seq.seq_id, None)
        self.lookups.drop(seq.seq_id)
        self.frontier.pop(seq.seq_id, None)
        draft_seq = self.seqs.pop(seq.seq_id, None)
        if draft_seq is not None:
            self.blocks.free_blocks(draft_seq)
