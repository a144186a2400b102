"""Compare: replay the last prompt greedily in every available mode and line the results up.

Greedy SD and SSD must give AR's tokens exactly; the report says whether they did, next to the
speed-ups. Runs in the engine worker thread; the engine's previous speculation config is restored
whatever happens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.outputs import RequestFinished, RequestOutput
from engine.sampling_params import SamplingParams
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


def run_compare(
    engine: ChatEngine, messages: list[dict[str, str]], *, max_tokens: int, cancel: threading.Event,
    on_mode: Callable[[str], None] = lambda mode: None,
) -> CompareReport:
    """`messages` end with the user prompt to replay. Stops early (keeping finished rows) on `cancel`."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    previous = engine.speculation
    rows: list[CompareRow] = []
    try:
        for mode in available_modes(engine):
            if cancel.is_set():
                break
            on_mode(mode)
            engine.speculation = replace(previous, mode=mode)
            rows.append(_row(mode, _run(engine, messages, params, cancel)))
    finally:
        engine.speculation = previous
    return CompareReport(messages[-1]["content"], tuple(rows))


def _run(engine: ChatEngine, messages, params, cancel) -> RequestOutput:
    output = None
    for event in engine.chat(messages, params, cancel=cancel):
        if isinstance(event, RequestFinished):
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
