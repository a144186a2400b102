"""Prompt files (the bench's, distill's): one plain-text prompt per line, or JSON lines with "prompt" or
"messages"; and their token ids, through the chat template or raw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import LLM

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "prompts"
DEFAULT_PROMPTS = PROMPTS_DIR / "chat.jsonl"  # the held-out benchmark set
# A second held-out set of chat tasks outside the training prompts' task families (jokes, menus, role-play, ...),
# written after them: how a draft does on requests unlike most of what it was trained on (a few hand-written
# training prompts are of the same kinds: a joke, a riddle, a tweet, an apology).
UNSEEN_PROMPTS = PROMPTS_DIR / "chat-unseen.jsonl"
HELD_OUT_SETS = (DEFAULT_PROMPTS, UNSEEN_PROMPTS)

Messages = list[dict[str, str]]


class BenchInputError(ValueError):
    """A prompt file or option the bench cannot use; ``str(err)`` is one line with the fix."""


def load_prompts(path: Path, *, limit: int | None = None) -> list[Messages]:
    """Read a prompt file: one plain-text prompt per line, or JSON objects with "prompt" or "messages"."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BenchInputError(f"cannot read prompt file {path}: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise BenchInputError(f"prompt file {path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from err
    prompts = [_parse_line(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise BenchInputError(f"prompt file {path} holds no prompts")
    return prompts[:limit]


def _parse_line(line: str, where: str) -> Messages:
    if not line.lstrip().startswith("{"):
        return [{"role": "user", "content": line.strip()}]
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise BenchInputError(f"{where}: invalid JSON ({err.msg})") from err
    if isinstance(obj.get("prompt"), str):
        return [{"role": "user", "content": obj["prompt"]}]
    messages = obj.get("messages")
    is_valid = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    )
    if not is_valid:
        raise BenchInputError(f'{where}: needs a "prompt" string or a "messages" list of {{role, content}}')
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def encode_prompts(llm: LLM, prompts: list[Messages], *, raw: bool) -> list[list[int]]:
    """Token ids per prompt: chat template applied, or (raw) the message contents joined by blank lines."""
    if not raw:
        return [llm.encode_chat(messages) for messages in prompts]
    return [llm.tokenizer.encode("\n\n".join(m["content"] for m in messages)) for messages in prompts]
