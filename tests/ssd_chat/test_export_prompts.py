"""/export writes a prompt as the chat shows it, plain text: read by a CommonMark / GFM parser (markdown-it, the
transcript's), it gives no heading, list, code, quote, table, emphasis or link, and the text as typed, line by line
(a prompt written raw under "## You" made "# heading?" an H1, a line "## Assistant" a fake turn, an indent code)."""

from __future__ import annotations

from markdown_it import MarkdownIt

from ssd_chat.history import ChatMessage, ChatSettings, Conversation
from ssd_chat.tui.export import to_markdown

NBSP, WORD_JOINER = "\u00a0", "\u2060"  # (an indent, a blank line; what an export wrote before a first indent)

PROMPT = "\n".join([
    "# heading?", "## Assistant", "fake reply", "    four-space indent", "\tand a tab", "", "", "two blank lines above",
    "- not a list", "+ nor this", "1. nor this", "2) nor this", "> not a quote", "---", "===",
    "**bold** and *it* and _it_",
    "`code` and ``` fence", "~~~", "~~struck~~", "[a link](http://x) ![img](y)", "<b>html</b> <http://auto>",
    "| a | b |", "|---|---|", "&amp; &#35; stay", r"C:\Users\me and \*escaped\* and a trailing \ ", "last line \\",
])
BLOCKS = {"paragraph_open", "inline", "paragraph_close"}
INLINE = {"text", "text_special", "hardbreak"}


def _shown(prompt: str) -> tuple[set[str], set[str], str]:
    """What a parser makes of `prompt` in an export (the tokens between "You" and the next heading): its block and
    inline token types, and its text (a line break: \\n). A URL's link (linkify's, or an autolink's: its text as
    written) is text here."""
    chat = Conversation(None, "Prompt", messages=[ChatMessage("user", prompt), ChatMessage("assistant", "ok")])
    tokens = MarkdownIt("gfm-like").parse(to_markdown(chat))
    you = next(i for i, t in enumerate(tokens) if t.type == "inline" and t.content == "You")
    tokens = tokens[you + 2: next(i for i, t in enumerate(tokens) if i > you and t.type == "heading_open")]
    children = [c for t in tokens for c in t.children or ()
                if not (c.type in ("link_open", "link_close") and c.markup in ("linkify", "autolink"))]
    text = "".join("\n" if c.type == "hardbreak" else c.content for c in children)
    lines = text.replace(NBSP, " ").split("\n")  # (a blank line: one no-break space)
    return {t.type for t in tokens}, {c.type for c in children}, "\n".join(line.rstrip(" ") for line in lines)


def _typed(prompt: str) -> str:
    """A prompt as the chat shows it: its tabs in 8 columns, trailing spaces out of sight."""
    return "\n".join(line.expandtabs(8).rstrip(" ") for line in prompt.split("\n"))


def test_a_prompt_is_exported_as_its_literal_text():
    blocks, inline, text = _shown(PROMPT)
    assert blocks == BLOCKS and inline <= INLINE
    assert text == _typed(PROMPT)


def test_a_prompt_that_starts_indented_keeps_its_indent():
    blocks, inline, text = _shown("    indented first\n  second")
    assert blocks == BLOCKS and inline <= INLINE and text == "    indented first\n  second"


def test_the_export_keeps_prompts_literal_and_replies_markdown():
    chat = Conversation(None, "Markup", ChatSettings(system="# Be **brief**."), messages=[
        ChatMessage("user", PROMPT), ChatMessage("assistant", "# A heading\n\n**bold**")])
    tokens = MarkdownIt("gfm-like").parse(to_markdown(chat))
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["Markup", "System", "You", "Assistant", "A heading"]  # the prompt fakes no turn
    strong = [c.type for t in tokens for c in t.children or () if c.type == "strong_open"]
    assert strong == ["strong_open"]  # the reply's bold, not the system prompt's


def test_a_url_in_a_prompt_stays_as_typed_and_links_there():
    """QA: https://example.com/a_b_c?q=1&r=2 was exported as a\\_b\\_c: GFM viewers link a bare URL as it stands, so
    the backslashes showed in its text and broke its address."""
    urls = ["https://example.com/a_b_c?q=1&r=2", "https://en.wikipedia.org/wiki/Foo_(bar)", "www.x.com/a_b"]
    prompt = f"see {urls[0]} and *this*\n{urls[1]}\nor {urls[2]} [x]"
    blocks, inline, text = _shown(prompt)
    assert blocks == BLOCKS and inline <= INLINE and text == prompt
    chat = Conversation(None, "Links", messages=[ChatMessage("user", prompt), ChatMessage("assistant", "ok")])
    links = [c.attrs["href"] for t in MarkdownIt("gfm-like").parse(to_markdown(chat)) for c in t.children or ()
             if c.type == "link_open"]
    assert links == [urls[0], urls[1], "http://" + urls[2]]


def test_a_first_line_keeps_its_indent_without_an_invisible_character():
    """An export wrote a word joiner (U+2060) before a first line's indent, as markdown-it strips a paragraph's
    leading whitespace (no-break spaces too): a viewer showed it, or copied it with the text. Its first no-break space
    is written as an entity instead (decoded after the strip); only there, and other Unicode spaces are kept too."""
    for prompt in ("    indented first\n  second", "\u3000full-width indent", "\u00a0typed no-break space"):
        chat = Conversation(None, "Indent", messages=[ChatMessage("user", prompt), ChatMessage("assistant", "ok")])
        exported = to_markdown(chat)
        assert WORD_JOINER not in exported and exported.count("&") == 1, prompt
        assert _shown(prompt)[2] == prompt.replace(NBSP, " "), prompt
    chat = Conversation(None, "Indent", messages=[ChatMessage("user", "first\n    second")])
    assert "&" not in to_markdown(chat) and _shown("first\n    second")[2] == "first\n    second"


def _links(prompt: str) -> list[str]:
    """The addresses a parser links in `prompt`'s export."""
    chat = Conversation(None, "Links", messages=[ChatMessage("user", prompt), ChatMessage("assistant", "ok")])
    return [c.attrs["href"] for t in MarkdownIt("gfm-like").parse(to_markdown(chat)) for c in t.children or ()
            if c.type == "link_open"]


URL_CASES = {  # a prompt: the addresses linkify links in it (a URL ends where linkify-it ends it, as typed raw)
    "https://x.com/path)**bold**": ["https://x.com/path"],  # QA: the rest of the line was written raw: bold
    "auto http://a.com/<x>": ["http://a.com/"],  # QA: "\<" after it: the backslash read into the URL, <x> HTML
    "see https://a.com/x_y. Or https://b.com/z, then! https://c.com/q?": [
        "https://a.com/x_y", "https://b.com/z", "https://c.com/q"],  # trailing punctuation is no part of it
    "(https://en.wikipedia.org/wiki/Foo_(bar)) [https://a.com/b] {https://a.com/c}": [
        "https://en.wikipedia.org/wiki/Foo_(bar)", "https://a.com/b", "https://a.com/c"],
    '<https://a.com/x> and https://b.com/<i>y</i> "https://c.com/d"': [
        "https://a.com/x", "https://b.com/", "https://c.com/d"],
    "**https://a.com/x** and *http://b.com/*y*": ["https://a.com/x", "http://b.com/*y"],  # ("*"s end it: emphasis)
    "https://a.com/1 https://b.com/2_2 www.c.com/3_3 me_too@d.com https://e.com/~5~": [
        "https://a.com/1", "https://b.com/2_2", "http://www.c.com/3_3", "mailto:me_too@d.com", "https://e.com/~5~"],
    "-https://a.com/a_b<i>\n1.http://a.com/c_d<i>\n_http://a.com/e_f<i>": [  # after an escape a scheme starts one
        "https://a.com/a_b", "http://a.com/c_d", "http://a.com/e_f"],
    "at the end https://a.com/path_": ["https://a.com/path_"],
    "at the end https://a.com/x**": ["https://a.com/x"],
}


def test_a_url_ends_where_linkify_ends_it_and_the_rest_is_escaped():
    """QA: a URL was kept raw up to the next space, so markup after its end took effect ("https://x.com/path)**bold**"
    bold), and a backslash escaping the character after it was read into it ("http://a.com/\\<x>": shown, and <x>
    raw HTML). Each prompt shows as typed, and links what linkify links in it as typed."""
    for prompt, links in URL_CASES.items():
        blocks, inline, text = _shown(prompt)
        assert blocks == BLOCKS and inline <= INLINE and text == prompt, prompt
        assert _links(prompt) == links, prompt
    for prompt in ("www.a.com/*b* c", "www.a.com/*b http://c.com www.d.com/e*", "x&amp;y@a.com"):  # markup in one:
        blocks, inline, text = _shown(prompt)  # escaped, as the text around it (its link ends at the first escape)
        assert blocks == BLOCKS and inline <= INLINE and text == prompt, prompt


def test_a_prompts_nul_vertical_tab_and_form_feed_show_as_control_pictures():
    """A prompt that started with a vertical tab or a form feed lost them (a paragraph's leading whitespace), and
    NUL became U+FFFD: each shows as its control picture, wherever it is."""
    blocks, inline, text = _shown("\x0b\x0cfeeds\x0b and \x00 NUL\nline\x0c")
    assert blocks == BLOCKS and inline <= INLINE
    assert text == "\u240b\u240cfeeds\u240b and \u2400 NUL\nline\u240c"
