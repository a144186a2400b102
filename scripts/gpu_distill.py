"""Distil drafts on a CUDA GPU, time-boxed: many more self-written prompts and replies than the CPU recipe affords,
and KL to the target's distribution on every step.

`ssd-chat distill` (the CPU recipe) is limited by its data: about a million reply tokens cost it 40-85 minutes on a
2-core CPU, and its drafts' agreement levels off there. On a GPU the same target writes about a million tokens a
minute (17k tokens/s on an H200 with this script's plain transformers decoding). This script runs one time-boxed
pass (``--budget-s``) of four phases:

1. prompts: ``assets/prompts/distill.jsonl`` (its held-out prompts and their twins left out of training, as
   distill does) plus ``--self-prompts`` requests the target writes itself (``make_self_prompts``' method and
   filter: its chat template up to a user turn, temperature 1, top-p 0.9, seeded), minus any that share a
   ``SHINGLE``-word run with a held-out benchmark prompt (``chat.jsonl``, ``chat-unseen.jsonl``: make_self_prompts'
   ``shares_run``); or the prompts of ``--self-prompts-file`` (the H200 run's 13,717 are
   ``assets/prompts/distill-gpu-self.jsonl``);
2. replies: greedy, ``--max-tokens`` each, past the end of turn (distill's ``--ignore-eos``), float32 (TF32 off),
   many decoded together, until the time box ends; reply caches (``--replies``: distill's ``DIR/distill/data.jsonl``
   holds the CPU target's own, an earlier run's ``data.jsonl.gz`` its new prompts') supply the replies they hold;
3. training, per ``--layers`` entry: distill's draft (the target's first L layers, its embedding frozen, a head
   over the ``--head-vocab`` most frequent reply tokens), AdamW on KL(target || draft) over the kept tokens,
   bfloat16 autocast, the step count fitted to the draft's share of the time left (a warm-up with cosine decay);
4. output: ``OUT/draft-L<n>/`` (a draft directory, int8 matmuls, as distill writes), ``OUT/data.jsonl.gz`` (the
   new prompts' ids and replies), ``OUT/self-prompts.jsonl``, ``OUT/log.jsonl`` and ``OUT/summary.json``.

``python scripts/gpu_distill.py --target smollm2-135m --out DIR --budget-s 420``; ``--smoke`` runs tiny settings on
the CPU (its logic is tested by tests/ssd_chat/test_gpu_distill.py). What one H200 run made and how the drafts
did: README.md, ``ssd-chat distill``, "The GPU recipe".
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from hf_decode import decode_split  # noqa: E402 (after the path set-up; many rows decoded together)
from make_self_prompts import held_out_shingles, keep, shares_run, user_turn_prefix  # noqa: E402

from engine.chat import encode_chat  # noqa: E402
from engine.registry import resolve_model  # noqa: E402
from engine.startup import load_tokenizer  # noqa: E402
from ssd_chat import distill_data as data  # noqa: E402
from ssd_chat import distill_model as dm  # noqa: E402
from ssd_chat.distill_config import DISTILL_PROMPTS  # noqa: E402
from ssd_chat.distill_prompts import split  # noqa: E402
from ssd_chat.distill_train import (  # noqa: E402
    TrainSettings,
    batch_indices,
    greedy_agreement,
    kl_loss,
    lr_at,
    pad_batch,
    target_argmax,
    target_logits,
)
from ssd_chat.prompts import load_prompts  # noqa: E402

PROBE_STEPS, SAFETY = 4, 0.8  # training steps timed to fit the count to the time; the share of the time planned
log = logging.getLogger("gpu_distill")


class Clock:
    """Seconds since the start and what is left of the budget."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def self_prompts(model, tokenizer, count: int, *, batch: int, seed: int, pad_id: int, stop_id: int,
                 clock: Clock, until_s: float) -> list[str]:
    """Up to ``count`` sampled user requests (kept by make_self_prompts' filter, no held-out run), in order."""
    prefix = user_turn_prefix(tokenizer)
    banned = held_out_shingles()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    kept: dict[str, None] = {}
    sampled = 0
    while len(kept) < count and clock.elapsed() < until_s:
        n = min(batch, 2 * (count - len(kept)))
        for row in decode_split(model, [prefix] * n, 96, pad_id=pad_id, stop_id=stop_id, temperature=1.0, top_p=0.9,
                          generator=generator):
            if row[-1] != stop_id:
                continue
            message = tokenizer.decode(row[:-1], skip_special_tokens=False).strip()
            if keep(message) and not shares_run(message, banned):
                kept.setdefault(message)
        sampled += n
        log.info("self-prompts: %d kept of %d sampled (t=%.0f s)", len(kept), sampled, clock.elapsed())
    return list(kept)[:count]


def read_reply_cache(path: Path | None) -> dict[tuple[int, ...], tuple[int, ...]]:
    """prompt ids -> reply ids from a distill reply cache (header line, then one row per reply); gzip allowed."""
    if path is None:
        return {}
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()[1:]
    return {tuple(row["prompt_ids"]): tuple(row["reply_ids"]) for row in map(json.loads, lines)}


def write_replies(model, todo: list[tuple[int, ...]], replies: dict, *, max_tokens: int, batch: int, pad_id: int,
                  clock: Clock, until_s: float) -> None:
    """Greedy replies for ``todo`` (shortest prompts first, so a batch pads little) until the time box ends."""
    todo = sorted(todo, key=len)
    for start in range(0, len(todo), batch):
        if clock.elapsed() >= until_s:
            log.info("replies: time box reached, %d prompts left without a reply", len(todo) - start)
            return
        chunk = todo[start : start + batch]
        written = decode_split(model, [list(i) for i in chunk], max_tokens, pad_id=pad_id)
        for ids, reply in zip(chunk, written, strict=True):
            replies[ids] = tuple(reply)
        log.info("replies: %d of %d (t=%.0f s)", min(start + batch, len(todo)), len(todo), clock.elapsed())


def train_draft(target, layers: int, head_ids: torch.Tensor, train: list[data.Example], held: list[data.Example],
                expected: list[torch.Tensor], *, seconds: float, batch: int, lr: float, seed: int, pad_id: int,
                device: torch.device, log_rows: list[dict], min_steps: int) -> tuple[object, dict]:
    """One draft trained on KL for about ``seconds`` (the step count fitted after timing PROBE_STEPS steps); its
    agreement on ``held`` against the target's greedy tokens ``expected`` (distill_train.target_argmax)."""
    draft = dm.init_draft(target, layers, head_ids.to(device)).to(device)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step(examples: list[data.Example], rate: float | None) -> float:
        ids, mask = (t.to(device) for t in pad_batch(examples, pad_id))
        with autocast:
            loss = kl_loss(draft(ids).float(), target_logits(target, ids, draft.head_ids).float(), mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.step()
        return loss.item()

    def batch_of(s: int) -> list[data.Example]:  # distill's batch order
        return [train[i] for i in batch_indices(s, batch, len(train), seed)]

    step(batch_of(0), None)  # warm-up (kernels, allocator): not timed, no update
    started = time.perf_counter()
    for probe in range(1, PROBE_STEPS + 1):  # several batches: their lengths vary
        step(batch_of(probe), None)
    step_s = (time.perf_counter() - started) / PROBE_STEPS
    started = time.perf_counter()
    before = greedy_agreement(draft, held, expected)
    eval_s = time.perf_counter() - started
    # the H200 run's steps came out 30% slower than a one-batch probe said: a margin, and the six evaluations
    steps = max(min_steps, int((SAFETY * seconds - 6 * eval_s) / step_s))
    settings = TrainSettings(steps, batch, lr, seed, eval_every=max(1, steps // 5), checkpoint_every=steps)
    log.info("L%d: %.3f s a step -> %d steps (%.1f epochs); agreement %.3f", layers, step_s, steps,
             steps * batch / len(train), before)
    recent: list[float] = []
    for s in range(steps):
        recent = [*recent[-19:], step(batch_of(s), lr_at(s, settings))]
        if (s + 1) % settings.eval_every == 0 or s + 1 == steps:
            row = {"layers": layers, "step": s + 1, "loss": round(sum(recent) / len(recent), 5),
                   "agreement": round(greedy_agreement(draft, held, expected), 4)}
            log_rows.append(row)
            log.info("L%d %s", layers, row)
    return draft, {"layers": layers, "steps": steps, "step_s": round(step_s, 4), "agreement_before": round(before, 4),
                   "agreement": log_rows[-1]["agreement"], "params_per_token": dm.num_params_per_token(draft)}


def main(args: argparse.Namespace) -> None:
    clock = Clock(args.budget_s)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    target_dir = resolve_model(args.target)
    tokenizer = load_tokenizer(target_dir)
    target = dm.load_target(target_dir).to(device)
    eos = dm.target_eos_ids(target)
    pad_id = eos[0] if eos else 0
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else pad_id
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "device": str(device)}
    if device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(device)

    base = load_prompts(args.prompts, limit=args.max_prompts)
    training, held = split(base, args.eval_prompts)  # (a held-out prompt's twins out of training too)
    encode = lambda messages: tuple(encode_chat(tokenizer, messages, model=str(target_dir)))  # noqa: E731
    base_ids = [encode(m) for m in base]
    train_ids, held_ids = [base_ids[i] for i in training], [base_ids[i] for i in held]

    if args.self_prompts_file is not None:  # an earlier run's (assets/prompts/distill-gpu-self.jsonl)
        banned = held_out_shingles()
        texts = [messages[-1]["content"] for messages in load_prompts(args.self_prompts_file)]
        written = [text for text in texts if not shares_run(text, banned)]
    else:
        written = self_prompts(target, tokenizer, args.self_prompts, batch=args.sample_batch, seed=args.seed,
                               pad_id=pad_id, stop_id=stop_id, clock=clock, until_s=args.prompts_s)
    (out / "self-prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in written), "utf-8")
    known = set(base_ids)
    new_ids = [ids for ids in dict.fromkeys(encode([{"role": "user", "content": p}]) for p in written)
               if ids not in known]
    summary["self_prompts"], summary["prompts_s"] = len(written), round(clock.elapsed(), 1)

    replies = {}
    for path in args.replies:
        replies |= read_reply_cache(path)
    seen = known | set(new_ids)
    new_ids += [ids for ids in replies if ids not in seen]  # an earlier run's prompts
    cached = len(replies)
    todo = [ids for ids in dict.fromkeys([*held_ids, *train_ids, *new_ids]) if ids not in replies]
    write_replies(target, todo, replies, max_tokens=args.max_tokens, batch=args.reply_batch, pad_id=pad_id,
                  clock=clock, until_s=args.replies_s)
    with gzip.open(out / "data.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"max_tokens": args.max_tokens, "ignore_eos": True, "dtype": "float32",
                                 "device": summary.get("gpu", str(device))}) + "\n")
        for ids in new_ids:
            if ids in replies:
                handle.write(json.dumps({"prompt_ids": ids, "reply_ids": replies[ids]}) + "\n")
    train = [data.Example(ids, replies[ids]) for ids in [*train_ids, *new_ids] if ids in replies]
    held_examples = [data.Example(ids, replies[ids]) for ids in held_ids if ids in replies]
    summary |= {"replies_cached": cached, "replies_written": len(replies) - cached, "train_examples": len(train),
                "train_reply_tokens": sum(len(e.reply_ids) for e in train), "data_s": round(clock.elapsed(), 1)}
    log.info("data: %s", {k: summary[k] for k in ("train_examples", "train_reply_tokens", "data_s")})

    head_ids = data.head_vocab_ids(train, target.config.vocab_size, args.head_vocab, always=eos)
    summary["head_coverage"] = round(data.head_coverage(train, head_ids), 4)
    layers = [int(x) for x in args.layers.split(",")]
    log_rows: list[dict] = []
    summary["drafts"] = []
    expected = target_argmax(target, held_examples)  # the target's greedy tokens there, once for every draft
    for n, num_layers in enumerate(layers):
        weights = [max(1, x) for x in layers[n:]]  # a draft's share of the time left ~ its depth
        seconds = max(1.0, (clock.left() - args.reserve_s) * weights[0] / sum(weights))
        draft, result = train_draft(target, num_layers, head_ids, train, held_examples, expected, seconds=seconds,
                                    batch=args.batch_size, lr=args.lr, seed=args.seed, pad_id=pad_id, device=device,
                                    log_rows=log_rows, min_steps=args.min_steps)
        # a copy goes to the CPU: the draft's embedding is the target's own tensor (moving the draft itself once
        # took a tied target's head along, on the H200)
        dm.save_draft(copy.deepcopy(draft).to("cpu"), target_dir, out / f"draft-L{num_layers}", "int8")
        del draft
        summary["drafts"].append(result | {"done_s": round(clock.elapsed(), 1)})
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log_rows), "utf-8")
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    log.info("done in %.0f s: %s", clock.elapsed(), json.dumps(summary["drafts"]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=DISTILL_PROMPTS)
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--replies", type=Path, nargs="*", default=[],
                        help="reply caches (distill's data.jsonl, this script's data.jsonl.gz): their replies are "
                             "reused, and their prompts outside --prompts are trained on")
    parser.add_argument("--budget-s", type=float, default=420.0, help="the whole run's time box")
    parser.add_argument("--prompts-s", type=float, default=45.0, help="self-prompts until this many seconds")
    parser.add_argument("--replies-s", type=float, default=170.0, help="replies until this many seconds")
    parser.add_argument("--reserve-s", type=float, default=15.0, help="kept for saving at the end")
    parser.add_argument("--self-prompts", type=int, default=20000)
    parser.add_argument("--self-prompts-file", type=Path, default=None,
                        help="take these self-written prompts instead of sampling new ones")
    parser.add_argument("--sample-batch", type=int, default=2048)
    parser.add_argument("--reply-batch", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--head-vocab", type=int, default=8192)
    parser.add_argument("--layers", default="4,12", help="draft depths to train, in order")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny settings on the CPU (the test)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device = "cpu"
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: this is the GPU recipe (use --smoke to try its logic on the CPU)")
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    main(parse_args())
