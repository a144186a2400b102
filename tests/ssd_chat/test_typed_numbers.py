"""Numbers are read as typed: ASCII digits, one sign, a decimal point and an exponent. Python's int() and float()
took `/temp 1_0` as 10, `/k ４` (a full-width digit) as 4, and `ask --temperature 1_0` ran at 10."""

from __future__ import annotations

import pytest

from engine.errors import InvalidParameterError
from ssd_chat.setting_words import SLASH, fanout_counts, typed_number
from ssd_chat.typed_numbers import WHAT, parse
from tests.ssd_chat.cli_runs import run_ssd_chat
from tests.ssd_chat.tui_fakes import FakeEngine, errors, make_app, send, settle

ODD = ("1_0", "４", "٣", "\u30001", "1\u00a0", "1 2", "nan", "inf", "-inf", "1e", "e5", "0x10", "", "+", "1.2.3", "--1",
       "1e1.5")


@pytest.mark.parametrize(("text", "value"), [("0.7", 0.7), ("-1", -1.0), ("+2", 2.0), (".5", 0.5), ("3.", 3.0),
                                             ("1e-3", 1e-3), ("2E+2", 200.0), ("0e-400", 0.0)])
def test_plain_numbers_read_as_floats(text, value):
    assert parse(text, float) == value and isinstance(parse(text, float), float)


def test_whole_numbers_take_no_point_or_exponent():
    assert [parse(t, int) for t in ("4", "-1", "+32", "007", "4 ", "\t 5")] == [4, -1, 32, 7, 4, 5]  # (ASCII spaces)
    for text in ("1.0", "1e3", "4.", *ODD):
        with pytest.raises(ValueError, match="is not a whole number"):
            parse(text, int)


@pytest.mark.parametrize("text", ODD)
def test_what_python_alone_would_take_is_refused(text):
    with pytest.raises(ValueError, match=r"is not a number \(ASCII digits"):
        parse(text, float)


def test_slash_arguments_refuse_them_in_one_line():
    with pytest.raises(InvalidParameterError, match=r"^/temp takes a number \(ASCII digits.*; got '1_0'$"):
        typed_number(SLASH, "temperature", "1_0", float)
    with pytest.raises(InvalidParameterError, match=r"^/k takes a whole number \(ASCII digits, as 4\); got '４'$"):
        typed_number(SLASH, "k", "４", int)
    assert fanout_counts(SLASH, " 1 , 2 ") == (1, 2)
    for typed in ("1_0", "1,２", "1.5"):
        with pytest.raises(InvalidParameterError, match=r"^/fanout takes whole numbers"):
            fanout_counts(SLASH, typed)


@pytest.mark.asyncio
async def test_the_chat_app_keeps_its_settings_on_such_a_number(tmp_path):
    app = make_app(FakeEngine(), tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        before = app.session.settings
        for typed in ("/temp 1_0", "/k ４", "/top-k 1_0", "/top-p ０.5", "/temp nan"):
            await send(app, pilot, typed)
            command, arg = typed.split()
            what = WHAT[int if command in ("/k", "/top-k") else float]
            assert errors(app)[-1] == f"{command} takes {what}; got {arg!r}"
        assert app.session.settings == before


@pytest.mark.parametrize(("option", "value"), [("--temperature", "1_0"), ("--k", "４"), ("--max-tokens", "1e3")])
def test_the_command_line_refuses_them_in_one_line_naming_the_option(option, value):
    result = run_ssd_chat("ask", "hi", option, value)  # (refused as it parses: no model loads)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} takes a "), lines
    assert lines[0].endswith(f"; got {value!r}"), lines
