"""`ssd-chat distill`'s soft labels (``--loss topk``): the target's top-k next-token distribution at every reply
position, scored once and cached, so that training matches the target's distribution at the cost of
cross-entropy (``--loss kl`` runs the target on every batch instead: about 3x a cross-entropy step).

A greedy reply token is the target's top choice; cross-entropy on it says nothing about the others, and a small
draft trained on few replies then memorises them (the training loss falls far below what it reaches on held-out
replies). The target's top-k probabilities are a richer label per token, and they rank the next-best tokens,
which SSD's fan-out pre-drafts. The labels are the top TOP_K of the target's whole-vocabulary softmax, kept where
the draft's head has the token and renormalised over those.

Scoring runs the target teacher-forced over the replies, SCORE_BATCH examples at a time (bfloat16 matmuls where
training runs them, the softmax in float32), and writes a chunk file per CHUNK examples: an interrupted run keeps
its chunks, and a chunk whose examples changed is scored again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ssd_chat.distill_data import Example

TOP_K = 16
SCORE_BATCH = 8
CHUNK = 256


@dataclass(frozen=True)
class TeacherRows:
    """One example's labels: the target's top-k tokens at each of its R reply positions."""

    ids: torch.Tensor       # [R, k] int32: token ids, most likely first
    logprobs: torch.Tensor  # [R, k] float16: their log-probabilities under the target (whole vocabulary)


def score(
    target: nn.Module, examples: Sequence[Example], work: Path, *, bf16: bool, pad_id: int,
    progress: Callable[[int, int], None],
) -> list[TeacherRows]:
    """The labels of every example, from ``work``'s chunk files where they match, the rest scored and written."""
    from ssd_chat.distill_train import pad_batch  # the training batches' own layout

    out: list[TeacherRows] = []
    progress(0, len(examples))
    for first in range(0, len(examples), CHUNK):
        chunk = examples[first : first + CHUNK]
        path, key = work / f"teacher-{first // CHUNK:05d}.pt", _key(target, chunk, bf16)
        rows = _load(path, key)
        if rows is None:
            rows = []
            for start in range(0, len(chunk), SCORE_BATCH):
                batch = chunk[start : start + SCORE_BATCH]
                ids, mask = pad_batch(batch, pad_id)
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    hidden = target.model(input_ids=ids).last_hidden_state[mask]  # [N, D]
                    logits = target.lm_head(hidden)                                # [N, V]
                top = F.log_softmax(logits.float(), dim=-1).topk(TOP_K, dim=-1)  # [N, k]
                sizes = [len(e.reply_ids) for e in batch]
                rows += [TeacherRows(i.to(torch.int32), v.to(torch.float16))
                         for i, v in zip(top.indices.split(sizes), top.values.split(sizes), strict=True)]
                progress(first + start + len(batch), len(examples))
            tmp = path.with_suffix(".tmp")
            torch.save({"key": key, "ids": [r.ids for r in rows], "logprobs": [r.logprobs for r in rows]}, tmp)
            tmp.replace(path)  # atomic: an interrupted write leaves no chunk
        out += rows
        progress(first + len(chunk), len(examples))
    return out


def soft_targets(rows: Sequence[TeacherRows], index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels of a batch's reply positions (in the order of ``pad_batch``'s mask) as rows of the draft's kept
    head: (cols [N, k] long, -1 where the head lacks the token; probs [N, k], renormalised over the kept ones, all
    zero where none is kept). index: ``distill_train.head_index`` [V]."""
    ids = torch.cat([r.ids for r in rows]).long()             # [N, k]
    probs = torch.cat([r.logprobs for r in rows]).float().exp()  # [N, k]
    cols = index[ids]                                          # [N, k], -100 outside the head
    kept = cols >= 0
    probs = probs * kept
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-12)
    return cols.where(kept, -1), probs


def topk_loss(draft_logits: torch.Tensor, cols: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft's softmax (over its kept vocabulary) against the target's renormalised top-k
    (KL(target top-k || draft) up to a constant), averaged over positions that have a label.
    draft_logits: [N, Vr]; cols, probs: [N, k] from ``soft_targets``."""
    log_q = F.log_softmax(draft_logits, dim=-1).gather(1, cols.clamp_min(0))  # [N, k]
    per_row = -(probs * log_q).sum(-1)                                         # [N]
    labelled = probs.sum(-1) > 0
    return (per_row * labelled).sum() / labelled.sum().clamp_min(1)  # 0, not NaN, for a batch with no label


def _key(target: nn.Module, chunk: Sequence[Example], bf16: bool) -> str:
    """What a chunk's labels depend on: the target (its directory), the examples, k, the precision and, in
    bfloat16, the batching (its products depend on the rows they are computed with)."""
    digest = hashlib.sha256(json.dumps([e.token_ids for e in chunk]).encode())
    digest.update(f"{getattr(target.config, 'name_or_path', '')} top{TOP_K} bf16={bf16} batch={SCORE_BATCH}".encode())
    return digest.hexdigest()


def _load(path: Path, key: str) -> list[TeacherRows] | None:
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)
    if state.get("key") != key:
        return None
    return [TeacherRows(i, v) for i, v in zip(state["ids"], state["logprobs"], strict=True)]
