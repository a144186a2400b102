"""Owns one model and its KV cache on one device; turns scheduled token chunks into logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, Index, SeqSpan, build_metadata
from engine.compiled_decode import CompiledDecode
from engine.cuda_graphs import MIN_KEYS, StepGraphs
from engine.models.llama import CausalLM
from engine.sequence import Sequence


@dataclass(frozen=True)
class Chunk:
    """Run tokens at positions start..end-1 of `seq`; keys are the seq's positions 0..end-1.

    The tokens are seq.token_ids[start:end] unless `tokens` gives them: speculative tokens (drafts,
    verification) run without being written into the sequence, whose committed state stays untouched.
    """

    seq: Sequence
    start: int
    end: int
    tokens: tuple[int, ...] | None = None

    @classmethod
    def path(cls, seq: Sequence, committed: list[int], drafts: list[int]) -> Chunk:
        """The last committed token and the drafts after it, at their true positions n-1 .. n+k-1 (n =
        len(committed)): a verify's rows, or the draft's glue pass over the same tokens (in `seq`'s KV)."""
        n = len(committed)
        return cls(seq, n - 1, n + len(drafts), (committed[-1], *drafts))

    def token_ids(self) -> list[int]:
        if self.tokens is None:
            return self.seq.token_ids[self.start : self.end]
        assert len(self.tokens) == self.end - self.start
        return list(self.tokens)


def slot_index(block_table: list[int], start: int, end: int, block_size: int) -> Index:
    """KV slots of positions start..end-1: a slice when the blocks are consecutive (no gather)."""
    first, last = start // block_size, (end - 1) // block_size
    blocks = block_table[first : last + 1]
    head, offset = blocks[0], start - first * block_size
    if blocks[-1] - head == last - first and (last - first < 2 or blocks == list(range(head, blocks[-1] + 1))):
        return slice(head * block_size + offset, head * block_size + offset + end - start)
    if end - start <= SMALL_GATHER:  # a list, then one tensor: a third of the tensor ops' time (22 against 66 us)
        slots = [b * block_size + i for b in blocks for i in range(block_size)]
        return torch.tensor(slots[offset : offset + end - start], dtype=torch.long)
    table = torch.tensor(blocks, dtype=torch.long)
    slots = (table[:, None] * block_size + torch.arange(block_size)).flatten()  # [blocks * bs]
    return slots[offset : offset + end - start]


SMALL_GATHER = 256  # slots up to which slot_index builds a scattered index in Python


class ModelRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, *, num_blocks: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, extra_slots: int = 0, graph_batch: int = 0,
                 graph_max_keys: int = 0, graph_min_keys: int = MIN_KEYS, compile_model: bool = False,
                 compile_decode: bool = False, compile_rows: bool = False, kv_dtype: torch.dtype | None = None):
        """KV slots: num_blocks * block_size managed by a BlockManager, then `extra_slots` (SSD scratch).

        graph_batch > 0: single-token decode steps of up to that many sequences, and causal steps of a few rows
        per sequence (verification, SSD's glue pass) of up to cuda_graphs.VERIFY_MAX_BATCH, with up to
        `graph_max_keys` keys each (SDPA: graphs of key lengths from `graph_min_keys` up), replay captured graphs
        (engine.cuda_graphs; CUDA graphs on CUDA, the eager twin on the CPU), which take one more slot for their
        padding rows. compile_model: torch.compile the model forward. compile_decode: one-sequence decode steps
        run a compiled forward (engine.compiled_decode; the CPU), and with compile_rows its several-row steps too
        (verification, prefill). kv_dtype: the KV cache's, where not the model's `dtype` (the CPU's half cache)."""
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device
        args = model.args
        num_slots = num_blocks * block_size + extra_slots
        backend.allocate(
            num_layers=args.num_layers, num_slots=num_slots + (graph_batch > 0),
            num_kv_heads=model.num_kv_heads_local,
            head_dim=args.head_dim, dtype=kv_dtype or dtype, device=device,
        )
        self.first_extra_slot = num_blocks * block_size
        self.num_forward_tokens = 0  # every token that went through the model (tests count compute)
        self.num_forwards = 0  # every forward (the bench: the share that ran compiled)
        self.forward = torch.compile(model.forward, dynamic=True) if compile_model else model.forward
        self.graphs: StepGraphs | None = None
        if graph_batch > 0:
            attn = model.model.layers[0].self_attn
            self.graphs = StepGraphs(self.forward, backend, num_heads=attn.num_heads, dtype=dtype, scale=attn.scale,
                                     pad_slot=num_slots, max_keys=graph_max_keys or num_slots, device=device,
                                     max_batch=graph_batch, min_keys=graph_min_keys)
            with torch.inference_mode():
                self.graphs.capture_all()
        self.compiled: CompiledDecode | None = None
        if compile_decode:
            self.compiled = CompiledDecode(model.forward, backend, device=device, rows=compile_rows)
            with torch.inference_mode():
                self.compiled.warm_up()

    @torch.inference_mode()
    def run(
        self, chunks: list[Chunk], *, all_logits: bool = False, greedy: bool = False, compact: bool = False
    ) -> torch.Tensor:
        """Logits [len(chunks), V] of each chunk's last token, or [sum of chunk lengths, V] if all_logits. greedy:
        the caller uses only each row's argmax (every request of the step is greedy): the logits may then hold
        -inf wherever a token cannot be a row's argmax (engine.layers.greedy_head). compact: a reduced head's
        rows [.., Vr] over its `lm_head.vocab_ids` (a draft's; engine.drafter.CompactHead)."""
        ids, positions, spans, write = [], [], [], []
        bs, row = self.block_size, 0
        for c in chunks:
            n = c.end - c.start
            ids += c.token_ids()
            positions.append(torch.arange(c.start, c.end))
            write.append(slot_index(c.seq.block_table, c.start, c.end, bs))
            spans.append(SeqSpan(row, n, slot_index(c.seq.block_table, 0, c.end, bs), c.end))
            row += n
        write_slots = write[0] if len(write) == 1 else _concat_slots(write)  # one chunk: keep the slice
        return self.run_spans(ids, torch.cat(positions), write_slots, spans, all_logits=all_logits, greedy=greedy,
                              compact=compact)

    @torch.inference_mode()
    def run_spans(
        self, ids: list[int], positions: torch.Tensor, write_slots: list[int] | Index, spans: list[SeqSpan], *,
        all_logits: bool, greedy: bool = False, compact: bool = False,
    ) -> torch.Tensor:
        """The general forward: N query tokens at `positions`, their K/V written to `write_slots`, each span
        attending to its own key slots (custom masks allowed: SSD branches). Logits (and greedy) as in `run`."""
        hidden = None
        if self.compiled is not None and self.compiled.handles(write_slots, spans):
            hidden = self.compiled.run(ids, positions, spans[0])  # [N, hidden], None if compiling failed
        if hidden is None and self.graphs is not None and self.graphs.handles(spans):
            hidden = self.graphs.run(ids, positions, write_slots, spans)  # [N, hidden]
        if hidden is None:
            meta = build_metadata(write_slots, spans, device=self.device, batch_decode=self.backend.batches_decode)
            hidden = self.forward(
                torch.tensor(ids, device=self.device), positions.to(self.device), meta, self.backend
            )  # [N, hidden]
        self.num_forward_tokens += len(ids)
        self.num_forwards += 1
        if not all_logits:
            last_rows = torch.tensor([s.q_start + s.q_len - 1 for s in spans], device=self.device)
            hidden = hidden.index_select(0, last_rows) if len(ids) > len(spans) else hidden
        # Sampling and verification run on the CPU (small [rows, V] tensors, CPU generators); a no-op here.
        return self.model.compute_logits(hidden, greedy, compact).float().cpu()


def _concat_slots(parts: list[Index]) -> list[int]:
    out: list[int] = []
    for p in parts:
        out += list(range(p.start, p.stop)) if isinstance(p, slice) else p.tolist()
    return out
