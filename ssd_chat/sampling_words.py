"""The sampling settings (temperature, top-p, top-k) in the chat's own words: a number written as the user would type
it, in the status line, the panel, the export and the notices alike."""

from __future__ import annotations


def number_text(value: float) -> str:
    """A number as the user would type it: 0.9, 1, 1e-9, 0.123456789 (Python's :g writes 1e-09 and 0.123457)."""
    if isinstance(value, int):
        return str(value)
    mantissa, _, exponent = repr(float(value)).partition("e")  # (repr: the shortest text that reads back as it)
    return mantissa.removesuffix(".0") + (f"e{int(exponent)}" if exponent else "")
