"""A scripted stand-in for engine.LLM: the TUI tests drive the app against it, with no model."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.config import EngineConfig, SpeculationConfig
from engine.errors import InvalidParameterError, PromptTooLongError
from engine.outputs import (
    EngineWarning,
    FinishReason,
    PrefillProgress,
    RequestFinished,
    RequestOutput,
    RequestStats,
    SpecStats,
    StepStats,
    ThreadsChanged,
    TokenDelta,
    TokenSource,
)

S = TokenSource


@dataclass
class FakeConfig:
    target: str = "fake-target"
    draft: str | None = "fake-draft"
    on_cuda: bool = False

    max_draft = EngineConfig.max_draft  # (the engine's: the CPU's cap, none on CUDA)
    drafted_k = EngineConfig.drafted_k


class FakeClock:
    """Every call moves time by `step` seconds: live rates come out the same on every run."""

    def __init__(self, step: float = 0.01) -> None:
        self.now, self.step = 0.0, step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now


@dataclass
class FakeEngine:
    """Replies with `words` (one token per word). In sd/ssd each step drafts k tokens and accepts
    `accept` of them; ssd alternates cache hits and misses. Hooks make a test pause, fail or warn."""

    words: list[str] = field(default_factory=lambda: ["Hello", " from", " the", " **fake**", " engine", "."])
    draft: str | None = "fake-draft"
    accept: int = 2
    error: Exception | None = None         # raised by chat() (the request is refused)
    crash_after: int | None = None          # RuntimeError after this many deltas (the engine died)
    warning: str | None = None              # one EngineWarning after the first delta
    gate: threading.Event | None = None     # each delta after the first waits for this event
    diverge_in: str | None = None           # a mode whose last token differs (a broken speculative path)
    prefill_chunks: int = 0                 # PrefillProgress events (512 tokens each) before the first delta
    threads: tuple[int, ...] = ()           # after the first delta, a ThreadsChanged(of 2) for each count here
    ends: FinishReason | None = None        # how a reply that is not cut by max_tokens ends (default: STOP)
    layout: dict[str, str] = field(default_factory=lambda: {"target": "fake-target on cpu (TP=1, 2 threads)",
                                                            "draft": "fake-draft on cpu"})
    calls: list[tuple[list[dict[str, str]], object, str]] = field(default_factory=list)
    warmed: list[list[dict[str, str]]] = field(default_factory=list)  # each warm()'s messages
    continued: list[bool] = field(default_factory=list)  # each chat()'s continue_reply
    closed: bool = False
    max_model_len: int = 100_000  # the context, in encode_chat's tokens
    vocab_size: int = 49152  # (SmolLM2's)

    def warm(self, messages, spec=None) -> bool:
        self.warmed.append([dict(m) for m in messages])
        if spec is not None:
            self.speculation = spec
        return True

    def encode_chat(self, messages) -> list[int]:
        """A token per word, plus 3 a message for the template."""
        return [0] * sum(len(m["content"].split()) + 3 for m in messages)

    def __post_init__(self) -> None:
        self.config = FakeConfig(draft=self.draft)
        self.tokenizer = self  # token id i is the i-th word: decode() gives per-token text for the colours
        self._spec = SpeculationConfig(mode="sd" if self.draft else "ar")

    @property
    def speculation(self) -> SpeculationConfig:
        return self._spec

    @speculation.setter
    def speculation(self, spec: SpeculationConfig) -> None:
        if spec.mode != "ar" and self.draft is None:
            raise InvalidParameterError(f"mode {spec.mode!r} needs a draft model: pass --draft")
        self._spec = spec

    def chat(self, messages, params=None, *, cancel: threading.Event | None = None, continue_reply: bool = False):
        self.calls.append(([dict(m) for m in messages], params, self._spec.mode))
        self.continued.append(continue_reply)
        if self.error is not None:
            raise self.error
        if sum(len(m["content"]) for m in messages) > 10_000:
            raise PromptTooLongError("the prompt has 9999 tokens but the context limit is 512: shorten it")
        return self._events(len(self.calls), len(messages), self._spec, params, cancel)

    def _events(self, request_id, num_messages, spec, params, cancel):
        words = self.words[: params.max_tokens] if params is not None else list(self.words)
        if spec.mode == self.diverge_in:
            words = [*words[:-1], "!"]
        mode, k = spec.mode, spec.k
        drafts = self.config.drafted_k(k)  # a round drafts at most this many, as the engine's does
        emitted: list[str] = []
        steps = hits = accepted_total = drafted_total = emitted_on_hit = 0
        i = 0
        cut = params is not None and params.max_tokens < len(self.words)
        reason = FinishReason.LENGTH if cut else (self.ends or FinishReason.STOP)
        for j in range(1, self.prefill_chunks + 1):  # a long prompt, a chunk a step (gated as the deltas are)
            yield PrefillProgress(request_id, 512 * j, 512 * self.prefill_chunks + 100)
            if self.gate is not None:
                self.gate.wait(5)
            if cancel is not None and cancel.is_set():
                words, reason = [], FinishReason.CANCELLED
                break
        while i < len(words):
            if cancel is not None and cancel.is_set():
                reason = FinishReason.CANCELLED
                break
            if i and self.gate is not None:
                self.gate.wait(5)
                if cancel is not None and cancel.is_set():
                    reason = FinishReason.CANCELLED
                    break
            if self.crash_after is not None and len(emitted) >= self.crash_after:
                raise RuntimeError("the draft process was killed")
            if mode == "ar" or i == 0:
                n, sources = 1, (S.TARGET,)
            else:
                acc = min(self.accept, drafts, len(words) - i - 1)
                hit = mode == "ssd" and steps % 2 == 0
                kind = S.ACCEPTED if mode == "sd" else (S.ACCEPTED_HIT if hit else S.ACCEPTED_MISS)
                n, sources = acc + 1, (kind,) * acc + (S.RECOVERY,)
                steps += 1
                hits += hit
                emitted_on_hit += n if hit else 0
                accepted_total += acc
                drafted_total += drafts
                yield StepStats(request_id, drafts, acc, 0.004, 0.0 if hit else 0.002, hit if mode == "ssd" else None,
                                draft_idle_s=0.003 if mode == "ssd" else None)
            chunk = words[i:i + n]
            yield TokenDelta(request_id, tuple(range(i, i + n)), "".join(chunk), sources)
            emitted += chunk
            i += n
            if self.warning and i == n:
                yield EngineWarning(request_id, self.warning, draft_lost=True)
            if i == n:
                yield from (ThreadsChanged(request_id, count, 2) for count in self.threads)
        spec_stats = None
        if mode != "ar":
            spec_stats = SpecStats(
                num_steps=steps, num_drafted=drafted_total, num_accepted=accepted_total,
                num_emitted=len(emitted) - 1, accepted_per_position=tuple(steps if j < self.accept else 0
                                                                          for j in range(drafts)),
                drafted_per_position=(steps,) * drafts,  # (a position per token a round can draft, as the engine's)
                num_cache_hits=hits if mode == "ssd" else None,
                emitted_on_hit=emitted_on_hit, verify_time_s=0.004 * steps,
                draft_time_s=0.002 * (steps - hits) if mode == "ssd" else 0.002 * steps,
                draft_idle_s=0.003 * steps if mode == "ssd" else None,
            )
        stats = RequestStats(mode=mode, prompt_tokens=10 * num_messages, reused_prefix_tokens=4 * (num_messages - 1),
                             prefill_tokens=10, generated_tokens=len(emitted), ttft_s=0.05,
                             decode_time_s=0.01 * max(1, len(emitted) - 1), total_time_s=0.1, spec=spec_stats,
                             seed=None if params is None or params.is_greedy else  # (as the engine: drawn if none)
                             1000 + request_id if params.seed is None else params.seed)
        ids = [i if w == self.words[i] else -1 for i, w in enumerate(emitted)]
        yield RequestFinished(request_id, RequestOutput(request_id, [1, 2, 3], ids, "".join(emitted), reason, stats))

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)

    def close(self) -> None:
        self.closed = True


def make_app(engine: FakeEngine, tmp_path, *, settings=None, resume: bool = False, speculation=None,
             given: frozenset[str] = frozenset(), enter_sends: bool | None = None):
    """A ChatApp on `engine`, its history in `tmp_path`, its clock scripted."""
    from ssd_chat.history import ChatSettings, HistoryStore
    from ssd_chat.tui.app import ChatApp

    settings = settings or ChatSettings(mode=engine.speculation.mode, temperature=0.0, max_tokens=64)
    store = HistoryStore(tmp_path / "history.sqlite3")
    return ChatApp(lambda: engine, settings=settings, store=store, target="fake-target", draft=engine.draft,
                   resume=resume, given=given, export_dir=tmp_path, clock=FakeClock(), speculation=speculation,
                   enter_sends=enter_sends)


async def settle(app, pilot, timeout: float = 10.0) -> None:
    """Wait until the engine is loaded and no reply or compare is running, and the UI caught up."""
    import asyncio
    import contextlib

    from textual.worker import WorkerCancelled

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while app.engine is None or app.busy:
        with contextlib.suppress(WorkerCancelled):  # a removed widget's worker (the loading screen's Log's)
            await app.workers.wait_for_complete()
        await pilot.pause(0.02)
        assert loop.time() < deadline, "the app did not settle"
    await pilot.pause()


async def type_text(pilot, text: str) -> None:
    """Type `text` into the focused prompt (space and punctuation as keys)."""
    names = {" ": "space", "/": "slash", ".": "full_stop", ",": "comma", "?": "question_mark", "-": "minus"}
    await pilot.press(*[names.get(c, c) for c in text])


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


async def send(app, pilot, text: str) -> None:
    """Put `text` in the prompt, press Enter and wait for the reply (or the command) to finish."""
    from ssd_chat.tui.widgets.prompt_input import PromptArea

    area = app.query_one(PromptArea)
    area.text = text
    area.focus()
    await pilot.press("enter")
    await settle(app, pilot)


async def first_delta(app, pilot, text: str = "Hi") -> None:
    """Send `text` and wait for the reply's first delta (a FakeEngine with a gate then holds the rest)."""
    from ssd_chat.tui.widgets.prompt_input import PromptArea

    app.query_one(PromptArea).text = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.reply_view is not None and app.reply_view.text == "Hello", what="1st delta")


def rendered(widget) -> str:
    """A widget's content as plain text (tables included)."""
    from rich.console import Console

    content = getattr(widget, "content", None) or widget.render()
    if isinstance(content, str):
        return content
    if hasattr(content, "plain"):
        return content.plain
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(content)
    return console.export_text()


def errors(app) -> list[str]:
    """The messages of the app's error notifications, oldest first."""
    return [n.message for n in app._notifications if n.severity == "error"]


def dies_mid_reply(engine: FakeEngine, after: int = 2) -> FakeEngine:
    """The engine's process is killed (kill -9, out of memory) once a reply has `after` tokens (0: before its first
    delta, while it reads the prompt): it is no longer alive."""
    engine.crash_after, engine.alive = after, True
    events = engine._events

    def dying(*args, **kwargs):
        try:
            yield from events(*args, **kwargs)
        except RuntimeError:
            engine.alive = False
            raise

    engine._events = dying
    return engine
