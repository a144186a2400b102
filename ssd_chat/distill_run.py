"""The run directory of `ssd-chat distill` (``OUT/distill``): --out checked before anything is written, the run's
settings (what a --resume may change), the checkpoint's step and the logged agreement."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.errors import InvalidParameterError
from ssd_chat import distill_data as data
from ssd_chat.distill_config import check_out

if TYPE_CHECKING:
    from ssd_chat.distill_config import DistillConfig

logger = logging.getLogger(__name__)
WORK_DIR = "distill"  # inside the output directory: the run's state, not part of the model


def prepare_out(out: Path) -> Path:
    """Create ``out/distill`` (a one-line error when that is impossible); refuse a directory holding anything
    but an earlier distill run, rather than writing model files into it."""
    check_out(out)
    work = out / WORK_DIR
    if out.is_dir() and any(out.iterdir()) and not (work / "settings.json").is_file():
        raise InvalidParameterError(f"--out {out} holds other files: give a new or empty directory")
    try:
        work.mkdir(parents=True, exist_ok=True)
        probe = work / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise InvalidParameterError(f"cannot write to --out {out}: {err.strerror or err}") from None
    return work


def check_settings(work: Path, config: DistillConfig, data_settings: data.DataSettings, precision: str) -> None:
    """With --resume a run continues only with the settings it started with, except that a larger --steps extends
    a run whose KL stage has not begun (the learning rate then follows the longer schedule from the checkpoint
    on; ``extended_from`` in settings.json lists the step counts it had); --no-resume starts over (keeping the
    reply cache, which is only reused when its own settings match)."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("out", "threads", "resume", "eval_every",
                                                                       "checkpoint_every", "save_weights")}
    settings = {**settings, "prompts_file": str(settings["prompts_file"]), "data": asdict(data_settings),
                "precision": precision}  # auto as resolved: a resume keeps it
    settings.pop("reply_dtype")  # in "data"
    path = work / "settings.json"
    if config.resume and path.is_file() and (work / "checkpoint.pt").is_file():
        before = {"kl_steps": 0, "kl_lr": config.kl_lr, "precision": "fp32"} \
            | json.loads(path.read_text(encoding="utf-8"))  # runs from before those options
        before["data"] = data.LATER_FIELDS | before.get("data", {})
        changed = sorted(k for k in settings if before.get(k) != settings[k])
        done = checkpoint_step(work) if changed else 0  # (reads the checkpoint: only when it matters)
        extended = list(before.get("extended_from", []))
        if "steps" in changed and config.steps > before["steps"] and done <= before["steps"]:
            changed.remove("steps")
            extended.append(before["steps"])
            logger.info("extending the run from %d to %d steps", before["steps"], config.steps)
        if extended:
            settings["extended_from"] = extended
        if changed and set(changed) <= {"kl_steps", "kl_lr"} and done <= config.steps:
            changed = []  # a KL stage (re)planned while the run has not started it: the steps before are the same
        if changed:
            flags = ", ".join(f"--{k.replace('_', '-')} ({before.get(k)!r} before)" for k in changed)
            raise InvalidParameterError(f"{work.parent} holds a run with other settings: {flags}; give the same "
                                        "options to resume, or --no-resume to start over")
    elif not config.resume:
        for name in ("checkpoint.pt", "log.jsonl"):
            (work / name).unlink(missing_ok=True)
        for name in ("config.json", "model.safetensors"):
            (work.parent / name).unlink(missing_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def checkpoint_step(work: Path) -> int:
    return int(torch.load(work / "checkpoint.pt", weights_only=True, map_location="cpu")["step"])


def logged_agreement(work: Path, step: int) -> float | None:
    path = work / "log.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        row = json.loads(line)
        if row.get("step") == step and "agreement" in row:
            return row["agreement"]
    return None
