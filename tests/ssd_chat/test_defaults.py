"""The embedded pair: asking for speculation with the default target gets the shipped draft under SSD with the
draft on the last core; plain `ssd-chat` stays AR until PLAIN_RUNS_SSD is on; every explicit choice wins."""

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


def test_asking_for_speculation_gets_the_shipped_draft_with_the_draft_on_the_last_core(shipped):
    for given in (Layout(DEFAULT_TARGET, None, "ssd"), Layout(DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, None)):
        two = apply_defaults(given, cores=[0, 1])
        assert (two.draft, two.mode, two.target_devices, two.draft_device) == \
            (defaults.SHIPPED_DRAFT_ALIAS, "ssd", "cpu:0", "cpu:1"), given
    eight = apply_defaults(Layout(DEFAULT_TARGET, None, "ssd"), cores=list(range(8)))
    assert (eight.target_devices, eight.draft_device) == ("cpu:0-6", "cpu:7")
    # SD, or AR with the shipped draft loaded, keep the same cores, so that the modes compare like for like.
    for given in (Layout(DEFAULT_TARGET, None, "sd"), Layout(DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "ar")):
        other = apply_defaults(given, cores=[0, 1])
        assert (other.draft, other.mode, other.target_devices, other.draft_device) == \
            (defaults.SHIPPED_DRAFT_ALIAS, given.mode, "cpu:0", "cpu:1"), given


def test_plain_ssd_chat_runs_ar_until_the_switch_is_on(shipped, monkeypatch):
    plain = Layout(DEFAULT_TARGET, None, None)
    assert apply_defaults(plain, cores=[0, 1]) == plain  # AR on every core: the fastest exact choice today
    assert apply_defaults(Layout(DEFAULT_TARGET, None, "ar"), cores=[0, 1]) == Layout(DEFAULT_TARGET, None, "ar")
    monkeypatch.setattr(defaults, "PLAIN_RUNS_SSD", True)
    on = apply_defaults(plain, cores=[0, 1])
    assert (on.draft, on.mode, on.target_devices, on.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "ssd", "cpu:0", "cpu:1")


def test_one_core_gets_sd_in_one_process(shipped, monkeypatch):
    monkeypatch.setattr(defaults, "PLAIN_RUNS_SSD", True)
    one = apply_defaults(Layout(DEFAULT_TARGET, None, None), cores=[3])
    assert (one.draft, one.mode, one.target_devices, one.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "sd", None, None)
    asked = apply_defaults(Layout(DEFAULT_TARGET, None, "ssd"), cores=[3])
    assert (asked.mode, asked.draft_device) == ("ssd", None)  # SSD in the target's process, as asked


def test_explicit_choices_win(shipped):
    for given in (Layout("llama-3.2-1b", None, None), Layout(DEFAULT_TARGET, "/some/draft", None),
                  Layout(DEFAULT_TARGET, "/some/draft", "ssd", 1, None, "cpu:1")):
        assert apply_defaults(given, cores=[0, 1]) == given
    placed = apply_defaults(Layout(DEFAULT_TARGET, None, "sd", 1, "cpu:1", None), cores=[0, 1])
    assert (placed.draft, placed.mode, placed.target_devices, placed.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "sd", "cpu:1", None)
    tp = apply_defaults(Layout(DEFAULT_TARGET, None, "ssd", 2), cores=[0, 1, 2])
    assert (tp.target_devices, tp.draft_device) == (None, None)


def test_draft_none_runs_the_target_alone(shipped):
    for spelling in ("none", "None", "NONE"):
        alone = apply_defaults(Layout(DEFAULT_TARGET, spelling, None), cores=[0, 1])
        assert (alone.draft, alone.mode, alone.target_devices) == (None, None, None)


def test_without_a_shipped_draft_nothing_changes(monkeypatch, tmp_path):
    monkeypatch.setattr(defaults, "SHIPPED_DRAFT_DIR", tmp_path / "missing")
    given = Layout(DEFAULT_TARGET, None, "ssd")
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
    for args in (["--plain", "--mode", "ssd"], ["ask", "hi", "--mode", "ssd"]):
        seen.clear()
        result = CliRunner().invoke(cli.app, args)
        assert result.exit_code == 2 and "stop here" in result.stderr, result.output
        assert (seen["target"], seen["draft"], seen["target_devices"], seen["draft_device"]) == \
            (DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "cpu:0", "cpu:1"), args
        assert seen["speculation"].mode == "ssd", args
    for args in (["ask", "hi"], ["ask", "hi", "--draft", "none"]):
        seen.clear()
        CliRunner().invoke(cli.app, args)
        assert seen["draft"] is None and seen["speculation"].mode == "ar" and seen["draft_device"] is None, args
