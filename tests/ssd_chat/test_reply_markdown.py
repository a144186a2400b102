"""The reply's Markdown widget: streamed in pieces it shows what the whole text shows, draws each closed block once,
and draws again only for a new width or theme (widgets/reply_markdown.py)."""

from __future__ import annotations

import random

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.selection import Selection

from ssd_chat.tui.widgets import line_view, reply_markdown
from ssd_chat.tui.widgets.markdown_parser import split_blocks
from ssd_chat.tui.widgets.reply_markdown import ReplyMarkdown

DOCS = [
    "# Title\n\nA paragraph with **bold** and `code`.\nIts second line.\n\n- one\n- two\n\n  still two\n\n"
    "1. first\n2. second\n\n> a quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    "```python\ndef f(x):\n\n    return x\n```\n\n"
    "Setext heading\n===\n\n---\nThe end.",
    "```\nx = 1\n```\nafter the fence\n\n```\nunclosed\n\nstill code",
    "1. a\n\n2. b\n\n3. c\n\n> q\n*>\n\n- x\n--\n- y\n\n12) twelve\n13) thirteen",
    "Plain words, no blocks but one, long enough to wrap over the narrow width the tests give it, twice at least.",
    "",
    # lists: items that go on lazily, nest, hold a fence or a second paragraph; numbers past 9 (their column widens),
    # numbers written alike; a marker or delimiter change starts a new list; an item that turns into a rule
    "Intro:\n\n7. **Seven**: a point long enough to wrap over the narrow width of the test's screen.\n"
    "   - a detail\n   - another\n8. eight\nlazy line\n9. nine\n\n   its second paragraph\n"
    "10. ten\n    ```python\n    x = 1\n\n    y = 2\n    ```\n11. eleven\n\nAfter the list.\n\n"
    "1. a\n1. b\n1. c\n\n- x\n- - -\n- y\n* z\n\n1) p\n2. q\n- \n-\n",
]


class Host(App):
    def __init__(self, width: int = 60) -> None:
        super().__init__()
        self.width = width

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield ReplyMarkdown(id="streamed")
            yield ReplyMarkdown(id="whole")


@pytest.mark.parametrize("doc", DOCS)
def test_split_blocks_gives_each_blocks_start_and_text(doc):
    blocks = split_blocks(doc)
    for start, text, items, _ in blocks:
        assert doc[start:].startswith(text)
        for at, item in items:
            assert text[at:].startswith(item)
        assert [item for _, item in items] == [item for _, item in sorted(items)]
    starts = [block.start for block in blocks]
    assert starts == sorted(set(starts))  # in order, none twice
    assert starts[:1] == ([len(doc) - len(doc.lstrip("\n"))] if doc.strip() else [])


@pytest.mark.asyncio
@pytest.mark.parametrize("doc", DOCS)
async def test_a_streamed_reply_shows_what_the_whole_text_shows(doc):
    """Appended in random pieces, the blocks and the drawn lines match one update with the whole text, at every
    step (each prefix as if given whole), and a fence's closing line closes it."""
    pieces = random.Random(len(doc)).choices(range(1, 9), k=len(doc))
    app = Host()
    async with app.run_test(size=(60, 200)) as pilot:
        streamed, whole = app.query_one("#streamed", ReplyMarkdown), app.query_one("#whole", ReplyMarkdown)
        at = 0
        for size in pieces:
            if at >= len(doc):
                break
            streamed.append(doc[at:at + size])
            at += size
            whole.update(doc[:at])
            await pilot.pause()
            assert streamed.blocks == whole.blocks, doc[:at]
            assert streamed.shown_lines() == whole.shown_lines()
        assert streamed.source == doc
        assert streamed.blocks == [block.text for block in split_blocks(doc)]


@pytest.mark.asyncio
async def test_a_reply_streamed_a_character_at_a_time_never_shows_a_block_cut_wrong():
    """A block is closed only once the next block's first line is whole: "1. a\n\n2" read "2" as a paragraph that
    closed the list, and "2. b" then showed as a second list until the reply ended. A list's item is a place the
    parse starts from only once its first line is whole ("- -" grows into "- - -", a rule, not an item)."""
    doc = ("1. a\n\n2. b\n\n3. c\n\n> q\n*>\n\n- x\n-\n-\n\n12) twelve\n13) thirteen\n\nend\n\n"
           "- x\n- - -\n- y\n- z\n* w\n\n8. h\n9. i\n10. j\nlazy\n11. k\n    ```\n    code\n    ```\n12. l\n\n"
           # an item that on its own would be a table (its marker a cell), the list then drawn whole
           "- x\n- a | b\n--|--\n\n1. x\n2. a | b\n   --|--\n   | 1 | 2\n3. c\n")
    streamed, _ = await _a_character_at_a_time(doc, (60, 200))
    assert streamed[:3] == [" 1 a", " 2 b", " 3 c"]  # one list


async def _a_character_at_a_time(doc: str, size: tuple[int, int]) -> tuple[list[str], list[tuple[str, str]]]:
    """`doc` appended a character at a time: at every step the lines and the links equal those of one update with
    the text so far. The last step's lines and links."""
    app = Host()
    async with app.run_test(size=size) as pilot:
        streamed, whole = app.query_one("#streamed", ReplyMarkdown), app.query_one("#whole", ReplyMarkdown)
        for at in range(len(doc)):
            streamed.append(doc[at])
            whole.update(doc[:at + 1])
            await pilot.pause()
            assert streamed.shown_lines() == whole.shown_lines(), doc[:at + 1]
            assert _links(streamed) == _links(whole), doc[:at + 1]
        return streamed.shown_lines(), _links(streamed)


@pytest.mark.asyncio
async def test_separators_other_than_newlines_are_spaces_and_link_references_reach_every_block():
    """`str.splitlines` breaks lines at \\x0c, \\x85, \\u2028, ...; the parser does not: the blocks' offsets slid, so
    text after a fence showed as code. A link reference defined in one block is used in any other."""
    app = Host()
    async with app.run_test(size=(60, 40)) as pilot:
        view = app.query_one("#whole", ReplyMarkdown)
        view.update("a\u2028b\x0cc\x85d\n```\ncode\n```\nafter")
        await pilot.pause()
        assert view.blocks == ["a b c d", "```\ncode\n```", "after"]
        assert view.shown_lines()[0] == "a b c d" and view.shown_lines()[-1] == "after"
        from textual.geometry import Offset

        assert view.get_selection(Selection(Offset(0, len(view.shown_lines()) - 1), None))[0] == "after"
        view.update("See [the docs].\n\nMore.\n\n[the docs]: https://example.com/d")
        await pilot.pause()
        assert view.shown_lines()[0] == "See the docs." and _links(view) == [("the docs", "https://example.com/d")]
        streamed = app.query_one("#streamed", ReplyMarkdown)
        for piece in ["See [the docs].\n\n", "More.\n\n[the docs]: https://", "example.com/d\n\nend"]:
            streamed.append(piece)
        await pilot.pause()
        assert _links(streamed) == [("the docs", "https://example.com/d")]  # drawn again once defined


def _links(view: ReplyMarkdown) -> list[tuple[str, str]]:
    """The drawn links: each one's text and the URL a click on it opens."""
    return [(text, style.meta["@click"].removeprefix("open_link(").removesuffix(")").strip("'"))
            for line in view._all_lines for text, style, _ in line if style is not None and "@click" in style.meta]


@pytest.mark.asyncio
@pytest.mark.parametrize("doc", [
    "[x]: http://a.example\n\nsee [x]\n\n[x]: http://b.example\n\nend [x]",  # a label's first definition is its
    "see [x]\n\n[x]: http://a b c\n\nend",  # valid while it streams ("http://a"), then not: it goes
    "- [y]: http://in.item\n- use [y]\n- more\n- [y]: http://later\n- last [y]\n\nsee [y] and [z]\n\n[z]: http://z",
])
async def test_streamed_links_open_what_the_whole_text_links_to(doc):
    """While a reply streams, its links go where one parse of the text so far sends them: the first definition of a
    label, in a closed block, an item of a list parsed from its last items on, or the open block (whose
    definitions may change as it grows)."""
    _, links = await _a_character_at_a_time(doc, (60, 60))
    assert links and all("later" not in href and "b.example" not in href for _, href in links)


@pytest.mark.asyncio
async def test_a_click_on_a_links_text_opens_its_url(monkeypatch):
    """A link shows its text, and a click on it opens the URL (the browser; a terminal that knows OSC 8 links
    can open it too); a click beside it opens nothing."""
    app = Host()
    async with app.run_test(size=(60, 40)) as pilot:
        opened: list[str] = []
        monkeypatch.setattr(app, "open_url", lambda url, **_: opened.append(url))
        view = app.query_one("#whole", ReplyMarkdown)
        view.update("Read [the guide](https://example.com/g?a='1') first.\n\n- or <https://example.com/b>")
        await pilot.pause()
        assert view.shown_lines()[0] == "Read the guide first."
        assert [segment.style.link for segment in view._all_lines[0] if segment.text == "the guide"] == [
            "https://example.com/g?a='1'"]
        await pilot.click(view, offset=(1, 0))
        await pilot.click(view, offset=(7, 0))
        await pilot.click(view, offset=(view.shown_lines()[2].index("https") + 3, 2))
        await pilot.pause()
        assert opened == ["https://example.com/g?a='1'", "https://example.com/b"]


@pytest.mark.asyncio
async def test_the_mouse_over_a_link_marks_all_of_it():
    """Textual marks, under the mouse, the pieces whose link id is the hovered piece's: every piece of a link (a
    bold word in it, the lines it wraps over) has one id, and another link's is another, and all of them are marked
    wherever the mouse is on it (each piece had its own id, so only the piece under the mouse was marked)."""
    app = Host()
    async with app.run_test(size=(40, 40)) as pilot:
        view = app.query_one("#whole", ReplyMarkdown)
        view.update("See [a **bold** link that goes on and on until it wraps](https://a.example) or [this "
                    "one](https://b.example).")
        await pilot.pause()
        ids: dict[str, set[str]] = {}
        for line in view._all_lines:
            for _, style, _ in line:
                if style is not None and style.link:
                    ids.setdefault(style.link, set()).add(style.link_id)
        assert len(ids["https://a.example"]) == len(ids["https://b.example"]) == 1
        assert ids["https://a.example"] != ids["https://b.example"]
        shown = view.shown_lines()
        for word in ("bold", "wraps"):  # a piece of the link, then one on its next line
            row = next(i for i, line in enumerate(shown) if word in line)
            await pilot.hover(view, offset=(shown[row].index(word) + 1, row))
            await pilot.pause()
            assert {view.highlight_link_id} == ids["https://a.example"]
            hover = view.link_style_hover.bgcolor  # (Textual's: a background)
            marked = {(text, style.bgcolor == hover) for strip in view.render_lines(Region(0, 0, 40, len(shown)))
                      for text, style, _ in strip if style is not None and style.link}
            assert {text for text, lit in marked if lit} == {
                "a ", "bold", " link that goes on and on ", "until it wraps"}, marked
        await pilot.hover(view, offset=(1, 0))  # plain text ("See"): nothing lit
        await pilot.pause()
        hover = view.link_style_hover.bgcolor
        assert not any(style.bgcolor == hover for strip in view.render_lines(Region(0, 0, 40, len(shown)))
                       for _, style, _ in strip if style is not None)


@pytest.mark.asyncio
async def test_each_closed_block_is_drawn_once_while_a_reply_streams(monkeypatch):
    """Never the whole reply per update: a block is drawn again only while it is the last (open) one."""
    drawn: list[str] = []
    original = ReplyMarkdown._draw

    def counting(self, block, key, **kwargs):
        drawn.append(block)
        return original(self, block, key, **kwargs)

    monkeypatch.setattr(ReplyMarkdown, "_draw", counting)
    paragraphs = [f"Paragraph {i} says something." for i in range(30)]
    app = Host()
    async with app.run_test(size=(60, 200)) as pilot:
        streamed = app.query_one("#streamed", ReplyMarkdown)
        for paragraph in paragraphs:
            for word in paragraph.split(" "):
                streamed.append(word + " ")
                await pilot.pause()
            streamed.append("\n\n")
        await pilot.pause()
        assert all(drawn.count(paragraph + " ") == 1 for paragraph in paragraphs)  # once whole, open or closed
        assert len(drawn) <= sum(len(paragraph.split(" ")) for paragraph in paragraphs)  # one block per update
        before = len(drawn)
        streamed.update(streamed.source)  # the reply's finish: parsed whole, nothing changed, nothing drawn again
        await pilot.pause()
        assert drawn[before:] == []  # (the open block's lines are kept too)
        streamed.update(streamed.source.replace("Paragraph 3 ", "Paragraph three "))
        await pilot.pause()
        redrawn = ["Paragraph three says something.", *paragraphs[4:-1]]  # (the open block's lines are kept)
        assert drawn[before:] == [paragraph + " " for paragraph in redrawn]
        assert streamed.shown_lines()[0] == "Paragraph 0 says something."


@pytest.mark.asyncio
async def test_a_streaming_list_is_parsed_and_drawn_an_item_at_a_time(monkeypatch):
    """A reply that is one long list (a model's "ten tips"): an update parses the list from its last items on and
    draws its last item, not the whole list; what it shows is the whole list's drawing at every step (numbers past
    9 widen the number column: the items are drawn again once then), and the finish draws nothing again."""
    items = [f"{n}. **Tip {n}**: a sentence long enough to wrap on the test's narrow screen.\n"
             f"{' ' * len(f'{n}. ')}- a detail of tip {n}\n" for n in range(1, 31)]
    doc = "Tips:\n\n" + "".join(items) + "\nDone."
    parsed: list[int] = []
    drawn: list[str] = []
    split, rich_lines = reply_markdown.split_blocks, ReplyMarkdown._rich_lines
    monkeypatch.setattr(reply_markdown, "split_blocks", lambda source, *a: parsed.append(len(source)) or split(
        source, *a))
    monkeypatch.setattr(ReplyMarkdown, "_rich_lines", lambda self, markup, *a: (
        self.id == "streamed" and drawn.append(markup)) or rich_lines(self, markup, *a))
    app = Host()
    async with app.run_test(size=(60, 300)) as pilot:
        streamed, whole = app.query_one("#streamed", ReplyMarkdown), app.query_one("#whole", ReplyMarkdown)
        for at in range(0, len(doc), 23):
            streamed.append(doc[at:at + 23])
            await pilot.pause()
            if at % 230 == 0:
                streamed_parses = len(parsed)
                whole.update(streamed.source)  # (parsed whole)
                del parsed[streamed_parses:]
                await pilot.pause()
                assert streamed.shown_lines() == whole.shown_lines()
        longest = max(len(item) for item in items)
        assert max(parsed[len(parsed) // 4:]) <= 2 * longest + 23  # from the last whole item on
        list_draws = [markup for markup in drawn if markup[:1].isdigit()]
        assert max(len(markup) for markup in list_draws) <= longest + 23  # never the whole list (an item's text
        # may hold the next one's first characters: "1" goes on its last line until "10. " shows it is an item)
        for item in items[:8] + items[9:-1]:  # (the closed items: once as the last whole item, once closed; those
            # before the tenth once more when the numbers widen)
            assert list_draws.count(item.rstrip("\n")) <= (3 if items.index(item) < 9 else 2), item
        whole.update(doc)
        await pilot.pause()
        assert streamed.shown_lines() == whole.shown_lines()
        numbered = [line for line in streamed.shown_lines() if "Tip " in line]
        assert numbered[0].startswith("  1 Tip 1: ") and numbered[-1].startswith(" 30 Tip 30: ")  # (2 digits)
        before = len(drawn)
        streamed.update(doc)  # the finish
        await pilot.pause()
        assert drawn[before:] == []


@pytest.mark.asyncio
async def test_a_streaming_reply_grows_room_lines_at_a_time_and_repaints_only_what_changed(monkeypatch):
    """While a reply streams its height is its lines rounded up to ROOM, so most appends need no layout (which
    repaints the whole screen): they repaint the lines that changed, and the screen shows every line as drawn; the
    finished reply takes its lines' height."""
    layouts: list[bool] = []
    refresh = ReplyMarkdown.refresh
    monkeypatch.setattr(ReplyMarkdown, "refresh", lambda self, *regions, **kwargs: (
        self.id == "streamed" and layouts.append(bool(kwargs.get("layout")))) or refresh(self, *regions, **kwargs))
    doc = DOCS[0] + "\n\n" + DOCS[2] + "\n\n" + DOCS[3] * 3
    app = Host()
    async with app.run_test(size=(60, 200)) as pilot:
        view = app.query_one("#streamed", ReplyMarkdown)
        await pilot.pause()
        grew = relaid = 0  # the appends that changed the lines' count, that asked for a layout
        for at in range(0, len(doc), 11):
            count = len(view.shown_lines())
            layouts.clear()
            view.append(doc[at:at + 11])
            await pilot.pause()
            lines = view.shown_lines()
            grew += len(lines) != count
            relaid += any(layouts)
            assert view.size.height == -(-len(lines) // line_view.ROOM) * line_view.ROOM
            screen = [strip.text.rstrip() for strip in app.screen._compositor.render_strips()][:view.size.height]
            assert screen == lines + [""] * (view.size.height - len(lines)), doc[:at + 11]
        assert 0 < relaid < grew / 2
        view.update(doc)  # the finish
        await pilot.pause()
        assert view.size.height == len(view.shown_lines())


@pytest.mark.asyncio
async def test_a_new_width_or_theme_draws_the_lines_again():
    doc = "A sentence long enough to wrap at forty columns but not at a hundred.\n\n```python\nx = 1\n```"
    app = Host()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one("#whole", ReplyMarkdown)
        view.update(doc)
        await pilot.pause()
        wide = view.shown_lines()
        colours = {segment.style.bgcolor for line in view._all_lines for segment in line if segment.style}
        await pilot.resize_terminal(40, 40)
        await pilot.pause()
        assert len(view.shown_lines()) > len(wide) and all(len(line) <= 40 for line in view.shown_lines())
        app.theme = "textual-light"
        await pilot.pause()
        view.render_lines(Region(0, 0, view.size.width, 1))  # (a paint draws for the theme it finds)
        light = {segment.style.bgcolor for line in view._all_lines for segment in line if segment.style}
        assert light != colours  # the code block's background follows the theme


@pytest.mark.asyncio
async def test_headings_sit_at_the_left_and_the_blank_lines_between_blocks_are_one():
    app = Host()
    async with app.run_test(size=(60, 40)) as pilot:
        view = app.query_one("#whole", ReplyMarkdown)
        view.update("# Title\n\n- a\n- b\n\n> quoted\n\nend")
        await pilot.pause()
        assert view.shown_lines() == ["Title", "", " • a", " • b", "", "▌ quoted", "", "end"]


@pytest.mark.asyncio
async def test_a_selection_gives_the_text_as_drawn():
    app = Host()
    async with app.run_test(size=(60, 40)) as pilot:
        view = app.query_one("#whole", ReplyMarkdown)
        view.update("first line\nsecond line\n\n- item")
        await pilot.pause()
        from textual.geometry import Offset

        text, ending = view.get_selection(Selection(Offset(6, 0), Offset(6, 1)))
        assert (text, ending) == ("line\nsecond", "\n")
        assert reply_markdown._empty(view._all_lines[2])


@pytest.mark.asyncio
async def test_the_ui_cost_script_measures_an_open_and_the_updates():
    """scripts/ui_update_cost.py (the README's figures) runs: a chat of two turns opens, a reply streams in it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "ui_update_cost.py"
    spec = importlib.util.spec_from_file_location("ui_update_cost", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    reply = script.reply_markdown(sections=1)
    assert reply.count("```") == 2 and "- item 4" in reply
    opened, mean, last = await script.measure(2, reply)
    assert opened > 0 and mean > 0 and last > 0
    assert script.reply_list(12).count("\n") == 35 and "\n    - a detail" in script.reply_list(12)  # (under "10. ")


@pytest.mark.asyncio
async def test_the_flush_cost_script_streams_a_reply_through_the_whole_app():
    """scripts/ui_flush_cost.py (the README's figures): the app streams a reply from the scripted engine, paced,
    and the pacer's updates are timed."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "ui_flush_cost.py"
    spec = importlib.util.spec_from_file_location("ui_flush_cost", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    costs, gaps = await script.measure(script.reply_markdown(sections=1), "sd", rate=200)
    assert costs and all(cost > 0 for cost in costs) and all(gap >= 0.1 - 2e-3 for gap in gaps)


def _program(lines: int) -> str:
    """Python with blank lines here and there (some at the edges of `open_fence.RUN`-line runs)."""
    body = [f"    total += {i}  # step {i}" if i % 7 else "" for i in range(lines)]
    return "Here:\n\n```python\ndef f():\n    total = 0\n" + "\n".join(body) + "\n    return total\n```\n\nDone."


@pytest.mark.asyncio
async def test_a_long_code_block_streams_in_runs_and_ends_drawn_whole(monkeypatch):
    """An open code block's whole runs of lines are drawn once; what shows is what the whole text shows at every
    step; the finished reply's block is Rich's own drawing of it (colours included)."""
    from ssd_chat.tui.widgets import open_fence

    drawn: list[int] = []
    original = open_fence._draw

    def counting(console, options, code, *args, **kwargs):
        drawn.append(code.count("\n") + 1)
        return original(console, options, code, *args, **kwargs)

    monkeypatch.setattr(open_fence, "_draw", counting)
    monkeypatch.setattr(open_fence, "RUN", 8)  # (short runs: a short program has several)
    doc = _program(3 * open_fence.RUN + 5)
    pieces = random.Random(7).choices(range(3, 30), k=len(doc))
    app = Host()
    async with app.run_test(size=(70, 300)) as pilot:
        streamed, whole = app.query_one("#streamed", ReplyMarkdown), app.query_one("#whole", ReplyMarkdown)
        at, updates = 0, 0
        for size in pieces:
            if at >= len(doc):
                break
            streamed.append(doc[at:at + size])
            at, updates = at + size, updates + 1
            whole.update(doc[:at])
            await pilot.pause()
            assert streamed.shown_lines() == whole.shown_lines(), doc[:at]
        lines = doc.count("\n")
        assert sum(drawn) <= lines + updates * open_fence.RUN  # each whole run once, then the last run per update
        assert drawn and max(drawn) <= open_fence.RUN + 1
        cut = doc.index("    return total")  # a reply cut inside the block: the open block, finished, is drawn whole
        streamed.update(doc[:cut])
        whole.update(doc[:cut])
        await pilot.pause()
        assert [list(line) for line in streamed._all_lines] == [list(line) for line in whole._all_lines]


def test_only_a_code_block_at_the_margin_with_no_closing_fence_is_open():
    from ssd_chat.tui.widgets.open_fence import open_fence_code

    assert open_fence_code("```python\nx = 1\ny") == ("python", "x = 1\ny")
    assert open_fence_code("~~~\nx") == ("text", "x")
    assert open_fence_code("```c\nx;\n    ") == ("c", "x;\n    ")  # (the parser drops a last line of spaces)
    assert open_fence_code("```python\nx = 1\n```") is None
    assert open_fence_code("  ```\nx") is None  # (indented: its lines are not the code as written)
    assert open_fence_code("para\n```\nx") is None
