"""Left-padded batch decoding with transformers' KV cache, greedy or top-p sampled: how scripts/gpu_distill.py writes
its self-prompts and its replies on a GPU, many rows at a time (the engine decodes one sequence, or a few)."""

from __future__ import annotations

import inspect
import logging

import torch

from engine.sampling import keep_top_k_top_p

log = logging.getLogger("gpu_distill")


@torch.no_grad()
def decode(model, prompts: list[list[int]], max_new: int, *, pad_id: int, stop_id: int | None = None,
           temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """Left-padded batch decoding with transformers' KV cache: greedy (temperature 0) or top-p sampling. Without
    ``stop_id`` every row runs ``max_new`` tokens; with it a row's tokens end at (and include) its first stop."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, W]
    cache = DynamicCache()
    # transformers 5.2x renamed past_key_values to cache (the old name warns, and goes in 5.40); 5.0 knows only it
    given = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **given,
                   use_cache=True, logits_to_keep=1).logits[:, -1]  # [B, V]
    last = positions[:, -1]  # [B]
    out, done = [], torch.zeros(len(prompts), dtype=torch.bool, device=device)
    for step in range(max_new):
        token = _pick(logits.float(), temperature, top_p, generator)  # [B]
        out.append(token)
        if stop_id is not None:
            done |= token == stop_id
            if bool(done.all()):
                break
        if step + 1 == max_new:
            break
        mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
        last = last + 1
        logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=last[:, None], **given,
                       use_cache=True).logits[:, -1]
    rows = torch.stack(out, dim=1).tolist()  # [B, steps]
    if stop_id is not None:
        rows = [row[: row.index(stop_id) + 1] if stop_id in row else row for row in rows]
    return rows


def decode_split(model, prompts: list[list[int]], max_new: int, **kwargs) -> list[list[int]]:
    """``decode``, in halves (recursively) where a batch runs out of device memory."""
    try:
        return decode(model, prompts, max_new, **kwargs)
    except torch.OutOfMemoryError:
        if len(prompts) == 1:
            raise
        torch.cuda.empty_cache()
        log.warning("out of memory at %d rows: halving", len(prompts))
        half = len(prompts) // 2
        return decode_split(model, prompts[:half], max_new, **kwargs) + decode_split(model, prompts[half:], max_new,
                                                                                       **kwargs)


def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] -> [B]: the argmax, or a sample from the top-p nucleus of softmax(logits / temperature) (the
    engine's nucleus, engine.sampling)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = keep_top_k_top_p((logits / temperature).softmax(-1), 0, top_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
