"""TP ranks in processes of their own: TP=2 equals TP=1, a step cut by a second Ctrl-C, the heads TP must divide,
a rank that dies while starting, and a killed leader's ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidParameterError
from tests.engine.processes import cut_step_then_close
from tests.engine.test_spec_decode import PROMPTS


def test_tp2_equals_tp1(tiny_llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, threads=1) as one:
        want = [o.token_ids for o in one.generate(PROMPTS, params)]
    with LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, tp=2, target_devices="cpu", threads=1) as two:
        assert "TP=2" in two.layout["target"]
        assert [o.token_ids for o in two.generate(PROMPTS, params)] == want
        procs = list(two._workers)
    assert procs and not any(p.is_alive() for p in procs)  # close() stopped the TP rank


def test_a_tp_step_cut_by_a_second_ctrl_c_stops_the_ranks_at_once(tiny_llama_dir, monkeypatch):
    """A second Ctrl-C inside a TP forward leaves the ranks mid-collective: STOP, broadcast to them as at a normal
    close, would meet a rank's all-reduce. The ranks are killed at once and the engine refuses more requests."""
    from engine.layers.parallel import TensorParallel

    llm = LLM(str(tiny_llama_dir), max_model_len=256, block_size=4, tp=2, target_devices="cpu", threads=1)
    procs = list(llm._workers)
    real, calls = TensorParallel.all_reduce, []

    def cut(self, x):  # the leader's third all-reduce: its ranks have the forward's inputs and are in it too
        calls.append(x.shape)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, x)

    monkeypatch.setattr(TensorParallel, "all_reduce", cut)
    cut_step_then_close(llm)
    assert procs and not any(p.is_alive() for p in procs)


def test_tp_must_divide_the_heads(tiny_llama_dir, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1, "num_attention_heads": 1,
                                                 "head_dim": 64}))
    with pytest.raises(InvalidParameterError, match="does not divide") as err:
        LLM(str(odd), tp=2, target_devices="cpu")  # refused before any process starts
    assert "\n" not in str(err.value)


def test_a_rank_that_dies_while_starting_is_reported_at_once():
    import datetime
    import multiprocessing

    from engine.distributed import free_port, make_group

    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,), name="rank-under-test")
    child.start()
    with pytest.raises(RuntimeError, match="rank-under-test exited with code 3 while starting"):
        make_group(free_port(), 0, 2, datetime.timedelta(seconds=60), [child])


LEADER_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from engine import LLM
    if __name__ == "__main__":
        llm = LLM(sys.argv[1], draft=sys.argv[1], draft_device="cpu:0", tp=2, target_devices="cpu", threads=1)
        print(" ".join(str(p.pid) for p in [llm.remote.proc, *llm._workers]), flush=True)
        time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_leader_takes_its_ranks_down(tiny_llama_dir, tmp_path):
    script = tmp_path / "leader.py"
    script.write_text(LEADER_SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}
    every_core = set(range(os.cpu_count() or 1))  # not this worker's pinning (an open engine in another test of it)
    leader = subprocess.Popen([sys.executable, str(script), str(tiny_llama_dir)], stdout=subprocess.PIPE, env=env,
                              text=True, preexec_fn=lambda: os.sched_setaffinity(0, every_core))
    try:
        pids = [int(p) for p in leader.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        leader.kill()
        leader.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
