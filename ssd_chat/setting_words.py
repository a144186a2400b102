"""The chat's settings in the chat's own words: the check of a value before the engine sees it, naming the option the
user typed, and a number written as the user would type it.

The engine's SpeculationConfig and SamplingParams refuse the same values in their Python API's words ("k (draft
tokens per step) must be between 1 and 32", "top_p must be in (0, 1]", "max_tokens must be >= 1"); the chat app,
the plain mode, `ask` and `bench` check them first and name the option the user typed: `/top-p` in the app (SLASH),
`--top-p` on the command line (FLAGS). Numbers show as typed in the status line, the panel, the export and the
notices alike. A top-k at or past the model's vocabulary filters nothing (it is top-k off): once the vocabulary is
known (the engine has loaded), it is refused with how to turn the filter off.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.config import MAX_FANOUT, MAX_K, MODES, SCRATCH_SLOTS, capped
from engine.errors import InvalidParameterError
from engine.sampling_params import MAX_TEMPERATURE
from ssd_chat import typed_numbers

TAKES = {"temperature": "a temperature from 0 to 100, 0 = greedy", "top_p": "a mass in (0, 1], 1 = off",
         "top_k": "a number of tokens, 0 = off", "k": f"the most draft tokens per step, 1-{MAX_K}",
         "seed": "a whole number from 0 to 2^63-1, last (the last reply's) or off (a new seed each reply)",
         "max_tokens": "the most tokens a reply generates, at least 1"}
# The options' names: the chat app's commands and the command line's options
SLASH = {"mode": "/mode", "k": "/k", "fanout": "/fanout", "temperature": "/temp", "top_p": "/top-p", "top_k": "/top-k",
         "seed": "/seed", "max_tokens": "/max-tokens"}
FLAGS = {"mode": "--mode", "k": "--k", "fanout": "--fanout", "max_tokens": "--max-tokens",
         "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k"}
DEFAULT_FANOUT = ("", "none", "default")  # what /fanout and --fanout take for the default fan-out (any case)


def check(names: Mapping[str, str], mode: object, k: object, fanout: object, drafted: int | None = None) -> None:
    """Raise a one-line InvalidParameterError naming the option as `names` has it for a value SpeculationConfig would
    refuse (a saved chat's may be any JSON value). `drafted`: the k the engine drafts for this k, where lower (the
    CPU drafts at most 31 a round: EngineConfig.drafted_k): a fan-out has one count per accepted count 0..drafted."""
    if mode not in MODES:
        raise InvalidParameterError(_mode_refused(names, mode))
    if not _whole(k) or not 1 <= k <= MAX_K:
        raise InvalidParameterError(f"{names['k']} takes {TAKES['k']}; got {_given(k)}")
    if fanout is None:  # (the default: geometric for the measured acceptance)
        return
    drafts = capped(k, drafted)
    counts = (fanout,) if _whole(fanout) else tuple(fanout) if isinstance(fanout, tuple | list) else ()
    if not counts or len(counts) not in (1, drafts + 1):
        raise InvalidParameterError(f"{names['fanout']} takes one count or k+1 = {drafts + 1} of them (SSD's "
                                    f"candidates per accepted count, 0 to {drafts}), separated by commas; got "
                                    f"{_counts(fanout)}")
    for count in counts:
        if not _whole(count) or not 0 <= count <= MAX_FANOUT:
            raise InvalidParameterError(f"{names['fanout']} takes counts from 0 to {MAX_FANOUT} (SSD's speculation "
                                        f"cache holds {SCRATCH_SLOTS} branch tokens a request); got {_given(count)}")


def check_sampling(names: Mapping[str, str], temperature: object, top_p: object, top_k: object,
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


def check_max_tokens(name: str, value: object) -> None:
    """Refuse a reply length SamplingParams would: under one token."""
    if not _whole(value) or value < 1:
        raise InvalidParameterError(f"{name} takes {TAKES['max_tokens']}; got {_given(value)}")


def mode_named(names: Mapping[str, str], typed: str) -> str:
    """A typed mode in any case (SD, Ssd) as engine.config.MODES has it; refused as `check` refuses it, as typed."""
    mode = typed.strip().lower()
    if mode not in MODES:
        raise InvalidParameterError(_mode_refused(names, typed))
    return mode


def typed_number(names: Mapping[str, str], field: str, typed: str, kind: type[int] | type[float]) -> int | float:
    """A setting's number as typed (typed_numbers: not 1_0, a full-width ４, nan); one past what a float holds (1e400,
    a non-zero 1e-400) is refused rather than read as inf or 0 (`/temp 1e-400` ran greedy)."""
    try:
        return typed_numbers.parse(typed, kind)
    except typed_numbers.UnheldNumber as err:
        raise InvalidParameterError(f"{names[field]} {unheld_text(err, field)}") from None
    except ValueError:
        raise InvalidParameterError(f"{names[field]} takes {typed_numbers.WHAT[kind]}; got {typed!r}") from None


def unheld_text(err: typed_numbers.UnheldNumber, field: str) -> str:
    """Why a number past a float's range is refused, and what `field` takes instead."""
    if field == "temperature" and not err.too_big:
        return f"{err}; 0 turns sampling off (greedy)"
    return f"{err}; it takes {TAKES[field]}" if field in TAKES else str(err)


def fanout_counts(names: Mapping[str, str], typed: str | None) -> tuple[int, ...] | None:
    """A typed fan-out: whole numbers separated by commas ("1, 2" is (1, 2)); None for the default (nothing, none or
    default: what /help and the panel call it)."""
    if typed is None or typed.strip().lower() in DEFAULT_FANOUT:
        return None
    try:
        return tuple(int(typed_numbers.parse(f, int)) for f in typed.split(","))
    except ValueError:
        raise InvalidParameterError(f"{names['fanout']} takes whole numbers (ASCII digits) separated by commas, or "
                                    f"none for the default; got {typed!r}") from None


def fanout_text(fanout: tuple[int, ...] | None) -> str:
    """A fan-out as the panel, the notices and the export show it: 1,2,2 (as /fanout takes it), or default."""
    return "default" if fanout is None else ",".join(map(str, fanout))


def number_text(value: float) -> str:
    """A number as the user would type it: 0.9, 1, 1e-9, 0.123456789 (Python's :g writes 1e-09 and 0.123457); 0 for
    -0 (a float's sign of zero means nothing here)."""
    if isinstance(value, int):
        return str(value)
    mantissa, _, exponent = repr(float(value) + 0.0).partition("e")  # (repr: the shortest text that reads back as it)
    return mantissa.removesuffix(".0") + (f"e{int(exponent)}" if exponent else "")


def listed(words: tuple[str, ...]) -> str:
    """The words a word option takes, as its refusal names them: "ar, sd or ssd"."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


def _mode_refused(names: Mapping[str, str], mode: object) -> str:
    return f"{names['mode']} takes {listed(MODES)}; got {_given(mode)}"


def _fits(field: str, value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if field == "top_k":
        return isinstance(value, int) and value >= 0
    if field == "top_p":
        return 0 < value <= 1
    return 0 <= value <= MAX_TEMPERATURE


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _given(value: object) -> str:
    return number_text(value) if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)


def _counts(fanout: object) -> str:
    """A fan-out as /fanout takes it: 1,2,2."""
    if isinstance(fanout, tuple | list):
        return ",".join(map(_given, fanout)) or "none"
    return _given(fanout)
