"""SIGTERM (`kill`) and SIGHUP (the terminal closed) stop ssd-chat the way Ctrl-C does.

By default either signal ended the process at once: the chat app lost the reply it was writing, and a closed
terminal (SIGHUP reaches the whole process group) also ended multiprocessing's resource tracker before it could
remove SSD's shared-memory block. Now the leader takes them: in the CLI commands they raise KeyboardInterrupt
(whatever Ctrl-C stops and cleans up, they do too), in the chat app they quit as Ctrl+Q does (ChatApp), and the
children start with SIGHUP blocked (engine.spawning.interrupts_blocked) so that the leader can stop them. The
exit code is 128 + the signal's number, as for a process the signal ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio  # (its import is 45 ms of every start; the chat app has it loaded already)
    from types import FrameType

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
HANGUP_EXIT_S = 5.0  # after a hangup the process ends by this time, whatever it waits on
_AGAIN_S = 0.005  # a signal that came where KeyboardInterrupt would go wrong comes again after this (_not_here)
_AGAIN_MAX = 200  # in eval'd code at most this many times in a row (a second), then it is raised wherever it comes
_again_count = 0  # how many times in a row it came again into eval'd code
_received: int | None = None  # the first stop signal that came
_deferred: int | None = None  # that signal, while it waits to come again (_not_here)
_before_forced_exit: list[Callable[[], object]] = []  # what the hangup's forced exit runs first (before_forced_exit)


def _first(signum: int) -> bool:
    """Record `signum` if it is the first stop signal (a second must not break the cleanup the first started);
    after a hangup, the output leaves the closed terminal. Whether it was the first."""
    global _received
    if _received is not None:
        return False
    _received = signum
    if hung_up():
        detach_terminal()
    return True


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    global _deferred
    if not _first(signum) and _deferred is None:
        return
    _deferred = signum  # (before the signal can come again: it must find itself waited for)
    if _waits(signum, frame):
        return
    _deferred = None
    raise KeyboardInterrupt


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: KeyboardInterrupt at every press, as Python's own handler raises it, but not where it goes wrong."""
    if not _waits(signum, frame):
        raise KeyboardInterrupt


def _waits(signum: int, frame: FrameType | None) -> bool:
    """Whether `signum` comes again a moment later rather than KeyboardInterrupt now, where the code it interrupted
    would lose it (`_not_here`)."""
    global _again_count
    where = _not_here(frame)
    if where is None or (where == "eval" and _again_count >= _AGAIN_MAX) or not _again_later(signum):
        _again_count = 0
        return False
    _again_count += where == "eval"
    return True


def _not_here(frame: FrameType | None) -> str | None:
    """Where KeyboardInterrupt raised in the code the signal interrupted would go wrong (None: it would not):
    - "finalizer": inside a `__del__`, at any depth. The exception goes nowhere: Python prints "Exception ignored
      in ... __del__" with its traceback and carries on, so the stop was lost (the run went on to its end) and
      stderr got a traceback (a tokenizer's regex object, collected as a start-up's signal came). It comes again
      until the finalizer has returned;
    - "eval": in code that `eval` or `exec` compiled from a string ("<string>"), where the signal came (the
      outermost frame aside: `python -c`'s program). An interrupt leaving it marks the interpreter's run as ended
      by an uncaught Ctrl-C, even once caught, and `python -m ssd_chat` then died of SIGINT instead of exiting
      with its code (a namedtuple's class, made as transformers imported). Only where it came, and at most
      _AGAIN_MAX times in a row: a program that runs whole under such code (pytest-xdist's workers do) would
      never take the signal."""
    if frame is not None and frame.f_code.co_filename == "<string>" and frame.f_back is not None:
        return "eval"
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return "finalizer"
        frame = frame.f_back
    return None


def _again_later(signum: int) -> bool:
    """`signum` to the main thread again in a moment (_AGAIN_S); False where it cannot be (no pthread_kill, as on
    Windows; no thread to be had, as at the interpreter's shutdown)."""
    if not hasattr(signal, "pthread_kill"):
        return False
    timer = threading.Timer(_AGAIN_S, signal.pthread_kill, (threading.main_thread().ident, signum))
    timer.daemon = True
    try:
        timer.start()
    except RuntimeError:
        return False
    return True


def install() -> None:
    """From now on a stop signal raises KeyboardInterrupt in the main thread (once), and Ctrl-C raises it as
    before; neither where the interrupt would go wrong (`_not_here`): there it comes again a moment later."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


@contextlib.contextmanager
def pythons_ctrl_c() -> Iterator[None]:
    """Ctrl-C (SIGINT) by Python's own handler inside the block: asyncio's runner (the chat app's Textual loop)
    installs its own, which cancels the main task, only over that one (with ours, a `kill -INT` raised
    KeyboardInterrupt anywhere in the event loop)."""
    ours = signal.getsignal(signal.SIGINT) is _interrupt
    if ours:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, _interrupt)


def hung_up() -> bool:
    return _received == getattr(signal, "SIGHUP", None)


def detach_terminal() -> None:
    """After a hangup: stdout and stderr, where they are the terminal, go to /dev/null, since writes to the closed
    terminal fail (EIO). A pipe or a file keeps what comes."""
    ttys = []
    for target in (1, 2):
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(os.fstat(target).st_mode):
                ttys.append(target)
    _devnull_over(ttys)


def _devnull_over(fds: list[int]) -> None:
    """/dev/null in place of each of `fds` (writes there then succeed, and vanish)."""
    fd = os.open(os.devnull, os.O_WRONLY)
    for target in fds:
        os.dup2(fd, target)
    os.close(fd)


def exit_if_hung_up() -> None:
    """After a hangup, once the engine is stopped and the conversation saved: end the process without the
    terminal's restoring (there is none). Textual's shutdown wrote to it, and its writer thread, dead of EIO, or
    its SIGCONT handler, restarting the screen, left the app hung with a full queue."""
    if hung_up():
        logging.shutdown()
        os._exit(128 + _received)


def before_forced_exit(cleanup: Callable[[], object]) -> None:
    """Run `cleanup` (quick: it must not wait on what the quit waits on) before the hangup's forced exit ends the
    process, which runs no atexit handler: what the process would otherwise leave behind (the engine's stderr file
    in /tmp, child_stderr)."""
    _before_forced_exit.append(cleanup)


def _exit_later(seconds: float) -> None:
    """The last resort after a hangup: whatever the app's quit waits on, the process ends (its engine's process,
    its pipe closed, ends too, and the resource tracker removes what it left), once the cleanups registered with
    before_forced_exit have run."""
    timer = threading.Timer(seconds, _forced_exit)
    timer.daemon = True
    timer.start()


def _forced_exit() -> None:
    for cleanup in list(_before_forced_exit):
        try:
            cleanup()
        except Exception:  # (one that fails must not keep the process from ending, nor the others from running)
            logging.getLogger(__name__).debug("a cleanup before the forced exit failed", exc_info=True)
    os._exit(128 + (_received or 0))


def call_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[int], object]) -> Callable[[], None]:
    """While an event loop runs in the main thread (the chat app's): a stop signal calls `callback(signum)` in it
    instead of raising. A hangup first sends the output to /dev/null (`_first`), removes the SIGCONT handler
    (Textual's, which the closed terminal's SIGCONT would run to restart the screen) and starts `_exit_later`.
    Returns what puts the handlers before back. Outside the main thread it does nothing (a test's loop)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def taken(signum: int, frame: object) -> None:
        global _deferred
        if not _first(signum) and _deferred is None:  # (one _raise_interrupt waited out before: taken now)
            return
        _deferred = None
        if hung_up():  # (a Python handler: it runs before SIGCONT's, which comes with it and has a higher number)
            signal.signal(signal.SIGCONT, signal.SIG_DFL)
            _exit_later(HANGUP_EXIT_S)
        loop.call_soon_threadsafe(callback, signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, taken)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def exiting() -> None:
    """The run is over and cleaned up: a late Ctrl-C (or stop signal) must not print a traceback over the exit."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)


def received() -> int | None:
    """The first stop signal that came (None: none)."""
    return _received


def reader_gone() -> int:
    """stdout's reader went away (`ssd-chat ask ... | head`): the run ends as a filter that SIGPIPE ended, quietly
    with 128 + SIGPIPE. (Python ignores SIGPIPE, so the write raised BrokenPipeError instead.) Call it once the run
    is cleaned up. stdout, and stderr where it is the same pipe, go to /dev/null: the interpreter's last flush of
    what is still buffered would fail again and print "Exception ignored ... BrokenPipeError". Returns the code."""
    try:
        same = os.path.sameopenfile(1, 2)
    except OSError:  # (stderr closed: `2>&-`)
        same = False
    _devnull_over([1, 2] if same else [1])
    return 128 + getattr(signal, "SIGPIPE", 13)


@contextlib.contextmanager
def quiet_when_the_reader_goes() -> Iterator[None]:
    """`... | head`: a write to stdout after its reader went away ends the command quietly with 128 + SIGPIPE, as
    SIGPIPE ends a filter (`reader_gone`), once what it opened is closed (the exception left those `with` blocks).
    Click's own handling of it would exit with 1."""
    import typer

    try:
        yield
    except BrokenPipeError:
        raise typer.Exit(reader_gone()) from None


def stdout_flushed(code: int) -> int:
    """`code`, once what stdout still buffers is written; reader_gone's where its reader went away meanwhile (a
    reply's last text was out, its closing newline not). The interpreter's own flush at exit met the broken pipe
    there, and exited with 120 and "Exception ignored ... BrokenPipeError" instead."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    return code


def exit_code(code: int) -> int:
    """`code`, or 128 + the stop signal's number when one stopped the run."""
    return code if _received is None else 128 + _received
