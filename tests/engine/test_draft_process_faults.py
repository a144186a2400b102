"""SSD's draft process when things go wrong: killed or silent (every request it served goes on in AR), a step cut
by a second Ctrl-C, an engine left open at exit, and a start where stderr has no file descriptor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from engine import LLM, EngineWarning, TokenDelta
from engine.config import SpeculationConfig
from engine.outputs import RequestFinished
from engine.request import RequestState
from engine.sequence import Sequence
from tests.engine import processes
from tests.engine.processes import DRAFT_CORE, GREEDY, cut_step_then_close, outputs
from tests.engine.test_spec_decode import PROMPTS

draft_dir = processes.draft_dir  # the fixture: the tiny target with noise, SSD's draft here


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
    cut_step_then_close(llm)
    assert not drafter.alive
    drafter.proc.join(10)
    assert not drafter.proc.is_alive()


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
        want = outputs(llm, SpeculationConfig(mode="ar"))
        tokens, warnings, final = _ssd_with_a_fault(llm, PROMPTS[0], after=8, sig=signal.SIGKILL)
        assert tokens == final.token_ids == want[0]  # nothing lost, nothing repeated
        assert len(warnings) == 1 and "AR mode" in warnings[0]
        assert "the draft process died (killed by SIGKILL)" in warnings[0]  # (not "stopped after 0.0 s")
        later = list(llm.stream(PROMPTS[1], GREEDY))  # new SSD requests also run (in AR) and say so
        assert later[-1].output.token_ids == want[1]
        assert [e.draft_lost for e in later if isinstance(e, EngineWarning)] == [True]
        stats = later[-1].output.stats  # it ran in AR: reported as AR, with no speculation figures (not tau 0.00)
        assert (stats.mode, stats.spec) == ("ar", None)


def test_a_lost_draft_moves_every_request_using_it_to_ar(tiny_llama_dir, draft_dir):
    with LLM(str(tiny_llama_dir), draft=str(draft_dir), max_model_len=256, block_size=4, draft_device=DRAFT_CORE,
             threads=1) as llm:
        want = outputs(llm, SpeculationConfig(mode="ar"))
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
        want = outputs(llm, SpeculationConfig(mode="ar"))
        tokens, warnings, _ = _ssd_with_a_fault(llm, PROMPTS[2], after=6, sig=signal.SIGSTOP)  # alive but silent
        assert tokens == want[2]
        assert len(warnings) == 1 and "AR mode" in warnings[0]
        assert "the draft process did not answer for 3 s" in warnings[0]
        llm.remote.proc.join(10)
        assert not llm.remote.proc.is_alive()  # the silent process was killed, not left behind


def test_a_request_that_had_no_round_when_its_draft_went_reports_ar():
    """A request still waiting or prefilling when the draft process is lost runs all in AR: its stats say so."""
    for rounds, mode in ((0, "ar"), (1, "ssd")):
        state = RequestState(Sequence(1, [1, 2], GREEDY), None, mode="ssd", stop_ids=frozenset(), k=2)
        state.spec.steps = rounds
        state.fell_back_to_ar()
        assert state.mode == mode  # (one that ran SSD rounds keeps their figures, under SSD)
