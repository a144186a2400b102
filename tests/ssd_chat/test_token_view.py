"""The token-colour view (widgets/token_view.py): streamed in pieces it shows what the whole reply shows, drawing
only the lines an update ended and the last one."""

from __future__ import annotations

import random

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll

from engine.outputs import TokenSource
from ssd_chat.tui.widgets.token_view import TokenView

SOURCES = list(TokenSource)
TEXT = ("A first line that is long enough to wrap at the narrow width of the test's screen.\n\n"
        "- an item\n- another\n\n```\ncode\n```\n\n" + "word " * 40 + "\nend\n")


class Host(App):
    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield TokenView(classes="streamed")
            yield TokenView(classes="whole")


@pytest.mark.asyncio
async def test_streamed_pieces_show_what_the_whole_reply_shows(monkeypatch):
    rng = random.Random(7)
    pieces, at = [], 0
    while at < len(TEXT):
        size = rng.randint(1, 9)
        pieces.append((TEXT[at:at + size], rng.choice(SOURCES)))
        at += size
    drawn: list[str] = []
    rows = TokenView._rows
    monkeypatch.setattr(TokenView, "_rows", lambda self, text, width: (
        "streamed" in self.classes and drawn.append(text.plain)) or rows(self, text, width))
    app = Host()
    async with app.run_test(size=(50, 120)) as pilot:
        streamed, whole = app.query_one(".streamed", TokenView), app.query_one(".whole", TokenView)
        for i, piece in enumerate(pieces):
            streamed.append([piece])
            whole.show(pieces[:i + 1])
            await pilot.pause()
            assert streamed.shown_lines() == whole.shown_lines()
            assert _cells(streamed) == _cells(whole)  # (each row's colours too)
            assert streamed.text.spans == whole.text.spans  # (the colours too)
        assert any(not line for line in streamed.shown_lines()) and streamed.text.plain == TEXT
        assert max(len(text) for text in drawn) < 210  # (the longest line: never the whole reply)
        assert streamed.size.height % 4 == 0 and streamed.size.height >= len(streamed.shown_lines())  # (the room)
        streamed.show(pieces)  # the reply's end
        await pilot.pause()
        assert streamed.size.height == len(streamed.shown_lines()) == len(whole.shown_lines())


def _cells(view: TokenView) -> list[list[tuple[str, object]]]:
    """Each row's characters with their styles."""
    return [[(char, segment.style) for segment in line for char in segment.text] for line in view._all_lines]


@pytest.mark.asyncio
async def test_a_new_width_or_a_theme_draws_the_view_again():
    app = Host()
    async with app.run_test(size=(50, 60)) as pilot:
        view = app.query_one(".whole", TokenView)
        view.show([(TEXT, TokenSource.ACCEPTED_HIT)])
        await pilot.pause()
        narrow = view.shown_lines()
        dark = view.text.spans
        await pilot.resize_terminal(80, 60)
        await pilot.pause()
        assert len(view.shown_lines()) < len(narrow)
        app.theme = "textual-light"
        view.show([(TEXT, TokenSource.ACCEPTED_HIT)])  # (as the app does on a theme change)
        await pilot.pause()
        assert view.text.spans != dark
