"""The leader's handle on the draft rank (SSD with the draft in its own process).

It looks like an in-process drafter to the engine core (start / answer / commit / finish), but only
sends what changed: a request's prompt once, then per round (k wanted, the last verification's
outcome). `answer` is the only call that waits for the draft; on a cache hit the draft replies at once,
because it built the cache while the target verified the previous round.

A draft rank that dies or stops answering raises DraftLost; the core then finishes the affected
requests in AR mode.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable

import torch

from engine import shm_channel, spawning
from engine.config import BACKUPS
from engine.distributed import Channel, RankSpec, float_bits, free_port, host_store, make_group, spawn_rank
from engine.draft_server import (
    FINISH,
    NO_OUTCOME,
    NO_TEMPERATURE,
    ROUND,
    SHUTDOWN,
    START,
    STATS,
    DraftSpec,
    decode_reply,
    encode_start,
    load,
    proposal_of,
    serve,
)
from engine.drafter import Proposal
from engine.sequence import Sequence

log = logging.getLogger(__name__)

DRAFT_RANK = 1
CLOSE_WAIT_S = 5.0  # the longest close() waits for the draft process's answer to SHUTDOWN before killing it


class DraftLost(RuntimeError):
    """The draft rank died or stopped answering."""


class RemoteDrafter:
    def __init__(self, spec: DraftSpec, rank: RankSpec, *, timeout_s: float = 120.0):
        """Start the draft process, which loads the draft while the caller goes on (loading the target: the two
        overlap, 2.5 s of a start on a 2-core CPU); `connect` then waits for it. `timeout_s`: how long any one
        exchange may take before the draft counts as lost."""
        self.spec = spec
        self.block_size = spec.block_size
        self.num_blocks = spec.num_blocks
        self.timeout_s = timeout_s
        self.port = free_port()
        self.store = host_store(self.port, 2)
        self.block = _shm_block()
        try:  # (a Ctrl-C or SIGTERM during the spawn: the block must not outlive it)
            spec = spec if self.block is None else dataclasses.replace(spec, shm=self.block.name)
            self.proc = spawn_rank(serve, rank, self.port, 2, spec, load=load)
        except BaseException:
            self._free_block()
            raise
        self.alive = False
        self.channel: Channel | shm_channel.ShmChannel | None = None  # connect's
        self.seqs: dict[int, int] = {}                       # request id -> draft blocks reserved for it
        self.outcome: dict[int, tuple[int, int, int, int]] = {}  # request id -> (drafted, accepted, t*, length)
        self.reused: dict[int, int] = {}
        self.last_idle_s = 0.0

    def connect(self, vocab_size: int) -> None:
        """Wait for the draft process to load its draft and join; DraftLost if it died first (then it is gone)."""
        self.vocab_size = vocab_size
        try:
            self.group = make_group(self.port, 0, 2, datetime.timedelta(seconds=self.timeout_s), [self.proc],
                                    store=self.store)
            gloo = Channel(self.group, DRAFT_RANK)  # the draft rank joins once its model is loaded
        except BaseException as exc:
            self._abandon()
            if isinstance(exc, RuntimeError):
                raise DraftLost(f"the draft process did not start: {_first_line(exc)}") from exc
            raise
        self.channel = gloo if self.block is None else shm_channel.ShmChannel(
            self.block, 0, gloo, owner=True, alive=self.proc.is_alive, timeout_s=self.timeout_s)
        self.alive = True

    def _abandon(self) -> None:
        """Stop a draft process that never connected (it failed, or the leader's start did) and free its block."""
        self.proc.kill()
        self.proc.join(5.0)
        self._free_block()

    def _free_block(self) -> None:
        if self.block is not None:
            self.block.close()
            self.block.unlink()
            self.block = None

    # -- admission (a conservative count: the draft's prefix sharing is not known here) ---------
    def admission_budget(self, running: list[Sequence], reserve_of: Callable[[Sequence], int]) -> int:
        """The draft's free blocks less those its running requests hold (counted at `start` from their reserves:
        `reserve_of` is Drafter.admission_budget's, not needed here)."""
        held = sum(self.seqs[s.seq_id] for s in running if s.seq_id in self.seqs)
        return self.num_blocks - held

    def admit(self, seq: Sequence, reserve: int, spare: int) -> int | None:
        need = -(-reserve // self.block_size)
        return need if need <= spare else None

    # -- the protocol ----------------------------------------------------------------------------
    def start(self, seqs: list[Sequence], reserve_of: Callable[[Sequence], int]) -> dict[Sequence, int]:
        msg = [START, len(seqs)]
        for seq in seqs:
            if seq.noise_key is not None:  # the draft runs the same race (engine.coupling)
                seed = seq.noise_key
            else:
                seed = 0 if seq.generator is None else int(torch.randint(2**62, (1,), generator=seq.generator))
            msg += encode_start(seq, seed)
            self.seqs[seq.seq_id] = -(-reserve_of(seq) // self.block_size)
        self._send(msg)
        return {}  # the reused counts come with each request's first answer

    def answer(
        self, wanted: dict[Sequence, int], draft_temperature: float | None, fanout: tuple[int, ...], *,
        backup: str = "jit", lookup: bool = False, ahead: dict[Sequence, int] | None = None,
    ) -> tuple[dict[Sequence, Proposal], dict[Sequence, bool | None]]:
        """The round's proposals. A round where no request drafts (k = 0: plain steps) only tells the draft process
        the outcomes (and what to pre-draft: `ahead`), and does not wait for its answer."""
        temp = NO_TEMPERATURE if draft_temperature is None else draft_temperature
        quiet = not any(wanted.values())
        msg = [ROUND, len(wanted), float_bits(temp), BACKUPS.index(backup), int(lookup), int(quiet), len(fanout),
               *fanout]
        for seq, k in wanted.items():
            drafted, accepted, t_star, length = self.outcome.pop(seq.seq_id, (NO_OUTCOME, 0, 0, len(seq.token_ids)))
            msg += [seq.seq_id, k, (ahead or {}).get(seq, 0), drafted, accepted, t_star, length]
        self._send(msg)
        if quiet:
            self.last_idle_s = None
            return {seq: proposal_of([], None) for seq in wanted}, dict.fromkeys(wanted)
        self.last_idle_s, replies = decode_reply(self._call(self.channel.recv_ints))
        num_rows = sum(len(replies[s.seq_id][2]) for s in wanted if s.needs_q)
        rows = self._call(self.channel.recv_tensor, (num_rows, self.vocab_size), torch.float32) if num_rows else None
        proposals, hits, row = {}, {}, 0
        for seq in wanted:
            hit, reused, tokens = replies[seq.seq_id]
            if reused is not None:
                self.reused[seq.seq_id] = reused
            q = None
            if seq.needs_q and tokens:
                q, row = rows[row : row + len(tokens)], row + len(tokens)
            proposals[seq], hits[seq] = proposal_of(tokens, q), hit
        return proposals, hits

    def build_cache(self, proposals, fanout, draft_temperature, lookup: bool = False, ahead=None) -> None:
        """Nothing to do here: the draft rank builds its cache by itself while the target verifies."""

    def commit(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        self.outcome[seq.seq_id] = (num_drafted, num_accepted, seq.token_ids[-1], len(seq.token_ids))

    def pop_reused(self, seq: Sequence) -> int | None:
        return self.reused.pop(seq.seq_id, None)

    def finish(self, seq: Sequence) -> None:
        self.outcome.pop(seq.seq_id, None)
        self.reused.pop(seq.seq_id, None)
        if self.seqs.pop(seq.seq_id, None) is not None and self.alive:
            try:
                self._send([FINISH, 1, seq.seq_id])
            except DraftLost:
                log.warning("the draft process is gone; it held request %d", seq.seq_id)

    def stats(self) -> tuple[int, int, int]:
        """(free blocks, total blocks, live requests) as the draft rank sees them."""
        self._send([STATS])
        free, total, live = self._call(self.channel.recv_ints)
        return free, total, live

    def drop(self) -> None:
        """Give up on a draft process whose exchange was cut half-way (a second Ctrl-C): it is out of step. It is
        killed, and close() does not wait for it."""
        self.alive = False
        if self.proc.is_alive():
            self.proc.kill()

    def close(self, timeout_s: float = 10.0) -> None:
        if self.channel is None:  # never connected
            self._abandon()
            return
        if self.alive:
            if isinstance(self.channel, shm_channel.ShmChannel):  # an idle draft answers in ms: do not wait minutes
                self.channel.timeout_s = min(self.channel.timeout_s or CLOSE_WAIT_S, CLOSE_WAIT_S)
            try:
                self._send([SHUTDOWN])
                self._call(self.channel.recv_ints)
            except DraftLost:
                pass
        self.alive = False
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            log.warning("the draft process did not stop; killing it")
            self.proc.kill()
            self.proc.join(timeout_s)
        self.channel.close()

    # -- transport with fault detection ---------------------------------------------------------
    def _send(self, msg: list[int]) -> None:
        self._call(self.channel.send_ints, msg)

    def _call(self, fn, *args):
        if not self.alive:
            raise DraftLost("the draft process is gone")
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except RuntimeError as exc:
            self.alive, waited = False, time.perf_counter() - t0
            self.proc.join(0.5)  # (a dying process: its socket may close before it can be reaped)
            if self.proc.is_alive():  # it stopped answering: do not leave it behind
                self.proc.kill()
                raise DraftLost(f"the draft process did not answer for {waited:.0f} s: {_first_line(exc)}") from exc
            raise DraftLost(f"the draft process died ({_exit_status(self.proc.exitcode)})") from exc


def _shm_block():
    """The shared-memory block of the round messages (engine.shm_channel), or None: gloo (not x86-64,
    SSD_CHAT_SHM=0, or no shared memory here)."""
    if not shm_channel.available():
        return None
    try:
        return shm_channel.ShmChannel.new_block()
    except OSError as exc:
        log.warning("no shared memory for SSD's round messages (%s); they go over gloo", exc)
        return None


def _exit_status(code: int | None) -> str:
    if code is None:
        return "it exited"
    return spawning.killed_by(code) if code < 0 else f"exit code {code}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
