"""Slash commands against the fake engine: /clear /export /copy /help /enter, parsing and completion; bad input is
one notification and the line stays in the prompt, shown as typed."""

from __future__ import annotations

import pytest
from textual.widgets._markdown import MarkdownTableContent

from ssd_chat.tui.commands import (
    SLASH_COMMANDS,
    SlashCommand,
    SlashError,
    as_typed,
    complete,
    completions,
    parse_fanout,
    parse_slash,
    prompt_text,
)
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import AssistantMessage
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


@pytest.mark.asyncio
async def test_clear_export_and_help(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is **SSD**?")
        await send(app, pilot, "/export")
        exported = tmp_path / "what-is-ssd.md"
        text = exported.read_text()
        assert "## You\n\nWhat is **SSD**?" in text
        assert "## Assistant\n\nHello from the **fake** engine." in text
        assert "| turn | mode | tokens | decode tok/s |" in text
        assert "| 1 | sd | 6 | 100.0 | 50 | 2.50 | 38% |" in text
        await send(app, pilot, f"/export {tmp_path / 'mine.md'}")
        assert (tmp_path / "mine.md").read_text() == text
        (tmp_path / "mine.md").write_text("my notes")
        await send(app, pilot, f"/export {tmp_path / 'mine.md'}")  # an existing FILE is kept ...
        assert "mine.md exists: /export! " in errors(app)[-1]
        assert (tmp_path / "mine.md").read_text() == "my notes"
        assert app.query_one(PromptArea).text == f"/export {tmp_path / 'mine.md'}"
        await send(app, pilot, f"/export! {tmp_path / 'mine.md'}")  # ... unless the command says so
        assert (tmp_path / "mine.md").read_text() == text
        (tmp_path / "out dir").mkdir()
        await send(app, pilot, f'/export "{tmp_path / "out dir"}"')  # a folder, quoted: a named file in it
        assert (tmp_path / "out dir" / "what-is-ssd.md").read_text() == text
        await send(app, pilot, f"/export {tmp_path / 'new dir'}/")  # a folder that is not there: no file by its name
        assert "no folder" in errors(app)[-1] and not (tmp_path / "new dir").exists()

        await send(app, pilot, "/clear")
        assert not app.query(AssistantMessage) and app.session.messages == []
        await send(app, pilot, "after")
        assert engine.calls[-1][0] == [{"role": "user", "content": "after"}]

        await send(app, pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        help_text = app.screen.query_one("Markdown").source
        for needle in ("/k N", "/fanout", "/temp T", "/system TEXT", "/clear", "/export", "Esc", "Ctrl+G", "Ctrl+R",
                       "F5"):
            assert needle in help_text, needle
        await wait_for(pilot, lambda: len(app.screen.query(MarkdownTableContent)) == 2, what="the tables")
        commands = app.screen.query(MarkdownTableContent).last()  # a | in a usage ("/mode ar|sd|ssd") split its cell
        assert [[cell.plain for cell in row] for row in commands.rows] == [[c.usage, c.help] for c in SLASH_COMMANDS]
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_slash_completion_with_tab_and_hints(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "/c")
        hints = app.query_one("#completions")

        def shown() -> str:  # as on the screen (read as markup, "[TEXT]" was lost)
            return hints.render().plain

        assert shown().startswith("/clear clear this conversation's turns   /chats [TEXT] open, search")
        await pilot.press("o", "p")
        assert shown() == "/copy [code] copy the last reply (code: its code blocks) to the clipboard"
        app.query_one(PromptArea).text = "/e"
        await pilot.pause()
        assert "/export[!] [FILE] write this chat" in shown()
        app.query_one(PromptArea).text = ""
        await type_text(pilot, "/fa")
        assert hints.display and "/fanout" in rendered(hints)
        await pilot.press("tab")
        assert app.query_one(PromptArea).text == "/fanout "
        await type_text(pilot, "2")
        assert not hints.display
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.settings.fanout == (2,)


@pytest.mark.asyncio
async def test_notifications_show_brackets_as_typed(tmp_path):
    """A notification that quotes what was typed or named (a command's value, a chat's title) shows it as it is:
    read as markup, "/temp [/]" crashed the app (and "[red]" lost its brackets)."""
    from ssd_chat.tui.screens.chats import ChatsScreen

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/temp [/]")
        await send(app, pilot, "[red]hi[/]")  # the chat's title
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatsScreen), what="the picker")
        await pilot.press("d")
        await pilot.pause()
        toasts = [str(toast.render()) for toast in app.screen.query("Toast")]
        assert any("got '[/]'" in t for t in toasts) and any("“[red]hi[/]”" in t for t in toasts)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatsScreen), what="the chat")
        await pilot.press("ctrl+c")  # Textual's hint keeps its bold
        await pilot.pause()
        assert "Press Ctrl+Q to quit the app" in [str(toast.render()).splitlines()[-1]
                                                   for toast in app.screen.query("Toast")]


def test_slash_parsing():
    assert parse_slash("/mode  ssd ").arg == "ssd"
    assert parse_slash("/TEMP 0").name == "temp"
    assert parse_slash("/system\nBe terse.\nUse lists.").arg == "Be terse.\nUse lists."  # Ctrl+J right after
    with pytest.raises(SlashError, match=r"unknown command / "):
        parse_slash("/")
    with pytest.raises(SlashError, match=r"did you mean /mode"):
        parse_slash("/mod ssd")
    assert parse_slash("/export! a.md") == SlashCommand("export", "a.md", force=True)
    for typed in ("//etc", "  //etc\n  x", "///x", "plain / text"):  # as_typed undoes what sending takes off
        assert as_typed(prompt_text(typed)) == typed
    assert parse_slash("/export a.md").force is False
    with pytest.raises(SlashError, match=r"/mode takes no !"):
        parse_slash("/mode! ssd")
    assert [c.name for c in completions("/c")] == ["clear", "chats", "compare", "colors", "copy"]
    assert complete("/co") is None and complete("/com") == "/compare " and complete("/ch") == "/chats "
    assert complete("/r") == "/re" and complete("/re") is None and complete("hello") is None
    assert parse_fanout("") is None and parse_fanout("1, 2") == (1, 2)


@pytest.mark.asyncio
async def test_f4_names_the_key_that_sends_the_edit(tmp_path):
    """With Enter a new line, F4 said "Enter sends it in place of the last turn": Enter broke the line."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path, enter_sends=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "first")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.busy and len(engine.calls) == 1, what="the reply")
        await pilot.press("f4")
        assert "Ctrl+S sends it in place of the last turn" in [n.message for n in app._notifications][-1]
        await pilot.press("escape")
        app.query_one(PromptArea).text = "/enter send"
        await pilot.press("ctrl+s")
        await pilot.press("f4")
        assert "Enter sends it in place of the last turn" in [n.message for n in app._notifications][-1]


@pytest.mark.asyncio
async def test_enter_newline_breaks_the_line_and_ctrl_s_sends_and_slash_enter_switches_back(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path, enter_sends=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        assert "Ctrl+S sends" in str(area.placeholder)
        await type_text(pilot, "line one")
        await pilot.press("enter")
        await type_text(pilot, "line two")
        assert area.text == "line one\nline two" and not engine.calls
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.busy and len(engine.calls) == 1, what="the reply")
        assert engine.calls[-1][0][-1]["content"] == "line one\nline two"

        area.text = "/help"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        help_text = app.screen.query_one("Markdown").source
        assert "| Ctrl+S (Ctrl+Enter) | send the prompt |" in help_text  # the keys of this run's Enter mode
        assert "| Enter / Ctrl+J | new line" in help_text
        await pilot.press("escape")

        for bad in ("/enter", "/enter sideways"):
            area.text = bad
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert "/enter takes send or newline" in errors(app)[-1] and area.text == bad
        area.text = "/enter SEND"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Enter sends" in str(area.placeholder)
        await send(app, pilot, "third")  # Enter sends again
        assert engine.calls[-1][0][-1]["content"] == "third" and area.text == ""


@pytest.mark.asyncio
async def test_copy_puts_the_last_reply_or_its_code_blocks_on_the_clipboard(tmp_path, monkeypatch):
    from ssd_chat.tui import clipboard

    monkeypatch.setattr(clipboard, "local_tool", lambda env=None: None)  # the terminal's clipboard only
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/copy")
        assert errors(app)[-1] == "no reply to copy yet" and app.clipboard == ""
        await send(app, pilot, "first")
        engine.words = ["Two", " blocks", ":\n\n", "```python\n", "x = 1\n", "```\n", "and\n", "~~~~\n", "y\n",
                        "```\n", "~~~~\n"]
        await send(app, pilot, "second")
        await send(app, pilot, "/copy")
        assert app.clipboard == "".join(engine.words)
        await send(app, pilot, "/copy code")  # a ``` inside a ~~~~ block is its text, not a fence
        assert app.clipboard == "x = 1\n\ny\n```"
        assert [n.message for n in app._notifications][-1] == \
            "copied 2 code blocks (12 characters) through the terminal, where it allows OSC 52 writes"
        engine.words = ["No", " code", "."]
        await send(app, pilot, "third")
        await send(app, pilot, "/copy code")
        assert "the last reply has no code block" in errors(app)[-1] and app.clipboard == "x = 1\n\ny\n```"
        await send(app, pilot, "/copy everything")
        assert "/copy takes nothing or code" in errors(app)[-1]


@pytest.mark.asyncio
async def test_an_export_that_cannot_be_written_is_a_notification_from_the_palette_too(tmp_path):
    (tmp_path / "a file").write_text("")
    app = make_app(FakeEngine(), tmp_path)
    app.export_dir = tmp_path / "a file" / "sub"  # (no folder can be made there)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        export = next(c for c in app.get_system_commands(app.screen) if c.title == "Export to Markdown")
        export.callback()
        await pilot.pause()
        assert "cannot write" in errors(app)[-1] and app.is_running
        for bad in ("~nosuchuser_zz/x.md", "a" * 300):
            await send(app, pilot, f"/export {bad}")
            assert errors(app)[-1].startswith("cannot export to "), bad
        assert app.is_running


@pytest.mark.asyncio
async def test_clear_gives_the_chat_back_its_first_prompts_title(tmp_path):
    """/clear kept the first prompt's title (the status line and the picker showed it over other turns), where
    undoing every turn named the chat by its next prompt; a chosen title stays."""
    from ssd_chat.history import HistoryStore

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Bananas")
        await send(app, pilot, "/clear")
        assert app.session.conversation.title == "New chat" and "Bananas" not in rendered(app.query_one("#status"))
        await send(app, pilot, "Cherries")
        assert "Cherries" in rendered(app.query_one("#status"))
        assert [s.title for s in HistoryStore(tmp_path / "history.sqlite3").list()] == ["Cherries"]
        await send(app, pilot, "/rename Fruit")
        await send(app, pilot, "/clear")
        assert app.session.conversation.title == "Fruit"


@pytest.mark.asyncio
async def test_copy_while_a_reply_streams_copies_it_so_far(tmp_path, monkeypatch):
    """/copy copied the reply before the one on screen."""
    import threading

    from ssd_chat.tui import clipboard
    from tests.ssd_chat.tui_fakes import first_delta

    monkeypatch.setattr(clipboard, "local_tool", lambda env=None: None)
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        engine.words = ["Before", "."]
        await send(app, pilot, "first")
        engine.words, engine.gate = ["Hello", " again"], threading.Event()
        await first_delta(app, pilot, "second")
        app.submit("/copy")
        await pilot.pause()
        assert app.clipboard == "Hello"
        assert [n.message for n in app._notifications][-1].startswith("copied the reply so far (5 characters)")
        app.submit("/copy code")
        await pilot.pause()
        assert errors(app)[-1] == "the reply so far has no code block: /copy copies all of it"
        engine.gate.set()
        await settle(app, pilot)
        app.submit("/copy")
        assert app.clipboard == "Hello again"
