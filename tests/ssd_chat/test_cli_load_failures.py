"""A failure while the engine loads (`ask`, the plain mode) or while `bench` runs is one `error:` line on stderr and
exit code 1, as a failure while `ask` writes a reply is (test_cli_exits): the load's ended in a traceback and the
bench was not wrapped at all. The user's errors stay exit code 2. A BrokenPipeError there is the engine's (a pipe to a
process of its own: nothing writes to stdout then); it ended the run as a reader gone, with 141 and not a word."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.errors import InvalidParameterError
from ssd_chat import cli
from ssd_chat.prompts import BenchInputError

runner = CliRunner()
COMMANDS = {"ask": ["ask", "hi"], "plain": ["--plain"]}


def _raising(error: Exception):
    def load(*args, **kwargs):
        raise error

    return load


def _one_line(result, code: int) -> str:
    assert result.exit_code == code, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # (not the error itself: no traceback)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize("error", [RuntimeError("CUDA error: out of memory"), OSError(5, "Input/output error"),
                                   BrokenPipeError(32, "Broken pipe")], ids=["RuntimeError", "OSError", "BrokenPipe"])
def test_a_failure_while_the_engine_loads_is_one_line_and_exit_1(monkeypatch, command, error):
    monkeypatch.setattr(cli, "LLM", _raising(error))
    line = _one_line(runner.invoke(cli.app, [*command, "--draft", "none"], input="hi\n"), 1)
    assert line == f"error: the engine failed to load ({type(error).__name__}: {error})"


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_user_error_while_the_engine_loads_stays_exit_2(monkeypatch, command):
    monkeypatch.setattr(cli, "LLM", _raising(InvalidParameterError("--attention flashinfer needs a CUDA device")))
    line = _one_line(runner.invoke(cli.app, [*command, "--draft", "none"], input="hi\n"), 2)
    assert line == "error: --attention flashinfer needs a CUDA device"


@pytest.mark.parametrize(("error", "code", "says"), [
    (RuntimeError("cannot sample"), 1, "error: the engine failed (RuntimeError: cannot sample)"),
    (OSError(5, "Input/output error"), 1, "error: the engine failed (OSError: [Errno 5] Input/output error)"),
    (BrokenPipeError(32, "Broken pipe"), 1, "error: the engine failed (BrokenPipeError: [Errno 32] Broken pipe)"),
    (InvalidParameterError("unknown model 'x'"), 2, "error: unknown model 'x'"),
    (BenchInputError("prompts.txt has no prompts"), 2, "error: prompts.txt has no prompts"),
])
def test_a_failure_in_the_bench_is_one_line(monkeypatch, error, code, says):
    import ssd_chat.bench

    monkeypatch.setattr(ssd_chat.bench, "run_bench", _raising(error))
    assert _one_line(runner.invoke(cli.app, ["bench"]), code) == says
