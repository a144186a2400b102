"""The panel GEMM (engine.layers.panel): products to float32 rounding of the plain GEMM's, the same bits for a
row whatever the row and thread counts, every few-row step through it, greedy SD/SSD equal to AR, and MKL's
kernels where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import native, packed, packed_kernels, panel

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")

PROMPTS = [[1, 5, 9, 12], [3, 3, 7], list(range(2, 40))]


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (100, 37), (8, 64), (4 * 32 + 16, 5)])
def test_products_match_the_plain_gemm(n, k):
    generator = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=generator).t().contiguous().t()  # K-major, as the engine stores it
    panels = panel.to_panels(weight)
    assert panels.shape == (-(-n // 32), k, 32)
    for rows in (1, 2, 3, 5, 8, 9, 16, 17, 32, 40):
        x = torch.randn(rows, k, generator=generator)
        got = panel.matmul(x, panels, n)
        assert got.shape == (rows, n)
        assert torch.allclose(got, F.linear(x, weight), rtol=1e-4, atol=1e-4), rows
    assert not torch.allclose(panel.matmul(x, panel.to_panels(weight * 1.01), n), F.linear(x, weight),
                              rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("n", "k"), [(960, 576), (100, 37)])
def test_a_rows_products_do_not_depend_on_the_row_or_thread_count(n, k):
    generator = torch.Generator().manual_seed(7)
    panels = panel.to_panels(torch.randn(n, k, generator=generator))
    x = torch.randn(24, k, generator=generator)
    one_by_one = torch.cat([panel.matmul(x[i : i + 1], panels, n) for i in range(24)])
    threads, lib = torch.get_num_threads(), native.library()
    try:
        for tall_from in (1 << 40, 2, 0):  # panel_gemm.cpp's tall passes never, from 2 rows on, the build's choice
            lib.fp32_tall_rows(tall_from)
            for count in (1, 2):
                torch.set_num_threads(count)
                for rows in (2, 3, 5, 6, 7, 8, 13, 24):
                    got = panel.matmul(x[:rows], panels, n)
                    assert torch.equal(got, one_by_one[:rows]), (tall_from, count, rows)
    finally:
        torch.set_num_threads(threads)
        lib.fp32_tall_rows(0)


def test_the_load_time_check_accepts_the_panels_and_refuses_a_wrong_copy():
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(3)).t().contiguous().t()
    assert packed.same_products(weight, packed.pack(weight, "panel"), "panel")
    assert not packed.same_products(weight, packed.pack(weight * 1.01, "panel"), "panel")


def _count_panel_calls(monkeypatch) -> list[int]:
    calls, matmul = [0], panel.matmul

    def counted(*args, **kwargs):
        calls[0] += 1
        return matmul(*args, **kwargs)

    monkeypatch.setattr(panel, "matmul", counted)
    return calls


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_every_few_row_step_takes_the_panels_and_greedy_sd_ssd_equal_ar(tiny_llama_dir, monkeypatch, vendor):
    monkeypatch.setattr(packed_kernels, "_cpu_vendor", lambda: vendor)  # Intel: prefill on MKL; elsewhere on the panels
    many_rows = vendor != "GenuineIntel"
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    calls = _count_panel_calls(monkeypatch)
    with LLM(target=str(tiny_llama_dir), packed_kernel="panel") as llm:  # AR alone packs: one-row steps take it
        modules = [m for m in llm.core.runner.model.modules() if getattr(m, "packed", None) is not None]
        most = packed_kernels.EVERY_STEP if many_rows else packed_kernels.MAX_ROWS["panel"]
        assert modules and all(m.packed_kernel == "panel" and m.packed_min_rows == 1 and m.packed_rows == most
                               for m in modules)
        calls[0] = 0
        alone = [out.token_ids for out in llm.generate(PROMPTS[:1], greedy)]
        assert calls[0] == 24 * len(modules)  # the 4-row prefill and the 23 one-row decode steps
        calls[0] = 0
        llm.generate(PROMPTS[2:], greedy)  # a 38-row prefill: through the panels off Intel (on Intel only the head's
        assert calls[0] == 23 * len(modules) + (len(modules) if many_rows else 1)  # one row: the last position's)
    llm = LLM(target=str(tiny_llama_dir), draft=str(tiny_llama_dir), packed_kernel="panel", draft_weights="float32")
    try:
        outputs = {}
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            calls[0] = 0
            outputs[mode] = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
            assert calls[0] > 0, mode
    finally:
        llm.close()
    assert outputs["sd"] == outputs["ar"] and outputs["ssd"] == outputs["ar"]
    assert outputs["ar"][0] == alone[0]


def test_without_a_compiler_the_engine_keeps_mkl(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SSD_CHAT_KERNEL_CACHE", str(tmp_path / "kernels"))
    try:
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
        native.forget()
        assert not panel.available()
        monkeypatch.setattr(packed_kernels, "_cpu_vendor", lambda: "GenuineIntel")
        assert packed_kernels.default_kernel() == "mkl" and not packed_kernels.one_row_pays()
        monkeypatch.setenv("CXX", "false")  # a compiler that fails: one warning line, then MKL
        native.forget()
        with caplog.at_level(logging.WARNING, logger="engine.layers.native"):
            assert not panel.available()
        assert "did not build" in caplog.text and not list((tmp_path / "kernels").glob("*.so"))
        monkeypatch.delenv("CXX")
        native.forget()
        assert panel.available() and len(list((tmp_path / "kernels").glob("*.so"))) == 1  # built into the cache
    finally:
        native.forget()


@pytest.mark.slow  # compiles the tiny model's graphs with inductor
def test_compiled_steps_call_the_panel_kernel_and_keep_greedy_ar(tiny_llama_dir, tmp_path, monkeypatch):
    """--compile keeps the panels: the compiled decode and verify graphs call the kernel as one op (prefill
    past 32 rows takes MKL's GEMM inside the same op), and greedy AR, SD and SSD give eager AR's tokens."""
    from tests.engine.test_spec_decode import noisy_copy

    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(target=str(tiny_llama_dir), packed_kernel="panel") as eager:
        want = [out.token_ids for out in eager.generate(PROMPTS, greedy)]
    calls = _count_panel_calls(monkeypatch)
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.1, seed=3)
    with LLM(target=str(tiny_llama_dir), draft=str(draft), packed_kernel="panel", compile=True,
             block_size=4) as llm:
        compiled = llm.core.runner.compiled
        assert compiled is not None and compiled.available
        modules = [m for m in llm.core.runner.model.modules() if getattr(m, "packed", None) is not None]
        assert modules
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            runs, calls[0] = compiled.num_runs, 0
            got = [llm.generate([p], greedy)[0].token_ids for p in PROMPTS]
            runs = compiled.num_runs - runs
            assert runs > 10 and calls[0] > 0, mode
            if mode == "ar":  # every compiled step's matmuls took the panels (the eager prefills add the rest)
                assert calls[0] >= runs * len(modules), (calls[0], runs)
            assert got == want, mode
    x, weight = torch.randn(40, 64), torch.randn(50, 64)
    panels = panel.to_panels(weight)
    torch.testing.assert_close(panel.linear_op(x, panels, weight, 32), F.linear(x, weight))  # 40 rows: MKL
    assert torch.equal(panel.linear_op(x[:8], panels, weight, 32), panel.matmul(x[:8], panels, 50))
