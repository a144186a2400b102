"""The transcript's views of messages: a prompt, a reply (its Markdown or its coloured tokens, and its stats line),
the line above an opened chat's shown messages, and `Shown`, a message not shown yet.

A reply keeps both its Markdown (the default view, code blocks highlighted) and its text cut into
provenance pieces, so the colour toggle can switch views at any time without re-running anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from engine.outputs import TokenSource
from ssd_chat.tui.widgets.reply_markdown import ReplyMarkdown
from ssd_chat.tui.widgets.token_view import Piece, TokenView


@dataclass(frozen=True)
class Shown:
    """A message of an opened chat: "user" or "assistant", its text, and a reply's stats line."""

    role: str
    text: str
    stats: str = ""
    pieces: tuple[Piece, ...] | None = None  # a reply streamed in this run: its tokens' sources (Ctrl+T's colours)

    def rows(self, width: int) -> int:
        """About how many rows its view takes at `width` columns (the borders, the stats line, a margin)."""
        lines = self.text.split("\n")
        return 4 + sum(max(1, math.ceil(len(line) / max(1, width - 4))) for line in lines)


class EarlierMessages(Static):
    """The line above the shown messages of an opened chat, while earlier ones are not shown yet."""

    def __init__(self) -> None:
        super().__init__("", classes="earlier")

    def count(self, hidden: int) -> None:
        self.update(Text(f"↑ {hidden} earlier message{'s' * (hidden != 1)}: scroll up to show them"))


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="message user")
        self.border_title = "you"
        self.text = text

    def shown(self) -> Shown:
        return Shown("user", self.text)


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

    def shown(self) -> Shown:
        """The reply as its record while unshown: its text, stats line and token sources."""
        return Shown("assistant", self.text, self.stats, tuple(self.pieces))

    def set_stats(self, line: str) -> None:
        self.stats = line
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
