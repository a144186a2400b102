"""Where the engine's processes run: placements refused up front or warned about, the target moved off SSD's
draft cores (only an unpinned one-rank target), and a pin from a worker thread."""

from __future__ import annotations

import os
import threading

import pytest

from engine import LLM
from engine.affinity import pin
from engine.errors import InvalidParameterError
from engine.placement import Device, Placement, off_the_draft
from tests.engine.processes import TWO_CORES


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tp=64, target_devices="cpu"), "needs at least 64 cores"),
    (dict(target_devices="cpu:999"), "core 999 does not exist"),
    (dict(target_devices="gpu:0"), "^--target-devices takes cpu or cuda, .*; got 'gpu:0'$"),
    (dict(draft_device="cuda:0"), "no CUDA device"),
    (dict(tp=3, target_devices="cpu:0", threads=1), "needs at least 3 cores"),
])
def test_bad_placements_are_refused_up_front(tiny_llama_dir, kwargs, message):
    if "cuda" in str(kwargs) and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidParameterError, match=message) as err:
        LLM(str(tiny_llama_dir), **kwargs)
    assert "\n" not in str(err.value)


def test_a_plans_own_refusals_read_as_the_command_lines():
    """They said `--tp must be at least 1, got 0`: the comma, where the command line's errors have `; got`."""
    from engine.placement import plan

    with pytest.raises(InvalidParameterError, match=r"^--tp takes a number of target ranks, at least 1; got 0$"):
        plan(0)
    with pytest.raises(InvalidParameterError, match=r"^--threads takes a number of CPU threads, at least 1; got 0$"):
        plan(1, threads=0)


def test_a_crowded_placement_is_warned_about():
    from engine.placement import crowding, plan

    assert crowding(plan(1, "cpu:0", "cpu:1"), {0, 1}) is None
    assert crowding(plan(1, None, "cpu:0"), {0, 1}) is None  # an unpinned target moves off SSD's core
    assert "shares core(s) 0" in crowding(plan(1, "cpu:0", "cpu:0"), {0, 1})
    assert "shares core(s) 1" in crowding(plan(1, "cpu:0-1", "cpu:1"), {0, 1})
    assert "more than the 2 usable cores" in crowding(plan(1, None, None, threads=8), {0, 1})


def test_only_an_unpinned_one_rank_target_moves_off_the_draft():
    shared = Placement((Device("cpu", None),), Device("cpu", (1,)), None)
    assert off_the_draft(shared, {0, 1, 2, 3}, 4) == ({0, 2, 3}, 3)
    assert off_the_draft(shared, {0, 1, 2, 3}, 2) == ({0, 2, 3}, 2)
    assert off_the_draft(shared, {1}, 1) is None  # no other core
    for placement in (Placement((Device("cpu", (0,)),), Device("cpu", (1,)), None),          # pinned target
                      Placement((Device("cpu", None),) * 2, Device("cpu", (1,)), None),      # TP
                      Placement((Device("cpu", None),), Device("cpu", None), None),          # unpinned draft
                      Placement((Device("cpu", None),), Device("cuda", None, 0), None),      # a GPU draft
                      Placement((Device("cuda", None, 0),), Device("cpu", (1,)), None),      # a GPU target
                      Placement((Device("cpu", None),), None, None)):                        # no draft process
        assert off_the_draft(placement, {0, 1, 2, 3}, 4) is None


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to see a change")
def test_pinning_from_a_worker_thread_pins_the_whole_process():
    before = os.sched_getaffinity(0)
    worker = threading.Thread(target=pin, args=({1}, None))  # the TUI builds the engine in a worker thread
    worker.start()
    worker.join()
    try:
        assert os.sched_getaffinity(0) == {1}  # this (main) thread moved too
    finally:
        pin(before, None)
    assert os.sched_getaffinity(0) == before
