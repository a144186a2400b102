"""SSD's draft side: answer from the speculation cache, then pre-draft every likely outcome.

While the target verifies round r ([t, x1..xK]), the draft predicts the outcome (k accepted, then the
target's token t*) and drafts the next K tokens for each likely one:
1. glue pass: one forward over [t, x1..xK] at their true positions (writes the verified path's KV and
   gives K+1 next-token distributions);
2. fan-out: for each k, the top F_k tokens of distribution k as candidates for t* (a coupled request's: its race's
   first finishers over q at that position, then the logits' order; for k < K excluding
   x_{k+1}, which the target would have accepted); for k = K (all accepted) a request with the context lookup
   on also gets the lookup's token after x_K, where it has one and the top F_K (F_K > 0) miss it;
3. branch drafting: K batched steps over all branches; each branch attends to the prefix and the path
   up to k (real KV slots) plus its own tokens, kept in scratch slots at their logical positions.
The cache maps (k, t*) -> the branch's K tokens (and their draft distributions when sampling by the rejection rule). The
target's verification rule is unchanged, so exactness never depends on the cache.

In this module the cache is built in the caller's thread, between answering and verifying: correct,
but without the overlap that makes SSD fast; engine.draft_server runs this same class in its own process,
where the cache is built while the target verifies.
"""

from __future__ import annotations

import torch

from engine.attention.base import SeqSpan
from engine.config import SCRATCH_SLOTS
from engine.drafter import CompactHead, Drafter, Proposal, draft_probabilities, draw_rows
from engine.runner import Chunk, slot_index
from engine.sampling import race_ranked
from engine.sequence import Sequence


class SsdDrafter(Drafter):
    """A Drafter that also serves SSD. Its runner must have `max_num_seqs * SCRATCH_SLOTS` extra slots:
    each running request owns one scratch region there for its branch tokens."""

    def __init__(self, runner, blocks, *, max_model_len: int, max_num_seqs: int):
        super().__init__(runner, blocks)
        self.max_model_len = max_model_len
        self.cache: dict[int, dict[tuple[int, int], Proposal]] = {}
        self.outcome: dict[int, tuple[int, int]] = {}  # request id -> (k, t*) of its last verification
        self.glued: set[int] = set()                   # requests whose last proposal got a glue pass
        self.free_regions = list(range(max_num_seqs))
        self.region: dict[int, int] = {}               # request id -> its scratch region

    def start(self, seqs: list[Sequence], *, upto: dict[Sequence, int] | None = None) -> dict[Sequence, int]:
        for seq in seqs:
            if seq.seq_id not in self.region:  # (a later chunk of its prompt)
                self.region[seq.seq_id] = self.free_regions.pop()
        return super().start(seqs, upto=upto)

    # -- answering ---------------------------------------------------------------------------------
    def answer(
        self, wanted: dict[Sequence, int], draft_temperature: float | None, fanout: tuple[int, ...] = (), *,
        backup: str = "jit", lookup: bool = False, ahead: dict[Sequence, int] | None = None,
    ) -> tuple[dict[Sequence, Proposal], dict[Sequence, bool | None]]:
        """Proposals for this round: from the cache on a hit; on a miss drafted just in time (backup "jit") or
        guessed from the context at no cost (backup "fast": see `_fast_guess`). hit is None for a request's
        first round (nothing could be cached yet) and for a round that drafts nothing (k = 0). `lookup`:
        just-in-time drafts take the context lookup's token where it has one. (`fanout`, `ahead`: the draft
        process's message carries them; here `build_cache` takes them.)"""
        proposals, hits, misses = {}, {}, {}
        for seq, k in wanted.items():
            outcome = self.outcome.pop(seq.seq_id, None)
            branch = self.cache.pop(seq.seq_id, {}).get(outcome) if outcome else None
            hits[seq] = None if outcome is None or k == 0 else branch is not None
            if branch is not None and k > 0:
                self.mirror(seq)
                proposals[seq] = _handed_out(branch, k, self.head)
                self.handed_out[seq.seq_id] = proposals[seq].from_lookup
            elif backup == "fast" and k > 0:
                self.mirror(seq)
                proposals[seq] = self._fast_guess(seq, k)
            else:
                misses[seq] = k
        proposals |= self.propose(misses, draft_temperature, lookup)
        return proposals, hits

    def _fast_guess(self, seq: Sequence, k: int) -> Proposal:
        """The fast backup: k tokens from the context lookup (engine.lookup), each after the ones guessed before
        it, the last token repeated where the context has no match; no draft cost. Requests sampled by the rejection
        rule get one-hot q rows, which keep it exact (a token proposed with certainty is accepted with probability
        p(x), and the residual then excludes it)."""
        committed, proposal = self.seqs[seq.seq_id].token_ids, Proposal([], [] if seq.needs_q else None)
        for _ in range(k):
            token = self.lookups.guess(seq.seq_id, committed, proposal.tokens)
            proposal.add_guess((proposal.tokens or committed)[-1] if token is None else token, self.vocab_size)
        return proposal

    # -- building the cache ------------------------------------------------------------------------
    def build_cache(
        self, proposals: dict[Sequence, Proposal], fanout: tuple[int, ...], draft_temperature: float | None,
        lookup: bool = False, ahead: dict[Sequence, int] | None = None,
    ) -> None:
        """Draft the branches for this round's likely outcomes (`lookup`: they take the context lookup's token
        where it has one). A request that drafts nothing this round gets branches only with ahead[seq] > 0: that
        many drafts after each likely token of the target's plain step, the round's whole fan-out on that one
        outcome (the policy asks for them before SSD's probe of a paused request: engine.spec_policy.pre_draft)."""
        # The glue pass always runs on a proposal (the verify positions fit: see spec_decode.lookahead), so
        # the draft's KV along the verified path is right whether the proposal came from the cache or not.
        ahead = ahead or {}
        length = {s: len(p.tokens) or ahead.get(s, 0) for s, p in proposals.items()}  # each branch's drafts
        seqs = [s for s in proposals if length[s]]
        if not seqs:
            return
        glue = self._glue(seqs, proposals)  # per seq [k+1, V or Vr]
        for seq in seqs:
            self.cache[seq.seq_id] = {}
            self.glued.add(seq.seq_id)
        seqs = [s for s in seqs if self._has_room(s, length[s], not proposals[s].tokens)]
        branches = []  # (seq, j, t*)
        for seq in seqs:
            drafts = proposals[seq].tokens
            rank = self._ranking(seq, glue[seq], draft_temperature)
            for j, row in enumerate(glue[seq]):
                width = fanout[min(j, len(fanout) - 1)] if drafts else sum(fanout)
                top = rank(j, row, min(width + 1, row.shape[-1]))
                top = top if self.head is None else self.head.tokens(top)
                skip = drafts[j] if j < len(drafts) else None  # the target would have accepted it
                candidates = [t for t in top if t != skip][:width]
                if j == len(drafts) and width > 0:  # all accepted: the target's next token is often the context's
                    # (83% where the lookup has one, on the held-out chat replies), and then often not the top F_K
                    guess = self.guess(seq, drafts, lookup)
                    if guess is not None and guess not in candidates:
                        candidates.append(guess)
                branches += [(seq, j, t) for t in candidates]
        limit = {s: SCRATCH_SLOTS // length[s] for s in seqs}
        branches = _cap_per_request(branches, limit)
        rows = _pad_rows(branches, limit)
        drafted = self._draft_branches(rows, proposals, length, draft_temperature, lookup) if branches else []
        for (seq, j, t), branch in zip(branches, drafted, strict=False):  # padding rows come last and are dropped
            self.cache[seq.seq_id][(j, t)] = branch

    def _ranking(self, seq: Sequence, rows: torch.Tensor, draft_temperature: float | None):
        """How the fan-out ranks the candidates for t* in glue row j (position len + j): by the draft's logits; for a
        coupled request (engine.coupling) the draft's race over q at that position first (its winners are the
        target's likeliest), then the logits' order for the rest. -> rank(j, row, n): n indices into the row."""
        if seq.noise_key is None:
            return lambda j, row, n: torch.topk(row, n).indices.tolist()
        q = draft_probabilities(rows, seq.params, draft_temperature)  # [K+1, V or Vr]
        ids = None if self.head is None else self.head.ids

        def rank(j: int, row: torch.Tensor, n: int) -> list[int]:
            first = race_ranked(q[j], seq.noise_key, len(seq.token_ids) + j, ids, n)
            rest = [i for i in torch.topk(row, min(n + len(first), row.shape[-1])).indices.tolist() if i not in first]
            return (first + rest)[:n]

        return rank

    def _has_room(self, seq: Sequence, k: int, pre_draft: bool = False) -> bool:
        # the deepest branch token sits at position len + 2k - 1 (all accepted, then k more); a pre-draft's (nothing
        # proposed: the plain step's token, then k) at len + k - 1
        return len(seq.token_ids) + (k if pre_draft else 2 * k) <= self.max_model_len

    def _glue(self, seqs: list[Sequence], proposals: dict[Sequence, Proposal]) -> dict[Sequence, torch.Tensor]:
        """One forward over each request's [t, x1..xK] at their true positions (real KV slots), after the committed
        tokens the draft has no KV for yet (rounds that drafted nothing and built no cache: the draft only
        followed). Returns the last K+1 rows of each."""
        chunks = []
        for seq in seqs:
            draft_seq, drafts = self.seqs[seq.seq_id], proposals[seq].tokens
            n = len(seq.token_ids)
            self.blocks.ensure_capacity(draft_seq, n + len(drafts))
            start = min(draft_seq.num_computed_tokens, n - 1)
            chunks.append(Chunk(draft_seq, start, n + len(drafts), (*seq.token_ids[start:], *drafts)))
        logits = self.runner.run(chunks, all_logits=True, compact=self.head is not None)  # [sum(rows_i), V or Vr]
        out, row = {}, 0
        for seq, chunk in zip(seqs, chunks, strict=True):
            row += chunk.end - chunk.start
            out[seq] = logits[row - len(proposals[seq].tokens) - 1 : row]  # [K+1, V or Vr]
        return out

    def _draft_branches(
        self, branches: list[tuple[Sequence, int, int]], proposals: dict[Sequence, Proposal],
        length: dict[Sequence, int], draft_temperature: float | None, lookup: bool,
    ) -> list[Proposal]:
        """K batched decode steps over every branch, branch tokens in per-request scratch slots. With `lookup`, a
        branch takes the context lookup's token where it has one and skips the model for that step; the
        tokens it skipped go through the model with the branch's next model step (several rows, one span)."""
        bs = self.runner.block_size
        per_seq: dict[Sequence, int] = {}
        scratch_base = []  # first scratch slot of each branch: branch i of a request owns [i*K, (i+1)*K)
        for seq, _, _ in branches:
            index = per_seq.get(seq, 0)
            per_seq[seq] = index + 1
            region = self.runner.first_extra_slot + self.region[seq.seq_id] * SCRATCH_SLOTS
            scratch_base.append(region + index * length[seq])
        out = [Proposal([], [] if seq.needs_q else None) for seq, _, _ in branches]
        deepest: dict[Sequence, int] = {}
        for seq, j, _ in branches:
            deepest[seq] = max(j, deepest.get(seq, 0))
        paths = {}  # a request's real KV slots: the prefix and the verified path, to its deepest branch's j
        for seq, j in deepest.items():
            path = slot_index(self.seqs[seq.seq_id].block_table, 0, len(seq.token_ids) + j, bs)
            paths[seq] = torch.arange(path.start, path.stop) if isinstance(path, slice) else path
        keys = [  # a branch's key slots: its request's path up to its j, then its scratch slots (a step: a prefix)
            torch.cat([paths[seq][: len(seq.token_ids) + j], torch.arange(base, base + length[seq])])
            for (seq, j, _), base in zip(branches, scratch_base, strict=True)
        ]
        done = [0] * len(branches)  # branch tokens (t*, then its drafts) whose KV is in its scratch slots
        num_steps = max(length[seq] for seq, _, _ in branches)
        for step in range(num_steps):
            run = []
            for i, (seq, j, t_star) in enumerate(branches):
                if step >= length[seq]:
                    continue
                guess = self.guess(seq, [*proposals[seq].tokens[:j], t_star, *out[i].tokens], lookup)
                if guess is None:
                    run.append(i)
                else:
                    out[i].add_guess(guess, self.vocab_size)
            if not run:
                continue
            ids, positions, write, spans = [], [], [], []
            for i in run:  # branch token s sits at position n + j + s, in scratch slot base + s
                seq, j, t_star = branches[i]
                n, first = len(seq.token_ids), done[i]
                spans.append(SeqSpan(len(ids), step + 1 - first, keys[i][: n + j + step + 1], n + j + step + 1))
                ids += [t_star, *out[i].tokens][first : step + 1]
                positions += range(n + j + first, n + j + step + 1)
                write += range(scratch_base[i] + first, scratch_base[i] + step + 1)
                done[i] = step + 1
            logits = self.runner.run_spans(ids, torch.tensor(positions), write, spans, all_logits=False,
                                           compact=self.head is not None)  # [run, V or Vr]
            draw_rows([out[i] for i in run], [branches[i][0] for i in run], logits, draft_temperature, self.head,
                      spread=False, positions=[len(branches[i][0].token_ids) + branches[i][1] + step + 1 for i in run])
            # (spread when handed out: `answer`)
        return out

    # -- bookkeeping -------------------------------------------------------------------------------
    def commit(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        draft_seq, glued = self.seqs[seq.seq_id], seq.seq_id in self.glued
        if glued:  # the glue pass wrote [t, x1..xK]: its KV is right up to x_k
            self.record_lookup(seq, num_drafted, num_accepted)
            self.glued.discard(seq.seq_id)
            self.frontier.pop(seq.seq_id, None)  # a just-in-time proposal's frontier: the glue supersedes it
            before = self.mirror(seq)
            draft_seq.num_computed_tokens = min(before + num_accepted, len(draft_seq.token_ids) - 1)
            self.blocks.commit(draft_seq)
        else:
            super().commit(seq, num_drafted, num_accepted)
        if num_drafted > 0 or glued:  # (glued without drafts: a plain step's outcome was pre-drafted)
            self.outcome[seq.seq_id] = (num_accepted, seq.token_ids[-1])

    def finish(self, seq: Sequence) -> None:
        for table in (self.cache, self.outcome):
            table.pop(seq.seq_id, None)
        self.glued.discard(seq.seq_id)
        region = self.region.pop(seq.seq_id, None)
        if region is not None:
            self.free_regions.append(region)
        super().finish(seq)


def _handed_out(branch: Proposal, k: int, head: CompactHead | None) -> Proposal:
    """A cached branch's first k drafts, their q rows (cached compact) spread over the vocabulary."""
    probs = None if branch.probs is None else [q if head is None else head.spread(q) for q in branch.probs[:k]]
    return Proposal(branch.tokens[:k], probs, branch.from_lookup[:k])


def _pad_rows(branches: list, limit: dict) -> list:
    """Repeat the last branch up to 16 rows when there are 10-15: MKL's fp32 GEMM is slower for 10-15 rows
    than for 16 (measured: 15 rows cost 1.3-1.5x 16 rows on this CPU), and the extra rows are dropped."""
    if not 10 <= len(branches) < 16:
        return branches
    seq = branches[-1][0]
    extra = 16 - len(branches)
    if sum(b[0] is seq for b in branches) + extra > limit[seq]:  # no scratch room for the copies
        return branches
    return branches + [branches[-1]] * extra


def _cap_per_request(branches: list, limit: dict) -> list:
    """Keep at most limit[seq] branches per request, in order (the order ranks them by fan-out)."""
    kept, count = [], {}
    for branch in branches:
        seq = branch[0]
        if count.get(seq, 0) < limit[seq]:
            kept.append(branch)
            count[seq] = count.get(seq, 0) + 1
    return kept
