"""A conversation as plain text (`/export FILE.txt`), for a viewer that shows a file as it is: every turn as it was
typed or written (a reply's Markdown as the model wrote it, what /copy copies), so no backslash escapes, no line-break
spaces and no no-break spaces, which the Markdown export (export.py) needs; the stats in aligned columns."""

from __future__ import annotations

from ssd_chat.history import Conversation
from ssd_chat.tui.export_stats import STATS_HEADER, settings_sentence, stats_rows

HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}


def to_text(conversation: Conversation, k: int | None = None) -> str:
    """`k`: the k the engine drafts for the chat's (export_stats.settings_sentence), where known."""
    s = conversation.settings
    lines = [conversation.title, "=" * len(conversation.title), "", settings_sentence(s, s.mode, k), ""]
    if s.system:
        lines += ["System:", s.system, ""]
    for message in conversation.messages:
        if message.role != "system":
            lines += [f"{HEADINGS.get(message.role, message.role)}:", message.content, ""]
    rows = stats_rows(conversation.messages)
    if rows:
        lines += ["Stats:", *columns([STATS_HEADER, *rows]), ""]
    return "\n".join(lines)


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """`rows` (the first: the header) in left-aligned columns two spaces apart, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [lines[0], "  ".join("-" * width for width in widths), *lines[1:]]
