"""The bridge between the engine's blocking event stream and the UI thread.

A worker thread runs `stream_reply`, which feeds every event into a `ReplyBuffer` (under a lock);
the UI drains the buffer on a timer (every 0.1-0.5 s: flush_pacer.py), so a reply at hundreds of tokens per second
costs a few Markdown appends per second, not one per token. The UI thread never calls the engine
while a worker runs, and the worker never touches a widget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.config import SpeculationConfig
from engine.outputs import (
    EngineWarning,
    Event,
    PrefillProgress,
    RequestFinished,
    RequestOutput,
    StepStats,
    ThreadsChanged,
    TokenDelta,
    TokenSource,
)
from engine.sampling_params import SamplingParams
from ssd_chat.tui.live_stats import LiveStats, PanelData

log = logging.getLogger(__name__)

Piece = tuple[str, TokenSource]  # a span of reply text and where its tokens came from


class ChatEngine(Protocol):
    """What the TUI needs from `engine.LLM` (the tests drive a scripted fake with the same shape)."""

    config: Any  # .target, .draft (None without a draft model), .on_cuda, .max_draft, .drafted_k
    speculation: SpeculationConfig
    layout: dict[str, str]
    max_model_len: int  # the context; with encode_chat, which turns fit (ssd_chat.context_window)
    vocab_size: int  # the target's vocabulary (a top-k at or past it filters nothing: setting_words)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]: ...

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
             cancel: threading.Event | None = None, continue_reply: bool = False) -> Iterator[Event]: ...

    def close(self) -> None: ...


def available_modes(engine: ChatEngine) -> tuple[str, ...]:
    return ("ar",) if engine.config.draft is None else ("ar", "sd", "ssd")


def token_texts(engine: ChatEngine) -> Callable[[tuple[int, ...]], list[str]] | None:
    """Per-token text for provenance colours, from the engine's tokenizer when it has one."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return None
    return lambda ids: [tokenizer.decode([i]) for i in ids]


def split_pieces(delta: TokenDelta, texts: Callable[[tuple[int, ...]], list[str]] | None) -> list[Piece]:
    """The delta's text cut per token when the single-token texts add up to it (they do not while a
    multi-byte character or a stop string is pending); else one piece with the delta's most telling source."""
    if not delta.text:
        return []
    if delta.sources and texts is not None and len(delta.sources) == len(delta.token_ids):
        parts = texts(delta.token_ids)
        if "".join(parts) == delta.text:
            return [(p, s) for p, s in zip(parts, delta.sources, strict=True) if p]
    drafted = [s for s in delta.sources if s not in (TokenSource.TARGET, TokenSource.RECOVERY, TokenSource.BONUS)]
    source = drafted[0] if drafted else (delta.sources[-1] if delta.sources else TokenSource.TARGET)
    return [(delta.text, source)]


@dataclass
class Drained:
    """What arrived since the last drain."""

    text: str
    pieces: list[Piece]
    warnings: list[str]
    panel: PanelData
    prefill: tuple[int, int] | None = None  # (done, total) prompt tokens while a long prompt prefills
    draft_lost: bool = False  # the reply's draft process is gone: it (and the mode's later replies) run in AR


@dataclass
class ReplyBuffer:
    """Events of one reply, written by the worker thread and drained by the UI thread."""

    stats: LiveStats
    clock: Callable[[], float]
    cancel: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _text: list[str] = field(default_factory=list)
    _pieces: list[Piece] = field(default_factory=list)
    _warnings: list[str] = field(default_factory=list)
    _prefill: tuple[int, int] | None = None
    _draft_lost: bool = False

    def push(self, event: Event, pieces: list[Piece] | None = None) -> None:
        now = self.clock()
        with self._lock:
            if isinstance(event, TokenDelta):
                self._prefill = None
                self._text.append(event.text)
                self._pieces.extend(pieces or [])
                self.stats.on_tokens(len(event.token_ids), now)
            elif isinstance(event, StepStats):
                self.stats.on_step(event)
            elif isinstance(event, EngineWarning):
                self._draft_lost |= event.draft_lost
                self._warnings.append(event.message + (" (/restart starts a new draft process)" if event.draft_lost
                                                       else ""))
            elif isinstance(event, PrefillProgress):
                self._prefill = (event.done, event.total)
            elif isinstance(event, ThreadsChanged):
                self.stats.on_threads(event)

    def drain(self) -> Drained:
        with self._lock:
            out = Drained("".join(self._text), self._pieces, self._warnings, self.stats.snapshot(), self._prefill,
                          self._draft_lost)
            self._text, self._pieces, self._warnings, self._draft_lost = [], [], [], False
        return out


def stream_reply(engine: ChatEngine, messages: list[dict[str, str]], params: SamplingParams,
                 buffer: ReplyBuffer, *, continue_reply: bool = False) -> RequestOutput:
    """Run one chat request to its end, feeding `buffer` (`continue_reply`: going on with the last message, a
    reply). Raises EngineError for a request the engine refuses (the prompt is too long, ...), anything else when
    the engine itself fails."""
    texts = token_texts(engine)
    output = None
    for event in engine.chat(messages, params, cancel=buffer.cancel, continue_reply=continue_reply):
        if isinstance(event, RequestFinished):
            output = event.output
        else:
            buffer.push(event, split_pieces(event, texts) if isinstance(event, TokenDelta) else None)
    if output is None:
        raise RuntimeError("the engine stream ended without a result")
    return output
