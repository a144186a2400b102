"""The chat's settings besides sampling (the mode, k, the fan-out, the reply length) in the chat's own words: the check
of a value before the engine sees it, naming the option the user typed.

The engine's SpeculationConfig and SamplingParams refuse the same values in their Python API's words ("k (draft
tokens per step) must be between 1 and 32", "max_tokens must be >= 1"); the chat app and the command line check them
first, as sampling_words does the sampling settings: `/k` in the app (SLASH), `--k` on the command line (FLAGS).
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.config import MAX_FANOUT, MODES, SCRATCH_SLOTS
from engine.errors import InvalidParameterError
from ssd_chat.sampling_words import number_text

MAX_K = 32  # (SpeculationConfig's)
SLASH = {"mode": "/mode", "k": "/k", "fanout": "/fanout"}  # the chat app's commands
FLAGS = {"mode": "--mode", "k": "--k", "fanout": "--fanout", "max_tokens": "--max-tokens"}  # the command line's


def check(names: Mapping[str, str], mode: object, k: object, fanout: object) -> None:
    """Raise a one-line InvalidParameterError naming the option as `names` has it for a value SpeculationConfig would
    refuse (a saved chat's may be any JSON value)."""
    if mode not in MODES:
        raise InvalidParameterError(f"{names['mode']} takes {', '.join(MODES[:-1])} or {MODES[-1]}; got {_given(mode)}")
    if not _whole(k) or not 1 <= k <= MAX_K:
        raise InvalidParameterError(f"{names['k']} takes the most draft tokens per step, 1-{MAX_K}; got {_given(k)}")
    if fanout is None:  # (the default: geometric for the measured acceptance)
        return
    counts = (fanout,) if _whole(fanout) else tuple(fanout) if isinstance(fanout, tuple | list) else ()
    if not counts or len(counts) not in (1, k + 1):
        raise InvalidParameterError(f"{names['fanout']} takes one count or k+1 = {k + 1} of them (SSD's candidates per "
                                    f"accepted count, 0 to {k}), separated by commas; got {_counts(fanout)}")
    for count in counts:
        if not _whole(count) or not 0 <= count <= MAX_FANOUT:
            raise InvalidParameterError(f"{names['fanout']} takes counts from 0 to {MAX_FANOUT} (SSD's speculation "
                                        f"cache holds {SCRATCH_SLOTS} branch tokens a request); got {_given(count)}")


def check_max_tokens(name: str, value: object) -> None:
    """Refuse a reply length SamplingParams would: under one token."""
    if not _whole(value) or value < 1:
        raise InvalidParameterError(f"{name} takes the most tokens a reply generates, at least 1; got {_given(value)}")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _given(value: object) -> str:
    return number_text(value) if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)


def _counts(fanout: object) -> str:
    """A fan-out as /fanout takes it: 1,2,2."""
    if isinstance(fanout, tuple | list):
        return ",".join(map(_given, fanout)) or "none"
    return _given(fanout)
