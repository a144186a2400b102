"""The prompt and the lines around it against the fake engine: typing (new lines, pastes, Esc), recalling
earlier prompts, the `//` escape, the footer's keys and the status line."""

from __future__ import annotations

import threading

import pytest
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from ssd_chat.tui.app import KEYS
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, first_delta, make_app, rendered, send, settle, type_text

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)


async def test_a_pasted_block_keeps_its_first_line_indent(tmp_path):
    """Indented code pasted as the prompt: the blank lines around it go, its first line's indent stays (the
    whole prompt was stripped, so the first line lost its indent against the others)."""
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "\n  \n    if x:\n        return 1\n\n  ")
        assert engine.calls[-1][0][-1]["content"] == "    if x:\n        return 1"
        await send(app, pilot, "  //usr/bin is a path ")
        assert engine.calls[-1][0][-1]["content"] == "  /usr/bin is a path"


async def test_shift_enter_and_ctrl_j_insert_newlines(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await type_text(pilot, "one")
        await pilot.press("shift+enter")
        await type_text(pilot, "two")
        await pilot.press("ctrl+j")
        await type_text(pilot, "three")
        assert app.query_one(PromptArea).text == "one\ntwo\nthree"
        assert not engine.calls
        await pilot.press("enter")
        await settle(app, pilot)
        assert engine.calls[0][0][-1]["content"] == "one\ntwo\nthree"


def _footer_keys(app) -> list[str]:
    """The keys the footer shows whole (a key cut by the terminal's edge, or under the command palette's key docked
    on the right, is not shown)."""
    footer = app.query_one(Footer)
    palette = [k.region for k in footer.query(".-command-palette") if k.display and k.region.width]
    right = palette[0].x if palette else footer.region.right
    return [k.key for k in footer.query(FooterKey)
            if k.region.width and "-command-palette" not in k.classes and k.region.right <= right]


async def test_an_80_column_footer_shows_every_key_and_a_60_column_one_help_first(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        every = [b.key for b in KEYS]
        assert _footer_keys(app)[:len(every)] == every
        assert app.query_one(Footer).query_one(".-command-palette").display  # beside them
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert _footer_keys(app)[:len(every)] == every  # compact: nothing cut, not even under the palette's key
        await pilot.resize_terminal(60, 24)
        await pilot.pause()
        assert _footer_keys(app)[:2] == ["escape", "f1"]


async def test_the_status_line_stays_one_line_with_the_mode_and_state_first(tmp_path):
    """A long title, colours on and 40 columns: the line is cut with an ellipsis, never wrapped out of sight, and
    the mode and the reply's state are still on it."""
    gate = threading.Event()
    app = make_app(FakeEngine(gate=gate), tmp_path)
    async with app.run_test(size=(40, 12)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/rename " + "x" * 300)
        await pilot.press("ctrl+t")
        await first_delta(app, pilot)
        await pilot.pause()
        status = app.query_one("#status")
        line = status.render_line(0).text
        assert line.strip().startswith("SD · replying") and line.rstrip().endswith("…"), line
        assert status.region.height == 1
        gate.set()
        await settle(app, pilot)


async def test_esc_with_no_reply_clears_the_input_undoably(tmp_path):
    """A refused paste of thousands of lines came back into the input with no quick way to clear it."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        pasted = "line of a long paste\n" * 2000
        app.query_one(PromptArea).text = pasted
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one(PromptArea).text == ""
        await pilot.press("ctrl+z")
        await pilot.pause()
        assert app.query_one(PromptArea).text == pasted


async def test_the_status_line_shows_the_context_the_last_reply_left(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert "ctx 0/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "first")
        first = app.session.messages[-1].stats
        await send(app, pilot, "second, a longer prompt")
        second = app.session.messages[-1].stats
        assert second.prompt_tokens > first.prompt_tokens
        used = second.prompt_tokens + second.generated_tokens
        assert f"ctx {used:,}/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "/undo")
        assert f"ctx {first.prompt_tokens + first.generated_tokens:,}/100,000" in rendered(app.query_one("#status"))
        await send(app, pilot, "/new")
        assert "ctx 0/100,000" in rendered(app.query_one("#status"))


async def test_up_and_down_recall_the_chats_earlier_prompts_and_never_replace_typed_text(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        await pilot.press("up")
        assert area.text == ""  # nothing to recall yet
        await send(app, pilot, "first")
        await send(app, pilot, "second\nwith two lines")
        seen = []
        for key in ("up", "up", "up", "up", "down", "down", "down"):
            await pilot.press(key)
            seen.append(area.text)
        # up from the last line of a two-line prompt: first to its first line, then to the older prompt
        assert seen == ["second\nwith two lines", "second\nwith two lines", "first", "first", "second\nwith two lines",
                        "", ""]
        await pilot.press("up", "up", "up", "x")  # "firstx": changed, so up and down move the cursor only
        for key in ("up", "down"):
            await pilot.press(key)
            assert area.text == "firstx"
        area.text = ""
        await type_text(pilot, "a draft")
        await pilot.press("up")
        assert area.text == "a draft"


async def test_up_and_down_in_a_recalled_prompt_that_wraps_move_the_cursor_until_its_first_or_last_row(tmp_path):
    """A long prompt wraps: Up on its second row replaced it with the older prompt (it is on the first line of the
    document), and Down on its first row with the newer one (or an empty input)."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        long = " ".join(["a long prompt that wraps"] * 12)
        await send(app, pilot, "first")
        await send(app, pilot, long)
        await pilot.press("up")
        assert area.text == long and area.wrapped_document.height > 2
        await pilot.press("up")  # from its last row to the one above
        assert area.text == long and area.cursor_location[1] < len(long)
        await pilot.press("ctrl+home", "down")  # from its first row to the one below
        assert area.text == long and area.cursor_location[1] > 0
        for _ in range(area.wrapped_document.height):
            await pilot.press("up")
        assert area.text == "first"  # on the first row, up recalls the older one


async def test_a_prompt_sent_with_a_double_slash_comes_back_with_it(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        await send(app, pilot, "//etc/hosts: what is it?")
        assert engine.calls[-1][0][-1]["content"] == "/etc/hosts: what is it?"
        await pilot.press("f4")  # edited
        assert area.text == "//etc/hosts: what is it?"
        await pilot.press("escape")
        await pilot.press("up")  # recalled
        assert area.text == "//etc/hosts: what is it?"
        area.text = ""
        engine.crash_after = 0  # (before its first token)
        await send(app, pilot, "//usr: and this?")  # a failed reply puts it back
        assert area.text == "//usr: and this?"


async def test_a_recall_does_not_carry_over_to_another_chat_or_an_edit(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        for prompt in ("a1", "a2", "a3"):
            await send(app, pilot, prompt)
        await pilot.press("up", "up")
        assert area.text == "a2"
        await pilot.press("ctrl+n")  # a new chat: "a2" stays typed, and is no recall of it
        await pilot.pause()
        await pilot.press("up")
        assert area.text == "a2"
        area.text = ""
        await send(app, pilot, "b1")
        await pilot.press("up")
        assert area.text == "b1"
        await pilot.press("enter")  # the recalled prompt sent as it is
        await settle(app, pilot)
        await pilot.press("f4")  # its edit: Up and Down edit it, they recall nothing over it
        assert area.text == "b1"
        await pilot.press("up", "down")
        assert area.text == "b1"


async def test_recall_goes_on_after_a_send_the_app_refuses(tmp_path):
    gate = threading.Event()
    engine = FakeEngine()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        engine.gate = gate
        await first_delta(app, pilot, "third")
        area = app.query_one(PromptArea)
        await pilot.press("up")
        assert area.text == "third"
        await pilot.press("enter")  # refused: a reply is running; the recall stays one
        await pilot.press("up")
        assert area.text == "second"
        gate.set()
        await settle(app, pilot)


async def test_a_prompt_sent_and_taken_is_no_longer_one_to_bring_back(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.prompt_to_restore = "an old one"  # (a failed reply's, with the engine still alive)
        await send(app, pilot, "an old one")
        assert app.prompt_to_restore is None


@pytest.mark.parametrize("width", [80, 100, 110, 140, 200])
async def test_the_placeholder_fits_on_the_prompts_row_at_any_width(tmp_path, width):
    """The empty prompt's hint is the longest of its forms that fits one row (at 110 columns, beside the panel, the
    whole hint was cut off mid-word)."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(width, 40)) as pilot:
        await settle(app, pilot)
        area = app.query_one(PromptArea)
        for mode in ("newline", "send"):
            area.text = f"/enter {mode}"
            await pilot.press("ctrl+s")  # (sends in either mode)
            await pilot.pause()
            assert area.enter_sends == (mode == "send") and not area.text
            room = area.content_size.width
            hint = str(area.placeholder)
            assert hint.startswith("Message") and len(hint) < room
            assert ("Ctrl+S sends" if mode == "newline" else "Enter sends") in hint or len(hint) + 15 > room
            if room > 80:
                assert hint.endswith("newline, /help: commands)")
