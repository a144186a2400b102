"""The Markdown export (/export FILE.md), without a UI: the turns and a stats table, code fences a cut reply left
open closed, code blocks as /copy code takes them, and a reply's lines as the chat app shows them."""

from __future__ import annotations

from ssd_chat.history import ChatMessage, ChatSettings, Conversation, TurnStats
from ssd_chat.tui.export import code_blocks, export_path, to_markdown
from tests.ssd_chat.tea_chat import STATS, tea_chat


def test_markdown_export_has_the_turns_and_a_stats_table(tmp_path):
    text = to_markdown(tea_chat())
    assert text.startswith("# Tea\n\nMode `ssd`, k 3, fan-out 1,2,2,1, temperature 0, max tokens 64 (the chat's "
                           "settings when exported")
    assert "## System\n\nBe brief." in text
    assert "## You\n\nWrite a haiku about tea." in text
    assert "```python\nprint('tea')\n```" in text
    assert "| 1 | ssd |  | 12 | 41.2 | 81 | 2.75 | 50% | 80% | 16/30 | stop |" in text  # (no settings kept)
    nucleus = Conversation(None, "Tea", settings=ChatSettings(temperature=0.2, top_p=0.9, top_k=20))
    assert "temperature 0.2, top-p 0.9, top-k 20, max tokens 512 (" in to_markdown(nucleus)
    stopped = ChatMessage("assistant", "", TurnStats("sd", 0.0, 11.162, 0, 4478, 48, "cancelled"))  # (earlier versions)
    assert "| 1 | sd |  | 0 | 0.0 | – |" in to_markdown(Conversation(None, "Stopped", messages=[stopped]))
    assert export_path(tea_chat(), tmp_path) == tmp_path / "tea.md"
    (tmp_path / "tea.md").write_text("x")
    assert export_path(tea_chat(), tmp_path) == tmp_path / "tea-2.md"


def test_the_export_closes_a_code_fence_a_cut_reply_left_open():
    """A reply cut by the length limit inside a code block: the rest of the document read as code."""
    from ssd_chat.tui.export import closed_fences

    cut = "Here:\n\n```python\nclass Account:\n    def deposit(self, amount):\n        if amount <="
    assert closed_fences(cut) == cut + "\n```"
    assert closed_fences("```\ncode\n```\ntext") == "```\ncode\n```\ntext"  # closed: as it was
    assert closed_fences("~~~~\na\n```\nb\n") == "~~~~\na\n```\nb\n~~~~"  # only its own marker closes it
    assert closed_fences("````\n```\n````") == "````\n```\n````"
    assert closed_fences("no code") == "no code"
    conversation = Conversation(None, "Cut", ChatSettings(), [ChatMessage("user", "code please"),
                                                               ChatMessage("assistant", cut)])
    from ssd_chat.tui.export import to_markdown

    assert to_markdown(conversation).count("```") == 2


def test_code_blocks_are_the_fenced_blocks_contents_with_a_cut_one_to_the_end():
    assert code_blocks("a\n```py\nx = 1\n```\nb\n~~~\ny\n```\n~~~") == ["x = 1", "y\n```"]
    assert code_blocks("```\n```") == [""] and code_blocks("text ``` inline") == []
    assert code_blocks("go:\n````\nfn()\n```\nmore") == ["fn()\n```\nmore"]  # cut: runs to the end
    assert code_blocks("| a | b |\n|---|---|\n| 1 | 2 |\n    code here\n") == ["code here"]  # as the transcript: GFM


def test_code_blocks_in_list_items_and_quotes_come_without_their_indent():
    """A numbered answer indents its code under each step (4 spaces is common): `/copy code` found no code block
    in it, and one indented 3 spaces came with the indent, which Python refuses."""
    steps = ("1. Install:\n\n    ```bash\n    pip install x\n    ```\n\n"
             "2. Run:\n   ```python\n   if x:\n       go()\n   ```\n")
    assert code_blocks(steps) == ["pip install x", "if x:\n    go()"]
    assert code_blocks("> ```\n> quoted\n> ```") == ["quoted"]
    assert code_blocks("text\n\n    indented = 1\n") == ["indented = 1"]  # shown as code, copied as code


def test_the_export_closes_a_cut_fence_inside_a_list_item_where_it_was_opened():
    """A ``` at column 0 after a cut list item's fence opened a new block: the stats table read as code."""
    from ssd_chat.tui.export import closed_fences, to_markdown

    cut = "Steps:\n\n1. Install:\n   ```bash\n   pip install"
    assert closed_fences(cut) == cut + "\n   ```"
    assert closed_fences("> ```py\n> x = 1") == "> ```py\n> x = 1\n> ```"
    for still_open in ("```md\n> ```", "```md\n    ```", "a\x0cb\n```py\nx = 1", "a\u2028b\n```py\nx = 1"):
        assert closed_fences(still_open) == still_open + "\n```", still_open  # (no closing line; other line breaks)
    conversation = Conversation(None, "Cut", ChatSettings(), [ChatMessage("user", "how?"),
                                                               ChatMessage("assistant", cut, STATS)])
    assert code_blocks(to_markdown(conversation)) == ["pip install"]


def test_the_export_keeps_a_replys_lines_as_the_chat_app_shows_them():
    """A poem's single newlines are soft breaks to other Markdown viewers, which join its lines: each line a
    paragraph goes on after ends in two spaces; code, lists, tables and an explicit break stay as written."""
    from markdown_it import MarkdownIt

    rest = "\n\n```\ncode\nline\n```\n- a\n- b\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    poem = "In the depths,\nA world\nof wonder." + rest
    chat = Conversation(None, "Sea", messages=[ChatMessage("user", "a poem"), ChatMessage("assistant", poem)])
    text = to_markdown(chat)
    assert "In the depths,  \nA world  \nof wonder." + rest in text
    breaks = [c.type for t in MarkdownIt("gfm-like").parse(text) for c in (t.children or []) if "break" in c.type]
    assert breaks == ["hardbreak", "hardbreak"]


def test_a_tab_indented_line_after_a_list_item_is_exported_where_the_chat_app_shows_it():
    """A QA pass read "- item" then a tab-indented line as two blocks in the chat and one in the export. The chat
    app shows it in the item too (CommonMark: a tab is 4 columns, past the item's 2): the export, read by a plain
    GFM parser, gives the transcript's HTML."""
    from markdown_it import MarkdownIt

    from ssd_chat.tui.widgets.markdown_parser import parser

    for reply in ("- item\n\tcode line", "- item\n\n\tcode line", "- item\n\n\t\tx = 1", "1. one\n\tfoo()\n2. two"):
        chat = Conversation(None, "Tabs", messages=[ChatMessage("user", "q"), ChatMessage("assistant", reply)])
        exported = to_markdown(chat).split("## Assistant\n\n")[1]
        assert MarkdownIt("gfm-like").render(exported) == parser().render(reply), reply
