"""What a streamed reply's updates cost the chat app's UI thread, the whole app: transcript, panel and status line.

    python scripts/ui_flush_cost.py                 # SD, a Markdown reply, 120 words a second
    python scripts/ui_flush_cost.py --rate 400 --mode ssd

The app runs headless (Textual's test driver, 130x45) on the TUI tests' scripted engine (tests/ssd_chat/tui_fakes.py),
which here writes a long Markdown reply (scripts/ui_update_cost.py's) a word every 1/RATE s, so no model runs. The
flush pacer (ssd_chat/tui/flush_pacer.py) times each update: the UI thread's CPU from one update to the next, which
sets the gap to the next (ten times it, 0.1 to 0.5 s). This prints their median and 90th percentile, the updates'
count and the gaps; scripts/ui_update_cost.py times the transcript alone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from ui_update_cost import reply_list, reply_markdown  # noqa: E402

from engine.outputs import TokenDelta  # noqa: E402
from ssd_chat.history import ChatSettings  # noqa: E402
from ssd_chat.tui.flush_pacer import FlushPacer  # noqa: E402
from tests.ssd_chat.tui_fakes import FakeEngine, make_app, settle, wait_for  # noqa: E402

log = logging.getLogger("ui_flush_cost")


class PacedEngine(FakeEngine):
    """The scripted engine, a word every `delay` seconds (on its worker thread, as a model's steps)."""

    delay: float = 0.01

    def _events(self, *args, **kwargs):
        for event in super()._events(*args, **kwargs):
            if isinstance(event, TokenDelta):
                time.sleep(self.delay * len(event.token_ids))
            yield event


async def measure(reply: str, mode: str, rate: float) -> tuple[list[float], list[float]]:
    """(the UI thread's CPU between updates, the gaps between them), in seconds, over one streamed reply."""
    costs: list[float] = []
    gaps: list[float] = []
    flushed = FlushPacer.flushed

    def timed(pacer: FlushPacer, now: float) -> None:
        if pacer._last is not None:
            costs.append(pacer.cpu() - pacer._cpu_at_last)
            gaps.append(now - pacer._last)
        flushed(pacer, now)

    FlushPacer.flushed = timed  # type: ignore[method-assign]
    try:
        engine = PacedEngine(words=re.findall(r"\s*\S+", reply))
        engine.delay = 1 / rate
        engine.speculation = engine.speculation.__class__(mode=mode, k=4)
        with tempfile.TemporaryDirectory() as tmp:
            app = make_app(engine, Path(tmp), settings=ChatSettings(mode=mode, temperature=0.0, max_tokens=100_000))
            async with app.run_test(size=(130, 45)) as pilot:
                await settle(app, pilot)
                app.query_one("#prompt").text = "Tell me about it."
                await pilot.press("enter")
                await wait_for(pilot, lambda: app.busy, what="the reply to start")
                await settle(app, pilot, timeout=600)
    finally:
        FlushPacer.flushed = flushed  # type: ignore[method-assign]
    return costs, gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="sd", choices=["ar", "sd", "ssd"])
    parser.add_argument("--rate", type=float, default=120.0, help="words a second the scripted engine writes")
    parser.add_argument("--list", type=int, metavar="ITEMS", help="the reply a numbered list of ITEMS items")
    parser.add_argument("--sections", type=int, default=4, help="the Markdown reply's sections (heading, list, code)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    reply = reply_list(args.list) if args.list else reply_markdown(args.sections)
    costs, gaps = asyncio.run(measure(reply, args.mode, args.rate))
    deciles = statistics.quantiles(costs, n=10) if len(costs) > 1 else costs * 9
    log.info("%s, a %d-character reply at %.0f words/s: %d updates; UI CPU an update median %.1f ms, p90 %.1f ms; "
             "gap median %.2f s", args.mode, len(reply), args.rate, len(costs) + 1, 1000 * statistics.median(costs),
             1000 * deciles[-1], statistics.median(gaps))


if __name__ == "__main__":
    main()
