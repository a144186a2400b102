"""A conversation as a Markdown document: the turns, then a table of every reply's stats."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ssd_chat.history import ChatMessage, Conversation, TurnStats

_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")  # CommonMark's fenced code block markers


def to_markdown(conversation: Conversation) -> str:
    s = conversation.settings
    lines = [f"# {conversation.title}", ""]
    lines.append(f"Mode `{s.mode}`, k {s.k}, temperature {s.temperature:g}, max tokens {s.max_tokens}.")
    lines.append("")
    if s.system:
        lines += ["## System", "", s.system, ""]
    for message in conversation.messages:
        if message.role == "system":
            continue
        lines += [f"## {_HEADINGS.get(message.role, message.role)}", "", closed_fences(message.content), ""]
    replies = [m for m in conversation.messages if m.role == "assistant" and m.stats is not None]
    if replies:
        lines += ["## Stats", "", *_stats_table(replies), ""]
    return "\n".join(lines)


def closed_fences(text: str) -> str:
    """`text` with a code fence it left open closed (a reply cut by the length limit inside a code block: the rest
    of the document, headings and the stats table, read as code)."""
    blocks = list(_fenced_blocks(text.splitlines()))
    if not blocks or blocks[-1][1] is not None:
        return text
    return text.rstrip("\n") + "\n" + blocks[-1][2]


def code_blocks(text: str) -> list[str]:
    """The contents of `text`'s fenced code blocks, in order (one a cut reply left open runs to the end)."""
    lines = text.splitlines()
    return ["\n".join(lines[start + 1 : len(lines) if end is None else end]) for start, end, _ in _fenced_blocks(lines)]


def _fenced_blocks(lines: list[str]) -> Iterator[tuple[int, int | None, str]]:
    """Each fenced code block's opening line, closing line (None: left open) and opening marker (e.g. "```")."""
    start, fence = 0, None
    for i, line in enumerate(lines):
        found = _FENCE.match(line)
        if found is None:
            continue
        marker = found.group(1)
        if fence is None:
            start, fence = i, marker
        elif marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip()[len(marker):].strip():
            yield start, i, fence
            fence = None
    if fence is not None:
        yield start, None, fence


def _stats_table(replies: list[ChatMessage]) -> list[str]:
    rows = [
        "| turn | mode | tokens | decode tok/s | TTFT ms | tau | acceptance | cache hits | prefix reused | finish |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, message in enumerate(replies, start=1):
        st: TurnStats = message.stats  # type: ignore[assignment]
        rows.append(
            f"| {i} | {st.mode} | {st.generated_tokens} | {st.decode_tok_s:.1f} | {1000 * st.ttft_s:.0f} | "
            f"{_opt(st.tau, '{:.2f}')} | {_opt(st.acceptance_rate, '{:.0%}')} | {_opt(st.cache_hit_rate, '{:.0%}')} | "
            f"{st.reused_prefix_tokens}/{st.prompt_tokens} | {st.finish_reason} |"
        )
    return rows


def _opt(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def export_path(conversation: Conversation, directory: Path) -> Path:
    """A file name from the title that does not overwrite an earlier export."""
    stem = re.sub(r"[^a-z0-9]+", "-", conversation.title.lower()).strip("-")[:40] or "chat"
    path = directory / f"{stem}.md"
    n = 2
    while path.exists():
        path = directory / f"{stem}-{n}.md"
        n += 1
    return path
