"""How a reply's Markdown is read: one parser (GFM, a single newline a line break) and its top-level blocks."""

from __future__ import annotations

import functools

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


# The line separators `str.splitlines` breaks at and the Markdown parser does not (nor Textual's selection): spaces
SEPARATORS = str.maketrans(dict.fromkeys("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", " "))
References = dict[str, dict[str, object]]  # markdown-it's link reference definitions, by label


def split_blocks(source: str, references: References | None = None) -> list[tuple[int, str]]:
    """`source` cut into its top-level blocks: (where each starts in `source`, its text without the blank lines after
    it, its `SEPARATORS` as spaces). A block runs from its first line to the next block's, so a list's or a fence's
    inner blank lines stay in it (and a link reference definition, which makes no block, in the block before it).
    `references` gets the definitions found."""
    source = source.translate(SEPARATORS)  # (the same length: the offsets hold)
    env: dict[str, References] = {}
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    starts = [token.map[0] for token in parser().parse(source, env)
              if token.level == 0 and token.map is not None and token.nesting >= 0]
    ends = [*starts[1:], len(lines)][:len(starts)]
    if references is not None:
        references.update(env.get("references", {}))
    return [(offsets[start], "".join(lines[start:end]).rstrip("\n")) for start, end in zip(starts, ends, strict=True)]
