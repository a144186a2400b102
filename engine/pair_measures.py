"""What a draft/target pair is like, measured with transformers: parameters stored, and how often the draft's
greedy choice is the target's (``make-pair`` prints both; ``engine.synthetic`` builds the pair)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from engine.errors import InvalidParameterError
from engine.synthetic import PAD_ID, quiet_transformers


def num_params(model_dir: Path) -> int:
    """Parameters stored in a model directory's safetensors files (a tied head counts once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += math.prod(handle.get_slice(name).get_shape())
    return total


def greedy_agreement(target_dir: Path, draft_dir: Path, prompts: Sequence[str], num_tokens: int) -> float:
    """Fraction of positions where the draft's argmax equals the target's, teacher-forced along the
    target's own greedy continuation (``num_tokens`` per prompt, chat template applied) of each prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not prompts or num_tokens < 1:
        raise InvalidParameterError("greedy_agreement needs at least one prompt and num_tokens >= 1")
    with torch.inference_mode():
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        with quiet_transformers():
            target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
            draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        matches = 0
        for prompt in prompts:
            prompt_ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False,
                return_tensors="pt",
            )  # [1, P]
            sequence = target.generate(
                prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                max_new_tokens=num_tokens, min_new_tokens=num_tokens, pad_token_id=PAD_ID,
            )  # [1, P + N]
            continuation = sequence[0, prompt_ids.shape[1]:]  # [N]: the target's greedy tokens
            draft_logits = draft(sequence[:, :-1]).logits[0, prompt_ids.shape[1] - 1:]  # [N, V]
            matches += int((draft_logits.argmax(-1) == continuation).sum())
        return matches / (len(prompts) * num_tokens)
