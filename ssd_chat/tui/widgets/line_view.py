"""A widget that draws its own lines (Textual's line API) as a reply streams into it: the reply's Markdown
(reply_markdown.py) and its token colours (token_view.py).

A subclass keeps `_all_lines` drawn at a width (`_layout`) and says when they are not (`_stale`); this holds what
both share. An update that changes the widget's height makes Textual lay out and repaint the whole screen, so while a
reply streams the height grows `ROOM` lines at a time (the room shows blank under the text until the reply ends), and
an update within it repaints only the lines it changed (`_refresh_changed`). Text selection gives the lines as drawn.
"""

from __future__ import annotations

from itertools import zip_longest

from rich.console import Console, ConsoleOptions
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget

ROOM = 4  # a streaming reply's height grows this many lines at a time: most updates then repaint its last lines


class LineView(Widget):
    """Lines drawn by the subclass; `_streaming` while the text may still grow."""

    DEFAULT_CSS = "LineView { height: auto; }"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._all_lines: list[Strip] = []  # every line at the last layout's width
        self._streaming = False
        self._current = False  # `_all_lines` hold the text as it is (at the width and theme `_stale` tells)
        self._line_style = Style()  # the widget's style, for the lines of one paint (render_lines)

    def _layout(self, width: int) -> None:
        """`_all_lines` at `width` (drawing only what changed)."""
        raise NotImplementedError

    def _stale(self, width: int) -> bool:
        """Whether `_all_lines` were drawn for another width or theme (or never)."""
        raise NotImplementedError

    def _lay_out(self, width: int) -> None:
        """`_layout(width)` where the lines are not the text's now at `width`: once an update, not again at the
        layout and the paint that follow it."""
        if not self._current or self._stale(width):
            self._layout(width)
            self._current = True

    def _options(self, width: int) -> tuple[Console, ConsoleOptions]:
        """The app's console, and its options for lines `width` cells wide (Rich's drawing of them)."""
        console = self.app.console
        return console, console.options.update(width=width, min_width=width, height=None)

    def _refresh_changed(self) -> None:
        """After a change: a layout where the height changed, else a repaint of the lines that did (a layout
        repaints the whole screen: on a Zen 1 VM most of an update's cost; an append within a line changes its last
        line or two)."""
        self._current = False
        width = self.size.width
        if not self.is_mounted or not width or self._stale(width):
            self.refresh(layout=True)
            return
        before = self._all_lines
        self._lay_out(width)
        if self._height() != self.size.height:  # (as laid out)
            self.refresh(layout=True)
            return
        changed = [y for y, (old, new) in enumerate(zip_longest(before, self._all_lines))
                   if old is not new and old != new]
        if changed:
            self.refresh(Region(0, changed[0], width, changed[-1] + 1 - changed[0]))

    def _height(self) -> int:
        """The lines' count; while streaming, rounded up to a multiple of `ROOM` (the room below the text)."""
        lines = len(self._all_lines)
        return -(-lines // ROOM) * ROOM if self._streaming else lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._lay_out(width)
        return self._height()

    def render_lines(self, crop: Region) -> list[Strip]:
        """The widget's style worked out once a paint, not a line (it walks the ancestors' styles)."""
        self._lay_out(self.size.width)  # (a theme changed: its colours)
        self._line_style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if y >= len(self._all_lines):
            return Strip.blank(self.size.width, self._line_style)
        line = self._all_lines[y]
        selection = self.text_selection
        if selection is not None and (span := selection.get_span(y)) is not None:
            style = self.screen.get_component_rich_style("screen--selection")
            line = _selected(line, *span, style, self.app.console)
        return line.apply_style(self._line_style).apply_offsets(0, y)

    def shown_lines(self) -> list[str]:
        """The lines as last drawn, as text (a list's bullets, a code block's indent), their ends stripped."""
        return [line.text.rstrip() for line in self._all_lines]

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The selected text, as drawn."""
        return selection.extract("\n".join(self.shown_lines())), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()


def _selected(line: Strip, start: int, end: int, style: Style, console: Console) -> Strip:
    """`line` with its characters start..end (-1: to its end) in the selection's style."""
    text = Text.assemble(*((segment.text, segment.style or "") for segment in line if not segment.control))
    text.stylize(style, start, len(text) if end == -1 else end)
    return Strip(text.render(console), line.cell_length)
