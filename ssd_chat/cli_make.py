"""`ssd-chat make-pair` and `ssd-chat distill`: the commands that make draft/target models (registered on the
app in ``cli``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from engine import pair_measures, synthetic
from engine.config import DEFAULT_TARGET
from engine.errors import InvalidParameterError
from engine.registry import locate_model
from ssd_chat.cli_options import Target, Threads, one_of, plain, report, user_errors
from ssd_chat.distill_config import (
    DISTILL_PROMPTS,
    LOSSES,
    PRECISIONS,
    REPLY_DTYPES,
    SAVE_WEIGHTS,
    DistillConfig,
    check_out,
    checked_target,
)
from ssd_chat.distill_prompts import checked_prompts
from ssd_chat.prompts import DEFAULT_PROMPTS, load_prompts

AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 8, 32  # make-pair: the first prompts of the shipped set
PAIR_OPTIONS = ("seed", "draft_layers", "damping", "head_vocab")  # synthetic.PairSettings' fields, as make-pair's
WHOLE, NUMBER = plain(int), plain(float)  # plain numbers, as the other commands take them (int() took 1_0 as ten)


def make_pair(
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for target/ and draft/.", show_default="the synthetic-* aliases' cache"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.", parser=WHOLE)] = 0,
    draft_layers: Annotated[int, typer.Option(help="Target layers the draft keeps.",
                                              parser=WHOLE)] = synthetic.DEFAULT_DRAFT_LAYERS,
    damping: Annotated[float, typer.Option(help="Scale of the deeper layers' output projections.", parser=NUMBER)] = (
        synthetic.DEFAULT_DAMPING),
    head_vocab: Annotated[
        int, typer.Option(help="Tokens the target can emit (the draft's reduced head scores only these); 0: all.",
                          parser=WHOLE)
    ] = synthetic.DEFAULT_HEAD_VOCAB,
    agreement: Annotated[bool, typer.Option(help="Measure the greedy draft/target agreement.")] = True,
) -> None:
    """Build a random, correlated draft/target pair for speculative-decoding speed tests (no download)."""
    out_dir = out if out is not None else synthetic.default_pair_dir()
    with user_errors():
        started = time.perf_counter()
        try:
            paths = synthetic.build_pair(out_dir, seed=seed, draft_layers=draft_layers, damping=damping,
                                         head_vocab=head_vocab)
        except InvalidParameterError as err:
            raise typer.Exit(report(_as_option(str(err)))) from None
        except OSError as err:
            raise typer.Exit(report(f"cannot write the pair to {out_dir}: {err.strerror or err}")) from None
        typer.echo(f"ready in {time.perf_counter() - started:.1f} s (seed {seed}, draft layers {draft_layers}, "
                   f"damping {damping:g}, head vocabulary {head_vocab or 'all'})")
        for role, path in zip(("target", "draft"), paths, strict=True):
            typer.echo(f"{role}: {path} ({pair_measures.num_params(path) / 1e6:.1f}M params)")
        if agreement:
            messages = load_prompts(DEFAULT_PROMPTS, limit=AGREEMENT_PROMPTS)
            prompts = [turns[-1]["content"] for turns in messages]
            rate = pair_measures.greedy_agreement(*paths, prompts, AGREEMENT_TOKENS)
            typer.echo(f"greedy agreement: {rate:.3f} ({len(prompts)} prompts x {AGREEMENT_TOKENS} tokens)")


def _as_option(error: str) -> str:
    """The pair's settings name a refused value by its field (`draft_layers takes ...`): the option as typed."""
    field, _, rest = error.partition(" ")
    return f"--{field.replace('_', '-')} {rest}" if field in PAIR_OPTIONS else error


def distill(
    out: Annotated[Path, typer.Option(help="Output directory: the draft model, and its run state in DIR/distill/.")],
    target: Target = DEFAULT_TARGET,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Training prompts: plain lines or JSONL with prompt/messages.",
                     show_default="assets/prompts/distill.jsonl"),
    ] = None,
    max_prompts: Annotated[int | None, typer.Option(help="Use the file's first N prompts (default: all).",
                                                    parser=WHOLE)] = None,
    draft_layers: Annotated[int, typer.Option(help="Target layers the draft starts from.", parser=WHOLE)] = 4,
    head_vocab: Annotated[int, typer.Option(help="Tokens the draft's head scores (most frequent in the replies); "
                                                 "0: all.", parser=WHOLE)] = 8192,
    steps: Annotated[int, typer.Option(help="Training steps (0: write the untrained draft).", parser=WHOLE)] = 1800,
    batch_size: Annotated[int, typer.Option(help="Replies per training step.", parser=WHOLE)] = 16,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate (warm-up, then cosine decay).",
                                      parser=NUMBER)] = 1e-3,
    loss: Annotated[str, typer.Option(help="ce: cross-entropy on the reply tokens (greedy acceptance, fast); "
                                           "kl: KL to the target's distribution (runs the target per step); "
                                           "topk: the target's top-16 distribution, scored once.",
                                      parser=one_of(LOSSES))] = "ce",
    kl_steps: Annotated[int, typer.Option(help="Then this many steps of KL to the target's distribution (it ranks "
                                               "the draft's other choices: SSD's cache hits).", parser=WHOLE)] = 400,
    kl_lr: Annotated[float, typer.Option(help="Peak learning rate of the KL steps.", parser=NUMBER)] = 3e-4,
    seed: Annotated[int, typer.Option(help="Seed of the batch order (and of sampled replies).", parser=WHOLE)] = 0,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per target reply.", parser=WHOLE)] = 192,
    temperature: Annotated[float, typer.Option(help="The target's temperature for its replies; 0 = greedy.",
                                               parser=NUMBER)] = 0.0,
    ignore_eos: Annotated[bool, typer.Option(help="Replies run to --max-tokens past the end of turn (the target "
                                                  "then writes and answers a new user turn).")] = True,
    eval_prompts: Annotated[int, typer.Option(help="Prompts held out to measure greedy agreement (they must leave "
                                              "one --batch-size of training prompts).", parser=WHOLE)] = 32,
    eval_every: Annotated[int, typer.Option(help="Steps between agreement measurements.", parser=WHOLE)] = 100,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints (and draft writes).",
                                                  parser=WHOLE)] = 100,
    threads: Threads = None,
    resume: Annotated[bool, typer.Option(help="Continue the run found in --out (--no-resume: start over).")] = True,
    precision: Annotated[str, typer.Option(help="The training steps' matmuls: fp32, bf16, or auto (bf16 where the "
                                                "CPU has native bfloat16, else fp32).",
                                           parser=one_of(PRECISIONS))] = "auto",
    reply_dtype: Annotated[str, typer.Option(help="The target's dtype while it writes the replies: float32, or "
                                                  "bfloat16 (faster where the CPU has AMX).",
                                             parser=one_of(REPLY_DTYPES))] = "float32",
    save_weights: Annotated[str, typer.Option(help="How the draft's matmul weights are stored: int8 (row scales; "
                                                   "what the engine's default int8 draft runs) or float16.",
                                              parser=one_of(SAVE_WEIGHTS))] = "int8",
) -> None:
    """Train a cheap draft for --target on its own replies (self-distillation, CPU); --draft DIR loads it."""
    with user_errors():
        config = DistillConfig(
            target=target, out=out, prompts_file=prompts or DISTILL_PROMPTS, max_prompts=max_prompts,
            draft_layers=draft_layers, head_vocab=head_vocab, steps=steps, batch_size=batch_size, lr=lr, loss=loss,
            kl_steps=kl_steps, kl_lr=kl_lr,
            seed=seed, max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos,
            eval_prompts=eval_prompts, eval_every=eval_every,
            checkpoint_every=checkpoint_every, threads=threads, resume=resume, precision=precision,
            reply_dtype=reply_dtype, save_weights=save_weights,
        )
        check_out(Path(config.out).expanduser())  # a wrong --out or --target: said before torch loads (3 s)
        if (found := locate_model(config.target)) is not None:  # (None: built or downloaded as the run starts)
            checked_target(config, found)
        prompts = checked_prompts(config)  # (a held-out prompt in them, too few left to train on)
        from ssd_chat.distill import progress_bar, run_distill  # (torch)

        with progress_bar() as progress:
            result = run_distill(config, progress, prompts)
    ratio = result.target_params_per_token / max(result.draft_params_per_token, 1)
    before = "n/a" if result.agreement_before is None else f"{result.agreement_before:.3f}"
    after = "n/a" if result.agreement is None else f"{result.agreement:.3f}"
    typer.echo(f"draft: {result.out} ({result.steps} steps, {result.steps_run} run now; replies "
               f"{result.replies_s:.0f} s, training {result.training_s:.0f} s)")
    typer.echo(f"data: {result.num_examples} replies, {result.num_reply_tokens} tokens, {result.head_coverage:.1%} "
               f"of them in the draft's head vocabulary")
    typer.echo(f"per token: draft {result.draft_params_per_token / 1e6:.1f}M params, target "
               f"{result.target_params_per_token / 1e6:.1f}M ({ratio:.1f}x)")
    typer.echo(f"greedy agreement on held-out prompts: {before} untrained -> {after}"
               + ("" if result.final_loss is None else f" (loss {result.final_loss:.3f})"))
