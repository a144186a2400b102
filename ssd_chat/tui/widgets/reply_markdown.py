"""A reply's Markdown as one widget, drawn by Rich one top-level block at a time, each finished block drawn once.

Textual's `Markdown` made a widget per block, list item and paragraph (about 100 for a 1,800-character reply with
lists and code), and each streamed append laid out every widget of the transcript: on a 2-vCPU Zen 1 VM
(2026-12-07, scripts/ui_update_cost.py) an update cost the UI thread 95 ms with no earlier turns and 295 ms under six
such turns (631 widgets), which the engine's threads wait for; now 25 and 35. Here a reply is one widget that draws
its lines itself (Textual's line API): a block the parser has closed (any but the last) is rendered once at the
width and kept; an update re-parses and redraws only the open block (of a code block, its last run of lines:
open_fence.py; of a list, its last item: open_list.py, a long list parsed from its last items on). The same blocks,
drawn the same way, make the finished reply, so nothing moves at its end. A link's text opens it on a click.
While a reply streams its height grows a few lines at a time, and an append within them repaints only the lines it
changed (line_view.py).
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Heading, ListElement, MarkdownElement
from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip

from ssd_chat.tui.widgets.line_view import LineView
from ssd_chat.tui.widgets.markdown_parser import (
    SEPARATORS,
    Block,
    References,
    common_prefix,
    definitions,
    parser,
    split_blocks,
)
from ssd_chat.tui.widgets.open_fence import OpenFence, open_fence_code
from ssd_chat.tui.widgets.open_list import Numbered, OpenList

CODE_THEMES = {True: "monokai", False: "default"}  # the app's theme dark or light: Pygments' theme for code blocks


class _LeftHeading(Heading):
    """Headings at the left, as a chat reads (Rich centres the first level)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = self.text.copy()
        text.justify = "left"
        yield text


class _NumberedList(ListElement):
    """An ordered list; at the block's top, where the Markdown says `numbered`, numbered so (one item of a longer
    list drawn alone: open_list.py)."""

    numbered: Numbered = None

    @classmethod
    def create(cls, markdown: RichMarkdown, token: object) -> ListElement:
        element = super().create(markdown, token)
        if getattr(token, "level", None) == 0:
            element.numbered = getattr(markdown, "numbered", None)
        return element

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.numbered is None or self.list_type != "ordered_list_open":
            yield from super().__rich_console__(console, options)
            return
        for item in self.items:
            yield from item.render_number(console, options, *self.numbered)


class _BlockMarkdown(RichMarkdown):
    """Rich's Markdown of one block, parsed by `parser()` (GFM, line breaks kept). Rich's own `__init__` is left
    out: it builds a parser and parses with it, a third of a block's drawing; these are the attributes it sets
    (the same in Rich 14 and 15). `numbered`: the block is a list's item, drawn as that list numbers it."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **RichMarkdown.elements, "heading_open": _LeftHeading, "ordered_list_open": _NumberedList}

    def __init__(self, markup: str, code_theme: str, references: References, numbered: Numbered = None) -> None:
        self.markup, self.parsed = markup, parser().parse(markup, {"references": dict(references)})
        self.code_theme = self.inline_code_theme = code_theme
        self.justify, self.style, self.hyperlinks, self.inline_code_lexer = None, "none", True, None
        self.numbered = numbered


Key = tuple[int, bool, str]  # what a block's lines depend on: the width, a dark theme, the link references (repr)


class ReplyMarkdown(LineView):
    """The Markdown of `source`; `append` adds to it as a reply streams, `update` replaces it."""

    def __init__(self, source: str = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.source = ""  # the Markdown
        self._closed_blocks: list[str] = []  # the closed blocks' text, in order
        self._open_at = 0  # where the open blocks start in `source`
        self._open_blocks: list[str] = []  # the last block (it may grow), and the one before while the last's first
        # line is not whole
        self._open_items: dict[str, tuple[int | None, list[str]]] = {}  # an open list's first number and items
        self._tail_at = 0  # where in the open blocks the parse starts: 0, or the first open block a list, one of its
        # items (its first line whole): a long list is not parsed again whole at every update
        self._head = Block(0, "")  # that list's items before it
        self._references: References = {}  # the link reference definitions the blocks see (any block may use
        # them): each label's first in the text, as a parse of the whole text has them
        self._closed_references: References = {}  # those in the closed blocks (they no longer change)
        self._references_key = "[]"  # their repr, for `Key`
        self._closed_lines: list[list[Strip]] = []  # the closed blocks' lines at `_drawn_key`, a prefix of them
        self._drawn_key: Key | None = None
        self._open_lines: dict[str, list[Strip]] = {}  # the open blocks' lines at `_drawn_key`, by their text
        self._streaming = False  # appended to since the last update: an open code block is drawn in runs, a list
        # an item at a time, the height grows ROOM lines at a time (line_view.py)
        self._fence = OpenFence()  # those runs
        self._list = OpenList()  # an open list's items, drawn an item at a time while streaming
        self.update(source)

    def update(self, source: str) -> None:
        """Show `source` from scratch: parsed whole, so a link reference or a block the streaming cut saw
        differently is read as in one piece; the lines of closed blocks that did not change are kept."""
        closed = self._closed_blocks
        self.source, self._closed_blocks, self._open_at, self._closed_references = source, [], 0, {}
        self._tail_at = 0
        if self._fence.drew:  # (an open code block was drawn in runs: the blocks still open are drawn whole)
            self._open_lines, self._fence = {}, OpenFence()
        self._streaming = False
        self._reparse()
        del self._closed_lines[common_prefix(closed, self._closed_blocks):]
        self._refresh_changed()

    def append(self, text: str) -> None:
        """Add `text` to the source: only the blocks from the last open one's start are parsed again."""
        if text:
            self.source += text
            self._streaming = True
            self._reparse()
            self._refresh_changed()

    def _reparse(self) -> None:
        """The blocks from `_open_at` on. Those before the last are closed: the parser has started a block after
        each, so more text cannot change them, once that block's first line is whole ("1. a\n\n2" would close the
        list before "2. b" goes on with it). The open part starts at the first block not closed."""
        found: References = {}  # the definitions in the text parsed now
        blocks = self._split(found)
        whole_line = bool(blocks) and "\n" in self.source[self._open_at + blocks[-1].start:]
        still_open = 1 if whole_line or len(blocks) < 2 else 2
        self._closed_blocks += [block.text for block in blocks[:-still_open]]
        if blocks:
            closed = self.source[self._open_at:self._open_at + blocks[-still_open].start]  # (a definition before the
            _first(self._closed_references, definitions(closed.translate(SEPARATORS)))  # first block is in no block)
            self._open_at += blocks[-still_open].start
        opened = blocks[-still_open:]
        self._open_blocks = [block.text for block in opened]
        self._open_items = {block.text: (block.first, [text for _, text in block.items]) for block in opened
                            if block.items}
        self._tail_at = self._list_tail(opened[0]) if opened else 0
        seen: References = {}  # the open blocks' definitions: in the items before the next parse's start, first
        for _, item in self._head.items if self._tail_at else ():
            _first(seen, definitions(item))
        _first(seen, found)
        self._references = {**seen, **self._closed_references}  # (a label's first definition: the closed blocks')
        self._references_key = repr(sorted(self._references.items()))

    def _split(self, found: References) -> list[Block]:
        """The blocks from `_open_at` on, their starts from there. Parsed from `_tail_at`, where that is a list's item:
        the parser reads the list's items after it as in the whole list (a list goes on, or ends, by its items' own
        lines), so the first block is the list from there, its items before kept from the parse before. `found`
        gets the link reference definitions parsed."""
        at = self._open_at + self._tail_at
        blocks = split_blocks(self.source[at:], found)
        if not self._tail_at:
            return blocks
        if not blocks or blocks[0].start or not blocks[0].items:  # (never seen: the parse from the open blocks' start)
            self._tail_at = 0
            found.clear()
            return self._split(found)
        tail, head = blocks[0], self._head
        listed = Block(0, self.source[self._open_at:at].translate(SEPARATORS) + tail.text,
                       head.items + tuple((self._tail_at + start, text) for start, text in tail.items), head.first)
        return [listed, *(block._replace(start=block.start + self._tail_at) for block in blocks[1:])]

    def _list_tail(self, block: Block) -> int:
        """Where the next parse of `block`, the first open one (at `_open_at`), can start: its last item whose first
        line is whole (a partial one may still turn out no item: "- -" grows into "- - -", a rule), past its first;
        else 0. `_head` keeps the items before it."""
        items = block.items
        last = len(items) - 1
        if last >= 0 and "\n" not in self.source[self._open_at + items[last][0]:]:
            last -= 1
        if last < 1:
            return 0
        self._head = Block(0, "", items[:last], block.first)
        return items[last][0]

    @property
    def blocks(self) -> list[str]:
        return self._closed_blocks + self._open_blocks

    def _layout(self, width: int) -> None:
        """Every line at `width`: the closed blocks' kept lines, the open blocks drawn now, a blank line between."""
        key = self._key(width)
        if key != self._drawn_key:
            self._closed_lines, self._open_lines, self._drawn_key = [], {}, key
        drawn = self._open_lines  # (a block that closed is drawn as it was while open)
        self._closed_lines += [drawn[block] if block in drawn else self._draw(block, key)
                               for block in self._closed_blocks[len(self._closed_lines):]]
        self._open_lines = {block: drawn[block] if block in drawn else self._draw(block, key, streaming=self._streaming)
                            for block in self._open_blocks}
        blank = Strip.blank(key[0])
        self._all_lines = []
        for lines in [*self._closed_lines, *(self._open_lines[block] for block in self._open_blocks)]:
            if self._all_lines:
                self._all_lines.append(blank)
            self._all_lines += lines

    def _stale(self, width: int) -> bool:
        return self._drawn_key != self._key(width)

    def _key(self, width: int) -> Key:
        return max(width, 1), self.app.current_theme.dark, self._references_key

    def _draw(self, block: str, key: Key, *, streaming: bool = False) -> list[Strip]:
        """`block`'s lines; `streaming`: it may still grow, a code block not yet closed is drawn in runs, a list an
        item at a time."""
        if streaming and (fence := open_fence_code(block)) is not None:
            return self._fence.draw(*self._options(key[0]), *fence, CODE_THEMES[key[1]])
        lines = None
        if streaming and block in self._open_items:
            first, items = self._open_items[block]
            lines = self._list.draw(first, items, key, lambda text, numbered: self._rich_lines(text, key, numbered))
        if lines is None:
            lines = self._rich_lines(block, key)
        start, end = 0, len(lines)  # (Rich puts a blank line before a list and after others: one goes between)
        while start < end and _empty(lines[start]):
            start += 1
        while end > start and _empty(lines[end - 1]):
            end -= 1
        return lines[start:end]

    def render_lines(self, crop: Region) -> list[Strip]:
        """The lines as shown, each link's pieces under one id again, and all of them underlined while the mouse is
        on one: on their way to the screen Textual copies every styled piece with an id of its own (the widget's
        style, the selection offsets, the colour filters), so its hover marked the piece under the mouse alone."""
        strips = [_clickable(strip) for strip in super().render_lines(crop)]
        hover = self.hover_style  # (plain text has an id too, from the offsets' meta: only a link's counts)
        hovered = hover.link_id if hover.link and "@click" in hover.meta else ""
        if hovered and any(hovered in strip.link_ids for strip in strips):
            strips = [_clickable(strip.style_links(hovered, self.link_style_hover)) for strip in strips]
        return strips

    def action_open_link(self, href: str) -> None:
        """A link's text was clicked (its `@click`): the browser opens it (an OSC 8 terminal opens it too)."""
        self.app.open_url(href)

    def _rich_lines(self, markup: str, key: Key, numbered: Numbered = None) -> list[Strip]:
        """Rich's lines of `markup` at `key`: the Markdown, at the width, padded to it."""
        width, dark, _ = key
        console, options = self._options(width)
        markdown = _BlockMarkdown(markup, CODE_THEMES[dark], self._references, numbered)
        return [_clickable(Strip(line, width)) for line in console.render_lines(markdown, options, pad=True)]


def _first(into: References, found: References) -> None:
    """`found`'s definitions into `into`, where it has none of that label (a label's first definition is its)."""
    for label, definition in found.items():
        into.setdefault(label, definition)


def _clickable(line: Strip) -> Strip:
    """`line` with each link's text (Rich gives it the link's URL as its style's `link`) opening it on a click:
    Textual runs a style's `@click` action, and under the mouse underlines every piece with the hovered one's link
    id. Each URL's click style is made once (`_CLICKS`) and added by Rich's `Style._add`, whose sum takes the
    right-hand side's link id, so every piece of a link (a bold word in it, each line it wraps over) has that one
    id: `Style.__add__` copies a sum that has a link, with a new id, and each piece was underlined alone."""
    if not any(segment.style is not None and segment.style.link for segment in line):
        return line

    def click(style: Style | None) -> Style | None:
        if not style or not style.link:
            return style
        if (on_click := _CLICKS.get(style.link)) is None:
            on_click = _CLICKS[style.link] = Style.from_meta({"@click": f"open_link({style.link!r})"})
        return style._add(on_click)

    return Strip([Segment(text, click(style), control) for text, style, control in line], line.cell_length)


_CLICKS: dict[str, Style] = {}  # a URL's click style (one link id a URL: the links of a chat are few)


def _empty(line: Strip) -> bool:
    """A line with nothing on it: blank, and no background (a code block's padding has its theme's)."""
    return not line.text.strip() and not any(segment.style and segment.style.bgcolor for segment in line)
