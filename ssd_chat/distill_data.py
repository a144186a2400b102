"""`ssd-chat distill`'s training data: the target's own replies to a prompt set, generated once with our engine.

Each example is a prompt (chat template applied) and the target's reply to it (greedy, or sampled with a seed
drawn from the prompt's ids), as token ids. Replies are appended to a JSONL cache one batch at a time, keyed by
their prompt's ids, so an interrupted run keeps what it generated, a resumed run only generates the rest, and a
prompt file that gained prompts only costs the new ones' replies. The cache's first line records what the replies
depend on (not the prompt file); a cache made with other settings is regenerated, never mixed in.

A fixed, evenly spaced subset of the prompts is held out: the trainer measures greedy agreement on those
and never trains on them.
"""

from __future__ import annotations

import hashlib
import json
import zlib
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
    dtype: str = "float32"  # the target's dtype while it writes them (bfloat16: about 2x faster on an AMX CPU)
    sampler: str = "coupled"  # how sampled replies draw (engine.sampling_params.SAMPLERS; greedy ones: no matter)

    def reply_settings(self) -> dict:
        """What a cached reply depends on: everything but the prompt file (each row names its own prompt), and the
        sampler only where replies sample."""
        return _greedy_without_sampler({k: v for k, v in asdict(self).items() if k != "prompts_sha256"})


@dataclass(frozen=True)
class Example:
    prompt_ids: tuple[int, ...]
    reply_ids: tuple[int, ...]

    @property
    def token_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.reply_ids]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate_examples(
    target: str, prompts: Sequence[Messages], settings: DataSettings, cache: Path, *, threads: int | None,
    progress: Callable[[int, int], None],
) -> list[Example]:
    """The target's reply to every prompt: from ``cache`` where it holds that prompt, the rest generated (shortest
    prompts first, GENERATE_BATCH at a time) and appended."""
    from engine.chat import encode_chat
    from engine.startup import load_tokenizer

    tokenizer = load_tokenizer(Path(target))
    prompt_ids = [tuple(encode_chat(tokenizer, messages, model=target)) for messages in prompts]
    _swap_in(cache, settings)
    replies = _read_cache(cache, settings)
    if not replies:
        cache.write_text(json.dumps(settings.reply_settings()) + "\n", encoding="utf-8")
    # each new prompt once, shortest first: a batch of like lengths decodes as one padded attention call (one long
    # prompt among short ones makes the padding too costly, and each sequence attends on its own)
    todo = sorted(dict.fromkeys(ids for ids in prompt_ids if ids not in replies), key=len)
    progress(len(prompt_ids) - sum(ids not in replies for ids in prompt_ids), len(prompt_ids))
    if todo:
        _generate(target, todo, settings, cache, replies, threads,
                  lambda: progress(sum(ids in replies for ids in prompt_ids), len(prompt_ids)))
    return [Example(ids, replies[ids]) for ids in prompt_ids]


def _generate(target: str, todo: list[tuple[int, ...]], settings: DataSettings, cache: Path,
              replies: dict[tuple[int, ...], tuple[int, ...]], threads: int | None, progress: Callable[[], None],
              ) -> None:
    from engine import LLM, SamplingParams

    model_limit = int(json.loads((Path(target) / "config.json").read_text()).get("max_position_embeddings", 4096))
    max_model_len = min(model_limit, 4096)
    llm = LLM(target=target, threads=threads, max_num_seqs=GENERATE_BATCH, max_model_len=max_model_len,
              kv_cache_tokens=max(KV_CACHE_TOKENS, 2 * max_model_len), dtype=settings.dtype)
    try:
        for start in range(0, len(todo), GENERATE_BATCH):
            batch = todo[start : start + GENERATE_BATCH]
            params = [SamplingParams(temperature=settings.temperature, max_tokens=settings.max_tokens,
                                     seed=None if settings.temperature == 0 else reply_seed(settings.seed, ids),
                                     ignore_eos=settings.ignore_eos, sampler=settings.sampler) for ids in batch]
            outputs = llm.generate([list(ids) for ids in batch], params)
            with cache.open("a", encoding="utf-8") as handle:
                for ids, out in zip(batch, outputs, strict=True):
                    replies[ids] = tuple(out.token_ids)
                    handle.write(json.dumps({"prompt_ids": ids, "reply_ids": replies[ids]}) + "\n")
            progress()
    finally:
        llm.close()


def reply_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """A sampled reply's seed: from the run's seed and the prompt itself, so it does not depend on the prompt's
    place in the file (reproducible when prompts are added or reordered)."""
    return seed * 1_000_003 + zlib.crc32(json.dumps(list(prompt_ids)).encode())


# header fields recorded after caches already existed, with the value an older header's replies were made with
LATER_FIELDS = {"dtype": "float32", "sampler": "rejection"}


def _settings_of(cache: Path) -> dict | None:
    """The reply settings a cache was written with (its header line, as ``reply_settings`` gives them: headers
    written before the cache was keyed by prompt name a prompt file, which does not matter; headers written
    before ``dtype`` was recorded are float32 replies, before ``sampler`` the rejection rule's draws); None for a
    missing or unreadable header."""
    try:
        with cache.open(encoding="utf-8") as handle:
            header = json.loads(handle.readline())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    return _greedy_without_sampler(LATER_FIELDS | {k: v for k, v in header.items() if k != "prompts_sha256"})


def _greedy_without_sampler(settings: dict) -> dict:
    """Greedy replies (temperature 0) do not depend on the sampler: a greedy cache from before it was recorded
    stays valid."""
    return {k: v for k, v in settings.items() if k != "sampler" or settings.get("temperature")}


def _aside(cache: Path, reply_settings: dict) -> Path:
    digest = hashlib.sha256(json.dumps(reply_settings, sort_keys=True).encode()).hexdigest()[:12]
    return cache.with_name(f"{cache.stem}-{digest}{cache.suffix}")


def _swap_in(cache: Path, settings: DataSettings) -> None:
    """Make ``cache`` the file of ``settings``: a cache of other settings moves aside (to a name of its own
    settings) instead of being overwritten, and one of these settings moved aside earlier comes back."""
    wanted, found = settings.reply_settings(), _settings_of(cache)
    if found == wanted:
        return
    if found is not None:
        cache.replace(_aside(cache, found))
    if _aside(cache, wanted).is_file():
        _aside(cache, wanted).replace(cache)


def _read_cache(cache: Path, settings: DataSettings) -> dict[tuple[int, ...], tuple[int, ...]]:
    """prompt ids -> reply ids, from a cache whose header matches ``settings`` (``_settings_of``). A last line that
    an interrupted write left without its newline (whole or cut short) and anything after a line that does not
    parse are dropped from the file (atomically), so the next batch appends after whole lines."""
    if _settings_of(cache) != settings.reply_settings():
        return {}
    text = cache.read_text(encoding="utf-8")
    lines = text.splitlines()
    whole = lines if text.endswith("\n") else lines[:-1] or lines  # (a whole header stays, newline added)
    replies = {}
    for number, line in enumerate(whole[1:], start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            whole = whole[:number]
            break
        replies[tuple(row["prompt_ids"])] = tuple(row["reply_ids"])
    if len(whole) < len(lines) or not text.endswith("\n"):
        tmp = cache.with_suffix(".tmp")
        tmp.write_text("".join(kept + "\n" for kept in whole), encoding="utf-8")
        tmp.replace(cache)  # a crash here leaves the old file, never a truncated one
    return replies


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
