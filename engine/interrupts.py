"""Holding a Ctrl-C (or `kill`, or a closed terminal) until a step that must not be cut is done.

Python runs a signal's handler in the main thread at its next bytecode, which may be inside a C or Rust extension's
call back into Python. safetensors' `get_tensor` then turned the KeyboardInterrupt into an unrelated error ("could
not determine the shape of object type 'torch.storage.UntypedStorage'"): a traceback instead of a clean exit, or
a panel-cache entry rebuilt and the load carried on, the interrupt lost; and an SSD round cut half-way left the
draft process out of step. Inside `held()` the main thread's handlers only record a signal; the first one recorded
is handled when the block ends (a second Ctrl-C at once). No torch here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGHUP", "SIGTERM") if hasattr(signal, name)
)
_holding = False  # a held() block is open (in the main thread): one inside it holds nothing more


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Signals that come inside the block are handled once it ends (in the main thread; elsewhere the main thread's
    handlers run anyway, so there is nothing to hold). A handler that a signal racing the block's end leaves in
    place passes every later signal on to the one it stood in for. Inside another held() block it adds nothing
    (a step's cancels, a close's): the outer one handles what comes when it ends."""
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {sig: h for sig in SIGNALS if callable(h := signal.getsignal(sig))}
    came: list[int] = []
    holding = [True]

    def record(signum: int, frame: object) -> None:
        if not holding[0]:  # left in place: as if it were not there
            handlers[signum](signum, frame)
            return
        came.append(signum)
        if signum == signal.SIGINT and len(came) > 1:  # a second Ctrl-C: now (a first compiled step takes long)
            handlers[signum](signum, frame)

    installed = []
    _holding = True
    try:
        for sig in handlers:
            signal.signal(sig, record)
            installed.append(sig)
        yield
    finally:
        _holding = holding[0] = False
        for sig in installed:
            signal.signal(sig, handlers[sig])
    if came:
        handlers[came[0]](came[0], None)  # e.g. KeyboardInterrupt, now that the step is whole
