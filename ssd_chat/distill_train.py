"""`ssd-chat distill`'s training loop, teacher-forced on the target's replies, with AdamW on the CPU.

Three losses: ``ce`` is cross-entropy on the reply tokens themselves. A greedy reply token is the
target's top choice, the very token a greedy draft must propose to be accepted, so this trains greedy
acceptance directly and needs no forward pass of the target (about 3x faster per step than ``kl`` with a
4-layer draft of a 30-layer target). ``kl`` is KL(target || draft) over the kept vocabulary: the target runs
on every batch; it also matches the target's distribution where the reply token is not its top choice.
``topk`` is cross-entropy against the target's top-k distribution, scored once per reply (``distill_teacher``):
the target's distribution at the cost of ``ce``.
After ``steps`` steps of the chosen loss, ``kl_steps`` steps of ``kl`` (fresh AdamW moments, their own warm-up
and decay to ``kl_lr``): cross-entropy on greedy replies teaches the top choice and leaves the ranking of the
others poor, which SSD's fan-out (the draft's next-best tokens) depends on.

``precision`` "bf16" runs the training steps' matmuls in bfloat16 (CPU autocast, onto oneDNN; the weights,
the optimizer and the loss's softmax stay float32; a KL step's teacher logits come from bfloat16 matmuls too):
on a CPU with native bfloat16 (AVX512-BF16 or AMX) a 4-layer step took a third of its float32 time (measured on
an AMD EPYC, where float32 GEMMs run MKL's slower path). The held-out agreement is always measured in float32,
as the engine runs the draft.

Deterministic and resumable: the examples of step s are a pure function of (seed, s) (one seeded permutation
per epoch), and a checkpoint holds the trained tensors, the optimizer and the step, so a run resumed from
step c does exactly what an uninterrupted one does after step c. The log (JSONL) has one line per step
(step, loss, lr) plus, every ``eval_every`` steps and at step 0, the greedy agreement on the held-out prompts.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ssd_chat.distill_data import Example
from ssd_chat.distill_model import DraftModel
from ssd_chat.distill_teacher import TeacherRows, soft_targets, topk_loss

WARMUP_FRACTION, MIN_LR_FRACTION, WEIGHT_DECAY = 0.05, 0.1, 0.01


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int
    lr: float
    seed: int
    eval_every: int
    checkpoint_every: int
    loss: str = "ce"  # "ce" | "kl" | "topk"
    kl_steps: int = 0      # then this many KL steps, fresh AdamW moments, their own warm-up and decay to kl_lr
    kl_lr: float = 3e-4
    precision: str = "fp32"  # "fp32" | "bf16": the training steps' matmuls (autocast)

    @property
    def total_steps(self) -> int:
        return self.steps + self.kl_steps


@dataclass(frozen=True)
class TrainResult:
    steps_run: int             # in this call (0 when the checkpoint was already at the last step)
    final_loss: float | None   # mean of the last logged steps' losses
    agreement: float | None    # at the last evaluation


def kl_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked positions of KL(target || draft), both softmaxed over the kept vocabulary.

    draft_logits, target_logits: [B, T, Vr]; mask: [B, T] (True where position t predicts a reply token).
    """
    log_q = F.log_softmax(draft_logits[mask], dim=-1)   # [N, Vr]
    log_p = F.log_softmax(target_logits[mask], dim=-1)  # [N, Vr]
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def ce_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the reply tokens the head can score. draft_logits: [N, Vr]; labels: [N], indices
    into the kept vocabulary, -100 for tokens outside it (the draft can never propose them)."""
    return F.cross_entropy(draft_logits, labels, ignore_index=-100)


def head_index(head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V]: each token's row in the kept head (``head_ids`` [Vr]), -100 for tokens outside it."""
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[head_ids] = torch.arange(head_ids.numel())
    return index


def head_labels(ids: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The next token at every masked position as a row of the kept head (``head_index``): [N].
    ids, mask: [B, T]."""
    following = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # [B, T]; the wrapped last column is never masked
    return index[following[mask]]


def batch_indices(step: int, batch_size: int, num_examples: int, seed: int) -> list[int]:
    """The examples of ``step``: consecutive slots of a fresh seeded permutation per epoch."""
    out = []
    for slot in range(step * batch_size, (step + 1) * batch_size):
        epoch, pos = divmod(slot, num_examples)
        out.append(_epoch_order(num_examples, seed, epoch)[pos])
    return out


@functools.lru_cache(maxsize=2)  # a step's slots lie in at most two epochs
def _epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()


def pad_batch(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and the mask [B, T] of positions whose next token is a reply token. Causal
    attention keeps right padding from touching real positions, so no attention mask is needed."""
    length = max(len(e.token_ids) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), length, dtype=torch.bool)
    for row, example in enumerate(examples):
        tokens = example.token_ids
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, len(example.prompt_ids) - 1 : len(tokens) - 1] = True
    return ids, mask


def lr_at(step: int, settings: TrainSettings) -> float:
    """Per stage (the main steps, then the KL steps): linear warm-up, then cosine decay to MIN_LR_FRACTION of the
    stage's peak."""
    if step >= settings.steps:
        step, steps, peak = step - settings.steps, settings.kl_steps, settings.kl_lr
    else:
        steps, peak = settings.steps, settings.lr
    warmup = max(1, int(WARMUP_FRACTION * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def target_logits(target: nn.Module, ids: torch.Tensor, head_ids: torch.Tensor | None) -> torch.Tensor:
    """The teacher's logits [B, T, Vr] over the kept tokens (the full vocabulary when head_ids is None)."""
    hidden = target.model(input_ids=ids).last_hidden_state  # [B, T, D]
    head = target.lm_head.weight if head_ids is None else target.lm_head.weight[head_ids]
    return hidden @ head.T


@torch.no_grad()
def greedy_agreement(draft: DraftModel, examples: Sequence[Example], target_argmax: Sequence[torch.Tensor]) -> float:
    """Fraction of reply positions where the draft's top token (over its kept vocabulary) is the target's
    (over the whole vocabulary), teacher-forced on the target's replies: the draft's greedy acceptance. On the
    draft's device (``target_argmax``'s tensors on it too)."""
    matches = total = 0
    for example, expected in zip(examples, target_argmax, strict=True):
        ids, mask = (t.to(draft.head.device) for t in pad_batch([example], pad_id=0))
        proposed = draft.head_ids[draft(ids)[mask].argmax(-1)]  # [R]
        matches += int((proposed == expected).sum())
        total += expected.numel()
    return matches / max(total, 1)


def target_argmax(target: nn.Module, examples: Sequence[Example]) -> list[torch.Tensor]:
    """The target's greedy token at every reply position of each example (computed once; on the target's device)."""
    out = []
    for example in examples:
        ids, mask = (t.to(target.lm_head.weight.device) for t in pad_batch([example], pad_id=0))
        out.append(target_logits(target, ids, None)[mask].argmax(-1))
    return out


def train(
    draft: DraftModel, target: nn.Module, examples: Sequence[Example], eval_examples: Sequence[Example],
    settings: TrainSettings, work_dir: Path, *, pad_id: int, on_checkpoint: Callable[[], None],
    progress: Callable[[int, int, str], None], teacher: Sequence[TeacherRows] | None = None,
) -> TrainResult:
    """Train ``draft`` up to ``settings.total_steps``, resuming from ``work_dir``'s checkpoint when there is one.
    ``teacher``: the labels of ``loss="topk"``, one per example."""
    assert (teacher is not None) == (settings.loss == "topk") and (teacher is None or len(teacher) == len(examples))
    checkpoint, log_path = work_dir / "checkpoint.pt", work_dir / "log.jsonl"
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=WEIGHT_DECAY)
    start = _restore(checkpoint, draft, optimizer)
    _truncate_log(log_path, start)
    expected = target_argmax(target, eval_examples) if eval_examples else []
    index = head_index(draft.head_ids, target.config.vocab_size)
    agreement = None
    if start == 0 and expected:
        agreement = greedy_agreement(draft, eval_examples, expected)
        _append_log(log_path, {"step": 0, "agreement": round(agreement, 4)})
    recent: list[float] = []
    total = settings.total_steps
    progress(start, total, "")
    for step in range(start, total):
        chosen = batch_indices(step, settings.batch_size, len(examples), settings.seed)
        batch = [examples[i] for i in chosen]
        ids, mask = pad_batch(batch, pad_id)
        lr = lr_at(step, settings)
        if step == settings.steps:
            optimizer.state.clear()  # the KL stage starts from fresh moments (its gradients are another loss's)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # the labels outside autocast (it does not take their float16 storage)
        labels = soft_targets([teacher[i] for i in chosen], index) if teacher is not None and step < settings.steps \
            else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.precision == "bf16"):
            if settings.loss == "kl" or step >= settings.steps:
                loss = kl_loss(draft(ids).float(), target_logits(target, ids, draft.head_ids).float(), mask)
            else:
                hidden = draft.hidden(ids)[mask]  # [N, D]: only the positions that predict a reply token
                logits = (hidden @ draft.head.T).float()  # [N, Vr]
                if labels is not None:
                    loss = topk_loss(logits, *labels)
                else:
                    loss = ce_loss(logits, head_labels(ids, mask, index))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        recent = [*recent[-9:], loss.item()]
        row = {"step": step + 1, "loss": round(recent[-1], 5), "lr": lr, "tokens": int(mask.sum())}
        if expected and ((step + 1) % settings.eval_every == 0 or step + 1 in (settings.steps, total)):
            agreement = greedy_agreement(draft, eval_examples, expected)
            row["agreement"] = round(agreement, 4)
        _append_log(log_path, row)
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 in (settings.steps, total):
            _save(checkpoint, draft, optimizer, step + 1)
            on_checkpoint()
        progress(step + 1, total, f"loss {recent[-1]:.3f}" + (
            f"  agreement {agreement:.2f}" if agreement is not None else ""))
    final_loss = sum(recent) / len(recent) if recent else None
    return TrainResult(steps_run=total - start, final_loss=final_loss, agreement=agreement)


def _save(path: Path, draft: DraftModel, optimizer: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "draft": draft.trainable_state(), "optimizer": optimizer.state_dict()}, tmp)
    tmp.replace(path)  # atomic: an interrupted save leaves the previous checkpoint


def _restore(path: Path, draft: DraftModel, optimizer: torch.optim.Optimizer) -> int:
    if not path.is_file():
        return 0
    state = torch.load(path, weights_only=True)
    draft.load_trainable_state(state["draft"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def _truncate_log(path: Path, step: int) -> None:
    """Drop the lines of steps after the checkpoint: they are about to be redone."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines() if step > 0 else []:
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):  # a line cut short by an interruption
            continue
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def _append_log(path: Path, row: dict) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
