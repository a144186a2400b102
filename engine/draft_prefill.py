"""The draft process's prompt prefills (SSD): queued by START, run a chunk at a time between the leader's messages.

The draft process reads the leader's next message between two chunks, so a long prompt's prefill no longer holds
up the leader: a mailbox holds one message (engine.shm_channel), and a START sent behind an unread FINISH used to
wait for the whole of the previous prompt's prefill (an 8k-token prompt after compare's one-token warm-up: SSD's
first token came 15 s after AR's).

A request that finishes while its prompt is still prefilling (a one-token reply, a cancel) leaves an orphan: its
prefill goes on while the process has nothing else to do, so that its prompt lands in the draft's prefix cache as
it does in the target's (compare's warm-up is there for that), and it stops at the leader's next START, ROUND or
STATS. What it computed stays cached: the same prompt sent again goes on from there.
"""

from __future__ import annotations

from engine.sequence import Sequence


class DraftPrefills:
    def __init__(self, drafter, chunk: int):
        """`drafter`: the draft process's Drafter (its `start(seqs, upto=)` and `finish(seq)`); `chunk`: prompt
        tokens a forward at most, all prompts together, as the target's chunks (one forward over a 6k-token prompt
        took 80 MB more at its peak)."""
        self.drafter = drafter
        self.chunk = chunk
        self.pending: dict[Sequence, int] = {}  # prompt -> its tokens prefilled so far, in arrival order
        self.orphans: set[int] = set()           # request ids the leader finished while their prompt prefilled

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def add(self, seqs: list[Sequence]) -> None:
        """Queue new prompts; orphans stop here (the new prompts may need their blocks, which the leader counts as
        free)."""
        self.drop_orphans()
        for seq in seqs:
            self.pending[seq] = 0

    def finish(self, seq_id: int) -> bool:
        """The leader finished `seq_id`: True if its prompt is still prefilling (it is an orphan now, and its draft
        sequence is freed once its prefill ends or stops), False if it is not here."""
        if not any(seq.seq_id == seq_id for seq in self.pending):
            return False
        self.orphans.add(seq_id)
        return True

    def drop_orphans(self) -> None:
        """Stop the orphans' prefills and free their draft sequences (their computed blocks stay in the cache)."""
        for seq in [s for s in self.pending if s.seq_id in self.orphans]:
            del self.pending[seq]
            self.drafter.finish(seq)
        self.orphans.clear()

    def step(self) -> dict[int, int]:
        """One forward of at most `chunk` prompt tokens over the queued prompts, in order. Returns, for each live
        request whose prompt it finished, the prompt tokens reused from the draft's prefix cache."""
        budget, upto = self.chunk, {}
        for seq, done in self.pending.items():
            upto[seq] = min(len(seq.token_ids), done + budget)
            budget -= upto[seq] - done
            if budget == 0:
                break
        started = self.drafter.start(list(upto), upto=upto)
        reused = {}
        for seq, end in upto.items():
            if end < len(seq.token_ids):
                self.pending[seq] = end
                continue
            del self.pending[seq]
            if seq.seq_id in self.orphans:
                self.orphans.discard(seq.seq_id)
                self.drafter.finish(seq)
            else:
                reused[seq.seq_id] = started[seq]
        return reused

    def settle(self) -> dict[int, int]:
        """Drop the orphans and finish every live prompt (before a round, which needs their KV): `step`'s counts."""
        self.drop_orphans()
        reused = {}
        while self.pending:
            reused |= self.step()
        return reused
