"""The sampling settings (temperature, top-p, top-k) in the chat's own words: what each takes, the check of a value
before the engine sees it, and a number written as the user would type it.

The engine's SamplingParams refuses the same values in its Python API's words ("top_p must be in (0, 1]"); the chat
app, the plain mode, `ask` and `bench` check them first and name the option the user typed: `/top-p` in the app
(SLASH), `--top-p` on the command line (FLAGS). Numbers show as typed in the status line, the panel, the export and
the notices alike. A top-k at or past the model's vocabulary filters nothing (it is top-k off): once the vocabulary is
known (the engine has loaded), it is refused with how to turn the filter off.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.errors import InvalidParameterError

MAX_TEMPERATURE = 100.0  # (SamplingParams')
TAKES = {"temperature": "a temperature from 0 to 100, 0 = greedy", "top_p": "a mass in (0, 1], 1 = off",
         "top_k": "a number of tokens, 0 = off"}
SLASH = {"temperature": "/temp", "top_p": "/top-p", "top_k": "/top-k"}  # the chat app's commands
FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k"}  # the command line's options


def check(names: Mapping[str, str], temperature: object, top_p: object, top_k: object,
          vocab: int | None = None) -> None:
    """Raise a one-line InvalidParameterError naming the option as `names` has it for a value SamplingParams would
    refuse (a saved chat's may be any JSON value), or for a top-k at or past `vocab` (the model's, where known)."""
    for field, value in {"temperature": temperature, "top_p": top_p, "top_k": top_k}.items():
        if not _fits(field, value):
            raise InvalidParameterError(f"{names[field]} takes {TAKES[field]}; got {_given(value)}")
    if vocab is not None:
        check_top_k(names["top_k"], top_k, vocab)  # (an int: _fits)


def check_top_k(name: str, top_k: int, vocab: int) -> None:
    """Refuse a top-k that filters nothing: at or past the model's `vocab` tokens."""
    if top_k >= vocab:
        raise InvalidParameterError(f"{name} takes fewer tokens than the model's vocabulary of {vocab} (0 turns it "
                                    f"off); got {top_k}")


def number_text(value: float) -> str:
    """A number as the user would type it: 0.9, 1, 1e-9, 0.123456789 (Python's :g writes 1e-09 and 0.123457)."""
    if isinstance(value, int):
        return str(value)
    mantissa, _, exponent = repr(float(value)).partition("e")  # (repr: the shortest text that reads back as it)
    return mantissa.removesuffix(".0") + (f"e{int(exponent)}" if exponent else "")


def _fits(field: str, value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if field == "top_k":
        return isinstance(value, int) and value >= 0
    if field == "top_p":
        return 0 < value <= 1
    return 0 <= value <= MAX_TEMPERATURE


def _given(value: object) -> str:
    return number_text(value) if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)
