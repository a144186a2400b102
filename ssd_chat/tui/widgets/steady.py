"""A `Static`'s new content, with the screen laid out again only where the widget's height changes.

`Static.update` asks for a layout by default, and a layout makes Textual repaint the whole screen. While a reply
streams, every update sets the panel's figures and the status line, which mostly change in place: with the headless
app on the scripted engine (scripts/ui_flush_cost.py, 2-vCPU Zen 1 VM, 2026-12-07), the UI thread's CPU per update
had a median of 59 ms, most of it Textual painting, before these updates stopped asking for layouts.
"""

from __future__ import annotations

from textual.visual import VisualType
from textual.widgets import Static


def set_content(widget: Static, content: VisualType) -> None:
    """`widget.update(content)`: a repaint of the widget alone where its height at its width stays, else a layout."""
    width, height = widget.size
    widget.update(content, layout=False)
    auto_width = widget.styles.width is not None and widget.styles.width.is_auto  # (its width follows its text)
    if not width or auto_width or widget.get_content_height(widget.size, widget.size, width) != height:
        widget.refresh(layout=True)
