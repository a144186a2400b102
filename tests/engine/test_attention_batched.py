"""A decode step of several sequences: on a CPU where the row kernel runs, each sequence through it, the very bits
it gets alone (so a prompt decodes in a batch as alone, at any --cpu-matmul: under q8 the padded batch's last-bit
differences flipped tokens); elsewhere as one padded batch (engine.attention.base.BatchedDecode), each sequence's
output the one it gets alone to rounding, whatever its length and wherever its slots are."""

import pytest
import torch

from engine.attention import SdpaBackend, SeqSpan, build_metadata
from engine.attention.base import as_index


@pytest.mark.parametrize("row_kernel", [True, False])
@pytest.mark.parametrize("head_dim", [16, 64])  # 16: attend()'s matmul route; 64: torch's SDPA kernel
def test_a_batched_decode_step_equals_each_sequence_alone(head_dim, row_kernel, monkeypatch):
    from engine.attention import sdpa
    from engine.layers import panel

    if row_kernel and not panel.available():
        pytest.skip("the row kernel needs AVX-512, AVX2 or NEON and a C++ compiler")
    if not row_kernel:
        monkeypatch.setattr(sdpa, "row_kernel", lambda q, k_cache: False)
    torch.manual_seed(0)
    heads, kv_heads, num_slots = 6, 2, 64
    backend = SdpaBackend()
    backend.allocate(num_layers=1, num_slots=num_slots, num_kv_heads=kv_heads, head_dim=head_dim,
                     dtype=torch.float32, device=torch.device("cpu"))
    backend.k[0].normal_()
    backend.v[0].normal_()
    # three sequences: contiguous slots, scattered slots, and a short one; the last slot of each is the new token
    key_slots = [list(range(0, 9)), [20, 21, 22, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52], [30, 31, 32]]
    q = torch.randn(len(key_slots), heads, head_dim)
    k, v = torch.randn(len(key_slots), kv_heads, head_dim), torch.randn(len(key_slots), kv_heads, head_dim)
    spans = [SeqSpan(i, 1, as_index(slots), len(slots)) for i, slots in enumerate(key_slots)]
    write = [slots[-1] for slots in key_slots]
    meta = build_metadata(write, spans, batch_decode=True)
    assert meta.batched_decode is not None
    assert backend.batches_decode  # (before any forward: not known to run the kernel)
    batched = backend.forward(0, q, k, v, meta, scale=head_dim**-0.5)  # [B, H*D]
    assert backend.batches_decode is not row_kernel  # the runner builds the padded gather only where it is read
    for i, span in enumerate(spans):
        alone_span = SeqSpan(0, 1, span.key_slots, span.num_keys)  # its one query is row 0 of q[i : i + 1]
        alone = backend.forward(0, q[i : i + 1], k[i : i + 1], v[i : i + 1],
                                build_metadata([write[i]], [alone_span]), scale=head_dim**-0.5)
        if row_kernel:
            assert torch.equal(batched[i : i + 1], alone)
        else:
            torch.testing.assert_close(batched[i : i + 1], alone, rtol=1e-5, atol=1e-5)
        # and plain softmax attention, query head j reading KV head j // (heads / kv_heads)
        keys = backend.k[0][:, key_slots[i]].repeat_interleave(heads // kv_heads, dim=0)  # [H, T, D]
        values = backend.v[0][:, key_slots[i]].repeat_interleave(heads // kv_heads, dim=0)
        probs = torch.softmax((keys @ q[i].unsqueeze(-1)).squeeze(-1) * head_dim**-0.5, dim=-1)  # [H, T]
        expected = (probs.unsqueeze(1) @ values).reshape(1, heads * head_dim)
        torch.testing.assert_close(batched[i : i + 1], expected, rtol=1e-5, atol=1e-5)


def test_only_a_decode_step_of_several_sequences_is_batched():
    one = SeqSpan(0, 1, slice(0, 4), 4)
    assert build_metadata([3], [one], batch_decode=True).batched_decode is None  # one sequence: its own short path
    verify = SeqSpan(1, 3, slice(8, 14), 6)  # a k+1-row verification beside a decode
    assert build_metadata([3, 11, 12, 13], [one, verify], batch_decode=True).batched_decode is None
    two = [one, SeqSpan(1, 1, slice(8, 10), 2)]
    assert build_metadata([3, 9], two).batched_decode is None  # for a backend that does not read it: not built
    gather = build_metadata([3, 9], two, batch_decode=True).batched_decode
    assert gather.key_index.tolist() == [0, 1, 2, 3, 8, 9, 0, 0]  # padded to the longest with slot 0 ...
    assert gather.key_mask.view(2, 4).tolist() == [[True] * 4, [True, True, False, False]]  # ... masked out
    spans = [SeqSpan(0, 1, slice(0, 40), 40), SeqSpan(1, 1, slice(40, 42), 2), SeqSpan(2, 1, slice(42, 44), 2)]
    assert build_metadata([39, 41, 43], spans, batch_decode=True).batched_decode is None  # padded, 120 keys read for 44
