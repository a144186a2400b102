"""Compare: replay the last prompt in every available mode, at the chat's sampling, and line the results up.

A greedy chat replays greedily; a sampled one at its own temperature and filters, every mode with one seed (the
chat's /seed, else a fresh one), by the coupled race (engine.coupling), under which a seeded reply is AR's in every
mode. Either way SD and SSD must give AR's tokens exactly; the report says whether they did, next to the speed-ups.
Runs in the engine worker thread; the engine's previous speculation config is restored whatever happens. While it
runs it reports progress (the rows done so far, the mode running and its token count, or while a long prompt
prefills, its tokens read so far, as a reply's status line shows them), a few times a second at most, so a live demo
shows it moving.

The prefix cache is kept fair and whole: a two-token warm-up in every mode first, so each row starts from the same
cached prompt (target and draft) and none pays the conversation's prefill for the others (two: SSD's second token is
its first round, which waits for the draft process to prefill the whole prompt; after one token it was still
prefilling, and the SSD row paid the rest, 14 s of an 8k-token prompt); and afterwards the conversation as it stands
is prefilled again (one token), since every row wrote its reply where the chat's last reply was cached: the next
turn then reuses that reply's KV as if no compare had run."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.outputs import PrefillProgress, RequestFinished, RequestOutput, TokenDelta
from engine.sampling_params import SamplingParams
from ssd_chat.sampling_defaults import filters_text
from ssd_chat.setting_words import number_text
from ssd_chat.tui.engine_worker import ChatEngine, available_modes


@dataclass(frozen=True)
class CompareRow:
    mode: str
    decode_tok_s: float
    ttft_s: float
    generated_tokens: int
    tau: float | None
    cache_hit_rate: float | None
    token_ids: tuple[int, ...]
    cancelled: bool = False


@dataclass(frozen=True)
class CompareReport:
    prompt: str
    rows: tuple[CompareRow, ...]

    def speedup(self, row: CompareRow) -> float | None:
        base = self.rows[0].decode_tok_s if self.rows and self.rows[0].mode == "ar" else 0.0
        return row.decode_tok_s / base if base > 0 else None

    @property
    def identical(self) -> bool | None:
        """Whether every mode produced the same tokens (None with fewer than two complete rows)."""
        done = [r.token_ids for r in self.rows if not r.cancelled]
        return None if len(done) < 2 else all(ids == done[0] for ids in done)

    def differences(self) -> list[tuple[str, str, int]]:
        """(mode, the first complete row's mode, the index of the first token where their outputs part) for each
        complete row whose tokens are not the first's (one a prefix of the other: where the shorter ends)."""
        done = [r for r in self.rows if not r.cancelled]
        out = []
        for row in done[1:]:
            a, b = row.token_ids, done[0].token_ids
            if a != b:
                parted = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                out.append((row.mode, done[0].mode, next(parted, min(len(a), len(b)))))
        return out


@dataclass(frozen=True)
class CompareSnapshot:
    """A compare under way: the rows finished so far, the mode now running and its tokens so far."""

    report: CompareReport
    mode: str
    tokens: int
    prefill: tuple[int, int] | None = None  # (done, total) prompt tokens while the prompt prefills (PrefillProgress)


PROGRESS_INTERVAL_S = 0.2  # at most ~5 progress reports a second while a mode streams
WARM_UP, RESTORE = "warm-up", "restore"  # CompareSnapshot.mode outside the rows
WARM_UP_TOKENS = 2  # a first token (the prompt's prefill) and a step (SD's, SSD's round): every model's cache


def replay_params(sampling: SamplingParams | None, max_tokens: int) -> SamplingParams:
    """What every row samples with: greedy (`sampling` None or greedy), else the chat's sampling with one seed (the
    chat's /seed, which replays the reply on screen, else a fresh one) and the coupled sampler."""
    if sampling is None or sampling.is_greedy:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    seed = random.getrandbits(62) if sampling.seed is None else sampling.seed
    return replace(sampling, max_tokens=max_tokens, seed=seed, sampler="coupled")


def decoding(params: SamplingParams) -> str:
    """How a compare decodes, for its title: "greedy", or "sampled at 0.2, top-p 0.9, seed 7"."""
    if params.is_greedy:
        return "greedy"
    return (f"sampled at {number_text(params.temperature)}, "
            + filters_text(params.temperature, params.top_p, params.top_k, ", ", seed=params.seed))


def run_compare(
    engine: ChatEngine, messages: list[dict[str, str]], *, max_tokens: int, cancel: threading.Event,
    params: SamplingParams | None = None,
    on_progress: Callable[[CompareSnapshot], None] = lambda snapshot: None,
    clock: Callable[[], float] = time.perf_counter, interval_s: float = PROGRESS_INTERVAL_S,
    keep: list[dict[str, str]] | None = None,
) -> CompareReport:
    """`messages` end with the user prompt to replay, with `params` (`replay_params`'; None: greedy) to `max_tokens`.
    Stops early (keeping finished rows) on `cancel`.
    `on_progress` gets a snapshot as each mode starts (the rows before it; WARM_UP and RESTORE around them),
    then its token count at most once every `interval_s` seconds of `clock`. `keep`: the conversation as it
    stands (the prompt and its reply), prefilled again at the end, even after a stop, in the previous mode, where it
    fits the context (a reply the limit cut leaves no room for the next turn's header; that turn moves the window)."""
    params = replace(params, max_tokens=max_tokens) if params is not None else replay_params(None, max_tokens)
    one_token, warm_up = replace(params, max_tokens=1), replace(params, max_tokens=WARM_UP_TOKENS)
    prompt = messages[-1]["content"]
    progress = _Progress(on_progress, clock, interval_s)
    previous = engine.speculation
    modes = available_modes(engine)
    rows: list[CompareRow] = []
    try:
        progress.start(CompareReport(prompt, ()), WARM_UP)
        for mode in modes:
            if cancel.is_set():
                break
            engine.speculation = replace(previous, mode=mode)
            _run(engine, messages, warm_up, cancel, on_prefill=progress.prefill)
        for mode in modes:
            if cancel.is_set():
                break
            progress.start(CompareReport(prompt, tuple(rows)), mode)
            engine.speculation = replace(previous, mode=mode)
            rows.append(_row(mode, _run(engine, messages, params, cancel, on_tokens=progress.tokens,
                                        on_prefill=progress.prefill)))
        if keep is not None and len(engine.encode_chat(keep)) < engine.max_model_len:  # (a reply the limit cut: none)
            progress.start(CompareReport(prompt, tuple(rows)), RESTORE)
            engine.speculation = previous
            _run(engine, keep, one_token, threading.Event(), on_prefill=progress.prefill)  # (short: the prompt's
            # blocks are cached; the reply's are not, and a long one prefills a while)
    finally:
        engine.speculation = previous
    return CompareReport(prompt, tuple(rows))


class _Progress:
    """Reports each mode's start at once, then its token count when `interval_s` of `clock` has passed
    since the last report: a few reports a second, not one a token."""

    def __init__(self, send: Callable[[CompareSnapshot], None], clock: Callable[[], float],
                 interval_s: float) -> None:
        self.send, self.clock, self.interval_s = send, clock, interval_s
        self.done = CompareReport("", ())
        self.mode = ""
        self.last = 0.0

    def start(self, done: CompareReport, mode: str) -> None:
        self.done, self.mode, self.last = done, mode, self.clock()
        self.send(CompareSnapshot(done, mode, 0))

    def tokens(self, count: int) -> None:
        if self._due():
            self.send(CompareSnapshot(self.done, self.mode, count))

    def prefill(self, done: int, total: int) -> None:
        if self._due():
            self.send(CompareSnapshot(self.done, self.mode, 0, (done, total)))

    def _due(self) -> bool:
        now = self.clock()
        if now - self.last < self.interval_s:
            return False
        self.last = now
        return True


def _run(engine: ChatEngine, messages, params, cancel, *, on_tokens: Callable[[int], None] = lambda count: None,
         on_prefill: Callable[[int, int], None] = lambda done, total: None) -> RequestOutput:
    """One request to its end; `on_tokens` gets the running token count after each delta, `on_prefill` the prompt
    tokens read and their total after each prefill chunk of a long prompt."""
    output = None
    tokens = 0
    for event in engine.chat(messages, params, cancel=cancel):
        if isinstance(event, TokenDelta):
            tokens += len(event.token_ids)
            on_tokens(tokens)
        elif isinstance(event, PrefillProgress):
            on_prefill(event.done, event.total)
        elif isinstance(event, RequestFinished):
            output = event.output
    if output is None:
        raise RuntimeError("the engine stream ended without a result")
    return output


def _row(mode: str, output: RequestOutput) -> CompareRow:
    s = output.stats
    return CompareRow(
        mode=mode, decode_tok_s=s.decode_tok_s, ttft_s=s.ttft_s, generated_tokens=s.generated_tokens,
        tau=None if s.spec is None else s.spec.tau,
        cache_hit_rate=None if s.spec is None else s.spec.cache_hit_rate,
        token_ids=tuple(output.token_ids), cancelled=str(output.finish_reason) == "cancelled",
    )
