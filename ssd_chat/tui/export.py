"""A conversation as a Markdown document: the turns (replies as Markdown, prompts as the literal text the chat shows),
then a table of every reply's stats. /export writes it, or plain text to a .txt file (export_text.py)."""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

from ssd_chat.history import Conversation
from ssd_chat.tui.export_links import with_links
from ssd_chat.tui.export_stats import STATS_HEADER, settings_sentence, stats_rows
from ssd_chat.tui.export_text import HEADINGS, to_text

_MARKDOWN = MarkdownIt("gfm-like")  # the transcript's parser (widgets.transcript), so its code blocks
_LINE_BREAK = re.compile(r"\r\n?|\n")  # where markdown-it breaks lines (str.splitlines breaks at \x0c, \u2028 too)
_PROBE = "ssd-chat-fence-probe"
# What CommonMark (and GFM: tables, strikethrough) reads as markup in a line's text: code spans, emphasis, links,
# HTML and autolinks, table cells, strikethrough and fences, an entity, a backslash that escapes or breaks a line
_MARKUP = re.compile(r"[`*_\[\]<|~]|&(?=#?\w+;)|\\(?=[!-/:-@\[-`{-~]|$)")
# ... and at the start of a line: a heading, a quote, a list item, a setext underline ("*" and "_" above)
_LINE_MARKUP = re.compile(r"^(?:[#>+=-]|\d{1,9}(?=[.)]))")
NBSP = "\u00a0"
# What Markdown cannot carry, shown as its Unicode control picture: NUL (a parser reads it as U+FFFD) and the vertical
# tab and the form feed (whitespace a paragraph's start or end loses; a viewer shows none where they stay)
PICTURED = str.maketrans({"\x00": "\u2400", "\x0b": "\u240b", "\x0c": "\u240c"})


def to_markdown(conversation: Conversation, k: int | None = None) -> str:
    """`k`: the k the engine drafts for the chat's (export_stats.settings_sentence), where known."""
    s = conversation.settings
    lines = [f"# {literal(conversation.title)}", ""]  # (a title: the first prompt's first line, as the chat shows it)
    lines += [settings_sentence(s, f"`{s.mode}`", k), ""]
    if s.system:
        lines += ["## System", "", literal(s.system), ""]
    for message in conversation.messages:
        if message.role == "system":
            continue
        text = hard_breaks(closed_fences(message.content)) if message.role == "assistant" else literal(message.content)
        lines += [f"## {HEADINGS.get(message.role, message.role)}", "", text, ""]
    rows = stats_rows(conversation.messages)
    if rows:
        table = [f"| {' | '.join(row)} |" for row in (STATS_HEADER, *rows)]
        lines += ["## Stats", "", table[0], "|---" * len(STATS_HEADER) + "|", *table[1:], ""]
    return "\n".join(lines)


def document(conversation: Conversation, path: Path, k: int | None = None) -> str:
    """What /export writes to `path`: plain text to a .txt file (export_text), else Markdown; `k` as to_markdown's."""
    return to_text(conversation, k) if path.suffix.lower() == ".txt" else to_markdown(conversation, k)


def literal(text: str) -> str:
    """`text` as Markdown that shows it as the chat app shows a prompt, as plain text (widgets.transcript): the ASCII
    punctuation CommonMark would read as markup backslash-escaped (a plain-text viewer shows the backslashes: a .txt
    export, export_text.py, has none), a line's indent in no-break spaces (4 spaces made a code block), a blank line
    one no-break space (a run of them stays), and every line but the last ending in a line break (two spaces). A link
    a GFM-like viewer makes of the text stays as typed (export_links: a backslash in it would show and break it), the
    text after its end escaped. One paragraph, so a line like "## Assistant" is no heading and fakes no turn. A first
    line's first no-break space (or other Unicode space) is an entity, "&nbsp;": markdown-it strips a paragraph's (and
    a heading's) leading whitespace, Unicode's too, before it decodes entities (a word joiner, U+2060, went before it:
    copying the rendered text took it along). NUL, a vertical tab and a form feed show as their control pictures (␀, ␋,
    ␌: PICTURED), which a viewer shows; as such, a prompt's first ones were lost."""
    lines = []
    for line in _LINE_BREAK.split(text.translate(PICTURED)):
        rest = line.lstrip(" \t")
        indent = NBSP * len(line[: len(line) - len(rest)].expandtabs(8))  # (a tab: to the chat's next 8th column)
        head = _LINE_MARKUP.match(rest)  # (escaped, it ends the parser's pending text: a scheme starts after it)
        start = head.end() + head[0].isdigit() if head else 0  # ("1." escapes the ".")
        rest = with_links(rest, lambda part: _MARKUP.sub(lambda m: "\\" + m[0], part), start)  # (links as typed)
        rest = _LINE_MARKUP.sub(lambda m: m[0] + "\\" if m[0][0].isdigit() else "\\" + m[0], rest)
        lines.append(indent + rest if indent + rest else NBSP)
    first = lines[0][0]  # (spaces and tabs are no-break ones by now; control characters are left to the parser)
    if first.isspace() and ord(first) > 0x9F:
        lines[0] = ("&nbsp;" if first == NBSP else f"&#x{ord(first):X};") + lines[0][1:]
    return "  \n".join(lines)


def hard_breaks(text: str) -> str:
    """`text` with two spaces ending each line a paragraph goes on after: other Markdown viewers join such lines
    into one (a soft break), where the chat app shows the reply's lines as written (widgets.transcript)."""
    lines = _LINE_BREAK.split(text)  # (the parser's own line split: map indexes its lines)
    ends = re.findall(_LINE_BREAK, text)
    for token in _MARKDOWN.parse(text):
        if token.type == "paragraph_open" and token.map is not None:
            for i in range(token.map[0], token.map[1] - 1):
                if not lines[i].endswith(("  ", "\\")):  # (a break already)
                    lines[i] += "  "
    return "".join(line + end for line, end in zip(lines, [*ends, ""], strict=True))


def closed_fences(text: str) -> str:
    """`text` with a code fence it left open closed (a reply cut by the length limit inside a code block: the rest
    of the document, headings and the stats table, read as code). The closing fence gets the opening one's indent
    and quote marks: at column 0, one a list item or a quote held would open a new block instead. Open means what
    the parser says: a line in the fence's container after the text still lands in the fence."""
    fences = [t for t in _MARKDOWN.parse(text) if t.type == "fence" and t.map is not None]
    if not fences:
        return text
    fence, body = fences[-1], text.rstrip("\r\n")
    opening = _LINE_BREAK.split(text)[fence.map[0]]  # (the parser's own line split: map indexes its lines)
    prefix = re.sub(r"[^\s>]", " ", opening[: opening.index(fence.markup)])  # "1. ```": "   ```"
    probe = f"{body}\n{prefix}{_PROBE}"
    if not any(t.type == "fence" and _PROBE in t.content for t in _MARKDOWN.parse(probe)):
        return text
    newline = "\r\n" if "\r\n" in text else "\n"  # (the text's own line ends)
    return f"{body}{newline}{prefix}{fence.markup}"


def code_blocks(text: str) -> list[str]:
    """The contents of `text`'s code blocks as the transcript shows them (its parser: fenced with ``` or ~~~, in a
    list item or a quote too, without its indent; indented ones), in order; one a cut reply left open runs to the
    end."""
    return [t.content.rstrip("\n") for t in _MARKDOWN.parse(text) if t.type in ("fence", "code_block")]


def export_path(conversation: Conversation, directory: Path, suffix: str = ".md") -> Path:
    """A file name from the title that does not overwrite an earlier export (`suffix`: .txt for plain text)."""
    stem = re.sub(r"[^a-z0-9]+", "-", conversation.title.lower()).strip("-")[:40] or "chat"
    path = directory / f"{stem}{suffix}"
    n = 2
    while path.exists():
        path = directory / f"{stem}-{n}{suffix}"
        n += 1
    return path
