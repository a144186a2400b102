"""Slash commands' arguments: one given to a command that takes none (`/clear now`) is refused, and the line stays
in the input to fix, as does a command that must wait for the reply under way; a title is made one line."""

from __future__ import annotations

import threading

import pytest

from engine.errors import InvalidParameterError
from ssd_chat.setting_words import SLASH, fanout_counts
from ssd_chat.tui.commands import SLASH_COMMANDS, SlashError, parse_slash
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, errors, first_delta, make_app, rendered, send, settle

SIZE = (120, 40)


def test_commands_that_take_no_argument_refuse_one():
    bare = {c.name for c in SLASH_COMMANDS if not c.takes_argument}
    assert bare == {"clear", "new", "regen", "continue", "edit", "undo", "turns", "compare", "colors", "restart",
                    "help"}
    for name in bare:
        assert parse_slash(f"/{name}  ").arg == ""
        with pytest.raises(SlashError, match=rf"^/{name} takes no argument: send /{name} alone$"):
            parse_slash(f"/{name} now")
    with pytest.raises(SlashError, match="/undo takes no argument"):
        parse_slash("/undo\nmore")  # (a second line typed with Ctrl+J)
    assert parse_slash("/chats cats and dogs").arg == "cats and dogs"  # free text stays free
    assert fanout_counts(SLASH, " 1 , 2 ") == (1, 2)
    with pytest.raises(InvalidParameterError, match=r"/fanout takes whole numbers \(ASCII digits\) separated by "
                                                    r"commas, or none for the default; got '1 2'"):
        fanout_counts(SLASH, "1 2")  # (it was 12)
    assert parse_slash("/export my notes.md").arg == "my notes.md"


@pytest.mark.asyncio
async def test_an_argument_to_clear_or_undo_is_refused_and_stays_in_the_input(tmp_path):
    """`/clear now` cleared the chat (there is no undo) and `/undo extra` removed a turn."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        for typed in ("/clear now", "/undo extra"):
            await send(app, pilot, typed)
            name = typed.split()[0]
            assert errors(app)[-1] == f"{name} takes no argument: send {name} alone"
            assert app.query_one(PromptArea).text == typed
            assert [m.content for m in app.session.messages] == ["first", "Hello from the **fake** engine."]


@pytest.mark.asyncio
async def test_a_command_that_must_wait_for_the_reply_stays_in_the_input_as_a_prompt_does(tmp_path):
    """`/undo` mid-reply was refused ("a reply is running") and wiped from the input; a prompt refused so stays."""
    engine = FakeEngine(gate=threading.Event())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        area = app.query_one(PromptArea)
        for typed in ("/undo", "/regen", "/clear", "/new", "/edit", "/compare", "/chats cats", "/restart", "a prompt"):
            area.text = typed
            await pilot.press("enter")
            assert [n.message for n in app._notifications][-1] == "a reply is running: Esc stops it", typed
            assert area.text == typed
        area.text = "/temp 0.5"  # (a setting changes from the next reply: taken, and the input emptied)
        await pilot.press("enter")
        assert app.session.settings.temperature == 0.5 and area.text == ""
        engine.gate.set()
        await settle(app, pilot)
        assert [m.content for m in app.session.messages] == ["Hi", "Hello from the **fake** engine."]


@pytest.mark.asyncio
async def test_rename_makes_the_title_one_line(tmp_path):
    """A title typed over two lines (Ctrl+J) was stored so: the status line and the picker showed its first line,
    and the picker lost its search snippet."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await send(app, pilot, "/rename First line\n  Second\tline ")
        assert app.session.conversation.title == "First line Second line"
        assert app.session.store.load(app.session.conversation.id).title == "First line Second line"
        assert rendered(app.query_one("#status")).endswith("First line Second line")


@pytest.mark.asyncio
async def test_a_fanout_past_the_speculation_cache_is_refused_and_ssd_replies_go_on(tmp_path):
    """`/fanout 99999999999999999999` was taken (and saved with the chat), and every later SSD reply failed with
    "the engine failed: OverflowError" (the draft process's channel takes 64-bit numbers)."""
    from engine.config import MAX_FANOUT

    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/mode ssd")
        await send(app, pilot, "/fanout 2")
        for typed, shown in [("/fanout 99999999999999999999", "99999999999999999999"), (f"/fanout {MAX_FANOUT + 1}",
                             str(MAX_FANOUT + 1)), (f"/fanout 1,1,1,1,{MAX_FANOUT + 1}", str(MAX_FANOUT + 1))]:
            await send(app, pilot, typed)
            assert errors(app)[-1].startswith(f"/fanout takes counts from 0 to {MAX_FANOUT} (SSD's speculation cache")
            assert errors(app)[-1].endswith(f"got {shown}") and "\n" not in errors(app)[-1]
            assert app.query_one(PromptArea).text == typed and app.session.settings.fanout == (2,)
        await send(app, pilot, f"/fanout {MAX_FANOUT}")  # the limit itself is taken
        await send(app, pilot, "hi")
        assert engine.calls[-1][2] == "ssd" and engine.speculation.fanout == (MAX_FANOUT,)
        assert app.session.messages[-1].role == "assistant"


@pytest.mark.asyncio
async def test_keys_typed_in_the_same_burst_as_the_send_key_stay_in_the_input(tmp_path):
    """QA pass 10: `/temp 0.3`, Enter, `abc` sent at once applied /temp and lost "abc" (the keys after Enter reach the
    input before the app takes the line, which cleared it all); a prompt lost them too."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        area.text = "/temp 0.3abc"  # what the input holds when the app takes "/temp 0.3"
        app.submit("/temp 0.3")
        await pilot.pause()
        assert app.session.settings.temperature == 0.3 and area.text == "abc"
        area.text = "hinext question"
        app.submit("hi")
        await settle(app, pilot)
        assert engine.calls[-1][0][-1] == {"role": "user", "content": "hi"} and area.text == "next question"
        area.text = "/k 0more"  # refused: the line comes back to fix, and the keys after it on a line of their own
        app.submit("/k 0")
        await pilot.pause()
        assert "1-32; got 0" in errors(app)[-1] and area.text == "/k 0\nmore"


@pytest.mark.asyncio
async def test_a_title_that_looks_like_markup_is_shown_as_typed(tmp_path):
    """A first prompt "In vim, what does [/ do?" (the chat's title) crashed the app with a MarkupError and lost the
    prompt; `/rename [red]x[/` crashed it too, and again whenever that chat was opened: the status line read the
    title as Textual markup, which `[/` opens a closing tag in even escaped."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "In vim, what does [/ do?")
        assert rendered(app.query_one("#status")).endswith("In vim, what does [/ do?")
        assert app.session.messages[0].content == "In vim, what does [/ do?"
        for title in ("[red]x[/", "x[/", "a\\[/b] $title [b]bold[/b]"):
            await send(app, pilot, f"/rename {title}")
            assert rendered(app.query_one("#status")).endswith(title)
    reopened = make_app(FakeEngine(), tmp_path, resume=True)  # (the latest chat: this one)
    async with reopened.run_test(size=SIZE) as pilot:
        await settle(reopened, pilot)
        assert rendered(reopened.query_one("#status")).endswith("a\\[/b] $title [b]bold[/b]")
