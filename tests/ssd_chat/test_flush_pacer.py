"""The reply view's pacing (ssd_chat.tui.flush_pacer): the first update at once, then every min_s where rendering
is free; with a CPU budget the gap grows with the UI thread's CPU per update, within [min_s, max_s]."""

from __future__ import annotations

import itertools

import pytest

from ssd_chat.tui.flush_pacer import FlushPacer


class FakeCpu:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _run(pacer: FlushPacer, cpu: FakeCpu, cost_s: float, ticks: int, tick_s: float = 0.05) -> list[float]:
    """Ticks every tick_s; each update costs the UI thread cost_s of CPU. Returns the update times."""
    times = []
    for i in range(ticks):
        now = i * tick_s
        if pacer.due(now):
            pacer.flushed(now)
            cpu.t += cost_s
            times.append(now)
    return times


def test_without_a_budget_it_updates_every_min_s_whatever_the_cost():
    cpu = FakeCpu()
    times = _run(FlushPacer(0.1, 0.5, None, cpu), cpu, cost_s=0.2, ticks=40)
    assert times[0] == 0.0
    assert all(b - a == pytest.approx(0.1) for a, b in itertools.pairwise(times))


@pytest.mark.parametrize(("cost_s", "gap_s"), [(0.005, 0.1), (0.03, 0.3), (0.045, 0.45), (0.2, 0.5)])
def test_with_a_budget_the_gap_keeps_the_ui_near_its_share(cost_s, gap_s):
    cpu = FakeCpu()
    pacer = FlushPacer(0.1, 0.5, 0.1, cpu)
    times = _run(pacer, cpu, cost_s, ticks=400)
    assert pacer.gap_s == pytest.approx(gap_s)
    late = [b - a for a, b in itertools.pairwise(times[-6:])]
    assert all(g == pytest.approx(gap_s, abs=0.051) for g in late)  # quantized by the 0.05 s ticks
    used = cost_s * len(times[-20:]) / (times[-1] - times[-21])
    assert used <= max(0.1, cost_s / 0.5) * 1.2  # the share, unless max_s caps the gap


def test_the_gap_follows_a_change_in_cost():
    cpu = FakeCpu()
    pacer = FlushPacer(0.1, 0.5, 0.1, cpu)
    _run(pacer, cpu, 0.04, ticks=200)
    assert pacer.gap_s == pytest.approx(0.4)
    for i in range(200, 400):  # the renders got cheap (a short reply, a smaller terminal)
        now = i * 0.05
        if pacer.due(now):
            pacer.flushed(now)
            cpu.t += 0.005
    assert pacer.gap_s == pytest.approx(0.1)
