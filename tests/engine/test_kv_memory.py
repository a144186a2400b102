"""The CPU KV cache takes memory only where it is written (engine.attention.sdpa.untouched_zeros): zeros when read,
like torch.zeros, in pages the OS maps to zero until a write."""

from __future__ import annotations

import sys

import pytest
import torch

from engine.attention.sdpa import SdpaBackend, untouched_zeros

MB = 1 << 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_they_are_zeros_of_the_shape_and_writable(dtype):
    x = untouched_zeros((3, 40, 64), dtype, torch.device("cpu"))
    assert x.shape == (3, 40, 64) and x.dtype == dtype and x.is_contiguous()
    assert torch.equal(x, torch.zeros(3, 40, 64, dtype=dtype))
    x[1, 5:9] = 2.5
    assert float(x.sum()) == 2.5 * 4 * 64 and float(x[0].abs().sum()) == 0.0
    assert x.data_ptr() % 4096 == 0  # page-aligned: any kernel's vector loads are aligned


@linux
def test_a_cache_costs_memory_only_where_written():
    backend = SdpaBackend()
    before = _rss()
    # 2 layers x K, V x 4 heads x 65536 slots x 64 x 4 bytes: 256 MB that torch.zeros would write out
    backend.allocate(num_layers=2, num_slots=65536, num_kv_heads=4, head_dim=64, dtype=torch.float32,
                     device=torch.device("cpu"))
    assert _rss() - before < 32 * MB
    for cache in backend.k + backend.v:
        cache[:, :4096] = 1.0  # the first 4096 slots of every head: 16 MB in all
    grown = _rss() - before
    assert 12 * MB < grown < 48 * MB
    assert float(backend.k[0][:, 4096:].abs().sum()) == 0.0  # the rest still reads as zeros
