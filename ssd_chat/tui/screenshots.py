"""Regenerate the README's screenshots of the real app (real models, headless):

    python -m ssd_chat.tui.screenshots [--out assets]

Uses smollm2-135m (AR) and the synthetic pair (SSD, compare); each screenshot is an SVG.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
from pathlib import Path

from engine.config import SpeculationConfig
from ssd_chat.history import ChatSettings, HistoryStore
from ssd_chat.tui.app import ChatApp
from ssd_chat.tui.engine_process import EngineProcess
from ssd_chat.tui.widgets.prompt_input import PromptArea

log = logging.getLogger(__name__)
SIZE = (140, 44)
CHAT_PROMPT = "Write a Python function that checks whether a number is prime, with a short explanation."
SPEC_PROMPT = "Explain speculative decoding in two sentences."


async def _wait(app: ChatApp, pilot, timeout: float = 300.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (app.engine is None or app.busy) and loop.time() < deadline:
        await pilot.pause(0.1)
    await pilot.pause(0.3)


async def _send(app: ChatApp, pilot, text: str) -> None:
    area = app.query_one(PromptArea)
    area.text = text
    area.focus()
    await pilot.press("enter")
    await _wait(app, pilot)


def _app(target: str, draft: str | None, settings: ChatSettings, data: Path) -> ChatApp:
    spec = SpeculationConfig(mode=settings.mode, k=settings.k)
    return ChatApp(lambda: EngineProcess(target, draft=draft, speculation=spec, threads=2), settings=settings,
                   store=HistoryStore(Path(tempfile.mkdtemp(dir=data)) / "history.sqlite3"), target=target,
                   draft=draft)  # (a folder each: one app's preferences, the light theme, are not the next one's)


async def shoot(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp())
    app = _app("smollm2-135m", None, ChatSettings(mode="ar", temperature=0.0, max_tokens=220), data)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):  # until the engine logged what it loads
            if app.engine is not None or len(app.screen.query_one("Log").lines) > 1:
                break
            await pilot.pause(0.1)
        app.save_screenshot(str(out / "tui-loading.svg"))
        await _wait(app, pilot)
        await _send(app, pilot, CHAT_PROMPT)
        app.save_screenshot(str(out / "tui-chat.svg"))
        await app.action_quit()

    settings = ChatSettings(mode="ssd", k=4, temperature=0.0, max_tokens=64)
    app = _app("synthetic-target", "synthetic-draft", settings, data)
    async with app.run_test(size=SIZE) as pilot:
        await _wait(app, pilot)
        await _send(app, pilot, SPEC_PROMPT)
        await pilot.press("ctrl+t")
        await pilot.pause(0.3)
        app.save_screenshot(str(out / "tui-ssd-colours.svg"))
        await pilot.press("ctrl+t", "ctrl+r")
        await _wait(app, pilot)
        app.save_screenshot(str(out / "tui-compare.svg"))
        await pilot.press("escape", "f1")
        await pilot.pause(0.3)
        app.theme = "textual-light"
        await pilot.pause(0.3)
        app.save_screenshot(str(out / "tui-help-light.svg"))
        await app.action_quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("assets"))
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(shoot(parser.parse_args().out))


if __name__ == "__main__":
    main()
