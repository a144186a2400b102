"""Slash commands against the fake engine: parsing and completion, /enter and the keys it names, /clear's title;
bad input is one notification and the line stays in the prompt, shown as typed."""

from __future__ import annotations

import pytest

from ssd_chat.setting_words import SLASH, fanout_counts
from ssd_chat.tui.commands import (
    SlashCommand,
    SlashError,
    as_typed,
    complete,
    completions,
    parse_slash,
    prompt_text,
)
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


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
    assert [c.name for c in completions("/c")] == ["clear", "chats", "continue", "compare", "colors", "copy"]
    assert complete("/co") is None and complete("/com") == "/compare " and complete("/ch") == "/chats "
    assert complete("/r") == "/re" and complete("/re") is None and complete("hello") is None
    assert fanout_counts(SLASH, "") is None and fanout_counts(SLASH, "1, 2") == (1, 2)


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
        for binding in app.BINDINGS:  # each key with its whole action, not the footer's one word ("Esc: Stop")
            assert binding.tooltip and f" | {binding.tooltip} |" in help_text, binding.key
        assert "| Esc | stop the reply or the compare (the partial text stays);" in help_text
        assert "- **tau** (vLLM's and llama.cpp's mean acceptance length): tokens per target step" in help_text
        await pilot.press("escape")

        for bad in ("/enter", "/enter sideways"):
            area.text = bad
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert "/enter takes send or newline" in errors(app)[-1] and area.text == bad
            assert bad == "/enter" or errors(app)[-1].endswith("; got 'sideways'")
        area.text = "/enter SEND"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Enter sends" in str(area.placeholder)
        await send(app, pilot, "third")  # Enter sends again
        assert engine.calls[-1][0][-1]["content"] == "third" and area.text == ""


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
