"""Float32 weights that no step reads are released at load (engine.layers.unread): the target's layers and head on
low-bit panels, the draft's fewer-bit matmuls, and an embedding of 8-bit values, whose lookups then read the same
bits from an 8-bit copy (the tied head's, or its own); every weight stays under --compile; a released weight keeps
its shape and raises on any other use."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM
from engine.config import SpeculationConfig
from engine.layers import packed, packed_kernels, panel, panel8
from engine.layers.embedding import VocabParallelEmbedding
from engine.layers.unread import Released, release_unread, unread
from tests.engine.test_panel4 import GREEDY, PROMPTS, q4_form, rewritten
from tests.engine.test_panel8 import low_bit_model, q8_form  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")


@pytest.fixture
def off_intel(monkeypatch):
    """Off Intel every step of a low-bit model takes its panels, so its float32 weights go; on Intel a prefill's
    matmuls past 32 rows run MKL's GEMM on them (engine.layers.packed_kernels.max_rows), and they stay."""
    monkeypatch.setattr(packed_kernels, "_cpu_vendor", lambda: "AuthenticAMD")


def _released(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), Released)]


def test_a_released_weight_keeps_its_shape_and_refuses_its_values():
    weight = torch.randn(64, 32)
    gone = Released.like(weight)
    assert gone.shape == (64, 32) and gone.shape[1] == 32 and gone.numel() == 64 * 32
    assert gone.element_size() == 4 and gone.dtype == torch.float32 and gone.dim() == 2
    for read in (lambda: F.linear(torch.randn(2, 32), gone), lambda: gone.data_ptr(), lambda: gone + 1,
                 lambda: gone.t().contiguous(), lambda: gone.device, lambda: gone.float()):
        with pytest.raises(RuntimeError, match="released at load"):
            read()


def test_the_low_bit_target_and_the_int8_draft_release_their_float32_weights(
    low_bit_model, tiny_llama_dir, off_intel  # noqa: F811
):
    with LLM(str(low_bit_model), draft=str(tiny_llama_dir), packed_kernel="panel4", threads=1) as llm:
        target = llm.core.runner.model
        matmuls = packed.bias_free_matmuls(target)
        assert all(unread(m) for m in matmuls)  # every layer and the untied head on low-bit panels
        embed = target.model.embed_tokens  # untied, of 8-bit values: its lookups from a copy of its own
        assert sorted(_released(target)) == sorted(n for n, m in target.named_modules() if m in [*matmuls, embed])
        assert isinstance(embed.rows8, panel8.Panel8) and embed.rows8 is not target.lm_head.packed
        draft = llm.core.drafter.runner.model
        assert _released(draft) and all(isinstance(m.weight, Released) for m in packed.bias_free_matmuls(draft)
                                         if type(m) is not VocabParallelEmbedding and unread(m))
        got = {}
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            got[mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    with LLM(str(low_bit_model), packed_kernel="panel", threads=1) as whole:  # float32 panels, read by the steps
        assert _released(whole.core.runner.model) == ["model.embed_tokens"]  # its lookups still from 8 bits
        want = [o.token_ids for o in whole.generate(PROMPTS, GREEDY)]
    assert got["ar"] == got["sd"] == want


def test_on_intel_the_low_bit_target_keeps_the_weights_its_prefill_reads(low_bit_model, monkeypatch):  # noqa: F811
    monkeypatch.setattr(packed_kernels, "_cpu_vendor", lambda: "GenuineIntel")
    with LLM(str(low_bit_model), packed_kernel="panel4", threads=1) as llm:
        model = llm.core.runner.model
        assert not any(unread(m) for m in packed.bias_free_matmuls(model))  # MKL's GEMM reads them past 32 rows
        assert _released(model) == ["model.embed_tokens"]  # untied, of 8-bit values: its lookups from 8 bits
        assert [len(o.token_ids) for o in llm.generate(PROMPTS, GREEDY)] == [GREEDY.max_tokens] * len(PROMPTS)


def test_an_8bit_copy_gives_the_embeddings_rows_bit_for_bit():
    weight = q8_form(torch.randn(320, 64, generator=torch.Generator().manual_seed(7)))
    copy = panel8.compress(weight)
    ids = torch.tensor([0, 31, 32, 319, 5, 5, 200])
    assert torch.equal(panel8.rows(copy, ids).view(torch.int32), weight[ids].view(torch.int32))
    assert torch.equal(panel8.rows(copy, torch.arange(320)).view(torch.int32), weight.view(torch.int32))


def test_a_tied_8bit_head_gives_the_lookups_and_both_go(tiny_qwen3_dir, tiny_llama_dir, tmp_path, off_intel):
    tied = rewritten(tiny_qwen3_dir, tmp_path, lambda name, w: q4_form(w) if "proj" in name else q8_form(w))
    outputs = {}
    for kernel in ("panel", "panel4"):  # float32 panels (nothing released), then the low-bit copies
        with LLM(str(tied), draft=str(tiny_llama_dir), packed_kernel=kernel, threads=1) as llm:
            model = llm.core.runner.model
            embed, head = model.model.embed_tokens, model.lm_head
            if kernel == "panel4":
                assert embed.rows8 is head.packed and isinstance(head.packed, panel8.Panel8)
                assert isinstance(embed.weight, Released) and embed.weight is head.weight
                assert not [n for n, _ in model.named_parameters() if "embed" in n or "lm_head" in n]
            else:
                assert embed.rows8 is None and _released(model) == []
            for mode in ("ar", "sd"):
                llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
                outputs[kernel, mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert len(set(map(str, outputs.values()))) == 1


def test_a_model_without_8bit_values_keeps_its_weights(tiny_qwen3_dir):
    with LLM(str(tiny_qwen3_dir), threads=1) as llm:  # random float32 weights: float32 panels, read by the steps
        model = llm.core.runner.model
        assert _released(model) == [] and release_unread(model) == 0 and model.model.embed_tokens.rows8 is None


@pytest.mark.slow  # reads SmolLM2-135M's embedding
def test_smollm2s_lookups_from_its_head_copy_are_its_embeddings_bits(off_intel):
    from safetensors import safe_open

    from engine.registry import resolve_model

    path = resolve_model("smollm2-135m")
    with LLM(str(path), threads=1) as llm:
        embed = llm.core.runner.model.model.embed_tokens
        assert isinstance(embed.weight, Released) and embed.rows8 is not None
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            weight = f.get_tensor("model.embed_tokens.weight").float()
        for ids in torch.arange(weight.shape[0]).split(8192):
            assert torch.equal(embed(ids).view(torch.int32), weight[ids].view(torch.int32))


def test_a_tied_draft_on_int8_panels_looks_up_its_own_bits(tiny_qwen3_dir, tmp_path, monkeypatch):
    """A draft's int8 head panels hold its weight rounded per row (engine.layers.low_bits), not the embedding's
    values: the tied embedding's lookups must come from an exact copy of its own, not from the head's."""
    from safetensors import safe_open

    from engine.layers import low_bits, native

    if not native.q8_available():
        pytest.skip("the draft's int8 matmuls run on the panels with q8's code only (x86 with AVX2)")
    monkeypatch.setenv(low_bits.PANELS_ENV, "always")  # AVX2's q8 code too (by default AVX-512 VNNI only)
    tied = rewritten(tiny_qwen3_dir, tmp_path, lambda name, w: q4_form(w) if "proj" in name else q8_form(w))
    with LLM(str(tied), draft=str(tied), packed_kernel="panel4", threads=1) as llm:
        draft = llm.core.drafter.runner.model
        embed, head = draft.model.embed_tokens, draft.lm_head
        assert isinstance(head.packed, panel8.Panel8) and head.packed.q8  # the int8-rounded head
        assert embed.rows8 is not head.packed
        with safe_open(str(tied / "model.safetensors"), "pt") as f:
            weight = f.get_tensor("model.embed_tokens.weight").float()
        ids = torch.arange(weight.shape[0])
        assert torch.equal(embed(ids).view(torch.int32), weight.view(torch.int32))
