"""The chat app's preferences across runs: the file's reading and writing, and the app restoring what it saved."""

from __future__ import annotations

import json

import pytest

from ssd_chat.tui import preferences
from ssd_chat.tui.preferences import Preferences
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle

SIZE = (120, 40)


def test_a_missing_or_broken_file_gives_the_defaults_field_by_field(tmp_path):
    path = tmp_path / preferences.FILE_NAME
    assert preferences.load(path) == Preferences()
    path.write_text("{not json")
    assert preferences.load(path) == Preferences()
    path.write_bytes(b"\xff\xfe")
    assert preferences.load(path) == Preferences()
    path.write_text("[" * 100_000 + "]" * 100_000)  # nested past Python's recursion limit
    assert preferences.load(path) == Preferences()
    path.write_text(json.dumps(["a list"]))
    assert preferences.load(path) == Preferences()
    path.write_text(json.dumps({"theme": 3, "colours": "yes", "enter": "newline", "other": 1}))
    assert preferences.load(path) == Preferences(enter="newline")
    path.write_text(json.dumps({"theme": "nord", "colours": True, "enter": "sideways"}))
    assert preferences.load(path) == Preferences(theme="nord", colours=True)


def test_save_writes_the_whole_file_and_an_unwritable_folder_is_no_error(tmp_path):
    path = tmp_path / "new" / preferences.FILE_NAME
    assert preferences.save(path, Preferences(theme="nord", enter="newline"))
    assert preferences.load(path) == Preferences(theme="nord", enter="newline")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [preferences.FILE_NAME]  # no temporary left
    blocked = tmp_path / "a file" / preferences.FILE_NAME  # (its folder cannot be made: a file has the name)
    (tmp_path / "a file").write_text("")
    assert not preferences.save(blocked, Preferences(colours=True))
    assert preferences.changed(blocked, Preferences(), colours=True) == Preferences(colours=True)


def test_two_windows_changing_different_preferences_keep_both(tmp_path):
    path = tmp_path / preferences.FILE_NAME
    first, second = preferences.load(path), preferences.load(path)  # two app windows, started together
    first = preferences.changed(path, first, theme="nord")
    second = preferences.changed(path, second, enter="newline")
    assert second == Preferences(enter="newline")  # (each window keeps its own view while it runs)
    assert preferences.load(path) == Preferences(theme="nord", enter="newline")  # the first window's theme stays
    first = preferences.changed(path, first, colours=True)
    assert preferences.load(path) == Preferences(theme="nord", colours=True, enter="newline")
    written = path.stat().st_ino  # a change to what the file holds already writes nothing (a write is a new file)
    assert preferences.changed(path, second, colours=True) == Preferences(colours=True, enter="newline")
    assert path.stat().st_ino == written


@pytest.mark.asyncio
async def test_the_theme_colours_and_enter_mode_come_back_in_the_next_run(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.theme = "nord"
        await pilot.press("ctrl+t")
        await send(app, pilot, "/enter newline")
        await pilot.pause()
    saved = json.loads((tmp_path / preferences.FILE_NAME).read_text())
    assert saved == {"theme": "nord", "colours": True, "enter": "newline"}

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.theme == "nord" and app.colours and app.query_one("#legend").display
        assert not app.query_one(PromptArea).enter_sends

    app = make_app(FakeEngine(), tmp_path, enter_sends=True)  # --enter send: for this run, the file unchanged
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.query_one(PromptArea).enter_sends
    assert json.loads((tmp_path / preferences.FILE_NAME).read_text())["enter"] == "newline"


@pytest.mark.asyncio
async def test_a_theme_change_recolours_the_tokens_and_the_legend(tmp_path):
    from ssd_chat.tui.provenance import legend

    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Hi")
        await pilot.press("ctrl+t")
        tokens = app.query_one(".reply-tokens")
        dark = (str(app.query_one("#legend").content.spans), str(tokens.text.spans))
        app.theme = "textual-light"
        await pilot.pause()
        light = (str(app.query_one("#legend").content.spans), str(tokens.text.spans))
        assert light != dark
        assert str(app.query_one("#legend").content.spans) == str(legend(app.current_theme).spans)
