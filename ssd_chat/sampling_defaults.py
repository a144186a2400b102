"""The chat's default sampling for a target (where `--temperature`, `--top-p`, `--top-k` are not given): what the
model's makers recommend, else FALLBACK.

- A model directory's ``generation_config.json``, where it samples (``do_sample`` true): the temperature, top-p and
  top-k that transformers' ``generate()`` samples with (Llama 3.1 Instruct's: 0.6 and top-p 0.9; Qwen3's: 0.6,
  top-p 0.95, top-k 20). A value it leaves out, or one out of range, is the fallback's.
- The embedded SmolLM2-135M-Instruct (the ``smollm2-135m`` alias): 0.2 and top-p 0.9, its model card's example
  (``model.generate(..., temperature=0.2, top_p=0.9, do_sample=True)``); its generation_config.json has none.
  At 0.7 a 135M model rambles, and its draft's acceptance is lower (README, Numbers: the sampled tables).
- Anything else (a hub alias or repo id: its files may not even be here yet): FALLBACK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.sampling_params import SamplingParams
from ssd_chat.setting_words import FLAGS, check_max_tokens, check_sampling, number_text


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off


FALLBACK = Sampling(0.7)
MODEL_CARD = {"smollm2-135m": Sampling(0.2, top_p=0.9)}  # alias -> its card's example


def recommended(target: str) -> Sampling:
    """The sampling the model's makers recommend for `target` (an alias or a model directory), else FALLBACK."""
    directory = Path(target).expanduser()
    if not directory.is_dir() and target.lower() in MODEL_CARD:  # (as the registry: a directory first, any case)
        return MODEL_CARD[target.lower()]
    try:
        data = json.loads((directory / "generation_config.json").read_text())
    except (OSError, ValueError):
        return FALLBACK
    if not isinstance(data, dict) or not data.get("do_sample"):  # greedy by its makers' word, or no word
        return FALLBACK
    temperature = _number(data.get("temperature"), lambda t: 0 <= t <= 10)
    if temperature is None:
        return FALLBACK
    top_p = _number(data.get("top_p"), lambda p: 0 < p <= 1)
    top_k = _number(data.get("top_k"), lambda k: k >= 0 and k == int(k))
    return Sampling(float(temperature), FALLBACK.top_p if top_p is None else float(top_p),
                    FALLBACK.top_k if top_k is None else int(top_k))


def _number(value: object, valid) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and valid(value):
        return value
    return None


def chosen(target: str, temperature: float | None, top_p: float | None, top_k: int | None,
           **others: object) -> SamplingParams:
    """The request settings of the options as given, each sampling one not given (None) the model's recommended one;
    `others`: SamplingParams' other fields (max_tokens, seed). A bad value's error names its option (--top-p,
    --max-tokens)."""
    base = recommended(target)
    sampling = (base.temperature if temperature is None else temperature, base.top_p if top_p is None else top_p,
                base.top_k if top_k is None else top_k)
    check_sampling(FLAGS, *sampling)
    if "max_tokens" in others:
        check_max_tokens(FLAGS["max_tokens"], others["max_tokens"])
    return SamplingParams(temperature=sampling[0], top_p=sampling[1], top_k=sampling[2], **others)


def filters_text(temperature: float, top_p: float, top_k: int, sep: str = " ", seed: int | None = None) -> str:
    """The filters a sampled reply uses, and its seed where it has one, for the status line, the panel, the export and
    compare: "top-p 0.9", "top-p 0.95 top-k 20 seed 7"; "" where none applies (off, or greedy: temperature 0 takes
    the argmax whatever they are, and draws from no seed)."""
    if temperature == 0:
        return ""
    return sep.join(([f"top-p {number_text(top_p)}"] if top_p < 1 else []) + ([f"top-k {top_k}"] if top_k > 0 else [])
                    + ([f"seed {seed}"] if seed is not None else []))
