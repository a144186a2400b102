"""The links a GFM-like viewer makes of a line of plain text (markdown-it's linkify, linkify-it's rule), for the
export's literal prompts (export.literal): each stays as typed and clickable, the text around it is escaped."""

from __future__ import annotations

from collections.abc import Callable

from markdown_it import MarkdownIt
from markdown_it.rules_inline.autolink import AUTOLINK_RE
from markdown_it.rules_inline.linkify import SCHEME_RE

_MARKDOWN = MarkdownIt("gfm-like")
_LINKIFY = _MARKDOWN.linkify  # (the parser's own linkify-it: gfm-like needs it)
_SHOWN = {"text", "text_special", "link_open", "link_close"}


def with_links(line: str, escape: Callable[[str], str], start: int = 0, core: bool = True) -> str:
    """`line` with its text escaped by `escape` and its links as typed. A link found at "://" (the inline rule: it
    matches the Markdown source, so a backslash escaping the character after it would be read into the URL) is put
    in an autolink's brackets, "<http://a.com/>\\<x>", where the escaped text after it would lengthen it. `start`:
    where the parser's pending text begins (after a character escaped at the line's start), from where links count.
    `core`: keep the core rule's links as typed too (_text), unless then the line no longer shows as typed."""
    pieces: list[tuple[str, bool]] = []  # (Markdown, a link the inline rule finds)
    end = 0
    for first, last in _scheme_links(line, start):
        pieces += [(_text(line[end:first], escape, max(start - end, 0), core), False), (line[first:last], True)]
        end = last
    pieces.append((_text(line[end:], escape, max(start - end, 0), core), False))
    after = ""
    for markdown, inline in reversed(pieces):  # (from the end: what follows a link is final when it is checked)
        if inline and _lengthened(markdown, after) and AUTOLINK_RE.match(markdown):
            markdown = f"<{markdown}>"
        after = markdown + after
    if core and len(pieces) > 1 and not _shows(after, line):  # (markup across an inline one: "www.a.com/*b" and
        return with_links(line, escape, start, core=False)  # "www.c.com/d*" around one paired as emphasis)
    return after


def _text(text: str, escape: Callable[[str], str], start: int, core: bool) -> str:
    """`text` (between the inline rule's links) escaped, but the links the core rule finds in it from `start` on
    (linkify-it's match: "www.", a bare domain, an e-mail address) as typed, where all of it still shows as typed
    (markup in a link: "www.a.com/*b*", all escaped; the core rule's link then ends at the first escape)."""
    matches = (_LINKIFY.match(text[start:]) if core else None) or []
    pieces, end = [], 0
    for match in matches:
        first, last = start + match.index, start + match.last_index
        pieces += [escape(text[end:first]), text[first:last]]
        end = last
    markdown = "".join([*pieces, escape(text[end:])])
    return markdown if not matches or _shows(markdown, text) else escape(text)


def _scheme_links(line: str, start: int) -> list[tuple[int, int]]:
    """The inline rule's links (markdown_it.rules_inline.linkify): at each "://" the parser stands on, the scheme that
    ends its pending text, and the URL linkify-it matches from there, less the "*"s that end it (emphasis)."""
    found: list[tuple[int, int]] = []
    pending, colon = start, line.find("://", start)
    while colon != -1:
        scheme = SCHEME_RE.search(line[pending:colon])
        link = scheme and _LINKIFY.match_at_start(line[colon - len(scheme[1]):])
        url = link.url.rstrip("*") if link else ""
        if scheme and url and _MARKDOWN.validateLink(_MARKDOWN.normalizeLink(url)):
            first = colon - len(scheme[1])
            found.append((first, first + len(url)))
            pending = first + len(url)
        colon = line.find("://", max(colon + 1, pending))
    return found


def _lengthened(url: str, after: str) -> bool:
    """Whether the inline rule would read a URL followed by `after` (Markdown) as a longer one."""
    link = _LINKIFY.match_at_start(url + after)
    return link is None or link.url.rstrip("*") != url


def _shows(markdown: str, text: str) -> bool:
    """Whether a parser shows `markdown` as `text`: no emphasis, code, link or HTML markup, escapes and links only."""
    children = _MARKDOWN.parseInline(markdown)[0].children or []
    shown = "".join(child.content for child in children if child.type in ("text", "text_special"))
    return all(child.type in _SHOWN for child in children) and shown == text
