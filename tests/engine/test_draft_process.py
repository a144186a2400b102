"""SSD's draft in its own process, on one engine the module shares: equal to AR in every variant, its rounds over
shared memory or gloo, the context limit, its prefix cache, a Ctrl-C between steps, a cancel, and the cores and
threads the target keeps."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from engine import LLM, EngineWarning, FinishReason, SamplingParams, TokenDelta, shm_channel
from engine.config import SpeculationConfig
from engine.distributed import Channel
from engine.shm_channel import ShmChannel
from tests.engine import processes
from tests.engine.processes import DRAFT_CORE, GREEDY, TWO_CORES, outputs
from tests.engine.test_spec_decode import PROMPTS

draft_dir = processes.draft_dir  # the fixture: the tiny target with noise, SSD's draft here


@pytest.fixture(scope="module")
def remote(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        yield llm


@pytest.mark.parametrize(("k", "fanout", "backup"), [(1, None, "jit"), (4, None, "jit"), (4, (3, 2, 2, 1, 4), "jit"),
                                                      (3, (0,), "jit"), (4, None, "fast")])
def test_ssd_with_a_draft_process_equals_ar(remote, k, fanout, backup):
    want = outputs(remote, SpeculationConfig(mode="ar"))
    remote.speculation = SpeculationConfig(mode="ssd", k=k, fanout=fanout, backup=backup, adaptive_k=False)
    outs = remote.generate(PROMPTS, GREEDY)  # (adaptive, SSD may pause: test_spec_length's)
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
    want = outputs(remote, SpeculationConfig(mode="ar"))
    monkeypatch.setenv("SSD_CHAT_SHM", "0")
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        assert type(llm.remote.channel) is Channel
        assert outputs(llm, SpeculationConfig(mode="ssd", k=4)) == want


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
    ar = outputs(remote, SpeculationConfig(mode="ar"))
    drafter = remote.remote
    # out of step, the test fails in seconds, not minutes (the shared-memory channel's wait; gloo's has its own)
    monkeypatch.setattr(drafter.channel, "timeout_s", 10.0, raising=False)
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
    assert outputs(remote, SpeculationConfig(mode="ssd", k=4)) == ar
    assert remote.remote is drafter and drafter.alive


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
        ar = outputs(llm, SpeculationConfig(mode="ar"))
    counts, tokens = seen[:-1], seen[-1]
    assert counts and set(counts) == {len(os.sched_getaffinity(0)) - 1} and tokens == ar[0]


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to see a change")
def test_an_unpinned_target_loads_off_the_cores_of_the_draft_process_loading_beside_it(tiny_llama_dir, draft_dir,
                                                                                       monkeypatch):
    """The chat app's layout: the target built while the draft process loads keeps off its cores (its threads
    waited for that core: the chat app's start took 1 s longer on the 2-vCPU VM), then steps in SD on every core."""
    import engine.startup

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    draft_core = max(before)
    seen = []
    build = engine.startup.build_model

    def recorded(*args, **kwargs):
        seen.append((os.sched_getaffinity(0), torch.get_num_threads()))
        return build(*args, **kwargs)

    monkeypatch.setattr(engine.startup, "build_model", recorded)
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4,
             draft_device=f"cpu:{draft_core}") as llm:
        assert seen == [(before - {draft_core}, min(threads, len(before) - 1))]
        assert llm.speculation.mode == "sd"
        assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to see a change")
def test_ssd_moves_an_unpinned_target_off_the_draft_cores(tiny_llama_dir, draft_dir, remote):
    remote.speculation = SpeculationConfig(mode="ar")  # the module's engine (same layout) gives the cores back
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    draft_core = max(before)
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4,
             draft_device=f"cpu:{draft_core}") as llm:  # the chat app's SD layout: the target unpinned
        ar = outputs(llm, SpeculationConfig(mode="ar"))
        assert os.sched_getaffinity(0) == before
        ssd = outputs(llm, SpeculationConfig(mode="ssd", k=3))
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
