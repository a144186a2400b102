"""The draft rank (SSD): a process that owns the draft model, its KV cache and block manager.

Per round the leader sends only what changed (new sequences, each request's verification outcome
(drafted, accepted, t*), finished requests); the server answers with the next proposal (from the
speculation cache on a hit, drafted just in time on a miss), and then, while the target verifies,
builds the speculation cache for the outcomes of that round. A round where no request drafts (k = 0: the target
runs plain steps) gets no answer: the leader goes on at once, and the server pre-drafts only what the message asks
for (`ahead`: before SSD's probe of a paused request). Greedy and coupled rounds (engine.coupling) carry token ids
only; rounds sampled by the rejection rule add the q rows it needs. A START's prompts prefill a chunk at a time
between the leader's messages (engine.draft_prefill).

Messages are int64 lists (engine.distributed.Channel); floats travel as their bit patterns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from engine.config import BACKUPS, FastPath
from engine.distributed import LEADER, Channel, bits_float, float_bits
from engine.draft_prefill import DraftPrefills
from engine.drafter import Proposal
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.shm_channel import ShmChannel

log = logging.getLogger(__name__)

START, ROUND, FINISH, STATS, SHUTDOWN = range(1, 6)
NO_TEMPERATURE = -1.0  # "the draft samples at the request's temperature"
NO_OUTCOME = -1        # a request's first round: nothing verified yet


@dataclass(frozen=True)
class DraftSpec:
    """What the draft rank needs to build its side (a plain value: it is pickled to the child)."""

    model_path: str
    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    enable_prefix_caching: bool
    dtype: str
    device: str
    fast: FastPath = field(default_factory=FastPath)  # attention backend, CUDA graphs, torch.compile
    target_path: str | None = None  # the target's directory, for a draft that borrows its embedding
    shm: str | None = None          # the shared-memory block of the round messages (engine.shm_channel), or gloo
    prefill_chunk: int = 256        # prompt tokens per prefill forward, as the target's (EngineConfig.prefill_chunk)


def encode_start(seq: Sequence, draft_seed: int) -> list[int]:
    """A request's START entry. draft_seed: its noise key where it is coupled (int(coupled) says so), else the seed
    of the draft's own generator."""
    p = seq.params
    return [seq.seq_id, draft_seed, int(seq.noise_key is not None), float_bits(p.temperature), p.top_k,
            float_bits(p.top_p), len(seq.token_ids), *seq.token_ids]


def load(spec: DraftSpec):
    """Build the draft (in the child, before it joins the group): (drafter, its spec)."""
    from engine.build import build_drafter  # the model code is imported in the child only

    return build_drafter(spec), spec


def serve(group, loaded) -> None:
    """The draft rank's main loop (runs in the child process until SHUTDOWN or the leader's death)."""
    drafter, spec = loaded
    channel = Channel(group, LEADER) if spec.shm is None else ShmChannel.attach(spec.shm, Channel(group, LEADER))
    try:
        _Server(drafter, channel, spec.prefill_chunk).loop()
    finally:
        channel.close()


class _Server:
    def __init__(self, drafter, channel: Channel | ShmChannel, prefill_chunk: int):
        self.drafter = drafter
        self.channel = channel
        self.prefills = DraftPrefills(drafter, prefill_chunk)
        self.shadow: dict[int, Sequence] = {}   # request id -> the target's committed tokens, as last told
        self.last: dict[int, list[int]] = {}    # request id -> tokens of its last proposal
        self.reused: dict[int, int] = {}        # request id -> prompt tokens from the draft's prefix cache (unsent)
        self.unsent_idle = 0.0                  # seconds idle before quiet rounds, told with the next answer

    def loop(self) -> None:
        while True:
            if self.prefills.busy and not self.channel.poll():  # a prompt's next chunk, unless a message waits
                self.reused |= self.prefills.step()
                continue
            t0 = time.perf_counter()
            msg = self.channel.recv_ints()
            idle = time.perf_counter() - t0
            op = msg[0]
            if op == START:
                self._start(msg)
            elif op == ROUND:
                self._round(msg, idle)
            elif op == FINISH:
                for seq_id in msg[2 : 2 + msg[1]]:
                    self._finish(seq_id)
            elif op == STATS:  # as the leader knows it: no orphans, every prompt prefilled
                self.reused |= self.prefills.settle()
                blocks = self.drafter.blocks
                self.channel.send_ints([blocks.num_free_blocks, len(blocks.blocks), len(self.drafter.seqs)])
            elif op == SHUTDOWN:
                self.channel.send_ints([0])
                return
            else:
                raise RuntimeError(f"unknown draft op {op}")

    def _start(self, msg: list[int]) -> None:
        seqs, i = [], 2
        for _ in range(msg[1]):
            seq_id, seed, coupled, temp, top_k, top_p, n = msg[i : i + 7]
            tokens = msg[i + 7 : i + 7 + n]
            i += 7 + n
            params = SamplingParams(temperature=bits_float(temp), top_k=top_k, top_p=bits_float(top_p),
                                    max_tokens=1 << 30, sampler="coupled" if coupled else "rejection")
            generator = torch.Generator().manual_seed(seed) if not params.is_greedy and not coupled else None
            seq = Sequence(seq_id, tokens, params, generator, seed=seed)  # (coupled: its noise_key)
            self.shadow[seq_id] = seq
            seqs.append(seq)
        self.prefills.add(seqs)  # prefilled a chunk at a time by the loop, between messages

    def _round(self, msg: list[int], idle: float) -> None:
        # [ROUND, n, draft_temperature, backup, lookup, quiet, n_fanout, fanout..., then per request:
        #  seq_id, wanted, ahead, drafted, accepted, t*, committed length]; a quiet round (nobody drafts) gets no reply
        n, temp, backup, lookup, quiet = msg[1], bits_float(msg[2]), BACKUPS[msg[3]], bool(msg[4]), bool(msg[5])
        draft_temperature = None if temp == NO_TEMPERATURE else temp
        n_fan = msg[6]
        fanout = tuple(msg[7 : 7 + n_fan])
        self.reused |= self.prefills.settle()
        wanted, ahead, i = {}, {}, 7 + n_fan
        for _ in range(n):
            seq_id, k, pre, drafted, accepted, t_star, length = msg[i : i + 7]
            i += 7
            seq = self.shadow[seq_id]
            if drafted != NO_OUTCOME:
                seq.token_ids += [*self.last.get(seq_id, [])[:accepted], t_star]
                self.drafter.commit(seq, drafted, accepted)
            if len(seq.token_ids) != length:
                raise RuntimeError(f"request {seq_id}: draft holds {len(seq.token_ids)} tokens, target {length}")
            wanted[seq] = k
            if pre:
                ahead[seq] = pre
        proposals, hits = self.drafter.answer(wanted, draft_temperature, fanout, backup=backup, lookup=lookup)
        for seq in wanted:
            self.last[seq.seq_id] = proposals[seq].tokens
        if quiet:
            self.unsent_idle += idle
            self.drafter.build_cache(proposals, fanout, draft_temperature, lookup, ahead)
            return
        reply, rows = [n, int((idle + self.unsent_idle) * 1e6)], []
        self.unsent_idle = 0.0
        for seq in wanted:  # the leader reads the q rows in its own order
            prop = proposals[seq]
            hit = hits.get(seq)
            reply += [seq.seq_id, -1 if hit is None else int(hit), self.reused.pop(seq.seq_id, -1),
                      len(prop.tokens), *prop.tokens]
            rows += prop.probs or []
        self.channel.send_ints(reply)
        if rows:
            self.channel.send_tensor(torch.stack(rows).float())  # [sampled draft tokens, V]
        self.drafter.build_cache(proposals, fanout, draft_temperature, lookup, ahead)

    def _finish(self, seq_id: int) -> None:
        seq = self.shadow.pop(seq_id, None)
        self.last.pop(seq_id, None)
        self.reused.pop(seq_id, None)
        if seq is not None and not self.prefills.finish(seq_id):  # (an orphan is freed when its prefill ends)
            self.drafter.finish(seq)


def decode_reply(msg: list[int]) -> tuple[float, dict[int, tuple[bool | None, int | None, list[int]]]]:
    """-> (draft idle seconds, {request id: (hit, reused prompt tokens or None, proposal tokens)})."""
    n, idle, out, i = msg[0], msg[1] / 1e6, {}, 2
    for _ in range(n):
        seq_id, hit, reused, k = msg[i : i + 4]
        out[seq_id] = (None if hit < 0 else bool(hit), None if reused < 0 else reused, msg[i + 4 : i + 4 + k])
        i += 4 + k
    return idle, out


def proposal_of(tokens: list[int], rows: torch.Tensor | None) -> Proposal:
    return Proposal(tokens, None if rows is None else list(rows))
