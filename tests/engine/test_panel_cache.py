"""The low-bit panels' disk cache (engine.layers.panel_cache): a weight's second compression is read back with
the same bits, any change to the weight misses, weights without a low-bit form are remembered, broken entries
are rebuilt, and an unwritable cache only costs the time."""

from __future__ import annotations

import pytest
import torch

from engine.layers import panel4, panel8, panel_cache
from tests.engine.test_panel4 import q4_form
from tests.engine.test_panel8 import q8_form


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_CHAT_PANEL_CACHE", str(tmp_path / "panels"))
    calls = []
    real = panel_cache.compress
    monkeypatch.setattr(panel_cache, "compress", lambda w: calls.append(w) or real(w))
    return tmp_path / "panels", calls


def _same(a, b) -> bool:
    fields = ("q", "d", "m") if isinstance(a, panel4.Panel4) else ("q", "d")
    return type(a) is type(b) and a.n == b.n and all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)


@pytest.mark.parametrize(("form", "kind"), [(q4_form, panel4.Panel4), (q8_form, panel8.Panel8)])
def test_a_second_compression_reads_the_same_bits_back(cache, form, kind):
    folder, calls = cache
    weight = form(torch.randn(96, 64, generator=torch.Generator().manual_seed(3)))
    first = panel_cache.low_bit(weight, min_cached=1)
    second = panel_cache.low_bit(weight.clone(), min_cached=1)
    assert isinstance(first, kind) and _same(first, second)
    assert len(calls) == 1 and len(list(folder.glob("*.safetensors"))) == 1
    k_major = weight.t().contiguous().t()  # the same values stored K-major: another entry, the same panels
    assert _same(panel_cache.low_bit(k_major, min_cached=1), first) and len(calls) == 2


def test_a_changed_weight_misses(cache):
    _, calls = cache
    weight = q8_form(torch.randn(64, 64))
    panel_cache.low_bit(weight, min_cached=1)
    edited = weight.clone()
    edited[5, 7] = torch.nextafter(edited[5, 7], torch.tensor(10.0))  # one bit: no low-bit form any more
    assert panel_cache.low_bit(edited, min_cached=1) is None
    assert len(calls) == 2
    assert panel_cache.low_bit(edited, min_cached=1) is None and len(calls) == 2  # remembered: no second try


def test_small_weights_are_not_cached(cache):
    folder, calls = cache
    weight = q4_form(torch.randn(64, 64))
    for _ in range(2):
        assert isinstance(panel_cache.low_bit(weight, min_cached=64 * 64 + 1), panel4.Panel4)
    assert len(calls) == 2 and not folder.exists()


def test_broken_entries_are_rebuilt(cache):
    folder, calls = cache
    weight = q4_form(torch.randn(64, 64))
    want = panel_cache.low_bit(weight, min_cached=1)
    (entry,) = folder.glob("*.safetensors")
    entry.write_bytes(b"not a safetensors file")
    assert _same(panel_cache.low_bit(weight, min_cached=1), want) and len(calls) == 2
    assert _same(panel_cache.low_bit(weight, min_cached=1), want) and len(calls) == 2  # rewritten whole


def test_an_unwritable_cache_still_compresses(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SSD_CHAT_PANEL_CACHE", str(blocker / "panels"))  # under a file: mkdir fails
    weight = q8_form(torch.randn(64, 64))
    assert isinstance(panel_cache.low_bit(weight, min_cached=1), panel8.Panel8)
