"""The panel's numbers for one reply (ssd_chat.tui.live_stats): tau over every step, and SD's steps without
drafts (the adaptive length chose k = 0) counted apart from the accepted-length histogram."""

from __future__ import annotations

import json
from dataclasses import asdict

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


def test_the_final_panel_keeps_plain_steps_and_never_drafted_positions_show_no_rate():
    """The finished reply's panel dropped the steps-without-drafts line (its histogram then summed to fewer steps
    than tau counted), and a position the adaptive length never reached read 0%, as if always rejected."""
    from engine.outputs import FinishReason, RequestOutput, RequestStats, SpecStats

    stats = LiveStats(mode="ssd", k=4, started=0.0)
    for drafted, accepted in [(1, 1), (0, 0), (1, 0)] * 3:
        stats.on_step(StepStats(1, drafted, accepted, verify_time_s=0.01, draft_time_s=0.002))
    live = stats.snapshot()
    assert live.per_position == (1 / 2, None, None, None)
    spec = SpecStats(num_steps=9, num_drafted=6, num_accepted=3, num_emitted=12, accepted_per_position=(3, 0, 0, 0),
                     drafted_per_position=(6, 0, 0, 0))
    assert spec.per_position_acceptance == (1 / 2, None, None, None)
    output = RequestOutput(1, [1], list(range(12)), "text", FinishReason.LENGTH,
                           RequestStats(mode="ssd", prompt_tokens=1, reused_prefix_tokens=0, prefill_tokens=1,
                                        generated_tokens=12, ttft_s=0.1, decode_time_s=0.1, total_time_s=0.2,
                                        spec=spec))
    final = stats.final(output)
    assert final.plain_steps == 3 and "3 steps without drafts" in str(StatsPanel._spec_text(final))
    positions = str(StatsPanel._positions(final)).splitlines()
    assert positions[0].endswith("50%") and all(p.endswith("–") and "%" not in p for p in positions[1:])


def test_a_draft_position_with_too_few_drafts_shows_no_rate():
    """One draft at a position read 0% or 100% there, and two 50%: fewer than MIN_POSITION_DRAFTS show "–"."""
    from ssd_chat.tui.widgets.stats_panel import MIN_POSITION_DRAFTS

    stats = LiveStats(mode="sd", k=3, started=0.0)
    stats.on_step(StepStats(1, 3, 0, verify_time_s=0.01, draft_time_s=0.002))  # positions 2 and 3: one draft each
    for _ in range(MIN_POSITION_DRAFTS - 1):
        stats.on_step(StepStats(1, 1, 1, verify_time_s=0.01, draft_time_s=0.002))
    assert stats.snapshot().position_drafts == (MIN_POSITION_DRAFTS, 1, 1)
    rows = str(StatsPanel._positions(stats.snapshot())).splitlines()
    assert rows[0].endswith(" 80%") and [r.split()[-1] for r in rows[1:]] == ["–", "–"]


def test_token_colours_read_as_text_in_every_builtin_theme():
    """In the light theme the cache-hit and cache-miss colours (success, warning) were 1.6:1 and 1.4:1 against its
    surface: most of an SSD reply was hard to read with Ctrl+T's colours on."""
    from textual.color import Color
    from textual.theme import BUILTIN_THEMES

    from engine.outputs import TokenSource
    from ssd_chat.tui.provenance import MIN_CONTRAST, _contrast, source_style

    sources = [TokenSource.ACCEPTED_HIT, TokenSource.ACCEPTED_MISS, TokenSource.ACCEPTED, TokenSource.RECOVERY]
    for name, theme in BUILTIN_THEMES.items():
        background = Color.parse(theme.surface or theme.background or ("#000000" if theme.dark else "#ffffff"))
        colours = [Color(*source_style(s, theme).color.get_truecolor()) for s in sources]
        assert all(_contrast(c, background) >= MIN_CONTRAST for c in colours), name
        assert len({c.hex6 for c in colours}) == len(colours), name  # still four colours
    dark = BUILTIN_THEMES["textual-dark"]
    assert Color(*source_style(TokenSource.ACCEPTED_HIT, dark).color.get_truecolor()) == Color.parse(dark.success)


def test_a_reply_stopped_in_its_prefill_shows_no_ttft():
    """Saved by earlier versions: 0 tokens, and the time until the stop was shown as a TTFT of seconds."""
    from ssd_chat.history import TurnStats
    from ssd_chat.tui.live_stats import saved_panel

    assert saved_panel(TurnStats("sd", 0.0, 11.162, 0, 4478, 48, "cancelled")).ttft_s is None
    assert saved_panel(TurnStats("sd", 0.0, 0.05, 1, 30, 0, "stop")).ttft_s == 0.05


def test_a_saved_ssd_reply_shows_its_cache_hits_and_the_tau_split_where_the_history_kept_it():
    """A resumed chat's panel read "cache hits 80%" over "tau on hit – · on miss –", which a live reply shows for
    rounds that never happened: the history kept the hit rate and tau, not the split. It keeps the split now; a
    reply saved before that shows no split line."""
    from ssd_chat.history import TurnStats
    from ssd_chat.tui.live_stats import saved_panel

    before = TurnStats("ssd", 40.0, 0.08, 12, 30, 0, "stop", tau=2.5, acceptance_rate=0.5, cache_hit_rate=0.8)
    text = str(StatsPanel._spec_text(saved_panel(before)))
    assert "cache hits 80%" in text and "tau on hit" not in text and "–" not in text
    now = TurnStats.from_dict(json.loads(json.dumps({**asdict(before), "tau_on_hit": 2.75, "tau_on_miss": 1.5})))
    assert "cache hits 80%\ntau on hit 2.75 · on miss 1.50" in str(StatsPanel._spec_text(saved_panel(now)))
    stats = LiveStats(mode="ssd", k=2, started=0.0)
    for accepted, hit in [(2, True), (0, False)]:
        stats.on_step(StepStats(1, 2, accepted, verify_time_s=0.01, draft_time_s=0.0, cache_hit=hit))
    assert "cache hits 50%\ntau on hit 3.00 · on miss 1.00" in str(StatsPanel._spec_text(stats.snapshot()))


def test_ssds_plain_steps_are_neither_hits_nor_misses_and_a_round_with_nothing_cached_is_a_miss():
    stats = LiveStats(mode="ssd", k=2, started=0.0)
    rounds = [(2, 1, None), (0, 0, None), (0, 0, None), (2, 2, True), (1, 0, None), (2, 0, False)]
    for drafted, accepted, hit in rounds:  # (the first round, and one after plain steps with nothing pre-drafted)
        stats.on_step(StepStats(1, drafted, accepted, verify_time_s=0.01, draft_time_s=0.0, cache_hit=hit))
    data = stats.snapshot()
    assert data.plain_steps == 2 and data.cache_hit_rate == 1 / 4
    assert data.tau_on_hit == 3.0 and data.tau_on_miss == (2 + 1 + 1) / 3
