"""The decode loop: admit waiting sequences, run one step, commit, check for the end.

``EngineCore.step()`` reads like the engine: schedule -> run (prefill, AR decode, or a speculative
step) -> commit tokens with stop checks. It knows token ids only; text, stop strings and timing live
in the request layer above (llm.py).
"""

from __future__ import annotations

from collections import deque

from engine.config import SpeculationConfig
from engine.kv.block_manager import BlockManager
from engine.outputs import EngineWarning, FinishReason, TokenSource
from engine.remote_drafter import DraftLost, RemoteDrafter
from engine.runner import Chunk, ModelRunner
from engine.sampling import sample_batch
from engine.sequence import SeqStatus, Sequence, StepOutput
from engine.spec_decode import sd_step, ssd_step
from engine.spec_policy import SpecPolicy
from engine.ssd import SsdDrafter

DraftSide = SsdDrafter | RemoteDrafter  # the in-process draft, or SSD's draft process (the same calls, but `start`)


class EngineCore:
    def __init__(self, runner: ModelRunner, blocks: BlockManager, *, max_model_len: int, max_num_seqs: int,
                 eos_token_ids: frozenset[int], prefill_chunk: int, drafter: SsdDrafter | None = None,
                 ssd_drafter: RemoteDrafter | None = None):
        """`drafter` serves SD (and SSD unless `ssd_drafter`, a draft in its own process, is given). A prompt
        prefills `prefill_chunk` tokens a step at most (all requests together)."""
        self.runner = runner
        self.prefill_chunk = prefill_chunk
        self.blocks = blocks
        self.drafter = drafter
        self.drafters: dict[str, DraftSide] = {} if drafter is None else {"sd": drafter, "ssd": ssd_drafter or drafter}
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.spec: dict[int, SpeculationConfig] = {}  # request id -> how it decodes
        self.policy = SpecPolicy(runner.device.type)  # draft lengths and fan-outs, from what was measured
        self.warnings: list[EngineWarning] = []       # for the request layer to report
        self.part_prefilled: list[Sequence] = []      # the last step's prompts that ran a chunk and have more to go

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence, spec: SpeculationConfig) -> None:
        assert len(seq.token_ids) < self.max_model_len, "the request layer checks prompt length"
        assert spec.mode == "ar" or self.drafter is not None, "the request layer checks for a draft"
        if spec.mode != "ar" and spec.mode not in self.drafters:  # its draft process was lost earlier
            lost = f"the draft process is gone: this reply runs in AR mode, not {spec.mode}"
            self.warnings.append(EngineWarning(seq.seq_id, lost, draft_lost=True))
            spec = SpeculationConfig(mode="ar", k=spec.k)
        self.spec[seq.seq_id] = spec
        self.waiting.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End `seq` (also used to cancel it) and release its KV blocks at once, on both models."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free_blocks(seq)
            for drafter in set(self.drafters.values()):
                drafter.finish(seq)
        else:
            self.waiting.remove(seq)
        self.spec.pop(seq.seq_id, None)
        self.policy.forget(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, reason

    def stop_string_hit(self, seq: Sequence, num_dropped: int) -> None:
        """A stop string ended the reply inside the last step: drop that step's last `num_dropped` tokens
        and finish as STOP (even if the same step had also reached max_tokens or the context limit)."""
        if num_dropped:
            del seq.token_ids[-num_dropped:]
        self.finish(seq, FinishReason.STOP)
        seq.finish_reason = FinishReason.STOP

    # -- scheduling ------------------------------------------------------------------------------
    def _reserve_tokens(self, seq: Sequence) -> int:
        return min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)

    def _outstanding(self, blocks: BlockManager, tables: list[list[int]], seqs: list[Sequence]) -> int:
        """Blocks that running sequences may still claim from `blocks` (admission keeps them available)."""
        return sum(
            max(0, blocks.blocks_needed(self._reserve_tokens(s)) - len(t)) for s, t in zip(seqs, tables, strict=True)
        )

    def _admit(self) -> list[Sequence]:
        """Start waiting sequences while every running one can still grow to its reserve, on the target and,
        for speculative requests, on their draft (whose pool shares prefixes differently)."""
        admitted = []
        outstanding = self._outstanding(self.blocks, [s.block_table for s in self.running], self.running)
        draft_spare = {d: d.admission_budget(self.running, self._reserve_tokens) for d in set(self.drafters.values())}
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            reserve = self._reserve_tokens(seq)
            spare = self.blocks.num_free_blocks - outstanding
            if not self.blocks.can_allocate(seq.token_ids, reserve, spare=spare):
                break
            drafter = self.drafters.get(self.spec[seq.seq_id].mode)
            charge = None if drafter is None else drafter.admit(seq, reserve, draft_spare[drafter])
            if drafter is not None and charge is None:
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            outstanding += max(0, self.blocks.blocks_needed(reserve) - len(seq.block_table))
            if drafter is not None:
                draft_spare[drafter] -= charge
        assert admitted or self.running or not self.waiting, "the KV cache cannot hold a single request"
        return admitted

    # -- one step ----------------------------------------------------------------------------------
    def step(self) -> dict[Sequence, StepOutput]:
        """Prefill the next chunk of the prompts still prefilling (newly admitted ones included), or else advance
        every running sequence by one AR or SD step. A step with no output leaves a prompt part-way prefilled."""
        self._admit()
        self.part_prefilled = []
        prefilling = [s for s in self.running if s.num_computed_tokens < s.num_prompt_tokens]
        if prefilling:
            outputs = self._prefill(prefilling)
        else:
            ar = [s for s in self.running if self.spec[s.seq_id].mode == "ar"]
            outputs = self._decode(ar) if ar else {}
            # a group per speculation setting, in arrival order (a set's order follows per-process string hashes)
            for spec in dict.fromkeys(self.spec[s.seq_id] for s in self.running if self.spec[s.seq_id].mode != "ar"):
                group = [s for s in self.running if self.spec[s.seq_id] == spec]
                if group:  # empty when a lost draft process moved its requests to AR earlier in this step
                    outputs |= self._speculate(group, spec)
        return self._commit(outputs)

    def _speculate(self, seqs: list[Sequence], spec: SpeculationConfig) -> dict[Sequence, StepOutput]:
        common = dict(draft_temperature=spec.draft_temperature, max_model_len=self.max_model_len,
                      ensure_capacity=self.blocks.ensure_capacity, lookup=spec.lookup)
        drafter = self.drafters[spec.mode]
        k = {s: self.policy.draft_length(s, spec) for s in seqs}
        if spec.mode == "sd":
            outputs = sd_step(seqs, self.runner, drafter, k=k, **common)
        else:
            ahead = {s: n for s in seqs if k[s] == 0 and (n := self.policy.pre_draft(s, spec))}
            fanout = self.policy.fanout(spec, max([*k.values(), *ahead.values()]), seqs)
            try:
                outputs = ssd_step(seqs, self.runner, drafter, k=k, fanout=fanout, backup=spec.backup, ahead=ahead,
                                   **common)
            except DraftLost as exc:
                self._drop_draft(drafter, exc)
                return self._decode(seqs)
        self.policy.measured(spec.mode, outputs)
        return outputs

    def _drop_draft(self, drafter: RemoteDrafter, exc: Exception) -> None:
        """The draft process died: every request using it (running or waiting) goes on in AR mode from its
        committed tokens (nothing is lost or repeated: a failed round commits nothing), and later requests of
        its modes fall back to AR too (see `add`)."""
        lost = [m for m, d in self.drafters.items() if d is drafter]
        for mode in lost:
            del self.drafters[mode]
        for seq_id, spec in self.spec.items():
            if spec.mode in lost:
                self.spec[seq_id] = SpeculationConfig(mode="ar", k=spec.k)
                self.warnings.append(EngineWarning(seq_id, f"{exc}; continuing in AR mode", draft_lost=True))

    def _prefill(self, seqs: list[Sequence]) -> dict[Sequence, StepOutput]:
        """One chunk of prompt tokens, `prefill_chunk` at most in all, in admission order (the first prompt may
        take the whole chunk). A prompt whose last token runs samples its first token; the others only extend
        their KV. A draft process gets the whole prompt with its first chunk (it prefills while the target runs
        the chunks); the in-process draft prefills each chunk after the target."""
        budget, chunks = self.prefill_chunk, []
        for seq in seqs:
            if budget == 0:
                break
            end = min(seq.num_prompt_tokens, seq.num_computed_tokens + budget)
            chunks.append(Chunk(seq, seq.num_computed_tokens, end))
            budget -= end - seq.num_computed_tokens
        first = [c.seq for c in chunks if c.start == c.seq.num_cached_tokens]
        started: dict[Sequence, int] = {}
        for drafter, own in self._by_drafter(first).items():
            if drafter is not self.drafter:  # start only sends: the draft process prefills while the target does
                started |= self._start_draft(drafter, own)
        outputs = self._run_and_sample(chunks, [r for r, c in enumerate(chunks) if c.end == c.seq.num_prompt_tokens])
        for c in chunks:
            if c.end < c.seq.num_prompt_tokens:  # more of the prompt to go: keep this chunk's KV (and share it)
                c.seq.num_computed_tokens = c.end
                self.blocks.commit(c.seq)
                self.part_prefilled.append(c.seq)
        own = self._by_drafter([c.seq for c in chunks]).get(self.drafter)
        if own:  # the in-process draft: the same chunks, right after the target's
            started |= self.drafter.start(own, upto={c.seq: c.end for c in chunks})
        for seq, reused in started.items():
            if seq in outputs:
                outputs[seq].draft_reused_tokens = reused
        return outputs

    def _by_drafter(self, seqs: list[Sequence]) -> dict[DraftSide, list[Sequence]]:
        by_drafter: dict[DraftSide, list[Sequence]] = {}
        for seq in seqs:
            drafter = self.drafters.get(self.spec[seq.seq_id].mode)
            if drafter is not None:
                by_drafter.setdefault(drafter, []).append(seq)
        return by_drafter

    def _start_draft(self, drafter: RemoteDrafter, seqs: list[Sequence]) -> dict[Sequence, int]:
        try:
            return drafter.start(seqs, self._reserve_tokens)
        except DraftLost as exc:
            self._drop_draft(drafter, exc)
            return {}

    def _decode(self, seqs: list[Sequence]) -> dict[Sequence, StepOutput]:
        for s in seqs:
            self.blocks.ensure_capacity(s, len(s.token_ids))
        return self._run_and_sample([Chunk(s, len(s.token_ids) - 1, len(s.token_ids)) for s in seqs])

    def _run_and_sample(self, chunks: list[Chunk], rows: list[int] | None = None) -> dict[Sequence, StepOutput]:
        """Run the chunks and sample a token for each of `rows` (chunk indices; None: every chunk). A prefill
        samples only the prompts its chunks finish."""
        picked = chunks if rows is None else [chunks[r] for r in rows]
        logits = self.runner.run(chunks, greedy=all(c.seq.params.is_greedy for c in picked))  # [len(chunks), V]
        if not picked:
            return {}
        if rows is not None:
            logits = logits[rows]  # [len(rows), V]
        tokens = sample_batch(logits, [c.seq for c in picked])
        return {c.seq: StepOutput([t], [TokenSource.TARGET], c.end) for c, t in zip(picked, tokens, strict=True)}

    def _commit(self, outputs: dict[Sequence, StepOutput]) -> dict[Sequence, StepOutput]:
        """Append each step's tokens up to the first stop, record the KV they cover, end what stopped."""
        for seq, out in outputs.items():
            reason = None
            for i, token in enumerate(out.tokens):
                seq.token_ids.append(token)
                reason = self._stop_reason(seq, token)
                if reason is not None:
                    del out.tokens[i + 1 :], out.sources[i + 1 :]
                    break
            seq.num_computed_tokens = min(out.num_computed, len(seq.token_ids) - 1)
            self.blocks.commit(seq)
            drafter = self.drafters.get(self.spec[seq.seq_id].mode)
            if drafter is not None and seq.seq_id in drafter.seqs:
                drafter.commit(seq, out.num_drafted, out.num_accepted)
            self.policy.accepted(seq, out.num_drafted, out.num_accepted)
            if reason is not None:
                self.finish(seq, reason)
        return outputs

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.STOP
        if seq.num_generated >= params.max_tokens:
            return FinishReason.LENGTH
        if len(seq.token_ids) >= self.max_model_len:
            return FinishReason.CONTEXT
        return None
