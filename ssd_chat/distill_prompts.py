"""distill's training prompts, without torch: which are held out for the agreement measure (and their twins), and
the prompt files refused before any reply is written (the CLI checks them before torch loads: 0.7 s, not 3 s)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import InvalidParameterError
from ssd_chat.prompts import HELD_OUT_SETS, load_prompts

if TYPE_CHECKING:
    from ssd_chat.distill_config import DistillConfig
    from ssd_chat.prompts import Messages


def checked_prompts(config: DistillConfig) -> list[Messages]:
    """The prompt file's prompts (--max-prompts of them), refused where they hold a held-out benchmark prompt or
    leave no batch of training prompts beside the held-out ones."""
    prompts = load_prompts(Path(config.prompts_file), limit=config.max_prompts)
    refuse_held_out(prompts, Path(config.prompts_file))
    refuse_a_small_training_set(prompts, config.eval_prompts, config.batch_size)
    return prompts


def held_out_indices(num_prompts: int, num_eval: int) -> list[int]:
    """``num_eval`` evenly spaced prompt indices (independent of the seed, so resumes agree)."""
    num_eval = min(num_eval, num_prompts - 1)
    return [(2 * i + 1) * num_prompts // (2 * num_eval) for i in range(num_eval)] if num_eval > 0 else []


def split(prompts: Sequence[Messages], num_eval: int) -> tuple[list[int], list[int]]:
    """(training, held-out) prompt indices: ``held_out_indices``, and a held-out prompt's twin (the same turns under
    another system prompt, or none) kept out of training too."""
    held = held_out_indices(len(prompts), num_eval)
    held_turns = {conversation_turns(prompts[i]) for i in held}
    training = [i for i, p in enumerate(prompts) if conversation_turns(p) not in held_turns]  # (the held-out too)
    return training, held


def conversation_turns(messages: Messages) -> tuple[tuple[str, str], ...]:
    """A prompt's user and assistant turns, without its system prompt: prompts that differ only there are twins."""
    return tuple((m["role"], m["content"]) for m in messages if m["role"] != "system")


def refuse_held_out(prompts: list, path: Path) -> None:
    """A prompt file that holds a held-out benchmark prompt (a copy of chat.jsonl under another name, say): tau on
    that set would then measure memory, not drafting."""
    train = {conversation_turns(p) for p in prompts}
    for held in HELD_OUT_SETS:
        shared = sum(conversation_turns(p) in train for p in load_prompts(held))
        if shared:
            raise InvalidParameterError(f"{path.name} holds {shared} prompt(s) of the held-out benchmark set "
                                        f"{held.name}: take them out, or train on another prompt file")


def refuse_a_small_training_set(prompts: list, num_eval: int, batch_size: int) -> None:
    """Held-out prompts must leave at least one batch of training prompts (their twins go too: split), said
    before any reply is generated: --eval-prompts 100000 generated replies to all 5,327 prompts (hours) to train on one
    (held_out_indices holds out all but one), and --max-prompts 4 --eval-prompts 10 trained on one reply."""
    def num_training(n: int) -> int:
        return len(split(prompts, n)[0]) if n < len(prompts) else 0

    if num_eval == 0 or (left := num_training(num_eval)) >= batch_size:
        return
    low, high = 0, min(num_eval, len(prompts)) - 1  # the most held out that leaves a batch (fewer: more training)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if num_training(middle) >= batch_size else (low, middle - 1)
    fix = f"hold out at most {low:,}" if low else "hold out none (--eval-prompts 0)"
    raise InvalidParameterError(f"--eval-prompts {num_eval:,} leaves {left:,} of the {len(prompts):,} prompts for "
                                f"training, fewer than one batch (--batch-size {batch_size}): {fix}, or give more "
                                "prompts (--max-prompts, --prompts) or a smaller --batch-size")
