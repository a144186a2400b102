"""Row invariance on the CPU: a verify step gives each of its rows the bits plain decoding gives that token.
The causal attention kernel (engine.attention.sdpa.causal_rows) per row, eager and compiled, and a whole model's
logits (matmuls, norms and attention together) in one k + 1-row step against one-row steps."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.attention.base import SeqSpan
from engine.attention.sdpa import ROW_KERNEL_ROWS, attend, causal_rows, causal_spans, span_table
from engine.layers import native, packed_kernels, panel

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")

H, KVH, D = 6, 2, 64


def _cache(slots: int = 256, seed: int = 0, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(KVH, slots, d, generator=generator), torch.randn(KVH, slots, d, generator=generator)


@pytest.mark.parametrize("d", [64, 128, 80])  # 64 and 128 have their own weighted-sum code, 80 the generic one
@pytest.mark.parametrize("scattered", [False, True])
def test_each_row_of_a_causal_step_is_the_bits_of_its_own_decode_step(scattered, d):
    k, v = _cache(d=d)
    slots = torch.cat([torch.arange(10, 40), torch.arange(100, 130)]) if scattered else slice(10, 70)
    slot_list = slots if scattered else torch.arange(10, 70)
    q = torch.randn(5, H, d, generator=torch.Generator().manual_seed(1))
    many = causal_rows(q, k, v, slots, 60, d**-0.5)  # rows see 56..60 keys
    for r in range(5):
        keys = 56 + r
        own = slot_list[:keys] if scattered else slice(10, 10 + keys)
        assert torch.equal(causal_rows(q[r : r + 1], k, v, own, keys, d**-0.5), many[r : r + 1]), r
    mask = torch.ones(5, 60, dtype=torch.bool).tril(55)
    want = attend(q.transpose(0, 1).unsqueeze(0), k[:, slot_list].unsqueeze(0), v[:, slot_list].unsqueeze(0),
                  mask=mask, causal=False, scale=d**-0.5)[0].transpose(0, 1).reshape(5, H * d)
    torch.testing.assert_close(many, want, rtol=1e-5, atol=1e-5)


def test_a_prefill_past_the_kernel_rows_gives_each_row_its_decode_bits():
    # A prefill's rows go ROW_KERNEL_ROWS at a time through the same kernel: a prompt's KV is the same bits however
    # it was split (whole, in --prefill-chunk chunks, or after a prefix-cache hit). Through SDPA, a prompt prefilled
    # whole and the same prompt after a cache hit differed in their last bits, and under --cpu-matmul q8 a second
    # greedy AR reply to the same chat prompt left the first at its 33rd token.
    k, v = _cache()
    n = 2 * ROW_KERNEL_ROWS + 8
    q = torch.randn(n, H, D, generator=torch.Generator().manual_seed(3))
    for cached, scattered in ((0, False), (80, False), (80, True)):  # the whole prompt; a chunk after 80 cached keys
        keys = cached + n
        slot_list = torch.cat([torch.arange(5, 50), torch.arange(60, 60 + keys - 45)]) if scattered else \
            torch.arange(10, 10 + keys)
        slots = slot_list if scattered else slice(10, 10 + keys)
        got = causal_rows(q, k, v, slots, keys, D**-0.5)
        for r in (0, ROW_KERNEL_ROWS - 1, ROW_KERNEL_ROWS, n - 1):
            own = slot_list[: cached + r + 1] if scattered else slice(10, 10 + cached + r + 1)
            one = causal_rows(q[r : r + 1], k, v, own, cached + r + 1, D**-0.5)
            assert torch.equal(one, got[r : r + 1]), (cached, scattered, r)
        mask = torch.ones(n, keys, dtype=torch.bool).tril(cached)
        want = attend(q.transpose(0, 1).unsqueeze(0), k[:, slot_list].unsqueeze(0), v[:, slot_list].unsqueeze(0),
                      mask=mask, causal=False, scale=D**-0.5)[0].transpose(0, 1).reshape(n, H * D)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, keys: int, threads: int) -> torch.Tensor:
    """engine/kernels/attention.cpp's causal_attention itself (or its half cache's): q [n, H, D], k and v [KVH, S, D]
    -> [n, H * D]."""
    n, h, d = q.shape
    out = torch.empty(n, h * d)
    lib = native.library()
    kernel = lib.causal_attention_half if k.dtype == torch.float16 else lib.causal_attention
    kernel(q.data_ptr(), n, h, d, k.data_ptr(), v.data_ptr(), k.shape[0], k.shape[1], first, keys, d**-0.5,
           out.data_ptr(), threads)
    return out


@pytest.mark.parametrize(("n", "keys", "heads", "kv_heads", "d"), [
    (32, 3001, 9, 3, 64), (32, 1500, 6, 2, 128), (32, 517, 6, 2, 40), (20, 45, 4, 4, 64), (17, 200, 8, 1, 128),
    (5, 60, 6, 3, 40), (1, 33, 9, 3, 64), (32, 32, 9, 3, 64)])
def test_the_tiled_kernel_gives_every_row_of_a_prefill_call_the_bits_of_its_one_row_call(n, keys, heads, kv_heads, d):
    # The many-row calls go over tiles of keys for blocks of rows and heads at once; a row's arithmetic, and so its
    # bits, must stay those of its one-row call (block and tail scores, exps and sums by its own key count), at any
    # thread count.
    generator = torch.Generator().manual_seed(n * keys + d)
    k, v = (torch.randn(kv_heads, keys + 9, d, generator=generator) for _ in range(2))
    q = 3 * torch.randn(n, heads, d, generator=generator)
    got = _kernel(q, k, v, 5, keys, 1)
    assert torch.equal(_kernel(q, k, v, 5, keys, 2), got)
    for r in range(n):
        assert torch.equal(_kernel(q[r : r + 1], k, v, 5, keys - n + r + 1, 1), got[r : r + 1]), r
    mask = torch.ones(n, keys, dtype=torch.bool).tril(keys - n)
    want = attend(q.transpose(0, 1).unsqueeze(0), k[:, 5 : 5 + keys].unsqueeze(0), v[:, 5 : 5 + keys].unsqueeze(0),
                  mask=mask, causal=False, scale=d**-0.5)[0].transpose(0, 1).reshape(n, heads * d)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("d", [64, 128, 48])
@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (8, 1)])
def test_a_few_rows_over_several_chunks_of_keys_split_over_threads_keep_one_threads_bits(d, half, heads, kv_heads):
    # A decode's or a verify's few blocks of rows and KV heads (3 for SmolLM2's decode: 2 for one thread, 1 for the
    # other) go chunk by chunk of keys (attention.cpp's ATTN_CHUNK, 256) over the threads: every chunk's scores,
    # then each chunk's sums from zero, then the chunks' sums added in key order, as one thread adds them. So at any
    # thread count each row keeps its one-row call's bits, at key counts around the chunks' edges.
    generator = torch.Generator().manual_seed(d + 7 * half + heads)
    k, v = (torch.randn(kv_heads, 1200, d, generator=generator) for _ in range(2))
    if half:
        k, v = k.half(), v.half()
    q = 3 * torch.randn(17, heads, d, generator=generator)
    for keys in (256, 257, 300, 512, 513, 1100):
        for n in (1, 5, 17):  # 17: blocks of 16 and 1 rows, the chunks handed out by their work
            got = _kernel(q[:n], k, v, 5, keys, 1)
            for threads in (2, 3):
                assert torch.equal(_kernel(q[:n], k, v, 5, keys, threads), got), (keys, n, threads)
            for r in range(n):
                assert torch.equal(_kernel(q[r : r + 1], k, v, 5, keys - n + r + 1, 2), got[r : r + 1]), (keys, r)
            mask = torch.ones(n, keys, dtype=torch.bool).tril(keys - n)
            want = attend(q[:n].transpose(0, 1).unsqueeze(0), k[:, 5 : 5 + keys].float().unsqueeze(0),
                          v[:, 5 : 5 + keys].float().unsqueeze(0), mask=mask, causal=False,
                          scale=d**-0.5)[0].transpose(0, 1).reshape(n, heads * d)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("d", [64, 40])
@pytest.mark.parametrize("half", [False, True], ids=["float32-cache", "half-cache"])
@pytest.mark.parametrize("lens", [[(1, 30), (5, 44), (40, 300), (1, 7), (17, 17), (3, 260)], [(1, 700), (5, 600)]],
                         ids=["mixed", "long"])  # (q_len, num_keys): decode, verify, prefill; "long": chunks split
def test_several_spans_in_one_call_give_each_row_the_bits_of_its_own_span_call(d, half, lens):
    # A batched step's causal spans (several sequences' verifies and decodes, SSD's branches over gathered slots) go
    # through one kernel call a layer: each row must keep the bits the call of its own span gives it, at any thread
    # count, however the spans' slots lie (one run, or scattered: gathered a tile at a time).
    generator = torch.Generator().manual_seed(d + half)
    k, v = (torch.randn(KVH, 900, d, generator=generator) for _ in range(2))
    if half:
        k, v = k.half(), v.half()
    spans, start, row = [], 0, 0
    for i, (q_len, keys) in enumerate(lens):
        if i % 2:  # scattered: two runs, and the slots of a branch's scratch
            slots = torch.cat([torch.arange(start, start + keys // 2), torch.arange(850 - keys + keys // 2, 850)])
        else:
            slots = slice(start, start + keys)
        spans.append(SeqSpan(row, q_len, slots, keys))
        start, row = start + keys // 2 + 1, row + q_len
    q = 2 * torch.randn(row, H, d, generator=generator)
    each = torch.cat([causal_rows(q.narrow(0, s.q_start, s.q_len), k, v, s.key_slots, s.num_keys, d**-0.5)
                      for s in spans])
    table = span_table(spans)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert torch.equal(causal_spans(q, k, v, *table, d**-0.5), each), count
    finally:
        torch.set_num_threads(threads)
    short = SeqSpan(0, 1, torch.arange(5), 6)  # fewer slots than keys: refused, not read from the next span's
    with pytest.raises(ValueError, match="a span of 6 keys has 5 key slots"):
        span_table([short, spans[1]])


@pytest.mark.skipif(packed_kernels.max_rows(packed_kernels.resolve_kernel("auto")) < 80,
                    reason="Intel: matmuls past 32 rows run MKL's GEMM, whose bits depend on the row count")
def test_a_prompt_prefilled_whole_or_after_a_cache_hit_gives_the_same_logits(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_model_len=256, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        ids = torch.randint(runner.model.args.vocab_size, (80,), generator=torch.Generator().manual_seed(4)).tolist()
        whole = runner.run_spans(ids, torch.arange(80), slice(0, 80), [SeqSpan(0, 80, slice(0, 80), 80)],
                                 all_logits=True)  # [80, V]
        cached = 64  # then the same prompt's last 16 tokens over the first 64's KV, as after a prefix-cache hit
        tail = runner.run_spans(ids[cached:], torch.arange(cached, 80), slice(cached, 80),
                                [SeqSpan(0, 80 - cached, slice(0, 80), 80)], all_logits=True)
        assert torch.equal(tail, whole[cached:])


def test_the_compiled_op_gives_the_eager_bits():
    k, v = _cache()
    compiled = torch.compile(lambda q, t: causal_rows(q, k, v, slice(3, 3 + t), t, D**-0.5), dynamic=True,
                             fullgraph=True)
    q = torch.randn(70, H, D)
    for rows, keys in ((1, 40), (5, 44), (70, 150)):  # (70 rows: a prefill's three kernel calls)
        assert torch.equal(compiled(q[:rows], keys), causal_rows(q[:rows], k, v, slice(3, 3 + keys), keys, D**-0.5))


def test_a_verify_step_gives_each_row_the_logits_of_plain_decoding(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_model_len=128, enable_prefix_caching=False) as llm:
        runner = llm.core.runner
        assert runner.model.model.layers[0].mlp.down_proj.packed is not None  # the panel kernel's matmuls
        ids = torch.randint(runner.model.args.vocab_size, (30,), generator=torch.Generator().manual_seed(2)).tolist()
        runner.run_spans(ids[:25], torch.arange(25), slice(0, 25), [SeqSpan(0, 25, slice(0, 25), 25)],
                         all_logits=False)
        verify = runner.run_spans(ids[25:], torch.arange(25, 30), slice(25, 30), [SeqSpan(0, 5, slice(0, 30), 30)],
                                  all_logits=True)  # [5, V]
        for p in range(25, 30):  # the same tokens one at a time (rewriting the same slots with the same K/V)
            span = SeqSpan(0, 1, slice(0, p + 1), p + 1)
            one = runner.run_spans([ids[p]], torch.tensor([p]), slice(p, p + 1), [span], all_logits=True)
            assert torch.equal(one[0], verify[p - 25]), p
