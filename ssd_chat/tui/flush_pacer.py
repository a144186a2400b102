"""When a streaming reply's view next updates: often where rendering is free, less often where it takes the engine's
CPU.

An update of the reply (a Markdown append) and the panel that changes the reply's height makes Textual lay out and
repaint the whole screen: 50-60 ms of the UI thread on a 2-vCPU Zen 1 VM (2026-12-07), of which the transcript 25-55
(scripts/ui_update_cost.py); one that does not (a streaming reply grows 4 lines at a time, line_view.ROOM, and
the panel's figures change in place, widgets/steady.py) repaints the lines that changed (scripts/ui_flush_cost.py). With
the engine on this machine's CPU its threads want every core, and the UI's CPU stalls them (an OpenMP step waits
for its slowest thread). So on a CPU engine the gap after an update is the UI thread's CPU since the last one
divided by `share`, between `min_s` and `max_s`; on a GPU engine every `min_s`. In tmux
(2026-12-05, AR on both cores, an 800-token essay, three interleaved runs): updates every 0.15 s 90-103 tok/s (the
app's process used 1.9-2.4 s of CPU), paced 107-115 (1.1-1.2 s; the gap grew from 0.1 to about 0.4 s), none
until the end 120-126 (0.5 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class FlushPacer:
    """`due(now)`: whether the view should update now; `flushed(now)` after it did. `share` None: no CPU budget."""

    def __init__(self, min_s: float, max_s: float, share: float | None,
                 cpu: Callable[[], float] = time.thread_time) -> None:
        assert 0 < min_s <= max_s and (share is None or 0 < share <= 1)
        self.min_s, self.max_s, self.share, self.cpu = min_s, max_s, share, cpu
        self.gap_s = min_s
        self._last: float | None = None  # when the view last updated
        self._cpu_at_last = 0.0
        self._cost_s: float | None = None  # the UI thread's CPU per update, smoothed

    def due(self, now: float) -> bool:
        return self._last is None or now - self._last >= self.gap_s - 1e-3  # a timer tick early is on time

    def flushed(self, now: float) -> None:
        """The view updated at `now` (call it on the UI thread: `cpu` is that thread's time)."""
        cpu = self.cpu()
        if self._last is not None and self.share is not None:
            spent = cpu - self._cpu_at_last  # the last update's layout and redraw, and whatever else the UI did
            self._cost_s = spent if self._cost_s is None else 0.5 * self._cost_s + 0.5 * spent
            self.gap_s = min(self.max_s, max(self.min_s, self._cost_s / self.share))
        self._last, self._cpu_at_last = now, cpu
