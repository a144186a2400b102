"""The CPU kernels built for AVX2 (engine/kernels/simd.h's two 8-lane halves) compute the AVX-512 build's bits,
kernel by kernel and in a whole model's decode and verify steps; the engine takes the instruction set the CPU has,
and $SSD_CHAT_CPU_ISA another one only where the CPU has it."""

from __future__ import annotations

import logging

import pytest
import torch

from engine import LLM, cpu_info
from engine.layers import panel, panel4, panel8
from tests.engine.test_fused import step_logits
from tests.engine.test_panel4 import q4_form
from tests.engine.test_panel8 import q8_form

ISAS = ("avx512", "avx2")
pytestmark = pytest.mark.skipif(not {"avx512f", "avx2", "fma"} <= cpu_info.flags(),
                                reason="compares the AVX-512 and AVX2 builds: needs a CPU with both")


@pytest.fixture(scope="module")
def libs():
    built = {isa: panel.build(isa) for isa in ISAS}
    if any(lib is None for lib in built.values()):
        pytest.skip("the kernels do not build here (no C++ compiler)")
    return built


def _each(libs, run) -> list[torch.Tensor]:
    """run(lib) -> output, for each build; the AVX-512 output first."""
    return [run(libs[isa]) for isa in ISAS]


def _equal(outputs: list[torch.Tensor]) -> bool:
    return all(torch.equal(outputs[0], out) for out in outputs[1:])


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 8, 9, 13])
def test_gemms_give_the_same_bits(libs, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(100, 96, generator=g)  # 100 outputs: a short last panel
    panels = panel.to_panels(w)

    def fp32(lib):
        y = torch.empty(rows, 100)
        lib.panel_gemm(x.data_ptr(), rows, 96, panels.data_ptr(), y.data_ptr(), 100, 1)
        return y

    four, eight = panel4.compress(q4_form(torch.randn(64, 96, generator=g))), panel8.compress(q8_form(w[:96]))
    assert four is not None and eight is not None

    def q4(lib):
        y = torch.empty(rows, 64)
        lib.panel4_gemm(x.data_ptr(), rows, 96, *(t.data_ptr() for t in four.operands), y.data_ptr(), 64, 1)
        return y

    def q8(lib):
        y = torch.empty(rows, 96)
        lib.panel8_gemm(x.data_ptr(), rows, 96, *(t.data_ptr() for t in eight.operands), y.data_ptr(), 96, 1)
        return y

    for run, reference in ((fp32, x @ w.t()), (q4, None), (q8, None)):
        outputs = _each(libs, run)
        assert _equal(outputs), run.__name__
        if reference is not None:
            assert torch.allclose(outputs[0], reference, atol=1e-4)


@pytest.mark.parametrize("width", [576, 100])
def test_rms_norm_gives_the_same_bits(libs, width):
    g = torch.Generator().manual_seed(width)
    x, w = torch.randn(5, width, generator=g) * 4, torch.randn(width, generator=g)

    def norm(lib):
        y = torch.empty_like(x)
        lib.rms_norm(x.data_ptr(), 5, width, w.data_ptr(), 1e-5, y.data_ptr())
        return y

    outputs = _each(libs, norm)
    assert _equal(outputs)
    assert torch.allclose(outputs[0], x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "keys"), [(64, 37), (64, 300), (48, 21), (40, 23), (128, 16)])
def test_attention_gives_the_same_bits(libs, head_dim, keys):
    """Every path of attention.cpp: 16-wide exp and libm's tail, head sizes 64 and 128 and any other (48; 40: a
    masked tail)."""
    g = torch.Generator().manual_seed(keys)
    n, heads, kv_heads, slots = 5, 4, 2, 400
    q = torch.randn(n, heads, head_dim, generator=g)
    k, v = torch.randn(kv_heads, slots, head_dim, generator=g) * 2, torch.randn(kv_heads, slots, head_dim, generator=g)

    def attend(lib):
        out = torch.empty(n, heads * head_dim)
        lib.causal_attention(q.data_ptr(), n, heads, head_dim, k.data_ptr(), v.data_ptr(), kv_heads, slots, 3, keys,
                             head_dim**-0.5, out.data_ptr())
        return out

    outputs = _each(libs, attend)
    assert _equal(outputs)
    keys_of = k[:, 3 : 3 + keys].repeat_interleave(2, 0)  # [heads, keys, D]
    values_of = v[:, 3 : 3 + keys].repeat_interleave(2, 0)
    mask = torch.ones(n, keys, dtype=torch.bool).tril(keys - n)
    expected = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), keys_of, values_of, mask)
    assert torch.allclose(outputs[0], expected.transpose(0, 1).reshape(n, -1), atol=1e-5)


def test_rotary_gives_the_same_bits(libs):
    g = torch.Generator().manual_seed(3)
    x, cos, sin = torch.randn(5, 3, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)

    def rotary(lib):
        out = torch.empty_like(x)
        lib.rotary_rows(x.data_ptr(), 5, 3, 64, 3 * 64, cos.data_ptr(), sin.data_ptr(), out.data_ptr(), 3 * 64)
        return out

    assert _equal(_each(libs, rotary))


def test_a_models_steps_give_the_same_logits(libs, wide_heads_dir, monkeypatch):
    """Prefill, a 5-row verify and a one-row decode step (the fused layers) of a tiny model, per build."""
    logits = {}
    try:
        for isa in ISAS:
            monkeypatch.setenv(panel.ISA_ENV, isa)
            panel.forget()
            assert panel.isa() == isa and panel.available()
            with LLM(str(wide_heads_dir), max_model_len=128, enable_prefix_caching=False) as llm:
                runner = llm.core.runner
                ids = torch.randint(runner.model.args.vocab_size, (46,), generator=torch.Generator().manual_seed(4))
                ids = ids.tolist()
                logits[isa] = (step_logits(runner, ids, 0, 40), step_logits(runner, ids, 40, 5),
                               step_logits(runner, ids, 45, 1))
    finally:
        monkeypatch.delenv(panel.ISA_ENV)
        panel.forget()
    for a, b in zip(logits["avx512"], logits["avx2"], strict=True):
        assert torch.equal(a, b)


def test_the_cpu_decides_which_build_loads(monkeypatch, caplog):
    try:
        monkeypatch.delenv(panel.ISA_ENV, raising=False)
        panel.forget()
        assert panel.isa() == "avx512"
        monkeypatch.setenv(panel.ISA_ENV, "avx2")
        panel.forget()
        assert panel.isa() == "avx2"
        monkeypatch.setattr(cpu_info, "flags", lambda: frozenset({"avx2", "fma", "sse4_2"}))  # an AVX2-only CPU
        monkeypatch.setenv(panel.ISA_ENV, "avx512")
        panel.forget()
        with caplog.at_level(logging.WARNING, logger="engine.layers.panel"):
            assert panel.isa() == "avx2"
        assert "SSD_CHAT_CPU_ISA=avx512" in caplog.text
        monkeypatch.setattr(cpu_info, "flags", lambda: frozenset({"sse4_2", "avx"}))  # neither: MKL / oneDNN
        monkeypatch.delenv(panel.ISA_ENV)
        panel.forget()
        assert panel.isa() is None and not panel.available()
    finally:
        monkeypatch.undo()
        panel.forget()
