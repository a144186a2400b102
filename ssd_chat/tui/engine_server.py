"""The engine process's side of the chat app's pipe (engine_process.EngineProcess starts it): load the engine,
answer the app's messages (a reply's events as they come, a cancel between steps), forward the engine's log lines,
and end quietly, the engine closed, when the app is gone (killed, or it crashed)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque

from engine.chat import turn_prefix
from engine.errors import EngineError
from engine.outputs import EngineWarning, not_also_an_event
from engine.sampling_params import SamplingParams
from ssd_chat.tui import child_stderr

ENGINE_LOGGER = "engine"
WATCH_S = 1.0  # how often the engine process looks for its app, and how long it then waits for its main thread
CLOSE_GRACE_S = 30.0  # the most a close begun when the app was gone may take


class _ToParent(logging.Handler):
    def __init__(self, pipe) -> None:
        super().__init__(logging.INFO)
        self.pipe = pipe
        self.addFilter(not_also_an_event)

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


def serve(pipe, parent: int, target: str, kwargs: dict, stderr_path: str | None = None) -> None:
    """The child: load the engine, then answer the parent's messages until "close", or until the parent is gone:
    then it closes the engine (its draft and TP processes, its shared memory) and ends, quietly. Its stderr goes
    to `stderr_path` (child_stderr: never over the app's screen), removed here if the app is gone."""
    if stderr_path is not None:
        child_stderr.redirect(stderr_path)
    from engine import LLM

    global _stderr_file
    _stderr_file = None if stderr_path is None else (stderr_path, parent)
    closing = threading.Event()
    threading.Thread(target=_watch, args=(parent, closing), daemon=True).start()
    wire = _Wire(pipe)
    engine_log = logging.getLogger(ENGINE_LOGGER)
    engine_log.setLevel(logging.INFO)
    engine_log.propagate = False
    engine_log.addHandler(_ToParent(pipe))
    try:
        llm = LLM(target=target, companion_pids=(parent,), **kwargs)  # (the app's work is no other program's)
    except EngineError as err:
        _tell_load_failure(wire, str(err), stderr_path)
        return
    except Exception as err:  # a bug or a broken install: one line for the app, the rest in this log
        logging.getLogger(__name__).exception("loading the engine failed")
        _tell_load_failure(wire, f"loading the engine failed: {err!r}", stderr_path)
        return
    try:
        wire.send(("ready", (llm.config, llm.max_model_len, llm.speculation, llm.layout, TokenDecoder(llm.tokenizer),
                             llm.vocab_size)))
        cache_turn_prefix(llm)  # (while the user types the first message)
        _answer(llm, wire)
    except _AppGone:  # (its pipe closed, maybe before this process was handed to a new parent: unlink it here)
        _remove(stderr_path)
    finally:
        closing.set()
        llm.close()
        _exit_now()


class TokenDecoder:
    """The engine's tokenizer as the app uses it, `decode(ids)` (engine_worker.token_texts: each token's text for
    the provenance colours), pickled as the `tokenizers` library's tokenizer alone where that decodes the same. The
    app unpickled transformers' whole tokenizer, importing transformers: 1.1 s between the engine's "ready" and the
    app's. A tokenizer that cleans up spaces after decoding (transformers' step, not the library's), or whose class
    decodes in a way of its own, goes whole."""

    def __init__(self, tokenizer) -> None:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        backend = getattr(tokenizer, "backend_tokenizer", None)
        light = (backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
                 and getattr(type(tokenizer), "_decode", None) is TokenizersBackend._decode)
        self._backend, self._tokenizer = (backend, None) if light else (None, tokenizer)

    def decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)  # (transformers' default: special ones kept)
        return self._tokenizer.decode(ids)


def cache_turn_prefix(llm, messages: list[dict[str, str]] | None = None, stop=lambda: False) -> int:
    """Prefill the whole blocks of what the next user turn after `messages` starts with into the prefix cache
    (engine.chat.turn_prefix; none: the chat template's opening, with no system message of the app's), so the next
    reply reuses them; the prompt tokens cached. With no messages the first reply's TTFT was the later ones' plus about
    16 prompt tokens' prefill; after a resumed chat's history, or a long system prompt, its whole prefill. `stop()` is
    asked between the prefill's chunks: True (a request of the app's waits) cancels the rest (the chunks done stay
    cached)."""
    if not llm.config.enable_prefix_caching:
        return 0
    try:
        prefix = turn_prefix(llm.tokenizer, messages or [], model=llm.config.target)
        whole = len(prefix) - len(prefix) % llm.config.block_size
        if whole:  # (a stream, closed on a failure: its request is cancelled, its blocks freed)
            once, cancel = SamplingParams(temperature=0.0, max_tokens=1), threading.Event()
            with contextlib.closing(llm.stream(prefix[:whole], once, cancel=cancel)) as events:
                for event in events:
                    if isinstance(event, EngineWarning):  # (a reply's would come as its event: here no one reads it)
                        logging.getLogger(ENGINE_LOGGER).warning("%s", event.message)
                    if not cancel.is_set() and stop():
                        cancel.set()
    except EngineError as err:  # (no chat template, a conversation past the context: nothing to cache)
        logging.getLogger(__name__).info("the next turn's opening was not cached: %s", err)
        return 0
    except _AppGone:
        raise
    except Exception:  # a failure here is the next reply's to report ("failed"), not the end of this process
        logging.getLogger(__name__).exception("caching the next turn's opening failed")
        return 0
    return whole


def _tell_load_failure(wire: _Wire, line: str, stderr_path: str | None) -> None:
    """The failed load's one line to the app. Where the app is gone (killed while this process loaded), nobody is
    left to print this process's stderr file: it goes (the process then returns, and its watch with it)."""
    try:
        wire.send(("error", line))
    except _AppGone:
        _remove(stderr_path)


def _remove(stderr_path: str | None) -> None:
    if stderr_path is not None:
        with contextlib.suppress(OSError):
            os.unlink(stderr_path)


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
            elif kind == "warm":  # (no answer: the app does not wait; a request of its own cuts it short)
                if message[2] is not None:  # the chat's mode: an SSD chat's draft process prefills too, an AR one's not
                    llm.speculation = message[2]
                cache_turn_prefix(llm, message[1], stop=lambda: bool(pending) or wire.poll())
            elif kind == "chat" and _stream(llm, wire, message[1], message[2], message[3], pending):
                return  # a close arrived while the reply streamed
        except _AppGone:
            raise
        except EngineError as err:
            wire.send(("error", err))  # (its kind too: a PromptTooLongError stays one)
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
    _remove_if_orphaned()
    os._exit(0)


_stderr_file: tuple[str, int] | None = None  # this process's stderr file and its app's pid (serve sets it)


def _remove_if_orphaned() -> None:
    """Where the app is gone (killed), nobody is left to print this process's stderr file: it goes."""
    if _stderr_file is not None and os.getppid() != _stderr_file[1]:
        _remove(_stderr_file[0])


def _stream(llm, wire: _Wire, messages, params, continue_reply: bool, pending: deque) -> bool:
    """One request's events to the parent; a "cancel" or "close" between steps cancels it, anything else waits in
    `pending`. Returns whether a "close" came. Left early (the app gone), the request is cancelled."""
    cancel, closing = threading.Event(), False
    with contextlib.closing(llm.chat(messages, params, cancel=cancel, continue_reply=continue_reply)) as events:
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
    _remove_if_orphaned()
    os._exit(0)
