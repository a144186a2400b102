"""set_content (widgets/steady.py): a Static's new content asks for a layout only where its height changes."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ssd_chat.tui.widgets.steady import set_content


class Host(App):
    CSS = "#auto { width: auto; }"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("one line", id="figures")
            yield Static("short", id="auto")
            yield Static("below", id="below")


@pytest.mark.asyncio
async def test_a_same_height_update_repaints_and_a_taller_one_lays_out(monkeypatch):
    layouts: list[str] = []
    refresh = Static.refresh
    monkeypatch.setattr(Static, "refresh", lambda self, *regions, **kwargs: (
        kwargs.get("layout") and layouts.append(self.id)) or refresh(self, *regions, **kwargs))
    app = Host()
    async with app.run_test(size=(40, 12)) as pilot:
        figures, below = app.query_one("#figures", Static), app.query_one("#below", Static)
        await pilot.pause()
        layouts.clear()
        set_content(figures, Text("another line"))
        await pilot.pause()
        assert layouts == [] and str(figures.render()) == "another line"
        set_content(figures, Text("two\nlines"))
        await pilot.pause()
        assert "figures" in layouts and figures.size.height == 2 and below.region.y == 3
        layouts.clear()
        set_content(figures, Text("a line far too long for forty columns, so it wraps"))  # (two lines still)
        await pilot.pause()
        assert layouts == [] and figures.size.height == 2
        set_content(figures, Text("one"))
        await pilot.pause()
        assert "figures" in layouts and below.region.y == 2
        layouts.clear()
        set_content(app.query_one("#auto", Static), Text("longer text"))  # (its width follows its text)
        await pilot.pause()
        assert "auto" in layouts and app.query_one("#auto", Static).size.width == len("longer text")
