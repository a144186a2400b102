"""The chat's default temperature: the model's recommended one (the embedded SmolLM2's model card, a directory's
generation_config.json), else 0.7; --temperature always wins."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ssd_chat import cli
from ssd_chat.sampling_defaults import FALLBACK, default_temperature


def _model_dir(tmp_path, generation_config) -> str:
    if generation_config is not None:
        text = generation_config if isinstance(generation_config, str) else json.dumps(generation_config)
        (tmp_path / "generation_config.json").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize(("config", "expected"), [
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9}, 0.6),  # (Llama 3.1 Instruct's)
    ({"do_sample": False, "temperature": 0.6}, FALLBACK),  # greedy by its makers' word: no sampled default there
    ({"temperature": 0.6}, FALLBACK),
    ({"do_sample": True}, FALLBACK),
    ({"do_sample": True, "temperature": True}, FALLBACK),
    ({"do_sample": True, "temperature": -1}, FALLBACK),
    ("{not json", FALLBACK),
    ([1, 2], FALLBACK),
    (None, FALLBACK),  # no file
])
def test_a_directory_takes_its_generation_configs_temperature(tmp_path, config, expected):
    assert default_temperature(_model_dir(tmp_path, config))[0] == expected


def test_the_embedded_target_takes_its_model_cards_temperature():
    assert default_temperature("smollm2-135m") == (0.2, "its model card")
    assert default_temperature("SmolLM2-135M")[0] == 0.2  # (the registry takes an alias in any case)
    assert default_temperature("llama-3.1-8b")[0] == FALLBACK  # (a hub alias: its files may not be here)


class _NoEngine:
    def __init__(self, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.mark.parametrize(("target", "flags", "expected"), [
    ("smollm2-135m", [], 0.2),
    ("smollm2-135m", ["--temperature", "0.9"], 0.9),
    ("DIR", [], 0.6),
    ("DIR", ["--temperature", "0"], 0.0),
])
def test_the_plain_chat_samples_at_the_default_unless_told(tmp_path, monkeypatch, target, flags, expected):
    seen = []
    monkeypatch.setattr(cli, "LLM", _NoEngine)
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: seen.append(params.temperature))
    target = _model_dir(tmp_path, {"do_sample": True, "temperature": 0.6}) if target == "DIR" else target
    result = CliRunner().invoke(cli.app, ["--plain", "--target", target, "--draft", "none", *flags], input="")
    assert result.exit_code == 0, result.output
    assert seen == [expected]
