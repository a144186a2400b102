"""Each reply keeps the settings it was generated with (ReplySettings, in its TurnStats): saved with it in the
history, read back from files saved before they were kept (no settings), and shown in the export's stats table, so
that a /temp between replies no longer leaves only the chat's settings at export time to go by."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, replace

import pytest

from engine.config import CPU_MAX_DRAFT
from ssd_chat.history import ChatMessage, ChatSettings, Conversation, HistoryStore, TurnStats
from ssd_chat.reply_settings import ReplySettings
from ssd_chat.tui.export import to_markdown
from ssd_chat.tui.export_text import to_text
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, send, settle

SIZE = (120, 40)
SAMPLED = ReplySettings("ssd", 3, (1, 2, 2), 0.6, 0.9, 20, 64)
GREEDY = ReplySettings("ar", 4, None, 0.0, 0.9, 0, 64)


def _stats(settings: ReplySettings | None) -> TurnStats:
    return TurnStats("ssd", 40.0, 0.08, 12, 30, 16, "stop", tau=2.5, acceptance_rate=0.5, settings=settings)


def _chat(*replies: TurnStats) -> Conversation:
    messages = [m for i, st in enumerate(replies) for m in (ChatMessage("user", f"q{i}"), ChatMessage("assistant",
                                                                                                      f"a{i}", st))]
    return Conversation(None, "Tea", ChatSettings(temperature=0.2), messages)


def _table_rows(markdown: str) -> list[list[str]]:
    table = markdown.split("## Stats\n\n")[1].strip().split("\n")
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in table]


def test_a_replys_settings_round_trip_through_the_history_with_and_without_them(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat = _chat(_stats(SAMPLED), _stats(None), _stats(GREEDY))
    loaded = store.load(store.save(chat))
    assert loaded == chat  # (the fan-out a tuple again, as the reply had it)
    assert [m.stats.settings for m in loaded.messages if m.stats] == [SAMPLED, None, GREEDY]
    saved = [json.loads(row[0]) for row in sqlite3.connect(store.path).execute(
        "SELECT stats FROM messages WHERE role = 'assistant' ORDER BY position")]
    assert saved[0]["settings"]["temperature"] == SAMPLED.temperature and saved[1]["settings"] is None


def test_a_history_saved_before_replies_kept_their_settings_still_loads(tmp_path):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path).close()
    old = {"mode": "sd", "decode_tok_s": 50.0, "ttft_s": 0.1, "generated_tokens": 8, "prompt_tokens": 20,
           "reused_prefix_tokens": 0, "finish_reason": "stop", "tau": 2.0, "acceptance_rate": 0.4}
    hand_edited = {**old, "settings": {"mode": "sd", "temperature": 0.5}}  # (fields missing: no settings either)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO conversations VALUES (1, 'Old', 0, 0, ?)", (json.dumps({"mode": "sd"}),))
        db.executemany("INSERT INTO messages VALUES (1, ?, ?, ?, ?)", [
            (0, "user", "hi", None), (1, "assistant", "hello", json.dumps(old)),
            (2, "user", "again", None), (3, "assistant", "hello again", json.dumps(hand_edited))])
    loaded = HistoryStore(path).load(1)
    replies = [m.stats for m in loaded.messages if m.role == "assistant"]
    assert [st.settings for st in replies] == [None, None]
    assert replies[0] == TurnStats.from_dict(old)
    rows = _table_rows(to_markdown(loaded))
    assert rows[0][:3] == ["turn", "mode", "settings"] and [row[2] for row in rows[2:]] == ["", ""]


def test_the_settings_cell_is_compact_and_says_what_applied():
    assert SAMPLED.text() == "k 3, fan-out 1,2,2, temp 0.6, top-p 0.9, top-k 20"  # (SSD: its fan-out, set)
    assert GREEDY.text() == "temp 0"  # AR drafts nothing (no k); greedy: its filters do nothing
    rows = _table_rows(to_markdown(_chat(_stats(SAMPLED), _stats(GREEDY))))
    assert [row[2] for row in rows[2:]] == [SAMPLED.text(), GREEDY.text()]


def test_an_ssd_replys_fanout_shows_where_it_was_set():
    """The settings cell left the fan-out out: two SSD replies with another /fanout read the same."""
    default = ReplySettings("ssd", 3, None, 0.6, 1.0, 0, 64)
    assert default.text() == "k 3, temp 0.6"  # (the default fan-out: geometric for the measured acceptance)
    assert SAMPLED.text(ran="ssd").startswith("k 3, fan-out 1,2,2, ")
    assert SAMPLED.text(ran="sd") == "k 3, temp 0.6, top-p 0.9, top-k 20"  # (it ran in SD: no fan-out applied)
    assert ReplySettings("sd", 3, (1, 2, 2), 0.6, 1.0, 0, 64).text() == "k 3, temp 0.6"  # (SD fans out nothing)
    chat = _chat(_stats(SAMPLED))
    chat.settings = ChatSettings(mode="ssd", k=3, fanout=(2, 1, 1, 1), temperature=0.2)
    markdown = to_markdown(chat)
    assert "Mode `ssd`, k 3, fan-out 2,1,1,1, temperature 0.2" in markdown
    assert _table_rows(markdown)[2][2] == SAMPLED.text()


def test_a_seeded_chat_says_its_seed_where_it_sampled():
    seeded = ReplySettings("sd", 3, None, 0.6, 0.9, 0, 64, seed=42)
    assert seeded.text() == "k 3, temp 0.6, top-p 0.9, seed 42"
    assert ReplySettings("sd", 3, None, 0.0, 1.0, 0, 64, seed=42).text() == "k 3, temp 0"  # greedy: no seed applies
    assert ReplySettings.of(ChatSettings(temperature=0.6, seed=7)).seed == 7
    assert ReplySettings.from_dict({**asdict(seeded), "seed": None}).seed is None
    assert ReplySettings.from_dict({k: v for k, v in asdict(seeded).items() if k != "seed"}).seed is None  # older
    chat = _chat(_stats(seeded))
    chat.settings = ChatSettings(mode="sd", k=3, temperature=0.2, top_p=0.9, seed=42)
    assert "temperature 0.2, top-p 0.9, seed 42, max tokens" in to_markdown(chat)


@pytest.mark.asyncio
async def test_the_export_shows_each_replys_own_settings_after_a_mid_chat_change(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        first = ReplySettings.of(app.session.settings)
        await send(app, pilot, "first")
        for line in ("/temp 0.5", "/top-p 0.8", "/top-k 7"):
            await send(app, pilot, line)
        second = ReplySettings.of(app.session.settings)
        assert (second.temperature, second.top_p, second.top_k) == (0.5, 0.8, 7) and first != second
        await send(app, pilot, "second")
        await send(app, pilot, "/temp 0.9")  # after both replies: the header's, neither reply's
        await send(app, pilot, f"/export {tmp_path / 'chat.md'}")
        text = (tmp_path / "chat.md").read_text()
        assert "temperature 0.9, top-p 0.8, top-k 7," in text.split("\n")[2]
        drawn = app.session.messages[-1].stats.settings.seed  # the seed the engine drew for the sampled reply
        second = replace(second, seed=drawn)
        assert first.temperature == 0 and first.seed is None and drawn is not None
        assert [row[2] for row in _table_rows(text)[2:]] == [first.text(), second.text()]
        assert f"temp 0.5, top-p 0.8, top-k 7, seed {drawn}" in second.text()
        reopened = app.session.store.load(app.session.conversation.id)
        assert [m.stats.settings for m in reopened.messages if m.stats] == [first, second]


def test_k_shows_only_where_the_reply_drafted_or_the_chat_is_set_to_draft():
    """A reply that ran in AR after the draft process was lost (its chat in SSD) showed its chat's k in the settings
    cell, and the header sentence gave k for a chat in AR too ("Mode `ar`, k 4, ...")."""
    fell_back = TurnStats("ar", 40.0, 0.08, 12, 30, 16, "stop", settings=SAMPLED)  # (SAMPLED: an SSD chat's)
    rows = _table_rows(to_markdown(_chat(fell_back, _stats(SAMPLED))))
    assert [row[1:3] for row in rows[2:]] == [["ar", "temp 0.6, top-p 0.9, top-k 20"], ["ssd", SAMPLED.text()]]
    assert SAMPLED.text().startswith(f"k {SAMPLED.k}, ")
    for mode in ("ar", "sd", "ssd"):
        chat = Conversation(None, "Tea", ChatSettings(mode=mode, k=5, temperature=0.2), [])
        k = "" if mode == "ar" else "k 5, "
        assert to_markdown(chat).split("\n")[2].startswith(f"Mode `{mode}`, {k}temperature 0.2, ")
        assert to_text(chat).split("\n")[3].startswith(f"Mode {mode}, {k}temperature 0.2, ")


@pytest.mark.asyncio
async def test_k_is_what_the_engine_drafts_in_the_export_and_in_k_with_no_value(tmp_path):
    """/k 32 on the CPU: the engine drafts at most 31 a round (the status line says k 31), but `/k` said "(now 32)"
    and the export's settings column and header sentence said k 32."""
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "/k 32")
        await send(app, pilot, "/k")
        assert errors(app)[-1].endswith(f"(now {CPU_MAX_DRAFT})") and app.session.settings.k == 32
        await send(app, pilot, "hi")
        await send(app, pilot, f"/export {tmp_path / 'k.md'}")
        text = (tmp_path / "k.md").read_text()
        assert text.split("\n")[2].startswith(f"Mode `sd`, k {CPU_MAX_DRAFT}, ")
        assert _table_rows(text)[2][2].startswith(f"k {CPU_MAX_DRAFT}, ")
        app.engine.config.on_cuda = True  # no cap on CUDA: the chat's own
        await send(app, pilot, "/k")
        assert errors(app)[-1].endswith("(now 32)")
