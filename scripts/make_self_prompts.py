"""Write ``assets/prompts/distill-self.jsonl``: chat prompts written by the target itself.

An instruct model that is given its chat template up to the start of a user turn (system turn, then
``<|im_start|>user\\n``) writes a plausible user message: the kind of request it was tuned on. Sampling many of
them (temperature 1, top-p 0.9, one seed per prompt) gives prompts far more varied than templates, and in the
target's own distribution. Kept: messages that end with the end-of-turn token, 4-80 words, mostly ASCII, no
chat markers, no subject of the held-out benchmark set (``chat.jsonl``), no repeats. scripts/gpu_distill.py adds
a stricter test of its own prompts: no ``SHINGLE``-word run shared with a held-out prompt (``shares_run``).

Deterministic on a given torch build: ``python scripts/make_self_prompts.py [--target smollm2-135m]``.
About 16 minutes for 2000 prompts on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from make_distill_prompts import HELD_OUT_SUBJECTS, PROMPTS

from engine import LLM, FinishReason, SamplingParams
from ssd_chat.prompts import HELD_OUT_SETS, load_prompts

OUT = PROMPTS / "distill-self.jsonl"
BATCH = 128
MARKER = "\x00USER\x00"
SHINGLE = 5  # words: a self-written prompt sharing a run this long with a held-out prompt is dropped
log = logging.getLogger("make_self_prompts")


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user message starts (with the template's default system turn)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], tokenize=False)
    return tokenizer.encode(text[: text.index(MARKER)])


def keep(text: str) -> bool:
    words = text.split()
    ascii_share = sum(c.isascii() for c in text) / max(len(text), 1)
    lowered = text.lower()
    return (4 <= len(words) <= 80 and ascii_share >= 0.98 and "<|" not in text
            and not any(subject in lowered for subject in HELD_OUT_SUBJECTS))


def held_out_shingles() -> set[tuple[str, ...]]:
    """Every SHINGLE-word run of the held-out benchmark prompts' turns (lower case)."""
    runs = set()
    for path in HELD_OUT_SETS:
        for messages in load_prompts(path):
            for message in messages:
                words = message["content"].lower().split()
                runs.update(tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1))
    return runs


def shares_run(text: str, banned: set[tuple[str, ...]]) -> bool:
    """Whether ``text`` holds one of the ``banned`` SHINGLE-word runs (lower case)."""
    words = text.lower().split()
    return any(tuple(words[i : i + SHINGLE]) in banned for i in range(len(words) - SHINGLE + 1))


def main(target: str, count: int, out: Path) -> None:
    llm = LLM(target=target, max_num_seqs=BATCH)
    prefix = user_turn_prefix(llm.tokenizer)
    kept: dict[str, None] = {}  # insertion-ordered: the prompts in the order sampled, each once
    seed = 0
    try:
        while len(kept) < count:
            params = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=96, seed=seed + i) for i in range(BATCH)]
            seed += BATCH
            for output in llm.generate([prefix] * BATCH, params):
                text = output.text.strip()
                if output.finish_reason == FinishReason.STOP and keep(text):
                    kept.setdefault(text)
            log.info("%d prompts kept of %d sampled", len(kept), seed)
    finally:
        llm.close()
    out.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in list(kept)[:count]), encoding="utf-8")
    log.info("wrote %d prompts to %s", min(len(kept), count), out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    main(args.target, args.count, args.out)
