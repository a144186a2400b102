"""Ctrl-C in the plain mode: it stops the reply where its text was printed (nothing more of it, the stats line of
the printed tokens alone, no turn where it came before the first token) and drops the lines pasted ahead."""

from __future__ import annotations

import os
import threading

from engine import SamplingParams
from engine.outputs import (
    FinishReason,
    RequestFinished,
    RequestOutput,
    RequestStats,
    SpecStats,
    StepStats,
    TokenDelta,
)
from engine.outputs import TokenSource as S
from ssd_chat.plain import discard_typed_ahead, print_stream, run_plain
from tests.ssd_chat.plain_input import REPLY, feed
from tests.ssd_chat.tui_fakes import FakeEngine


def test_ctrl_c_drops_the_lines_pasted_ahead_on_a_terminal_only():
    """The plain mode reads one prompt per line: after Ctrl-C stopped a reply, the rest of a multi-line paste
    (unread in the terminal) is dropped, so one Ctrl-C stops it all; a pipe keeps its lines."""
    import pty
    import select

    master, slave = pty.openpty()
    try:
        os.write(master, b"second line\nthird line\n")
        select.select([slave], [], [], 5)
        assert discard_typed_ahead(slave) == len(b"second line\nthird line\n")
        assert select.select([slave], [], [], 0.1)[0] == []  # nothing left to read
    finally:
        os.close(master), os.close(slave)
    read, write = os.pipe()
    try:
        os.write(write, b"next prompt\n")
        assert discard_typed_ahead(read) == 0 and os.read(read, 100) == b"next prompt\n"
    finally:
        os.close(read), os.close(write)


def test_plain_a_reply_stopped_before_its_first_token_leaves_no_turn(monkeypatch, capsys):
    engine = FakeEngine()
    feed(monkeypatch, ["hi", "stop me", "next"])
    original = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        if messages[-1]["content"] == "stop me":
            cancel.set()  # (a Ctrl-C while the engine reads the prompt)
        return original(messages, params, cancel=cancel)

    engine.chat = chat
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    assert "stopped before the reply began" in capsys.readouterr().err
    assert [m["content"] for m in engine.calls[-1][0]] == ["hi", REPLY, "next"]  # no "stop me" and empty reply


def test_plain_prints_nothing_more_of_a_reply_after_ctrl_c(monkeypatch, capsys):
    """The step under way when Ctrl-C landed still printed its token: the reply went on after the stop. What was
    printed is the partial reply the conversation keeps."""
    engine = FakeEngine(draft=None)  # (AR: a token a step)
    feed(monkeypatch, ["hi", "next"])
    original = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        for event in original(messages, params, cancel=cancel):
            if isinstance(event, TokenDelta) and event.text == " from" and messages[-1]["content"] == "hi":
                cancel.set()  # (a Ctrl-C while the step of " from" ran)
            yield event

    engine.chat = chat
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    assert capsys.readouterr().out == "Hello\n" + REPLY + "\n"
    assert [m["content"] for m in engine.calls[-1][0]] == ["hi", "Hello", "next"]


def test_plain_stats_after_ctrl_c_count_only_the_tokens_printed(monkeypatch, capsys):
    """The step under way when Ctrl-C landed ran on and its tokens were not printed: the stats line counted them."""
    engine = FakeEngine(accept=1)  # (SD: a step gives its accepted draft and a recovery token)
    feed(monkeypatch, ["hi"])
    original, generated = engine.chat, []

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        deltas = 0
        for event in original(messages, params, cancel=cancel):
            deltas += isinstance(event, TokenDelta)
            if deltas == 3:
                cancel.set()  # (a Ctrl-C while the third step ran)
            if isinstance(event, RequestFinished):
                generated.append(event.output.stats.generated_tokens)
            yield event

    engine.chat = chat
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    captured = capsys.readouterr()
    printed = captured.out.removesuffix("\n")
    printed_tokens = next(n for n in range(len(engine.words) + 1) if "".join(engine.words[:n]) == printed)
    assert 1 < printed_tokens < generated[0]  # (the engine generated the step the user did not see)
    stats = [line for line in captured.err.splitlines() if "tok/s" in line]
    assert len(stats) == 1 and f" {printed_tokens} tokens " in stats[0] and stats[0].endswith("stopped: cancelled")


def test_print_stream_counts_a_textless_deltas_tokens_once_their_text_is_printed():
    """A delta with no text (half a character, a possible stop string) prints its tokens with the next one's text:
    they count then, and not where Ctrl-C came first."""
    def events(cancel):
        yield TokenDelta(1, (5,), "Caf")
        yield TokenDelta(1, (6,), "")  # the first byte of "é"
        yield TokenDelta(1, (7, 8), "é au")
        yield TokenDelta(1, (9,), "")
        cancel.set()
        yield TokenDelta(1, (10, 11), "é lait")
        yield RequestFinished(1, output)

    output = RequestOutput(1, [1], list(range(5, 12)), "Café au é lait", FinishReason.CANCELLED, None)
    cancel = threading.Event()
    streamed = print_stream(events(cancel), None, cancel=cancel)
    assert streamed.text == "Café au" and streamed.tokens == len([5, 6, 7, 8]) and streamed.output is output


def test_print_stream_figures_after_ctrl_c_are_those_of_the_text_printed():
    """tok/s and tau after a Ctrl-C took in the step that ran on unprinted (the engine's figures): they are now the
    printed steps' and the time between the first text printed and the last."""
    def events(cancel):
        yield TokenDelta(1, (0,), "A", (S.TARGET,))  # the prefill's token
        yield StepStats(1, num_drafted=4, num_accepted=3, verify_time_s=0.1, draft_time_s=0.1)
        yield TokenDelta(1, (1, 2, 3, 4), "BCDE")
        yield StepStats(1, num_drafted=4, num_accepted=1, verify_time_s=0.1, draft_time_s=0.1)
        yield TokenDelta(1, (5, 6), "FG")
        cancel.set()  # (a Ctrl-C while the next step ran: all 4 drafts accepted, 5 tokens, never printed)
        yield StepStats(1, num_drafted=4, num_accepted=4, verify_time_s=0.1, draft_time_s=0.1)
        yield TokenDelta(1, (7, 8, 9, 10, 11), "HIJKL")
        yield RequestFinished(1, output)

    spec = SpecStats(num_steps=3, num_drafted=12, num_accepted=8, num_emitted=11, accepted_per_position=(3, 2, 2, 1),
                     drafted_per_position=(3, 3, 3, 3))
    engine_stats = RequestStats(mode="sd", prompt_tokens=10, reused_prefix_tokens=0, prefill_tokens=10,
                                generated_tokens=12, ttft_s=0.05, decode_time_s=1.0, total_time_s=1.05, spec=spec)
    output = RequestOutput(1, [1], list(range(12)), "ABCDEFGHIJKL", FinishReason.CANCELLED, engine_stats)
    ticks = iter([1.0, 2.0, 3.0])  # the clock as each text is printed: "A", "BCDE", "FG"
    cancel = threading.Event()
    streamed = print_stream(events(cancel), None, cancel=cancel, clock=lambda: next(ticks))
    stats = streamed.stats
    assert streamed.text == "ABCDEFG" and stats.generated_tokens == 7
    assert stats.decode_tok_s == 3.0  # 6 tokens after the first in 2 s (the engine's: 11 in 1 s)
    assert stats.tau == 3.0 and stats.acceptance_rate == 0.5  # 6 tokens in 2 steps, 4 of 8 drafts (engine: 3.67, 67%)
    assert stats.line() == ("3.0 tok/s · TTFT 50 ms · 7 tokens · prefix reused 0/10 · sd tau 3.00 · accepted 50% · "
                            "stopped: cancelled")
