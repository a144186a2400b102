"""The embedded pair: the default target gets the shipped draft; plain `ssd-chat` runs SD on every core, `--mode
ssd` gives the draft process the last core; `--mode ar`, `--draft none` and every explicit choice win."""

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


def test_ssd_gets_the_shipped_draft_with_the_draft_process_on_a_core_of_its_own(shipped):
    for given in (Layout(DEFAULT_TARGET, None, "ssd"), Layout(DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "ssd")):
        for ready in (True, False):
            two = apply_defaults(given, cores=[0, 1], ssd_ready=ready)
            assert (two.draft, two.mode, two.target_devices, two.draft_device) == \
                (defaults.SHIPPED_DRAFT_ALIAS, "ssd", "cpu:0", "cpu:1"), given
    eight = apply_defaults(Layout(DEFAULT_TARGET, None, "ssd"), cores=list(range(8)))
    assert (eight.target_devices, eight.draft_device) == ("cpu:0-6", "cpu:7")


def test_plain_ssd_chat_and_sd_run_sd_on_every_core(shipped):
    for given in (Layout(DEFAULT_TARGET, None, None), Layout(DEFAULT_TARGET, None, "sd"),
                  Layout(DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, None),
                  Layout(DEFAULT_TARGET.upper(), None, None)):  # (QA: --target SmolLM2-135M ran AR, no draft)
        # Unpinned (torch's threads, one per physical core), the draft in the target's process.
        once = apply_defaults(given, cores=[0, 1])
        assert (once.draft, once.mode, once.target_devices, once.draft_device) == \
            (defaults.SHIPPED_DRAFT_ALIAS, "sd", None, None), given
        # The chat app also keeps an idle draft process on the last core, so that SSD is one keystroke away.
        app = apply_defaults(given, cores=[0, 1], ssd_ready=True)
        assert (app.draft, app.mode, app.target_devices, app.draft_device) == \
            (defaults.SHIPPED_DRAFT_ALIAS, "sd", None, "cpu:1"), given
    eight = apply_defaults(Layout(DEFAULT_TARGET, None, None), cores=list(range(8)), ssd_ready=True)
    assert (eight.target_devices, eight.draft_device) == (None, "cpu:7")


def test_ar_alone_unless_the_draft_is_asked_for(shipped):
    assert apply_defaults(Layout(DEFAULT_TARGET, None, "ar"), cores=[0, 1]) == Layout(DEFAULT_TARGET, None, "ar")
    with_draft = apply_defaults(Layout(DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "ar"), cores=[0, 1],
                                ssd_ready=True)
    assert (with_draft.draft, with_draft.mode, with_draft.target_devices, with_draft.draft_device) == \
        (defaults.SHIPPED_DRAFT_ALIAS, "ar", None, "cpu:1")


def test_one_core_keeps_everything_in_one_process(shipped):
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
    for given in (Layout(DEFAULT_TARGET, None, "ssd"), Layout(DEFAULT_TARGET, None, None)):  # plain: AR alone
        assert apply_defaults(given, cores=[0, 1], ssd_ready=True) == given


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
    monkeypatch.setattr(defaults.affinity, "usable", lambda: {0, 1})
    for args in (["--plain", "--mode", "ssd"], ["ask", "hi", "--mode", "ssd"]):
        seen.clear()
        result = CliRunner().invoke(cli.app, args)
        assert result.exit_code == 2 and "stop here" in result.stderr, result.output
        assert (seen["target"], seen["draft"], seen["target_devices"], seen["draft_device"]) == \
            (DEFAULT_TARGET, defaults.SHIPPED_DRAFT_ALIAS, "cpu:0", "cpu:1"), args
        assert seen["speculation"].mode == "ssd", args
    for args in (["--plain"], ["ask", "hi"]):  # no chat app to switch modes in: no idle draft process
        seen.clear()
        CliRunner().invoke(cli.app, args)
        assert (seen["draft"], seen["target_devices"], seen["draft_device"]) == \
            (defaults.SHIPPED_DRAFT_ALIAS, None, None), args
        assert seen["speculation"].mode == "sd", args
    for args in (["ask", "hi", "--draft", "none"], ["ask", "hi", "--mode", "ar"]):
        seen.clear()
        CliRunner().invoke(cli.app, args)
        assert seen["draft"] is None and seen["speculation"].mode == "ar" and seen["draft_device"] is None, args


def test_the_chat_app_gets_an_idle_draft_process_for_ssd(shipped, monkeypatch):
    from typer.testing import CliRunner

    from ssd_chat import cli, tui
    from ssd_chat.tui import engine_process

    seen: dict = {}

    class Started:  # the app's engine, started before the app
        @classmethod
        def start(cls, target, **kwargs):
            seen.update(kwargs)
            return cls()

        def wait_ready(self):
            return None

    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: load_engine() or 0)
    monkeypatch.setattr(engine_process, "EngineProcess", Started)
    monkeypatch.setattr(cli, "LLM", lambda **kwargs: pytest.fail("the chat app's engine runs in its own process"))
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    monkeypatch.setattr(defaults.affinity, "usable", lambda: {0, 1})
    result = CliRunner().invoke(cli.app, [])
    assert result.exit_code == 0, result.output
    assert (seen["draft"], seen["target_devices"], seen["draft_device"]) == \
        (defaults.SHIPPED_DRAFT_ALIAS, None, "cpu:1")
    assert seen["speculation"].mode == "sd"


@pytest.mark.parametrize(("args", "env", "enter_sends"), [([], {}, None), (["--enter", "newline"], {}, False),
                                                          ([], {"SSD_CHAT_ENTER": "Newline"}, False)])
def test_enter_reaches_the_chat_app_from_the_flag_or_the_environment(args, env, enter_sends, monkeypatch):
    """None: neither, so the app takes its saved preference."""
    from typer.testing import CliRunner

    from ssd_chat import cli, tui

    seen: dict = {}
    monkeypatch.setattr(tui, "run_tui", lambda load_engine, **kwargs: seen.update(kwargs) or 0)
    monkeypatch.setattr(cli, "_engine_loader", lambda target, engine_kwargs: None)
    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    result = CliRunner().invoke(cli.app, ["--mode", "ar", *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen["enter_sends"] is enter_sends



class FakeLLM:
    """engine.LLM's closing, as the CLI uses it: a context manager."""

    vocab_size = 49152

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def test_a_bad_ssd_chat_enter_stops_only_the_chat_app(monkeypatch):
    from typer.testing import CliRunner

    from ssd_chat import cli

    monkeypatch.setattr(cli, "_in_a_terminal", lambda: True)
    models = CliRunner().invoke(cli.app, ["models"], env={"SSD_CHAT_ENTER": "sideways"})
    assert models.exit_code == 0 and "smollm2-135m" in models.output
    monkeypatch.setattr(cli, "run_repl", lambda llm, params, system: None)  # the plain mode: no use for it either
    monkeypatch.setattr(cli, "LLM", lambda **kwargs: FakeLLM())
    plain = CliRunner().invoke(cli.app, ["--plain", "--mode", "ar"], env={"SSD_CHAT_ENTER": "sideways"})
    assert plain.exit_code == 0, plain.output
    chat = CliRunner().invoke(cli.app, [], env={"SSD_CHAT_ENTER": "sideways"})
    assert chat.exit_code == 2
    assert "--enter (from SSD_CHAT_ENTER) takes send or newline; got 'sideways'" in chat.output
