"""Numbers as a user types them: ASCII digits, one sign, a decimal point and an exponent (0.7, -1, .5, 1e-9).

Python's int() and float() take more: 1_0 (ten: `/temp 1_0` ran at 10), other scripts' digits (a full-width ４ was
4), other scripts' spaces around the number, and float()'s inf and nan. ASCII spaces and tabs around it are fine
(`--k '4 '`, as int() took it, and as /fanout's counts take them). The slash commands (setting_words) and the
command line's number options (cli_options) read numbers here, so a typo is refused rather than read as some other
value. So is a number past what a float holds: 1e400 (float() reads inf) and a non-zero 1e-400 (float() reads 0:
`/temp 1e-400` ran greedy); -0 reads as 0.
"""

from __future__ import annotations

import math
import re

_WHOLE = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
WHAT = {int: "a whole number (ASCII digits, as 4)",
        float: "a number (ASCII digits, a sign, a decimal point and an exponent, as 0.7, -1 or 1e-3)"}


class UnheldNumber(ValueError):
    """A plain number a float cannot hold: past its largest (`too_big`) or a non-zero one under its smallest."""

    def __init__(self, text: str, *, too_big: bool) -> None:
        self.text, self.too_big = text, too_big
        super().__init__(f"{text} is {'above the largest' if too_big else 'below the smallest'} number it can hold")


def parse(text: str, kind: type[int] | type[float]) -> int | float:
    """`text` as a `kind` (int: a whole number, no decimal point or exponent); ValueError for anything else
    (UnheldNumber for a float past a float's range)."""
    number = text.strip(" \t")
    if not (_WHOLE if kind is int else _NUMBER).fullmatch(number):
        raise ValueError(f"{text!r} is not {WHAT[kind]}")
    if kind is int:
        return int(number)
    value = float(number)
    if math.isinf(value):
        raise UnheldNumber(number, too_big=True)
    if value == 0 and re.search(r"[1-9]", re.split(r"[eE]", number)[0]):  # (1e-400: not the 0 typed)
        raise UnheldNumber(number, too_big=False)
    return value + 0.0  # (-0.0 + 0.0 is 0.0: -0 is 0)
