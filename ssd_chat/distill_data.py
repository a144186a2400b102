"""`ssd-chat distill`'s training data: the target's own replies to a prompt set, generated once with our engine.

Each example is a prompt (chat template applied) and the target's reply to it (greedy, or sampled with a
per-prompt seed), as token ids. Replies are appended to a JSONL cache one batch at a time, so an interrupted
run keeps what it generated and a resumed run only generates the rest. The cache's first line records what
the replies depend on; a cache made with other settings is regenerated, never mixed in.

A fixed, evenly spaced subset of the prompts is held out: the trainer measures greedy agreement on those
and never trains on them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ssd_chat.prompts import Messages

GENERATE_BATCH = 128  # prompts per LLM.generate call, all decoded together (batch 64 ran 1.7x batch 16 here)
KV_CACHE_TOKENS = GENERATE_BATCH * 512  # room for the whole batch's prompts and replies (more waits its turn)


@dataclass(frozen=True)
class DataSettings:
    """Everything the generated replies depend on (recorded in the cache's header line)."""

    target: str          # resolved model directory
    prompts_sha256: str  # of the prompt file's bytes
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool     # past the end of turn to max_tokens (the target goes on with a new chat turn)


@dataclass(frozen=True)
class Example:
    prompt_ids: tuple[int, ...]
    reply_ids: tuple[int, ...]

    @property
    def token_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.reply_ids]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def held_out_indices(num_prompts: int, num_eval: int) -> list[int]:
    """``num_eval`` evenly spaced prompt indices (independent of the seed, so resumes agree)."""
    num_eval = min(num_eval, num_prompts - 1)
    return [(2 * i + 1) * num_prompts // (2 * num_eval) for i in range(num_eval)] if num_eval > 0 else []


def generate_examples(
    target: str, prompts: Sequence[Messages], settings: DataSettings, cache: Path, *, threads: int | None,
    progress: Callable[[int, int], None],
) -> list[Example]:
    """The target's reply to every prompt, from ``cache`` where it holds them; the rest generated and appended."""
    examples = _read_cache(cache, settings)
    progress(len(examples), len(prompts))
    if len(examples) >= len(prompts):
        return examples[: len(prompts)]
    from engine import LLM, SamplingParams

    if not examples:
        cache.write_text(json.dumps(asdict(settings)) + "\n", encoding="utf-8")
    model_limit = int(json.loads((Path(target) / "config.json").read_text()).get("max_position_embeddings", 4096))
    max_model_len = min(model_limit, 4096)
    llm = LLM(target=target, threads=threads, max_num_seqs=GENERATE_BATCH, max_model_len=max_model_len,
              kv_cache_tokens=max(KV_CACHE_TOKENS, 2 * max_model_len))
    try:
        while len(examples) < len(prompts):
            start = len(examples)
            batch = prompts[start : start + GENERATE_BATCH]
            prompt_ids = [llm.encode_chat(messages) for messages in batch]
            # Sampled: one seed per prompt, from its index (each request seeds its own generator): reproducible.
            params = [SamplingParams(temperature=settings.temperature, max_tokens=settings.max_tokens,
                                     seed=None if settings.temperature == 0 else settings.seed * 1_000_003 + start + i,
                                     ignore_eos=settings.ignore_eos) for i in range(len(batch))]
            outputs = llm.generate(prompt_ids, params)
            new = [Example(tuple(ids), tuple(out.token_ids)) for ids, out in zip(prompt_ids, outputs, strict=True)]
            with cache.open("a", encoding="utf-8") as handle:
                for example in new:
                    handle.write(json.dumps({"prompt_ids": example.prompt_ids, "reply_ids": example.reply_ids}) + "\n")
            examples.extend(new)
            progress(len(examples), len(prompts))
    finally:
        llm.close()
    return examples


def _read_cache(cache: Path, settings: DataSettings) -> list[Example]:
    if not cache.is_file():
        return []
    lines = cache.read_text(encoding="utf-8").splitlines()
    try:
        if not lines or json.loads(lines[0]) != asdict(settings):
            return []
        rows = [json.loads(line) for line in lines[1:]]
    except json.JSONDecodeError:  # a line cut short by an interrupted write: regenerate from scratch
        return []
    return [Example(tuple(row["prompt_ids"]), tuple(row["reply_ids"])) for row in rows]


def head_vocab_ids(examples: Sequence[Example], vocab_size: int, head_vocab: int, *, always: Sequence[int] = ()
                   ) -> torch.Tensor:
    """The ``head_vocab`` token ids the draft's head keeps, sorted: ``always`` (the end-of-turn tokens), then
    the most frequent tokens of the replies, ties and unseen tokens by id. 0 keeps the whole vocabulary."""
    if head_vocab == 0 or head_vocab >= vocab_size:
        return torch.arange(vocab_size)
    counts = Counter(t for example in examples for t in example.reply_ids)
    ranked = sorted(range(vocab_size), key=lambda t: (t not in always, -counts.get(t, 0), t))
    return torch.tensor(sorted(ranked[:head_vocab]))


def head_coverage(examples: Sequence[Example], head_ids: torch.Tensor) -> float:
    """Fraction of reply tokens the kept vocabulary contains (the draft can never propose the others)."""
    kept = set(head_ids.tolist())
    total = sum(len(e.reply_ids) for e in examples)
    return sum(t in kept for e in examples for t in e.reply_ids) / max(total, 1)
