"""How a reply's Markdown is read: one parser (GFM, a single newline a line break) and its top-level blocks."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore


def _line_breaks(state: StateCore) -> None:
    """A reply's single newlines kept as line breaks (a poem, an address, an item a line): CommonMark reads them
    as soft breaks, which render as spaces, and the token-colour view (the plain text) showed other lines.
    Code blocks keep their text as it is; lists, tables and headings end their lines anyway."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type, child.tag = "hardbreak", "br"


@functools.cache
def parser() -> MarkdownIt:
    """One parser for every reply (building one costs more than parsing a streamed block)."""
    markdown = MarkdownIt("gfm-like")
    markdown.core.ruler.push("line_breaks", _line_breaks)
    return markdown


@functools.cache
def block_parser() -> MarkdownIt:
    """`parser()`'s block rules alone: the same blocks, list items, fences and link reference definitions, without
    reading the text inside them (the inline rules), which is half of a parse (a 100-item list: 20 ms of 40)."""
    markdown = MarkdownIt("gfm-like")
    markdown.core.ruler.disable([name for name in markdown.core.ruler.get_active_rules()
                                 if name not in ("normalize", "block")])
    return markdown


# The line separators `str.splitlines` breaks at and the Markdown parser does not (nor Textual's selection): spaces
SEPARATORS = str.maketrans(dict.fromkeys("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", " "))
References = dict[str, dict[str, object]]  # markdown-it's link reference definitions, by label


class Block(NamedTuple):
    """A top-level block of a reply's Markdown."""

    start: int  # where it starts in the text split
    text: str  # its text, without the blank lines after it, its `SEPARATORS` as spaces
    items: tuple[tuple[int, str], ...] = ()  # a list's items: where each starts in `text`, its text (its blank lines
    # after it left out); none for other blocks
    first: int | None = None  # an ordered list's first number


def split_blocks(source: str, references: References | None = None) -> list[Block]:
    """`source` cut into its top-level blocks. A block runs from its first line to the next block's, so a list's or
    a fence's inner blank lines stay in it (and a link reference definition, which makes no block, in the block
    before it); a list's items run so within it. `references` gets the definitions found."""
    source = source.translate(SEPARATORS)  # (the same length: the offsets hold)
    env: dict[str, References] = {}
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    starts: list[int] = []  # each block's first line
    item_starts: dict[int, list[int]] = {}  # a list's items' first lines, by the list's
    first: dict[int, int] = {}  # an ordered list's first number, by its first line
    for token in block_parser().parse(source, env):
        if token.map is None or token.nesting < 0:
            continue
        if token.level == 0:
            starts.append(token.map[0])
            if token.type == "ordered_list_open":
                first[token.map[0]] = int(token.attrs.get("start", 1))
        elif token.level == 1 and token.type == "list_item_open" and starts:
            item_starts.setdefault(starts[-1], []).append(token.map[0])
    if references is not None:
        references.update(env.get("references", {}))

    def text(start: int, end: int) -> str:
        return "".join(lines[start:end]).rstrip("\n")

    def ends(starts: list[int], end: int) -> list[int]:
        return [*starts[1:], end][:len(starts)]

    blocks = []
    for start, end in zip(starts, ends(starts, len(lines)), strict=True):
        items = item_starts.get(start, [])
        blocks.append(Block(offsets[start], text(start, end), tuple(
            (offsets[item] - offsets[start], text(item, item_end))
            for item, item_end in zip(items, ends(items, end), strict=True)), first.get(start)))
    return blocks


def definitions(block: str) -> References:
    """The link reference definitions in `block` (each label's first), by label."""
    if "]:" not in block:  # (none can be in it: most blocks are not parsed)
        return {}
    env: dict[str, References] = {}
    block_parser().parse(block, env)
    return env.get("references", {})


def common_prefix(old: Sequence[str], new: Sequence[str]) -> int:
    """How many leading items `old` and `new` share: the blocks (or a code block's runs) drawn before that are kept."""
    kept = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        kept += 1
    return kept
