"""--cpu-matmul q8 (engine/kernels/q8_gemm.cpp): the 4- and 8-bit panels' products with 8-bit activations. Its products
are the float32 products of the activations it rounds (engine.layers.panel4.q8_activations), near the float32
model's; every row's bits are the same at any row and thread count, so greedy SD and SSD still equal AR under it,
fused layers or not; AVX2's code (engine/kernels/q8_avx2.cpp) gives AVX-512 VNNI's bits; a CPU without AVX2 gets
a one-line error. The same kernel runs int8 drafts
(engine.layers.low_bits.int8_panels), whose steps then take the fused layers; the output stays the target's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig, SpeculationConfig
from engine.errors import InvalidParameterError
from engine.layers import fused, low_bits, native, packed, panel4, panel8
from tests.engine.test_panel4 import q4_form, rewritten
from tests.engine.test_panel8 import q8_form

pytestmark = pytest.mark.skipif(not native.q8_available(), reason="needs an x86 CPU with AVX2 and a C++ compiler")

SHAPES = [(960, 576), (576, 1536), (64, 32)]
FORMS = {4: (q4_form, panel4.Panel4, "panel4q8_gemm"), 8: (q8_form, panel8.Panel8, "panel8q8_gemm")}


WIDE = native.q8_vnni()  # this CPU runs the AVX-512 VNNI code (else AVX2's)


@pytest.fixture(params=["avx512", "avx2"])
def path(request):
    """The kernel tests run each x86 code the CPU has (q8_path: 1 AVX-512 VNNI, 0 AVX2)."""
    if request.param == "avx512" and not WIDE:
        pytest.skip("no AVX-512 VNNI and VBMI here")
    native.library().q8_path(1 if request.param == "avx512" else 0)
    yield request.param
    native.library().q8_path(-1)


def q8_copy(n: int, k: int, seed: int, bits: int = 4) -> tuple[torch.Tensor, panel4.Panel4 | panel8.Panel8]:
    form, kind, kernel = FORMS[bits]
    weight = form(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05)
    copy = packed.pack(weight, "q8")
    assert isinstance(copy, kind) and copy.q8 and copy.kernel == kernel
    return weight, copy


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_products_are_the_rounded_activations_float32_products_and_near_float32s(n, k, bits, path):
    weight, copy = q8_copy(n, k, n + k, bits)
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(1)) * 3
    got = copy.matmul(x)
    rounded = panel4.q8_activations(x)
    assert torch.allclose(got, F.linear(rounded, weight), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)  # not the float32 model's products
    error = (got - F.linear(x, weight)).norm(dim=-1) / F.linear(x, weight).norm(dim=-1)
    assert float(error.max()) < 0.02  # about 0.6% for random rows
    assert packed.same_products(weight, copy, "q8")


def test_activations_round_each_block_to_127_steps_of_its_largest():
    x = torch.tensor([[*range(-16, 16)], [0.0] * 32, [1e-3] * 31 + [-2.0]])
    rounded = panel4.q8_activations(x)
    assert torch.equal(rounded[1], x[1])  # a zero block stays zero (no division by its zero maximum)
    assert rounded[0, 0] == -16 and rounded[2, 31] == -2.0  # the largest value is kept
    steps = rounded[2, :31] / (2.0 / 127)
    assert torch.equal(steps, steps.round()) and torch.equal(rounded[2, :31], torch.zeros(31))  # 1e-3 < a half step


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [2560, 4096])
def test_wide_inputs_round_as_the_reference_does(k, bits, path):
    """Every block's 127 / max |x| the kernel's division (a reciprocal times 127 differs by an ulp in about a
    quarter of the blocks, and then some x * inv near a half rounds the other way): a tight match at any width."""
    weight, copy = q8_copy(64, k, k, bits)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(k))
    assert torch.allclose(copy.matmul(x), F.linear(panel4.q8_activations(x), weight), rtol=1e-5, atol=1e-5)
    assert packed.same_products(weight, copy, "q8")


@pytest.mark.parametrize("bits", [4, 8])
def test_zero_tiny_and_nan_blocks(bits, path):
    weight, copy = q8_copy(64, 64, 5, bits)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6))
    x[0] = 0.0  # a zero row: zero products (no division by its zero maximum)
    x[1, :32] = torch.tensor([1e-38, -3e-39] * 16)  # 127 / max |x| overflows: counts as zeros, not as inf * x
    x[2, 40] = float("nan")
    x[3, 5] = float("inf")  # NaN products too, on either code (AVX2 and AVX-512 would round the inf apart)
    tiny_alone = torch.cat([x[1:2, :32], torch.zeros(1, 32)], 1)
    got, tiny = copy.matmul(x), copy.matmul(tiny_alone)
    assert torch.equal(got[0], torch.zeros(64)) and torch.equal(tiny, torch.zeros(1, 64))
    assert torch.allclose(got[1], F.linear(panel4.q8_activations(x[1:2]), weight)[0], rtol=1e-5, atol=1e-5)
    assert torch.isnan(got[2]).all() and torch.isnan(got[3]).all()  # NaN or inf in: NaN out
    assert not torch.isnan(copy.matmul(x[:2])).any()
    rounded = panel4.q8_activations(x[:2])
    assert torch.equal(rounded[0], torch.zeros(64)) and torch.equal(rounded[1, :32], torch.zeros(32))
    assert torch.equal(rounded[1, 32:], panel4.q8_activations(x[1:2, 32:])[0])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_gets_its_one_row_bits_at_any_row_count(threads, bits, path):
    torch.set_num_threads(threads)
    try:
        for n, k in SHAPES:
            _, copy = q8_copy(n, k, 7, bits)
            x = torch.randn(40, k, generator=torch.Generator().manual_seed(n))
            alone = torch.cat([copy.matmul(x[i : i + 1]) for i in range(40)])
            for rows in (2, 3, 4, 5, 8, 9, 13, 40):
                assert torch.equal(copy.matmul(x[:rows]), alone[:rows]), (n, k, rows)
    finally:
        torch.set_num_threads(1)


@pytest.mark.skipif(not WIDE, reason="needs a CPU that runs both codes")
@pytest.mark.parametrize("bits", [4, 8])
def test_avx2_gives_avx512s_bits(bits):
    lib = native.library()
    try:
        for n, k in [*SHAPES, (96, 64)]:
            _, copy = q8_copy(n, k, 11, bits)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for rows in (1, 2, 3, 5, 7, 13):
                    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 2
                    x[0, :32] = 0.0  # a zero block
                    lib.q8_path(1)
                    wide = copy.matmul(x)
                    lib.q8_path(0)
                    assert torch.equal(copy.matmul(x), wide), (n, k, threads, rows)
    finally:
        lib.q8_path(-1)
        torch.set_num_threads(1)


@pytest.fixture(scope="module")
def q4_wide(wide_heads_dir, tmp_path_factory):
    """The wide-heads tiny model (head size 64: the fused layers take its steps) with Q4_1-form layer weights and a
    Q8_0-form embedding and head, as SmolLM2-135M's."""
    def form(name: str, w: torch.Tensor) -> torch.Tensor | None:
        if w.shape[1] % 32 or w.shape[0] % 32:
            return None
        return q4_form(w) if "proj" in name else q8_form(w) if "embed" in name or "lm_head" in name else None

    return rewritten(wide_heads_dir, tmp_path_factory.mktemp("q4wide"), form)


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 9, 13, 2, 7], [11, 3, 3, 8, 1, 4, 20, 6]]


def test_speculation_under_q8_equals_its_ar_fused_or_eager(q4_wide, monkeypatch):
    outputs, rows = {}, []
    forward = fused.forward
    monkeypatch.setattr(fused, "forward", lambda *args: rows.append(args[2].shape[0]) or forward(*args))
    with LLM(str(q4_wide), draft=str(q4_wide), packed_kernel="q8", max_model_len=128, threads=1) as llm:
        copies = [m.packed for m in packed.bias_free_matmuls(llm.core.runner.model)
                  if isinstance(getattr(m, "packed", None), packed.LOW_BIT)]
        assert {type(c) for c in copies} == {panel4.Panel4, panel8.Panel8} and all(c.q8 for c in copies)
        assert "8-bit activations (q8)" in llm.layout["target"]  # the chat's panel says it is not float32
        for fused_on in (False, True):
            monkeypatch.setattr(fused, "ENABLED", fused_on)
            for mode in ("ar", "sd", "ssd"):
                llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
                outputs[fused_on, mode] = [llm.generate([ids], GREEDY)[0].token_ids for ids in PROMPTS]
    assert all(out == outputs[False, "ar"] for out in outputs.values()), outputs
    assert 1 in rows and 5 in rows  # fused decode steps and k + 1 = 5-row verifies ran (layer.cpp's kind 5)


@pytest.mark.slow  # SmolLM2-135M: the tiny models flip no token
@pytest.mark.parametrize("kernel", ["q8", "panel4"])
def test_prompts_decode_in_a_batch_as_alone(kernel):
    """A batch's decode steps attend each sequence through the row kernel (engine.attention.sdpa), the bits it gets
    alone: the padded batch's last-bit differences, which q8's rounding of the activations amplifies, flipped the
    5th token of the first prompt here (QA, 2026-12-05)."""
    prompts = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3, 4,"]
    with LLM("smollm2-135m", packed_kernel=kernel, threads=1) as llm:
        batch = [out.token_ids for out in llm.generate(prompts, GREEDY)]
        alone = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    assert batch == alone


def test_the_layout_says_q8_only_where_it_runs(wide_heads_dir, q4_wide):
    with LLM(str(wide_heads_dir), packed_kernel="q8", max_model_len=64) as random_weights:  # no 4- or 8-bit values
        assert "q8" not in random_weights.layout["target"]  # the float32 panels: the float32 model's bits
    with LLM(str(q4_wide), packed_kernel="q8", max_model_len=64) as q8:
        assert "8-bit activations (q8)" in q8.layout["target"]


def test_a_cpu_without_avx2_is_told_in_one_line(monkeypatch):
    monkeypatch.setattr(native, "q8_available", lambda: False)
    with pytest.raises(InvalidParameterError) as error:
        EngineConfig(packed_kernel="q8")
    assert "--cpu-matmul q8 needs" in str(error.value) and "\n" not in str(error.value)
    EngineConfig(packed_kernel="q8", device="cuda")  # the CPU's kernels are not asked for on CUDA


@pytest.mark.slow  # compiles the tiny model's graphs with inductor
def test_compiled_steps_under_q8_give_its_eager_tokens(q4_wide):
    with LLM(str(q4_wide), packed_kernel="q8", max_model_len=128) as eager:
        want = [out.token_ids for out in eager.generate(PROMPTS, GREEDY)]
    with LLM(str(q4_wide), draft=str(q4_wide), packed_kernel="q8", compile=True, max_model_len=128) as llm:
        assert llm.core.runner.compiled is not None and llm.core.runner.compiled.available
        draft = llm.core.drafter.runner.model  # its int8 weights on the panels, called as an op when compiled
        on_panels = [isinstance(m.packed, panel8.Panel8) for m in packed.bias_free_matmuls(draft)]
        assert all(on_panels) if low_bits.panels_wanted() else not any(on_panels)
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            runs = llm.core.runner.compiled.num_runs
            assert [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS] == want, mode
            assert llm.core.runner.compiled.num_runs > runs, mode


def test_int8_draft_weights_on_the_panels_are_the_int8_rows_products(path):
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(3)) * 0.05
    copy = low_bits.int8_panels(weight)
    assert copy is not None and copy.q8 and low_bits.int8_panels(weight[:, :48]) is None  # 48 inputs: no blocks
    q, scales = low_bits.int8_rows(weight)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    int8_weight = q.float() * scales[:, None]
    assert torch.allclose(copy.matmul(x), F.linear(panel4.q8_activations(x), int8_weight), rtol=1e-4, atol=1e-5)
    error = (copy.matmul(x) - F.linear(x, weight)).norm() / F.linear(x, weight).norm()
    assert 0 < float(error) < 5e-2  # the int8 tolerance of tests/engine/test_low_bits.py


@pytest.mark.parametrize("panels", [True, False])
def test_an_int8_draft_on_the_panels_takes_the_fused_layers_and_keeps_the_output(wide_heads_dir, panels,
                                                                                monkeypatch):
    # "always": on the panels with AVX2's q8 code too (by default there only with AVX-512 VNNI); "0": fbgemm.
    # SSD's draft process, spawned afresh, reads it too
    monkeypatch.setenv(low_bits.PANELS_ENV, "always" if panels else "0")
    with LLM(str(wide_heads_dir), max_model_len=128, threads=1) as alone:
        want = [alone.generate([ids], GREEDY)[0].token_ids for ids in PROMPTS]
    rows = []
    forward = fused.forward
    monkeypatch.setattr(fused, "forward", lambda *args: rows.append(args[0].model) or forward(*args))
    with LLM(str(wide_heads_dir), draft=str(wide_heads_dir), max_model_len=128, threads=1) as llm:
        draft = llm.core.drafter.runner.model
        matmuls = packed.bias_free_matmuls(draft)
        if panels:
            assert all(isinstance(m.packed, panel8.Panel8) and m.packed.q8 and m.low_bits is None for m in matmuls)
        else:
            assert all(m.low_bits is not None for m in matmuls)
        for mode in ("sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            assert [llm.generate([ids], GREEDY)[0].token_ids for ids in PROMPTS] == want, mode
    assert any(model is draft for model in rows) == panels  # the draft's steps took the fused layers
