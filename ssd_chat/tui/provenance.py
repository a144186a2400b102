"""Token provenance colours: where each reply token came from, in the current theme's colours."""

from __future__ import annotations

from functools import cache

from rich.style import Style
from rich.text import Text
from textual.color import Color
from textual.theme import Theme

from engine.outputs import TokenSource

# (label, theme colour) per source; plain target tokens keep the text colour.
_LEGEND = {
    TokenSource.ACCEPTED_HIT: ("accepted, cache hit", "success"),
    TokenSource.ACCEPTED_MISS: ("accepted, cache miss", "warning"),
    TokenSource.ACCEPTED: ("accepted draft (SD)", "primary"),
    TokenSource.RECOVERY: ("target's recovery / bonus", "error"),
    TokenSource.BONUS: ("target's recovery / bonus", "error"),
    TokenSource.TARGET: ("target only", "foreground"),
}


MIN_CONTRAST = 4.5  # WCAG's for text: the light theme's warning and success colours were 1.4:1 and 1.6:1


def source_style(source: TokenSource, theme: Theme) -> Style:
    colour = getattr(theme, _LEGEND[source][1], None) or theme.foreground
    if not colour:
        return Style()
    return Style(color=readable(colour, theme.surface or theme.background or ("#000000" if theme.dark else "#ffffff")))


@cache
def readable(colour: str, background: str) -> str:
    """`colour`, darkened on a light background (lightened on a dark one) until it reads as text on it."""
    fg, bg = Color.parse(colour), Color.parse(background)
    toward = Color(0, 0, 0) if _luminance(bg) > 0.5 else Color(255, 255, 255)
    for step in range(21):
        c = fg.blend(toward, step / 20)
        if _contrast(c, bg) >= MIN_CONTRAST:
            return c.hex6
    return toward.hex6


def _contrast(a: Color, b: Color) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _luminance(c: Color) -> float:
    """WCAG's relative luminance of an sRGB colour."""
    def linear(v: int) -> float:
        x = v / 255
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4
    return 0.2126 * linear(c.r) + 0.7152 * linear(c.g) + 0.0722 * linear(c.b)


def colour_text(pieces: list[tuple[str, TokenSource]], theme: Theme) -> Text:
    text = Text()
    for piece, source in pieces:
        text.append(piece, source_style(source, theme))
    return text


def legend(theme: Theme) -> Text:
    text = Text("tokens: ")
    seen: set[str] = set()
    for source, (label, _) in _LEGEND.items():
        if label in seen:
            continue
        seen.add(label)
        text.append("■ ", source_style(source, theme))
        text.append(label + "  ")
    return text
