"""Every usage error of the command line is one line in the commands' own style, naming the option: a value an
option's parser refused said click's `Invalid value for '--threads': takes ...` (in a box in typer's standalone
mode) beside our own `--mode takes ar, sd or ssd; got 'x'`; an unknown option said `No such option: --thread
(Possible options: --threads)`, with no word of what to do. Still exit code 2; --help still prints the help."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ssd_chat import cli
from tests.ssd_chat.cli_runs import REPO_ROOT, run_ssd_chat


def _no_engine(**kwargs):
    pytest.fail("a model loaded")


@pytest.mark.parametrize(("args", "line"), [
    (["ask", "hi", "--threads", "0"], "--threads takes a number of CPU threads, 1 to 1024; got 0"),
    (["ask", "hi", "--k", "1_0"], "--k takes a whole number (ASCII digits, as 4); got '1_0'"),
    (["ask", "hi", "-t", "x", "--top-p", "x"], "--top-p takes a number (ASCII digits, a sign, a decimal point and an "
                                               "exponent, as 0.7, -1 or 1e-3); got 'x'"),
    (["ask", "hi", "--dtype", "float8"], "--dtype takes auto, float32, bfloat16 or float16; got 'float8'"),
    (["ask", "hi", "--sampler", "gumbel"], "--sampler takes coupled or rejection; got 'gumbel'"),
    (["--sampler", "rejection"], "--sampler is an option of ssd-chat ask and ssd-chat bench, not of the chat: give it "
                                 "after the command's name (ssd-chat ask ... --sampler)"),
    (["ask", "hi", "--thread", "2"], "--thread is no option of ssd-chat ask (did you mean --threads or "
                                     "--fixed-threads?): see ssd-chat ask --help"),
    (["ask", "hi", "--zzz"], "--zzz is no option of ssd-chat ask: see ssd-chat ask --help"),
    (["bench", "--thread", "2"], "--thread is no option of ssd-chat bench (did you mean --threads or "
                                 "--fixed-threads?): see ssd-chat bench --help"),  # (click's third guess: --raw)
    (["--json=yes"], "--json is an option of ssd-chat ask and ssd-chat bench, not of the chat: give it after the "
                     "command's name (ssd-chat ask ... --json)"),  # (it said: did you mean --version?)
    (["--hf"], "--hf is an option of ssd-chat bench, not of the chat: give it after the command's name (ssd-chat "
               "bench ... --hf)"),
    (["--thread", "2"], "--thread is no option of ssd-chat (did you mean --threads or --fixed-threads?): see "
                        "ssd-chat --help"),
    (["ask", "hi", "-v"], "-v is an option of ssd-chat itself: give it before the command (ssd-chat -v ask ...)"),
    (["bench", "--verbose"], "--verbose is an option of ssd-chat itself: give it before the command (ssd-chat -v "
                             "bench ...)"),
    # a missing argument or option said "Missing argument 'prompt'", "Missing option '--out'"
    (["ask"], 'ask needs a prompt (ssd-chat ask "your question", or - to read stdin): see ssd-chat ask --help'),
    (["distill"], "distill needs --out: see ssd-chat distill --help"),
    # an option with no value, last on the line, said no more: no pointer to the command's --help
    (["distill", "--target", "smollm2-135m", "--out"], "--out needs a value: see ssd-chat distill --help"),
    (["ask", "hi", "--max-tokens"], "--max-tokens needs a value: see ssd-chat ask --help"),
    (["ask", "hi", "--k"], "--k needs a value: see ssd-chat ask --help"),
    (["--threads"], "--threads needs a value: see ssd-chat --help"),
    (["ask", "hi", "--json=yes"], "--json takes no value: see ssd-chat ask --help"),  # (click's "Option '--json'
    # does not take a value.")
    (["nope"], "No such command 'nope': see ssd-chat --help"),
    # bench --modes said "unknown mode(s) xx; available: ar, sd, ssd, ar-all, sd-all"
    (["bench", "--modes", "AR,xx"], "--modes takes ar, sd, ssd, ar-all or sd-all, separated by commas; got 'AR,xx'"),
    (["bench", "--modes", " , "], "--modes takes ar, sd, ssd, ar-all or sd-all, separated by commas; got ' , '"),
    # distill's word options said "--loss must be one of ce, kl, topk, got 'mse'"
    (["distill", "--out", "d", "--loss", "mse"], "--loss takes ce, kl or topk; got 'mse'"),
    (["distill", "--out", "d", "--precision", "fp8"], "--precision takes auto, fp32 or bf16; got 'fp8'"),
    (["distill", "--out", "d", "--reply-dtype", "int4"], "--reply-dtype takes float32 or bfloat16; got 'int4'"),
    (["distill", "--out", "d", "--save-weights", "int4"], "--save-weights takes int8 or float16; got 'int4'"),
])
def test_usage_errors_are_one_line_naming_the_option(monkeypatch, args, line):
    monkeypatch.setattr(cli, "LLM", _no_engine)
    result = CliRunner().invoke(cli.app, args, prog_name="ssd-chat")  # (typer's standalone mode: no box either)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {line}\n", "")


def test_a_parsers_refusal_reads_as_the_commands_own_errors(monkeypatch):
    """--threads 0 (refused by its parser, as typer reads it) and --fanout x (by speculation_config, in the
    command): the same form."""
    monkeypatch.setattr(cli, "LLM", _no_engine)
    parsed = CliRunner().invoke(cli.app, ["ask", "hi", "--threads", "0"])
    checked = CliRunner().invoke(cli.app, ["ask", "hi", "--fanout", "x"])
    assert (checked.exit_code, checked.stderr) == (2, "error: --fanout takes whole numbers (ASCII digits) separated "
                                                      "by commas, or none for the default; got 'x'\n")
    assert (parsed.exit_code, parsed.stderr) == (2, "error: --threads takes a number of CPU threads, 1 to 1024; "
                                                    "got 0\n")


def test_the_group_tells_them_whether_typer_runs_standalone_or_not():
    """cli.main() runs typer with standalone_mode=False, where typer raises them; a test's CliRunner standalone,
    where typer drew its box."""
    for standalone in (True, False):
        result = CliRunner().invoke(cli.app, ["ask", "hi", "--thread", "2"], standalone_mode=standalone,
                                    prog_name="ssd-chat")
        assert (result.exit_code if standalone else result.return_value) == 2, result.exception  # (the code
        # typer returns where it does not exit)
        assert result.stderr == ("error: --thread is no option of ssd-chat ask (did you mean --threads or "
                                 "--fixed-threads?): see ssd-chat ask --help\n")


def test_the_real_entry_point_says_them_in_one_line_with_exit_2():
    for args, line in [(["ask", "hi", "--threads", "0"], "--threads takes a number of CPU threads, 1 to 1024; got 0"),
                       (["ask", "hi", "--thread", "2"], "--thread is no option of python -m ssd_chat ask (did you "
                                                        "mean --threads or --fixed-threads?): see python -m "
                                                        "ssd_chat ask --help")]:
        result = run_ssd_chat(*args)
        assert (result.returncode, result.stderr, result.stdout) == (2, f"error: {line}\n", "")


@pytest.mark.parametrize("args", [["--help"], ["ask", "--help"]])
def test_help_still_prints_the_help(args):
    result = run_ssd_chat(*args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "Usage: python -m ssd_chat" in result.stdout and "--threads" in result.stdout


def test_distills_words_are_taken_in_any_case_and_its_config_refuses_them_alike(monkeypatch, tmp_path):
    from ssd_chat import distill
    from ssd_chat.distill_config import DistillConfig

    seen = []

    def run(config, progress, prompts=None):
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(distill, "run_distill", run)
    CliRunner().invoke(cli.app, ["distill", "--out", str(tmp_path / "d"), "--loss", "KL", "--precision", " BF16",
                                 "--reply-dtype", "BFloat16", "--save-weights", "Float16"])
    assert [(c.loss, c.precision, c.reply_dtype, c.save_weights) for c in seen] == [("kl", "bf16", "bfloat16",
                                                                                     "float16")]
    with pytest.raises(ValueError, match=r"^--precision takes auto, fp32 or bf16; got 'fp8'$"):
        DistillConfig(target="t", out=tmp_path / "d", precision="fp8")


def test_bench_modes_are_taken_in_any_case_once_each_and_its_config_refuses_them_alike(monkeypatch):
    from ssd_chat import bench
    from ssd_chat.bench import BenchConfig
    from ssd_chat.prompts import BenchInputError

    seen = []

    def run(config, progress, prompts=None):
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(bench, "run_bench", run)
    CliRunner().invoke(cli.app, ["bench", "--modes", "AR-all, ar,Ar-All"])
    assert [c.modes for c in seen] == [("ar-all", "ar")]
    with pytest.raises(BenchInputError, match=r"^--modes takes ar, sd, ssd, ar-all or sd-all, separated by commas; "
                                              r"got 'ar,xx'$"):
        BenchConfig(target="t", modes=("ar", "xx"))


@pytest.mark.parametrize("args", [["--help"], ["ask", "--help"], ["distill", "--help"], ["--version"], ["models"]])
def test_what_the_commands_print_to_a_gone_reader_ends_as_sigpipe_would(args):
    """`ssd-chat --help | head -1`: 128 + SIGPIPE and not a word, as `ask ... | head` (test_cli_exits); the help
    (rich's own handling), --version and models' table (click's) exited with 1."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "ssd_chat", *args], cwd=REPO_ROOT, stdout=write,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, "")


@pytest.mark.parametrize(("args", "message"), [
    (["distill", "--out", "x", "--steps", "-1"], "--steps takes at least 0; got -1"),
    (["distill", "--out", "x", "--draft-layers", "0"], "--draft-layers takes at least 1; got 0"),
    (["distill", "--out", "x", "--seed", "4294967296"], "--seed takes a whole number from 0 to 2^32-1; got 4294967296"),
    (["distill", "--out", "x", "--lr", "0"], "--lr takes a learning rate above 0; got 0"),
    (["distill", "--out", "x", "--temperature", "101"],
     "--temperature takes a temperature from 0 to 100, 0 = greedy; got 101"),
    (["bench", "--max-tokens", "1"], "--max-tokens takes at least 2 (a decode speed needs two tokens); got 1"),
    (["bench", "--limit", "0"], "--limit takes at least 1; got 0"),
])
def test_distill_and_bench_refuse_a_number_as_the_other_options_do(args, message):
    """DistillConfig's and BenchConfig's own checks said `--steps must be >= 0, got -1`."""
    result = CliRunner().invoke(cli.app, args)
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n"), result.output


@pytest.mark.parametrize(("args", "line"), [
    (["--draft-layers", "30"], "--draft-layers takes 1 to 29 (the target has 30 layers); got 30"),
    (["--damping", "2"], "--damping takes a number from 0 to 1; got 2"),
    (["--seed", "-1"], "--seed takes a whole number from 0 to 2^64-1; got -1"),
    (["--head-vocab", "-5"], "--head-vocab takes at least 0 (0: all); got -5"),
    (["--head-vocab", "99999"], "--head-vocab takes at most the vocabulary's 49152 tokens (0: all); got 99999"),
])
def test_make_pairs_refusals_name_the_option_as_typed(tmp_path, args, line):
    """The pair's settings refused a value by its Python field (`draft_layers takes ...`), not by the option."""
    result = CliRunner().invoke(cli.app, ["make-pair", "--out", str(tmp_path / "pair"), *args], prog_name="ssd-chat")
    assert (result.exit_code, result.stderr) == (2, f"error: {line}\n")


@pytest.mark.parametrize(("args", "line"), [
    (["--tp", str(len(os.sched_getaffinity(0)) + 1)], "needs at least"),
    (["--mode", "ssd", "--draft", "none"], "mode 'ssd' needs a draft model: pass --draft"),
    (["--kv-dtype", "float16", "--target-devices", "cuda:0"], "--kv-dtype float16 is for the CPU"),
    # it said "--draft-device must look like cpu:0-3, cpu:0,2 or cuda:0-3, got 'gpu'": the comma, not `; got`
    (["--draft-device", "gpu"], "error: --draft-device takes cpu or cuda, or CPU cores or GPUs as cpu:0-3, cpu:0,2 "
                                "or cuda:0-3; got 'gpu'\n"),
])
def test_the_chat_app_refuses_what_the_engine_would_before_it_takes_the_screen(monkeypatch, args, line):
    """The app showed its screen, started the engine process, then left for the engine's error line."""
    from ssd_chat import tui

    started: list = []
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    monkeypatch.setattr(cli, "_engine_loader", lambda target, engine_kwargs: started.append("engine"))
    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: started.append("app") or 0)
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2 and started == [], result.output
    assert result.stderr.startswith("error: ") and line in result.stderr and len(result.stderr.splitlines()) == 1
    result = CliRunner().invoke(cli.app, [])  # the defaults pass
    assert result.exit_code == 0 and started == ["engine", "app"], result.output


@pytest.mark.parametrize(("args", "line"), [
    (["--draft-device", "gpu"], "--draft-device takes cpu or cuda, or CPU cores or GPUs as cpu:0-3, cpu:0,2 or "
                                "cuda:0-3; got 'gpu'"),
    (["--tp", str(len(os.sched_getaffinity(0)) + 1)], "needs at least"),
    (["--modes", "sd", "--draft", "nonexistent-model"], "unknown model 'nonexistent-model'"),
])
def test_the_bench_refuses_a_placement_or_a_draft_before_its_first_progress_line(args, line):
    """It printed "loading smollm2-135m", then the engine's refusal."""
    result = CliRunner().invoke(cli.app, ["bench", *args])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and line in result.stderr, result.output
    assert len(result.stderr.splitlines()) == 1, result.stderr
