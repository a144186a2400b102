"""Tensor parallelism across processes: target ranks 1..TP-1 replay the leader's forward passes.

The leader owns scheduling and the block manager; every rank owns its shard of the weights and of
the KV cache (its KV heads, the same slots). Before each forward the leader broadcasts the inputs
(token ids, positions, KV slots to write, each span's key slots and mask), so every rank runs the same
forward and meets the leader in the same all-reduces. Only the leader samples.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from engine.attention.base import Index, SeqSpan
from engine.config import FastPath
from engine.runner import ModelRunner

STOP = -1


@dataclass(frozen=True)
class TargetShardSpec:
    """What a TP rank needs to build its shard (pickled to the child)."""

    model_path: str
    rank: int
    tp: int
    num_blocks: int
    block_size: int
    max_model_len: int
    dtype: str
    device: str
    fast: FastPath = field(default_factory=FastPath)  # attention backend, CUDA graphs, torch.compile
    nccl_port: int | None = None  # CUDA: the TP all-reduce's NCCL group meets here (control stays on gloo)


class BroadcastingRunner(ModelRunner):
    """The leader's runner: broadcasts every forward's inputs to the other TP ranks first."""

    def __init__(self, *args, group, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group

    def run_spans(self, ids, positions, write_slots, spans, *, all_logits, greedy=False, compact=False):
        _broadcast(self.group, encode(ids, positions, write_slots, spans, all_logits))
        # (greedy changes nothing on a sharded head: engine.layers.greedy_head takes one rank's whole head only)
        return super().run_spans(ids, positions, write_slots, spans, all_logits=all_logits, greedy=greedy,
                                 compact=compact)

    def stop_workers(self) -> None:
        _broadcast(self.group, [STOP])


def serve(group, spec: TargetShardSpec) -> None:
    """A TP rank's main loop: run every forward the leader announces, until STOP."""
    from engine.build import build_target_shard  # the model code is imported in the child only

    runner = build_target_shard(spec, group)
    while True:
        msg = _receive(group)
        if msg[0] == STOP:
            return
        ids, positions, write_slots, spans, all_logits = decode(msg)
        runner.run_spans(ids, positions, write_slots, spans, all_logits=all_logits)


# -- the wire format: one int64 list -----------------------------------------------------------------
def encode(ids: list[int], positions: torch.Tensor, write_slots, spans: list[SeqSpan], all_logits: bool) -> list[int]:
    msg = [len(ids), *ids, *positions.tolist(), int(all_logits), *_index(write_slots), len(spans)]
    for s in spans:
        msg += [s.q_start, s.q_len, s.num_keys, *_index(s.key_slots)]
        if s.mask is None:
            msg.append(0)
        else:
            msg += [1, *s.mask.flatten().int().tolist()]
    return msg


def decode(msg: list[int]):
    n = msg[0]
    ids, positions = msg[1 : 1 + n], torch.tensor(msg[1 + n : 1 + 2 * n], dtype=torch.long)
    i = 1 + 2 * n
    all_logits = bool(msg[i])
    write_slots, i = _read_index(msg, i + 1)
    count, i = msg[i], i + 1
    spans = []
    for _ in range(count):
        q_start, q_len, num_keys = msg[i : i + 3]
        key_slots, i = _read_index(msg, i + 3)
        has_mask, i = msg[i], i + 1
        mask = None
        if has_mask:
            mask = torch.tensor(msg[i : i + q_len * num_keys], dtype=torch.bool).view(q_len, num_keys)
            i += q_len * num_keys
        spans.append(SeqSpan(q_start, q_len, key_slots, num_keys, mask))
    return ids, positions, write_slots, spans, all_logits


def _index(slots: Index | list[int]) -> list[int]:
    if isinstance(slots, slice):
        return [0, slots.start, slots.stop]
    values = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
    return [1, len(values), *values]


def _read_index(msg: list[int], i: int) -> tuple[Index | list[int], int]:
    if msg[i] == 0:
        return slice(msg[i + 1], msg[i + 2]), i + 3
    n = msg[i + 1]
    return torch.tensor(msg[i + 2 : i + 2 + n], dtype=torch.long), i + 2 + n


def _broadcast(group, msg: list[int]) -> None:
    group.broadcast(torch.tensor([len(msg)], dtype=torch.long), 0).wait()
    group.broadcast(torch.tensor(msg, dtype=torch.long), 0).wait()


def _receive(group) -> list[int]:
    header = torch.zeros(1, dtype=torch.long)
    group.broadcast(header, 0).wait()
    payload = torch.empty(int(header[0]), dtype=torch.long)
    group.broadcast(payload, 0).wait()
    return payload.tolist()


def stop_ranks(workers: list, runner: object, *, cut: bool) -> None:
    """Stop the TP ranks: told to, or killed at once after a cut step (each is mid-collective: a STOP would meet
    its all-reduce and wait there)."""
    if workers and not cut and isinstance(runner, BroadcastingRunner):
        with contextlib.suppress(RuntimeError):
            runner.stop_workers()
    for proc in workers:
        if cut:
            proc.kill()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
