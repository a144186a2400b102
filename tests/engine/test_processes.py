"""The process layout: SSD's draft in its own process, TP ranks across processes, faults and shutdown."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from engine import LLM, EngineWarning, FinishReason, SamplingParams, TokenDelta, affinity, shm_channel
from engine.affinity import pin
from engine.config import SpeculationConfig
from engine.distributed import Channel
from engine.errors import InvalidParameterError
from engine.outputs import RequestFinished
from engine.placement import Device, Placement, off_the_draft
from engine.shm_channel import ShmChannel
from tests.engine.test_spec_decode import PROMPTS, noisy_copy

GREEDY = SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True)
TWO_CORES = affinity.can_pin() and len(affinity.usable()) >= 2
DRAFT_CORE = "cpu:1" if TWO_CORES else "cpu:0"


@pytest.fixture(scope="module")
def draft_dir(tiny_llama_dir, tmp_path_factory):
    return noisy_copy(tiny_llama_dir, tmp_path_factory.mktemp("proc") / "mild", scale=0.1, seed=3)


@pytest.fixture(scope="module")
def remote(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        yield llm


def _outputs(llm: LLM, spec: SpeculationConfig, params=GREEDY) -> list[list[int]]:
    llm.speculation = spec
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize(("k", "fanout", "backup"), [(1, None, "jit"), (4, None, "jit"), (4, (3, 2, 2, 1, 4), "jit"),
                                                      (3, (0,), "jit"), (4, None, "fast")])
def test_ssd_with_a_draft_process_equals_ar(remote, k, fanout, backup):
    want = _outputs(remote, SpeculationConfig(mode="ar"))
    remote.speculation = SpeculationConfig(mode="ssd", k=k, fanout=fanout, backup=backup)
    outs = remote.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == want
    spec = [o.stats.spec for o in outs]
    hits, steps = sum(s.num_cache_hits for s in spec), sum(s.num_steps for s in spec)
    if fanout == (0,):
        assert hits == 0  # an empty cache: every round was a miss, and the output is still exact
    else:
        assert 0 < hits < steps
    assert all(s.draft_idle_s is not None for s in spec)  # the draft process reports its idle time


def test_the_round_messages_take_shared_memory_on_x86_and_gloo_when_told(remote, tiny_llama_dir, draft_dir,
                                                                          monkeypatch):
    """x86-64: the leader and the draft process exchange rounds through shared memory (engine.shm_channel);
    SSD_CHAT_SHM=0 (and other CPUs) keep gloo, with the same tokens."""
    assert isinstance(remote.remote.channel, ShmChannel) == shm_channel.available()
    want = _outputs(remote, SpeculationConfig(mode="ar"))
    monkeypatch.setenv("SSD_CHAT_SHM", "0")
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        assert type(llm.remote.channel) is Channel
        assert _outputs(llm, SpeculationConfig(mode="ssd", k=4)) == want


def test_ssd_with_a_draft_process_runs_exactly_into_the_context_limit(remote):
    prompt = list(range(5, 5 + 240))  # 16 positions left before max_model_len (256)
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    remote.speculation = SpeculationConfig(mode="ar")
    want = remote.generate([prompt], params)[0]
    remote.speculation = SpeculationConfig(mode="ssd", k=4)
    got = remote.generate([prompt], params)[0]
    assert got.finish_reason is FinishReason.CONTEXT and got.token_ids == want.token_ids
    assert len(prompt) + len(got.token_ids) == 256


def test_the_draft_process_keeps_its_prefix_cache_across_turns(remote):
    remote.speculation = SpeculationConfig(mode="ssd", k=3)
    first = remote.generate(["Paris is a city of lights and"], GREEDY)[0]
    again = remote.generate([first.prompt_token_ids + first.token_ids + [7, 8]], GREEDY)[0]
    assert again.stats.spec.draft_reused_prefix_tokens >= len(first.prompt_token_ids) - 4


def test_a_ctrl_c_mid_round_lands_between_steps_and_the_draft_stays_in_step(remote, monkeypatch):
    """A Ctrl-C while the leader waits for the draft process's answer is handled once the step is done
    (engine.interrupts): cut there, the answer stayed unread, the next round read it as its own, and close() waited
    for the draft process for minutes. The next request still equals AR, with the same draft process."""
    ar = _outputs(remote, SpeculationConfig(mode="ar"))
    drafter = remote.remote
    monkeypatch.setattr(drafter.channel, "timeout_s", 10.0)  # out of step, the test fails in seconds, not minutes
    receive = drafter.channel.recv_ints
    waits = []

    def ctrl_c_then_receive(*args):
        if not waits:
            waits.append(1)
            signal.raise_signal(signal.SIGINT)  # (Python runs the handler at once)
        return receive(*args)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(drafter.channel, "recv_ints", ctrl_c_then_receive)
    remote.speculation = SpeculationConfig(mode="ssd", k=4)
    try:
        with pytest.raises(KeyboardInterrupt):
            list(remote.stream(PROMPTS[0], GREEDY))
    finally:
        signal.signal(signal.SIGINT, before)
    monkeypatch.setattr(drafter.channel, "recv_ints", receive)
    assert waits and drafter.alive
    assert _outputs(remote, SpeculationConfig(mode="ssd", k=4)) == ar
    assert remote.remote is drafter and drafter.alive


def test_a_step_cut_by_a_second_ctrl_c_drops_the_draft_process(tiny_llama_dir, draft_dir, monkeypatch):
    """A second Ctrl-C acts at once, inside the step: the scheduler's lists and the draft process's exchange are
    half-way. The draft process is killed (close() does not wait for it: on gloo that was the 120 s timeout), the
    request ends without touching the scheduler (its lists raised ValueError: a traceback), and the engine refuses
    more requests with one line instead of decoding from a state it cannot trust."""

    llm = LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
              threads=1, mode="ssd")
    drafter = llm.remote

    def cut(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(drafter.channel, "recv_ints", cut)
    _cut_step_then_close(llm)
    assert not drafter.alive
    drafter.proc.join(10)
    assert not drafter.proc.is_alive()


def _cut_step_then_close(llm: LLM) -> None:
    """A request whose step the caller's patch cuts with a KeyboardInterrupt (a second Ctrl-C): it raises it, the
    engine refuses the next request with one line, and its close takes under 5 s."""
    from engine.errors import EngineError

    try:
        with pytest.raises(KeyboardInterrupt):
            list(llm.stream(PROMPTS[0], GREEDY))
        with pytest.raises(EngineError, match="second Ctrl-C"):
            llm.generate(PROMPTS[0], GREEDY)
    finally:
        started = time.perf_counter()
        llm.close()
    assert time.perf_counter() - started < 5


def test_an_ssd_engine_left_open_at_exit_lets_the_process_end(tiny_llama_dir, tmp_path):
    """multiprocessing's exit stops a daemon child with SIGTERM and waits for it: a draft process that blocked
    SIGTERM kept a script that never closed its LLM from ending."""
    script = tmp_path / "open_at_exit.py"
    script.write_text(textwrap.dedent(f"""
        from engine import LLM
        if __name__ == "__main__":
            llm = LLM({str(tiny_llama_dir)!r}, draft={str(tiny_llama_dir)!r}, mode="ssd", draft_device="cpu")
            print("open", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and "open" in done.stdout, done.stderr


def test_cancel_frees_blocks_on_every_rank(remote):
    remote.speculation = SpeculationConfig(mode="ssd", k=3)
    cancel = threading.Event()
    events = []
    for event in remote.stream("The cat sat on", SamplingParams(temperature=0.0, max_tokens=200), cancel=cancel):
        events.append(event)
        if sum(isinstance(e, TokenDelta) for e in events) == 3:
            cancel.set()
    assert events[-1].output.finish_reason is FinishReason.CANCELLED
    free, total, live = remote.remote.stats()
    assert (free, live) == (total, 0)
    assert remote.core.blocks.num_free_blocks == len(remote.core.blocks.blocks)


def _ssd_with_a_fault(llm: LLM, prompt, *, after: int, sig: int):
    """Stream ``prompt`` under SSD (k=3) and send ``sig`` to the draft process once, after ``after`` tokens:
    (the streamed token ids, the warnings, the final output)."""
    llm.speculation = SpeculationConfig(mode="ssd", k=3)
    tokens, warnings, final, sent = [], [], None, False
    for event in llm.stream(prompt, GREEDY):
        if isinstance(event, TokenDelta):
            tokens += event.token_ids
            if len(tokens) >= after and not sent:
                os.kill(llm.remote.proc.pid, sig)
                sent = True
        elif isinstance(event, EngineWarning):
            warnings.append(event.message)
        elif isinstance(event, RequestFinished):
            final = event.output
    return tokens, warnings, final


def test_a_dying_draft_process_falls_back_to_ar(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        want = _outputs(llm, SpeculationConfig(mode="ar"))
        tokens, warnings, final = _ssd_with_a_fault(llm, PROMPTS[0], after=8, sig=signal.SIGKILL)
        assert tokens == final.token_ids == want[0]  # nothing lost, nothing repeated
        assert len(warnings) == 1 and "AR mode" in warnings[0]
        later = list(llm.stream(PROMPTS[1], GREEDY))  # new SSD requests also run (in AR) and say so
        assert later[-1].output.token_ids == want[1]
        assert any(isinstance(e, EngineWarning) for e in later)


def test_a_lost_draft_moves_every_request_using_it_to_ar(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        want = _outputs(llm, SpeculationConfig(mode="ar"))
        llm.speculation = SpeculationConfig(mode="ssd", k=3)
        first = llm.stream(PROMPTS[0], GREEDY)
        llm.speculation = SpeculationConfig(mode="ssd", k=2)  # a second group of requests on the same draft
        second = llm.stream(PROMPTS[1], GREEDY)
        events, killed = {0: [], 1: []}, False
        for event in first:  # each step advances both requests
            events[0].append(event)
            if not killed and sum(isinstance(e, TokenDelta) for e in events[0]) == 4:
                os.kill(llm.remote.proc.pid, signal.SIGKILL)
                killed = True
        events[1] = list(second)
        for i, evs in events.items():
            assert evs[-1].output.token_ids == want[i]
            assert sum(isinstance(e, EngineWarning) for e in evs) == 1


def test_a_draft_process_that_stops_answering_is_dropped(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1, draft_timeout_s=3.0) as llm:
        want = _outputs(llm, SpeculationConfig(mode="ar"))
        tokens, warnings, _ = _ssd_with_a_fault(llm, PROMPTS[2], after=6, sig=signal.SIGSTOP)  # alive but silent
        assert tokens == want[2]
        assert len(warnings) == 1 and "AR mode" in warnings[0]
        llm.remote.proc.join(10)
        assert not llm.remote.proc.is_alive()  # the silent process was killed, not left behind


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
    _cut_step_then_close(llm)
    assert procs and not any(p.is_alive() for p in procs)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tp=64, target_devices="cpu"), "needs at least 64 cores"),
    (dict(target_devices="cpu:999"), "core 999 does not exist"),
    (dict(target_devices="gpu:0"), "must look like cpu:0-3"),
    (dict(draft_device="cuda:0"), "no CUDA device"),
    (dict(tp=3, target_devices="cpu:0", threads=1), "needs at least 3 cores"),
])
def test_bad_placements_are_refused_up_front(tiny_llama_dir, kwargs, message):
    if "cuda" in str(kwargs) and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidParameterError, match=message) as err:
        LLM(str(tiny_llama_dir), **kwargs)
    assert "\n" not in str(err.value)


def test_tp_must_divide_the_heads(tiny_llama_dir, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1, "num_attention_heads": 1,
                                                 "head_dim": 64}))
    with pytest.raises(InvalidParameterError, match="does not divide") as err:
        LLM(str(odd), tp=2, target_devices="cpu")  # refused before any process starts
    assert "\n" not in str(err.value)


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


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to see a change")
def test_ssd_steps_run_on_the_engines_thread_count_on_any_thread(tiny_llama_dir, draft_dir, remote):
    """The chat app runs each reply on whichever worker thread is free, and torch's thread count belongs to the
    thread that set it: a thread that used torch before SSD took a core off the target kept two threads for the
    one core left (a step 30x slower). Every step now sets the engine's count on its own thread."""
    remote.speculation = SpeculationConfig(mode="ar")
    started, go, seen = threading.Event(), threading.Event(), []
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4,
             draft_device=f"cpu:{max(os.sched_getaffinity(0))}") as llm:  # the chat app's SD layout

        def reply() -> None:  # a worker thread that ran torch on a thread a core before SSD started
            torch.set_num_threads(len(os.sched_getaffinity(0)))
            torch.ones(256, 256) @ torch.ones(256, 256)  # its first parallel op: the count is now its own
            started.set()
            go.wait()
            step = llm.core.step
            llm.core.step = lambda: seen.append(torch.get_num_threads()) or step()
            try:
                seen.append(llm.generate(PROMPTS[0], GREEDY)[0].token_ids)
            finally:
                llm.core.step = step

        worker = threading.Thread(target=reply)
        worker.start()
        started.wait()
        llm.speculation = SpeculationConfig(mode="ssd", k=3)  # this (main) thread: the target leaves a core
        go.set()
        worker.join()
        ar = _outputs(llm, SpeculationConfig(mode="ar"))
    counts, tokens = seen[:-1], seen[-1]
    assert counts and set(counts) == {len(os.sched_getaffinity(0)) - 1} and tokens == ar[0]


def test_processes_start_while_stderr_has_no_descriptor():
    """Textual replaces sys.stderr with a stream whose fileno() is -1; multiprocessing's resource tracker, which a
    spawned process and a shared-memory block start, then failed ("bad value(s) in fds_to_keep"), and `ssd-chat`
    in a terminal could not start SSD's draft process. A fresh interpreter: the tracker must not be running yet."""
    script = textwrap.dedent("""
        import multiprocessing, sys
        from multiprocessing import shared_memory

        class NoDescriptor:
            def fileno(self):
                return -1
            def write(self, text):
                return len(text)
            def flush(self):
                pass

        sys.stderr = NoDescriptor()
        try:
            if sys.argv[1] == "engine":
                from engine.distributed import ensure_resource_tracker
                ensure_resource_tracker()
            proc = multiprocessing.get_context("spawn").Process(target=print, args=("child",))
            proc.start()  # first: where the tracker cannot start, no shared-memory block is made (and left behind)
            proc.join()
            block = shared_memory.SharedMemory(create=True, size=64)
            block.close()
            block.unlink()
            print("ok", proc.exitcode, type(sys.stderr).__name__)
        except ValueError as exc:
            print("failed:", exc)
    """)
    run = [sys.executable, "-c", script]
    fixed = subprocess.run([*run, "engine"], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert fixed.stdout.split()[-3:] == ["ok", "0", "NoDescriptor"], fixed.stderr
    plain = subprocess.run([*run, "plain"], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert "failed: bad value(s) in fds_to_keep" in plain.stdout  # what the helper is for


def test_a_crowded_placement_is_warned_about():
    from engine.placement import crowding, plan

    assert crowding(plan(1, "cpu:0", "cpu:1"), {0, 1}) is None
    assert crowding(plan(1, None, "cpu:0"), {0, 1}) is None  # an unpinned target moves off SSD's core
    assert "shares core(s) 0" in crowding(plan(1, "cpu:0", "cpu:0"), {0, 1})
    assert "shares core(s) 1" in crowding(plan(1, "cpu:0-1", "cpu:1"), {0, 1})
    assert "more than the 2 usable cores" in crowding(plan(1, None, None, threads=8), {0, 1})


def test_a_rank_that_dies_while_starting_is_reported_at_once():
    import datetime
    import multiprocessing

    from engine.distributed import free_port, make_group

    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,), name="rank-under-test")
    child.start()
    with pytest.raises(RuntimeError, match="rank-under-test exited with code 3 while starting"):
        make_group(free_port(), 0, 2, datetime.timedelta(seconds=60), [child])


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to see a change")
def test_ssd_moves_an_unpinned_target_off_the_draft_cores(tiny_llama_dir, draft_dir, remote):
    remote.speculation = SpeculationConfig(mode="ar")  # the module's engine (same layout) gives the cores back
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    draft_core = max(before)
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4,
             draft_device=f"cpu:{draft_core}") as llm:  # the chat app's SD layout: the target unpinned
        ar = _outputs(llm, SpeculationConfig(mode="ar"))
        assert os.sched_getaffinity(0) == before
        ssd = _outputs(llm, SpeculationConfig(mode="ssd", k=3))
        assert os.sched_getaffinity(0) == before - {draft_core}
        assert torch.get_num_threads() == min(threads, len(before) - 1)
        assert ssd == ar
        llm.speculation = SpeculationConfig(mode="sd")
        assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads
        llm.speculation = SpeculationConfig(mode="ssd")
        assert os.sched_getaffinity(0) == before - {draft_core}
        os.kill(llm.remote.proc.pid, signal.SIGKILL)  # a lost draft process: AR from now on, on every core
        llm.remote.proc.join(10)
        events = list(llm.stream(PROMPTS[0], GREEDY))
        assert any(isinstance(e, EngineWarning) for e in events) and events[-1].output.token_ids == ar[0]
        assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads
        llm.speculation = SpeculationConfig(mode="ssd")  # stays off: nothing to make room for
        assert os.sched_getaffinity(0) == before
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4,
             draft_device=f"cpu:{draft_core}") as llm:
        llm.speculation = SpeculationConfig(mode="ssd")
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads  # close() gives them back
    llm.speculation = SpeculationConfig(mode="ssd")  # after close: no draft process to make room for
    assert os.sched_getaffinity(0) == before


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
