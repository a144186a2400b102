"""An engine process whose pipe closed (it died) is not alive from that moment, though its exit status comes a moment
later: a reply that failed on the closed pipe then says "engine stopped" itself, and the app's watch adds no second
notice. The child here is a stub (a pipe that closes after a reply's first delta, an exit status the test hands in):
a real kill is too quick to catch in between."""

from __future__ import annotations

import threading
from collections import deque

import pytest

from engine.config import SpeculationConfig
from engine.outputs import TokenDelta, TokenSource
from engine.sampling_params import SamplingParams
from ssd_chat.history import ChatSettings, HistoryStore
from ssd_chat.tui.chat_actions import RESTART
from ssd_chat.tui.engine_process import EngineProcess
from ssd_chat.tui.reply_actions import PARTIAL_KEPT
from tests.ssd_chat.tui_fakes import FakeClock, FakeConfig, rendered, send, settle

LAYOUT = {"target": "fake-target on cpu", "draft": "fake-draft on cpu"}
_EOF = object()


class _ClosingPipe:
    """The app's end of the pipe: "spec" and "encode" answered, a chat's first delta, then the child's end closes."""

    def __init__(self) -> None:
        self.replies: deque = deque()
        self.closed = self.eof = False

    def send(self, message) -> None:
        if self.eof:
            raise BrokenPipeError(32, "Broken pipe")
        kind = message[0]
        if kind == "spec":
            self.replies.append(("ok", (message[1], LAYOUT)))
        elif kind == "encode":
            self.replies.append(("ok", [0] * 8 * len(message[1])))
        elif kind == "chat":
            self.replies += [("event", TokenDelta(1, (0,), "Hello", (TokenSource.TARGET,))), _EOF]

    def poll(self, timeout: float = 0.0) -> bool:
        return True

    def recv(self):
        reply = self.replies.popleft() if self.replies else _EOF
        if reply is _EOF:
            self.eof = True
            raise EOFError
        return reply

    def close(self) -> None:
        self.closed = True


class _Child:
    """The process object: gone as far as close() and kill() are concerned."""

    pid = 2**22 + 4321  # (no shared-memory blocks of its to remove)
    exitcode = None

    def is_alive(self) -> bool:
        return False

    def kill(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


def _engine() -> tuple[EngineProcess, list[int | None]]:
    """An EngineProcess on the stubs; the list holds its exit status (None: not there yet), for the test to set."""
    engine = EngineProcess.__new__(EngineProcess)
    status: list[int | None] = [None]
    engine._pipe, engine._proc = _ClosingPipe(), _Child()
    engine._lock, engine._send_lock = threading.Lock(), threading.Lock()
    engine._exit_code = lambda: status[0]
    engine.EXIT_STATUS_WAIT_S = 0.0  # (the exit status is the test's to give)
    engine.config, engine.max_model_len, engine.layout, engine.tokenizer = FakeConfig(), 100_000, LAYOUT, None
    engine.vocab_size = 49152
    engine._speculation = SpeculationConfig(mode="sd")
    return engine, status


def test_alive_is_false_once_the_pipe_closed_and_the_reason_comes_with_the_exit_status():
    engine, status = _engine()
    assert engine.alive and engine.stop_reason is None
    with pytest.raises(RuntimeError, match="the engine process stopped"):
        list(engine.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=4)))
    assert not engine.alive and engine.stop_reason == "the engine process stopped"
    status[0] = -9
    assert not engine.alive and engine.stop_reason == "the engine process was killed by SIGKILL"


@pytest.mark.asyncio
async def test_a_reply_failing_on_the_closed_pipe_is_told_once(tmp_path):
    from ssd_chat.tui.app import ChatApp

    engine, status = _engine()
    app = ChatApp(lambda: engine, settings=ChatSettings(mode="sd", temperature=0.0, max_tokens=64),
                  store=HistoryStore(tmp_path / "history.sqlite3"), target="fake-target", draft="fake-draft",
                  export_dir=tmp_path, clock=FakeClock())
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "Hi")
        assert "engine stopped: /restart" in rendered(app.query_one("#status"))
        status[0] = -9  # its exit status comes
        app._watch_engine()  # (its next check, now that nothing runs)
        told = [(n.title, n.message) for n in app._notifications if n.severity == "error"]
        assert told == [("reply cut", f"the engine process stopped: {RESTART}{PARTIAL_KEPT}")]
        assert [m.content for m in app.session.messages] == ["Hi", "Hello"]  # (its first delta stays)
        assert app.prompt_to_restore is None
