"""What the chat app's transcript costs the UI thread: a streamed update under N earlier turns, and opening a chat.

    python scripts/ui_update_cost.py --turns 0 6 20
    python scripts/ui_update_cost.py --turns 0 --code 400   # the reply one 400-line code block
    python scripts/ui_update_cost.py --turns 0 --list 40    # the reply one numbered list of 40 items
    python scripts/ui_update_cost.py --turns 0 --table 40   # the reply one table of 40 rows

Each earlier turn is a prompt and a Markdown reply (headings, lists, code: assets-free, written below). A reply of
the same Markdown then streams in 40-character appends; each append is awaited with the screen's refresh, and its
UI-thread CPU is timed (`time.thread_time`). "open" is the CPU to show N turns, as opening a chat from the history
does (`Transcript.show`: its last two screens; the rest are then shown whole, for the updates' measure). No engine
runs: this is the view alone (the app adds its panel's updates to each).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from pathlib import Path

from textual.app import App, ComposeResult

from engine.outputs import TokenSource
from ssd_chat.tui import app as chat_app
from ssd_chat.tui.widgets.transcript import Shown, Transcript

log = logging.getLogger("ui_update_cost")
CHUNK = 40  # characters an update
SIZE = (130, 45)


def reply_markdown(sections: int = 4) -> str:
    """A long reply as a chat model writes one: a heading, a paragraph, a list and a code block a section."""
    parts = []
    for s in range(sections):
        parts.append(f"## Section {s}\n\nThis is a paragraph explaining things in some detail, with **bold** and "
                     "`code` spans, and it goes on for a while to wrap over lines.\n")
        parts.append("\n".join(f"- item {j}: a point worth making about the topic" for j in range(5)) + "\n")
        parts.append("```python\ndef f(x):\n    return x * 2\n\nprint(f(3))\n```\n")
    return "\n".join(parts)


def reply_code(lines: int) -> str:
    """A reply that is a program: a Python code block of `lines` lines."""
    body = "\n".join(f"    total += {i}  # step {i}" for i in range(lines - 3))
    return f"```python\ndef f():\n    total = 0\n{body}\n    return total\n```"


def reply_list(items: int) -> str:
    """A reply that is one numbered list, as a chat model writes "ten tips": a bold title and a sentence an item,
    and two sub-points under it."""
    def item(n: int) -> str:
        indent = " " * len(f"{n}. ")  # (the sub-points' indent: under the item's text)
        return (f"{n}. **Point {n}**: a sentence that explains the point at some length, so it wraps.\n"
                f"{indent}- a detail about it\n{indent}- another detail, with `code`")

    return "\n".join(item(i + 1) for i in range(items))


def reply_table(rows: int) -> str:
    """A reply that is one table, as a chat model writes a comparison: a header, then `rows` rows of four cells."""
    lines = ["| name | kind | size | notes |", "|---|---|---|---|"]
    lines += [f"| item {i} | kind {i % 3} | {10 * i} MB | a short note about item {i} |" for i in range(rows)]
    return "\n".join(lines)


class Host(App):
    CSS_PATH = Path(chat_app.__file__).with_name(chat_app.ChatApp.CSS_PATH)  # (relative to its module)

    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")  # (the app's CSS for it)


async def measure(turns: int, reply: str) -> tuple[float, float, float]:
    """(CPU to open `turns` turns, mean CPU an update, mean CPU of the last ten updates), in seconds."""
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        transcript = app.query_one(Transcript)
        await pilot.pause()
        start = time.thread_time()
        transcript.show([Shown(role, text) for i in range(turns) for role, text in (("user", f"question {i}"),
                                                                                    ("assistant", reply))])
        await pilot.pause()
        opened = time.thread_time() - start
        if transcript.hidden:  # (earlier turns, as a scroll to the top shows them: under the streamed reply too)
            transcript.reveal(keep=False)
            await pilot.pause()
        transcript.add_user("the last question")
        message = transcript.add_assistant("")
        await pilot.pause()
        costs = []
        for at in range(0, len(reply), CHUNK):
            chunk = reply[at:at + CHUNK]
            start = time.thread_time()
            await message.append(chunk, [(chunk, TokenSource.TARGET)])
            await pilot.pause()
            costs.append(time.thread_time() - start)
    return opened, statistics.mean(costs), statistics.mean(costs[-10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[0, 6, 20], help="earlier turns, a run each")
    parser.add_argument("--code", type=int, metavar="LINES", help="the reply (and each earlier one) a code block")
    parser.add_argument("--list", type=int, metavar="ITEMS", help="the reply (and each earlier one) a numbered list")
    parser.add_argument("--table", type=int, metavar="ROWS", help="the reply (and each earlier one) a table")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    reply = (reply_code(args.code) if args.code else reply_list(args.list) if args.list
             else reply_table(args.table) if args.table else reply_markdown())
    log.info("a %d-character reply in %d-character updates, %dx%d screen", len(reply), CHUNK, *SIZE)
    log.info("%6s  %8s  %12s  %16s", "turns", "open s", "update ms", "last 10 ms")
    for turns in args.turns:
        opened, mean, last = asyncio.run(measure(turns, reply))
        log.info("%6d  %8.2f  %12.1f  %16.1f", turns, opened, 1000 * mean, 1000 * last)


if __name__ == "__main__":
    main()
