"""The transcript: the conversation's messages, the last reply streaming in as Markdown.

A reply keeps both its Markdown (the default view, code blocks highlighted) and its text cut into
provenance pieces, so the colour toggle can switch views at any time without re-running anything.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from engine.outputs import TokenSource
from ssd_chat.tui.widgets.reply_markdown import ReplyMarkdown
from ssd_chat.tui.widgets.token_view import Piece, TokenView

PAGE_SPEED = 50  # rows a second: Textual's for a page, for the last one (scroll_end's default is a whole second)
FOUND_S = 3.0  # how long a chat opened from a search marks the message it matched


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="message user")
        self.border_title = "you"


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
        self.streaming = False  # appended to since the last finish

    def compose(self) -> ComposeResult:
        yield ReplyMarkdown(self.text, classes="reply-markdown")
        yield TokenView(classes="reply-tokens")
        yield Static(Text(self.stats), classes="reply-stats")

    def on_mount(self) -> None:
        if self.query(ReplyMarkdown):  # (a rebuild right after this one, Ctrl+N as a chat opens, may have emptied it)
            self._apply_view()

    async def append(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        self.text += text
        self.pieces += pieces
        self.streaming = True
        if self.colours:
            self.query_one(TokenView).append(pieces)
        else:
            self.query_one(ReplyMarkdown).append(text)

    def finish(self, text: str, line: str) -> None:
        """The reply is complete: its final text parsed whole (appends may have cut a Markdown block
        otherwise), then the stats line."""
        self.text, self.streaming = text, False
        self.query_one(ReplyMarkdown).update(text)
        self._apply_view()
        self.set_stats(line)

    def set_stats(self, line: str) -> None:
        self.query_one(".reply-stats", Static).update(Text(line))

    def show_colours(self, colours: bool) -> None:
        self.colours = colours
        self._apply_view()

    def _apply_view(self) -> None:
        markdown = self.query_one(ReplyMarkdown)
        tokens = self.query_one(TokenView)
        markdown.display, tokens.display = not self.colours, self.colours
        if self.colours:
            tokens.show(self.pieces, streaming=self.streaming)
        elif markdown.source != self.text:  # (replies streamed in colours went to the tokens view only)
            markdown.update(self.text)


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

    def views_of(self, start: int, count: int, total: int) -> list[Widget]:
        """The views of messages start..start+count of a chat of `total` messages: they are the last `total` views
        (the chat shown before may not be removed yet)."""
        views = list(self.children)
        first = len(views) - total + start
        return views[first:first + count]

    def show_found(self, message: Widget, seconds: float = FOUND_S) -> None:
        """`message` scrolled to the top and marked for `seconds` (a search's match: the class "found")."""
        message.add_class("found")
        self.set_timer(seconds, lambda: message.remove_class("found"))
        self.call_after_refresh(self.scroll_to_widget, message, animate=False, top=True)

    def last_assistant(self) -> AssistantMessage | None:
        found = self.query(AssistantMessage)
        return found.last() if found else None

    def remove_last(self, count: int) -> None:
        for child in list(self.children)[-count:]:
            child.remove()
