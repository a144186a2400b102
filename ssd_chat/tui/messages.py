"""Messages the engine worker threads post to the app (post_message is thread-safe)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from engine.outputs import RequestOutput
from ssd_chat.tui.compare import CompareReport, CompareSnapshot
from ssd_chat.tui.engine_worker import ChatEngine


@dataclass
class EngineReady(Message):
    engine: ChatEngine


@dataclass
class EngineLoadFailed(Message):
    error: str


@dataclass
class ReplyDone(Message):
    output: RequestOutput


@dataclass
class ReplyFailed(Message):
    error: str
    engine_failed: bool = False  # the engine itself failed (its process died, a bug), not the request


@dataclass
class CompareProgress(Message):
    """The rows finished so far, the mode running and its token count (a few a second at most)."""

    snapshot: CompareSnapshot


@dataclass
class CompareDone(Message):
    report: CompareReport  # (on a failure: the rows that finished before it)
    error: str | None = None
