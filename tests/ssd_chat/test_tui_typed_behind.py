"""The line of what was typed while a screen covers the chat's prompt (a compare, the loading screen): it waits in the
prompt, and the line shows the end of it on one line of the screen's box at any terminal width."""

from __future__ import annotations

import threading

import pytest
from textual import events

from ssd_chat.history import ChatSettings, Conversation, HistoryStore
from ssd_chat.tui.app import ChatApp
from ssd_chat.tui.screens.compare import CompareScreen
from ssd_chat.tui.screens.loading import LoadingScreen
from ssd_chat.tui.typed_behind import typed_line
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.test_tui_compare import _gate_the_rows
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, rendered, send, settle, type_text, wait_for

LONG = "a long line typed while the models load, " * 4 + "the end"


def _held_load(release: threading.Event):
    """A load of the engine that lasts until `release` is set (the loading screen stays up)."""

    def load() -> FakeEngine:
        release.wait(30)
        return FakeEngine()

    return load


async def _type_long(pilot, screen) -> None:
    """LONG into the compare's `screen`: its first words as keys, the rest as a paste (175 keys, each redrawing the
    compare, took 20 s a test on a slow CPU)."""
    await type_text(pilot, LONG[:7])
    screen.post_message(events.Paste(LONG[7:]))
    await pilot.pause()


def test_the_line_fits_its_width_with_the_words_around_it():
    for width in (54, 86, 96):  # (54: the compare's box at 60 columns)
        line = typed_line("first\n" + LONG, width, "in the prompt once closed")
        assert len(line) == width and line.startswith("typed (2 lines): …") and "the end▏" in line
    assert typed_line("short", 96, "in the prompt once closed") == "typed: short▏ (in the prompt once closed)"
    assert "…" + LONG[-5:] + "▏" in typed_line(LONG, 10, "x")  # (too narrow: the last characters, wrapped)


@pytest.mark.asyncio
@pytest.mark.parametrize("width", [60, 80, 140, 200])
async def test_what_was_typed_during_a_compare_shows_on_one_line_of_its_box(tmp_path, width):
    """Its end was cut to the terminal's width less 50 columns, but the box is 100 columns at most: from about 120
    columns on, the line wrapped (at 200, over three lines), its start and end apart; and at 60, where the box is
    the terminal's width, the words around it took more than the 50 columns left for them."""
    engine, gate = FakeEngine(), threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(width, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate)
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await _type_long(pilot, screen)
        await pilot.pause()
        shown = screen.query_one("#compare-typed")
        assert rendered(shown).startswith("typed: …") and "the end▏" in rendered(shown)
        assert shown.size.height == 1
        gate.set()
        await settle(app, pilot)


@pytest.mark.asyncio
async def test_what_was_typed_while_the_models_load_shows_on_one_line_at_60_columns():
    release = threading.Event()
    app = ChatApp(_held_load(release), settings=ChatSettings(mode="ar"), target="fake-target")
    async with app.run_test(size=(60, 30)) as pilot:
        assert isinstance(app.screen, LoadingScreen)
        await type_text(pilot, "x")
        app.screen.post_message(events.Paste(LONG))
        await pilot.pause()
        shown = app.screen.query_one("#loading-typed")
        assert "the end▏" in rendered(shown) and shown.size.height == 1
        release.set()
        await wait_for(pilot, lambda: not isinstance(app.screen, LoadingScreen), what="the chat screen")


@pytest.mark.asyncio
async def test_the_line_fits_the_box_again_after_a_resize(tmp_path):
    """Its width was read once, as the keys came: a terminal made narrower wrapped the line over two, and one made
    wider left it short of the box."""
    engine, gate = FakeEngine(), threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate)
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await _type_long(pilot, screen)
        shown, box = screen.query_one("#compare-typed"), screen.query_one(".modal-box")
        for width, inside in ((60, 54), (140, 94)):  # (the box: 100 columns at most, less its border and padding)
            await pilot.resize_terminal(width, 40)
            await pilot.pause()
            assert box.content_size.width == inside
            assert len(rendered(shown)) == box.content_size.width and shown.size.height == 1
            assert "the end▏" in rendered(shown)
        gate.set()
        await settle(app, pilot)


@pytest.mark.asyncio
async def test_text_already_in_the_prompt_shows_as_a_compare_starts(tmp_path):
    """It showed only once a key was typed on the compare's screen: the text left in the prompt before Ctrl+R was
    there all along, unseen."""
    engine, gate = FakeEngine(), threading.Event()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "hi")
        _gate_the_rows(engine, gate)
        await type_text(pilot, "half a thought")
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await pilot.pause()
        shown = screen.query_one("#compare-typed")
        assert shown.display and rendered(shown).startswith("typed: half a thought▏")
        assert shown.size.height == 1
        gate.set()
        await settle(app, pilot)


@pytest.mark.asyncio
async def test_a_resumed_draft_shows_while_the_models_load(tmp_path):
    """--resume puts the chat's draft in the prompt before the models load, and typing then adds to it: the line
    showed it only once a key was typed."""
    store = HistoryStore(tmp_path / "history.sqlite3")
    chat = Conversation(None)
    store.save(chat)
    store.save_draft(chat.id, "half a thought")
    release = threading.Event()
    app = ChatApp(_held_load(release), settings=ChatSettings(mode="ar"), store=store, target="fake-target", resume=True)
    async with app.run_test(size=(120, 30)) as pilot:
        assert isinstance(app.screen, LoadingScreen)
        await pilot.pause()
        shown = app.screen.query_one("#loading-typed")
        assert shown.display and rendered(shown).startswith("typed: half a thought▏ (in the prompt once loaded)")
        release.set()
        await wait_for(pilot, lambda: not isinstance(app.screen, LoadingScreen), what="the chat screen")
        assert app.query_one(PromptArea).text == "half a thought"


@pytest.mark.asyncio
async def test_esc_while_the_models_load_clears_the_line_too_and_ctrl_z_brings_the_text_back():
    """Esc cleared the prompt behind the loading screen ("input cleared: Ctrl+Z brings it back"), while its line
    still showed the text; Ctrl+Z there did nothing, so the text seemed kept and came back only by a Ctrl+Z after
    the load."""
    release = threading.Event()
    app = ChatApp(_held_load(release), settings=ChatSettings(mode="ar"), target="fake-target")
    async with app.run_test(size=(80, 30)) as pilot:
        assert isinstance(app.screen, LoadingScreen)
        await type_text(pilot, "typed text")
        shown = app.screen.query_one("#loading-typed")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen_stack[0].query_one(PromptArea).text == "" and not shown.display
        await pilot.press("ctrl+z")
        await pilot.pause()
        assert app.screen_stack[0].query_one(PromptArea).text == "typed text"
        assert "typed: typed text▏" in rendered(shown) and shown.display
        release.set()
        await wait_for(pilot, lambda: not isinstance(app.screen, LoadingScreen), what="the chat screen")
        assert app.query_one(PromptArea).text == "typed text"
