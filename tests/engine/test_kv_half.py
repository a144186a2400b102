"""A half-precision KV cache on the CPU (EngineConfig.kv_dtype = "float16", --kv-dtype float16): the keys and
values are rounded to half as they are written, and every later step computes on their exact float32 values. So the
row kernel gives the float32 kernel's bits on the converted cache, each row of a verify still gets its decode step's
bits, the fused layers write the bits torch's copy_ writes, and greedy speculation stays token-identical to AR with
the same cache. The paths without the kernel (SDPA) read the cache converted to float32."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import sdpa
from engine.attention.sdpa import ROW_KERNEL_ROWS, causal_rows
from engine.config import EngineConfig, SpeculationConfig
from engine.errors import InvalidParameterError
from engine.layers import fused, panel
from tests.engine.test_fused import step_logits

kernel = pytest.mark.skipif(not panel.ready(), reason="the row kernel needs AVX-512, AVX2 or NEON and a C++ compiler")

H, KVH = 6, 2


def _half_cache(d: int, slots: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(KVH, slots, d, generator=g).half(), torch.randn(KVH, slots, d, generator=g).half()


@kernel
@pytest.mark.parametrize("d", [64, 128, 80, 16])
@pytest.mark.parametrize("scattered", [False, True])
def test_the_kernel_over_a_half_cache_gives_the_float32_bits_of_its_values(d, scattered):
    k, v = _half_cache(d)
    slots = torch.cat([torch.arange(10, 40), torch.arange(100, 130)]) if scattered else slice(10, 70)
    for n in (1, 5, ROW_KERNEL_ROWS + 3):
        q = torch.randn(n, H, d, generator=torch.Generator().manual_seed(n))
        half = causal_rows(q, k, v, slots, 60, d**-0.5)
        assert torch.equal(half, causal_rows(q, k.float(), v.float(), slots, 60, d**-0.5)), n


@kernel
def test_each_row_of_a_verify_over_a_half_cache_is_its_decode_steps_bits():
    k, v = _half_cache(64)
    q = torch.randn(5, H, 64, generator=torch.Generator().manual_seed(1))
    many = causal_rows(q, k, v, slice(0, 90), 90, 0.125)  # rows see 86..90 keys
    for r in range(5):
        assert torch.equal(causal_rows(q[r : r + 1], k, v, slice(0, 86 + r), 86 + r, 0.125), many[r : r + 1]), r


def _runner_cache(llm: LLM) -> torch.Tensor:
    return llm.core.runner.backend.k[0]


@kernel
@pytest.mark.parametrize("rows", [1, 5])
def test_fused_steps_over_a_half_cache_give_the_eager_logits_and_cache_bits(wide_heads_dir, rows, monkeypatch):
    with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False, kv_dtype="float16") as llm:
        runner = llm.core.runner
        assert _runner_cache(llm).dtype == torch.float16
        ids = torch.randint(runner.model.args.vocab_size, (50,), generator=torch.Generator().manual_seed(1)).tolist()
        step_logits(runner, ids, 0, 40)  # the prompt (more rows than the fused layers take: eager)
        monkeypatch.setattr(fused, "ENABLED", False)
        eager = step_logits(runner, ids, 40, rows)
        written = [(k[:, 40 : 40 + rows].clone(), v[:, 40 : 40 + rows].clone())
                   for k, v in zip(runner.backend.k, runner.backend.v, strict=True)]
        for k, v in zip(runner.backend.k, runner.backend.v, strict=True):
            k[:, 40 : 40 + rows] = 0
            v[:, 40 : 40 + rows] = 0
        monkeypatch.setattr(fused, "ENABLED", True)
        calls, forward = [], fused.forward
        monkeypatch.setattr(fused, "forward", lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs))
        one_call = step_logits(runner, ids, 40, rows)
        assert calls == [1]  # (the fused layers take a half cache)
        assert torch.equal(one_call, eager)
        for (k, v), (k0, v0) in zip(zip(runner.backend.k, runner.backend.v, strict=True), written, strict=True):
            assert torch.equal(k[:, 40 : 40 + rows], k0) and torch.equal(v[:, 40 : 40 + rows], v0)


def test_a_half_cache_holds_half_the_bytes_and_gives_logits_close_to_float32s(wide_heads_dir):
    ids = torch.randint(300, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    logits = {}
    for kv_dtype in ("auto", "float16"):
        with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False, kv_dtype=kv_dtype) as llm:
            cache = _runner_cache(llm)
            logits[kv_dtype] = step_logits(llm.core.runner, ids, 0, 30)
            logits[kv_dtype, "bytes"] = cache.element_size()
            logits[kv_dtype, "layout"] = llm.layout["target"]  # (the chat's panel: the target's row)
    assert (logits["auto", "bytes"], logits["float16", "bytes"]) == (4, 2)
    assert "KV" not in logits["auto", "layout"] and logits["float16", "layout"].endswith(", half KV cache)")
    assert not torch.equal(logits["auto"], logits["float16"])  # (the values were rounded)
    torch.testing.assert_close(logits["float16"], logits["auto"], rtol=0, atol=0.02)


@pytest.mark.parametrize("row_kernel", [True, False], ids=["row-kernel", "sdpa"])
def test_greedy_sd_and_ssd_over_a_half_cache_equal_ar_over_it(tiny_llama_dir, wide_heads_dir, row_kernel,
                                                              monkeypatch):
    if row_kernel and not panel.ready():
        pytest.skip("the row kernel needs AVX-512, AVX2 or NEON and a C++ compiler")
    if not row_kernel:  # torch's SDPA on the converted cache (a CPU without the kernels)
        monkeypatch.setattr(sdpa, "row_kernel", lambda q, k_cache: False)
        monkeypatch.setattr(fused, "ENABLED", False)
    prompts = [[5, 9, 13, 2, 7], [11, 3, 3, 8, 1, 4, 20, 6]]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    model = str(wide_heads_dir if row_kernel else tiny_llama_dir)
    with LLM(model, draft=model, max_model_len=128, kv_dtype="float16") as llm:
        assert _runner_cache(llm).dtype == torch.float16
        llm.speculation = SpeculationConfig(mode="ar")
        expected = [out.token_ids for out in llm.generate(prompts, greedy)]  # (a batch: batched decode steps)
        assert [llm.generate([ids], greedy)[0].token_ids for ids in prompts] == expected
        for mode in ("sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            assert [llm.generate([ids], greedy)[0].token_ids for ids in prompts] == expected, mode


def test_kv_dtype_takes_auto_or_float16_and_float16_only_on_the_cpu():
    assert EngineConfig(kv_dtype="float16").fast_path.kv_dtype == "float16"
    with pytest.raises(InvalidParameterError, match="kv_dtype must be one of auto, float16"):
        EngineConfig(kv_dtype="float8")
    with pytest.raises(InvalidParameterError, match="--kv-dtype float16 is for the CPU"):
        EngineConfig(kv_dtype="float16", device="cuda")
