"""Snapshots of the main screen states on the fake engine (`pytest --snapshot-update` after looking
at the report refreshes them). The fake engine's clock is scripted, so the panel is the same each run."""

from __future__ import annotations

import pytest

from ssd_chat.history import ChatSettings
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle

SIZE = (130, 42)
CODE_REPLY = ["Here", " is", " a", " function", ":\n\n", "```python\n", "def add(a, b):\n", "    return a + b\n",
              "```\n"]


def _app(tmp_path, **engine_args):
    engine = FakeEngine(**engine_args)
    return make_app(engine, tmp_path, settings=ChatSettings(mode="ssd", k=4, temperature=0.0, max_tokens=64))


async def _one_turn(pilot) -> None:
    await settle(pilot.app, pilot)
    await send(pilot.app, pilot, "Write an add function in Python")
    await pilot.pause(0.2)


def test_snapshot_after_a_reply_in_ssd(snap_compare, tmp_path):
    assert snap_compare(_app(tmp_path, words=CODE_REPLY), terminal_size=SIZE, run_before=_one_turn)


def test_snapshot_token_colours(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await _one_turn(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)

    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_compare_table(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await _one_turn(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot.app, pilot)
        await pilot.pause(0.2)

    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_help_in_the_light_theme(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await settle(pilot.app, pilot)
        pilot.app.theme = "textual-light"
        await pilot.press("f1")
        await pilot.pause(0.2)

    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=run_before)


@pytest.fixture(autouse=True)
def _no_cursor_blink(monkeypatch):
    from textual.widgets import TextArea

    monkeypatch.setattr(TextArea, "cursor_blink", False, raising=False)
