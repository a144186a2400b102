"""The command line refuses a bad option value in one line naming the option, before any model loads: --seed,
--threads, --tp, --max-model-len, --dtype and --attention said the engine's words ("threads must be >= 1"); `bench
--backup x` loaded the model first; --mode SD was refused where /mode SD is taken; --fanout none (the default, as
/help calls it) was refused; --resume --fanout was checked against --k's default, not the resumed chat's k;
make-pair and distill took 1_0 as ten; 1e400 and 1e-400 were read as inf and 0."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from engine.errors import InvalidParameterError
from ssd_chat import cli
from ssd_chat.setting_words import SLASH, mode_named
from tests.ssd_chat.cli_runs import run_ssd_chat


def _no_engine(**kwargs):
    pytest.fail("a model loaded")


class _Reached(Exception):
    """The engine was reached: the options passed (told as a failure to load: engine_failure.loaded)."""


def _engine_kwargs(monkeypatch, args: list[str]) -> dict:
    """What `ssd-chat ARGS` hands the engine (its options all taken)."""
    seen: dict = {}

    def llm(**kwargs):
        seen.update(kwargs)
        raise _Reached

    monkeypatch.setattr(cli, "LLM", llm)
    monkeypatch.setattr(cli, "check_before_loading", lambda target, kwargs: None)  # (what a machine or model refuses)
    result = CliRunner().invoke(cli.app, args, input="")
    assert seen and "(_Reached: )" in result.output, result.output
    return seen


@pytest.mark.parametrize(("flags", "message"), [
    (["--seed", "-1"], "--seed takes a whole number from 0 to 2^63-1; got -1"),
    (["--seed", "9223372036854775808"], "--seed takes a whole number from 0 to 2^63-1; got 9223372036854775808"),
    (["--threads", "0"], "--threads takes a number of CPU threads, 1 to 1024; got 0"),
    (["--threads", "99999"], "--threads takes a number of CPU threads, 1 to 1024; got 99999"),  # (it crashed)
    (["--tp", "0"], "--tp takes a number of target ranks, at least 1; got 0"),
    (["--max-model-len", "1"], "--max-model-len takes a context limit of at least 2 tokens; got 1"),
    (["--dtype", "float8"], "--dtype takes auto, float32, bfloat16 or float16; got 'float8'"),
    (["--attention", "fast"], "--attention takes auto, sdpa or flashinfer; got 'fast'"),
    (["--draft-weights", "int4"], "--draft-weights takes float32, float16 or int8; got 'int4'"),  # (the engine's
    (["--cpu-matmul", "blas"], "--cpu-matmul takes auto, mkl, onednn, panel, panel4 or q8; got 'blas'"),  # words)
])
def test_engine_options_are_refused_in_one_line_naming_the_flag(monkeypatch, flags, message):
    monkeypatch.setattr(cli, "LLM", _no_engine)
    result = CliRunner().invoke(cli.app, ["ask", "hi", *flags])
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n"), result.output


def test_the_real_entry_point_says_it_in_one_line():
    result = run_ssd_chat("ask", "hi", "--threads", "0")
    assert result.returncode == 2
    assert result.stderr == "error: --threads takes a number of CPU threads, 1 to 1024; got 0\n"


def test_engine_options_in_range_and_any_case_pass(monkeypatch):
    seen = _engine_kwargs(monkeypatch, ["ask", "hi", "--seed", "0", "--threads", "2", "--max-model-len", "2",
                                        "--dtype", "Float32", "--attention", "SDPA", "--draft", "none",
                                        "--draft-weights", "Float16", "--cpu-matmul", "PANEL"])
    assert seen["dtype"] == "float32" and seen["attention"] == "sdpa" and seen["threads"] == 2
    assert seen["draft_weights"] == "float16" and seen["packed_kernel"] == "panel"


@pytest.mark.parametrize("command", [["--plain"], ["ask", "hi"]])
def test_mode_takes_any_case_as_mode_does_in_the_app(monkeypatch, command):
    seen = _engine_kwargs(monkeypatch, [*command, "--mode", "SD", "--draft", "none"])
    assert seen["speculation"].mode == "sd"


@pytest.mark.parametrize("typed", ["SD", " ssd ", "Ar", "x", "s d", "sd,ssd"])
def test_mode_is_read_by_the_apps_parser(monkeypatch, typed):
    """--mode and /mode take and refuse the same words, with the same message (setting_words.mode_named: --mode had
    a parser of its own that let an unknown word through, to be refused later, after the layout was chosen)."""
    monkeypatch.setattr(cli, "apply_defaults", lambda *a, **kw: pytest.fail("the mode reached the layout"))
    try:
        mode = mode_named(SLASH, typed)
    except InvalidParameterError as refused:
        result = CliRunner().invoke(cli.app, ["ask", "hi", "--mode", typed])
        assert (result.exit_code, result.stderr) == (2, f"error: {str(refused).replace('/mode', '--mode')}\n")
        return
    monkeypatch.undo()
    assert _engine_kwargs(monkeypatch, ["ask", "hi", "--mode", typed, "--draft", "none"])["speculation"].mode == mode


@pytest.mark.parametrize(("typed", "fanout"), [("none", None), ("None", None), ("default", None), ("2", (2,))])
def test_fanout_none_is_the_default(monkeypatch, typed, fanout):
    seen = _engine_kwargs(monkeypatch, ["ask", "hi", "--mode", "ssd", "--fanout", typed])
    assert seen["speculation"].fanout == fanout


def test_a_resumed_chats_fanout_is_checked_against_its_own_k(monkeypatch):
    from ssd_chat import tui

    seen: dict = {}
    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: seen.update(kwargs) or 0)
    monkeypatch.setattr(cli, "_engine_loader", lambda target, engine_kwargs: None)
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    result = CliRunner().invoke(cli.app, ["--mode", "ssd", "--fanout", "1,2,3"])
    assert result.exit_code == 2 and "k+1 = 5" in result.output  # a new chat: --k's
    result = CliRunner().invoke(cli.app, ["--mode", "ssd", "--fanout", "1,2,3", "--resume"])
    assert result.exit_code == 0, result.output
    assert seen["settings"].fanout == (1, 2, 3) and "fanout" in seen["given"]  # (the chat's k: checked once open)
    assert seen["speculation"].fanout is None  # (the run's own: it does not fit k 4)
    result = CliRunner().invoke(cli.app, ["--mode", "ssd", "--fanout", "1,2,300", "--resume"])
    assert result.exit_code == 2 and "--fanout takes counts from 0 to 256" in result.output


@pytest.mark.parametrize("command", [["--plain"], ["ask", "hi"]])
def test_backup_is_a_word_option_as_the_others(monkeypatch, command):
    """--backup was checked by hand in speculation_config: refused once the layout was chosen, and in one case."""
    seen = _engine_kwargs(monkeypatch, [*command, "--backup", "FAST", "--draft", "none"])
    assert seen["speculation"].backup == "fast"
    monkeypatch.setattr(cli, "apply_defaults", lambda *a, **kw: pytest.fail("the backup reached the layout"))
    result = CliRunner().invoke(cli.app, [*command, "--backup", "slow"], input="")
    assert (result.exit_code, result.stderr) == (2, "error: --backup takes jit or fast; got 'slow'\n")


def test_bench_refuses_a_bad_backup_before_loading(monkeypatch):
    import ssd_chat.bench

    monkeypatch.setattr(ssd_chat.bench, "run_bench", lambda *args, **kwargs: pytest.fail("the bench ran"))
    result = CliRunner().invoke(cli.app, ["bench", "--backup", "x"])
    assert result.exit_code == 2 and result.output == "error: --backup takes jit or fast; got 'x'\n"


@pytest.mark.parametrize("args", [["make-pair", "--seed", "1_0"], ["make-pair", "--damping", "1_0"],
                                  ["distill", "--out", "x", "--steps", "1_0"],
                                  ["distill", "--out", "x", "--lr", "inf"]])
def test_make_pair_and_distill_take_plain_numbers(monkeypatch, args):
    import ssd_chat.distill
    from engine import synthetic

    monkeypatch.setattr(synthetic, "build_pair", lambda *a, **kw: pytest.fail("it built a pair"))
    monkeypatch.setattr(ssd_chat.distill, "run_distill", lambda *a, **kw: pytest.fail("it distilled"))
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {args[-2]} takes a "), result.output


@pytest.mark.parametrize(("flag", "typed", "says"), [
    ("--temperature", "1e-400", "1e-400 is below the smallest number it can hold; 0 turns sampling off (greedy)"),
    ("--temperature", "1e400", "1e400 is above the largest number it can hold; it takes a temperature from 0 to 100, "
                               "0 = greedy"),
    ("--top-p", "1e-400", "1e-400 is below the smallest number it can hold; it takes a mass in (0, 1], 1 = off"),
])
def test_a_number_past_a_floats_range_is_refused(monkeypatch, flag, typed, says):
    monkeypatch.setattr(cli, "LLM", _no_engine)
    result = CliRunner().invoke(cli.app, ["ask", "hi", flag, typed])
    assert (result.exit_code, result.stderr) == (2, f"error: {flag} {says}\n")


def _counts(n: int) -> str:
    return ",".join(["1"] * n)


def test_fanout_has_a_count_per_count_the_cpu_drafts(monkeypatch):
    """--k 32 on the CPU drafts at most 31 a round (EngineConfig.drafted_k): 33 counts passed and the engine ignored
    the last; 32 were refused, where the chat app's /fanout after /k 32 takes 32 and refuses 33."""
    monkeypatch.setattr(cli, "LLM", _no_engine)
    result = CliRunner().invoke(cli.app, ["ask", "hi", "--mode", "ssd", "--k", "32", "--fanout", _counts(33)])
    assert result.exit_code == 2 and "k+1 = 32 of them" in result.output, result.output
    seen = _engine_kwargs(monkeypatch, ["ask", "hi", "--mode", "ssd", "--k", "32", "--fanout", _counts(32)])
    assert seen["speculation"].k == 31 and len(seen["speculation"].fanout) == 32  # (the app's engine k: 31)


def test_fanout_on_cuda_has_a_count_per_k(monkeypatch):
    """On CUDA a round drafts the whole --k: its k+1 counts."""
    flags = ["--mode", "ssd", "--k", "32", "--target-devices", "cuda:0", "--draft", "none"]
    seen = _engine_kwargs(monkeypatch, ["ask", "hi", *flags, "--fanout", _counts(33)])
    assert seen["speculation"].k == 32 and len(seen["speculation"].fanout) == 33
    monkeypatch.setattr(cli, "LLM", _no_engine)
    result = CliRunner().invoke(cli.app, ["ask", "hi", *flags, "--fanout", _counts(32)])
    assert result.exit_code == 2 and "k+1 = 33 of them" in result.output, result.output


def test_the_chat_apps_k_stays_as_given_with_a_fanout_for_the_drafted_k(monkeypatch):
    from ssd_chat import tui

    seen: dict = {}
    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: seen.update(kwargs) or 0)
    monkeypatch.setattr(cli, "_engine_loader", lambda target, engine_kwargs: None)
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    result = CliRunner().invoke(cli.app, ["--mode", "ssd", "--k", "32", "--fanout", _counts(32)])
    assert result.exit_code == 0, result.output
    assert seen["settings"].k == 32 and len(seen["settings"].fanout) == 32  # (/k says 31: the app's drafted_k)
    assert seen["speculation"].k == 31 and len(seen["speculation"].fanout) == 32


def test_bench_checks_a_fanout_against_the_drafted_k(monkeypatch):
    import ssd_chat.bench

    configs: list = []

    def run_bench(config, **kwargs):
        configs.append(config)
        raise _Reached

    monkeypatch.setattr(ssd_chat.bench, "run_bench", run_bench)
    flags = ["bench", "--modes", "ssd", "--draft", "smollm2-135m-draft", "--k", "32", "--fanout"]
    result = CliRunner().invoke(cli.app, [*flags, _counts(33)])
    assert result.exit_code == 2 and "k+1 = 32 of them" in result.output and not configs, result.output
    result = CliRunner().invoke(cli.app, [*flags, _counts(32)])
    assert "(_Reached: )" in result.output, result.output
    assert configs[0].k == 31 and len(configs[0].fanout) == 32  # (what the run's rounds draft at most)


def test_the_command_line_takes_the_seeds_the_engine_takes():
    """--seed's limit was a copy of SamplingParams' (2**63 - 1 beside `< 2**63`): now both read MAX_SEED."""
    from engine.sampling_params import MAX_SEED, SamplingParams
    from ssd_chat.cli_options import seed_number

    assert seed_number(str(MAX_SEED)) == SamplingParams(seed=MAX_SEED).seed == 2**63 - 1
    with pytest.raises(typer.BadParameter, match=f"got {MAX_SEED + 1}$"):
        seed_number(str(MAX_SEED + 1))
    with pytest.raises(InvalidParameterError, match=f"got {MAX_SEED + 1}$"):
        SamplingParams(seed=MAX_SEED + 1)
