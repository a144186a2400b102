"""How `ssd-chat` ends: closed stdin or stdout, a reader gone, Ctrl-C and stop signals mid-reply or while it starts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from engine.outputs import TokenDelta
from ssd_chat import cli, stop_signals
from tests.ssd_chat.cli_runs import BUFFERED_ENV, REPO_ROOT, greedy_chat

runner = CliRunner()


@pytest.mark.parametrize("args", [["ask", "-"], ["--plain"], []], ids=["ask -", "plain", "piped chat"])
def test_a_closed_stdin_is_a_one_line_error(args, tiny_llama_dir):
    """`ssd-chat ask - <&-`: Python's sys.stdin is None, and the prompt (or the plain mode's lines) cannot come."""
    result = subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args, "--target", str(tiny_llama_dir)], cwd=REPO_ROOT,
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stdin is closed"), result.stderr


@pytest.mark.parametrize("args", [["ask", "Paris is"], ["--plain"], ["models"], ["bench", "--limit", "1"]],
                         ids=["ask", "plain", "models", "bench"])
def test_a_closed_stdout_is_a_one_line_error(args, tiny_llama_dir):
    """`ssd-chat ... >&-`: Python's sys.stdout is None; input() and rich raised, and ask's reply was dropped."""
    result = subprocess.run(
        [sys.executable, "-m", "ssd_chat", *args, *([] if args == ["models"] else ["--target", str(tiny_llama_dir)])],
        cwd=REPO_ROOT, input="Paris is\n", capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120, preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stdout is closed"), result.stderr


@pytest.mark.parametrize("args", [["ask", "Paris is"], ["ask", "Paris is", "--json"], ["--plain"]],
                         ids=["ask", "ask --json", "plain"])
def test_a_reader_gone_ends_it_quietly_as_sigpipe_would(args, tiny_llama_dir):
    """`ssd-chat ask ... | head -c 10`: the write after stdout's reader went away (here before the first write:
    the same BrokenPipeError) ends it with 128 + SIGPIPE, and no traceback (the same mid-reply in SSD:
    test_stop_signals)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ssd_chat", *args, "--target", str(tiny_llama_dir), "--max-tokens", "8"],
            cwd=REPO_ROOT, input="Paris is\n", stdout=write, stderr=subprocess.PIPE, text=True,
            env={**BUFFERED_ENV, "HF_HUB_OFFLINE": "1"}, timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr
    assert proc.stderr == ""


def test_the_plain_modes_rich_writes_to_a_gone_reader_end_with_141(tiny_llama_dir):
    """With stdin a terminal the plain mode's first write is its banner, through rich, whose own broken-pipe
    handling exited with 1 (so did its stats line). With stdout no terminal the banner goes to stderr: here both
    go to the gone reader, as with `2>&1 | head`."""
    import pty

    master, slave = pty.openpty()
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ssd_chat", "--plain", "--target", str(tiny_llama_dir), "--max-tokens", "8"],
            cwd=REPO_ROOT, stdin=slave, stdout=write, stderr=write, text=True,
            env={**BUFFERED_ENV, "HF_HUB_OFFLINE": "1"}, timeout=120,
        )
    finally:
        for fd in (write, slave, master):
            os.close(fd)
    assert proc.returncode == 128 + signal.SIGPIPE  # (a traceback, or rich's own handling, exits with 1)


class _CtrlCAfterTwoDeltas:
    """The real engine, with Ctrl-C (SIGINT) pressed after the first reply's second token delta."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.config = llm.config
        self.max_model_len, self.encode_chat = llm.max_model_len, llm.encode_chat
        self.calls: list[list[dict[str, str]]] = []

    def chat(self, messages, params, *, cancel=None, continue_reply=False):
        self.calls.append([dict(m) for m in messages])
        num_deltas = 0
        for event in self.llm.chat(messages, params, cancel=cancel):
            yield event
            num_deltas += isinstance(event, TokenDelta)
            if len(self.calls) == 1 and num_deltas == 2:
                os.kill(os.getpid(), signal.SIGINT)


def _type_lines(monkeypatch, typed: list[str]) -> None:
    """input() gives these lines, then EOF (Ctrl-D)."""
    lines = iter(typed)

    def fake_input(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)


def test_ctrl_c_cancels_the_reply_and_keeps_the_partial_text(tiny_llama_dir, monkeypatch, capsys):
    llm = LLM(target=str(tiny_llama_dir))
    proxy = _CtrlCAfterTwoDeltas(llm)
    _type_lines(monkeypatch, ["hi", "again"])
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under a background `cmd &`
    try:
        cli.run_repl(proxy, SamplingParams(temperature=0, max_tokens=8), system=None)
    finally:
        llm.close()
    captured = capsys.readouterr()
    out = captured.err  # the stats lines
    cancelled = re.search(r"· (\d+) tokens? · .* stopped: cancelled", out)
    assert cancelled, out
    assert re.search(r"· 8 tokens · ", out), out  # the next turn runs to completion
    partial = captured.out.splitlines()[0]  # the reply as printed (not what arrived after the Ctrl-C)
    assert partial and greedy_chat(tiny_llama_dir, "hi", 2).text.startswith(partial)
    printed = int(cancelled.group(1))  # the tokens printed (plain.Streamed), at most the 2 that arrived
    assert 1 <= printed <= 2 and greedy_chat(tiny_llama_dir, "hi", printed).text == partial
    assert proxy.calls[1] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": partial},
        {"role": "user", "content": "again"},
    ]
    assert signal.getsignal(signal.SIGINT) is before  # the chat's own Ctrl-C handler is gone again


@pytest.fixture
def own_signals():
    """main() installs its own Ctrl-C, SIGTERM and SIGHUP handlers (and ignores them once it is done): the test's
    process gets its own back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *stop_signals.STOP_SIGNALS)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


class _FailsOnce(_CtrlCAfterTwoDeltas):
    """The real engine, whose first reply fails inside the engine after its first token delta."""

    def chat(self, messages, params, *, cancel=None, continue_reply=False):
        self.calls.append([dict(m) for m in messages])
        for event in self.llm.chat(messages, params, cancel=cancel):
            yield event
            if len(self.calls) == 1:
                raise RuntimeError("cannot sample from a distribution of total mass nan")


def test_a_failure_inside_the_engine_is_one_line_and_the_chat_goes_on(tiny_llama_dir, monkeypatch, capsys):
    """No traceback and no lost session: the failed prompt is not part of the conversation, the next one runs."""
    llm = LLM(target=str(tiny_llama_dir))
    proxy = _FailsOnce(llm)
    _type_lines(monkeypatch, ["hi", "again"])
    try:
        cli.run_repl(proxy, SamplingParams(temperature=0, max_tokens=8), system=None)
    finally:
        llm.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    failed = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(failed) == 1 and "the engine failed (RuntimeError: cannot sample" in failed[0], err
    assert re.search(r"· 8 tokens · ", err), err  # the next prompt ran to completion
    assert proxy.calls[1] == [{"role": "user", "content": "again"}]  # without the failed turn


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["ask", "ask --json"])
def test_ask_ends_a_failure_inside_the_engine_in_one_line(json_flag, tiny_llama_dir, monkeypatch):
    """`ask` ended with a traceback and exit 1 where the plain mode says one line: now the same line, on stderr,
    and exit 1 (a user error is 2); the reply's printed part keeps its line end."""

    printed = []

    def failing_llm(**kwargs):
        llm = LLM(**kwargs)
        chat = llm.chat

        def failing_chat(messages, params=None, *, cancel=None):
            for event in chat(messages, params, cancel=cancel):
                yield event
                if isinstance(event, TokenDelta) and event.text:
                    printed.append(event.text)
                    raise RuntimeError("cannot sample from a distribution of total mass nan")

        llm.chat = failing_chat
        return llm

    monkeypatch.setattr(cli, "LLM", failing_llm)
    result = runner.invoke(cli.app, ["ask", "Paris is", "--target", str(tiny_llama_dir), "--temperature", "0",
                                     "--max-tokens", "8", *json_flag])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # (not the RuntimeError: no traceback)
    assert result.stderr.splitlines() == [
        "error: the engine failed (RuntimeError: cannot sample from a distribution of total mass nan)"]
    assert result.stdout == ("" if json_flag else printed[0] + "\n")


def test_ctrl_c_while_the_modules_import_exits_130_without_a_traceback(monkeypatch, capsys, own_signals):
    from ssd_chat import entry

    def interrupted(name: str):
        raise KeyboardInterrupt

    monkeypatch.setattr(entry.importlib, "import_module", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 130
    assert "Traceback" not in capsys.readouterr().err


def test_a_reply_stopped_mid_line_ends_its_line(monkeypatch, capsys, own_signals):
    """A second Ctrl-C (or SIGTERM) mid-reply in `ask`, through the real CLI: the partial reply's line is ended, so
    the shell's prompt does not start on it; exit 130, no traceback. (typer turns the interrupt into exit 130
    itself, so the line has to end where the reply is written.)"""
    from engine.outputs import TokenDelta
    from ssd_chat import cli

    class Interrupted:
        vocab_size = 49152

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def chat(self, messages, params):
            yield TokenDelta(0, (5,), "a partial rep")
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "LLM", lambda **kwargs: Interrupted())
    monkeypatch.setattr(sys, "argv", ["ssd-chat", "ask", "hi"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 130 and captured.out == "a partial rep\n" and "Traceback" not in captured.err


def test_a_reader_gone_as_the_reply_ends_exits_as_sigpipe_would_not_120(tiny_llama_dir):
    """`ssd-chat ask ... | head -c 1` where the reply's text was out before the reader went: only its closing newline
    was left, in stdout's buffer, and the interpreter's flush at exit met the broken pipe: exit 120 and "Exception
    ignored ... BrokenPipeError" (test_stop_signals' SSD reader-gone test, under load). Here the reply has no text,
    so that newline is the only write."""
    script = textwrap.dedent(f"""
        import sys
        from engine.outputs import FinishReason, RequestFinished, RequestOutput, RequestStats
        from ssd_chat import cli

        class NoText:
            max_model_len = model_max_len = 512
            vocab_size = 49152

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def chat(self, messages, params):
                stats = RequestStats("ar", 3, 0, 3, 0, 0.0, 0.0, 0.0)
                yield RequestFinished(0, RequestOutput(0, [1, 2, 3], [], "", FinishReason.STOP, stats))

        cli.LLM = lambda **kwargs: NoText()
        sys.argv = ["ssd-chat", "ask", "hi", "--target", {str(tiny_llama_dir)!r}, "--mode", "ar"]
        cli.main()
    """)
    read, write = os.pipe()
    os.close(read)  # the reader is gone
    try:
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=write, stderr=subprocess.PIPE,
                              text=True, env={**BUFFERED_ENV, "HF_HUB_OFFLINE": "1"}, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr
    assert proc.stderr == ""
