"""Packed weights (engine.layers.packed) change how few-row steps multiply: MKL's products equal the plain
GEMM's bit for bit, oneDNN's to float32 rounding, and greedy SD/SSD equal AR with either kernel and without."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import packed
from engine.layers import packed_kernels as kernels
from engine.layers.linear import ColumnParallelLinear

PROMPTS = [[1, 5, 9, 12], [3, 3, 7], list(range(2, 40))]


def _k_major_layer(n: int, k: int, seed: int) -> ColumnParallelLinear:
    layer = ColumnParallelLinear(k, n)
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    layer.weight.data = weight.t().contiguous().t()  # as engine.layers.linear.to_k_major stores it
    return layer


def _packed_layer(n: int, k: int, seed: int, kernel: str, scale: float = 1.0) -> ColumnParallelLinear:
    if not kernels.available(kernel):
        pytest.skip(f"torch built without the {kernel} packed GEMM")
    layer = _k_major_layer(n, k, seed)
    layer.packed = packed.pack(layer.weight * scale, kernel)
    layer.packed_kernel, layer.packed_rows = kernel, kernels.MAX_ROWS[kernel]
    return layer


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (4096, 576), (96, 64)])
def test_mkl_packed_products_equal_the_plain_gemm_bit_for_bit(n, k):
    layer = _packed_layer(n, k, seed=n + k, kernel="mkl")
    assert packed.same_products(layer.weight, layer.packed, "mkl")
    for rows in range(1, 13):  # 1 and 9.. rows take the plain path, 2..8 the packed one
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(layer(x), F.linear(x, layer.weight)), rows
    x3 = torch.randn(1, 3, k)  # [B, T, K] inputs keep their leading shape
    assert torch.equal(layer(x3), F.linear(x3, layer.weight))


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (96, 64)])
def test_onednn_packed_products_match_the_plain_gemm(n, k):
    layer = _packed_layer(n, k, seed=n + k, kernel="onednn")
    assert packed.same_products(layer.weight, layer.packed, "onednn")
    for rows in (1, 2, 5, 17, 32, 33, 40):  # 1 and 33.. rows take the plain path, 2..32 the packed one
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        want = F.linear(x, layer.weight)
        assert torch.allclose(layer(x), want, rtol=1e-4, atol=1e-4), rows
        if rows in (1, 33, 40):
            assert torch.equal(layer(x), want), rows
    x3 = torch.randn(2, 3, k)  # [B, T, K] inputs keep their leading shape
    assert torch.allclose(layer(x3), F.linear(x3, layer.weight), rtol=1e-4, atol=1e-4)
    assert not packed.same_products(layer.weight, packed.pack(layer.weight * 1.01, "onednn"), "onednn")


@pytest.mark.parametrize("kernel", kernels.KERNELS)
def test_only_the_kernels_row_counts_take_the_packed_copy(kernel):
    layer = _packed_layer(96, 64, seed=3, kernel=kernel, scale=2.0)  # a copy that is visibly not the weight
    for rows in range(1, kernels.MAX_ROWS[kernel] + 4):
        x = torch.randn(rows, 64)
        expected = F.linear(x, layer.weight) * (2 if 2 <= rows <= kernels.MAX_ROWS[kernel] else 1)
        assert torch.allclose(layer(x), expected, atol=1e-4), rows
    x = torch.randn(64, 4).t()  # a non-contiguous [4, 64] input
    assert torch.allclose(layer(x), F.linear(x, layer.weight) * 2, atol=1e-4)
    layer.packed_min_rows = 1  # where one-row steps gain from the packed copy too (kernels.one_row_pays)
    x = torch.randn(1, 64)
    assert torch.allclose(layer(x), F.linear(x, layer.weight) * 2, atol=1e-4)


def test_the_kernel_follows_the_cpu_vendor(monkeypatch):
    monkeypatch.setattr(kernels, "_has_avx512", lambda: True)
    monkeypatch.setattr(kernels, "_cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(kernels, "_panel_available", lambda: True)
    assert kernels.default_kernel() == "panel4" and kernels.one_row_pays() and kernels.min_rows("panel") == 1
    assert kernels.family("auto") == "panel" and kernels.min_rows("auto") == 1  # 4-bit copies where exact
    assert kernels.max_rows("panel") == kernels.MAX_ROWS["panel"] == kernels.max_rows("panel4")  # prefill: MKL
    monkeypatch.setattr(kernels, "_panel_available", lambda: False)  # no compiler: MKL's packed GEMM
    assert kernels.default_kernel() == "mkl" and not kernels.one_row_pays() and kernels.min_rows("mkl") == 2
    assert not kernels.one_row_pays("onednn")  # oneDNN asked for on Intel: only few-row steps, as measured there
    monkeypatch.setattr(kernels, "_cpu_vendor", lambda: "AuthenticAMD")
    assert kernels.default_kernel() == "onednn" and kernels.one_row_pays() and kernels.min_rows("onednn") == 1
    assert not kernels.one_row_pays("mkl") and kernels.min_rows("mkl") == 2
    monkeypatch.setattr(kernels, "_panel_available", lambda: True)  # AVX-512 off Intel: the panel kernel, every step
    assert kernels.default_kernel() == "panel4" and kernels.max_rows("auto") == kernels.EVERY_STEP
    monkeypatch.setattr(kernels, "_panel_available", lambda: False)
    monkeypatch.setattr(kernels, "_has_avx512", lambda: False)  # AVX2 only (Zen 3): a one-row step is faster plain
    assert kernels.default_kernel() == "onednn" and not kernels.one_row_pays() and kernels.min_rows("onednn") == 2
    assert kernels.max_rows("onednn") == kernels.MAX_ROWS["onednn"]  # and many-row steps run the plain GEMM
    monkeypatch.setattr(kernels, "_has_avx512", lambda: True)
    assert kernels.max_rows("onednn") == kernels.EVERY_STEP and kernels.max_rows("mkl") == kernels.MAX_ROWS["mkl"]
    with pytest.raises(ValueError, match="packed kernel"):
        packed.pack_weights(_k_major_layer(8, 8, seed=0), "blas")


def test_layers_with_a_bias_stay_unpacked():
    with_bias, without = ColumnParallelLinear(32, 48, bias=True), _k_major_layer(48, 32, seed=4)
    with_bias.weight.data, with_bias.bias.data = without.weight.data.clone(), torch.randn(48)
    model = torch.nn.ModuleList([with_bias, without])
    assert packed.pack_weights(model) == 1
    assert with_bias.packed is None and without.packed is not None


OPS = {"mkl": (torch.ops.mkl, "_mkl_linear"), "onednn": (torch.ops.mkldnn, "_linear_pointwise")}


def _count_packed_calls(monkeypatch, kernel: str) -> list[int]:
    """Count the calls of `kernel`'s packed GEMM op from now on: [calls], to read and reset."""
    namespace, name = OPS[kernel]
    calls, op = [0], getattr(namespace, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(namespace, name, counted)  # the profiler would count them too, at 10x the test's time
    return calls


def _run(model_dir, packed_weights: bool, kernel: str = "mkl",
         monkeypatch=None) -> tuple[dict[str, list[list[int]]], int, int]:
    calls = _count_packed_calls(monkeypatch, kernel)
    llm = LLM(target=str(model_dir), draft=str(model_dir), packed_weights=packed_weights, packed_kernel=kernel,
              draft_weights="float32")
    try:
        target, draft = llm.core.runner.model, llm.core.drafter.runner.model
        count = sum(getattr(m, "packed", None) is not None for m in target.modules())
        draft_count = sum(getattr(m, "packed", None) is not None for m in draft.modules())
        greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        outputs = {}
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            calls[0] = 0
            outputs[mode] = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
            packed_calls = calls[0]
            assert (packed_calls > 0) == packed_weights, (mode, packed_calls)  # 3 requests: even AR steps have 3 rows
        return outputs, count, draft_count
    finally:
        llm.close()


@pytest.mark.parametrize(("family", "kernel"), [("llama", "mkl"), ("qwen3-tied", "mkl"), ("llama", "onednn"),
                                               ("qwen3-tied", "onednn")])
def test_packed_weights_give_the_same_tokens(family, kernel, tiny_llama_dir, tiny_qwen3_dir, monkeypatch):
    if not kernels.available(kernel):
        pytest.skip(f"torch built without the {kernel} packed GEMM")
    model_dir = tiny_llama_dir if family == "llama" else tiny_qwen3_dir
    (with_packed, count, draft_count), (plain, none, _) = _run(model_dir, True, kernel, monkeypatch), \
        _run(model_dir, False, kernel, monkeypatch)
    assert count > 0 and draft_count > 0 and none == 0
    assert with_packed["sd"] == with_packed["ar"] and with_packed["ssd"] == with_packed["ar"]
    if kernel == "mkl":  # the same products bit for bit: the same tokens in every mode
        assert with_packed == plain


def _one_row_pays(monkeypatch, pays: bool) -> None:
    monkeypatch.setattr(kernels, "_cpu_vendor", lambda: "AuthenticAMD" if pays else "GenuineIntel")
    monkeypatch.setattr(kernels, "_has_avx512", lambda: pays)
    monkeypatch.setattr(kernels, "_panel_available", lambda: False)  # Intel with MKL's kernels (test_panel.py: ours)


def test_only_speculation_packs_and_only_float32(tiny_llama_dir, monkeypatch):
    _one_row_pays(monkeypatch, False)
    with LLM(target=str(tiny_llama_dir)) as llm:  # AR only: one-row steps, so no packed copies
        assert not any(getattr(m, "packed", None) is not None for m in llm.core.runner.model.modules())
    layer = _k_major_layer(64, 32, seed=1).to(torch.bfloat16)
    assert packed.pack_weights(layer) == 0 and layer.packed is None


def test_where_one_row_steps_gain_ar_alone_packs_and_decodes_through_the_copies(tiny_llama_dir, monkeypatch):
    if not kernels.available("onednn"):
        pytest.skip("torch built without the onednn packed GEMM")
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    _one_row_pays(monkeypatch, False)
    with LLM(target=str(tiny_llama_dir), packed_kernel="onednn") as llm:
        plain = [out.token_ids for out in llm.generate(PROMPTS[:1], greedy)]
        batch = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
    _one_row_pays(monkeypatch, True)
    calls = _count_packed_calls(monkeypatch, "onednn")
    with LLM(target=str(tiny_llama_dir), packed_kernel="onednn") as llm:
        modules = [m for m in llm.core.runner.model.modules() if getattr(m, "packed", None) is not None]
        assert modules and all(m.packed_min_rows == 1 and m.packed_rows == kernels.EVERY_STEP for m in modules)
        calls[0] = 0
        assert [out.token_ids for out in llm.generate(PROMPTS[:1], greedy)] == plain
        # every step went through the packed copies: the many-row prefill and the 23 one-row decode steps
        assert calls[0] == 24 * len(modules)
        calls[0] = 0
        assert [out.token_ids for out in llm.generate(PROMPTS, greedy)] == batch  # batched steps take them too
        assert calls[0] >= 24 * len(modules)
    with LLM(target=str(tiny_llama_dir), packed_kernel="onednn", packed_weights=False) as llm:
        assert not any(getattr(m, "packed", None) is not None for m in llm.core.runner.model.modules())


def test_compile_is_warned_off_where_it_would_replace_the_one_row_copies(tiny_llama_dir, monkeypatch, caplog):
    from engine.errors import InvalidParameterError

    for pays in (True, False):
        _one_row_pays(monkeypatch, pays)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="engine.build"), pytest.raises(InvalidParameterError):
            LLM(str(tiny_llama_dir), compile=True, max_model_len=10**9)  # refused after the check, before compiling
        assert ("leave --compile off" in caplog.text) == pays
