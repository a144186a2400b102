"""The plain mode: prompts from stdin, replies streamed as text on stdout, a stats line after each on stderr;
errors are one line on stderr and the conversation goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import LLM, SamplingParams
from engine.errors import PromptTooLongError
from engine.outputs import RequestFinished
from ssd_chat.plain import run_plain
from tests.ssd_chat.plain_input import REPLY, feed
from tests.ssd_chat.tui_fakes import FakeEngine

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_plain_streams_replies_with_a_stats_line(monkeypatch, capsys):
    engine = FakeEngine()
    engine.speculation = engine.speculation.__class__(mode="ssd")
    feed(monkeypatch, ["hi", "", "again", "/clear", "fresh", "/exit", "never sent"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), "Be brief.")
    captured = capsys.readouterr()
    assert captured.out == 3 * (REPLY + "\n")  # the text as streamed: no markup, no wrapping, nothing else
    stats = [line for line in captured.err.splitlines() if "tok/s" in line]
    assert len(stats) == 3 and all("ssd tau 2.50 · accepted 38% · cache hits 50%" in s for s in stats)
    assert [len(m) for m, _, _ in engine.calls] == [2, 4, 2]  # system + turns; /clear starts over
    assert engine.calls[1][0][2] == {"role": "assistant", "content": REPLY}


def test_plain_refuses_an_unknown_command_and_sends_a_doubled_slash_as_a_prompt(monkeypatch, capsys):
    """The chat app's rule: a line that starts with one / is a command (a path too); // sends a literal /."""
    engine = FakeEngine()
    feed(monkeypatch, ["/mode ar", "/temp 0", "/foo", "/usr/bin/foo is a path", "//usr/bin/foo is a path", "hi",
                        "/CLEAR", "again"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: unknown command /{name}: plain mode knows /clear, /continue and /exit; start a line "
                      "with // to send one that begins with /" for name in ("mode", "temp", "foo", "usr/bin/foo")]
    assert [[m["content"] for m in messages if m["role"] == "user"] for messages, _, _ in engine.calls] == [
        ["/usr/bin/foo is a path"], ["/usr/bin/foo is a path", "hi"], ["again"]]  # /CLEAR: /clear
    assert captured.out == 3 * (REPLY + "\n")


def test_plain_reports_an_engine_error_in_one_line_and_goes_on(monkeypatch, capsys):
    engine = FakeEngine()
    feed(monkeypatch, ["too long", "fine"])
    original = engine.chat

    def chat(messages, params=None, *, cancel=None, continue_reply=False):
        if messages[-1]["content"] == "too long":
            raise PromptTooLongError("the prompt has 900 tokens but the context limit is 512: shorten it")
        return original(messages, params, cancel=cancel)

    engine.chat = chat
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[0] == (
        "error: the prompt has 900 tokens but the context limit is 512: shorten it"
    )
    assert REPLY in captured.out
    assert engine.calls[-1][0] == [{"role": "user", "content": "fine"}]  # the refused prompt is not kept


def test_plain_keeps_the_window_after_a_refused_prompt(monkeypatch, capsys):
    """A prompt too long on its own is refused: the next one still sees the earlier turns."""
    engine = FakeEngine(max_model_len=64)
    feed(monkeypatch, ["one", "two", "x " * 6000, "three"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=6), None)
    err = capsys.readouterr().err
    assert "no longer holds" not in err  # (nothing left the view)
    assert ("error: this prompt has 6,003 tokens (the chat template's included) but the context limit is 64 even "
            "with every earlier turn out of view: shorten it by 5,940 tokens or more, and more for room to "
            "reply") in err  # (not the turns' count)
    assert [m["content"] for m in engine.calls[-1][0] if m["role"] == "user"] == ["one", "two", "three"]


def test_ssd_chat_is_plain_when_piped(tiny_llama_dir):
    llm = LLM(target=str(tiny_llama_dir))
    expected = list(llm.chat([{"role": "user", "content": "Paris is"}], SamplingParams(temperature=0, max_tokens=6)))
    llm.close()
    assert isinstance(expected[-1], RequestFinished)
    result = subprocess.run(
        [sys.executable, "-m", "ssd_chat", "--target", str(tiny_llama_dir), "--temperature", "0", "--max-tokens", "6"],
        cwd=REPO_ROOT, input="Paris is\n", capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected[-1].output.text + "\n"  # the reply only: the stats line is on stderr
    assert "\x1b" not in result.stdout + result.stderr  # no TUI, no colour codes in a pipe
    assert "6 tokens · prefix reused 0/" in result.stderr.splitlines()[-1]


def test_a_line_that_is_not_utf8_is_refused_and_the_chat_goes_on(tiny_llama_dir, monkeypatch, capsys):
    feed(monkeypatch, ["Paris is", "bad \udcff\udcfe bytes", "and Rome"])
    with LLM(str(tiny_llama_dir), threads=1) as llm:
        run_plain(llm, SamplingParams(temperature=0, max_tokens=4), None)
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the text is not valid UTF-8")
    assert len([line for line in captured.err.splitlines() if "tok/s" in line]) == 2
    assert "tok/s" not in captured.out


def test_typed_at_a_terminal_into_a_file_the_file_gets_only_the_replies(monkeypatch, capsys):
    """`ssd-chat > replies.txt` at a terminal: the banner, the >>> prompts and the newline at Ctrl-D go to stderr
    (where the user looks); stdout, a file here, holds the replies alone."""
    engine = FakeEngine()
    queue = iter(["hi", "again"])

    def terminal_input(prompt: str = "") -> str:  # as input() does where stdout is no terminal
        sys.stdout.write(prompt)
        try:
            return next(queue)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", terminal_input)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    captured = capsys.readouterr()
    assert captured.out == 2 * (REPLY + "\n")
    assert "/exit or Ctrl-D quits" in captured.err and captured.err.count(">>> ") == 3


def test_plain_clear_with_words_after_it_is_refused_and_keeps_the_conversation(monkeypatch, capsys):
    engine = FakeEngine()
    feed(monkeypatch, ["hi", "/clear now", "again"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: /clear takes no argument: send /clear alone"]
    assert [len(m) for m, _, _ in engine.calls] == [1, 3]  # the second turn still sees the first


def test_plain_says_what_to_do_when_the_context_limit_cut_a_reply(tiny_llama_dir, monkeypatch, capsys):
    """As ask does: a reply the context limit cut stopped mid-sentence, and only the stats line's "stopped: context"
    said why. One dim line on stderr says so and what to do; /clear only where earlier turns take room."""
    notice = "(the reply stopped at the context limit of {} tokens: shorten the prompt{})"
    with LLM(str(tiny_llama_dir), max_model_len=128, threads=1) as llm:  # (the tiny model never ends a reply)
        feed(monkeypatch, ["Paris is"])
        run_plain(llm, SamplingParams(temperature=0, max_tokens=1000), None)
        captured = capsys.readouterr()
        assert [line for line in captured.err.splitlines() if "limit" in line] == [notice.format(128, "")]
        assert captured.out.count("\n") == 1  # stdout: the reply alone
        feed(monkeypatch, ["Paris is", "And then?"])
        run_plain(llm, SamplingParams(temperature=0, max_tokens=30), None)  # replies of 30 tokens: none cut
        assert "limit" not in capsys.readouterr().err
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=1) as llm:
        # the second reply has room for a quarter of the context (the window keeps the first turn) but not for 85
        feed(monkeypatch, ["Paris is", "And then?"])
        run_plain(llm, SamplingParams(temperature=0, max_tokens=85), None)
        err = capsys.readouterr().err.splitlines()
        assert err[0].endswith("stopped: length") and err[-2].endswith("stopped: context")
        assert err[-1] == notice.format(256, ", or /clear the earlier turns")


def test_plain_continue_writes_more_of_the_last_reply(monkeypatch, capsys):
    """/continue: the conversation with its last reply left open (continue_reply), what comes added to that reply."""
    engine = FakeEngine()
    feed(monkeypatch, ["/continue", "hi", "/continue now", "/continue", "next"])
    run_plain(engine, SamplingParams(temperature=0, max_tokens=32), None)
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == ["error: no reply to continue yet", "error: /continue takes no argument: send /continue alone"]
    assert engine.continued == [False, True, False]
    assert engine.calls[1][0] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": REPLY}]
    assert engine.calls[2][0][:2] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 2 * REPLY}]
    assert captured.out == 3 * (REPLY + "\n")
