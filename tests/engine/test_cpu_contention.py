"""Fewer threads while other programs use the engine's cores (engine.cpu_contention): the rule that turns free
cores into a thread count, the governor's windows on a fake clock and /proc/stat, the real /proc/stat, and the
engine: greedy output is the same when the count changes at every step, and each reply hears of the changes."""

from __future__ import annotations

import logging
import sys
import time

import pytest
import torch

from engine import LLM, SamplingParams, ThreadsChanged, TokenDelta, affinity, core_share
from engine import cpu_contention as cc
from engine.config import DEFAULT_TARGET, SpeculationConfig
from engine.outputs import not_also_an_event
from engine.placement import plan
from engine.registry import SHIPPED_DRAFT_ALIAS
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")


@pytest.mark.parametrize(("others", "cores", "most", "chosen"), [
    (0.0, 2, 2, 2), (0.25, 2, 2, 2), (0.3, 2, 2, 2),  # quiet, or a light load: both threads
    (0.4, 2, 2, 1), (0.7, 2, 2, 1), (1.0, 2, 2, 1), (2.0, 2, 2, 1),  # a busy loop, two: one thread; never none
    (1.0, 4, 2, 2), (2.5, 4, 2, 1),  # two threads on four cores: the others have room beside them, until they don't
    (1.4, 8, 8, 6), (0.5, 8, 8, 7), (0.3, 8, 6, 6),  # eight cores: a core a load; never more than the engine's
])
def test_each_core_others_use_a_third_or_more_of_costs_a_thread(others, cores, most, chosen):
    assert cc.threads_for(others, cores, most) == chosen


def test_others_use_what_the_cores_were_busy_with_beyond_this_process():
    start, end = cc.Sample(10.0, 100.0, 5.0), cc.Sample(10.5, 101.8, 5.9)  # 1.8 core-s busy, 0.9 of them ours
    assert cc.others_use(start, end) == pytest.approx(0.9 / 0.5)
    assert cc.others_use(start, cc.Sample(10.5, 100.8, 5.9)) == 0.0  # (ticks: busy can read below ours)


class FakeMachine:
    """A clock and /proc/stat: `others` cores' worth of other programs' time, `ours` of this process's."""

    def __init__(self) -> None:
        self.now, self.busy, self.ours, self.others = 0.0, 0.0, 0.0, 0.0

    def run(self, seconds: float, ours: float = 2.0) -> None:
        self.now += seconds
        self.busy += seconds * (ours + self.others)
        self.ours += seconds * ours

    def read(self, cores) -> cc.Sample:
        return cc.Sample(self.now, self.busy, self.ours)


def _steps(governor: cc.ThreadGovernor, machine: FakeMachine, seconds: float, ours: float = 2.0) -> list[int]:
    """10 ms steps for `seconds`, this process using `ours` cores: the count of each."""
    counts = []
    for _ in range(round(seconds / 0.01)):
        counts.append(governor.tick())
        machine.run(0.01, ours)
        governor.done()
    return counts


def test_the_governor_drops_a_thread_while_another_program_runs_and_takes_it_back(caplog):
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)

    def steps(seconds: float, ours: float = 2.0) -> list[int]:
        return _steps(governor, machine, seconds, ours)

    assert set(steps(1.0)) == {2}  # quiet
    machine.others = 0.7  # a busy loop: while we step on two threads it gets about 0.7 of a core
    with caplog.at_level(logging.INFO, logger="engine.cpu_contention"):
        assert steps(0.6, ours=1.3)[-1] == 1
    assert "stepping with 1 of 2 threads" in caplog.text
    # each reply hears of it (ThreadsChanged, the panel's note): the chat app's log handlers drop the line, which
    # was a warning notice at every change ("stepping with 2 of 2 threads: other programs use 0.15 ...")
    assert caplog.records and not any(not_also_an_event(record) for record in caplog.records)
    machine.others = 1.0
    assert set(steps(2.0, ours=1.0)) == {1}  # it has its core now: one thread stays
    machine.others = 0.25  # a lighter load now (it shows whole beside one thread): two threads are the faster
    assert steps(1.2, ours=1.0)[-1] == 2
    machine.others = 0.2  # (beside two threads it shows as less)
    assert set(steps(2.0)) == {2}


def test_a_pause_between_steps_starts_a_new_window():
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    governor.tick()
    machine.run(0.01)
    governor.done()
    machine.others = 2.0  # between replies something else runs on both cores, and stops before the next one
    machine.run(5.0, ours=0.0)
    machine.others = 0.0
    ticks = []
    for _ in range(100):
        ticks.append(governor.tick())
        machine.run(0.01)
        governor.done()
    assert set(ticks) == {2}  # the idle time was not counted as a busy window


def test_short_replies_take_the_thread_back_once_the_load_has_gone():
    """Replies shorter than a window (a few dozen tokens) never completed one: after a busy loop had stopped, the
    chat stayed on one thread, its panel saying other programs used the CPU, for as long as its replies were short.
    On fewer threads a load shows whole, stepping or not, so the last steps and the pause after them are a window."""
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    machine.others = 1.0
    for _ in range(60):  # a reply beside a busy loop: one thread from its first window on
        governor.tick()
        machine.run(0.01, ours=1.0)
        governor.done()
    assert governor.threads == 1
    machine.others = 0.0  # the loop stops
    counts = []
    for _ in range(3):  # short replies, each 0.2 s of steps, 2 s apart
        machine.run(2.0, ours=0.0)
        for _ in range(20):
            counts.append(governor.tick())
            machine.run(0.01, ours=1.0)
            governor.done()
    assert counts[0] == 2 and set(counts) == {2}
    machine.others = 1.0  # a pause beside a busy loop, on two threads: no change (a window of steps decides)
    machine.run(2.0, ours=0.0)
    assert governor.tick() == 2


def test_a_reply_after_an_idle_pause_starts_on_the_count_the_pause_tells():
    """A load that began while the engine waited cost the next reply its first half second on every thread (in the
    chat app, beside a busy loop, a first token after 1.4-2.6 s). An idle engine shows a load whole: the reply's
    first step takes its count from the pause, both ways."""
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    governor.idle()  # loaded
    machine.others = 1.0  # a busy loop starts while the user types
    machine.run(3.0, ours=0.0)
    governor.idle()  # (the chat app sets the mode right before each reply: still idle since the first call)
    assert set(_steps(governor, machine, 1.0, ours=1.0)) == {1}  # from the first step
    governor.idle()  # the reply ends
    machine.others = 0.0  # the loop stops during the next pause
    machine.run(2.0, ours=0.0)
    assert _steps(governor, machine, 0.1, ours=2.0) == [2] * 10
    governor.idle()
    machine.others = 0.2  # a light load (the chat app's UI drawing a reply): every thread
    machine.run(2.0, ours=0.0)
    assert governor.tick() == 2


def test_a_short_pause_or_a_load_that_has_gone_costs_at_most_a_window():
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    governor.idle()
    machine.others = 1.0
    machine.run(cc.PAUSE_READ_S * 0.6, ours=0.0)  # too short to tell a load from a UI's burst: no change
    assert governor.tick() == 2
    machine.run(0.01, ours=2.0)
    governor.done()
    governor.idle()
    machine.run(2.5, ours=0.0)  # a load for most of the pause, gone at its end: one thread, for one window
    machine.others = 0.0
    machine.run(0.5, ours=0.0)
    counts = _steps(governor, machine, 1.0, ours=1.0)
    assert counts[0] == 1 and counts[-1] == 2 and counts.index(2) <= round(cc.WINDOW_S / 0.01) + 1


def test_a_companion_process_working_through_the_pause_is_no_other_program():
    """The chat app's UI imports and draws its first screen for a second after the engine has loaded (0.5 of a core
    over a 4 s pause): its work is the engine's own. While the engine steps, it is any other program's."""
    companion = {4321: 0.0}

    def governor(companions) -> cc.ThreadGovernor:
        return cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now, companions=companions)

    for companions, chosen in ((dict, 1), (lambda: dict(companion), 2)):  # (none, then the UI)
        machine, companion[4321] = FakeMachine(), 0.0
        governed = governor(companions)
        governed.idle()
        machine.others = 0.8  # the UI: busy with its start, it is counted in the cores' busy time ...
        machine.run(2.0, ours=0.0)
        companion[4321] += 0.8 * 2.0  # ... and in its own CPU time
        machine.others = 0.0
        machine.run(2.0, ours=0.0)
        assert governed.tick() == chosen


def test_a_companion_that_ends_during_the_pause_is_no_load():
    """A draft process that had run for minutes and was killed while the engine waited: its time, gone from the
    reading, was subtracted from the engine's own, and read as a dozen cores of other programs' work."""
    machine = FakeMachine()
    spent = {7: 120.0, 8: 3.0}
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now,
                                 companions=lambda: dict(spent))
    governor.idle()
    machine.others = 0.1  # (the killed process's last moments, say)
    machine.run(0.5, ours=0.0)
    del spent[7]
    spent[8] = 1.0  # (a pid taken by a new process whose time is less: no negative time either)
    machine.others = 0.0
    machine.run(2.0, ours=0.0)
    assert governor.tick() == 2


def _spin_then_wait(seconds: float, spun, stop) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass
    spun.set()
    stop.wait(60)


@linux_only
def test_the_processes_the_engine_started_are_its_companions():
    """SSD's idle draft process loads beside the target (1.6 s of a core): its work is the engine's own."""
    import multiprocessing
    forked = multiprocessing.get_context("fork")
    spun, stop = forked.Event(), forked.Event()
    child = forked.Process(target=_spin_then_wait, args=(0.3, spun, stop), daemon=True)
    child.start()
    try:
        assert spun.wait(60)
        assert child.pid in cc.children()
        assert cc.cpu_seconds([child.pid, 2**22 + 1]).keys() == {child.pid}  # (a pid never there: left out)
        assert cc.cpu_seconds([child.pid])[child.pid] >= 0.25  # (ticks of 10 ms)
    finally:
        stop.set()
        child.join(10)
    assert child.pid not in cc.children()


@linux_only
def test_cpu_seconds_reads_a_process_time():
    import os
    start = cc.cpu_seconds([os.getpid()])[os.getpid()]
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert cc.cpu_seconds([os.getpid()])[os.getpid()] - start >= 0.25  # (ticks of 10 ms)


def test_an_idle_reading_is_dropped_by_the_next_step():
    """A reply that comes right after the last (no pause) drops it: a later pause inside a request, with steps in
    the reading, is no idle pause (on every thread, a window of steps decides, as before)."""
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    _steps(governor, machine, 0.2, ours=2.0)
    governor.idle()
    assert _steps(governor, machine, 0.2, ours=2.0) == [2] * 20  # the next reply at once
    machine.others = 1.0
    machine.run(2.0, ours=0.0)  # a pause, no idle(): a request is still open
    assert governor.tick() == 2


def test_steps_slowed_by_other_programs_are_no_pause():
    """Beside a busy loop and the chat app's UI a verify took 0.5-0.9 s on two threads: each is one window."""
    machine = FakeMachine()
    governor = cc.ThreadGovernor((0, 1), 2, read=machine.read, clock=lambda: machine.now)
    machine.others = 0.9
    counts = []
    for _ in range(3):
        counts.append(governor.tick())
        machine.run(0.7, ours=1.1)
        governor.done()
    assert counts == [2, 1, 1]


def test_no_governor_for_one_thread_more_threads_than_cores_or_without_proc_stat(monkeypatch):
    assert cc.ThreadGovernor.where_useful({0}, 1) is None
    assert cc.ThreadGovernor.where_useful({0}, 2) is None  # (--threads 2 on one core: as asked)
    monkeypatch.setattr(cc, "read_sample", lambda cores: None)
    assert cc.ThreadGovernor.where_useful({0, 1}, 2) is None


@linux_only
def test_proc_stat_counts_this_process_work_as_busy_time():
    cores = tuple(affinity.usable())
    start = cc.read_sample(cores)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # (CPU time, not a sleep: the work /proc/stat must see)
        pass
    end = cc.read_sample(cores)
    assert end.ours - start.ours >= 0.3
    assert end.busy - start.busy >= end.ours - start.ours - 0.05  # ours is part of the cores' busy time (ticks)


class Flipper:
    """A governor that changes the count at every step: 2, 1, 2, ..."""

    def __init__(self) -> None:
        self.threads, self.most, self.ticks, self.idles = 2, 2, 0, 0

    def tick(self) -> int:
        self.ticks += 1
        self.threads = 1 + self.ticks % 2
        return self.threads

    def done(self) -> None:
        pass

    def idle(self) -> None:
        self.idles += 1


def _flipping(llm: LLM) -> Flipper:
    llm.core_share.governor = flipper = Flipper()
    return flipper


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_greedy_output_is_the_same_when_the_thread_count_changes_every_step(mode, tiny_llama_dir, tmp_path):
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.3)
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=1) as llm:
        ar = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=256, threads=2, mode=mode) as llm:
        flipper = _flipping(llm)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ar
        assert flipper.ticks >= GREEDY.max_tokens // 4


def test_each_reply_hears_of_the_thread_count(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=2, adapt_threads=False) as llm:
        assert llm.core_share.governor is None  # switched off
        _flipping(llm)
        events = list(llm.stream(PROMPTS[0], GREEDY))
        changes = [e for e in events if isinstance(e, ThreadsChanged)]
        assert len(changes) >= GREEDY.max_tokens - 1 and {(e.threads, e.most) for e in changes} == {(1, 2), (2, 2)}
        assert changes[0].request_id == events[-1].output.request_id
        stuck = Flipper()
        stuck.tick = lambda: 1  # one thread from here
        stuck.threads = 1
        llm.core_share.governor = stuck
        events = list(llm.stream(PROMPTS[1], GREEDY))  # a reply that starts on fewer threads hears so first
        assert isinstance(events[0], ThreadsChanged) and (events[0].threads, events[0].most) == (1, 2)
        assert not any(isinstance(e, ThreadsChanged) for e in events[1:])
        assert any(isinstance(e, TokenDelta) for e in events)


def test_a_reply_told_of_fewer_threads_hears_of_all_again_when_the_governor_is_replaced(tiny_llama_dir):
    """A new governor mid-reply (CoreShare._pin: SSD's draft process lost gives the target every core back) starts
    on every thread: a reply told it ran on fewer hears so, rather than show the old count to its end."""
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=2, adapt_threads=False) as llm:
        stuck = Flipper()
        stuck.tick = lambda: 1
        stuck.threads = 1
        llm.core_share.governor = stuck
        events = llm.stream(PROMPTS[0], GREEDY)
        first = next(events)
        assert isinstance(first, ThreadsChanged) and (first.threads, first.most) == (1, 2)
        llm.core_share._pin(None, 2)  # (as share(False) does; adapt_threads=False: no governor from here)
        changes = [(e.threads, e.most) for e in events if isinstance(e, ThreadsChanged)]
        assert changes == [(2, 2)]


def test_the_engine_tells_the_governor_when_it_goes_idle(tiny_llama_dir, tmp_path, monkeypatch):
    """Once loaded, when its last request ends or is cancelled, after a mode switch between replies: not while a
    request is open (a pause then is no idle one)."""
    idles = []
    monkeypatch.setattr(core_share.CoreShare, "idle", lambda self: idles.append(self))
    draft = noisy_copy(tiny_llama_dir, tmp_path / "draft", scale=0.3)
    with LLM(str(tiny_llama_dir), draft=str(draft), max_model_len=256, threads=2) as llm:
        assert len(idles) == 2  # from the start of the load (a first request right after it, as ask's), and loaded
        llm.generate(PROMPTS[:2], GREEDY)
        assert len(idles) == 3
        llm.speculation = SpeculationConfig(mode="ar")
        assert len(idles) == 4
        events = llm.stream(PROMPTS[0], GREEDY)
        next(events)
        llm.speculation = SpeculationConfig(mode="sd")  # (for the next request; this one is open)
        assert len(idles) == 4
        events.close()  # cancelled
        assert len(idles) == 5


def test_the_layout_says_the_engines_thread_count_not_the_governors(tiny_llama_dir):
    """The layout (the panel's, after a /mode; the bench's) is read on the stepping thread, whose torch count is the
    governor's last: it says the engine's own."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # (torch's count, as an engine with no --threads on two cores takes it)
    try:
        with LLM(str(tiny_llama_dir), max_model_len=256, adapt_threads=False) as llm:
            stuck = Flipper()
            stuck.tick = lambda: 1
            llm.core_share.governor = stuck
            llm.generate(PROMPTS[0], GREEDY)
            assert "2 threads per rank" in llm.layout["target"]
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(affinity.usable()) < 2,
                    reason="reads Linux's /proc/stat; two threads on one core keep their count")
def test_an_engine_on_several_threads_has_a_governor(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=2) as llm:
        assert llm.core_share.governor is not None and llm.core_share.governor.most == 2
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=1) as llm:
        assert llm.core_share.governor is None


@pytest.mark.slow
def test_the_real_pair_is_exact_when_the_thread_count_changes_every_step():
    """The real model's layers are wide enough for every kernel to split its work between two threads."""
    prompts = PROMPTS[:2]
    with LLM(DEFAULT_TARGET, draft=SHIPPED_DRAFT_ALIAS, max_model_len=512, threads=1, mode="ar") as llm:
        ar = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    with LLM(DEFAULT_TARGET, draft=SHIPPED_DRAFT_ALIAS, max_model_len=512, threads=2) as llm:
        for mode in ("ar", "sd"):
            llm.speculation = SpeculationConfig(mode=mode)
            _flipping(llm)
            assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == ar, mode


@linux_only
def test_a_new_governor_starts_on_the_count_the_last_one_lowered_to(monkeypatch):
    """A mode switch (SD to SSD and back, a compare's rows) pins the process anew and makes a new governor: beside a
    busy program it starts on the lowered count, not on every thread's 4-5x slower steps."""
    monkeypatch.setattr(core_share, "pin", lambda cores, threads: None)  # (this test process stays where it is)
    share = core_share.CoreShare(plan(1, None, None, None), adapt=True)
    share._pin({0, 1}, 2)
    assert share.governor.threads == 2
    share.governor.threads = 1  # another program took a core
    share._pin({0}, 1)  # SSD: the target on one core, one thread (nothing to govern)
    assert share.governor is None
    share._pin({0, 1}, 2)  # back to SD on both cores
    assert (share.governor.threads, share.governor.most) == (1, 2)
    share._pin({0, 1}, 2)  # (a governor on every thread carries nothing)
    assert share.governor.threads == 1
    share.governor.threads = 2
    share._pin({0, 1}, 2)
    assert share.governor.threads == 2


def test_a_reply_whose_first_step_takes_every_thread_back_hears_nothing(tiny_llama_dir):
    """A reply added while the count is lowered, whose first step finds the load gone, ran on every thread: it is
    told nothing (it was told of fewer when added, and its panel said "fewer threads for a while")."""
    with LLM(str(tiny_llama_dir), max_model_len=256, threads=2, adapt_threads=False) as llm:
        back = Flipper()
        back.threads = 1  # lowered by the last reply's load ...

        def tick() -> int:  # ... which has gone by this reply's first step
            back.threads = 2
            return 2

        back.tick = tick
        llm.core_share.governor = back
        assert not any(isinstance(e, ThreadsChanged) for e in llm.stream(PROMPTS[0], GREEDY))


def test_closing_an_engine_gives_the_process_its_thread_count_back(tiny_llama_dir):
    """An engine on two threads left the process on two: the next engine there (threads=None) took them, and a
    governor with them (in the tests' workers, on one thread each, a note on stderr where none was expected)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with LLM(str(tiny_llama_dir), max_model_len=256, threads=2) as llm:
            llm.generate(PROMPTS[:1], GREEDY)
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
