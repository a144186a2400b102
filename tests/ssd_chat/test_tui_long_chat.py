"""A long chat opens with its last messages shown and the earlier ones shown a batch at a time as the view nears
them, the view kept on the lines it showed (widgets.transcript)."""

from __future__ import annotations

import contextlib
import threading

import pytest

from engine.outputs import TokenSource
from ssd_chat.history import ChatMessage, ChatSettings, Conversation, HistoryStore
from ssd_chat.tui.widgets import transcript as transcript_module
from ssd_chat.tui.widgets.transcript import AssistantMessage, EarlierMessages, Shown, Transcript, UserMessage
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle, wait_for

SIZE = (100, 30)
TURNS = 16
LINES = 7  # a scroll's rows (a wheel's are 3; fewer steps here)


def long_chat(tmp_path, turns: int = TURNS) -> list[ChatMessage]:
    """A saved chat of `turns` turns (the latest, so --resume opens it); returns its messages."""
    messages = []
    for i in range(turns):
        reply = "\n\n".join(f"answer {i}, paragraph {j}" for j in range(1 + i % 5))
        messages += [ChatMessage("user", f"question {i}"), ChatMessage("assistant", reply)]
    HistoryStore(tmp_path / "history.sqlite3").save(
        Conversation(None, "long", ChatSettings(mode="sd", temperature=0.0), messages))
    return messages


def shown_texts(transcript: Transcript) -> list[str]:
    return [str(v.render()) if isinstance(v, UserMessage) else v.text for v in transcript.children
            if isinstance(v, (UserMessage, AssistantMessage))]


def rows_from_end(transcript: Transcript) -> int:
    """How far the view's top line is from the transcript's end: messages shown above it do not change it."""
    return transcript.virtual_size.height - round(transcript.scroll_y)


@contextlib.asynccontextmanager
async def opened(tmp_path, engine: FakeEngine | None = None):
    """The app on the latest saved chat (--resume), loaded: (app, pilot, transcript)."""
    app = make_app(engine or FakeEngine(), tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        yield app, pilot, app.query_one(Transcript)


async def settled(pilot) -> None:
    for _ in range(4):  # (a batch's layout, then the view put back: a few refreshes)
        await pilot.pause()


@pytest.mark.asyncio
async def test_a_long_chat_opens_at_its_end_with_its_last_messages_shown(tmp_path):
    messages = long_chat(tmp_path)
    async with opened(tmp_path) as (_app, _pilot, transcript):
        hidden = transcript.hidden
        assert 0 < hidden < len(messages) - 2
        assert shown_texts(transcript) == [m.content for m in messages[hidden:]]
        assert str(transcript.children[0].render()).startswith(f"↑ {hidden} earlier messages")
        assert transcript.scroll_y == transcript.max_scroll_y > 0  # (at the end, more than a screen shown)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["lines", "pages"])
async def test_scrolling_up_shows_the_earlier_messages_without_moving_the_view(tmp_path, how):
    """Each scroll moves the view by its own rows and no more, across every batch shown above it (a wheel's
    lines, or PageUp's animated pages), up to the chat's first message."""
    messages = long_chat(tmp_path)
    async with opened(tmp_path) as (app, pilot, transcript):
        batches, hidden = 0, transcript.hidden
        for _ in range(200):
            before, y = rows_from_end(transcript), transcript.scroll_y
            if how == "lines":
                transcript.scroll_to(y=y - LINES, animate=False)
            else:
                await pilot.press("pageup")
                await wait_for(pilot, lambda: not app.animator.is_being_animated(transcript, "scroll_y"),
                               what="the page scrolled")
            await settled(pilot)
            step = LINES if how == "lines" else transcript.scrollable_content_region.height
            if how == "pages" and round(y) == 0 and hidden:  # (PageUp at the top: a batch shown, then a page up)
                assert rows_from_end(transcript) == before + step, f"no page up (batch {batches})"
            else:
                assert rows_from_end(transcript) == before + min(step, round(y)), f"the view jumped (batch {batches})"
            batches += transcript.hidden < hidden
            hidden = transcript.hidden
            if transcript.hidden == 0 and transcript.scroll_y == 0:
                break
        assert batches >= 2  # (the test went through more than one batch)
        assert shown_texts(transcript) == [m.content for m in messages]
        assert not transcript.query(EarlierMessages)


@pytest.mark.asyncio
async def test_an_earlier_message_asked_for_is_shown_with_those_after_it(tmp_path):
    """A search's match or the turns list's choice among the unshown messages: it and the ones after it shown."""
    messages = long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        assert transcript.hidden > 4
        views = transcript.views_of(4, 2, len(messages))
        assert [str(views[0].render()), views[1].text] == [messages[4].content, messages[5].content]
        assert transcript.hidden == 4
        await settled(pilot)
        assert shown_texts(transcript) == [m.content for m in messages[4:]]
        assert str(transcript.children[0].render()).startswith("↑ 4 earlier messages")


@pytest.mark.asyncio
async def test_the_earlier_replies_come_in_the_view_chosen_while_they_were_unshown(tmp_path):
    long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        await pilot.press("ctrl+t")  # the coloured-token view
        transcript.reveal()
        await settled(pilot)
        replies = list(transcript.query(AssistantMessage))
        assert len(replies) == TURNS and all(r.colours for r in replies)


@pytest.mark.asyncio
async def test_removing_every_shown_message_brings_the_earlier_ones_into_view(tmp_path):
    messages = long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        hidden = transcript.hidden
        transcript.remove_last(len(messages) - hidden + 2)  # (the shown ones, and the last two unshown)
        await settled(pilot)
        shown = shown_texts(transcript)
        assert shown and shown == [m.content for m in messages[transcript.hidden:hidden - 2]]


@pytest.mark.asyncio
async def test_shown_messages_under_a_screen_bring_in_earlier_ones_until_a_scroll_can(tmp_path, monkeypatch):
    """Where the last messages, guessed to fill two screens, take under one, the earlier ones come in until the
    view can scroll up to them (no wheel would move a view that does not scroll)."""
    monkeypatch.setattr(Shown, "rows", lambda self, width: 10_000)  # (every message guessed taller than it is)
    long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        await wait_for(pilot, lambda: transcript.max_scroll_y > transcript.size.height, what="a scroll's room")
        await settled(pilot)
        assert transcript.hidden < 2 * TURNS - 2  # (two were shown at first)
        assert transcript.scroll_y == transcript.max_scroll_y


@pytest.mark.asyncio
async def test_pageup_at_the_top_of_the_shown_messages_shows_earlier_ones_and_pages_up(tmp_path, monkeypatch):
    """A view at the top with messages still unshown (nearing the top shows them first, so here that is switched
    off): PageUp shows a batch, then pages up into it."""
    monkeypatch.setattr(transcript_module, "NEAR_TOP_SCREENS", -1)
    long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        transcript.scroll_to(y=0, animate=False)
        await settled(pilot)
        hidden, before = transcript.hidden, rows_from_end(transcript)
        assert hidden > 0
        await pilot.press("pageup")
        await wait_for(pilot, lambda: rows_from_end(transcript) > before, what="a page up")
        await settled(pilot)
        assert transcript.hidden < hidden
        assert rows_from_end(transcript) == before + transcript.scrollable_content_region.height


@pytest.mark.asyncio
async def test_an_unshown_turn_deleted_leaves_the_shown_messages_as_they_are(tmp_path):
    messages = long_chat(tmp_path)
    async with opened(tmp_path) as (_app, pilot, transcript):
        hidden, views = transcript.hidden, list(transcript.children)[1:]
        assert hidden > 4
        transcript.remove_messages(2, 2, len(messages))  # (the /turns list's delete of the second turn)
        await settled(pilot)
        assert transcript.hidden == hidden - 2 and list(transcript.children)[1:] == views
        assert str(transcript.children[0].render()).startswith(f"↑ {hidden - 2} earlier messages")
        transcript.reveal()
        await settled(pilot)
        assert shown_texts(transcript) == [m.content for m in messages[:2] + messages[4:]]


@pytest.mark.asyncio
async def test_a_regenerated_reply_is_followed_where_its_turn_was_the_only_one_shown(tmp_path):
    """F5 with the view scrolled up in the last reply, the only turn shown (a long one): the earlier messages come
    back into view above, and the view follows the new reply to the end."""
    messages = long_chat(tmp_path)
    messages[-1] = ChatMessage("assistant", "\n\n".join(f"a long paragraph {j}" for j in range(60)))
    HistoryStore(tmp_path / "history.sqlite3").save(
        Conversation(None, "longer", ChatSettings(mode="sd", temperature=0.0), messages))
    engine = FakeEngine(gate=threading.Event())  # (the reply's first word, then the rest once the gate opens)
    async with opened(tmp_path, engine) as (app, pilot, transcript):
        assert transcript.hidden == len(messages) - 2
        transcript.scroll_to(y=transcript.max_scroll_y - 10, animate=False)
        await settled(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: transcript.last_assistant().text == "Hello", what="the reply's first word")
        await settled(pilot)
        engine.gate.set()
        await settle(app, pilot)
        await settled(pilot)
        assert shown_texts(transcript)[-2:] == [messages[-2].content, "Hello from the **fake** engine."]
        assert transcript.hidden < len(messages) - 2
        assert transcript.scroll_y == transcript.max_scroll_y


@pytest.mark.asyncio
async def test_a_live_chat_grown_long_unshows_its_oldest_messages_and_keeps_their_token_sources(tmp_path):
    """Followed at its end, a chat typed in this run keeps about two screens above the view: its older messages
    go, as an opened chat's earlier ones, and come back as they were (a reply's token sources for Ctrl+T too)."""
    words = ["A", " reply", " line", ".", "\n\n"] * 6
    engine = FakeEngine(words=words)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        transcript = app.query_one(Transcript)
        first_pieces = None
        for i in range(12):
            await send(app, pilot, f"prompt {i}")
            if first_pieces is None:
                first_pieces = list(transcript.last_assistant().pieces)
        await settled(pilot)
        hidden = transcript.hidden
        assert hidden > 0 and str(transcript.children[0].render()).startswith(f"↑ {hidden} earlier messages")
        screens = transcript.max_scroll_y / transcript.size.height  # (above the view, at its end)
        assert transcript_module.SHOWN_SCREENS <= screens <= transcript_module.RETIRE_SCREENS + 1
        texts = [m.content for m in app.session.messages]
        assert shown_texts(transcript) == texts[hidden:]
        transcript.reveal()
        await settled(pilot)
        assert shown_texts(transcript) == texts
        assert list(transcript.query(AssistantMessage).first().pieces) == first_pieces
        assert TokenSource.ACCEPTED in {source for _, source in first_pieces}  # (sd's: not a rebuild's one piece)


@pytest.mark.asyncio
async def test_a_regenerated_reply_retires_nothing_until_the_turn_it_replaced_is_gone(tmp_path, monkeypatch):
    """F5 takes the last turn out and sends its prompt again at once: the turn is still laid out then (Textual
    removes it after the handler), so counting it would retire the messages it covers too. The next prompt does."""
    monkeypatch.setattr(transcript_module, "RETIRE_SCREENS", 1000)  # (the chat grows long, nothing retired yet)
    app = make_app(FakeEngine(words=["A", " reply", " line", ".", "\n\n"] * 6), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        transcript = app.query_one(Transcript)
        for i in range(12):
            await send(app, pilot, f"prompt {i}")
        await settled(pilot)
        assert transcript.hidden == 0 and transcript.max_scroll_y > 6 * transcript.size.height
        monkeypatch.setattr(transcript_module, "RETIRE_SCREENS", 6)
        await pilot.press("f5")
        assert transcript.hidden == 0
        await settle(app, pilot)
        await send(app, pilot, "one more")
        await settled(pilot)
        assert transcript.hidden > 0
        assert transcript.max_scroll_y >= transcript_module.SHOWN_SCREENS * transcript.size.height
