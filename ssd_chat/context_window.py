"""Which turns of a long conversation the model still sees: the chat app and the plain mode keep every turn, and
send the model the system prompt and the latest turns that fit its context with room for a reply.

Once a conversation outgrows the context, its oldest turns leave the window, down to half the context, so that
the next several turns fit as they are: the window's start moves rarely, and each turn in between reuses the
previous turn's KV from the prefix cache (a move costs one full prefill of what is left).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def window_start(roles: list[str], start: int, prompt_tokens: Callable[[int], int], limit: int,
                 reserve: int) -> int:
    """The index of the first message (of `roles`, the conversation without its system prompt, ending with the
    new user message) the model sees. `start`: the window's start for the previous turn; `prompt_tokens(i)`:
    the prompt's length in tokens for messages i.. (system prompt and chat template included); `limit`: the
    context; `reserve`: tokens kept free for the reply. When even the last user message leaves no room for a reply,
    its index comes back (the reply gets what room there is); when it is as long as the context on its own, the
    engine refuses it, and the window stays where it was (the next prompt still sees the turns before)."""
    last_user = max(i for i, role in enumerate(roles) if role == "user")
    start = min(max(start, 0), last_user)
    if roles[start] != "user":  # the turns were edited since: start at the next prompt
        start = next(i for i in range(start, last_user + 1) if roles[i] == "user")
    if prompt_tokens(start) + reserve <= limit:
        return start
    later = [i for i in range(start + 1, last_user + 1) if roles[i] == "user"]
    sizes: dict[int, int] = {}
    for room in (limit // 2, limit):  # down to half the context where a turn allows it, else as little as fits
        for i in later:
            if sizes.setdefault(i, prompt_tokens(i)) + reserve <= room:
                return i
    alone = sizes[last_user] if last_user in sizes else prompt_tokens(last_user)
    return start if alone >= limit else last_user


def reply_reserve(max_tokens: int, limit: int) -> int:
    """The room kept for a reply: its max tokens, at most a quarter of the context."""
    return min(max_tokens, limit // 4)


def fit(engine: Any, messages: list[dict[str, str]], start: int, max_tokens: int) -> int:
    """window_start for the engine's chat messages (a system prompt first, if any, then the turns; the new prompt
    last), measured with its chat template (`engine.encode_chat`) against its context (`engine.max_model_len`).
    Returns the index, among the turns, of the first one the model sees."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    limit = engine.max_model_len
    return window_start([m["role"] for m in turns], start, lambda i: len(engine.encode_chat(system + turns[i:])),
                        limit, reply_reserve(max_tokens, limit))


def moved_notice(limit: int, start: int) -> str:
    """What the chat app and the plain mode say when the window moves."""
    return (f"the model's context ({limit} tokens) no longer holds the first {start} messages of this chat: "
            "it sees the rest")


def context_cut_notice(limit: int, fix: str, model_max: int | None = None) -> str:
    """What ask, the plain mode (a dim line on stderr, in parentheses) and the chat app (a notification) say under a
    reply the context limit cut, ending with `fix`; `model_max`: the model's own limit, where --max-model-len can
    raise the context to it."""
    more = f"raise --max-model-len (up to {model_max:,}), or " if model_max is not None and model_max > limit else ""
    return f"the reply stopped at the context limit of {limit:,} tokens: {more}{fix}"


def system_prompt_refusal(engine: Any, messages: list[dict[str, str]], fix: str) -> str | None:
    """Why the engine refused `messages` (a system prompt first, the new prompt last) as longer than its context,
    where the system prompt is what does not fit (the engine counts the prompt with it and the turns in view, and
    said "the prompt has 9032 tokens" of a 2-word prompt): one line ending with `fix`, how to change the system
    prompt. None where there is no system prompt, or where the system prompt fits and the new prompt alone does not."""
    if len(messages) < 2 or messages[0]["role"] != "system":
        return None
    limit = engine.max_model_len
    system = len(engine.encode_chat(messages[:1]))
    if system >= limit:  # (whatever the prompt: no prompt fits beside it)
        return f"the system prompt has {system:,} tokens but the context limit is {limit:,}: {fix}"
    prompt = len(engine.encode_chat(messages[-1:]))
    if prompt >= limit:
        return None
    return (f"this prompt ({prompt:,} tokens) and the system prompt ({system:,} tokens) together pass the context "
            f"limit of {limit:,}: shorten the prompt, or {fix}")


def prompt_refusal(engine: Any, messages: list[dict[str, str]], fix: str, refused: str) -> str:
    """Why the engine refused `messages` (a system prompt first, if any; the new prompt last) as longer than its
    context, in what the user can change: the system prompt (system_prompt_refusal, `fix` how to change it), or the
    prompt. The engine's line, `refused`, counts the turns in view too, which leave the view before a prompt is
    refused (window_start), so it said 14842 tokens of an 8,572-token prompt. Where the prompt with the system
    prompt fits (the engine refused something else), `refused` comes back."""
    why = system_prompt_refusal(engine, messages, fix)
    if why is not None:
        return why
    limit = engine.max_model_len
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    counted = len(engine.encode_chat(system + messages[-1:]))
    if counted < limit:
        return refused
    more = re.search(r", or raise --max-model-len \(up to \d+\)", refused)  # (the engine knows the model's limit)
    prompt = len(engine.encode_chat(messages[-1:]))
    size = f"this prompt has {prompt:,} tokens (the chat template's included)"
    if system and counted > prompt:  # (a template's own default system prompt can be longer than the one given)
        size += f" and the system prompt {counted - prompt:,} more, {counted:,} in all,"
    cut = counted - limit + 1
    return (f"{size} but the context limit is {limit:,} even with every earlier turn out of view: shorten "
            f"{'the prompt' if system else 'it'} by {cut:,} token{'' if cut == 1 else 's'} or more, and more for "
            f"room to reply{more[0] if more else ''}")
