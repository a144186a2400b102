"""The real SmolLM2-135M-Instruct: greedy output token-identical to transformers' generate."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU cache is.",
]


@pytest.mark.slow
def test_greedy_matches_transformers_on_smollm2():
    llm = LLM("smollm2-135m", max_model_len=512)
    ref = AutoModelForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for prompt in PROMPTS:
        ids = llm.encode_chat([{"role": "user", "content": prompt}])
        ours = llm.generate([ids], params)[0]
        # An explicit attention mask: pad == eos == <|im_end|> here, and generate() would otherwise mask
        # every <|im_end|> of the chat prompt as padding.
        x = torch.tensor([ids])
        theirs = ref.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=32,
                              eos_token_id=None)
        assert ours.token_ids == theirs[0, len(ids) :].tolist(), prompt
    answer = llm.generate([llm.encode_chat([{"role": "user", "content": PROMPTS[0]}])],
                          SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert "Paris" in answer.text
