"""The chat app's engine in a process of its own, behind the same interface as `engine.LLM` (`ChatEngine`).

In the app's process the engine's thread shares the GIL with Textual's: it takes the GIL back after each of its
kernel calls, about twenty a step, and while a reply streams the UI thread renders it. On the 2-vCPU VM a reply
then decoded at 51-54 tok/s where the plain mode gave 148 (AR, both cores), the engine's threads busy only half the
time. Here the engine runs in a spawned child, which owns the cores it is given, and talks to the app over a pipe:
a request's events come back as they happen (pickled dataclasses), a cancel goes the other way, the engine's log
lines (the loading screen's) are forwarded, and an EngineError stays one, of its kind, with its one-line message.
Its stderr goes to a file, printed once the app has quit (child_stderr).
``SSD_CHAT_ENGINE_PROCESS=0`` keeps the engine in the app's process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from engine import spawning
from engine.config import SpeculationConfig
from engine.errors import EngineError
from engine.outputs import Event, RequestFinished
from engine.sampling_params import SamplingParams
from engine.shm_channel import release_blocks_of
from engine.spawning import ensure_resource_tracker
from ssd_chat.tui import child_stderr
from ssd_chat.tui.engine_server import ENGINE_LOGGER, serve

ENV = "SSD_CHAT_ENGINE_PROCESS"
log = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


_loading: set[mp.process.BaseProcess] = set()  # engine processes that have not answered "ready" yet
_loading_lock = threading.Lock()


def stop_loading() -> bool:
    """Kill every engine process still loading (the app quits on its loading screen: a load cannot stop half-way,
    its process can); their constructors then raise. Returns whether there was one. The rank and draft processes
    such a process started watch it and exit with it."""
    with _loading_lock:
        procs = list(_loading)
    for proc in procs:
        proc.kill()
    return bool(procs)


class EngineProcess:
    """An `engine.LLM(target, **kwargs)` in a child process. Built (and loaded) by the constructor, which forwards
    the child's engine log lines to this process's "engine" logger and raises EngineError if loading failed."""

    pipe_closed = False  # the child's end of the pipe closed (it exits): nothing more can be sent, whatever its status
    EXIT_STATUS_WAIT_S = 2.0  # how long a closed pipe's error waits for the child's exit status (_stopped)

    def __init__(self, target: str, **kwargs: Any) -> None:
        """Start the child and wait until it has loaded (`start`, then `wait_ready`)."""
        self._start(target, kwargs)
        self.wait_ready()

    @classmethod
    def start(cls, target: str, **kwargs: Any) -> EngineProcess:
        """The child started, loading: call `wait_ready` before anything else. The chat app starts its engine so
        before its own UI loads, and the two loads overlap."""
        engine = cls.__new__(cls)
        engine._start(target, kwargs)
        return engine

    def _start(self, target: str, kwargs: dict) -> None:
        ensure_resource_tracker()
        self._pipe, child_end = mp.Pipe()
        stderr = str(child_stderr.new_file())  # (not the terminal: the app draws there)
        self._proc = mp.get_context("spawn").Process(target=serve, name="ssd-chat-engine",
                                                     args=(child_end, os.getpid(), target, kwargs, stderr))
        try:
            with _loading_lock:
                spawning.start(self._proc)  # a Ctrl-C before Textual has the terminal is the app's to take
                _loading.add(self._proc)
        finally:
            child_end.close()
        self._lock = threading.Lock()  # one exchange at a time (the app runs one request at a time)
        self._send_lock = threading.Lock()  # a close from the UI thread may send while a reply streams
        atexit.register(self.close)

    def wait_ready(self) -> EngineProcess:
        """Wait for the child's load, forwarding its log lines; EngineError (or RuntimeError) if it failed, or was
        stopped (stop_loading), and then it is closed."""
        try:
            kind, payload = self._receive()
            if kind != "ready":
                raise _failure(kind, payload)
        except (EngineError, RuntimeError):
            self.close()
            raise
        finally:
            with _loading_lock:
                _loading.discard(self._proc)
        self.config, self.max_model_len, self._speculation, self.layout, self.tokenizer, self.vocab_size = payload
        return self

    # -- ChatEngine ----------------------------------------------------------------------------------
    @property
    def speculation(self) -> SpeculationConfig:
        return self._speculation

    @speculation.setter
    def speculation(self, spec: SpeculationConfig) -> None:
        with self._lock:
            self._speculation, self.layout = self._call("spec", spec)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        with self._lock:
            return self._call("encode", messages)

    def warm(self, messages: list[dict[str, str]], spec: SpeculationConfig | None = None) -> bool:
        """Ask the engine to prefill what the next turn after `messages` starts with into its prefix cache (a resumed
        chat's history, a system prompt: engine_server.cache_turn_prefix), in the chat's mode `spec` (an SSD chat's
        draft process prefills it too; None: the engine's mode as it is), without waiting; its next request cuts it
        short, keeping the chunks done. Whether it was sent: not while an exchange runs (a reply, a compare)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._send(("warm", messages, spec))
            if spec is not None:
                self._speculation = spec  # (the layout follows with the next "spec" exchange)
        finally:
            self._lock.release()
        return True

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
             cancel: threading.Event | None = None, continue_reply: bool = False) -> Iterator[Event]:
        with self._lock:
            self._send(("chat", messages, params, continue_reply))
            cancelled = finished = False
            try:
                while True:
                    if cancel is not None and cancel.is_set() and not cancelled:
                        self._send(("cancel",))
                        cancelled = True
                    if not self._pipe.poll(0.05):
                        self._check_alive()
                        continue
                    kind, payload = self._receive()
                    if kind == "event":
                        finished = isinstance(payload, RequestFinished)
                        yield payload
                        if finished:
                            return
                    else:
                        finished = True
                        raise _failure(kind, payload)
            finally:
                if not finished:  # the caller left early: cancel, and read the rest so the next request starts clean
                    self._drain()

    def close(self) -> None:
        """Stop the child (its engine closes its draft and TP processes). Idempotent."""
        atexit.unregister(self.close)
        with _loading_lock:
            loading = self._proc in _loading
            _loading.discard(self._proc)
        if self._proc.is_alive() and not loading:  # one still loading reads no message before it is done: killed
            with contextlib.suppress(RuntimeError):
                self._send(("close",))  # a reply under way is cancelled first
            self._proc.join(10)
        self.kill()  # one that did not stop; and what a killed child left (nothing after its own close)
        self._pipe.close()

    @property
    def alive(self) -> bool:
        """False once the child's pipe has closed (a moment before its exit status is there to read) or it exited."""
        return not self.pipe_closed and self._exit_code() is None

    @property
    def stop_reason(self) -> str | None:
        """How the child ended ("the engine process was killed by SIGKILL"; "the engine process stopped" until its
        exit status comes after its pipe closed); None while it runs."""
        return None if self.alive else self._stopped(wait_s=0.0)

    def _exit_code(self) -> int | None:
        """The child's exit code (negative: the signal that killed it), None while it runs. A dead child is not
        reaped here: it stays a zombie, its pid taken, until close() or kill() reaps it and removes its
        shared-memory blocks at once. Reaped earlier, another ssd-chat's sweep of dead leaders' blocks
        (shm_channel.remove_stale_blocks) could remove them first, and they would stay registered with this app's
        resource tracker, which warns of leaked blocks when the app exits."""
        if not hasattr(os, "waitid"):  # macOS: no peek (exitcode reaps)
            return self._proc.exitcode
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already (close, kill, or multiprocessing's sweep when a process starts)
            return self._proc.exitcode
        if info is None:
            return None
        return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status

    def kill(self) -> None:
        """Stop the child now, mid-step: quitting while a step runs long (a cancel lands only between steps). Its
        draft and TP processes follow it; its shared-memory blocks are removed here. A stream under way then raises
        RuntimeError."""
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        release_blocks_of(self._proc.pid)

    # -- the wire --------------------------------------------------------------------------------------
    def _call(self, *message):
        self._send(message)
        kind, payload = self._receive()
        if kind != "ok":
            raise _failure(kind, payload)
        return payload

    def _send(self, message) -> None:
        try:
            with self._send_lock:
                self._pipe.send(message)
        except (OSError, ValueError) as exc:  # (a broken pipe: say how the child ended, where it has)
            self.pipe_closed = isinstance(exc, OSError) or self._pipe.closed  # (not a message it could not pickle)
            raise RuntimeError(self._stopped(wait_s=0.0) if self._exit_code() is not None
                               else f"the engine process is gone ({exc})") from None

    def _drain(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._send(("cancel",))
            while True:
                kind, payload = self._receive()
                if kind != "event" or isinstance(payload, RequestFinished):
                    return

    def _receive(self):
        while True:
            try:
                kind, payload = self._pipe.recv()
            except (EOFError, OSError) as exc:
                self.pipe_closed = True  # (before the wait for its exit status: `alive` says so at once)
                raise RuntimeError(self._stopped()) from exc
            if kind != "log":
                return kind, payload
            level, line = payload
            logging.getLogger(ENGINE_LOGGER).log(level, "%s", line)

    def _check_alive(self) -> None:
        if self._exit_code() is not None and not self._pipe.poll():
            raise RuntimeError(self._stopped())

    def _stopped(self, wait_s: float | None = None) -> str:
        """Why the child is gone, for its closed pipe: its pipe closes as it exits, a moment before its exit status
        is there to read (a killed child read "exit code None"), so this waits up to `wait_s` for it."""
        deadline = time.monotonic() + (self.EXIT_STATUS_WAIT_S if wait_s is None else wait_s)
        while (code := self._exit_code()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if code is None:
            return "the engine process stopped"
        if code < 0:
            return f"the engine process was {spawning.killed_by(code)}"
        return f"the engine process exited with code {code}"


def _failure(kind: str, payload: str | EngineError) -> Exception:
    """The child's "error" (a user error, one line: the EngineError itself, or its message) or "failed" (the engine
    broke) as this process's exception."""
    if kind == "error":
        return payload if isinstance(payload, EngineError) else EngineError(payload)
    return RuntimeError(payload)
