"""User-facing errors of the engine.

Every error a user can cause (a bad alias, missing weights, a prompt that is too long, an invalid
sampling value) is an ``EngineError``: its message is ONE line that says what is wrong and what to
do about it. Front ends print the message and exit with code 2; they never show a traceback for it.
Internal invariants use ``assert`` instead.
"""


class EngineError(ValueError):
    """A problem the user can fix; ``str(err)`` is a one-line explanation with the fix."""


class UnknownModelError(EngineError):
    """A model name that is neither an alias, a local directory, nor a Hugging Face repo id."""


class WeightsUnavailableError(EngineError):
    """The weights are not on this machine and cannot be downloaded now (offline, gated, ...)."""


class UnsupportedArchitectureError(EngineError):
    """The model directory holds an architecture the engine does not implement."""


class ModelFilesError(EngineError):
    """A model directory misses a file or holds a corrupt one."""


class PromptTooLongError(EngineError):
    """A prompt (plus what must be generated) does not fit in the context limit."""


class InvalidParameterError(EngineError):
    """An invalid sampling or engine parameter."""


class WeightShapeError(ModelFilesError):
    """A checkpoint tensor whose shape is not the one the model's config.json gives: the config and the weights
    are of different models. The weight loaders raise it; ``engine.loader`` names the tensor and its file."""

    def __init__(self, expected: tuple[int, ...], found: tuple[int, ...]):
        self.expected, self.found = expected, found
        super().__init__(f"a checkpoint tensor has shape {found}, where config.json gives {expected}: the config "
                         "and the weights are of different models")


def check_shape(found: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """Refuse a whole (unsharded) checkpoint tensor of another shape than `expected`, before any slice of it is
    copied: a narrow or a slice of a larger tensor succeeds, and loads a model that answers garbage."""
    found, expected = tuple(found), tuple(expected)
    if found != expected:
        raise WeightShapeError(expected, found)
