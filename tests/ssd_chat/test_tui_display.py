"""How the chat app shows a reply against the fake engine: narrow terminals and dialogs, token colours, the
transcript's scrolling, and renders paced to the reply's speed and the CPU."""

from __future__ import annotations

import threading

import pytest
from textual import events

from ssd_chat.tui.widgets.prompt_input import PromptArea
from ssd_chat.tui.widgets.stats_panel import StatsPanel
from ssd_chat.tui.widgets.transcript import AssistantMessage, Transcript
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle, wait_for

pytestmark = pytest.mark.asyncio
SIZE = (120, 40)
REPLY = "Hello from the **fake** engine."


async def test_a_narrow_terminal_hides_the_panel_and_keeps_the_chat(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(app, pilot)
        assert not app.query_one(StatsPanel).display or app.query_one(StatsPanel).region.width == 0
        assert app.query_one(PromptArea).region.width > 40
        await send(app, pilot, "Hi")
        assert app.query(AssistantMessage).last().text == REPLY
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert app.query_one(StatsPanel).region.width > 0


async def test_dialogs_fit_a_narrow_terminal(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(60, 16)) as pilot:
        await settle(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        box = app.screen.query_one(".modal-box")
        assert box.region.right <= 60 and box.region.bottom <= 16
        assert box.max_scroll_y > 0  # the help is longer than the box: it scrolls


async def test_token_colours_toggle_shows_provenance_and_a_legend(tmp_path):
    engine = FakeEngine()
    app = make_app(engine, tmp_path, settings=None)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.change_settings(mode="ssd")
        await send(app, pilot, "hi")
        reply = app.query(AssistantMessage).last()
        assert "".join(p for p, _ in reply.pieces) == REPLY
        sources = {str(s) for _, s in reply.pieces}
        assert {"target", "accepted_hit", "accepted_miss", "recovery"} <= sources
        spec = str(app.query_one(StatsPanel).query_one("#spec").render())
        assert "draft process idle 3 ms per step" in spec  # SSD: the draft's idle time beside the verify time
        await pilot.press("ctrl+t")
        await pilot.pause()
        tokens = reply.query_one(".reply-tokens")
        assert tokens.display and not reply.query_one(".reply-markdown").display
        spans = tokens.text.spans
        assert len({span.style for span in spans}) >= 3  # hit, miss, recovery in different colours
        legend = app.query_one("#legend")
        assert legend.display and "accepted, cache hit" in str(legend.render())
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert reply.query_one(".reply-markdown").display and not legend.display


async def test_single_newlines_in_a_reply_are_line_breaks_while_it_streams_and_after(tmp_path):
    """A poem's lines were one paragraph in the Markdown view (CommonMark's soft breaks) and lines in the colours
    view; code blocks, lists and headings render as before."""
    from ssd_chat.tui.widgets.reply_markdown import ReplyMarkdown

    poem = ["In the depths of the blue,\nA world of wonder,", "\nWhere fish swim free.\n\n", "# Fish\n\n",
            "- cod\n- eel\n\n", "```\nx = 1\ny = 2\n```\n"]
    engine = FakeEngine(words=poem, gate=threading.Event())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.query_one(PromptArea).text = "a poem"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text == poem[0], what="1st delta")
        markdown = app.reply_view.query_one(ReplyMarkdown)

        def shown() -> list[str]:
            return [line.strip() for line in markdown.shown_lines() if line.strip()]

        await wait_for(pilot, lambda: shown() == ["In the depths of the blue,", "A world of wonder,"], what="lines")
        engine.gate.set()
        await settle(app, pilot)
        reply = app.query(AssistantMessage).last()
        assert markdown.blocks == ["In the depths of the blue,\nA world of wonder,\nWhere fish swim free.", "# Fish",
                                   "- cod\n- eel", "```\nx = 1\ny = 2\n```"]
        assert shown() == ["In the depths of the blue,", "A world of wonder,", "Where fish swim free.", "Fish",
                           "• cod", "• eel", "x = 1", "y = 2"]
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert reply.query_one(".reply-tokens").text.plain.splitlines()[:3] == shown()[:3]


async def test_the_transcript_follows_the_reply_unless_scrolled_up(tmp_path):
    """It follows a reply; PageUp / PageDown in the prompt scroll it; scrolled up, it stays put while one streams."""
    engine = FakeEngine(words=[f"line {i}\n\n" for i in range(40)])
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "long")
        transcript = app.query_one(Transcript)
        await pilot.pause()
        bottom = transcript.max_scroll_y
        assert bottom > 0 and transcript.scroll_y == bottom  # followed

        app.query_one(PromptArea).text = "typing"
        await pilot.press("pageup")
        await pilot.pause()
        assert transcript.scroll_y < bottom and app.focused is app.query_one(PromptArea)
        assert app.query_one(PromptArea).text == "typing"
        await pilot.press("pagedown", "pagedown", "pagedown")
        await pilot.pause()
        assert transcript.scroll_y == bottom

        engine.gate = gate = threading.Event()
        app.query_one(PromptArea).text = "more"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text, what="1st delta")
        for _ in range(3):  # the user scrolls up with the mouse wheel while the reply streams
            transcript.post_message(events.MouseScrollUp(transcript, 2, 2, 0, -1, 0, False, False, False))
        await pilot.pause()
        scrolled = transcript.scroll_y
        assert scrolled < transcript.max_scroll_y
        gate.set()
        await settle(app, pilot)
        assert transcript.scroll_y == scrolled < transcript.max_scroll_y


class Steps:
    """A FakeEngine gate that lets one delta through per release."""

    def __init__(self) -> None:
        self._free = threading.Semaphore(0)

    def wait(self, timeout: float | None = None) -> bool:
        return self._free.acquire(timeout=timeout)

    def release(self, count: int = 1) -> None:
        self._free.release(count)


async def test_paging_where_nothing_scrolls_keeps_following_and_paging_down_to_the_end_follows_again(tmp_path):
    """PageDown while the conversation fit on the screen let go of Textual's anchor for good (it takes it back only
    when the position changes): the reply then streamed below the screen. PageUp during a long reply still stops
    following it, and PageDown to the end follows it again."""
    engine = FakeEngine(words=[f"line {i}\n\n" for i in range(40)], gate=Steps())
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        transcript = app.query_one(Transcript)
        app.query_one(PromptArea).text = "long"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text, what="the 1st delta")
        assert transcript.max_scroll_y == 0
        await pilot.press("pagedown", "pageup")
        engine.gate.release(100)
        await settle(app, pilot)
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y > 20, what="the reply's end")

        engine.gate = Steps()
        app.query_one(PromptArea).text = "more"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text == "line 0\n\n",
                       what="the 2nd reply's 1st delta")
        await pilot.press("pageup")
        engine.gate.release(5)  # (SD: 3 lines a step)
        await wait_for(pilot, lambda: "line 15" in app.reply_view.text, what="5 more steps")
        await pilot.pause()
        assert transcript.scroll_y < transcript.max_scroll_y - 10  # it did not follow
        await pilot.press("pagedown", "pagedown", "pagedown")
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, what="the end")
        engine.gate.release(100)
        await settle(app, pilot)
        await wait_for(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y > 60, what="the new end")


async def test_a_fast_reply_is_coalesced_into_few_renders(tmp_path, monkeypatch):
    engine = FakeEngine(words=[f"w{i} " for i in range(1500)])
    app = make_app(engine, tmp_path)
    appends: list[int] = []
    original = AssistantMessage.append

    async def counting_append(self, text, pieces):
        appends.append(len(text))
        await original(self, text, pieces)

    monkeypatch.setattr(AssistantMessage, "append", counting_append)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.session.update_settings(max_tokens=2000)
        await send(app, pilot, "go")
        assert app.query(AssistantMessage).last().text == "".join(engine.words)
        non_empty = [n for n in appends if n]
        assert len(non_empty) < 150  # 1500 deltas, one Markdown append per flush tick
    assert engine.closed  # quitting closes the engine


@pytest.mark.parametrize(("on_cuda", "budget"), [(False, True), (True, False)])
async def test_updates_are_paced_by_the_ui_cpu_only_with_a_cpu_engine(tmp_path, on_cuda, budget):
    """A CPU engine's cores are the UI's too: the reply's updates get a CPU budget (flush_pacer.py); a GPU
    engine's do not, and update every FLUSH_S."""
    from ssd_chat.tui import reply_actions

    engine = FakeEngine()
    engine.config.on_cuda = on_cuda
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "go")
        assert app.pacer.share == (reply_actions.UI_SHARE if budget else None)
        assert app.pacer.min_s == reply_actions.FLUSH_S and app.pacer.max_s == reply_actions.FLUSH_MAX_S
        assert app.query(AssistantMessage).last().text == REPLY
