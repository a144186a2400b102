"""The prefill progress line of the plain mode and `ask`: rewritten in place on a terminal, erased when the reply
starts or the request ends, and absent where stderr is a pipe or a file."""

from __future__ import annotations

import io
import os

from engine import SamplingParams
from engine.outputs import PrefillProgress, ThreadsChanged, TokenDelta
from ssd_chat import plain
from ssd_chat.plain import run_plain
from ssd_chat.prefill_line import ERASE, PrefillLine
from tests.ssd_chat.plain_input import REPLY, feed
from tests.ssd_chat.tui_fakes import FakeEngine


def test_the_line_is_rewritten_then_erased_by_the_reply():
    out = io.StringIO()
    line = PrefillLine(out, enabled=True)
    for event in (PrefillProgress(1, 256, 1000), ThreadsChanged(1, 1, 2), PrefillProgress(1, 512, 1000),
                  TokenDelta(1, (5,), "Hi")):  # (a change of thread count mid-prefill leaves the line)
        line.update(event)
    line.update(TokenDelta(1, (6,), "!"))
    line.clear()
    assert out.getvalue() == (f"{ERASE}reading the prompt: 256 / 1,000 tokens (Ctrl-C stops)"
                              f"{ERASE}reading the prompt: 512 / 1,000 tokens (Ctrl-C stops){ERASE}")


def test_the_line_is_cut_to_a_narrow_terminal(monkeypatch):
    """A wrapped line could not be rewritten in place: each update would leave a line behind."""
    monkeypatch.setattr("ssd_chat.prefill_line.os.get_terminal_size", lambda fd: os.terminal_size((30, 10)))
    out = io.StringIO()
    out.fileno = lambda: 2
    PrefillLine(out, enabled=True).update(PrefillProgress(1, 256, 1000))
    assert out.getvalue() == ERASE + "reading the prompt: 256 / 1,0"  # 29 columns


def test_nothing_is_written_where_the_stream_is_no_terminal():
    out = io.StringIO()
    line = PrefillLine(out)
    line.update(PrefillProgress(1, 256, 1000))
    line.clear()
    assert not line.enabled and out.getvalue() == ""


def test_the_plain_mode_shows_a_long_prompts_progress_on_a_terminal_only(monkeypatch, capsys):
    engine = FakeEngine(prefill_chunks=2)
    feed(monkeypatch, ["a long paste"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    piped = capsys.readouterr()
    assert piped.out == REPLY + "\n" and "reading the prompt" not in piped.err

    shown = io.StringIO()
    monkeypatch.setattr(plain, "PrefillLine", lambda **kwargs: PrefillLine(shown, enabled=True))
    feed(monkeypatch, ["a long paste"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    assert capsys.readouterr().out == REPLY + "\n"  # stdout keeps the reply alone
    assert shown.getvalue().count("reading the prompt: ") == 2 and shown.getvalue().endswith(ERASE)

