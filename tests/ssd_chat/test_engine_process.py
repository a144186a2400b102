"""The chat app's engine in its own process (ssd_chat.tui.engine_process): the same replies and interface as an
in-process LLM, errors as one-line EngineErrors, cancels and abandoned streams leave it clean for the next request,
its log lines reach the app, and it ends with close() or with the app's process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine import LLM, SamplingParams, shm_channel
from engine.config import SpeculationConfig
from engine.errors import EngineError, PromptTooLongError
from engine.outputs import FinishReason, PrefillProgress, RequestFinished, TokenDelta
from ssd_chat.tui.engine_process import EngineProcess

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
MESSAGES = [{"role": "user", "content": "Paris is"}]


@pytest.fixture(scope="module")
def child(tiny_llama_dir):
    engine = EngineProcess(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=128, threads=1)
    yield engine
    engine.close()


def _final(events) -> object:
    *_, last = events
    assert isinstance(last, RequestFinished)
    return last.output


def test_replies_and_interface_match_an_in_process_engine(child, tiny_llama_dir):
    with LLM(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=128, threads=1) as local:
        want = _final(local.chat(MESSAGES, GREEDY))
        assert child.encode_chat(MESSAGES) == local.encode_chat(MESSAGES)
        assert child.max_model_len == local.max_model_len == 128 and child.config.draft == local.config.draft
        vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]  # (the app's /top-k limit)
        assert child.vocab_size == local.vocab_size == vocab
    for mode in ("ar", "sd", "ssd"):
        child.speculation = SpeculationConfig(mode=mode, k=3)
        assert child.speculation.mode == mode and "target" in child.layout
        events = list(child.chat(MESSAGES, GREEDY))
        assert any(isinstance(e, TokenDelta) for e in events)
        assert _final(events).token_ids == want.token_ids
    assert child.tokenizer.decode(list(want.token_ids)) == local.tokenizer.decode(list(want.token_ids))


def test_a_reply_continued_through_the_pipe_is_the_in_process_engines(child, tiny_llama_dir):
    """/continue's request (continue_reply) reaches the engine process's LLM.chat."""
    conversation = [*MESSAGES, {"role": "assistant", "content": "The quick brown fox"}]
    short = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(str(tiny_llama_dir), max_model_len=128, threads=1) as local:
        want = _final(local.chat(conversation, short, continue_reply=True)).token_ids
        closed = _final(local.chat(conversation, short)).token_ids
    assert want != closed  # (continued from the open reply, not after a closed one)
    child.speculation = SpeculationConfig(mode="sd", k=3)
    assert _final(child.chat(conversation, short, continue_reply=True)).token_ids == want
    assert _final(child.chat(conversation, short)).token_ids == closed


def test_an_engine_error_is_one_line_and_the_next_request_runs(child):
    with pytest.raises(EngineError, match="context limit is 128") as err:
        list(child.chat([{"role": "user", "content": "word " * 400}], GREEDY))
    assert "\n" not in str(err.value)
    assert type(err.value) is PromptTooLongError  # its kind too (the app tells a system prompt that does not fit)
    assert _final(child.chat(MESSAGES, GREEDY)).finish_reason is FinishReason.LENGTH


def test_cancel_and_an_abandoned_stream_leave_it_clean(child):
    cancel = threading.Event()
    long = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    events = []
    for event in child.chat(MESSAGES, long, cancel=cancel):
        events.append(event)
        if len(events) == 2:
            cancel.set()
    assert _final(events).finish_reason is FinishReason.CANCELLED
    stream = child.chat(MESSAGES, long)
    next(stream)
    stream.close()  # left early: the rest is cancelled and read
    assert len(_final(child.chat(MESSAGES, GREEDY)).token_ids) == 24


def test_a_cancel_lands_between_the_chunks_of_a_long_prompt(tiny_llama_dir):
    """The engine process relays each chunk's PrefillProgress, and reads a cancel after it: the prefill stops
    part-way (Esc on a long paste does not wait for the whole prompt). About 200 chunks of 2 tokens: the cancel,
    set at the first report, lands long before the last, even on a loaded machine."""
    engine = EngineProcess(str(tiny_llama_dir), max_model_len=512, threads=1, prefill_chunk_tokens=2)
    try:
        cancel = threading.Event()
        words = [{"role": "user", "content": "one two three four five six " * 20}]
        events = []
        for event in engine.chat(words, GREEDY, cancel=cancel):
            events.append(event)
            cancel.set()
        progress = [e for e in events if isinstance(e, PrefillProgress)]
        assert progress and progress[0].total > 150 * 2
        assert progress[-1].done < progress[-1].total  # it stopped part-way
        assert _final(events).finish_reason is FinishReason.CANCELLED and not _final(events).token_ids
    finally:
        engine.close()


def test_a_warm_up_caches_a_conversation_for_its_next_turn_and_yields_to_a_request(tiny_llama_dir):
    """`warm` (a resumed chat's turns, a system prompt): the next turn after them reuses their whole blocks; sent
    and at once followed by a request, the warm-up gives way (the request is answered whole); a conversation past
    the context limit warms nothing and breaks nothing. (Its prompt is one prefill chunk here, which no request cuts
    short: with several, the chat sent at once after it would.)"""
    engine = EngineProcess(str(tiny_llama_dir), max_model_len=512, threads=1, block_size=4)
    try:
        history = [{"role": "system", "content": "Answer in one short sentence, in plain words, and nothing else."},
                   {"role": "user", "content": "What is the capital of France?"},
                   {"role": "assistant", "content": "Paris is the capital of France."}]
        turn = [*history, {"role": "user", "content": "And of Spain?"}]
        cold = _final(engine.chat([*history[:1], {"role": "user", "content": "Hi"}], GREEDY)).stats
        assert engine.warm(history)
        warmed = _final(engine.chat(turn, GREEDY)).stats
        shared = len(engine.encode_chat(history)) - 8  # (the reply's header at the end is the next turn's too)
        assert warmed.reused_prefix_tokens >= shared > cold.reused_prefix_tokens, (warmed, cold)
        other = [{"role": "system", "content": "Another system prompt, which nothing has cached: " + "word " * 20},
                 {"role": "user", "content": "Hi"}]
        assert engine.warm(other[:1])  # then at once a request: it goes first, whole
        assert len(_final(engine.chat(turn, GREEDY)).token_ids) == 24
        assert engine.warm([{"role": "user", "content": "word " * 600}])  # past the limit: logged, nothing else
        assert _final(engine.chat(other, GREEDY)).finish_reason is FinishReason.LENGTH
        spec = SpeculationConfig(mode="ar", k=2)  # the chat's mode goes with it (an SSD chat's draft prefills too)
        assert engine.warm(history, spec) and engine.speculation == spec
        engine.speculation = SpeculationConfig(mode="ar", k=3)  # (and the exchange after it is in step)
        assert engine.speculation.k == 3 and _final(engine.chat(turn, GREEDY)).stats.reused_prefix_tokens >= shared
    finally:
        engine.close()


def test_a_load_failure_is_an_engine_error_and_log_lines_reach_the_app(tmp_path, tiny_llama_dir, caplog):
    with pytest.raises(EngineError, match=r"config\.json"):
        EngineProcess(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="engine"):
        engine = EngineProcess(str(tiny_llama_dir), threads=1)
        engine.close()
    assert any("loading" in r.getMessage() for r in caplog.records if r.name == "engine")
    assert not engine._proc.is_alive()


def test_the_engine_process_ends_with_the_app(tiny_llama_dir):
    script = textwrap.dedent(f"""
        import os, sys
        from ssd_chat.tui.engine_process import EngineProcess
        from ssd_chat.tui import child_stderr
        engine = EngineProcess({str(tiny_llama_dir)!r}, threads=1)
        print(engine._proc.pid, child_stderr._files[-1], flush=True)
        os._exit(0)  # the app dies without closing it (nor printing its engine's stderr file)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    pid, stderr_file = out.stdout.split()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(int(pid)):
        time.sleep(0.2)
    assert not _alive(int(pid))
    assert not Path(stderr_file).exists()  # the engine process removed it: nobody was left to print it


def test_killed_mid_reply_the_app_leaves_an_engine_process_that_closes_quietly(tiny_llama_dir):
    """`kill -9` of the chat app while a reply streams in SSD: the engine process's next write meets the broken
    pipe; it closes its engine (the draft process, the shared-memory block) and ends without a word. run() returns
    once every process holding the app's stderr (the engine's, its draft's, the resource tracker) has ended."""
    tiny = str(tiny_llama_dir)
    core = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    script = textwrap.dedent(f"""
        import os, signal
        from engine import SamplingParams
        from engine.config import SpeculationConfig
        from engine.outputs import TokenDelta
        from ssd_chat.tui.engine_process import EngineProcess
        engine = EngineProcess({tiny!r}, draft={tiny!r}, max_model_len=512, threads=1, draft_device="cpu:{core}")
        engine.speculation = SpeculationConfig(mode="ssd", k=3)
        params = SamplingParams(temperature=0.0, max_tokens=100000, ignore_eos=True)
        stream = engine.chat([{{"role": "user", "content": "Paris is"}}], params)
        next(e for e in stream if isinstance(e, TokenDelta))
        print(engine._proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == -9, out.stderr
    pid = int(out.stdout.split()[0])
    assert out.stderr == ""  # no "the engine failed" and its BrokenPipeError, no leaked-block warning
    assert not _alive(pid)
    assert not list(Path("/dev/shm").glob(f"{shm_channel.PREFIX}{pid}_*"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_ssd_with_a_draft_process_runs_inside_it(tiny_llama_dir):
    """The chat app's SSD layout: the engine process starts a draft process of its own."""
    core = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    engine = EngineProcess(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=128, threads=1,
                           draft_device=f"cpu:{core}")
    try:
        engine.speculation = SpeculationConfig(mode="ar")
        want = _final(engine.chat(MESSAGES, GREEDY)).token_ids
        engine.speculation = SpeculationConfig(mode="ssd", k=3)
        assert "own process" in engine.layout["draft"]
        assert _final(engine.chat(MESSAGES, GREEDY)).token_ids == want
    finally:
        engine.close()
    assert not engine._proc.is_alive()
    assert engine._proc.exitcode == 0  # it closed its engine and ended itself (_exit_now), not killed by close()
    assert not list(Path("/dev/shm").glob(f"{shm_channel.PREFIX}{engine._proc.pid}_*"))


def test_stop_loading_kills_an_engine_process_that_is_still_loading(tiny_llama_dir):
    """Quitting on the loading screen: the load cannot stop half-way, its process can (the spawned child takes
    seconds to import torch, so it is still loading when it is stopped)."""
    from ssd_chat.tui import engine_process

    assert not engine_process.stop_loading()  # none loading: nothing to stop
    failed: list[Exception] = []

    def build() -> None:
        try:
            EngineProcess(str(tiny_llama_dir), threads=1).close()
        except RuntimeError as err:
            failed.append(err)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 30
    while not engine_process._loading and time.monotonic() < deadline:
        time.sleep(0.005)
    (proc,) = list(engine_process._loading)
    assert engine_process.stop_loading()
    thread.join(30)
    assert not thread.is_alive() and not proc.is_alive()
    assert failed and str(failed[0]) == "the engine process was killed by SIGKILL"
    assert not engine_process._loading


def test_kill_stops_it_mid_stream_and_removes_its_shared_memory(tiny_llama_dir):
    """Quitting during a step that runs long: kill() stops the process (and its draft process) at once; its SSD block is
    unlinked and dropped from the resource tracker; the stream under way raises."""
    from pathlib import Path

    from engine import shm_channel

    core = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    engine = EngineProcess(str(tiny_llama_dir), draft=str(tiny_llama_dir), max_model_len=128, threads=1,
                           draft_device=f"cpu:{core}")
    engine.speculation = SpeculationConfig(mode="ssd", k=3)
    pid = engine._proc.pid
    blocks = sorted(p.name for p in Path("/dev/shm").glob(f"{shm_channel.PREFIX}{pid}_*"))
    if shm_channel.available():
        assert len(blocks) == 1
    stream = engine.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    next(stream)
    engine.kill()
    assert not engine._proc.is_alive()
    with pytest.raises(RuntimeError, match="engine process"):
        list(stream)
    assert not list(Path("/dev/shm").glob(f"{shm_channel.PREFIX}{pid}_*"))
    engine.close()


def test_a_dead_engine_process_keeps_its_pid_until_closed(tiny_llama_dir):
    """`alive` peeks without reaping: a killed child stays a zombie, so another ssd-chat's sweep of dead leaders'
    shared memory (which goes by the pid) leaves its blocks to this app, which removes and unregisters them when it
    closes the child."""
    import signal

    from engine import shm_channel

    engine = EngineProcess(str(tiny_llama_dir), max_model_len=128, threads=1)
    pid = engine._proc.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while engine.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.alive and engine._exit_code() == -signal.SIGKILL
    assert shm_channel._running(pid)  # still a zombie: its blocks are not "stale" to other processes
    with pytest.raises(RuntimeError, match=r"^the engine process was killed by SIGKILL$"):  # (not "Broken pipe")
        list(engine.chat(MESSAGES, GREEDY))
    assert shm_channel._running(pid)
    engine.close()
    assert not shm_channel._running(pid)


def test_the_chat_apps_engine_starts_before_the_app_and_a_restart_starts_another(tiny_llama_dir, monkeypatch):
    """cli._engine_loader starts the engine process at once (it loads while the app starts); the app's first load
    waits for that one, a later load (/restart) starts a new one."""
    from ssd_chat import cli
    from ssd_chat.tui import engine_process

    load = cli._engine_loader(str(tiny_llama_dir), dict(threads=1, max_model_len=128))
    (started,) = list(engine_process._loading)  # spawned by the loader, before any load was asked for
    first = load()
    assert first._proc is started and not engine_process._loading
    want = _final(first.chat(MESSAGES, GREEDY)).token_ids
    second = load()
    try:
        assert second._proc is not started and _final(second.chat(MESSAGES, GREEDY)).token_ids == want
    finally:
        first.close()
        second.close()
    monkeypatch.setenv(engine_process.ENV, "0")  # the engine in the app's process: an LLM, built by each load
    llm = cli._engine_loader(str(tiny_llama_dir), dict(threads=1, max_model_len=128))()
    with llm:
        assert isinstance(llm, LLM) and not engine_process._loading


def test_closing_an_engine_that_is_still_loading_kills_it(tiny_llama_dir):
    """A child still loading reads no message until it is done: close() (the app's exit on a Ctrl-C before its UI
    is up) kills it rather than waiting for its load and then its close."""
    from ssd_chat.tui import engine_process

    engine = EngineProcess.start(str(tiny_llama_dir), threads=1)  # spawned: importing torch for a second or more
    engine.close()
    assert not engine._proc.is_alive() and engine._proc.exitcode == -9
    assert engine._proc not in engine_process._loading
