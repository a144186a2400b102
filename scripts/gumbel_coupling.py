"""Offline: how often would the Gumbel coupling accept a draft token, against the rejection rule?

On the engine's AR replies (sampled) to held-out chat prompts, per reply position, with the target's p and the
shipped draft's q (transformers, over the draft's kept tokens, the request's temperature and filters):
- the rejection rule accepts a draft token with probability sum(min(p, q));
- the Gumbel coupling (shared noise g: the target's token argmax(log p + g), the draft's argmax(log q + g))
  keeps it with probability P(argmax(log q + g) == argmax(log p + g)), estimated over NOISE_DRAWS draws of g.
docs/distill-experiments.md ("Gumbel coupling") has the figures.

    python scripts/gumbel_coupling.py [--prompts 8] [--max-tokens 96]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.config import DEFAULT_TARGET
from engine.registry import SHIPPED_DRAFT_DIR, resolve_model
from engine.sampling import probabilities
from ssd_chat.distill_model import load_hf_draft
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts

SETTINGS = ((0.2, 0.9), (0.7, 1.0))  # (temperature, top-p): the chat's default, and its default until 2026-12-06
NOISE_DRAWS = 64


def compare(p: torch.Tensor, q: torch.Tensor, gen: torch.Generator) -> tuple[float, float]:
    """Summed over positions: sum(min(p, q)) and the Gumbel match probability. p, q: [N, V]."""
    rejection = float(torch.minimum(p, q).sum())
    log_p, log_q, match = p.double().log(), q.double().log(), 0.0
    for _ in range(NOISE_DRAWS):
        u = torch.rand(p.shape, generator=gen, dtype=torch.float64).clamp_min(1e-300)
        g = -torch.log(-torch.log(u))  # [N, V] standard Gumbel
        match += float(((log_p + g).argmax(-1) == (log_q + g).argmax(-1)).double().sum()) / NOISE_DRAWS
    return rejection, match


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target_dir = resolve_model(DEFAULT_TARGET)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = load_hf_draft(SHIPPED_DRAFT_DIR, target_dir)
    outside = draft.lm_head.weight.abs().amax(-1) == 0  # [V] tokens the draft's head does not keep
    with LLM(target=DEFAULT_TARGET, max_model_len=1024, threads=2) as llm:
        prompts = [llm.encode_chat(m) for m in load_prompts(DEFAULT_PROMPTS, limit=args.prompts)]
        for temperature, top_p in SETTINGS:
            params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=args.max_tokens, seed=3)
            rejection = match = positions = 0.0
            gen = torch.Generator().manual_seed(0)
            for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
                ids = torch.tensor([prompt + out.token_ids])
                with torch.no_grad():
                    p_logits = target(ids).logits[0, len(prompt) - 1 : -1]  # [N, V]
                    q_logits = draft(ids).logits[0, len(prompt) - 1 : -1].masked_fill(outside, float("-inf"))
                r, m = compare(probabilities(p_logits, params), probabilities(q_logits, params), gen)
                rejection, match, positions = rejection + r, match + m, positions + p_logits.shape[0]
            print(f"temperature {temperature}, top-p {top_p}: {positions:.0f} positions: rejection rule "
                  f"{rejection / positions:.3f}, Gumbel coupling {match / positions:.3f}")


if __name__ == "__main__":
    main()
