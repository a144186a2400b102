"""`ssd-chat bench`: decode speed, TTFT and speculation figures per mode over a prompt set (ssd_chat.bench runs it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from engine.config import DEFAULT_TARGET
from ssd_chat.bench_config import BenchConfig
from ssd_chat.bench_results import ENGINE_MODES
from ssd_chat.bench_table import render_table, round_lines
from ssd_chat.cli_options import (
    Attention,
    Backup,
    Compile,
    CpuMatmul,
    DraftDevice,
    DraftWeights,
    Dtype,
    Eager,
    Fanout,
    FixedK,
    FixedThreads,
    K,
    KvDtype,
    NoLookup,
    Sampler,
    Target,
    TargetDevices,
    Threads,
    Tp,
    plain,
    seed_number,
    speculation_config,
    user_errors,
    word_list,
)
from ssd_chat.defaults import NO_DRAFT
from ssd_chat.engine_failure import engine_failures
from ssd_chat.plain import PipeConsole
from ssd_chat.prompts import DEFAULT_PROMPTS, BenchInputError


def bench(
    target: Target = DEFAULT_TARGET,
    modes: Annotated[
        str, typer.Option(help="Comma-separated engine modes: ar, sd, ssd, and ar-all / sd-all (AR / SD in one"
                               " process on every core).", parser=word_list(ENGINE_MODES))
    ] = "ar",
    draft: Annotated[str | None, typer.Option(
        "--draft", "-d", help="Draft model (alias or directory) for the modes sd, ssd and sd-all; the bench loads "
        "none unless given (the embedded pair's: --draft smollm2-135m-draft).")] = None,
    k: K = 4,
    fanout: Fanout = None,
    backup: Backup = "jit",
    fixed_k: FixedK = False,
    no_lookup: NoLookup = False,
    tp: Tp = 1,
    target_devices: TargetDevices = None,
    draft_device: DraftDevice = None,
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    eager: Eager = False,
    compile: Compile = False,
    draft_weights: DraftWeights = "int8",
    cpu_matmul: CpuMatmul = "auto",
    kv_dtype: KvDtype = "auto",
    hf: Annotated[bool, typer.Option("--hf", help="Also measure transformers' generate() as a baseline.")] = False,
    prompts: Annotated[
        Path,
        typer.Option(help="Prompt file: plain lines or JSONL with prompt/messages.",
                     show_default="assets/prompts/chat.jsonl"),
    ] = DEFAULT_PROMPTS,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt (at most, with --no-ignore-eos).",
                                            parser=plain(int))] = 128,
    ignore_eos: Annotated[bool, typer.Option(help="Fixed-length replies; --no-ignore-eos: each reply stops at its "
                                                  "end of turn, as in a chat.")] = True,
    threads: Threads = None,
    fixed_threads: FixedThreads = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results to this JSON file.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Skip the chat template.")] = False,
    limit: Annotated[int | None, typer.Option(help="Use only the first N prompts.", parser=plain(int))] = None,
    temperature: Annotated[float, typer.Option(help="Sample at this temperature (0 = greedy); every engine mode "
                                                    "gives AR's tokens (with --sampler rejection: the target's "
                                                    "distribution, not AR's tokens).",
                                                    parser=plain(float, field="temperature"))] = 0.0,
    top_p: Annotated[float, typer.Option(help="Sampled replies: the nucleus's mass (1 = off).",
                                         parser=plain(float, field="top_p"))] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampled replies: prompt i is seeded with SEED + i in every mode.",
                                      parser=seed_number)] = 0,
    sampler: Sampler = "coupled",
) -> None:
    """Fixed-length decode speed and TTFT per mode over a prompt set (greedy unless --temperature)."""
    err_console = Console(stderr=True, highlight=False)
    with user_errors():
        _check_writable(json_out)  # now, not after the whole run
        draft = None if draft is not None and draft.lower() == NO_DRAFT else draft  # (as the chat reads it)
        spec = speculation_config(draft, None, k, fanout, backup, target_devices=target_devices)  # (its k: drafted)
        config = BenchConfig(
            target=target, prompts_file=prompts, modes=tuple(modes.split(",")),
            hf=hf, max_tokens=max_tokens, threads=threads, raw=raw, limit=limit, draft=draft, k=spec.k,
            fanout=spec.fanout, backup=backup, tp=tp,
            target_devices=target_devices,
            draft_device=draft_device, dtype=dtype, attention=attention, eager=eager, compile=compile,
            draft_weights=draft_weights, packed_kernel=cpu_matmul, kv_dtype=kv_dtype,
            adapt_threads=not fixed_threads, ignore_eos=ignore_eos, adaptive_k=not fixed_k, lookup=not no_lookup,
            temperature=temperature, top_p=top_p, seed=seed, sampler=sampler,
        )
        prompts = config.checked_prompts()  # a wrong setting, file or model: said before torch and transformers load
        from ssd_chat.bench import run_bench  # (here: torch, and transformers' models)

        with engine_failures(writes=False):  # (a bug, a broken model: one line, exit 1; it writes stderr alone)
            report = run_bench(config, progress=lambda msg: err_console.print(msg, style="dim", markup=False),
                               prompts=prompts)
    console = PipeConsole(width=None if sys.stdout.isatty() else 200)  # a file or pipe: the whole table, not 80 columns
    console.print(render_table(report))
    for line in round_lines(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        with user_errors():
            try:
                json_out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            except OSError as err:
                raise BenchInputError(f"cannot write {json_out}: {err.strerror or err}") from err


def _check_writable(path: Path | None) -> None:
    """A --json path the run can write at its end: an existing directory holds it, and it is no directory."""
    if path is None:
        return
    if path.is_dir():
        raise BenchInputError(f"--json {path} is a directory: give a file name")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise BenchInputError(f"--json {path}: cannot write in {path.parent}: give a writable directory")

