"""The panel's numbers for one reply (ssd_chat.tui.live_stats): tau over every step, and SD's steps without
drafts (the adaptive length chose k = 0) counted apart from the accepted-length histogram."""

from __future__ import annotations

from engine.outputs import StepStats
from ssd_chat.tui.live_stats import LiveStats
from ssd_chat.tui.widgets.stats_panel import StatsPanel


def test_steps_without_drafts_count_in_tau_but_not_in_the_histogram():
    stats = LiveStats(mode="sd", k=4, started=0.0)
    for drafted, accepted in [(4, 4), (4, 1), (0, 0), (0, 0), (2, 0)]:
        stats.on_step(StepStats(1, drafted, accepted, verify_time_s=0.01, draft_time_s=0.002))
    data = stats.snapshot()
    assert data.tau == (5 + 5) / 5  # 5 accepted drafts plus one token per step
    assert data.acceptance_rate == 5 / 10
    assert data.histogram == (1, 1, 0, 0, 1) and data.plain_steps == 2
    assert data.per_position == (2 / 3, 1 / 3, 1 / 2, 1 / 2)
    assert data.verify_ms == 10.0  # every step's verify, plain ones included
    text = str(StatsPanel._spec_text(data))
    assert "2 steps without drafts" in text


def test_no_line_when_every_step_drafts():
    stats = LiveStats(mode="sd", k=2, started=0.0)
    stats.on_step(StepStats(1, 2, 1, verify_time_s=0.01, draft_time_s=0.002))
    data = stats.snapshot()
    assert data.plain_steps == 0 and "without drafts" not in str(StatsPanel._spec_text(data))
