"""The chat's default temperature for a target (`--temperature` not given): what the model's makers recommend,
else FALLBACK.

- A model directory's ``generation_config.json`` temperature, where it samples (``do_sample`` true): what
  transformers' ``generate()`` samples with (Llama 3.1 Instruct's says 0.6, Qwen3's 0.6).
- The embedded SmolLM2-135M-Instruct (the ``smollm2-135m`` alias): 0.2, its model card's example
  (``model.generate(..., temperature=0.2, top_p=0.9, do_sample=True)``); its generation_config.json has none.
  At 0.7 a 135M model rambles, and its draft's acceptance is lower (README, Numbers: the sampled table).
- Anything else (a hub alias or repo id: its files may not even be here yet): FALLBACK.

Only the temperature: the chat has no top-p setting (`ssd-chat ask --top-p` has).
"""

from __future__ import annotations

import json
from pathlib import Path

FALLBACK = 0.7
MODEL_CARD = {"smollm2-135m": 0.2}  # alias -> the temperature of its model card's own example


def default_temperature(target: str) -> tuple[float, str]:
    """The temperature and where it comes from (for --help and the README's words: "model card", ...)."""
    directory = Path(target).expanduser()
    if not directory.is_dir() and target.lower() in MODEL_CARD:  # (as the registry: a directory first, any case)
        return MODEL_CARD[target.lower()], "its model card"
    config = directory / "generation_config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return FALLBACK, "the default"
    temperature = data.get("temperature") if isinstance(data, dict) and data.get("do_sample") else None
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and 0 <= temperature <= 10:
        return float(temperature), "its generation_config.json"
    return FALLBACK, "the default"
