"""8-bit panels (engine.layers.panel8): weights of the Q8_0 form (d * q per 32 inputs) compress to the bit, the
kernel's outputs are the float32 panel kernel's bits for any row and thread count, other weights keep their
float32 panels, and an engine whose embedding and head are 8-bit values (as SmolLM2-135M's are) decodes with
--cpu-matmul panel4 exactly what the panel engine does, reading 1.125 bytes a head weight instead of 4."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.config import SpeculationConfig
from engine.layers import packed, panel, panel4, panel8
from engine.layers.unread import Released
from tests.engine.test_panel4 import GREEDY, PROMPTS, assert_float32_panel_bits, q4_form, rewritten

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")


def q8_form(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] rounded to the Q8_0 form gguf dequantises to: per 32 inputs a float16 d = max |w| / 127,
    q = round(w / d) in -127..127, w' = d * q in float32 (q an integer: a zero is +0.0, as gguf's)."""
    n, k = weight.shape
    w = weight.reshape(n, k // 32, 32)
    d = (w.abs().amax(-1, keepdim=True) / 127).half().float()
    return (d * (w / d).round().clamp(-127, 127) + 0.0).reshape(n, k)


@pytest.mark.parametrize(("n", "k"), [(384, 64), (576, 1536), (64, 32)])
def test_q8_weights_compress_and_give_the_float32_panels_bits(n, k):
    generator = torch.Generator().manual_seed(n + k)
    weight = q8_form(torch.randn(n, k, generator=generator))
    eight = panel8.compress(weight)
    assert eight is not None and eight.q.dtype == torch.int8 and eight.nbytes == n * k * 9 // 8
    assert_float32_panel_bits(eight, weight, generator)


def test_other_weights_keep_float32_panels():
    assert panel8.compress(torch.randn(64, 64)) is None  # not 8-bit values
    assert panel8.compress(q8_form(torch.randn(40, 64))) is None  # 40 columns: not whole panels
    nearly = q8_form(torch.randn(64, 64))
    nearly[7, 2] = torch.nextafter(nearly[7, 2], torch.tensor(10.0))  # one weight one float32 step off
    assert panel8.compress(nearly) is None
    assert isinstance(packed.pack(q8_form(torch.randn(64, 64)), "panel4"), panel8.Panel8)
    assert isinstance(packed.pack(q4_form(torch.randn(64, 64)), "panel4"), panel4.Panel4)  # 4 bits where they fit
    assert isinstance(packed.pack(nearly, "panel4"), torch.Tensor)


def test_a_wide_copy_is_checked_on_its_first_panels():
    """same_products reads the first CHECKED_PANELS panels of a wider copy (a head's 1536): a bad one there is
    refused, in either low-bit kind or the float32 panels; past them it is not read (the start-up cost it saves)."""
    generator = torch.Generator().manual_seed(5)
    width = (packed.CHECKED_PANELS + 4) * panel.WIDTH
    for form, kind in ((q8_form, panel8.Panel8), (q4_form, panel4.Panel4), (None, torch.Tensor)):
        weight = torch.randn(width, 64, generator=generator)
        weight = form(weight) if form else weight
        copy = packed.pack(weight, "panel4")
        assert isinstance(copy, kind) and packed.same_products(weight, copy, "panel4")
        inside, outside = weight.clone(), weight.clone()
        inside[5, 3] += 1.0  # in panel 0
        outside[-5, 3] += 1.0  # in the last panel
        assert not packed.same_products(inside, copy, "panel4")
        assert packed.same_products(outside, copy, "panel4")


@pytest.fixture(scope="module")
def low_bit_model(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with its layers in the Q4_1 form and its embedding and head in the Q8_0 form."""
    return rewritten(tiny_llama_dir, tmp_path_factory.mktemp("q8"),
                     lambda name, w: q4_form(w) if "proj" in name else q8_form(w))  # else: embed_tokens, lm_head


def _low_bit(llm: LLM, kind: type) -> list:
    return [m for m in packed.bias_free_matmuls(llm.core.runner.model) if isinstance(getattr(m, "packed", None), kind)]


def test_an_engine_with_an_8bit_head_decodes_what_the_panel_engine_does(low_bit_model, tiny_llama_dir):
    outputs, read = {}, {}
    for kernel in ("panel", "panel4"):
        llm = LLM(str(low_bit_model), draft=str(tiny_llama_dir), packed_kernel=kernel, threads=1)
        read[kernel] = llm.weight_bytes
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            outputs[kernel, mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        llm.close()
    assert all(out == outputs["panel", "ar"] for out in outputs.values())
    heads = _low_bit(llm, panel8.Panel8)
    assert [type(m).__name__ for m in heads] == ["ParallelLMHead"]
    four, eight = (sum(m.weight.numel() for m in _low_bit(llm, kind)) for kind in packed.LOW_BIT)
    assert read["panel"] - read["panel4"] == four * 4 - four * 3 // 4 + eight * 4 - eight * 9 // 8


@pytest.mark.slow  # compiles the tiny model's graphs with inductor
def test_compiled_steps_on_an_8bit_head_keep_greedy_ar(low_bit_model, tiny_llama_dir):
    with LLM(str(low_bit_model), packed_kernel="panel") as eager:
        want = [out.token_ids for out in eager.generate(PROMPTS, GREEDY)]
    with LLM(str(low_bit_model), draft=str(tiny_llama_dir), packed_kernel="panel4", compile=True,
             block_size=4) as llm:
        assert llm.core.runner.compiled is not None and _low_bit(llm, panel8.Panel8)
        # a compiled step's panel op takes the weights: none released
        assert not any(isinstance(getattr(m, "weight", None), Released) for m in llm.core.runner.model.modules())
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            runs = llm.core.runner.compiled.num_runs
            assert [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS] == want, mode
            assert llm.core.runner.compiled.num_runs > runs, mode
