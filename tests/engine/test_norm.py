"""RMSNorm (engine.layers.norm): a row's output is the same bits at any row count (so a verify reproduces plain
decoding), on the kernel and on torch's formula, eager and compiled, and both agree with the formula."""

from __future__ import annotations

import pytest
import torch

from engine.layers import norm, panel

needs_kernel = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")


def _norm(dim: int, seed: int) -> tuple[norm.RMSNorm, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    layer = norm.RMSNorm(dim, 1e-5)
    layer.weight.data = 1 + 0.1 * torch.randn(dim, generator=generator)
    return layer, 3 * torch.randn(40, dim, generator=generator)


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernel), False])
@pytest.mark.parametrize("dim", [64, 100, 576])
def test_a_row_is_the_same_bits_at_any_row_count(monkeypatch, kernel, dim):
    if not kernel:
        monkeypatch.setattr(panel, "available", lambda: False)
    layer, x = _norm(dim, dim)
    one_by_one = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    for rows in (2, 5, 9, 40):
        assert torch.equal(layer(x[:rows]), one_by_one[:rows]), rows
    assert torch.equal(layer(x.view(8, 5, dim)).view(40, dim), one_by_one)  # [..., D]: rows are rows
    want = layer.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(one_by_one, want, rtol=1e-6, atol=1e-6)


@needs_kernel
def test_add_forward_adds_the_residual_in_place_then_normalises():
    layer, x = _norm(576, 1)
    residual = torch.randn(5, 576)
    h, stream = layer.add_forward(x[:5].clone(), residual)
    assert torch.equal(stream, x[:5] + residual) and torch.equal(h, layer(x[:5] + residual))


@needs_kernel
def test_the_compiled_op_gives_the_eager_bits():
    layer, x = _norm(576, 2)
    torch.compiler.assume_constant_result(panel.ready)  # as engine.compiled_decode marks it (run alone, it was not)
    compiled = torch.compile(layer.forward, dynamic=True, fullgraph=True)
    for rows in (1, 5):
        assert torch.equal(compiled(x[:rows]), layer(x[:rows])), rows


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_hidden_state_is_normed_in_float32_as_transformers_norms_it(dtype):
    """SmolLM2's residual stream reaches about 7,000 on a chat prompt: in float16 its squares overflow (5e7 > 65,504),
    and a norm computed in float16 was 0, so every `--dtype float16` reply was token 0."""
    layer, x = _norm(576, 7)
    layer = layer.to(dtype)
    big = (x * 3000).to(dtype)  # squares past float16's range
    got = layer(big)
    assert got.dtype == dtype and bool(torch.isfinite(got).all()) and got.abs().max() > 1
    h = big.float()
    want = layer.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)  # (LlamaRMSNorm's)
    assert torch.equal(got, want)
