"""While the models load, a loading screen shows the engine's log lines and progress; a failed load
ends the app with one error line and exit code 2."""

from __future__ import annotations

import logging
import threading

import pytest
from textual import events
from textual.widgets import Log, ProgressBar

from engine.errors import WeightsUnavailableError
from ssd_chat.history import ChatSettings
from ssd_chat.tui.app import ChatApp
from ssd_chat.tui.screens.help import HelpScreen
from ssd_chat.tui.screens.loading import LoadingScreen
from ssd_chat.tui.widgets.prompt_input import PromptArea
from tests.ssd_chat.tui_fakes import FakeEngine, rendered, wait_for


@pytest.mark.asyncio
async def test_the_loading_screen_shows_progress_until_the_engine_is_ready():
    release = threading.Event()
    engine = FakeEngine()

    def load() -> FakeEngine:
        logging.getLogger("engine.llm").info("loading fake-target (/models/fake) on cpu")
        release.wait(10)
        logging.getLogger("engine.llm").info("loading draft fake-draft (/models/fake-draft)")
        return engine

    app = ChatApp(load, settings=ChatSettings(mode="ssd"), target="fake-target", draft="fake-draft")
    async with app.run_test(size=(120, 40)) as pilot:
        assert isinstance(app.screen, LoadingScreen)
        log = app.screen.query_one(Log)
        await wait_for(pilot, lambda: any("loading fake-target" in line for line in log.lines), what="a log line")
        assert app.screen.query_one(ProgressBar).progress == 1
        assert "fake-target + draft fake-draft" in str(app.screen.query_one("#loading-title").render())
        await pilot.press("H", "i", "x", "backspace", "space")  # typing while loading: in the prompt, not sent
        app.screen.post_message(events.Paste("there"))
        await pilot.pause()
        await pilot.press("ctrl+j", "o", "k")  # a new line too (they ran together)
        typed = str(app.screen.query_one("#loading-typed").render())
        assert typed.startswith("typed (2 lines): ok") and "in the prompt once loaded" in typed  # not typed blind
        release.set()
        await wait_for(pilot, lambda: app.engine is not None and not isinstance(app.screen, LoadingScreen),
                       what="the chat screen")
        assert app.focused is app.query_one(PromptArea)
        assert app.query_one(PromptArea).text == "Hi there\nok" and not engine.calls
        assert app.session.settings.mode == "ssd"
    assert not logging.getLogger("engine").handlers  # the forwarding handler is gone after the app


@pytest.mark.asyncio
async def test_a_model_path_with_brackets_shows_as_it_is():
    """A target directory named with brackets: the loading title and the panel show it (as markup, "[/]" crashed
    the app)."""
    from ssd_chat.tui.widgets.stats_panel import StatsPanel

    release = threading.Event()
    engine = FakeEngine(layout={"target": "/models/[/]odd on cpu"})

    def load() -> FakeEngine:
        release.wait(10)
        return engine

    app = ChatApp(load, settings=ChatSettings(mode="sd"), target="/models/[/]odd", draft="fake-draft")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "loading /models/[/]odd + draft fake-draft" in str(app.screen.query_one("#loading-title").render())
        release.set()
        await wait_for(pilot, lambda: app.engine is not None and not isinstance(app.screen, LoadingScreen),
                       what="the chat screen")
        await pilot.pause()
        assert "/models/[/]odd on cpu" in rendered(app.query_one(StatsPanel).query_one("#layout"))


@pytest.mark.asyncio
async def test_a_failed_load_exits_with_the_error():
    def load():
        raise WeightsUnavailableError("qwen3-0.6b is not on this machine and HF_HUB_OFFLINE=1: hf download it")

    app = ChatApp(load, settings=ChatSettings(), target="qwen3-0.6b")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.load_error is not None, what="the load error")
    assert app.return_code == 2
    assert app.load_error.startswith("qwen3-0.6b is not on this machine")


@pytest.mark.asyncio
async def test_a_conversation_in_a_mode_without_a_draft_falls_back_to_ar(tmp_path):
    app = ChatApp(lambda: FakeEngine(draft=None), settings=ChatSettings(mode="ssd"), target="fake-target")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None, what="the engine")
        await pilot.pause()
        assert app.session.settings.mode == "ar"
        assert any("needs a draft model" in n.message for n in app._notifications)


@pytest.mark.asyncio
async def test_quitting_while_loading_stops_the_load_and_exits_cleanly(monkeypatch, caplog):
    """Ctrl+Q on the loading screen stops the engine's process (engine_process.stop_loading); the load's failure
    that follows is no error: the app exits at once with code 0."""
    stopped = threading.Event()

    def load() -> FakeEngine:
        assert stopped.wait(10), "the load was not stopped"
        raise RuntimeError("the engine process was killed by SIGKILL")

    def stop_loading() -> bool:
        stopped.set()
        return True

    monkeypatch.setattr("ssd_chat.tui.app.stop_loading", stop_loading)
    app = ChatApp(load, settings=ChatSettings(), target="fake-target")
    async with app.run_test(size=(120, 40)) as pilot:
        assert isinstance(app.screen, LoadingScreen)
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert stopped.is_set() and app.load_error is None and not app.return_code
    assert not [r for r in caplog.records if r.name.startswith("ssd_chat")]  # nothing logged: it did not fail
    assert not any("quitting once" in n.message for n in app._notifications)


@pytest.mark.asyncio
async def test_a_dialog_over_the_loading_screen_does_not_keep_it_up():
    """F1 (or the palette) opened while loading: the log lines still reach the loading screen under it, and once
    the dialog closes after the load, the chat is there (it stayed on the loading screen for good)."""
    release = threading.Event()
    engine = FakeEngine()

    def load() -> FakeEngine:
        release.wait(10)
        logging.getLogger("engine.llm").info("loading fake-target (/models/fake) on cpu")
        return engine

    app = ChatApp(load, settings=ChatSettings(), target="fake-target", draft="fake-draft")
    async with app.run_test(size=(120, 40)) as pilot:
        loading = app.screen
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        release.set()
        await wait_for(pilot, lambda: app.engine is not None, what="the engine")
        await wait_for(pilot, lambda: any("loading fake-target" in line for line in loading.query_one(Log).lines),
                       what="the log line on the loading screen")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not any(isinstance(s, LoadingScreen) for s in app.screen_stack),
                       what="the chat screen")
        assert app.focused is app.query_one(PromptArea)
