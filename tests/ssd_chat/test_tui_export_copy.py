"""The commands that take a chat out of the app, against the fake engine: /export (a Markdown file) and /copy (the
clipboard), with /clear and /help on the way."""

from __future__ import annotations

import pytest
from textual.widgets._markdown import MarkdownTableContent

from ssd_chat.reply_settings import ReplySettings
from ssd_chat.tui.commands import SLASH_COMMANDS
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.transcript import AssistantMessage
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, send, settle, wait_for

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
        # a prompt as the chat shows it, plain text (its Markdown escaped), so the title it gave; the reply: Markdown
        assert text.startswith("# What is \\*\\*SSD\\*\\*?\n") and "## You\n\nWhat is \\*\\*SSD\\*\\*?" in text
        assert "## Assistant\n\nHello from the **fake** engine." in text
        assert "| turn | mode | settings | tokens | decode tok/s |" in text
        assert f"| 1 | sd | {ReplySettings.of(app.session.settings).text()} | 6 | 100.0 | 50 | 2.50 | 38% |" in text
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
        assert "/copy takes nothing or code; got 'everything'" in errors(app)[-1]


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
async def test_the_palette_exports_plain_text_too(tmp_path):
    """Ctrl+P offered the Markdown export only; /export FILE.txt wrote plain text, which the palette now does too:
    a new .txt file named from the title in the export folder, beside the .md one."""
    from ssd_chat.tui.export_text import to_text

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is **SSD**?")
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        for title in ("Export to Markdown", "Export to plain text", "Export to plain text"):
            commands[title].callback()
            await pilot.pause()
        assert not errors(app)
        text = (tmp_path / "what-is-ssd.txt").read_text()
        assert text == to_text(app.session.conversation, app.drafted_k()) and text.startswith("What is **SSD**?\n")
        assert (tmp_path / "what-is-ssd.md").read_text().startswith("# What is \\*\\*SSD")
        assert (tmp_path / "what-is-ssd-2.txt").read_text() == text  # (an earlier export is kept)


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
