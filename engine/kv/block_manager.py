"""Paged KV blocks with reference counts and prefix caching by chained block hashes.

A block holds the KV of `block_size` consecutive tokens of one sequence. Once all of a block's tokens
have their KV computed, the block is *committed*: it gets a hash chained from its predecessor's hash
and its own token ids, so equal hashes mean equal prefixes (the token ids and the parent's hash are
stored and compared too, so a hash collision can never hand out wrong KV). A new sequence whose prompt
starts with committed blocks shares them (ref count + 1) and skips their compute. Freed blocks keep
their contents and hash until the space is needed again (least recently freed first), so a chat's
next turn still finds them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    parent_hash: int | None = None  # the previous block's hash: with token_ids, what `hash` stands for
    token_ids: tuple[int, ...] = field(default_factory=tuple)


def chain_hash(prev: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((prev, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        self.by_hash: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix lookup -------------------------------------------------------------------------
    def _cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest committed prefix of `token_ids`, leaving >= 1 token to compute."""
        if not self.enable_prefix_caching:
            return []
        hits, prev, bs = [], None, self.block_size
        for start in range(0, len(token_ids) - 1 - (len(token_ids) - 1) % bs, bs):
            chunk = tuple(token_ids[start : start + bs])
            parent, prev = prev, chain_hash(prev, chunk)
            block_id = self.by_hash.get(prev)
            if block_id is None or (self.blocks[block_id].token_ids, self.blocks[block_id].parent_hash) != (
                chunk, parent
            ):
                break  # a miss, or a hash collision: never share KV whose context differs
            hits.append(block_id)
        return hits

    def can_allocate(self, token_ids: list[int], reserve_tokens: int, *, spare: int | None = None) -> bool:
        """Whether a sequence of `token_ids` can start and grow to `reserve_tokens` using at most `spare`
        free blocks (default: all of them)."""
        spare = self.num_free_blocks if spare is None else spare
        hits = self._cached_prefix(token_ids)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_needed(reserve_tokens) - len(hits) + revived <= spare

    # -- allocation ----------------------------------------------------------------------------
    def _take_free(self, after: int | None = None) -> int:
        """The least recently freed block, or the block right after `after` when `_continues` allows it."""
        if after is not None and self._continues(after):
            block_id = after + 1
            del self.free[block_id]
        else:
            block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.by_hash.get(block.hash) == block_id:
            del self.by_hash[block.hash]  # its old contents are about to be overwritten
        block.hash, block.parent_hash, block.token_ids, block.ref_count = None, None, (), 1
        return block_id

    def _continues(self, after: int) -> bool:
        """Whether a sequence ending in block `after` may take block after + 1: it is free and caches nothing
        a lookup can reach (nothing, or a chain whose parent block was overwritten: lookups walk from the
        first block), or only the old continuation of `after` itself. Consecutive blocks are read as one view
        (no gather) and run the compiled decode step, so a chat's next turn continues in its last turn's
        partial tail block, a regenerated reply (or /compare) in its previous reply's, and a new chat after
        the shared system prompt in the previous chat's blocks."""
        if after + 1 not in self.free:
            return False
        nxt, own = self.blocks[after + 1], self.blocks[after].hash
        reachable = self.by_hash.get(nxt.hash) == nxt.block_id and (nxt.parent_hash is None
                                                                    or nxt.parent_hash in self.by_hash)
        return not reachable or (own is not None and nxt.parent_hash == own)

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` blocks for its current tokens, sharing every cached prefix block."""
        assert not seq.block_table
        hits = self._cached_prefix(seq.token_ids)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_committed_blocks = len(hits)
        self.ensure_capacity(seq, len(seq.token_ids))

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> None:
        """Make `seq`'s block table hold at least `num_tokens` slots."""
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free(seq.block_table[-1] if seq.block_table else None))

    def commit(self, seq: Sequence) -> None:
        """Hash every block whose tokens all have computed KV (so later sequences can share it)."""
        bs = self.block_size
        while (seq.num_committed_blocks + 1) * bs <= seq.num_computed_tokens:
            i = seq.num_committed_blocks
            block = self.blocks[seq.block_table[i]]
            prev = self.blocks[seq.block_table[i - 1]].hash if i else None
            chunk = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            if block.hash is None:
                block.hash, block.parent_hash, block.token_ids = chain_hash(prev, chunk), prev, chunk
                if self.enable_prefix_caching:
                    self.by_hash.setdefault(block.hash, block.block_id)
            seq.num_committed_blocks += 1

    def free_blocks(self, seq: Sequence) -> None:
        """Release `seq`'s blocks; those nobody else holds go to the back of the free list."""
        for block_id in reversed(seq.block_table):  # tail first: prefixes survive longest
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, block
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
