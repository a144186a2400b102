"""The transcript: the conversation's messages, the last reply streaming in as Markdown.

A reply keeps both its Markdown (the default view, code blocks highlighted) and its text cut into
provenance pieces, so the colour toggle can switch views at any time without re-running anything.
"""

from __future__ import annotations

import functools

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from engine.outputs import TokenSource
from ssd_chat.tui.provenance import colour_text

Piece = tuple[str, TokenSource]
PAGE_SPEED = 50  # rows a second: Textual's for a page, for the last one (scroll_end's default is a whole second)
FOUND_S = 3.0  # how long a chat opened from a search marks the message it matched


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="message user")
        self.border_title = "you"


def _line_breaks(state: StateCore) -> None:
    """A reply's single newlines kept as line breaks (a poem, an address, an item a line): CommonMark reads them
    as soft breaks, which Textual shows as spaces, and the token-colour view (the plain text) showed other lines.
    Code blocks keep their text as it is; lists, tables and headings end their lines anyway."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type, child.tag = "hardbreak", "br"


@functools.cache
def _parser() -> MarkdownIt:
    """One Markdown parser for every reply: Textual builds a new one per streamed append otherwise, which took about
    a seventh of the UI thread's time while a reply streamed (the engine's thread waits for that thread's GIL)."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("line_breaks", _line_breaks)
    return parser


class AssistantMessage(Vertical):
    """One reply: Markdown and a coloured-token view (one shown at a time), then a dim stats line."""

    def __init__(self, text: str = "", pieces: list[Piece] | None = None, *, colours: bool = False,
                 stats: str = "") -> None:
        super().__init__(classes="message assistant")
        self.stats = stats  # the stats line a reply from the history comes with (a streamed one gets it at finish)
        self.border_title = "assistant"
        self.text = text
        self.pieces: list[Piece] = list(pieces) if pieces is not None else [(text, TokenSource.TARGET)]
        self.colours = colours

    def compose(self) -> ComposeResult:
        yield Markdown(self.text, classes="reply-markdown", parser_factory=_parser)
        yield Static("", classes="reply-tokens")
        yield Static(Text(self.stats), classes="reply-stats")

    def on_mount(self) -> None:
        if self.query(Markdown):  # (a rebuild right after this one, Ctrl+N as a chat opens, may have emptied it)
            self._apply_view()

    async def append(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        self.text += text
        self.pieces += pieces
        if self.colours:
            self._render_tokens()
        else:
            await self.query_one(Markdown).append(text)

    def finish(self, text: str, line: str) -> None:
        """The reply is complete: one full render of its final text (appends may have split a Markdown
        span), then the stats line."""
        self.text = text
        self._apply_view()
        self.set_stats(line)

    def set_stats(self, line: str) -> None:
        self.query_one(".reply-stats", Static).update(Text(line))

    def show_colours(self, colours: bool) -> None:
        self.colours = colours
        self._apply_view()

    def _apply_view(self) -> None:
        markdown = self.query_one(Markdown)
        tokens = self.query_one(".reply-tokens", Static)
        markdown.display, tokens.display = not self.colours, self.colours
        if self.colours:
            self._render_tokens()
        else:
            markdown.update(self.text)

    def _render_tokens(self) -> None:
        self.query_one(".reply-tokens", Static).update(colour_text(self.pieces, self.app.current_theme))


class Transcript(VerticalScroll):
    """Messages top to bottom; anchored to the bottom while a reply streams, unless scrolled up."""

    can_focus = False

    def add_user(self, text: str) -> UserMessage:
        message = UserMessage(text)
        self.mount(message)
        return message

    def add_assistant(self, text: str = "", *, colours: bool = False, stats: str = "") -> AssistantMessage:
        message = AssistantMessage(text, colours=colours, stats=stats)
        self.mount(message)
        self.anchor()
        return message

    def page(self, direction: int) -> None:
        """PageUp (-1) or PageDown (+1): scrolled up, it stops following a streaming reply; paged down to the end, it
        follows again. Where the page would not move (the conversation fits on the screen, or it is at the top) it
        does nothing: Textual lets go of the anchor on any scroll and takes it back only when the position changes,
        so a PageDown while a reply was short left the rest of it streaming below the screen."""
        if direction < 0:
            if self.scroll_y > 0:
                self.scroll_page_up()
        elif self.scroll_y + self.scrollable_content_region.height >= self.max_scroll_y:
            self.scroll_end(speed=PAGE_SPEED)  # (the anchor kept or taken back: new output scrolls into view)
        else:
            self.scroll_page_down()

    def show_colours(self, colours: bool) -> None:
        for message in self.query(AssistantMessage):
            message.show_colours(colours)

    def show_found(self, index: int, seconds: float = FOUND_S) -> None:
        """Message `index` (from the end where negative) scrolled to the top and marked for `seconds` (a search's
        match: the class "found")."""
        message = list(self.children)[index]
        message.add_class("found")
        self.set_timer(seconds, lambda: message.remove_class("found"))
        self.call_after_refresh(self.scroll_to_widget, message, animate=False, top=True)

    def last_assistant(self) -> AssistantMessage | None:
        found = self.query(AssistantMessage)
        return found.last() if found else None

    def remove_last(self, count: int) -> None:
        for child in list(self.children)[-count:]:
            child.remove()
