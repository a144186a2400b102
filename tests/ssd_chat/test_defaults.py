"""The embedded default layout: plain `ssd-chat` gets the shipped draft under SSD with the draft on the last core;
every explicit choice wins."""

from __future__ import annotations

import pytest

from engine.config import DEFAULT_TARGET
from engine.placement import ranges
from ssd_chat import defaults
from ssd_chat.defaults import Layout, apply_defaults


@pytest.fixture
def shipped(monkeypatch, tmp_path):
    monkeypatch.setattr(defaults, "SHIPPED_DRAFT_DIR", tmp_path)  # present, whatever assets/ holds
    return tmp_path


def test_plain_ssd_chat_runs_ssd_with_the_draft_on_the_last_core(shipped):
    two = apply_defaults(Layout(DEFAULT_TARGET, None, None), cores=[0, 1])
    assert (two.draft, two.mode, two.target_devices, two.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "ssd", "cpu:0", "cpu:1")
    eight = apply_defaults(Layout(DEFAULT_TARGET, None, None), cores=list(range(8)))
    assert (eight.target_devices, eight.draft_device) == ("cpu:0-6", "cpu:7")
    # Asking for AR or SD keeps the same cores, so that the modes compare like for like.
    ar = apply_defaults(Layout(DEFAULT_TARGET, None, "ar"), cores=[0, 1])
    assert (ar.draft, ar.mode, ar.target_devices, ar.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "ar", "cpu:0", "cpu:1")


def test_one_core_gets_sd_in_one_process(shipped):
    one = apply_defaults(Layout(DEFAULT_TARGET, None, None), cores=[3])
    assert (one.draft, one.mode, one.target_devices, one.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "sd", None, None)


def test_explicit_choices_win(shipped):
    for given in (Layout("llama-3.2-1b", None, None), Layout(DEFAULT_TARGET, "/some/draft", None),
                  Layout(DEFAULT_TARGET, "/some/draft", "ssd", 1, None, "cpu:1")):
        assert apply_defaults(given, cores=[0, 1]) == given
    placed = apply_defaults(Layout(DEFAULT_TARGET, None, None, 1, "cpu:1", None), cores=[0, 1])
    assert (placed.draft, placed.mode, placed.target_devices, placed.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "sd", "cpu:1", None)
    tp = apply_defaults(Layout(DEFAULT_TARGET, None, None, 2), cores=[0, 1, 2])
    assert (tp.target_devices, tp.draft_device) == (None, None)


def test_draft_none_runs_the_target_alone(shipped):
    for spelling in ("none", "None", "NONE"):
        alone = apply_defaults(Layout(DEFAULT_TARGET, spelling, None), cores=[0, 1])
        assert (alone.draft, alone.mode, alone.target_devices) == (None, None, None)


def test_without_a_shipped_draft_nothing_changes(monkeypatch, tmp_path):
    monkeypatch.setattr(defaults, "SHIPPED_DRAFT_DIR", tmp_path / "missing")
    given = Layout(DEFAULT_TARGET, None, None)
    assert apply_defaults(given, cores=[0, 1]) == given


def test_ranges_round_trip_the_device_syntax():
    assert ranges([0, 1, 2, 5]) == "0-2,5"
    assert ranges([7]) == "7"
    assert ranges([3, 1, 2]) == "1-3"


def test_the_cli_hands_the_default_layout_to_the_engine(shipped, monkeypatch):
    from typer.testing import CliRunner

    from engine.errors import InvalidParameterError
    from ssd_chat import cli

    seen: dict = {}

    def fake_llm(**kwargs):
        seen.update(kwargs)
        raise InvalidParameterError("stop here")

    monkeypatch.setattr(cli, "LLM", fake_llm)
    monkeypatch.setattr(defaults.os, "sched_getaffinity", lambda pid: {0, 1})
    for args in (["--plain"], ["ask", "hi"]):
        seen.clear()
        result = CliRunner().invoke(cli.app, args)
        assert result.exit_code == 2 and "stop here" in result.stderr, result.output
        assert (seen["target"], seen["draft"], seen["target_devices"], seen["draft_device"]) == \
            (DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "cpu:0", "cpu:1"), args
        assert seen["speculation"].mode == "ssd", args
    seen.clear()
    result = CliRunner().invoke(cli.app, ["ask", "hi", "--draft", "none"])
    assert seen["draft"] is None and seen["speculation"].mode == "ar"
