"""A list still streaming, drawn an item at a time: each item but the last drawn once, the last anew each update.

A chat model often answers with one long list ("ten tips", each a bold title, a sentence and sub-points), and a
reply's last block is drawn again at every update (reply_markdown.py): a 40-item numbered list cost the UI thread
100 ms an update on a 2-vCPU Zen 1 VM (scripts/ui_update_cost.py --list 40), the whole list drawn each time. Rich
draws a list's items one after another, each from its own text, its number and the width of the list's numbers
(`ListItem.render_number`: the digits of the list's start plus its item count), so an item drawn alone as a one-item
list, numbered as it is in the whole list, has the lines it has there: the streamed list is the whole list's
drawing, not an approximation of it, and needs no drawing again at the reply's end.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.strip import Strip

from ssd_chat.tui.widgets.markdown_parser import block_parser

Numbered = tuple[int, int] | None  # an ordered list's item: (its number, the list's last number as Rich counts it)
DrawItem = Callable[[str, Numbered], list[Strip]]  # an item's text drawn as a one-item list, numbered so


class OpenList:
    """The lines of one open list's items, at one width, theme and set of link references: `draw` reuses them
    while the list grows."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, int, int], list[Strip]] = {}  # (text, number, the numbers' digits): its lines
        self._for: object = None  # what the items were drawn for (width, theme, references)

    def draw(self, first: int | None, items: list[str], drawn_for: object, draw_item: DrawItem) -> list[Strip] | None:
        """The list's lines: its items' in order (`first`: an ordered list's first number, None for bullets), each
        but the last one's kept from the update before; None where an item is not one list item on its own (then
        the list is drawn whole). `drawn_for`: what else the lines depend on; a change draws every item again."""
        if self._for != drawn_for:
            self._items, self._for = {}, drawn_for
        last_number = None if first is None else first + len(items)  # (Rich's count: one past the last item)
        kept: dict[tuple[str, int, int], list[Strip]] = {}
        lines: list[Strip] = []
        for index, text in enumerate(items):
            numbered = None if first is None or last_number is None else (first + index, last_number)
            key = (text, numbered[0], len(str(numbered[1]))) if numbered else (text, 0, 0)
            item_lines = self._items.get(key)
            if item_lines is None:
                if not stands_alone(text):
                    self._items = kept
                    return None
                item_lines = _without_leading_blanks(draw_item(text, numbered))
            if index < len(items) - 1:  # (the last item may still grow)
                kept[key] = item_lines
            lines += item_lines
        self._items = kept
        return lines


def stands_alone(item: str) -> bool:
    """Whether `item`, parsed on its own, is one list of one item, as in its list. An item after the first can
    read otherwise: markdown-it's list goes on to an item without trying the table rule, which the top level tries
    first, so "- a | b\n--|--" on its own is a table (the list marker its first cell)."""
    tokens = block_parser().parse(item)
    blocks = [token for token in tokens if token.level == 0 and token.nesting >= 0]
    return (len(blocks) == 1 and blocks[0].type in ("bullet_list_open", "ordered_list_open")
            and sum(token.type == "list_item_open" and token.level == 1 for token in tokens) == 1)


def _without_leading_blanks(lines: list[Strip]) -> list[Strip]:
    """An item's lines without the blank line Rich puts before a list (an item's first line holds its bullet)."""
    start = 0
    while start < len(lines) and not lines[start].text.strip():
        start += 1
    return lines[start:]
