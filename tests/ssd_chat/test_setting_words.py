"""The mode, k, fan-out and reply length are refused in the app's words, naming the option typed: `ask --k 0` and
`/k 33` said "k (draft tokens per step) must be between 1 and 32", `ask --mode xyz` "mode must be one of ...", `ask
--max-tokens 0` "max_tokens must be >= 1", /fanout "fanout must be ...". The engine's own messages stay for its
Python API."""

from __future__ import annotations

import itertools

import pytest
from typer.testing import CliRunner

from engine.config import MAX_FANOUT, SpeculationConfig
from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams
from ssd_chat import cli
from ssd_chat.setting_words import FLAGS, SLASH, check, check_max_tokens, check_sampling, number_text


@pytest.mark.parametrize(("names", "values", "message"), [
    (SLASH, ("xyz", 4, None), "/mode takes ar, sd or ssd; got 'xyz'"),
    (FLAGS, (None, 4, None), "--mode takes ar, sd or ssd; got None"),
    (SLASH, ("sd", 33, None), "/k takes the most draft tokens per step, 1-32; got 33"),
    (FLAGS, ("sd", 0, None), "--k takes the most draft tokens per step, 1-32; got 0"),
    (SLASH, ("sd", True, None), "/k takes the most draft tokens per step, 1-32; got True"),
    (SLASH, ("ssd", 3, (1, 2)), "/fanout takes one count or k+1 = 4 of them (SSD's candidates per accepted count, 0 "
                                "to 3), separated by commas; got 1,2"),
    (FLAGS, ("ssd", 3, ()), "--fanout takes one count or k+1 = 4 of them (SSD's candidates per accepted count, 0 "
                            "to 3), separated by commas; got none"),
    (SLASH, ("ssd", 3, (1, 2, MAX_FANOUT + 1, 1)), f"/fanout takes counts from 0 to {MAX_FANOUT} (SSD's "
                                                   f"speculation cache holds 256 branch tokens a request); got 257"),
    (SLASH, ("ssd", 3, (-1,)), "/fanout takes counts from 0 to 256 (SSD's speculation cache holds 256 branch tokens "
                               "a request); got -1"),
])
def test_a_refused_setting_names_the_option_typed(names, values, message):
    with pytest.raises(InvalidParameterError) as err:
        check(names, *values)
    assert str(err.value) == message
    with pytest.raises(InvalidParameterError) as engine_err:  # the engine's words stay its own
        SpeculationConfig(mode=values[0], k=values[1], fanout=values[2])
    assert not str(engine_err.value).startswith(("/", "--"))


def test_it_refuses_exactly_what_the_engine_refuses():
    modes, ks = ("ar", "sd", "ssd", "SD", ""), (0, 1, 2, 31, 32, 33, -1)
    fanouts = (None, (0,), (MAX_FANOUT,), (MAX_FANOUT + 1,), (-1,), (), (1, 2, 3), (2, 2, 2, 2), 3)
    for mode, k, fanout in itertools.product(modes, ks, fanouts):
        try:
            SpeculationConfig(mode=mode, k=k, fanout=fanout)
        except InvalidParameterError:
            with pytest.raises(InvalidParameterError):
                check(SLASH, mode, k, fanout)
        else:
            check(SLASH, mode, k, fanout)


def test_the_reply_length_is_at_least_one_token():
    check_max_tokens("--max-tokens", 1)
    for bad in (0, -5):
        with pytest.raises(InvalidParameterError, match=rf"^--max-tokens takes the most tokens a reply generates, "
                                                        rf"at least 1; got {bad}$"):
            check_max_tokens("--max-tokens", bad)
        with pytest.raises(InvalidParameterError, match=r"^max_tokens must be >= 1"):
            SamplingParams(max_tokens=bad)


@pytest.mark.parametrize(("flags", "message"), [
    (["--k", "0"], "--k takes the most draft tokens per step, 1-32; got 0"),
    (["--k", "33"], "--k takes the most draft tokens per step, 1-32; got 33"),
    (["--mode", "xyz"], "--mode takes ar, sd or ssd; got 'xyz'"),
    (["--max-tokens", "0"], "--max-tokens takes the most tokens a reply generates, at least 1; got 0"),
    (["--mode", "ssd", "--k", "3", "--fanout", "1,2"], "--fanout takes one count or k+1 = 4 of them (SSD's "
                                                       "candidates per accepted count, 0 to 3), separated by commas; "
                                                       "got 1,2"),
    (["--backup", "slow"], "--backup takes jit or fast; got 'slow'"),
])
@pytest.mark.parametrize("command", [["--plain"], ["ask", "hi"]])
def test_the_command_line_says_it_in_one_line_before_a_model_loads(monkeypatch, flags, message, command):
    monkeypatch.setattr(cli, "LLM", lambda **kwargs: pytest.fail("a model loaded"))
    result = CliRunner().invoke(cli.app, [*command, *flags], input="")
    assert result.exit_code == 2 and result.output == f"error: {message}\n"


def test_numbers_show_as_typed_and_zero_has_no_sign():
    """A typed -0 (or a saved -0.0) showed as -0 in the status line, the panel and the errors."""
    assert [number_text(v) for v in (-0.0, 0.0, 0.9, 1.0, 1e-9, 0.123456789, 7)] == ["0", "0", "0.9", "1", "1e-9",
                                                                                     "0.123456789", "7"]
    with pytest.raises(InvalidParameterError, match=r"^/top-p takes a mass in \(0, 1\], 1 = off; got 0$"):
        check_sampling(SLASH, 0.5, -0.0, 0)
