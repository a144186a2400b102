"""`ssd-chat distill`'s settings: its word options' words and DistillConfig, which checks a run's settings.

Light (no torch): the command line reads the word lists to refuse a bad word as it parses (cli_options.one_of),
as the other commands refuse theirs, before distill's training modules load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.config import MAX_THREADS
from engine.errors import InvalidParameterError
from engine.model_dir import inspect_model_dir
from engine.sampling_params import MAX_TEMPERATURE
from ssd_chat.prompts import HELD_OUT_SETS
from ssd_chat.setting_words import TAKES, listed, number_text

DISTILL_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "distill.jsonl"
PRECISIONS = ("auto", "fp32", "bf16")
REPLY_DTYPES = ("float32", "bfloat16")
LOSSES = ("ce", "kl", "topk")
SAVE_WEIGHTS = ("int8", "float16")  # the draft's matmul weights' storage (distill_model.save_draft); the draft
# only proposes tokens: its rounding never touches exactness
MAX_SEED = 2**32 - 1  # the seeds derived from it (reply_seed, the epoch orders) stay in torch's range


@dataclass(frozen=True)
class DistillConfig:
    target: str
    out: Path
    prompts_file: Path = DISTILL_PROMPTS
    max_prompts: int | None = None  # the file's first N prompts (the reply cache is shared by every N)
    draft_layers: int = 4
    head_vocab: int = 8192  # 0: the whole vocabulary
    steps: int = 1800
    batch_size: int = 16
    lr: float = 1e-3
    loss: str = "ce"  # ce: cross-entropy on the (greedy) reply tokens; kl: KL to the target's distribution;
    # topk: cross-entropy against the target's top-k distribution, scored once (distill_teacher)
    kl_steps: int = 400  # then KL steps: they teach the draft the target's ranking of its other choices
    kl_lr: float = 3e-4
    seed: int = 0
    max_tokens: int = 192
    temperature: float = 0.0
    ignore_eos: bool = True  # replies run to max_tokens: past the end of turn the target writes a new chat turn
    eval_prompts: int = 32
    eval_every: int = 100
    checkpoint_every: int = 100
    threads: int | None = None
    resume: bool = True
    precision: str = "auto"  # the training matmuls: fp32, bf16, or auto (bf16 where the CPU has it natively)
    reply_dtype: str = "float32"  # the target's dtype while it writes the replies (and so --loss ce's labels)
    save_weights: str = "int8"  # how the draft's matmul weights are stored (SAVE_WEIGHTS)

    def __post_init__(self) -> None:
        for name in ("draft_layers", "batch_size", "max_tokens", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise _refused(name, "at least 1", getattr(self, name))
        for name in ("head_vocab", "steps", "kl_steps", "seed", "eval_prompts"):
            if getattr(self, name) < 0:
                raise _refused(name, "at least 0", getattr(self, name))
        for option, value, words in (("--precision", self.precision, PRECISIONS), ("--loss", self.loss, LOSSES),
                                     ("--reply-dtype", self.reply_dtype, REPLY_DTYPES),
                                     ("--save-weights", self.save_weights, SAVE_WEIGHTS)):
            if value not in words:  # (the command line refuses them as it reads them: cli_options.one_of)
                raise InvalidParameterError(f"{option} takes {listed(words)}; got {value!r}")
        if self.seed > MAX_SEED:
            raise _refused("seed", "a whole number from 0 to 2^32-1", self.seed)
        for name in ("lr", "kl_lr"):  # (inf trains the draft into NaNs)
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise _refused(name, "a learning rate above 0", getattr(self, name))
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise _refused("temperature", TAKES["temperature"], self.temperature)
        if self.max_prompts is not None and self.max_prompts < 1:
            raise _refused("max_prompts", "at least 1", self.max_prompts)
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise _refused("threads", f"a number of CPU threads, 1 to {MAX_THREADS}", self.threads)
        if Path(self.prompts_file).resolve() in HELD_OUT_SETS:
            raise InvalidParameterError(f"{Path(self.prompts_file).name} is a held-out benchmark set: train on another "
                                        f"prompt file (default {DISTILL_PROMPTS.name})")


def _refused(field: str, takes: str, value: float) -> InvalidParameterError:
    """A number DistillConfig refuses, in the command line's words: `--steps takes at least 0; got -1`."""
    return InvalidParameterError(f"--{field.replace('_', '-')} takes {takes}; got {number_text(value)}")


def checked_target(config: DistillConfig, target_dir: Path) -> dict:
    """The target's config.json, once `target_dir` is checked: a model directory (one line, not a traceback, where
    not), not a distilled draft, with at least --draft-layers layers. Torch-free: the CLI checks a target already
    on disk (`locate_model`) before torch loads; the run checks it again once resolved."""
    target_config = inspect_model_dir(target_dir).config
    if target_config.get("embedding_from_target") or target_config.get("reduced_head"):
        raise InvalidParameterError(f"--target {config.target} is a distilled draft, which needs its target to run: "
                                    "give the target model")
    num_layers = int(target_config["num_hidden_layers"])
    if config.draft_layers > num_layers:
        raise InvalidParameterError(f"--draft-layers {config.draft_layers} is more than the target's {num_layers} "
                                    f"layers: pick 1..{num_layers}")
    return target_config


def check_out(out: Path) -> None:
    """--out must be a directory to be: refused where it is a file (torch-free, as `checked_target`)."""
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out {out} is a file: give a new or empty directory")

