"""The `ssd-chat` command line: `ask`, `models`, `bench`, `make-pair` and `distill` (``cli_make``), and the chat
when no command is given: the Textual TUI in a terminal, the plain streaming mode with `--plain` or when piped.

A user error (any EngineError, a bad option value, an unusable prompt file) ends as ONE line
`error: <message>` on stderr with exit code 2, never a traceback (``cli_options``).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from engine.config import DEFAULT_TARGET
from engine.registry import list_models
from ssd_chat import stop_signals
from ssd_chat.cli_bench import bench
from ssd_chat.cli_make import distill, make_pair
from ssd_chat.cli_options import (
    STDOUT_CLOSED,
    Attention,
    Backup,
    ChatSeed,
    Compile,
    CpuMatmul,
    Draft,
    DraftDevice,
    DraftWeights,
    Dtype,
    Eager,
    Enter,
    Fanout,
    FixedK,
    FixedThreads,
    K,
    KvDtype,
    MaxModelLen,
    MaxTokens,
    Mode,
    NoLookup,
    Plain,
    PrefillChunk,
    Resume,
    Sampler,
    Seed,
    System,
    Target,
    TargetDevices,
    Temperature,
    Threads,
    TopK,
    TopP,
    Tp,
    Verbose,
    Version,
    chat_settings,
    check_before_loading,
    enter_mode,
    read_stdin,
    report,
    speculation_config,
    user_errors,
)
from ssd_chat.context_window import context_cut_notice
from ssd_chat.defaults import Layout, apply_defaults
from ssd_chat.engine_failure import loaded
from ssd_chat.plain import PipeConsole, print_stream, run_plain, tell_context_cut, tell_fewer_threads
from ssd_chat.prompts import BenchInputError
from ssd_chat.sampling_defaults import chosen
from ssd_chat.setting_words import FLAGS, check_top_k
from ssd_chat.usage_errors import OneLineCommand, OneLineUsageErrors

if TYPE_CHECKING:
    import engine.llm

REPL_OPTIONS = ("target", "system", "temperature", "top_p", "top_k", "seed", "max_tokens", "threads", "draft", "mode",
                "k", "fanout", "plain", "resume", "dtype", "attention", "eager", "compile", "draft_weights",
                "cpu_matmul", "backup", "fixed_k", "no_lookup", "tp", "target_devices", "draft_device", "prefill_chunk",
                "enter", "kv_dtype", "fixed_threads")

app = typer.Typer(
    cls=OneLineUsageErrors, add_completion=False, invoke_without_command=True, pretty_exceptions_show_locals=False,
    help="Chat with a local LLM on the ssd-chat engine. With no command: the chat app (TUI), or --plain.",
)
app.command("make-pair", cls=OneLineCommand)(make_pair)
app.command(cls=OneLineCommand)(distill)


def main() -> None:
    """Console-script entry: typer's own errors become one `error:` line too (its usage errors, in the commands'
    own words: usage_errors). SIGTERM and SIGHUP stop a command as Ctrl-C does (ssd_chat.stop_signals)."""
    stop_signals.install()
    try:
        code = app(standalone_mode=False) if sys.stdout is not None else report(STDOUT_CLOSED)
    except typer.TyperException as err:  # (click's errors that are no usage error, told in one line by the group)
        code = report(err.format_message())
    except (typer.Abort, KeyboardInterrupt):  # (a second Ctrl-C can land in click's own handling of the first)
        code = 130
    except Exception:
        if stop_signals.received() is None:
            stop_signals.exiting()  # (no signal sent again into the traceback's printing and the shutdown)
            raise
        code = 0  # an error on the way out of a run SIGTERM or SIGHUP stopped: its exit code says what happened
    stop_signals.exiting()
    sys.exit(stop_signals.exit_code(stop_signals.stdout_flushed(code if isinstance(code, int) else 0)))


def LLM(**kwargs) -> engine.llm.LLM:  # the engine's class, imported on first use
    """engine.LLM(**kwargs). torch and the models import here, not with the CLI: the chat app's process never
    needs them (its engine runs in a process of its own, started before the app's UI loads)."""
    from engine.llm import LLM as EngineLLM

    return EngineLLM(**kwargs)


@app.callback()
def root(
    ctx: typer.Context,
    target: Target = DEFAULT_TARGET,
    system: System = None,
    temperature: Temperature = None,
    top_p: TopP = None,
    top_k: TopK = None,
    seed: ChatSeed = None,
    max_tokens: MaxTokens = 512,
    threads: Threads = None,
    fixed_threads: FixedThreads = False,
    draft: Draft = None,
    mode: Mode = None,
    k: K = 4,
    fanout: Fanout = None,
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    backup: Backup = "jit",
    fixed_k: FixedK = False,
    no_lookup: NoLookup = False,
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    draft_weights: DraftWeights = "int8",
    cpu_matmul: CpuMatmul = "auto",
    kv_dtype: KvDtype = "auto",
    prefill_chunk: PrefillChunk = None,
    enter: Enter = None,
    plain: Plain = False,
    resume: Resume = False,
    verbose: Verbose = False,
    version: Version = False,
) -> None:
    """Chat with a local LLM. With no command: the chat app (F1 lists keys), or with --plain a streaming REPL."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if ctx.invoked_subcommand is not None:
        given = [n for n in REPL_OPTIONS if ctx.get_parameter_source(n).name == "COMMANDLINE"]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise typer.Exit(report(f"{flag} before a command is an option of the chat; put it after the command "
                                          "name"))
        return
    with user_errors():
        params = chosen(target, temperature, top_p, top_k, seed=seed, max_tokens=max_tokens)
        app_runs = not plain and _in_a_terminal()  # the chat app, where modes switch
        from_env = ctx.get_parameter_source("enter").name == "ENVIRONMENT"
        if app_runs or not from_env:  # (a bad SSD_CHAT_ENTER does not stop the plain mode: it means nothing there)
            enter = enter_mode(enter, "from SSD_CHAT_ENTER" if from_env else "on the command line")
        lay = apply_defaults(Layout(target, draft, mode, tp, target_devices, draft_device), ssd_ready=app_runs)
        spec = speculation_config(lay.draft, lay.mode, k, fanout, backup, fixed_k, no_lookup, resume,
                                  target_devices=lay.target_devices)
        engine_kwargs = dict(threads=threads, adapt_threads=not fixed_threads, draft=lay.draft, speculation=spec,
                             tp=tp, dtype=dtype, eager=eager, target_devices=lay.target_devices,
                             draft_device=lay.draft_device, attention=attention, compile=compile,
                             draft_weights=draft_weights, packed_kernel=cpu_matmul,
                             prefill_chunk_tokens=prefill_chunk, kv_dtype=kv_dtype)
        if not app_runs:
            if sys.stdin is None:  # started with stdin closed (`<&-`): no prompt can come
                raise BenchInputError("stdin is closed: the plain mode reads its prompts from stdin (a terminal, a "
                                      "pipe or a file)")
            check_before_loading(target, engine_kwargs)
            with stop_signals.quiet_when_the_reader_goes(), loaded(LLM, target=target, **engine_kwargs) as llm:
                check_top_k(FLAGS["top_k"], params.top_k, llm.vocab_size)  # (known once loaded)
                run_repl(llm, params, system)
            return
        check_before_loading(target, engine_kwargs)
        from ssd_chat.tui import keys_reach_the_app, run_tui

        with keys_reach_the_app():
            load_engine = _engine_loader(target, engine_kwargs)  # loading from here on, beside the app's start
            settings = chat_settings(spec, k, fanout, params, system)
            given = frozenset(n for n in ("mode", "k", "fanout", "temperature", "top_p", "top_k", "system", "seed")
                              if ctx.get_parameter_source(n).name == "COMMANDLINE")
            code = run_tui(load_engine, settings=settings, target=target, draft=lay.draft, resume=resume,
                           speculation=spec, given=given,
                           enter_sends=None if enter is None else enter == "send")
    raise typer.Exit(code)


def _engine_loader(target: str, engine_kwargs: dict):
    """The chat app's engine loader. The engine process (SSD_CHAT_ENGINE_PROCESS, on by default: no GIL shared with
    the UI) starts now, before the app imports and draws its UI, and the app's first load waits for it; a
    restart starts another. With the engine in the app's process, each load builds an LLM then."""
    from ssd_chat.tui.engine_process import EngineProcess, enabled

    if not enabled():
        return lambda: LLM(target=target, **engine_kwargs)
    first = [EngineProcess.start(target, **engine_kwargs)]

    def load():
        return first.pop().wait_ready() if first else EngineProcess(target, **engine_kwargs)

    return load


def _in_a_terminal() -> bool:
    return all(stream is not None and stream.isatty() for stream in (sys.stdout, sys.stdin))  # None: fd closed


@app.command(cls=OneLineCommand)
def ask(
    prompt: Annotated[str, typer.Argument(help='The prompt; "-" reads it from stdin.')],
    target: Target = DEFAULT_TARGET,
    system: System = None,
    temperature: Temperature = None,
    top_p: TopP = None,
    top_k: TopK = None,
    seed: Seed = None,
    sampler: Sampler = "coupled",
    max_tokens: MaxTokens = 512,
    threads: Threads = None,
    fixed_threads: FixedThreads = False,
    max_model_len: MaxModelLen = None,
    draft: Draft = None,
    mode: Mode = None,
    k: K = 4,
    fanout: Fanout = None,
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    backup: Backup = "jit",
    fixed_k: FixedK = False,
    no_lookup: NoLookup = False,
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    draft_weights: DraftWeights = "int8",
    cpu_matmul: CpuMatmul = "auto",
    kv_dtype: KvDtype = "auto",
    prefill_chunk: PrefillChunk = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
) -> None:
    """Answer one prompt (chat template applied), streaming the reply to stdout."""
    with user_errors(), stop_signals.quiet_when_the_reader_goes():
        params = chosen(target, temperature, top_p, top_k, seed=seed, max_tokens=max_tokens, sampler=sampler)
        lay = apply_defaults(Layout(target, draft, mode, tp, target_devices, draft_device))
        spec = speculation_config(lay.draft, lay.mode, k, fanout, backup, fixed_k, no_lookup,
                                  target_devices=lay.target_devices)
        text = read_stdin().rstrip("\n") if prompt == "-" else prompt
        if not text.strip():
            raise BenchInputError("the prompt is empty: give one, or - and the prompt on stdin")
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": text})
        engine_kwargs = dict(threads=threads, adapt_threads=not fixed_threads, max_model_len=max_model_len,
                             draft=lay.draft, speculation=spec, tp=tp, target_devices=lay.target_devices,
                             draft_device=lay.draft_device, dtype=dtype, attention=attention, eager=eager,
                             compile=compile, draft_weights=draft_weights, packed_kernel=cpu_matmul,
                             prefill_chunk_tokens=prefill_chunk, kv_dtype=kv_dtype)
        check_before_loading(target, engine_kwargs)  # (a wrong name or setting: said before torch loads)
        with loaded(LLM, target=target, **engine_kwargs) as llm:
            check_top_k(FLAGS["top_k"], params.top_k, llm.vocab_size)
            output = (streamed := print_stream(llm.chat(messages, params), None if as_json else sys.stdout)).output
            tell_context_cut(output, context_cut_notice(llm.max_model_len, "shorten the prompt", llm.model_max_len))
            tell_fewer_threads(streamed)
        if as_json:
            typer.echo(json.dumps(output.to_dict()))


@app.command(cls=OneLineCommand)
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
    PipeConsole(width=None if sys.stdout.isatty() else 200).print(table)  # a pipe: whole repo ids, not 80 columns


app.command(cls=OneLineCommand)(bench)
run_repl = run_plain  # the plain mode's read-reply loop (ssd_chat/plain.py)
