"""Numbers as a user types them: ASCII digits, one sign, a decimal point and an exponent (0.7, -1, .5, 1e-9).

Python's int() and float() take more: 1_0 (ten: `/temp 1_0` ran at 10), other scripts' digits (a full-width ４ was
4), other scripts' spaces around the number, and float()'s inf and nan. ASCII spaces and tabs around it are fine
(`--k '4 '`, as int() took it, and as /fanout's counts take them). The slash commands (tui.commands) and the
command line's number options (cli_options) read numbers here, so a typo is refused rather than read as some other
value.
"""

from __future__ import annotations

import re

_WHOLE = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
WHAT = {int: "a whole number (ASCII digits, as 4)",
        float: "a number (ASCII digits, a sign, a decimal point and an exponent, as 0.7, -1 or 1e-3)"}


def parse(text: str, kind: type[int] | type[float]) -> int | float:
    """`text` as a `kind` (int: a whole number, no decimal point or exponent); ValueError for anything else."""
    number = text.strip(" \t")
    if not (_WHOLE if kind is int else _NUMBER).fullmatch(number):
        raise ValueError(f"{text!r} is not {WHAT[kind]}")
    return kind(number)
