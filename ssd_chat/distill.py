"""`ssd-chat distill`: train a cheap draft for a target by self-distillation, on the CPU, resumably.

Recipe: (1) the target answers a prompt set (``assets/prompts/distill.jsonl``; a few prompts held out) with
our engine; (2) the draft starts as the target's embedding, first ``draft_layers`` layers and norm, and a head
restricted to the ``head_vocab`` tokens most frequent in those replies; (3) it is trained with AdamW,
teacher-forced on the replies, on cross-entropy with the reply tokens (``ce``) or on KL(target || draft) over
the kept tokens (``kl``), then for ``kl_steps`` more steps on KL (after ``--steps 0``, none). The output
directory is a compact draft directory (``--draft DIR``, see ``distill_model``); ``DIR/distill/`` holds the
run: settings, reply cache, checkpoint and log. The defaults are the recipe of the shipped
``smollm2-135m-draft``.
Settings: ``distill_config``; data: ``distill_data``; model: ``distill_model``; training loop: ``distill_train``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cpu_info import flags as cpu_flags
from engine.registry import resolve_model
from ssd_chat import distill_data as data
from ssd_chat import distill_teacher
from ssd_chat.distill_config import DistillConfig, checked_target
from ssd_chat.distill_model import init_draft, load_target, num_params_per_token, save_draft, target_eos_ids
from ssd_chat.distill_prompts import checked_prompts, split
from ssd_chat.distill_run import check_settings, logged_agreement, prepare_out
from ssd_chat.distill_train import TrainSettings, train

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int, str], None]  # phase ("replies" | "labels" | "training"), done, total, detail



@dataclass(frozen=True)
class DistillResult:
    out: Path
    steps: int
    steps_run: int
    num_examples: int            # training prompts (held-out ones excluded)
    num_reply_tokens: int        # in the training replies
    head_coverage: float         # of the training reply tokens by the kept vocabulary
    agreement_before: float | None  # greedy agreement on the held-out prompts, untrained
    agreement: float | None      # after training
    final_loss: float | None
    draft_params_per_token: int
    target_params_per_token: int
    replies_s: float
    training_s: float


def run_distill(config: DistillConfig, progress: Progress, prompts: list | None = None) -> DistillResult:
    """Generate (or reuse) the replies, train (or resume), write the draft into ``config.out``. `prompts`: the
    prompt file's, as `checked_prompts(config)` returns them (the CLI's, checked before torch loaded)."""
    out = Path(config.out).expanduser().resolve()
    target_dir = resolve_model(config.target)
    checked_target(config, target_dir)
    prompts = checked_prompts(config) if prompts is None else prompts
    work = prepare_out(out)
    data_settings = data.DataSettings(str(target_dir), data.file_sha256(Path(config.prompts_file)), config.max_tokens,
                                      config.temperature, config.seed, config.ignore_eos, config.reply_dtype)
    precision = training_precision(config.precision)
    check_settings(work, config, data_settings, precision)
    if config.threads is not None:
        torch.set_num_threads(config.threads)

    started = time.perf_counter()
    examples = data.generate_examples(str(target_dir), prompts, data_settings, work / "data.jsonl",
                                 threads=config.threads, progress=lambda d, t: progress("replies", d, t, ""))
    replies_s = time.perf_counter() - started
    training, held_out = split(prompts, config.eval_prompts)
    train_examples, eval_examples = [examples[i] for i in training], [examples[i] for i in held_out]

    started = time.perf_counter()
    target = load_target(target_dir)
    eos_ids = target_eos_ids(target)
    head_ids = data.head_vocab_ids(train_examples, target.config.vocab_size, config.head_vocab, always=eos_ids)
    draft = init_draft(target, config.draft_layers, head_ids)
    trains = config.steps > 0  # --steps 0: the untrained draft, no labels to score and no KL stage
    settings = TrainSettings(config.steps, config.batch_size, config.lr, config.seed, config.eval_every,
                             config.checkpoint_every, config.loss if trains else "ce",
                             config.kl_steps if trains else 0, config.kl_lr, precision)
    pad_id = eos_ids[0] if eos_ids else 0
    teacher = None
    if settings.loss == "topk":
        (work / "teacher").mkdir(exist_ok=True)
        teacher = distill_teacher.score(target, train_examples, work / "teacher", bf16=precision == "bf16",
                                        pad_id=pad_id, progress=lambda d, t: progress("labels", d, t, ""))
    result = train(draft, target, train_examples, eval_examples, settings, work, pad_id=pad_id,
                   on_checkpoint=lambda: save_draft(draft, target_dir, out, config.save_weights),
                   progress=lambda d, t, detail: progress("training", d, t, detail), teacher=teacher)
    if result.steps_run == 0:  # nothing trained now (--steps 0, or a finished run): the draft still gets written
        save_draft(draft, target_dir, out, config.save_weights)
    target_per_token = sum(p.numel() for p in target.model.layers.parameters()) + target.lm_head.weight.numel()
    return DistillResult(
        out=out, steps=settings.total_steps, steps_run=result.steps_run, num_examples=len(train_examples),
        num_reply_tokens=sum(len(e.reply_ids) for e in train_examples),
        head_coverage=data.head_coverage(train_examples, head_ids), agreement_before=logged_agreement(work, 0),
        agreement=result.agreement if result.agreement is not None else logged_agreement(work, settings.total_steps),
        final_loss=result.final_loss, draft_params_per_token=num_params_per_token(draft),
        target_params_per_token=target_per_token, replies_s=replies_s, training_s=time.perf_counter() - started,
    )


def training_precision(precision: str) -> str:
    """"auto" -> "bf16" on a CPU with native bfloat16 matmuls (AVX512-BF16 or AMX), else "fp32"."""
    if precision != "auto":
        return precision
    return "bf16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "fp32"


@contextmanager
def progress_bar() -> Iterator[Progress]:
    """A rich progress bar on stderr, one row per phase (replies, labels, training), as a ``Progress`` callback."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as RichProgress

    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[detail]}"))
    tasks: dict[str, object] = {}
    bar = RichProgress(*columns, console=Console(stderr=True))

    def update(phase: str, done: int, total: int, detail: str) -> None:
        if not tasks:  # the bar shows from the first update: an error before it stays one line
            bar.start()
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total, detail="")
        bar.update(tasks[phase], completed=done, total=total, detail=detail)

    try:
        yield update
    finally:
        if tasks:
            bar.stop()
