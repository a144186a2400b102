"""The chat's default sampling: the model's recommended temperature, top-p and top-k (the embedded SmolLM2's model
card, a directory's generation_config.json), else 0.7 and no filter; --temperature, --top-p, --top-k always win."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ssd_chat import cli
from ssd_chat.sampling_defaults import FALLBACK, Sampling, filters_text, recommended
from ssd_chat.setting_words import number_text


def _model_dir(tmp_path, generation_config) -> str:
    if generation_config is not None:
        text = generation_config if isinstance(generation_config, str) else json.dumps(generation_config)
        (tmp_path / "generation_config.json").write_text(text)
    return str(tmp_path)


T, P, K = FALLBACK.temperature, FALLBACK.top_p, FALLBACK.top_k


@pytest.mark.parametrize(("config", "expected"), [
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9}, (0.6, 0.9, K)),  # (Llama 3.1 Instruct's)
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}, (0.6, 0.95, 20)),  # (Qwen3's)
    ({"do_sample": False, "temperature": 0.6, "top_p": 0.9}, (T, P, K)),  # greedy by its makers' word: no default
    ({"temperature": 0.6}, (T, P, K)),
    ({"do_sample": True}, (T, P, K)),
    ({"do_sample": True, "top_p": 0.5}, (T, P, K)),  # (no temperature: none of it)
    ({"do_sample": True, "temperature": True}, (T, P, K)),
    ({"do_sample": True, "temperature": -1}, (T, P, K)),
    ({"do_sample": True, "temperature": 0.6, "top_p": 0, "top_k": 2.5}, (0.6, P, K)),  # out of range: the fallback's
    ({"do_sample": True, "temperature": 0.6, "top_p": 1.5, "top_k": -1}, (0.6, P, K)),
    ({"do_sample": True, "temperature": 0.6, "top_p": "0.9", "top_k": True}, (0.6, P, K)),
    ("{not json", (T, P, K)),
    ([1, 2], (T, P, K)),
    (None, (T, P, K)),  # no file
])
def test_a_directory_takes_its_generation_configs_sampling(tmp_path, config, expected):
    got = recommended(_model_dir(tmp_path, config))
    assert (got.temperature, got.top_p, got.top_k) == expected
    assert isinstance(got.top_k, int)


def test_the_embedded_target_takes_its_model_cards_sampling():
    assert recommended("smollm2-135m") == Sampling(0.2, top_p=0.9)
    assert recommended("SmolLM2-135M").top_p == 0.9  # (the registry takes an alias in any case)
    assert recommended("llama-3.1-8b") == FALLBACK  # (a hub alias: its files may not be here)


def test_the_filters_are_named_only_where_a_sampled_reply_uses_them():
    assert filters_text(0.2, 0.9, 0) == "top-p 0.9"
    assert filters_text(0.6, 0.95, 20, ", ") == "top-p 0.95, top-k 20"
    assert filters_text(0.7, 1.0, 0) == "" and filters_text(0.0, 0.9, 20) == ""  # off; greedy takes the argmax
    assert filters_text(0.2, 1e-9, 0) == "top-p 1e-9"  # (as typed: Python's :g wrote 1e-09)


@pytest.mark.parametrize(("value", "shown"), [(0.9, "0.9"), (1.0, "1"), (0.0, "0"), (20, "20"), (1e-9, "1e-9"),
                                              (1.5e-7, "1.5e-7"), (0.123456789, "0.123456789"), (1e16, "1e16"),
                                              (100.0, "100"), (2**60, str(2**60))])
def test_a_number_shows_as_the_user_types_it(value, shown):
    assert number_text(value) == shown


class _NoEngine:
    vocab_size = 49152  # (SmolLM2's)

    def __init__(self, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.mark.parametrize(("target", "flags", "expected"), [
    ("smollm2-135m", [], (0.2, 0.9, 0)),
    ("smollm2-135m", ["--temperature", "0.9"], (0.9, 0.9, 0)),
    ("smollm2-135m", ["--top-p", "1", "--top-k", "40"], (0.2, 1.0, 40)),
    ("DIR", [], (0.6, 0.95, 20)),
    ("DIR", ["--temperature", "0"], (0.0, 0.95, 20)),
])
def test_the_plain_chat_samples_at_the_default_unless_told(tmp_path, monkeypatch, target, flags, expected):
    seen = []
    monkeypatch.setattr(cli, "LLM", _NoEngine)
    monkeypatch.setattr(cli, "check_before_loading", lambda target, kwargs: None)  # (DIR holds no model)
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: seen.append(
        (params.temperature, params.top_p, params.top_k)))
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    target = _model_dir(tmp_path, config) if target == "DIR" else target
    result = CliRunner().invoke(cli.app, ["--plain", "--target", target, "--draft", "none", *flags], input="")
    assert result.exit_code == 0, result.output
    assert seen == [expected]


@pytest.mark.parametrize(("flags", "message"), [
    (["--top-p", "0"], "--top-p takes a mass in (0, 1], 1 = off; got 0"),
    (["--top-p", "1.5"], "--top-p takes a mass in (0, 1], 1 = off; got 1.5"),
    (["--top-k", "-1"], "--top-k takes a number of tokens, 0 = off; got -1"),
    (["--temperature", "-0.5"], "--temperature takes a temperature from 0 to 100, 0 = greedy; got -0.5"),
])
@pytest.mark.parametrize("command", [["--plain"], ["ask", "hi"]])
def test_a_bad_sampling_option_is_one_line_naming_the_option(monkeypatch, flags, message, command):
    """The plain mode and ask said "error: top_p must be in (0, 1] (1 = off), got 0.0": the engine's field, not the
    option typed."""
    monkeypatch.setattr(cli, "LLM", _NoEngine)
    result = CliRunner().invoke(cli.app, [*command, "--draft", "none", *flags], input="")
    assert result.exit_code == 2 and result.output == f"error: {message}\n"


@pytest.mark.parametrize("command", [["--plain"], ["ask", "hi"]])
@pytest.mark.parametrize("top_k", ["49152", "100000"])
def test_a_top_k_past_the_vocabulary_is_refused_once_the_model_is_loaded(monkeypatch, command, top_k):
    """`--top-k 100000` with SmolLM2's 49152 tokens filters nothing, and was taken as if it did."""
    monkeypatch.setattr(cli, "LLM", _NoEngine)
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: pytest.fail("it ran"))
    result = CliRunner().invoke(cli.app, [*command, "--draft", "none", "--top-k", top_k], input="")
    assert result.exit_code == 2 and result.output == (
        f"error: --top-k takes fewer tokens than the model's vocabulary of 49152 (0 turns it off); got {top_k}\n")
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: None)
    assert CliRunner().invoke(cli.app, ["--plain", "--draft", "none", "--top-k", "49151"], input="").exit_code == 0


def test_the_chat_app_starts_with_the_models_filters_and_resumes_with_those_given(monkeypatch):
    from ssd_chat import tui

    seen: dict = {}
    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: seen.update(kwargs) or 0)
    monkeypatch.setattr(cli, "_engine_loader", lambda target, engine_kwargs: None)
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    assert CliRunner().invoke(cli.app, ["--mode", "ar"]).exit_code == 0
    settings = seen["settings"]
    assert (settings.temperature, settings.top_p, settings.top_k) == (0.2, 0.9, 0) and seen["given"] == {"mode"}
    assert CliRunner().invoke(cli.app, ["--mode", "ar", "--top-k", "5", "--resume"]).exit_code == 0
    assert seen["settings"].top_k == 5 and seen["given"] == {"mode", "top_k"}  # (a resumed chat takes it)
    assert seen["settings"].seed is None
    assert CliRunner().invoke(cli.app, ["--mode", "ar", "--seed", "42", "--resume"]).exit_code == 0
    assert seen["settings"].seed == 42 and seen["given"] == {"mode", "seed"}


def test_the_plain_mode_takes_a_seed(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "LLM", _NoEngine)
    monkeypatch.setattr(cli, "check_before_loading", lambda target, kwargs: None)  # (DIR holds no model)
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: seen.append(params.seed))
    for flags in ([], ["--seed", "9"]):
        result = CliRunner().invoke(cli.app, ["--plain", "--draft", "none", *flags], input="")
        assert result.exit_code == 0, result.output
    assert seen == [None, 9]
