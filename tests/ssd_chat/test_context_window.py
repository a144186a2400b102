"""Long conversations: the model sees the system prompt and the latest turns that fit its context with room for a
reply; the window's start moves rarely (down to half the context), every turn stays in the transcript and the
history, and a move is said once."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from ssd_chat.context_window import reply_reserve, window_start
from ssd_chat.plain import run_plain
from tests.ssd_chat.plain_input import feed
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, send, settle

ROLES = ["user", "assistant"] * 5 + ["user"]  # five turns and a new prompt


def sizes(per_message: int):
    """prompt_tokens for messages i.. of ROLES when every message is `per_message` tokens."""
    return lambda i: per_message * (len(ROLES) - i)


def test_a_conversation_that_fits_keeps_its_start():
    assert window_start(ROLES, 0, sizes(10), limit=200, reserve=50) == 0
    assert window_start(ROLES, 4, sizes(10), limit=200, reserve=50) == 4  # an earlier move stays


def test_overflow_drops_whole_turns_down_to_half_the_context():
    start = window_start(ROLES, 0, sizes(10), limit=120, reserve=20)  # 110 + 20 > 120
    assert ROLES[start] == "user" and sizes(10)(start) + 20 <= 60 and sizes(10)(start - 2) + 20 > 60
    assert window_start(ROLES, start, sizes(10), limit=120, reserve=20) == start  # the next turn: no move


def test_when_half_is_out_of_reach_it_keeps_what_fits():
    def big_last(i: int) -> int:  # the new prompt alone is 70 tokens
        return 70 + 10 * (len(ROLES) - 1 - i)

    start = window_start(ROLES, 0, big_last, limit=120, reserve=20)
    assert big_last(start) + 20 <= 120 and big_last(start - 2) + 20 > 120


def test_a_prompt_too_long_alone_is_left_to_the_engine():
    assert window_start(ROLES, 0, sizes(100), limit=120, reserve=20) == len(ROLES) - 1
    assert window_start(ROLES, 2, sizes(120), limit=120, reserve=20) == 2  # refused: the window stays


def test_an_edited_history_starts_at_a_prompt():
    assert window_start(["user", "assistant", "user"], 5, sizes(1), limit=100, reserve=0) == 2
    assert window_start(["user", "assistant", "user", "assistant", "user"], 1, sizes(1), limit=100,
                        reserve=0) == 2


def test_the_reply_reserve_is_at_most_a_quarter():
    assert reply_reserve(512, 8192) == 512 and reply_reserve(4096, 8192) == 2048


@pytest.mark.asyncio
async def test_the_chat_app_sends_the_latest_turns_and_keeps_them_all(tmp_path):
    engine = FakeEngine(max_model_len=60)  # each turn: ~4 + 9 tokens; replies reserve 15 (a quarter)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for n in range(6):
            await send(app, pilot, f"question number {n}")
        seen = [m["content"] for m in engine.calls[-1][0]]
        assert seen[-1] == "question number 5" and "question number 0" not in seen
        assert sum(len(engine.encode_chat([m])) for m in engine.calls[-1][0]) + 15 <= 60
        assert len(app.session.messages) == 12  # the transcript and history keep every turn
        notes = [n.message for n in app._notifications if "context" in n.message]
        assert len(notes) >= 1 and "first" in notes[0]
        starts = [next(i for i, m in enumerate(app.session.messages) if m.content == c[0][0]["content"])
                  for c in engine.calls]
        assert starts == sorted(starts) and len(set(starts)) < len(starts)  # the start moves rarely
        await send(app, pilot, "/clear")
        await send(app, pilot, "fresh")
        assert [m["content"] for m in engine.calls[-1][0]] == ["fresh"]


def test_the_plain_mode_sends_the_latest_turns(monkeypatch, capsys):
    engine = FakeEngine(max_model_len=60)
    feed(monkeypatch, [f"question number {n}" for n in range(6)])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), "Be brief.")
    captured = capsys.readouterr()
    assert captured.out.count("Hello from the **fake** engine.") == 6
    last = engine.calls[-1][0]
    assert last[0] == {"role": "system", "content": "Be brief."} and last[-1]["content"] == "question number 5"
    assert "question number 0" not in [m["content"] for m in last]
    assert "no longer holds the first" in captured.err and "error" not in captured.err


def test_a_real_engine_chats_past_its_context(tiny_llama_dir, monkeypatch, capsys):
    with LLM(str(tiny_llama_dir), max_model_len=128, threads=1) as llm:
        feed(monkeypatch, [f"tell me about the number {n} and its neighbours" for n in range(12)])
        run_plain(llm, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), None)
    captured = capsys.readouterr()
    assert "error" not in captured.err and "no longer holds" in captured.err
    assert len([line for line in captured.err.splitlines() if "tok/s" in line]) == 12


def test_a_refusal_says_when_the_system_prompt_is_what_does_not_fit():
    """The engine counts the system prompt and the turns in view: "the prompt has 9032 tokens" of a 2-word prompt."""
    from ssd_chat.context_window import system_prompt_refusal

    engine, fix = FakeEngine(max_model_len=8192), "change it"

    def chat(system: str | None, prompt: str) -> list[dict[str, str]]:
        turns = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": prompt}]
        return ([{"role": "system", "content": system}] if system is not None else []) + turns

    assert system_prompt_refusal(engine, chat("word " * 9000, "hello there"), fix) == (
        "the system prompt has 9,003 tokens but the context limit is 8,192: change it")
    assert system_prompt_refusal(engine, chat("word " * 5000, "word " * 4000), fix) == (
        "this prompt (4,003 tokens) and the system prompt (5,003 tokens) together pass the context limit of 8,192: "
        "shorten the prompt, or change it")
    assert system_prompt_refusal(engine, chat("Be brief.", "word " * 9000), fix) is None  # the prompt alone: too long
    assert system_prompt_refusal(engine, chat(None, "word " * 9000), fix) is None


@pytest.mark.asyncio
async def test_the_app_says_when_the_system_prompt_does_not_fit(tmp_path):
    from engine.errors import PromptTooLongError
    from ssd_chat.history import ChatSettings
    from ssd_chat.tui.widgets.prompt_input import PromptArea

    engine = FakeEngine(max_model_len=8192)
    settings = ChatSettings(mode="sd", temperature=0.0, max_tokens=64, system="word " * 9000)
    app = make_app(engine, tmp_path, settings=settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        engine.error = PromptTooLongError("the prompt has 9032 tokens but the context limit is 8192: shorten it")
        await send(app, pilot, "hello there")
        told = [n.message for n in app._notifications if n.title == "not sent"]
        assert told == ["the system prompt has 9,003 tokens but the context limit is 8,192: /system TEXT sets a "
                        "shorter system prompt, /system alone removes it"]
        assert app.query_one(PromptArea).text == "hello there"


def test_the_plain_mode_says_when_its_system_prompt_does_not_fit(monkeypatch, capsys):
    from engine.errors import PromptTooLongError

    engine = FakeEngine(max_model_len=8192, error=PromptTooLongError("the prompt has 9032 tokens: shorten it"))
    feed(monkeypatch, ["hello there"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), "word " * 9000)
    assert capsys.readouterr().err.strip() == ("error: the system prompt has 9,003 tokens but the context limit is "
                                               "8,192: start again with a shorter --system, or none")


def test_a_refusal_counts_the_prompt_not_the_turns_that_leave_the_view():
    """The engine counts the turns in view beside the prompt ("the prompt has 14842 tokens" of an 8,572-token paste
    after two turns): the app says the size of what the user can change, and by how much."""
    from ssd_chat.context_window import prompt_refusal

    engine, fix = FakeEngine(max_model_len=8192), "change it"
    earlier = [{"role": "user", "content": "word " * 3000}, {"role": "assistant", "content": "word " * 3000}]
    prompt = [{"role": "user", "content": "word " * 8569}]  # 8,572 tokens with the template's 3
    raw = "the prompt has 14581 tokens but the context limit is 8192: shorten it, or raise --max-model-len (up to 9000)"
    assert prompt_refusal(engine, earlier + prompt, fix, raw) == (
        "this prompt has 8,572 tokens (the chat template's included) but the context limit is 8,192 even with every "
        "earlier turn out of view: shorten it by 381 tokens or more, and more for room to reply, or raise "
        "--max-model-len (up to 9000)")
    system = [{"role": "system", "content": "word " * 147}]  # 150 tokens
    assert prompt_refusal(engine, system + earlier + prompt, fix, "the prompt has 14731 tokens: shorten it") == (
        "this prompt has 8,572 tokens (the chat template's included) and the system prompt 150 more, 8,722 in all, "
        "but the context limit is 8,192 even with every earlier turn out of view: shorten the prompt by 531 tokens "
        "or more, and more for room to reply")
    huge = [{"role": "system", "content": "word " * 9000}]  # the system prompt alone: no prompt fits beside it
    assert prompt_refusal(engine, huge + prompt, fix, "the prompt has 17575 tokens: shorten it") == (
        "the system prompt has 9,003 tokens but the context limit is 8,192: change it")
    count = engine.encode_chat  # a template with a default system prompt (SmolLM2's) longer than the one given

    def encode(messages):
        return count(messages) + [0] * (0 if messages and messages[0]["role"] == "system" else 20)

    engine.encode_chat = encode
    short = [{"role": "system", "content": "Be brief."}]
    assert prompt_refusal(engine, short + prompt, fix, "the prompt has 8577 tokens: shorten it") == (
        "this prompt has 8,592 tokens (the chat template's included) but the context limit is 8,192 even with every "
        "earlier turn out of view: shorten the prompt by 386 tokens or more, and more for room to reply")
    engine.encode_chat = count
    fits = [{"role": "user", "content": "word " * 8188}]  # 8,191 tokens: sent (with earlier turns out of view)
    assert window_start(["user", "assistant", "user"], 0, lambda i: 8191 if i == 2 else 14200, 8192, 64) == 2
    assert prompt_refusal(engine, earlier + fits, fix, "another refusal") == "another refusal"


@pytest.mark.asyncio
async def test_the_app_gives_the_size_of_a_refused_prompt_without_the_earlier_turns(tmp_path):
    from engine.request import check_prompt
    from ssd_chat.history import ChatSettings

    engine = FakeEngine(max_model_len=8192)

    def like_the_engine(messages, params=None, *, cancel=None, continue_reply=False):  # it counts every message
        # sent (the turns in view too)
        check_prompt(engine.encode_chat(messages), 1, engine.max_model_len, engine.max_model_len)
        engine.calls.append((messages, params, engine.speculation.mode))
        return engine._events(len(engine.calls), len(messages), engine.speculation, params, cancel)

    engine.chat = like_the_engine
    app = make_app(engine, tmp_path, settings=ChatSettings(mode="sd", temperature=0.0, max_tokens=16))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "word " * 3000)
        await send(app, pilot, "word " * 3000)
        await send(app, pilot, "word " * 8569)
        told = [n.message for n in app._notifications if n.title == "not sent"]
        assert told == ["this prompt has 8,572 tokens (the chat template's included) but the context limit is 8,192 "
                        "even with every earlier turn out of view: shorten it by 381 tokens or more, and more for "
                        "room to reply"]
        assert len(app.session.messages) == 4


@pytest.mark.asyncio
async def test_a_resumed_chat_shows_the_model_the_turns_it_saw_before(tmp_path):
    """The window was not saved: reopened, it was 0 and moved down to half the context at the next prompt, so the
    model saw one turn where it had seen two. Each reply's stats keep it now (a chat saved before: 0, as before)."""
    from ssd_chat.history import ChatSettings, HistoryStore, TurnStats

    settings = ChatSettings(mode="sd", temperature=0.0, max_tokens=16)  # a reply: 8 tokens; 16 kept for it
    prompts = [("word " * n).strip() for n in (24, 27, 26, 20)]  # 27, 30, 29, 23 tokens in a context of 100
    app = make_app(FakeEngine(max_model_len=100), tmp_path, settings=settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for prompt in prompts:
            await send(app, pilot, prompt)
        assert any("no longer holds the first 4 messages" in n.message for n in app._notifications)
    engine = FakeEngine(max_model_len=100)
    app = make_app(engine, tmp_path, settings=settings, resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "ok")  # the third and fourth turns fit beside it, as before the quit
        assert [m["content"] for m in engine.calls[-1][0] if m["role"] == "user"] == [*prompts[2:], "ok"]
    saved = HistoryStore(tmp_path / "history.sqlite3").latest()
    assert [m.stats.window for m in saved.messages if m.stats is not None] == [0, 0, 4, 4, 4]
    assert TurnStats.from_dict({"mode": "ar", "decode_tok_s": 1.0, "ttft_s": 0.1, "generated_tokens": 1,
                                "prompt_tokens": 5, "reused_prefix_tokens": 0, "finish_reason": "stop"}).window == 0
