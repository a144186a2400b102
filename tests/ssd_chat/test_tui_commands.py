"""Modes and slash commands against the fake engine: key, palette and /mode; /k /fanout /temp /system
/clear /export /help; completion; bad input is one notification and the line stays in the prompt."""

from __future__ import annotations

import pytest

from engine.config import SpeculationConfig
from ssd_chat.tui.commands import (
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
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

SIZE = (120, 40)


def _first_command(app) -> str:
    found = app.screen.query("CommandList")
    if not found or not found.first().option_count:
        return ""
    prompt = found.first().get_option_at_index(0).prompt
    return getattr(prompt, "plain", str(prompt))


def _errors(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


@pytest.mark.asyncio
async def test_the_run_options_hold_for_every_reply_and_mode(tmp_path):
    engine = FakeEngine()
    run = SpeculationConfig(mode="sd", backup="fast", adaptive_k=False, lookup=False)  # --backup fast --fixed-k ...
    app = make_app(engine, tmp_path, speculation=run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ssd" and engine.speculation.backup == "fast"
        await send(app, pilot, "/k 2")
        await send(app, pilot, "again")
        assert engine.speculation.k == 2 and engine.speculation.backup == "fast"
        assert engine.speculation.adaptive_k is False and engine.speculation.lookup is False


@pytest.mark.asyncio
async def test_modes_switch_by_key_palette_and_slash(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "sd"
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ssd"
        assert "SSD" in rendered(app.query_one("#status"))
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ssd"  # the engine decoded in the new mode
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ar"

        await send(app, pilot, "/mode sd")
        assert app.session.settings.mode == "sd"
        await send(app, pilot, "/mode turbo")
        assert app.session.settings.mode == "sd" and "unknown mode 'turbo'" in _errors(app)[-1]
        assert app.query_one(PromptArea).text == "/mode turbo"  # kept for fixing

        await pilot.press("ctrl+p")
        await pilot.pause()
        await type_text(pilot, "Mode SSD")
        await wait_for(pilot, lambda: "Mode: SSD" in _first_command(app),
                       what="palette match")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.settings.mode == "ssd", what="palette mode switch")
        await send(app, pilot, "again")
        assert engine.calls[-1][2] == "ssd"


@pytest.mark.asyncio
async def test_without_a_draft_only_ar_is_available(tmp_path):
    engine = FakeEngine(draft=None)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.session.settings.mode == "ar"
        await pilot.press("ctrl+g")
        assert app.session.settings.mode == "ar"
        await send(app, pilot, "/mode ssd")
        assert "needs a draft model" in _errors(app)[-1]
        assert "no reply yet" in rendered(app.query_one("#spec"))  # no mode before the chat's first reply
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ar"
        assert "AR: no drafts" in rendered(app.query_one("#spec"))


@pytest.mark.asyncio
async def test_k_fanout_temp_and_system_reach_the_next_request(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/k 3")
        await send(app, pilot, "/fanout 1,2,2,1")
        await send(app, pilot, "/temp 0.5")
        await send(app, pilot, "/system You are terse.")
        await send(app, pilot, "hi")
        messages, params, mode = engine.calls[-1]
        assert messages[0] == {"role": "system", "content": "You are terse."}
        assert params.temperature == 0.5
        assert engine.speculation.k == 3 and engine.speculation.fanout == (1, 2, 2, 1) and mode == "ssd"
        assert "k 3 · fan-out 1,2,2,1" in rendered(app.query_one("#layout"))
        assert "system You are terse." in rendered(app.query_one("#layout"))

        for bad, message in [("/k 0", "between 1 and 32"), ("/k many", "needs a number"),
                             ("/fanout 1,2", "k+1 = 4"), ("/temp -1", "temperature must be"),
                             ("/frobnicate", "unknown command /frobnicate"), ("/k", "/k takes the most draft tokens "
                             "per step, 1-32 (now 3)"), ("/temp", "(now 0.5)"), ("/mode", "ar, sd or ssd (now ssd)")]:
            await send(app, pilot, bad)
            assert message in _errors(app)[-1], bad
        assert app.session.settings.k == 3 and app.session.settings.temperature == 0.5

        await send(app, pilot, "/system")
        assert "system prompt removed (it was: You are terse.)" in [n.message for n in app._notifications][-1]
        assert "system none" in rendered(app.query_one("#layout"))
        await send(app, pilot, "again")
        assert engine.calls[-1][0][0]["role"] == "user"
        await send(app, pilot, "/system")
        assert "no system prompt to remove" in [n.message for n in app._notifications][-1]


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
        assert "mine.md exists: /export! " in _errors(app)[-1]
        assert (tmp_path / "mine.md").read_text() == "my notes"
        assert app.query_one(PromptArea).text == f"/export {tmp_path / 'mine.md'}"
        await send(app, pilot, f"/export! {tmp_path / 'mine.md'}")  # ... unless the command says so
        assert (tmp_path / "mine.md").read_text() == text
        (tmp_path / "out dir").mkdir()
        await send(app, pilot, f'/export "{tmp_path / "out dir"}"')  # a folder, quoted: a named file in it
        assert (tmp_path / "out dir" / "what-is-ssd.md").read_text() == text
        await send(app, pilot, f"/export {tmp_path / 'new dir'}/")  # a folder that is not there: no file by its name
        assert "no folder" in _errors(app)[-1] and not (tmp_path / "new dir").exists()

        await send(app, pilot, "/clear")
        assert not app.query(AssistantMessage) and app.session.messages == []
        await send(app, pilot, "after")
        assert engine.calls[-1][0] == [{"role": "user", "content": "after"}]

        await send(app, pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        help_text = app.screen.query_one("Markdown").source
        for needle in ("/mode ar|sd|ssd", "/k N", "/fanout", "/temp T", "/system TEXT", "/clear", "/export",
                       "Esc", "Ctrl+G", "Ctrl+R", "F5"):
            assert needle in help_text, needle
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_slash_completion_with_tab_and_hints(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "/fa")
        hints = app.query_one("#completions")
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
            assert "/enter takes send or newline" in _errors(app)[-1] and area.text == bad
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
        assert _errors(app)[-1] == "no reply to copy yet" and app.clipboard == ""
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
        assert "the last reply has no code block" in _errors(app)[-1] and app.clipboard == "x = 1\n\ny\n```"
        await send(app, pilot, "/copy everything")
        assert "/copy takes nothing or code" in _errors(app)[-1]


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
        assert "cannot write" in _errors(app)[-1] and app.is_running
        for bad in ("~nosuchuser_zz/x.md", "a" * 300):
            await send(app, pilot, f"/export {bad}")
            assert _errors(app)[-1].startswith("cannot export to "), bad
        assert app.is_running
