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
