"""Releasing the float32 weights that no step reads.

On the CPU most matmuls of the embedded pair run from copies made at load: the target's 4-bit and 8-bit panels
(engine.layers.packed, panel4 and q8, for every row count) and the draft's int8 or float16 products
(engine.layers.low_bits). The float32 weight they were made from then only sat in memory: 425 MB of SmolLM2's
layers in the engine process, 75 MB of the draft's in each process that holds it.

`release_unread` swaps such a weight for a `Released` tensor: its shape, dtype and sizes stay for whoever reads
them (the fused layers, the stats), and anything else, a read of its values above all, raises. (A bare meta tensor
would not do: F.linear of a CPU input and a meta weight returns a CPU tensor of whatever memory held.) A weight the
embedding shares (a tied head) stays: the lookups read it. Not under --compile: a compiled step's panel op takes
the weight as an operand (engine.layers.panel.linear_op).

The embedding's float32 weight goes too where it is 8-bit values: its lookups then read the rows from an 8-bit
copy, the same bits (the head's copy where the two are tied; 113 MB of SmolLM2's, in the engine process, the
draft's there and in the draft process).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys

import torch
from torch import nn

from engine.layers import packed as packed_copies
from engine.layers import panel8, panel_cache
from engine.layers.packed_kernels import EVERY_STEP

log = logging.getLogger(__name__)


class Released(torch.Tensor):
    """A released weight: no storage, and an error for any use but its shape, dtype and sizes."""

    METADATA = frozenset((torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.ndim.__get__,
                          torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.element_size))

    @staticmethod
    def like(weight: torch.Tensor) -> Released:
        return torch.Tensor._make_subclass(Released, torch.empty(weight.shape, dtype=weight.dtype, device="meta"))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        raise RuntimeError(f"{name} read a float32 weight released at load (engine.layers.unread): a step that reads "
                           "it needs release=False")


def unread(module: nn.Module) -> bool:
    """Whether every eager step of the module takes another copy than its float32 weight: a fewer-bit product,
    or a low-bit panel copy for every row count."""
    if getattr(module, "low_bits", None) is not None:
        return True
    copy = getattr(module, "packed", None)
    return isinstance(copy, packed_copies.LOW_BIT) and module.packed_min_rows <= 1 \
        and module.packed_rows >= EVERY_STEP


def release_unread(model: nn.Module, *, exact_copies: bool = True) -> int:
    """Swap every unread float32 matmul weight of a CPU model for a `Released` of its shape, and an embedding's
    where its rows can come from an 8-bit copy (`_lookups_from_8_bits`); returns the bytes released.
    `exact_copies`: the low-bit copies hold the weights' own values (packed at load: panel4 / panel8 compress
    only those), not a draft's int8 rounding (engine.layers.low_bits), which a lookup must not read."""
    from engine.layers.embedding import VocabParallelEmbedding

    embeddings = [m for m in model.modules() if type(m) is VocabParallelEmbedding]
    read = {id(m.weight) for m in embeddings if not _lookups_from_8_bits(m, model, exact_copies)}  # by lookups
    unused = [m for m in [*packed_copies.bias_free_matmuls(model), *embeddings]
              if not isinstance(m.weight, Released) and id(m.weight) not in read
              and (m in embeddings or unread(m))]
    stand_ins: dict[int, Released] = {}  # a tied weight's one stand-in
    for module in unused:
        weight = module.weight
        stand_ins.setdefault(id(weight), Released.like(weight))
        del module.weight  # a parameter no longer: the model's parameters are the weights it holds
        module.weight = stand_ins[id(weight)]
    released = sum(r.numel() * r.element_size() for r in stand_ins.values())
    if released:
        log.info("released %.0f MB of float32 weights that no step reads", released / 1e6)
    return_freed_memory()
    return released


def _lookups_from_8_bits(embedding: nn.Module, model: nn.Module, exact_copies: bool) -> bool:
    """Give a one-rank CPU embedding whose weight is 8-bit values (SmolLM2's, Q8_0) its lookups from an 8-bit copy
    (`rows8`, the same float32 bits), where no step reads the weight: the copy of the head it is tied to, where
    that copy is exact, or else one of its own (engine.layers.panel_cache: made once, then read from disk; 34 MB
    against 113). Whether it did."""
    weight = embedding.weight
    if isinstance(weight, Released):
        return embedding.rows8 is not None
    if embedding.tp.size != 1 or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    tied = [m for m in packed_copies.bias_free_matmuls(model) if m.weight is weight]
    if tied and not unread(tied[0]):  # the head reads the weight: it stays, and the lookups with it
        return False
    exact_head = tied and exact_copies and getattr(tied[0], "low_bits", None) is None
    copy = tied[0].packed if exact_head else panel_cache.low_bit(weight)
    if not isinstance(copy, panel8.Panel8):
        return False
    embedding.rows8 = copy
    return True


def return_freed_memory() -> None:
    """Hand the C heap's free memory back to the OS (glibc's malloc_trim; elsewhere nothing). glibc keeps what a
    load freed (its weights' transient copies, the released weights) for later allocations: 350 MB of the
    engine's resident memory after SmolLM2's load."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
