"""A conversation as plain text (`/export FILE.txt`), for a viewer that shows a file as it is: every turn as it was
typed or written (a reply's Markdown as the model wrote it, what /copy copies), so no backslash escapes, no line-break
spaces and no no-break spaces, which the Markdown export (export.py) needs; the stats in aligned columns.

Each part starts with its marker alone on a line at the line's start: `System:`, `You:`, `Assistant:`, `Stats:`.
A line of a turn that reads like one (`Assistant:`, in any case, with whitespace around it; a line as
str.splitlines splits them, since some viewers break a line at a form feed or U+2028 too) is written one space in,
so a reader tells them apart: a marker is never indented, and such a line always is. The rule undoes itself: strip
one leading space from each marker-like line that has one to get the text as typed (mbox's `>From ` quoting, for
these lines only).
"""

from __future__ import annotations

import re

from ssd_chat.history import Conversation
from ssd_chat.tui.export_stats import STATS_HEADER, settings_sentence, stats_rows

HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}
MARKERS = (*HEADINGS.values(), "Stats")  # the parts' markers, each as `NAME:` alone on a line
MARKER_LIKE = re.compile(rf"\s*(?:{'|'.join(MARKERS)}):\s*", re.IGNORECASE)  # a turn's line that reads like one


def to_text(conversation: Conversation, k: int | None = None) -> str:
    """`k`: the k the engine drafts for the chat's (export_stats.settings_sentence), where known."""
    s, title = conversation.settings, unmistakable(conversation.title)  # (a first prompt "You:" named the chat)
    lines = [title, "=" * len(title), "", settings_sentence(s, s.mode, k), ""]
    if s.system:
        lines += ["System:", unmistakable(s.system), ""]
    for message in conversation.messages:
        if message.role != "system":
            lines += [f"{HEADINGS.get(message.role, message.role)}:", unmistakable(message.content), ""]
    rows = stats_rows(conversation.messages)
    if rows:
        lines += ["Stats:", *columns([STATS_HEADER, *rows]), ""]
    return "\n".join(lines)


def unmistakable(text: str) -> str:
    """`text` with each line that reads like a part's marker one space in (the module's docstring says why)."""
    return "".join(" " + line if MARKER_LIKE.fullmatch(line) else line for line in text.splitlines(keepends=True))


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """`rows` (the first: the header) in left-aligned columns two spaces apart, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [lines[0], "  ".join("-" * width for width in widths), *lines[1:]]
