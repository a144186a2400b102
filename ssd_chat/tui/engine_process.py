"""The chat app's engine in a process of its own, behind the same interface as `engine.LLM` (`ChatEngine`).

In the app's process the engine's thread shares the GIL with Textual's: it takes the GIL back after each of its
kernel calls, about twenty a step, and while a reply streams the UI thread renders it. On the 2-vCPU VM a reply
then decoded at 51-54 tok/s where the plain mode gave 148 (AR, both cores), the engine's threads busy only half the
time. Here the engine runs in a spawned child, which owns the cores it is given, and talks to the app over a pipe:
a request's events come back as they happen (pickled dataclasses), a cancel goes the other way, the engine's log
lines (the loading screen's) are forwarded, and an EngineError stays an EngineError with its one-line message.
``SSD_CHAT_ENGINE_PROCESS=0`` keeps the engine in the app's process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from engine import spawning
from engine.config import SpeculationConfig
from engine.errors import EngineError
from engine.outputs import Event, RequestFinished
from engine.sampling_params import SamplingParams
from engine.shm_channel import release_blocks_of
from engine.spawning import ensure_resource_tracker

ENV = "SSD_CHAT_ENGINE_PROCESS"
ENGINE_LOGGER = "engine"
WATCH_S = 1.0  # how often the engine process looks for its app, and how long it then waits for its main thread
CLOSE_GRACE_S = 30.0  # the most a close begun when the app was gone may take
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
        self._proc = mp.get_context("spawn").Process(target=_serve, args=(child_end, os.getpid(), target, kwargs),
                                                     name="ssd-chat-engine")
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
        self.config, self.max_model_len, self._speculation, self.layout, self.tokenizer = payload
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

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
             cancel: threading.Event | None = None) -> Iterator[Event]:
        with self._lock:
            self._send(("chat", messages, params))
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
        return self._exit_code() is None

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
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"the engine process is gone ({exc})") from None

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
                raise RuntimeError(f"the engine process stopped (exit code {self._exit_code()})") from exc
            if kind != "log":
                return kind, payload
            level, line = payload
            logging.getLogger(ENGINE_LOGGER).log(level, "%s", line)

    def _check_alive(self) -> None:
        code = self._exit_code()
        if code is not None and not self._pipe.poll():
            raise RuntimeError(f"the engine process stopped (exit code {code})")


def _failure(kind: str, message: str) -> Exception:
    """The child's "error" (a user error, one line) or "failed" (the engine broke) as this process's exception."""
    return EngineError(message) if kind == "error" else RuntimeError(message)


class _ToParent(logging.Handler):
    def __init__(self, pipe) -> None:
        super().__init__(logging.INFO)
        self.pipe = pipe

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.pipe.send(("log", (record.levelno, record.getMessage())))


class _AppGone(Exception):
    """The pipe to the app broke or closed: the app is gone (killed, or it crashed)."""


class _Wire:
    """The child's end of the pipe, where a broken or closed pipe is `_AppGone`, told apart from the engine's own
    errors (an OSError of the engine's is a failure to report)."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe

    def send(self, message) -> None:
        try:
            self.pipe.send(message)
        except OSError as exc:
            raise _AppGone from exc

    def recv(self):
        try:
            return self.pipe.recv()
        except (EOFError, OSError) as exc:
            raise _AppGone from exc

    def poll(self) -> bool:
        try:
            return self.pipe.poll()
        except OSError as exc:
            raise _AppGone from exc


def _serve(pipe, parent: int, target: str, kwargs: dict) -> None:
    """The child: load the engine, then answer the parent's messages until "close", or until the parent is gone:
    then it closes the engine (its draft and TP processes, its shared memory) and ends, quietly."""
    from engine import LLM

    closing = threading.Event()
    threading.Thread(target=_watch, args=(parent, closing), daemon=True).start()
    wire = _Wire(pipe)
    engine_log = logging.getLogger(ENGINE_LOGGER)
    engine_log.setLevel(logging.INFO)
    engine_log.propagate = False
    engine_log.addHandler(_ToParent(pipe))
    try:
        llm = LLM(target=target, **kwargs)
    except EngineError as err:
        with contextlib.suppress(_AppGone):
            wire.send(("error", str(err)))
        return
    except Exception as err:  # a bug or a broken install: one line for the app, the rest in this log
        logging.getLogger(__name__).exception("loading the engine failed")
        with contextlib.suppress(_AppGone):
            wire.send(("error", f"loading the engine failed: {err!r}"))
        return
    try:
        wire.send(("ready", (llm.config, llm.max_model_len, llm.speculation, llm.layout, llm.tokenizer)))
        _answer(llm, wire)
    except _AppGone:
        pass
    finally:
        closing.set()
        llm.close()
        _exit_now()


def _answer(llm, wire: _Wire) -> None:
    """Answer the app's messages until "close". An engine error goes back as one line, a failure as "failed"
    (with its traceback in this process's log); _AppGone, from any read or write, ends it."""
    pending: deque = deque()  # messages that came while a reply streamed (the app's next one, once it has the last)
    while True:
        message = pending.popleft() if pending else wire.recv()
        kind = message[0]
        if kind == "close":
            return
        try:
            if kind == "spec":
                llm.speculation = message[1]
                wire.send(("ok", (llm.speculation, llm.layout)))
            elif kind == "encode":
                wire.send(("ok", llm.encode_chat(message[1])))
            elif kind == "chat" and _stream(llm, wire, message[1], message[2], pending):
                return  # a close arrived while the reply streamed
        except _AppGone:
            raise
        except EngineError as err:
            wire.send(("error", str(err)))
        except Exception as err:
            logging.getLogger(__name__).exception("the engine failed")
            wire.send(("failed", f"{type(err).__name__}: {err}"))


def _exit_now() -> None:
    """End the child once its engine is closed (its ranks stopped, its shared memory removed), skipping the
    interpreter's teardown: freeing torch's and the models' objects one by one took 0.5 s of every quit."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _stream(llm, wire: _Wire, messages, params, pending: deque) -> bool:
    """One request's events to the parent; a "cancel" or "close" between steps cancels it, anything else waits in
    `pending`. Returns whether a "close" came. Left early (the app gone), the request is cancelled."""
    cancel, closing = threading.Event(), False
    with contextlib.closing(llm.chat(messages, params, cancel=cancel)) as events:
        for event in events:
            wire.send(("event", event))
            while wire.poll():
                message = wire.recv()
                closing |= message[0] == "close"
                if message[0] in ("cancel", "close"):
                    cancel.set()
                else:
                    pending.append(message)
    return closing


def _watch(parent: int, closing: threading.Event) -> None:
    """Exit when the app's process is gone (killed, or it crashed) while this one loads or runs a long step:
    nothing else would stop it. Otherwise its main thread meets the broken pipe at its next read or write and
    closes the engine, which ends the process: a close under way gets CLOSE_GRACE_S."""
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    if closing.wait(WATCH_S):
        time.sleep(CLOSE_GRACE_S)  # (a deadline: the close ends the process before it)
    os._exit(0)
