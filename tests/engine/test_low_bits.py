"""The draft's fewer-bit weights (engine.layers.low_bits): close products, only on the draft, never a changed
token, and a clear error for an unknown kind. Here on fbgemm (SSD_CHAT_DRAFT_PANELS=0); tests/engine/test_q8.py
has int8 drafts on the panel kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig, SpeculationConfig
from engine.errors import InvalidParameterError
from engine.layers import low_bits
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear

pytestmark = pytest.mark.skipif(not low_bits.available(), reason="torch built without fbgemm")

PROMPTS = [[1, 5, 9, 12], [3, 3, 7], list(range(2, 40))]


@pytest.fixture(autouse=True)
def on_fbgemm(monkeypatch):
    monkeypatch.setenv(low_bits.PANELS_ENV, "0")  # SSD's draft process, spawned afresh, reads it
TOLERANCE = {"float16": 2e-3, "int8": 5e-2}  # relative error of a product


def _layers() -> torch.nn.ModuleList:
    generator = torch.Generator().manual_seed(0)
    up, down, biased = ColumnParallelLinear(64, 96), RowParallelLinear(96, 64), ColumnParallelLinear(64, 8, bias=True)
    for layer in (up, down, biased):
        layer.weight.data = torch.randn(layer.weight.shape, generator=generator) * 0.05
    biased.bias.data.zero_()
    return torch.nn.ModuleList([up, down, biased])


@pytest.mark.parametrize("kind", ["float16", "int8"])
def test_products_are_close_to_float32_and_biased_layers_stay(kind):
    layers = _layers()
    assert low_bits.quantize_weights(layers, kind) == 2
    up, down, biased = layers
    assert biased.low_bits is None and up.low_bits is not None and down.low_bits is not None
    for rows in (1, 5, 40):
        x = torch.randn(rows, 64)
        want = F.linear(x, up.weight)
        got = up(x)
        assert got.shape == want.shape
        error = ((got - want).norm() / want.norm()).item()
        assert 0 < error < TOLERANCE[kind], (rows, error)  # close, and not the float32 product itself
    x3 = torch.randn(2, 3, 96)  # [B, T, K] inputs keep their leading shape
    assert down(x3).shape == (2, 3, 64)


def test_int8_weights_stored_as_rows_and_scales_run_the_same_int8_product(tmp_path):
    """A draft saved in int8 (engine.layers.low_bits.int8_rows: q and row scales) and loaded as q * scale gets
    the very q back when the engine quantizes it, so it computes the products it was saved with."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from engine.loader import read_tensor

    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    q, scales = low_bits.int8_rows(weight)
    assert q.dtype == torch.int8 and int(q.abs().amax(dim=1).min()) == 127  # every row reaches +-127
    save_file({"w": q, "w_scale": scales}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        loaded = read_tensor(f, "w")
    assert loaded.dtype == torch.float32 and torch.equal(low_bits.int8_rows(loaded)[0], q)
    x = torch.randn(5, 64)
    assert torch.equal(low_bits._int8(loaded)(x), low_bits._int8(weight)(x))


def test_float32_and_an_unknown_kind():
    layers = _layers()
    assert low_bits.quantize_weights(layers, "float32") == 0
    assert all(layer.low_bits is None for layer in layers)
    with pytest.raises(ValueError, match="draft weights"):
        low_bits.quantize_weights(layers, "int4")
    with pytest.raises(InvalidParameterError, match="draft weights must be one of"):
        EngineConfig(draft_weights="int4")
    assert EngineConfig(draft="d", draft_weights="float16").fast_path.draft_weights == "float16"  # to a draft process


@pytest.mark.parametrize("kind", ["float16", "int8"])
def test_only_the_draft_gets_them_and_greedy_output_stays_exact(kind, tiny_llama_dir):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(target=str(tiny_llama_dir), draft=str(tiny_llama_dir), draft_weights=kind) as llm:
        target, draft = llm.core.runner.model, llm.core.drafter.runner.model
        assert not any(getattr(m, "low_bits", None) is not None for m in target.modules())
        assert sum(getattr(m, "low_bits", None) is not None for m in draft.modules()) > 0
        assert not any(getattr(m, "packed", None) is not None for m in draft.modules())  # no unused copies
        head, calls = draft.lm_head, [0]
        product = head.low_bits

        def counted(x):
            calls[0] += 1
            return product(x)

        head.low_bits = counted
        outputs = {}
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            calls[0] = 0
            outputs[mode] = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
            assert (calls[0] > 0) == (mode != "ar"), mode  # the draft ran on its fewer-bit weights
    assert outputs["sd"] == outputs["ar"] and outputs["ssd"] == outputs["ar"]


@pytest.mark.slow  # compiles the tiny model's graphs with inductor
def test_compiled_draft_steps_run_the_fewer_bit_product_and_keep_greedy_ar(tiny_llama_dir):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(target=str(tiny_llama_dir)) as eager:
        want = [out.token_ids for out in eager.generate(PROMPTS, greedy)]
    with LLM(target=str(tiny_llama_dir), draft=str(tiny_llama_dir), draft_weights="int8", compile=True) as llm:
        draft = llm.core.drafter.runner
        assert draft.compiled is not None and draft.compiled.available
        layer = next(m for m in draft.model.modules() if isinstance(m, RowParallelLinear))  # in the compiled forward
        assert isinstance(layer.low_bits, low_bits.LowBits)
        calls, product = [0], layer.low_bits.product

        def counted(x):
            calls[0] += 1
            return product(x)

        layer.low_bits.product = counted  # the op looks the product up when it runs, so this counts compiled calls
        for mode in ("sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            runs, calls[0] = draft.compiled.num_runs, 0
            got = [llm.generate([p], greedy)[0].token_ids for p in PROMPTS]
            runs = draft.compiled.num_runs - runs
            assert got == want, mode
            assert runs > 5 and calls[0] >= runs, (mode, runs, calls[0])  # every compiled draft step used int8
    x = torch.randn(3, 64)
    weight = RowParallelLinear(64, 32).weight.data.normal_()
    product = low_bits.LowBits(low_bits._int8(weight), 32)
    assert torch.equal(low_bits.linear_op(x, product.key, 32), product(x))


@pytest.mark.parametrize(("choice", "support", "avx512", "halves", "wanted"), [
    (None, 2, True, False, True),     # AVX-512 VNNI: the panels
    (None, 1, False, False, True),    # AVX2 on full-width units (Zen 3, Intel clients): the panels, measured faster
    (None, 1, False, True, False),    # AVX2 in 128-bit halves (Zen 1): fbgemm, measured faster
    (None, 1, True, False, False),    # AVX-512 without VNNI and VBMI (Skylake): fbgemm, as before (not measured)
    (None, 0, False, False, False),   # no q8 code (ARM, no compiler): fbgemm
    ("always", 1, True, True, True),
    ("always", 0, False, False, False),
    ("0", 2, True, False, False),
])
def test_panels_wanted_by_the_cpu_and_the_switch(monkeypatch, choice, support, avx512, halves, wanted):
    if choice is None:
        monkeypatch.delenv(low_bits.PANELS_ENV, raising=False)
    else:
        monkeypatch.setenv(low_bits.PANELS_ENV, choice)
    monkeypatch.setattr(low_bits.native, "q8_support", lambda: support)
    monkeypatch.setattr(low_bits.cpu_info, "halves_256_bit", lambda: halves)
    monkeypatch.setattr(low_bits.native, "cpu_isas", lambda: ["avx512", "avx2"] if avx512 else ["avx2"])
    assert low_bits.panels_wanted() is wanted
