"""The command line's shared pieces: option types (typer ``Annotated`` aliases) and the one-line user error.

A user error (any EngineError, a bad option value, an unusable prompt file) ends as ONE line
`error: <message>` on stderr with exit code 2, never a traceback; a failure inside the engine as one line too,
with exit code 1 (engine_failure).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from engine import EngineError
from engine.config import (
    ATTENTION_BACKENDS,
    BACKUPS,
    DRAFT_WEIGHTS,
    DTYPES,
    KV_DTYPES,
    MAX_FANOUT,
    MAX_THREADS,
    PACKED_KERNELS,
    PREFILL_CHUNK,
    EngineConfig,
    SpeculationConfig,
    check_has_draft,
)
from engine.errors import InvalidParameterError
from engine.model_dir import inspect_model_dir
from engine.placement import plan
from engine.registry import locate_model
from engine.sampling_params import MAX_SEED, SAMPLERS
from ssd_chat import __version__, setting_words, typed_numbers
from ssd_chat.engine_failure import EXIT_ENGINE_FAILED, EngineFailed
from ssd_chat.prompts import BenchInputError
from ssd_chat.tui.commands import ENTER_MODES

if TYPE_CHECKING:
    from engine.sampling_params import SamplingParams
    from ssd_chat.history import ChatSettings

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


def plain(kind: type[int] | type[float], minimum: int | None = None, *, field: str = "", takes: str = "",
          maximum: int | None = None) -> Callable[[object], object]:
    """A number option's parser: a plain number only (typed_numbers; typer's own read --temperature 1_0 as ten), at
    least `minimum` and at most `maximum` where given (typer's min= does not apply to an option with a parser), said
    as `takes` ("a seed from 0 to 2^63-1"); `field`: the setting (setting_words.TAKES) a number past a float's range
    says it takes. Its refusal is what follows the option's name in the error line (usage_errors: `--k takes ...`)."""

    def parse(value: object) -> object:
        if not isinstance(value, str):  # (a default)
            return value
        try:
            number = typed_numbers.parse(value, kind)
        except typed_numbers.UnheldNumber as err:
            raise typer.BadParameter(setting_words.unheld_text(err, field)) from None
        except ValueError:
            raise typer.BadParameter(f"takes {typed_numbers.WHAT[kind]}; got {value!r}") from None
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            raise typer.BadParameter(f"takes {takes or f'at least {minimum}'}; got {value.strip()}")
        return number

    parse.__name__ = kind.__name__  # (the metavar in --help: FLOAT, INT)
    return parse


seed_number = plain(int, 0, maximum=MAX_SEED, takes="a whole number from 0 to 2^63-1")  # (SamplingParams')


def one_of(choices: tuple[str, ...]) -> Callable[[object], object]:
    """A word option's parser: one of `choices` (any case; the engine's own words named its Python field)."""

    def parse(value: object) -> object:
        if isinstance(value, str) and value.strip().lower() not in choices:
            raise typer.BadParameter(f"takes {setting_words.listed(choices)}; got {value!r}")
        return value.strip().lower() if isinstance(value, str) else value

    parse.__name__ = "text"
    return parse


def word_list(choices: tuple[str, ...]) -> Callable[[object], object]:
    """A comma-separated word list's parser (bench --modes): each word one of `choices` (any case, as one_of), a
    word named twice kept once; the words as `a,b`, in lower case."""

    def parse(value: object) -> object:
        if not isinstance(value, str):  # (a default)
            return value
        words = [word.strip().lower() for word in value.split(",") if word.strip()]
        if not words or any(word not in choices for word in words):
            raise typer.BadParameter(f"takes {setting_words.listed(choices)}, separated by commas; got {value!r}")
        return ",".join(dict.fromkeys(words))

    parse.__name__ = "text"
    return parse


def mode_word(value: object) -> object:
    """--mode's parser: /mode's, setting_words.mode_named (a mode in any case, SD, as MODES has it; any other word
    refused as it names the option: usage_errors tells its EngineError as it is)."""
    if not isinstance(value, str):  # (a default)
        return value
    try:
        return setting_words.mode_named(setting_words.FLAGS, value)
    except InvalidParameterError as err:
        raise typer.BadParameter(str(err)) from err


def speculation_config(
    draft: str | None, mode: str | None, k: int, fanout: str | None, backup: str = "jit", fixed_k: bool = False,
    no_lookup: bool = False, resume: bool = False, *, target_devices: str | None = None,
) -> SpeculationConfig:
    """The decoding mode the options ask for (EngineError on bad values, naming the option: setting_words), with
    `k` as a round drafts it on the target's devices (`target_devices`, the layout's): EngineConfig.drafted_k, the
    chat app's rule (--k 32 on the CPU drafts at most 31), so that a fan-out has one count per accepted count 0..31
    there, as /fanout after /k 32 takes it, and the engine is given that k (settings_fit.speculation, the app's).
    `resume`: the chat's k is the resumed chat's (or --k, given over it), which a fan-out's number of counts is
    checked against once the chat is open (settings_fit.fit: a notice, the default fan-out); here only each count is,
    and a fan-out that does not fit `k` is not the run's own (the chat's alone)."""
    counts = setting_words.fanout_counts(setting_words.FLAGS, fanout)
    mode = mode or ("sd" if draft else "ar")
    drafted = EngineConfig(target_devices=target_devices).drafted_k(k)  # (the device decides: the engine's rule)
    if resume and counts and len(counts) not in (1, drafted + 1):
        for count in counts:
            setting_words.check(setting_words.FLAGS, mode, k, (count,))
        counts = None
    setting_words.check(setting_words.FLAGS, mode, k, counts, drafted)
    return SpeculationConfig(mode=mode, k=drafted, fanout=counts, backup=backup, adaptive_k=not fixed_k,
                             lookup=not no_lookup)


def chat_settings(spec: SpeculationConfig, k: int, fanout: str | None, params: SamplingParams, system: str | None
                  ) -> ChatSettings:
    """The chat app's first settings: the options' (`k` as given: the app shows it as the engine drafts it; a fan-out
    as typed: under --resume it may fit the resumed chat's k, not --k's, so it is not always the run's own)."""
    from ssd_chat.history import ChatSettings  # (here: the plain mode and `ask` never need it)

    return ChatSettings(mode=spec.mode, k=k, fanout=setting_words.fanout_counts(setting_words.FLAGS, fanout),
                        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                        max_tokens=params.max_tokens, system=system, seed=params.seed)


Target = Annotated[
    str, typer.Option("--target", "-t", help="Model alias (see `ssd-chat models`) or a local model directory.")
]
System = Annotated[str | None, typer.Option(help="System prompt.")]
Temperature = Annotated[float | None, typer.Option(
    help="Sampling temperature; 0 = greedy. Default: the model's recommended one (smollm2-135m: 0.2, its model "
         "card's; a directory's generation_config.json), else 0.7.", show_default=False,
    parser=plain(float, field="temperature"))]
TopP = Annotated[float | None, typer.Option(
    help="Nucleus sampling mass; 1 = off. Default: the model's recommended one (smollm2-135m: 0.9), else 1.",
    show_default=False, parser=plain(float, field="top_p"))]
TopK = Annotated[int | None, typer.Option(
    help="Sample among the k likeliest tokens; 0 = off. Default: the model's recommended one, else 0.",
    show_default=False, parser=plain(int))]
MaxTokens = Annotated[int, typer.Option(help="Most tokens to generate per reply.", parser=plain(int))]
Threads = Annotated[int | None, typer.Option(help="CPU threads for torch (default: torch's choice).",
                                             parser=plain(int, 1, maximum=MAX_THREADS,
                                                          takes=f"a number of CPU threads, 1 to {MAX_THREADS}"))]
Seed = Annotated[int | None, typer.Option(help="Seed for a reproducible sampled reply: the same one in AR, SD and SSD "
                                         "(with --sampler rejection: in AR, or with --fixed-k, as the adaptive k "
                                         "follows measured speeds).", parser=seed_number)]
ChatSeed = Annotated[int | None, typer.Option(
    "--seed", help="Sample every reply from this seed, as /seed does: the same reply in AR, SD and SSD (saved with "
    "the chat; with --resume it replaces the chat's). Default: a new seed each reply.", parser=seed_number)]
MaxModelLen = Annotated[int | None, typer.Option(help="Context limit (default: the model's).", parser=plain(
    int, 2, takes="a context limit of at least 2 tokens"))]
Draft = Annotated[
    str | None,
    typer.Option("--draft", "-d", help="Draft model (alias or directory): enables --mode sd / ssd. The chat and "
                 "ask load the shipped smollm2-135m-draft with the default target unless --mode ar; none: no draft."),
]
Mode = Annotated[
    str | None,
    typer.Option(help="ar | sd | ssd (default: sd with a draft, else ar). ssd overlaps drafting with --draft-device.",
                 parser=mode_word),
]
K = Annotated[int, typer.Option("--k", help="Most draft tokens per verify step (fewer when faster, unless --fixed-k; "
                                 "at most 31 on the CPU).", parser=plain(int))]
Tp = Annotated[int, typer.Option("--tp", help="Target tensor-parallel ranks, one process each.",
                                  parser=plain(int, 1, takes="a number of target ranks, at least 1"))]
TargetDevices = Annotated[
    str | None, typer.Option(help="Target devices: CPU cores (cpu:0-1, split over the TP ranks) or GPUs (cuda:0-3).")
]
DraftDevice = Annotated[
    str | None,
    typer.Option(help="SSD's draft in its own process on this device (cpu:1, cuda:4); default: in-process."),
]
Backup = Annotated[
    str, typer.Option(help="SSD on a speculation-cache miss: jit (re-draft) or fast (guess from the context).",
                      parser=one_of(BACKUPS))
]
FixedK = Annotated[
    bool, typer.Option("--fixed-k", help="Always draft k tokens (default: the k <= --k with the most expected tokens "
                       "per second for the measured acceptance and round costs).")
]
Plain = Annotated[bool, typer.Option("--plain", help="Plain streaming chat instead of the TUI (automatic when piped).")]
Resume = Annotated[bool, typer.Option("--resume", help="TUI: reopen the most recent conversation.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log engine diagnostics.")]
Version = Annotated[bool, typer.Option("--version", callback=print_version, is_eager=True, help="Print the version.")]
FixedThreads = Annotated[
    bool, typer.Option("--fixed-threads", help="Keep every CPU thread while other programs use the cores (default, "
                       "on Linux: step with fewer while they take some, as one thread then beats two).")
]
NoLookup = Annotated[
    bool, typer.Option("--no-lookup", help="Drafts come from the draft model alone (default: the context "
                       "lookup's token wherever the context has one; see engine/lookup.py).")
]
Fanout = Annotated[
    str | None, typer.Option(help=f"SSD candidates per accepted count: one number, or k+1 comma-separated, each "
                             f"0-{MAX_FANOUT}; none: the default (geometric for the measured acceptance).")
]

Dtype = Annotated[str, typer.Option(help="auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, float16.",
                                    parser=one_of(DTYPES))]
Attention = Annotated[
    str, typer.Option(help="Attention kernels: auto (flashinfer on CUDA when installed), sdpa, flashinfer (CUDA).",
                      parser=one_of(ATTENTION_BACKENDS))
]
Sampler = Annotated[str, typer.Option(
    help="How a sampled reply draws its tokens, both exactly the target's distribution in every mode: coupled (each "
    "token the winner of a race keyed by the seed and its position: a seeded reply is the same in AR, SD and SSD, "
    "and drafts are kept where they equal the target's token, as greedy's are) or rejection (draws from a seeded "
    "generator, and speculative sampling's rejection rule).", parser=one_of(SAMPLERS))]
KvDtype = Annotated[str, typer.Option(
    help="CPU: the KV cache's dtype: auto (the model's: float32) or float16 (half the memory and the bytes a step "
    "reads: faster decoding in long chats; the keys and values rounded to half, so other tokens than float32's "
    "can come, and SD and SSD still equal AR).", parser=one_of(KV_DTYPES))]
PrefillChunk = Annotated[int | None, typer.Option(
    help=f"Prompt tokens per prefill step (default: {PREFILL_CHUNK['cpu']} on the CPU, {PREFILL_CHUNK['cuda']} on "
    "CUDA): a cancel lands between two steps.", parser=plain(int, minimum=1))]
DraftWeights = Annotated[str, typer.Option(
    help="CPU: the draft's matmul weights: int8, float16 or float32 (the target's stay in --dtype; the draft "
    "only proposes, so this never changes the output).", parser=one_of(DRAFT_WEIGHTS))]
CpuMatmul = Annotated[str, typer.Option(
    help="CPU: the target's matmul kernel: auto (panel4 on any AVX-512, AVX2 or ARM CPU where it builds; else mkl on "
    "Intel, "
    "onednn elsewhere), panel (ours: every row the same bits at any row count), panel4 (panel, reading 4-bit "
    "copies of the weights that are 4-bit values and 8-bit copies of 8-bit ones: the same bits, fewer bytes), "
    "q8 (panel4 with the activations of its 4- and 8-bit weights rounded to 8 bits, llama.cpp's arithmetic, on "
    "x86 with AVX2 (AVX-512 VNNI where it has it): "
    "faster, not the float32 model's bits; SD/SSD still equal AR under it), mkl, onednn.",
    parser=one_of(PACKED_KERNELS))]
def read_stdin() -> str:
    """`ask -`'s prompt: all of stdin."""
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise BenchInputError("stdin is closed: give the prompt as an argument, or - and the prompt on stdin")
    return sys.stdin.read()


def check_before_loading(target: str, engine_kwargs: dict) -> None:
    """Refuse, before torch loads and before the chat app takes the screen, what the engine would refuse as it
    starts (the app showed its screen, then left it for the error line; `ask` and `bench` took 3-4 s to say a name
    was wrong): a setting EngineConfig refuses, a placement the cores or GPUs do not hold (--tp 3 on two cores), a
    speculative mode with no draft (--mode ssd --draft none), a target or draft that is no model here (an unknown
    name, a missing directory, weights not downloaded, no config or tokenizer). No torch; of a model, its config and
    the headers of its weight files."""
    spec = engine_kwargs.get("speculation")
    config = EngineConfig(target=target, **{name: v for name, v in engine_kwargs.items() if name != "speculation"})
    plan(config.tp, config.target_devices, config.draft_device, config.threads, default_device=config.device)
    if spec is not None:
        check_has_draft(spec.mode, config.draft is not None)  # (LLM.speculation's check)
    for name in (config.target, config.draft):
        found = None if name is None else locate_model(name)
        if found is not None:  # (None: one the engine builds or downloads as it starts)
            inspect_model_dir(found)


def enter_mode(value: str | None, source: str) -> str | None:
    """--enter's value, checked only where the chat app runs (a bad SSD_CHAT_ENTER must not stop `ask`)."""
    if value is not None and value.lower() not in ENTER_MODES:
        raise InvalidParameterError(f"--enter ({source}) takes {setting_words.listed(ENTER_MODES)}; got {value!r}")
    return None if value is None else value.lower()


Enter = Annotated[str | None, typer.Option(
    "--enter", envvar="SSD_CHAT_ENTER", show_envvar=True,
    help="TUI: what Enter does in the prompt for this run: send (Shift+Enter or Ctrl+J: a new line) or newline. "
    "Ctrl+S always sends. Default: what /enter last chose (send at first).")]
Eager = Annotated[bool, typer.Option("--eager", help="CUDA: no CUDA graphs for the decode step.")]
Compile = Annotated[bool, typer.Option(
    "--compile", help="CPU: compile the one-sequence steps (first start: minutes; later starts ~25 s). "
    "CUDA: torch.compile the model forward.")]
