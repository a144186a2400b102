"""The `ssd-chat` command line: `ask`, `models`, `bench`, `make-pair`, and the chat when no command is given:
the Textual TUI in a terminal, the plain streaming mode with `--plain` or when piped.

A user error (any EngineError, a bad option value, an unusable prompt file) ends as ONE line
`error: <message>` on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from engine import LLM, EngineError, SamplingParams, synthetic
from engine.config import DEFAULT_TARGET, SpeculationConfig
from engine.errors import InvalidParameterError
from engine.outputs import Event, RequestFinished, RequestOutput, TokenDelta
from engine.registry import list_models
from ssd_chat import __version__
from ssd_chat.bench import DEFAULT_PROMPTS, BenchConfig, BenchInputError, load_prompts, run_bench
from ssd_chat.bench_table import render_table
from ssd_chat.defaults import Layout, apply_defaults
from ssd_chat.plain import run_plain

EXIT_USER_ERROR = 2
AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 8, 32  # make-pair: the first prompts of the shipped set
REPL_OPTIONS = ("target", "system", "temperature", "max_tokens", "threads", "draft", "mode", "k", "fanout", "plain",
                "resume", "dtype", "attention", "eager", "compile")

Target = Annotated[
    str, typer.Option("--target", "-t", help="Model alias (see `ssd-chat models`) or a local model directory.")
]
System = Annotated[str | None, typer.Option(help="System prompt.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")]
MaxTokens = Annotated[int, typer.Option(help="Most tokens to generate per reply.")]
Threads = Annotated[int | None, typer.Option(help="CPU threads for torch (default: torch's choice).")]
Draft = Annotated[
    str | None,
    typer.Option("--draft", "-d", help="Draft model (alias or directory): enables --mode sd / ssd. With the default "
                 "target, --mode sd/ssd alone loads the shipped smollm2-135m-draft (draft on the last core); "
                 "none: no draft."),
]
Mode = Annotated[
    str | None,
    typer.Option(help="ar | sd | ssd (default: sd with a draft, else ar). ssd overlaps drafting with --draft-device."),
]
K = Annotated[int, typer.Option("--k", help="Draft tokens per verify step.")]
Tp = Annotated[int, typer.Option("--tp", help="Target tensor-parallel ranks, one process each.")]
TargetDevices = Annotated[
    str | None, typer.Option(help="Target devices: CPU cores (cpu:0-1, split over the TP ranks) or GPUs (cuda:0-3).")
]
DraftDevice = Annotated[
    str | None,
    typer.Option(help="SSD's draft in its own process on this device (cpu:1, cuda:4); default: in-process."),
]
Backup = Annotated[
    str, typer.Option(help="SSD on a speculation-cache miss: jit (re-draft) or fast (guess from the context).")
]
Fanout = Annotated[
    str | None, typer.Option(help="SSD candidates per accepted count: one number, or k+1 comma-separated.")
]

Dtype = Annotated[str, typer.Option(help="auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, float16.")]
Attention = Annotated[
    str, typer.Option(help="Attention kernels: auto (flashinfer on CUDA when installed), sdpa, flashinfer (CUDA).")
]
Eager = Annotated[bool, typer.Option("--eager", help="CUDA: no CUDA graphs for the decode step.")]
Compile = Annotated[bool, typer.Option("--compile", help="CUDA: torch.compile the model forward.")]

app = typer.Typer(
    add_completion=False, invoke_without_command=True, pretty_exceptions_show_locals=False,
    help="Chat with a local LLM on the ssd-chat engine. With no command: the chat app (TUI), or --plain.",
)


def main() -> None:
    """Console-script entry: typer's own usage errors become one `error:` line too."""
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as err:  # typer's usage errors: bad value, missing argument, unknown option
        code = _report(err.format_message())
    except typer.Abort:
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def _report(message: str) -> int:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    return EXIT_USER_ERROR


@contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except (EngineError, BenchInputError) as err:
        raise typer.Exit(_report(str(err))) from None


def _speculation(
    draft: str | None, mode: str | None, k: int, fanout: str | None, backup: str = "jit"
) -> SpeculationConfig:
    """The decoding mode the options ask for (EngineError on bad values)."""
    try:
        fanout_values = None if fanout is None else tuple(int(f) for f in fanout.split(","))
    except ValueError:
        raise InvalidParameterError(f"--fanout takes numbers separated by commas, got {fanout!r}") from None
    return SpeculationConfig(mode=mode or ("sd" if draft else "ar"), k=k, fanout=fanout_values, backup=backup)


@contextmanager
def _open_llm(target: str, **engine_kwargs) -> Iterator[LLM]:
    llm = LLM(target=target, **engine_kwargs)
    try:
        yield llm
    finally:
        llm.close()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ssd-chat {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    target: Target = DEFAULT_TARGET,
    system: System = None,
    temperature: Temperature = 0.7,
    max_tokens: MaxTokens = 512,
    threads: Threads = None,
    draft: Draft = None,
    mode: Mode = None,
    k: K = 4,
    fanout: Fanout = None,
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    backup: Backup = "jit",
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    plain: Annotated[
        bool, typer.Option("--plain", help="Plain streaming chat instead of the TUI (automatic when piped).")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="TUI: reopen the most recent conversation.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log engine diagnostics.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Chat with a local LLM. With no command: the chat app (F1 lists keys), or with --plain a streaming REPL."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if ctx.invoked_subcommand is not None:
        given = [n for n in REPL_OPTIONS if ctx.get_parameter_source(n).name == "COMMANDLINE"]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise typer.Exit(_report(f"{flag} before a command is a REPL option; put it after the command name"))
        return
    with _user_errors():
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        lay = apply_defaults(Layout(target, draft, mode, tp, target_devices, draft_device))
        spec = _speculation(lay.draft, lay.mode, k, fanout, backup)
        engine_kwargs = dict(threads=threads, draft=lay.draft, speculation=spec, tp=tp, dtype=dtype, eager=eager,
                             target_devices=lay.target_devices, draft_device=lay.draft_device, attention=attention,
                             compile=compile)
        if plain or not (sys.stdout.isatty() and sys.stdin.isatty()):
            with _open_llm(target, **engine_kwargs) as llm:
                run_repl(llm, params, system)
            return
        from ssd_chat.history import ChatSettings
        from ssd_chat.tui import run_tui

        settings = ChatSettings(mode=spec.mode, k=spec.k, fanout=spec.fanout, temperature=temperature,
                                max_tokens=max_tokens, system=system)
        code = run_tui(lambda: LLM(target=target, **engine_kwargs), settings=settings, target=target, draft=lay.draft,
                       resume=resume)
    raise typer.Exit(code)


@app.command()
def ask(
    prompt: Annotated[str, typer.Argument(help='The prompt; "-" reads it from stdin.')],
    target: Target = DEFAULT_TARGET,
    system: System = None,
    temperature: Temperature = 0.7,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass; 1 = off.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest tokens; 0 = off.")] = 0,
    seed: Annotated[int | None, typer.Option(help="Seed for a reproducible sampled reply.")] = None,
    max_tokens: MaxTokens = 512,
    threads: Threads = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context limit (default: the model's).")] = None,
    draft: Draft = None,
    mode: Mode = None,
    k: K = 4,
    fanout: Fanout = None,
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    backup: Backup = "jit",
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
) -> None:
    """Answer one prompt (chat template applied), streaming the reply to stdout."""
    with _user_errors():
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_tokens=max_tokens)
        lay = apply_defaults(Layout(target, draft, mode, tp, target_devices, draft_device))
        spec = _speculation(lay.draft, lay.mode, k, fanout, backup)
        text = sys.stdin.read().rstrip("\n") if prompt == "-" else prompt
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": text})
        with _open_llm(target, threads=threads, max_model_len=max_model_len, draft=lay.draft, speculation=spec, tp=tp,
                       target_devices=lay.target_devices, draft_device=lay.draft_device, dtype=dtype,
                       attention=attention, eager=eager, compile=compile) as llm:
            output = _print_stream(llm.chat(messages, params), echo=not as_json)
    if as_json:
        typer.echo(json.dumps(output.to_dict()))


@app.command()
def models() -> None:
    """List the model aliases and whether their weights are on this machine."""
    table = Table(title="models")
    table.add_column("alias", no_wrap=True)
    table.add_column("repo id")
    table.add_column("params", justify="right")
    table.add_column("family")
    table.add_column("local", justify="center")
    for spec, is_local in list_models():
        table.add_row(spec.alias, spec.repo_id, spec.num_params, spec.family, "yes" if is_local else "no")
    Console().print(table)


@app.command()
def bench(
    target: Target = DEFAULT_TARGET,
    modes: Annotated[
        str, typer.Option(help="Comma-separated engine modes: ar, sd, ssd, and ar-all (AR on every core).")
    ] = "ar",
    draft: Draft = None,
    k: K = 4,
    fanout: Fanout = None,
    backup: Backup = "jit",
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    hf: Annotated[bool, typer.Option("--hf", help="Also measure transformers' generate() as a baseline.")] = False,
    prompts: Annotated[
        Path,
        typer.Option(help="Prompt file: plain lines or JSONL with prompt/messages.",
                     show_default="assets/prompts/chat.jsonl"),
    ] = DEFAULT_PROMPTS,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt (EOS ignored).")] = 128,
    threads: Threads = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results to this JSON file.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Skip the chat template.")] = False,
    limit: Annotated[int | None, typer.Option(help="Use only the first N prompts.")] = None,
) -> None:
    """Greedy fixed-length decode speed and TTFT per mode over a prompt set."""
    err_console = Console(stderr=True, highlight=False)
    with _user_errors():
        config = BenchConfig(
            target=target, prompts_file=prompts, modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
            hf=hf, max_tokens=max_tokens, threads=threads, raw=raw, limit=limit, draft=draft, k=k,
            fanout=_speculation(draft, None, k, fanout).fanout, backup=backup, tp=tp, target_devices=target_devices,
            draft_device=draft_device, dtype=dtype, attention=attention, eager=eager, compile=compile,
        )
        report = run_bench(config, progress=lambda msg: err_console.print(msg, style="dim", markup=False))
    Console().print(render_table(report))
    if json_out is not None:
        json_out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")


@app.command("make-pair")
def make_pair(
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for target/ and draft/.", show_default="the synthetic-* aliases' cache"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    draft_layers: Annotated[int, typer.Option(help="Target layers the draft keeps.")] = synthetic.DEFAULT_DRAFT_LAYERS,
    damping: Annotated[float, typer.Option(help="Scale of the deeper layers' output projections.")] = (
        synthetic.DEFAULT_DAMPING),
    head_vocab: Annotated[
        int, typer.Option(help="Tokens the target can emit (the draft's reduced head scores only these); 0: all.")
    ] = synthetic.DEFAULT_HEAD_VOCAB,
    agreement: Annotated[bool, typer.Option(help="Measure the greedy draft/target agreement.")] = True,
) -> None:
    """Build a random, correlated draft/target pair for speculative-decoding speed tests (no download)."""
    out_dir = out if out is not None else synthetic.default_pair_dir()
    with _user_errors():
        started = time.perf_counter()
        try:
            paths = synthetic.build_pair(out_dir, seed=seed, draft_layers=draft_layers, damping=damping,
                                         head_vocab=head_vocab)
        except OSError as err:
            raise typer.Exit(_report(f"cannot write the pair to {out_dir}: {err.strerror or err}")) from None
        typer.echo(f"ready in {time.perf_counter() - started:.1f} s (seed {seed}, draft layers {draft_layers}, "
                   f"damping {damping:g}, head vocabulary {head_vocab or 'all'})")
        for role, path in zip(("target", "draft"), paths, strict=True):
            typer.echo(f"{role}: {path} ({synthetic.num_params(path) / 1e6:.1f}M params)")
        if agreement:
            messages = load_prompts(DEFAULT_PROMPTS, limit=AGREEMENT_PROMPTS)
            prompts = [turns[-1]["content"] for turns in messages]
            rate = synthetic.greedy_agreement(*paths, prompts, AGREEMENT_TOKENS)
            typer.echo(f"greedy agreement: {rate:.3f} ({len(prompts)} prompts x {AGREEMENT_TOKENS} tokens)")


@app.command()
def distill(
    out: Annotated[Path, typer.Option(help="Output directory: the draft model, and its run state in DIR/distill/.")],
    target: Target = DEFAULT_TARGET,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Training prompts: plain lines or JSONL with prompt/messages.",
                     show_default="assets/prompts/distill.jsonl"),
    ] = None,
    max_prompts: Annotated[int | None, typer.Option(help="Use the file's first N prompts (default: all).")] = None,
    draft_layers: Annotated[int, typer.Option(help="Target layers the draft starts from.")] = 4,
    head_vocab: Annotated[int, typer.Option(help="Tokens the draft's head scores (most frequent in the replies); "
                                                 "0: all.")] = 8192,
    steps: Annotated[int, typer.Option(help="Training steps (0: write the untrained draft).")] = 1800,
    batch_size: Annotated[int, typer.Option(help="Replies per training step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate (warm-up, then cosine decay).")] = 1e-3,
    loss: Annotated[str, typer.Option(help="ce: cross-entropy on the reply tokens (greedy acceptance, fast); "
                                           "kl: KL to the target's distribution (runs the target per step).")] = "ce",
    seed: Annotated[int, typer.Option(help="Seed of the batch order (and of sampled replies).")] = 0,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per target reply.")] = 192,
    temperature: Annotated[float, typer.Option(help="The target's temperature for its replies; 0 = greedy.")] = 0.0,
    eval_prompts: Annotated[int, typer.Option(help="Prompts held out to measure greedy agreement.")] = 32,
    eval_every: Annotated[int, typer.Option(help="Steps between agreement measurements.")] = 100,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints (and draft writes).")] = 100,
    threads: Threads = None,
    resume: Annotated[bool, typer.Option(help="Continue the run found in --out (--no-resume: start over).")] = True,
) -> None:
    """Train a cheap draft for --target on its own replies (self-distillation, CPU); --draft DIR loads it."""
    from ssd_chat.distill import DISTILL_PROMPTS, DistillConfig, progress_bar, run_distill

    with _user_errors():
        config = DistillConfig(
            target=target, out=out, prompts_file=prompts or DISTILL_PROMPTS, max_prompts=max_prompts,
            draft_layers=draft_layers,
            head_vocab=head_vocab, steps=steps, batch_size=batch_size, lr=lr, loss=loss, seed=seed,
            max_tokens=max_tokens,
            temperature=temperature, eval_prompts=eval_prompts, eval_every=eval_every,
            checkpoint_every=checkpoint_every, threads=threads, resume=resume,
        )
        with progress_bar() as progress:
            result = run_distill(config, progress)
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


def _print_stream(events: Generator[Event, None, None], *, echo: bool = True) -> RequestOutput:
    """Write each delta to stdout as it arrives; return the final output. Leaving early (an error, a
    second Ctrl-C) closes `events`, which cancels the request and frees its KV blocks."""
    output = None
    with closing(events):
        for event in events:
            if isinstance(event, RequestFinished):
                output = event.output
            elif echo and isinstance(event, TokenDelta):
                sys.stdout.write(event.text)
                sys.stdout.flush()
    if echo:
        sys.stdout.write("\n")
    assert output is not None, "a stream ends with RequestFinished"
    return output


run_repl = run_plain  # the plain mode's read-reply loop (ssd_chat/plain.py)
