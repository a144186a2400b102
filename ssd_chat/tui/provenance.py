"""Token provenance colours: where each reply token came from, in the current theme's colours."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
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


def source_style(source: TokenSource, theme: Theme) -> Style:
    colour = getattr(theme, _LEGEND[source][1], None) or theme.foreground
    return Style(color=colour) if colour else Style()


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
