"""Block manager invariants: ref counts balance, prefixes are shared only when equal, nothing leaks."""

from __future__ import annotations

import random

from engine.kv.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(i, list(tokens), SamplingParams(temperature=0.0))


def compute_all(bm: BlockManager, s: Sequence) -> None:
    """Pretend the model ran every token of `s` (as the runner does after a forward)."""
    bm.ensure_capacity(s, len(s.token_ids))
    s.num_computed_tokens = len(s.token_ids)
    bm.commit(s)


def test_prefix_blocks_are_shared_and_refcounted():
    bm = BlockManager(16, 4)
    a = seq(0, list(range(10)))
    bm.allocate(a)
    assert a.num_cached_tokens == 0 and len(a.block_table) == 3
    compute_all(bm, a)
    b = seq(1, [*range(8), 99, 98, 97])
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    bm.free_blocks(a)
    bm.free_blocks(b)
    assert bm.num_free_blocks == 16 and all(blk.ref_count == 0 for blk in bm.blocks)


def test_freed_prefix_is_found_again_and_at_least_one_token_is_left_to_compute():
    bm = BlockManager(8, 4)
    a = seq(0, list(range(8)))
    bm.allocate(a)
    compute_all(bm, a)
    first_table = list(a.block_table)
    bm.free_blocks(a)
    again = seq(1, list(range(8)))  # the same 8 tokens: only the first block may be reused
    bm.allocate(again)
    assert again.num_cached_tokens == 4
    assert again.block_table == first_table  # it recomputes its second block in place (no gather later)
    compute_all(bm, again)
    longer = seq(2, list(range(9)))
    bm.allocate(longer)
    assert longer.num_cached_tokens == 8


def test_a_sequence_continues_in_the_next_block_unless_it_caches_another_prefix():
    bm = BlockManager(8, 4)
    a = seq(0, list(range(4)))  # block 0
    bm.allocate(a)
    other = seq(1, [50 + i for i in range(8)])  # blocks 1-2: another prefix, cached once computed
    bm.allocate(other)
    compute_all(bm, other)
    bm.free_blocks(other)
    a.token_ids += [7, 7]
    compute_all(bm, a)  # needs a second block: block 1 is free but caches `other`'s prefix
    assert a.block_table[1] not in (1, 2)
    assert bm._cached_prefix([50 + i for i in range(9)]) == [1, 2]  # that prefix survives
    fresh = seq(2, [9])
    bm.allocate(fresh)
    fresh.token_ids += [9] * 4
    compute_all(bm, fresh)
    assert fresh.block_table[1] == fresh.block_table[0] + 1  # a free block caching nothing: taken in order


def test_chats_sharing_a_system_prompt_stay_consecutive_over_blocks_no_lookup_can_reach():
    """Replies after a shared prefix (the chat template's system prompt) overwrite the previous reply's blocks;
    the blocks after an overwritten one cache a chain nobody can find any more, so the next reply takes them
    in order (consecutive blocks run the compiled decode step) instead of scattering."""
    bm = BlockManager(16, 4)
    system = [1, 2, 3, 4]
    for i, reply in enumerate(([10] * 12, [20] * 12, [30] * 12)):
        s = seq(i, [*system, 5 + i])
        bm.allocate(s)
        s.token_ids += reply
        compute_all(bm, s)
        assert s.block_table[0] == 0  # the shared prefix block
        assert s.block_table == list(range(len(s.block_table))), (i, s.block_table)
        bm.free_blocks(s)
    assert bm._cached_prefix(system + [5 + 2] + [30] * 12 + [0]) == [0, 1, 2, 3]  # the last reply is cached
    assert bm._cached_prefix(system + [5] + [10] * 12 + [0]) == [0]  # the first one's chain was overwritten


def test_different_prefix_or_disabled_cache_shares_nothing():
    bm = BlockManager(8, 4)
    a = seq(0, list(range(8)))
    bm.allocate(a)
    compute_all(bm, a)
    b = seq(1, [1, 0, 2, 3, 4, 5, 6, 7, 8])
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    off = BlockManager(8, 4, enable_prefix_caching=False)
    c = seq(2, list(range(9)))
    off.allocate(c)
    compute_all(off, c)
    d = seq(3, list(range(9)))
    off.allocate(d)
    assert d.num_cached_tokens == 0


def test_reused_free_block_loses_its_hash():
    bm = BlockManager(2, 4)
    a = seq(0, list(range(5)))
    bm.allocate(a)
    compute_all(bm, a)
    bm.free_blocks(a)
    b = seq(1, [50, 51, 52, 53, 54, 55, 56])  # needs both blocks: overwrites a's cached prefix
    bm.allocate(b)
    compute_all(bm, b)
    bm.free_blocks(b)
    c = seq(2, list(range(5)))
    bm.allocate(c)
    assert c.num_cached_tokens == 0


def test_random_workload_keeps_refcounts_balanced():
    rng = random.Random(0)
    bm = BlockManager(64, 4)
    live: list[Sequence] = []
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    for i in range(300):
        if live and (rng.random() < 0.4 or bm.num_free_blocks < 12):
            s = live.pop(rng.randrange(len(live)))
            bm.free_blocks(s)
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(1, 13)] + [rng.randrange(50) for _ in range(rng.randrange(8))]
            s = seq(i, tokens or [1])
            bm.allocate(s)
            compute_all(bm, s)
            live.append(s)
        held: dict[int, int] = {}
        for s in live:
            for b in s.block_table:
                held[b] = held.get(b, 0) + 1
        assert all(bm.blocks[b].ref_count == n for b, n in held.items())
        assert bm.num_free_blocks == 64 - len(held)
    for s in live:
        bm.free_blocks(s)
    assert bm.num_free_blocks == 64


def test_a_hash_collision_never_shares_a_block(monkeypatch):
    import engine.kv.block_manager as bm_module

    monkeypatch.setattr(bm_module, "chain_hash", lambda prev, tokens: hash(tokens))  # ignores the prefix
    bm = BlockManager(16, 4)
    for i, tokens in enumerate(([1, 2, 3, 4, 9, 9, 9, 9, 5], [7, 7, 7, 7, 8, 8, 8, 8, 5])):
        cached = seq(i, tokens)
        bm.allocate(cached)
        compute_all(bm, cached)
    # b's first block is d's; its second has the hash of a's second block, whose context differs
    b = seq(2, [7, 7, 7, 7, 9, 9, 9, 9, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 4
    c = seq(3, [1, 2, 3, 4, 9, 9, 9, 9, 6])  # a true prefix still hits in full
    bm.allocate(c)
    assert c.num_cached_tokens == 8


def test_slot_index_gives_each_positions_slot_as_a_slice_where_the_blocks_run_on():
    """runner.slot_index, every way it builds the slots (one run: a slice; scattered: a list, or tensor ops past
    SMALL_GATHER slots), against the slots spelled out position by position."""
    import torch

    from engine.runner import SMALL_GATHER, slot_index

    rng = random.Random(3)
    for _ in range(400):
        size = rng.choice([1, 4, 16])
        count = rng.randint(1, (2 * SMALL_GATHER) // size + 2)
        table = rng.sample(range(600), count) if rng.random() < 0.5 else list(range(b := rng.randint(0, 99), b + count))
        start = rng.randrange(count * size)
        end = rng.randint(start + 1, count * size)
        want = [table[p // size] * size + p % size for p in range(start, end)]
        got = slot_index(table, start, end, size)
        run = all(b == a + 1 for a, b in zip(table[start // size : (end - 1) // size + 1],
                                              table[start // size + 1 : (end - 1) // size + 1], strict=False))
        assert isinstance(got, slice) == run, (table, start, end, size)
        assert (list(range(got.start, got.stop)) if isinstance(got, slice) else got.tolist()) == want
        assert isinstance(got, slice) or got.dtype == torch.long
