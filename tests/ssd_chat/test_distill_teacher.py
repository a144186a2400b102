"""distill's top-k soft labels: the target's own top-k, cached per chunk, renormalised over the draft's head, and
a loss that is a KL (zero exactly where the draft's softmax is the label); `--loss topk` trains a better draft."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from ssd_chat import distill_teacher as teacher
from ssd_chat.distill import DistillConfig, run_distill
from ssd_chat.distill_data import Example
from ssd_chat.distill_model import load_target
from ssd_chat.distill_train import head_index


def test_soft_targets_keep_the_heads_tokens_and_renormalise():
    index = head_index(torch.tensor([2, 5, 7]), vocab_size=10)  # the head keeps tokens 2, 5, 7
    row = teacher.TeacherRows(torch.tensor([[5, 3, 2], [4, 3, 1]], dtype=torch.int32),
                              torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.3, 0.2]]).log().half())
    cols, probs = teacher.soft_targets([row], index)
    assert cols.tolist() == [[1, -1, 0], [-1, -1, -1]]
    torch.testing.assert_close(probs[0], torch.tensor([0.6, 0.0, 0.1]) / 0.7, atol=1e-3, rtol=1e-3)
    assert probs[1].sum() == 0  # no kept token: the position has no label


def test_topk_loss_is_a_kl_up_to_the_labels_entropy():
    gen = torch.Generator().manual_seed(0)
    cols = torch.tensor([[3, 0, -1], [1, 2, 4]])
    probs = torch.tensor([[0.7, 0.3, 0.0], [0.5, 0.25, 0.25]])
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()
    exact = torch.full((2, 5), -1e4)  # the draft's logits where its softmax is the label
    exact[0, [3, 0]] = torch.tensor([0.7, 0.3]).log()
    exact[1, [1, 2, 4]] = torch.tensor([0.5, 0.25, 0.25]).log()
    torch.testing.assert_close(teacher.topk_loss(exact, cols, probs), entropy, atol=1e-4, rtol=1e-4)
    for _ in range(5):  # any other draft pays more
        assert teacher.topk_loss(torch.randn(2, 5, generator=gen), cols, probs) > entropy
    assert teacher.topk_loss(torch.zeros(3, 5), torch.cat([cols, -torch.ones(1, 3, dtype=torch.long)]),
                             torch.cat([probs, torch.zeros(1, 3)])) == teacher.topk_loss(torch.zeros(2, 5), cols, probs)
    unlabelled = teacher.topk_loss(torch.zeros(2, 5), -torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 3))
    assert unlabelled.item() == 0.0  # a batch without a single label: no NaN in the loss or the log


def test_labels_are_the_targets_top_k_and_their_chunks_are_reused(tiny_llama_dir, tmp_path, monkeypatch):
    target = load_target(tiny_llama_dir)
    gen = torch.Generator().manual_seed(1)
    examples = [Example(tuple(torch.randint(200, (4 + i,), generator=gen).tolist()),
                        tuple(torch.randint(200, (6 + i,), generator=gen).tolist())) for i in range(5)]
    monkeypatch.setattr(teacher, "CHUNK", 2)
    rows = teacher.score(target, examples, tmp_path, bf16=False, pad_id=0, progress=lambda d, t: None)
    assert len(list(tmp_path.glob("teacher-*.pt"))) == 3
    for example, row in zip(examples, rows, strict=True):
        ids = torch.tensor([example.token_ids])
        with torch.no_grad():
            logits = target(ids).logits[0, len(example.prompt_ids) - 1 : -1]  # [R, V]
        top = F.log_softmax(logits, -1).topk(teacher.TOP_K)
        assert row.ids.shape == (len(example.reply_ids), teacher.TOP_K)
        assert torch.equal(row.ids.long(), top.indices)
        torch.testing.assert_close(row.logprobs.float(), top.values, atol=1e-2, rtol=1e-2)
    counting = _Counting(target.model)
    monkeypatch.setattr(target, "model", counting)
    again = teacher.score(target, examples, tmp_path, bf16=False, pad_id=0, progress=lambda d, t: None)
    assert counting.calls == 0 and all(torch.equal(a.ids, b.ids) for a, b in zip(again, rows, strict=True))
    changed = teacher.score(target, [*examples[:4], Example((1, 2), (3, 4))], tmp_path, bf16=False, pad_id=0,
                            progress=lambda d, t: None)
    assert counting.calls == 1 and changed[-1].ids.shape == (2, teacher.TOP_K)  # only the changed chunk again
    target.config.name_or_path = str(tmp_path / "another-target")  # the same examples, another teacher
    teacher.score(target, examples, tmp_path, bf16=False, pad_id=0, progress=lambda d, t: None)
    assert counting.calls == 4  # every chunk scored again


class _Counting(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, **kwargs):
        self.calls += 1
        return self.inner(**kwargs)


def test_topk_training_beats_the_untrained_draft(tiny_llama_dir, tmp_path):
    from ssd_chat.distill_config import DISTILL_PROMPTS
    from tests.ssd_chat.test_distill import MAX_TOKENS, NUM_PROMPTS

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(DISTILL_PROMPTS.read_text().splitlines()[:NUM_PROMPTS]) + "\n")
    config = DistillConfig(target=str(tiny_llama_dir), out=tmp_path / "d", prompts_file=prompts, draft_layers=1,
                           head_vocab=200, batch_size=4, lr=3e-3, max_tokens=MAX_TOKENS, eval_prompts=4,
                           eval_every=50, checkpoint_every=100, steps=150, kl_steps=0, loss="topk")
    result = run_distill(config, lambda *_: None)
    log = [json.loads(line) for line in (tmp_path / "d" / "distill" / "log.jsonl").read_text().splitlines()]
    assert log[0]["agreement"] < result.agreement
    assert len(list((tmp_path / "d" / "distill" / "teacher").glob("teacher-*.pt"))) == 1
