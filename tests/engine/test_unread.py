"""Float32 weights that no step reads are released at load (engine.layers.unread): the target's layers and untied
head on low-bit panels, the draft's fewer-bit matmuls; a tied head stays (the embedding's lookups read it), as does
every weight under --compile; a released weight keeps its shape and raises on any other use."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM
from engine.config import SpeculationConfig
from engine.layers import packed, panel
from engine.layers.embedding import VocabParallelEmbedding
from engine.layers.unread import Released, release_unread, unread
from tests.engine.test_panel4 import GREEDY, PROMPTS
from tests.engine.test_panel8 import low_bit_model  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not panel.available(), reason="needs AVX-512 or AVX2 and a C++ compiler")


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


def test_the_low_bit_target_and_the_int8_draft_release_their_float32_weights(low_bit_model, tiny_llama_dir):  # noqa: F811
    with LLM(str(low_bit_model), draft=str(tiny_llama_dir), packed_kernel="panel4", threads=1) as llm:
        target = llm.core.runner.model
        matmuls = packed.bias_free_matmuls(target)
        assert all(unread(m) for m in matmuls)  # every layer and the untied head on low-bit panels
        assert sorted(_released(target)) == sorted(n for n, m in target.named_modules() if m in matmuls)
        assert not isinstance(target.model.embed_tokens.weight, Released)  # the lookups read it
        draft = llm.core.drafter.runner.model
        assert _released(draft) and all(isinstance(m.weight, Released) for m in packed.bias_free_matmuls(draft)
                                         if type(m) is not VocabParallelEmbedding and unread(m))
        got = {}
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3, adaptive_k=False)
            got[mode] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    with LLM(str(low_bit_model), packed_kernel="panel", threads=1) as whole:  # float32 panels: nothing released
        assert _released(whole.core.runner.model) == []
        want = [o.token_ids for o in whole.generate(PROMPTS, GREEDY)]
    assert got["ar"] == got["sd"] == want


def test_a_tied_head_stays_and_a_model_without_low_bit_copies_keeps_everything(tiny_qwen3_dir, tiny_llama_dir):
    with LLM(str(tiny_qwen3_dir), threads=1) as llm:  # random float32 weights: float32 panels, read by the steps
        model = llm.core.runner.model
        assert _released(model) == [] and release_unread(model) == 0
        head = model.lm_head
        head.packed, head.packed_min_rows, head.packed_rows = object(), 1, packed.EVERY_STEP  # as if low-bit
        head.low_bits = True  # any fewer-bit product
        assert unread(head) and release_unread(model) == 0  # tied to the embedding: kept
