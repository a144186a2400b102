"""The decode loop: admit waiting sequences, run one forward, sample, commit, check for the end.

``EngineCore.step()`` reads like the engine: schedule -> run -> sample -> postprocess. It knows token
ids only; text, stop strings and timing live in the request layer above (llm.py).
"""

from __future__ import annotations

from collections import deque

from engine.kv.block_manager import BlockManager
from engine.outputs import FinishReason
from engine.runner import Chunk, ModelRunner
from engine.sampling import sample_batch
from engine.sequence import SeqStatus, Sequence


class EngineCore:
    def __init__(self, runner: ModelRunner, blocks: BlockManager, *, max_model_len: int, max_num_seqs: int,
                 eos_token_ids: tuple[int, ...]):
        self.runner = runner
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        assert len(seq.token_ids) < self.max_model_len, "the request layer checks prompt length"
        self.waiting.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End `seq` (also used to cancel it) and release its KV blocks at once."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free_blocks(seq)
        else:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason

    def _reserve_tokens(self, seq: Sequence) -> int:
        return min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)

    def _outstanding_blocks(self) -> int:
        """Blocks that running sequences may still claim (admission keeps them available)."""
        return sum(
            max(0, self.blocks.blocks_needed(self._reserve_tokens(s)) - len(s.block_table)) for s in self.running
        )

    def _admit(self) -> list[Sequence]:
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            spare = self.blocks.num_free_blocks - self._outstanding_blocks()
            if not self.blocks.can_allocate(seq.token_ids, self._reserve_tokens(seq), spare=spare):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        assert admitted or self.running or not self.waiting, "the KV cache cannot hold a single request"
        return admitted

    def step(self) -> dict[Sequence, list[int]]:
        """One forward pass: prefill newly admitted sequences, or else decode one token for each running one."""
        admitted = self._admit()
        if admitted:
            chunks = [Chunk(s, s.num_computed_tokens, len(s.token_ids)) for s in admitted]
        else:
            for s in self.running:
                self.blocks.ensure_capacity(s, len(s.token_ids))
            chunks = [Chunk(s, len(s.token_ids) - 1, len(s.token_ids)) for s in self.running]
        if not chunks:
            return {}
        logits = self.runner.run(chunks)  # [B, V]
        seqs = [c.seq for c in chunks]
        tokens = sample_batch(logits, [s.params for s in seqs], [s.generator for s in seqs])
        new: dict[Sequence, list[int]] = {}
        for chunk, token in zip(chunks, tokens, strict=True):
            seq = chunk.seq
            seq.num_computed_tokens = chunk.end
            self.blocks.commit(seq)
            seq.token_ids.append(token)
            new[seq] = [token]
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
        return new

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.STOP
        if seq.num_generated >= params.max_tokens:
            return FinishReason.LENGTH
        if len(seq.token_ids) >= self.max_model_len:
            return FinishReason.CONTEXT
        return None
