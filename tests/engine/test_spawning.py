"""What a child process starts with (engine.spawning): its own cores from its first instruction, and SIGINT and
SIGHUP blocked (the leader takes a Ctrl-C or a closed terminal and stops its children); the caller's thread gets
its own back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from engine import affinity, spawning

SHOW_MASK = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"



@pytest.mark.skipif(not affinity.can_pin() or len(affinity.usable()) < 2, reason="needs two cores and pinning")
def test_a_child_starts_on_its_own_cores_and_the_caller_keeps_its_own():
    """started_on: the child runs on its cores from its first instruction (its imports too), the caller's thread
    gets its affinity back."""
    import subprocess

    before = os.sched_getaffinity(0)
    last = max(before)
    with spawning.started_on((last,)):
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
    assert child.stdout.strip() == f"[{last}]"
    assert os.sched_getaffinity(0) == before
    with spawning.started_on(None):  # unpinned: nothing changes
        assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks here")
def test_a_child_starts_with_ctrl_c_blocked_and_the_caller_keeps_its_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with spawning.interrupts_blocked():
        child = subprocess.run([sys.executable, "-c", SHOW_MASK], capture_output=True, text=True, check=True)
    assert {int(signal.SIGINT), int(signal.SIGHUP)} <= set(eval(child.stdout))
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    plain = subprocess.run([sys.executable, "-c", SHOW_MASK], capture_output=True, text=True, check=True)
    assert int(signal.SIGINT) not in eval(plain.stdout)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_the_resource_tracker_outlives_a_hangup():
    """A closed terminal's SIGHUP reaches the whole process group: the tracker, blocking it, stays to remove the
    shared memory its processes leave."""
    script = ("from multiprocessing import resource_tracker as r; from engine.spawning import ensure_resource_tracker;"
              "ensure_resource_tracker(); print(open(f'/proc/{r._resource_tracker._pid}/status').read())")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    blocked = int(next(line for line in child.stdout.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    assert blocked >> (int(signal.SIGHUP) - 1) & 1


def test_a_rank_process_ignores_the_terminals_ctrl_c(tmp_path):
    """spawn_rank starts its child with SIGINT blocked: a SIGINT to it (as a Ctrl-C reaches the whole process group)
    leaves it running until the leader stops it."""
    import datetime

    from engine.distributed import RankSpec, free_port, make_group, spawn_rank

    port = free_port()
    proc = spawn_rank(_wait_for_leader, RankSpec(1, None, 1), port, 2)
    group = make_group(port, 0, 2, datetime.timedelta(seconds=60), [proc])
    os.kill(proc.pid, signal.SIGINT)
    import torch.distributed as dist

    dist.barrier(group=group)  # it is still there to meet the leader
    proc.join(30)
    assert proc.exitcode == 0


def _wait_for_leader(group) -> None:
    import torch.distributed as dist

    dist.barrier(group=group)
