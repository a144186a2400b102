"""Plain Python values for the engine's frozen settings (SamplingParams, EngineConfig, SpeculationConfig).

A caller may pass numpy's or torch's numbers, or a generator where a list is asked for; the settings keep plain
floats, ints and tuples. A value of the wrong type is one InvalidParameterError naming the field: a float token
count would run past it, a string would fail deep in a comparison, and a bool is no count.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable

from engine.errors import InvalidParameterError

Kind = Callable[[str, object], object]


def number(name: str, value: object) -> float:
    return _convert(name, value, float, "a number")


def whole(name: str, value: object) -> int:
    return _convert(name, value, operator.index, "a whole number")


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be True or False, got {value!r}")
    return value


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidParameterError(f"{name} must be a string, got {value!r}")
    return value


def path(name: str, value: object) -> str:
    """A model's alias or directory: a string, or a path (pathlib's) as its string."""
    return text(name, os.fspath(value) if isinstance(value, os.PathLike) else value)


def items(name: str, value: object) -> tuple:
    """`value`'s items (a list, a tuple, a generator: read once)."""
    try:
        return tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidParameterError(f"{name} must be a list, got {value!r}") from None


def texts(name: str, value: object) -> tuple[str, ...]:
    """One string (one item, not its characters) or a list of them."""
    out = (value,) if isinstance(value, str) else items(name, value)
    if not all(isinstance(v, str) for v in out):
        raise InvalidParameterError(f"{name} must be a string or a list of strings, got {value!r}")
    return out


def wholes(name: str, value: object) -> tuple[int, ...]:
    return tuple(whole(name, v) for v in items(name, value))


def optional(kind: Kind) -> Kind:
    """`kind`, where None is a value too."""
    return lambda name, value: None if value is None else kind(name, value)


def normalise(settings: object, kinds: dict[str, Kind]) -> None:
    """Replace each named field of the frozen dataclass `settings` by its plain value."""
    for name, kind in kinds.items():
        object.__setattr__(settings, name, kind(name, getattr(settings, name)))


def _convert(name: str, value: object, kind: Callable[[object], float | int], what: str) -> float | int:
    try:
        if isinstance(value, str | bytes | bytearray | bool) or type(value).__name__ == "bool_":  # (numpy's bool)
            raise TypeError
        return kind(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise InvalidParameterError(f"{name} must be {what}, got {value!r}") from None
