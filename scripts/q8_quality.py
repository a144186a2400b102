"""How far --cpu-matmul q8 (8-bit activations) moves a target from its float32 self, on a prompt set.

    python scripts/q8_quality.py [--target smollm2-135m] [--prompts assets/prompts/chat.jsonl] [--max-tokens 256]

The float32 target (the default kernels) answers each prompt greedily (to its end of turn or --max-tokens); then
both engines score that whole text (32 rows a step, so q8's kernel takes every row on any CPU), and the script
prints, over the reply positions: how often q8's top token is the float32 target's (teacher-forced agreement),
the mean KL(float32 || q8) of the next-token distributions, and per prompt the first reply token where q8's own
greedy reply parts from the float32 one.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from engine.attention.base import SeqSpan
from ssd_chat.prompts import DEFAULT_PROMPTS, encode_prompts, load_prompts

CHUNK = 32  # rows a step: the packed kernels take up to 32 on every CPU (beyond, Intel runs MKL's float32 GEMM)


def score(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The logits [len(ids), vocab] of a whole sequence (nothing cached before), CHUNK rows a step."""
    logits = []
    for start in range(0, len(ids), CHUNK):
        rows = min(CHUNK, len(ids) - start)
        span = SeqSpan(0, rows, slice(0, start + rows), start + rows)
        logits.append(llm.core.runner.run_spans(ids[start : start + rows], torch.arange(start, start + rows),
                                                slice(start, start + rows), [span], all_logits=True).float())
    return torch.cat(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    engines = {kernel: LLM(target=args.target, threads=args.threads, packed_kernel=kernel, max_num_seqs=1,
                           enable_prefix_caching=False) for kernel in ("auto", "q8")}
    prompts = encode_prompts(engines["auto"], load_prompts(args.prompts), raw=False)
    agree = total = 0
    kl_sum = 0.0
    parted = []
    for ids in prompts:
        replies = {k: list(llm.generate([ids], greedy)[0].token_ids) for k, llm in engines.items()}
        reference = replies["auto"]
        first = next((i for i, (a, b) in enumerate(zip(reference, replies["q8"], strict=False)) if a != b), None)
        parted.append(first)
        full = ids + reference
        exact, q8 = (score(llm, full)[len(ids) - 1 : len(full) - 1] for llm in engines.values())
        agree += int((exact.argmax(-1) == q8.argmax(-1)).sum())
        total += len(reference)
        p = exact.log_softmax(-1)
        kl_sum += float((p.exp() * (p - q8.log_softmax(-1))).sum())
    for llm in engines.values():
        llm.close()
    same = sum(f is None for f in parted)
    print(f"{args.target}, {len(prompts)} prompts of {args.prompts.name}, {total} reply tokens (float32 greedy)")
    print(f"teacher-forced top-1 agreement of q8 with float32: {agree / total:.4f} ({total - agree} tokens differ)")
    print(f"mean KL(float32 || q8) per token: {kl_sum / total:.2e} nats")
    print(f"greedy replies identical: {same} of {len(prompts)}; first differing reply token elsewhere: "
          f"{sorted(f for f in parted if f is not None)}")


if __name__ == "__main__":
    main()
