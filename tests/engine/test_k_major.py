"""K-major matmul weights (the CPU default, engine.layers.linear.to_k_major) change the layout, not the model:
greedy AR and SD outputs equal those of the weights as loaded, untied and tied."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.config import SpeculationConfig

PROMPTS = [[1, 5, 9, 12], [3, 3, 7], list(range(2, 40))]


def _runs(model_dir, *, k_major: bool) -> tuple[dict[str, list[list[int]]], dict[str, tuple[int, ...]]]:
    llm = LLM(target=str(model_dir), draft=str(model_dir), k_major_weights=k_major)
    try:
        model = llm.core.runner.model
        strides = {name: tuple(p.stride()) for name, p in model.named_parameters() if p.dim() == 2}
        greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        outputs = {}
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode, k=3)
            outputs[mode] = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
        return outputs, strides
    finally:
        llm.close()


@pytest.mark.parametrize("family", ["llama", "qwen3-tied"])
def test_k_major_weights_give_the_same_tokens(family, tiny_llama_dir, tiny_qwen3_dir):
    model_dir = tiny_llama_dir if family == "llama" else tiny_qwen3_dir
    (plain, plain_strides), (k_major, k_strides) = (_runs(model_dir, k_major=False), _runs(model_dir, k_major=True))
    assert k_major == plain
    assert plain["sd"] == plain["ar"]
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.qkv_proj.weight"):
        assert plain_strides[name][1] == 1 and k_strides[name][0] == 1, name  # [N, K]: (K, 1) -> (1, N)
    head = "lm_head.weight" if "lm_head.weight" in k_strides else "model.embed_tokens.weight"  # tied: shared
    assert k_strides[head][0] == 1
