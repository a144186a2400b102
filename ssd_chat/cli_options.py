"""The command line's shared pieces: option types (typer ``Annotated`` aliases) and the one-line user error.

A user error (any EngineError, a bad option value, an unusable prompt file) ends as ONE line
`error: <message>` on stderr with exit code 2, never a traceback; a failure inside the engine as one line too,
with exit code 1 (engine_failure).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from engine import EngineError
from engine.config import BACKUPS, MAX_FANOUT, PREFILL_CHUNK, SpeculationConfig
from engine.errors import InvalidParameterError
from ssd_chat import __version__, setting_words, typed_numbers
from ssd_chat.engine_failure import EXIT_ENGINE_FAILED, EngineFailed
from ssd_chat.prompts import BenchInputError
from ssd_chat.tui.commands import ENTER_MODES

EXIT_USER_ERROR = 2
# Started with stdout closed (`>&-`: Python's sys.stdout is None), the replies, tables and results had nowhere to
# go: input() and rich failed with a traceback, click's echo dropped them.
STDOUT_CLOSED = "stdout is closed: give ssd-chat a terminal, a pipe or a file (>/dev/null drops what it writes)"


def report(message: str) -> int:
    """Print ``error: <message>`` on one line on stderr; return the user-error exit code."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    return EXIT_USER_ERROR


def print_version(value: bool) -> None:
    """--version's callback."""
    if value:
        typer.echo(f"ssd-chat {__version__}")
        raise typer.Exit()


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn an EngineError or BenchInputError into the one-line error and exit code 2, and a failure inside the
    engine (EngineFailed: engine_failure.py) into its one line and exit code 1."""
    try:
        yield
    except (EngineError, BenchInputError) as err:
        raise typer.Exit(report(str(err))) from None
    except EngineFailed as failure:
        report(str(failure))
        raise typer.Exit(EXIT_ENGINE_FAILED) from None


def plain(kind: type[int] | type[float], minimum: int | None = None) -> Callable[[object], object]:
    """A number option's parser: a plain number only (typed_numbers; typer's own read --temperature 1_0 as ten), at
    least `minimum` where given (typer's min= does not apply to an option with a parser)."""

    def parse(value: object) -> object:
        if not isinstance(value, str):  # (a default)
            return value
        try:
            number = typed_numbers.parse(value, kind)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        if minimum is not None and number < minimum:
            raise typer.BadParameter(f"takes at least {minimum}; got {value}")
        return number

    parse.__name__ = kind.__name__  # (the metavar in --help: FLOAT, INT)
    return parse


def speculation_config(
    draft: str | None, mode: str | None, k: int, fanout: str | None, backup: str = "jit", fixed_k: bool = False,
    no_lookup: bool = False,
) -> SpeculationConfig:
    """The decoding mode the options ask for (EngineError on bad values, naming the option: setting_words)."""
    try:
        fanout_values = None if fanout is None else tuple(int(typed_numbers.parse(f.strip(), int))
                                                          for f in fanout.split(","))
    except ValueError:
        raise InvalidParameterError(f"--fanout takes whole numbers (ASCII digits) separated by commas, got {fanout!r}"
                                    ) from None
    mode = mode or ("sd" if draft else "ar")
    setting_words.check(setting_words.FLAGS, mode, k, fanout_values)
    if backup not in BACKUPS:
        raise InvalidParameterError(f"--backup takes {' or '.join(BACKUPS)}; got {backup!r}")
    return SpeculationConfig(mode=mode, k=k, fanout=fanout_values, backup=backup,
                             adaptive_k=not fixed_k, lookup=not no_lookup)


Target = Annotated[
    str, typer.Option("--target", "-t", help="Model alias (see `ssd-chat models`) or a local model directory.")
]
System = Annotated[str | None, typer.Option(help="System prompt.")]
Temperature = Annotated[float | None, typer.Option(
    help="Sampling temperature; 0 = greedy. Default: the model's recommended one (smollm2-135m: 0.2, its model "
         "card's; a directory's generation_config.json), else 0.7.", show_default=False, parser=plain(float))]
TopP = Annotated[float | None, typer.Option(
    help="Nucleus sampling mass; 1 = off. Default: the model's recommended one (smollm2-135m: 0.9), else 1.",
    show_default=False, parser=plain(float))]
TopK = Annotated[int | None, typer.Option(
    help="Sample among the k likeliest tokens; 0 = off. Default: the model's recommended one, else 0.",
    show_default=False, parser=plain(int))]
MaxTokens = Annotated[int, typer.Option(help="Most tokens to generate per reply.", parser=plain(int))]
Threads = Annotated[int | None, typer.Option(help="CPU threads for torch (default: torch's choice).",
                                             parser=plain(int))]
Seed = Annotated[int | None, typer.Option(help="Seed for a reproducible sampled reply (in AR, or with --fixed-k: the "
                                         "adaptive k follows measured speeds).", parser=plain(int))]
MaxModelLen = Annotated[int | None, typer.Option(help="Context limit (default: the model's).", parser=plain(int))]
Draft = Annotated[
    str | None,
    typer.Option("--draft", "-d", help="Draft model (alias or directory): enables --mode sd / ssd. The chat and "
                 "ask load the shipped smollm2-135m-draft with the default target unless --mode ar; none: no draft."),
]
Mode = Annotated[
    str | None,
    typer.Option(help="ar | sd | ssd (default: sd with a draft, else ar). ssd overlaps drafting with --draft-device."),
]
K = Annotated[int, typer.Option("--k", help="Most draft tokens per verify step (fewer when faster, unless --fixed-k; "
                                 "at most 31 on the CPU).", parser=plain(int))]
Tp = Annotated[int, typer.Option("--tp", help="Target tensor-parallel ranks, one process each.", parser=plain(int))]
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
FixedK = Annotated[
    bool, typer.Option("--fixed-k", help="Always draft k tokens (default: the k <= --k with the most expected tokens "
                       "per second for the measured acceptance and round costs).")
]
NoLookup = Annotated[
    bool, typer.Option("--no-lookup", help="Drafts come from the draft model alone (default: the context "
                       "lookup's token wherever the context has one; see engine/lookup.py).")
]
Fanout = Annotated[
    str | None, typer.Option(help=f"SSD candidates per accepted count: one number, or k+1 comma-separated, each "
                             f"0-{MAX_FANOUT} (default: geometric for the measured acceptance).")
]

Dtype = Annotated[str, typer.Option(help="auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, float16.")]
Attention = Annotated[
    str, typer.Option(help="Attention kernels: auto (flashinfer on CUDA when installed), sdpa, flashinfer (CUDA).")
]
PrefillChunk = Annotated[int | None, typer.Option(
    help=f"Prompt tokens per prefill step (default: {PREFILL_CHUNK['cpu']} on the CPU, {PREFILL_CHUNK['cuda']} on "
    "CUDA): a cancel lands between two steps.", parser=plain(int, minimum=1))]
DraftWeights = Annotated[str, typer.Option(
    help="CPU: the draft's matmul weights: int8, float16 or float32 (the target's stay in --dtype; the draft "
    "only proposes, so this never changes the output).")]
CpuMatmul = Annotated[str, typer.Option(
    help="CPU: the target's matmul kernel: auto (panel4 on any AVX-512, AVX2 or ARM CPU where it builds; else mkl on "
    "Intel, "
    "onednn elsewhere), panel (ours: every row the same bits at any row count), panel4 (panel, reading 4-bit "
    "copies of the weights that are 4-bit values and 8-bit copies of 8-bit ones: the same bits, fewer bytes), "
    "q8 (panel4 with the activations of its 4- and 8-bit weights rounded to 8 bits, llama.cpp's arithmetic, on "
    "x86 with AVX2 (AVX-512 VNNI where it has it): "
    "faster, not the float32 model's bits; SD/SSD still equal AR under it), mkl, onednn.")]
def enter_mode(value: str | None, source: str) -> str | None:
    """--enter's value, checked only where the chat app runs (a bad SSD_CHAT_ENTER must not stop `ask`)."""
    if value is not None and value.lower() not in ENTER_MODES:
        raise InvalidParameterError(f"--enter ({source}) takes {' or '.join(ENTER_MODES)}, got {value!r}")
    return None if value is None else value.lower()


Enter = Annotated[str | None, typer.Option(
    "--enter", envvar="SSD_CHAT_ENTER", show_envvar=True,
    help="TUI: what Enter does in the prompt for this run: send (Shift+Enter or Ctrl+J: a new line) or newline. "
    "Ctrl+S always sends. Default: what /enter last chose (send at first).")]
Eager = Annotated[bool, typer.Option("--eager", help="CUDA: no CUDA graphs for the decode step.")]
Compile = Annotated[bool, typer.Option(
    "--compile", help="CPU: compile the one-sequence steps (first start: minutes; later starts ~25 s). "
    "CUDA: torch.compile the model forward.")]
