"""MKL-packed weights (engine.layers.packed) change how few-row steps multiply, never what they produce: the
products equal the plain GEMM's bit for bit, and greedy SD/SSD equal AR with and without them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import packed
from engine.layers.linear import ColumnParallelLinear

pytestmark = pytest.mark.skipif(not packed.available(), reason="torch built without MKL")

PROMPTS = [[1, 5, 9, 12], [3, 3, 7], list(range(2, 40))]


def _k_major_layer(n: int, k: int, seed: int) -> ColumnParallelLinear:
    layer = ColumnParallelLinear(k, n)
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    layer.weight.data = weight.t().contiguous().t()  # as engine.layers.linear.to_k_major stores it
    return layer


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (4096, 576), (96, 64)])
def test_packed_products_equal_the_plain_gemm_bit_for_bit(n, k):
    layer = _k_major_layer(n, k, seed=n + k)
    layer.packed = packed.pack(layer.weight)
    assert packed.same_products(layer.weight, layer.packed)
    for rows in range(1, 13):  # 1 and 9.. rows take the plain path, 2..8 the packed one
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(layer(x), F.linear(x, layer.weight)), rows
    x3 = torch.randn(1, 3, k)  # [B, T, K] inputs keep their leading shape
    assert torch.equal(layer(x3), F.linear(x3, layer.weight))


def test_only_two_to_eight_rows_take_the_packed_copy():
    layer = _k_major_layer(96, 64, seed=3)
    layer.packed = packed.pack(layer.weight * 2)  # a copy that is visibly not the weight
    for rows in range(1, 12):
        x = torch.randn(rows, 64)
        expected = F.linear(x, layer.weight) * (2 if 2 <= rows <= packed.MAX_ROWS else 1)
        assert torch.allclose(layer(x), expected, atol=1e-4), rows
    x = torch.randn(64, 4).t()  # a non-contiguous [4, 64] input
    assert torch.allclose(layer(x), F.linear(x, layer.weight) * 2, atol=1e-4)


def test_layers_with_a_bias_stay_unpacked():
    with_bias, without = ColumnParallelLinear(32, 48, bias=True), _k_major_layer(48, 32, seed=4)
    with_bias.weight.data, with_bias.bias.data = without.weight.data.clone(), torch.randn(48)
    model = torch.nn.ModuleList([with_bias, without])
    assert packed.pack_weights(model) == 1
    assert with_bias.packed is None and without.packed is not None


def _run(model_dir, packed_weights: bool) -> tuple[dict[str, list[list[int]]], int, int]:
    llm = LLM(target=str(model_dir), draft=str(model_dir), packed_weights=packed_weights)
    try:
        target, draft = llm.core.runner.model, llm.core.drafter.runner.model
        count = sum(getattr(m, "packed", None) is not None for m in target.modules())
        draft_count = sum(getattr(m, "packed", None) is not None for m in draft.modules())
        greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        outputs = {}
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                outputs[mode] = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
            packed_calls = sum(e.count for e in prof.key_averages() if e.key == "mkl::_mkl_linear")
            assert (packed_calls > 0) == packed_weights, (mode, packed_calls)  # 3 requests: even AR steps have 3 rows
        return outputs, count, draft_count
    finally:
        llm.close()


@pytest.mark.parametrize("family", ["llama", "qwen3-tied"])
def test_packed_weights_give_the_same_tokens(family, tiny_llama_dir, tiny_qwen3_dir):
    model_dir = tiny_llama_dir if family == "llama" else tiny_qwen3_dir
    (with_packed, count, draft_count), (plain, none, _) = _run(model_dir, True), _run(model_dir, False)
    assert count > 0 and draft_count > 0 and none == 0
    assert with_packed == plain
    assert with_packed["sd"] == with_packed["ar"] and with_packed["ssd"] == with_packed["ar"]


def test_only_speculation_packs_and_only_float32(tiny_llama_dir):
    with LLM(target=str(tiny_llama_dir)) as llm:  # AR only: one-row steps, so no packed copies
        assert not any(getattr(m, "packed", None) is not None for m in llm.core.runner.model.modules())
    layer = _k_major_layer(64, 32, seed=1).to(torch.bfloat16)
    assert packed.pack_weights(layer) == 0 and layer.packed is None
