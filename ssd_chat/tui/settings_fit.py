"""A chat's settings against what the engine accepts: `check` before a change is applied, `fit` for a chat as saved.

A saved chat may hold a value this version refuses (a fan-out past engine.config.MAX_FANOUT, saved before the fan-out
had a limit; a k+1 fan-out reopened with another --k; a top-p and a top-k out of range in a hand-edited file): every
reply of that chat failed on it. `fit` gives the defaults of as few settings as make it usable, and a notice that names
each refused value, why, and what it is now.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from engine.config import SpeculationConfig, capped
from engine.errors import EngineError, InvalidParameterError
from engine.sampling_params import MAX_SEED, SamplingParams
from ssd_chat import setting_words
from ssd_chat.history import ChatSettings

# What fit may reset (as few as make the settings pass; of as many, the first in this order: a k+1 fan-out reopened
# with another k is one reset, the fan-out's), with its name in the notice and the command that sets it again
RESETS = {"fanout": ("fan-out", "/fanout"), "k": ("k", "/k"), "temperature": ("temperature", "/temp"),
          "top_p": ("top-p", "/top-p"), "top_k": ("top-k", "/top-k"), "seed": ("seed", "/seed"),
          "mode": ("mode", "/mode")}


def check(settings: ChatSettings, base: SpeculationConfig, vocab: int | None = None,
          max_draft: int | None = None) -> None:
    """Raise a one-line EngineError for a value the engine refuses, naming its slash command (setting_words:
    SpeculationConfig's and SamplingParams' errors name their fields, top_p), then SpeculationConfig's for the rest
    (`base`: the run's speculation settings, --backup and --fixed-k, with the chat's mode, k and fan-out); `vocab`:
    the loaded model's vocabulary, which a top-k must be under, and `max_draft`: the most its rounds draft (the CPU's
    31: a fan-out has a count per accepted count up to it); None: not loaded yet, or no such limit."""
    setting_words.check(setting_words.SLASH, settings.mode, settings.k, settings.fanout, max_draft)
    speculation(settings, base, max_draft)
    setting_words.check_sampling(setting_words.SLASH, settings.temperature, settings.top_p, settings.top_k, vocab)
    seed = settings.seed
    if seed is not None and not (type(seed) is int and 0 <= seed <= MAX_SEED):  # (a hand-edited one: -1, "7")
        raise InvalidParameterError(f"/seed takes {setting_words.TAKES['seed']}; got {seed!r}")
    sampling_params(settings)


def speculation(settings: ChatSettings, base: SpeculationConfig, max_draft: int | None = None) -> SpeculationConfig:
    """What a reply of a chat with these settings speculates with: its k as the engine drafts it (/k 32 on the CPU:
    31, the same rounds), so that a fan-out of k+1 counts for the k drafted is the engine's k+1."""
    k = capped(settings.k, max_draft)
    return replace(base, mode=settings.mode, k=k, fanout=settings.fanout)


def sampling_params(settings: ChatSettings) -> SamplingParams:
    """What a reply of a chat with these settings samples with."""
    return SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                          max_tokens=settings.max_tokens, seed=settings.seed)


def fit(settings: ChatSettings, base: SpeculationConfig, defaults: ChatSettings, vocab: int | None = None,
        max_draft: int | None = None) -> tuple[dict[str, object], str | None]:
    """The changes that make `settings` usable and the notice that says so; ({}, None) where they are usable.
    `defaults`: the run's settings (what a new chat starts with: the model's temperature, the mode the engine was
    started in). The fewest settings go back to them, and only those: a valid one beside refused ones stays."""
    if _refusal(settings, base, vocab, max_draft) is None:
        return {}, None
    differ = [name for name in RESETS if getattr(settings, name) != getattr(defaults, name)]
    for count in range(1, len(differ) + 1):
        for names in combinations(differ, count):
            changes = {name: getattr(defaults, name) for name in names}
            if _refusal(replace(settings, **changes), base, vocab, max_draft) is None:
                return changes, _notice(settings, base, changes, vocab, max_draft)
    return {}, None  # (none of these: the reply's error will say what)


def _notice(settings: ChatSettings, base: SpeculationConfig, changes: dict[str, object], vocab: int | None,
            max_draft: int | None) -> str:
    """One line: why each value was refused (its error, the other resets made: the fewest, so each is needed) and the
    default it is now."""
    others = [{n: v for n, v in changes.items() if n != name} for name in changes]
    reasons = " · ".join(filter(None, (_refusal(replace(settings, **without), base, vocab, max_draft)
                                       for without in others)))
    what = [RESETS[name][0] + ("" if value is None else f" {_shown(value)}")  # (None: the default fan-out)
            for name, value in changes.items()]
    what = " and ".join([", ".join(what[:-1]), what[-1]] if len(what) > 1 else what)
    how = ", ".join(RESETS[name][1] for name in changes) + (" sets it" if len(changes) == 1 else " set them")
    return f"this chat's settings are refused ({reasons}): it uses the default {what} now ({how})"


def _refusal(settings: ChatSettings, base: SpeculationConfig, vocab: int | None, max_draft: int | None) -> str | None:
    """check's error, or None where the settings pass."""
    try:
        check(settings, base, vocab, max_draft)
    except EngineError as err:
        return str(err)
    return None


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))  # (a fan-out, as /fanout takes it)
    return setting_words.number_text(value) if isinstance(value, int | float) else str(value)
