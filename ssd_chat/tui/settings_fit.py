"""A chat's settings against what the engine accepts: `check` before a change is applied, `fit` for a chat as saved.

A saved chat may hold a value this version refuses (a fan-out past engine.config.MAX_FANOUT, saved before the fan-out
had a limit; a k+1 fan-out reopened with another --k): every reply of that chat failed on it. `fit` gives the defaults
of as few settings as make it usable, and a notice saying which.
"""

from __future__ import annotations

from dataclasses import replace

from engine.config import SpeculationConfig
from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from ssd_chat import sampling_words
from ssd_chat.history import ChatSettings

# Reset in this order until the settings pass, each with the ones before it (a k+1 fan-out goes with its k); the
# command that sets each again
RESETS = {"fanout": ("fan-out", "/fanout"), "k": ("k", "/k"), "temperature": ("temperature", "/temp"),
          "top_p": ("top-p", "/top-p"), "top_k": ("top-k", "/top-k"), "mode": ("mode", "/mode")}


def check(settings: ChatSettings, base: SpeculationConfig) -> None:
    """Raise the one-line EngineError that SpeculationConfig gives for a value it refuses (`base`: the run's
    speculation settings, --backup and --fixed-k, with the chat's mode, k and fan-out), or sampling_words for a
    sampling value, naming its slash command (SamplingParams' error would name its field, top_p)."""
    replace(base, mode=settings.mode, k=settings.k, fanout=settings.fanout)
    sampling_words.check(sampling_words.SLASH, settings.temperature, settings.top_p, settings.top_k)
    sampling_params(settings)


def sampling_params(settings: ChatSettings) -> SamplingParams:
    """What a reply of a chat with these settings samples with."""
    return SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                          max_tokens=settings.max_tokens)


def fit(settings: ChatSettings, base: SpeculationConfig,
        defaults: ChatSettings) -> tuple[dict[str, object], str | None]:
    """The changes that make `settings` usable and the notice that says so; ({}, None) where they are usable.
    `defaults`: the run's settings (what a new chat starts with: the model's temperature, the mode the engine was
    started in). The fewest settings go back to them: each alone first, then together in RESETS' order."""
    try:
        check(settings, base)
        return {}, None
    except EngineError as err:
        error = str(err)
    differ = [name for name in RESETS if getattr(settings, name) != getattr(defaults, name)]
    tries = [{name: getattr(defaults, name)} for name in differ]
    tries += [{name: getattr(defaults, name) for name in differ[: i + 1]} for i in range(1, len(differ))]
    for changes in tries:
        try:
            check(replace(settings, **changes), base)
            break
        except EngineError:
            continue
    else:  # (none of these: the reply's error will say what)
        return {}, None
    what = " and ".join(RESETS[name][0] for name in changes)
    how = ", ".join(RESETS[name][1] for name in changes) + (" sets it" if len(changes) == 1 else " set them")
    return changes, f"this chat's settings are refused ({error}): it uses the default {what} now ({how})"
