"""4-bit panels (engine.layers.panel4): weights of the Q4_1 form (d * q + m per 32 inputs) compress to the bit,
the kernel's outputs are the float32 panel kernel's bits for any row and thread count, other weights keep their
float32 panels, and an engine with --cpu-matmul panel4 decodes exactly what the panel engine does."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig
from engine.layers import native, packed, panel, panel4

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")


def q4_form(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] rounded to the Q4_1 form gguf dequantises to: per 32 inputs d and m float16 values,
    q = round((w - m) / d) in 0..15, w' = d * q + m in float32."""
    n, k = weight.shape
    w = weight.reshape(n, k // 32, 32)
    m = w.amin(-1, keepdim=True).half().float()
    d = ((w.amax(-1, keepdim=True) - m) / 15).half().float()
    q = ((w - m) / d).round().clamp(0, 15)
    return (d * q + m).reshape(n, k)


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (64, 32)])
def test_q4_weights_compress_and_give_the_float32_panels_bits(n, k):
    generator = torch.Generator().manual_seed(n + k)
    weight = q4_form(torch.randn(n, k, generator=generator) * 0.05).t().contiguous().t()  # K-major, as stored
    four = panel4.compress(weight)
    assert four is not None and four.q.numel() == n * k // 2
    assert_float32_panel_bits(four, weight, generator)


def assert_float32_panel_bits(low_bit, weight: torch.Tensor, generator: torch.Generator) -> None:
    """A low-bit copy's products are the float32 panels' bits for 1-40 rows on 1 and 2 threads, its weights rebuilt
    in every pass of rows, once a panel (panel_gemm.cpp's low_bit_rebuild_rows) or as this CPU's build chooses."""
    panels = panel.to_panels(weight)
    lib = native.library()
    try:
        for rebuild_from in (1 << 40, 1, 0):  # never, from one row on, the build's choice (0)
            lib.low_bit_rebuild_rows(rebuild_from)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 40):  # (every pass kernel; AVX2's rebuild at 11)
                    x = torch.randn(rows, weight.shape[1], generator=generator)
                    got = low_bit.matmul(x)
                    assert torch.equal(got, panel.matmul(x, panels, weight.shape[0])), (rebuild_from, threads, rows)
    finally:
        torch.set_num_threads(1)
        lib.low_bit_rebuild_rows(0)


def test_other_weights_keep_float32_panels():
    weight = torch.randn(64, 64)
    assert panel4.compress(weight) is None  # not 4-bit values
    assert panel4.compress(q4_form(torch.randn(40, 64))) is None  # 40 columns: not whole panels
    nearly = q4_form(torch.randn(64, 64))
    nearly[3, 5] = torch.nextafter(nearly[3, 5], torch.tensor(10.0))  # one weight one float32 step off
    assert panel4.compress(nearly) is None
    assert isinstance(packed.pack(weight, "panel4"), torch.Tensor)  # panel's float32 copy
    assert isinstance(packed.pack(q4_form(torch.randn(64, 64)), "panel4"), panel4.Panel4)


PROMPTS = [[1, 5, 9, 12], list(range(2, 40))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def rewritten(tiny_dir: Path, out: Path, form: Callable[[str, torch.Tensor], torch.Tensor | None]) -> Path:
    """A copy of the tiny model at out/model with form(name, tensor) in place of each 2-D tensor it rewrites
    (None: kept)."""
    model = out / "model"
    shutil.copytree(tiny_dir, model)
    assert json.loads((model / "config.json").read_text())["hidden_size"] % 32 == 0  # whole 32-input blocks
    state = load_file(str(model / "model.safetensors"))
    for name, tensor in state.items():
        new = form(name, tensor.float()) if tensor.dim() == 2 else None
        state[name] = tensor if new is None else new
    save_file(state, str(model / "model.safetensors"))
    return model


@pytest.fixture(scope="module")
def q4_model(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with its layers' weights in the Q4_1 form (as SmolLM2-135M's are)."""
    return rewritten(tiny_llama_dir, tmp_path_factory.mktemp("q4"),
                     lambda name, w: q4_form(w) if "proj" in name and w.shape[1] % 32 == 0 else None)


def _four_bit_modules(llm: LLM) -> list:
    return [m for m in packed.bias_free_matmuls(llm.core.runner.model)
            if isinstance(getattr(m, "packed", None), panel4.Panel4)]


def test_an_engine_on_4bit_panels_decodes_what_the_panel_engine_does(q4_model, tiny_llama_dir):
    model, params, prompts = q4_model, GREEDY, PROMPTS
    outputs, read = {}, {}
    for kernel in ("panel", "panel4"):
        llm = LLM(str(model), draft=str(tiny_llama_dir), packed_kernel=kernel, threads=1)
        assert (len(_four_bit_modules(llm)) > 0) == (kernel == "panel4")
        read[kernel] = llm.weight_bytes  # the bench's bandwidth bound: the bytes a step reads
        for mode in ("ar", "sd", "ssd"):
            llm.speculation = SpeculationConfig(mode=mode, k=4, adaptive_k=False)
            outputs[kernel, mode] = [o.token_ids for o in llm.generate(prompts, params)]
        llm.close()
    assert all(out == outputs["panel", "ar"] for out in outputs.values())
    four_bit = sum(m.weight.numel() for m in _four_bit_modules(llm))
    assert read["panel"] - read["panel4"] == four_bit * 4 - four_bit * 3 // 4  # 0.75 bytes a weight, not 4


@pytest.mark.slow  # compiles the tiny model's graphs with inductor
def test_compiled_steps_on_4bit_panels_keep_greedy_ar(q4_model, tiny_llama_dir):
    with LLM(str(q4_model), packed_kernel="panel") as eager:
        want = [out.token_ids for out in eager.generate(PROMPTS, GREEDY)]
    with LLM(str(q4_model), draft=str(tiny_llama_dir), packed_kernel="panel4", compile=True, block_size=4) as llm:
        assert llm.core.runner.compiled is not None and llm.core.runner.compiled.available
        assert _four_bit_modules(llm)
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            runs = llm.core.runner.compiled.num_runs
            assert [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS] == want, mode
            assert llm.core.runner.compiled.num_runs > runs, mode
