"""SIGTERM and SIGHUP stop ssd-chat as Ctrl-C does (ssd_chat.stop_signals): the CLI cleans up and exits 128 + the
signal's number, the chat app keeps the reply under way, and a closed terminal leaves no process or shared-memory
block behind."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from ssd_chat import stop_signals
from tests.ssd_chat.tui_fakes import FakeEngine, first_delta, make_app, settle, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
needs_posix = pytest.mark.skipif(not hasattr(signal, "SIGHUP") or not SHM.is_dir(), reason="POSIX signals and shm")


@pytest.fixture
def fresh(monkeypatch):
    """No stop signal received yet; the process's handlers put back after the test."""
    monkeypatch.setattr(stop_signals, "_received", None)
    monkeypatch.setattr(stop_signals, "_deferred", None)
    monkeypatch.setattr(stop_signals, "_again_count", 0)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *stop_signals.STOP_SIGNALS)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (Python's own, which install() takes over; a
    # process started in a shell's background has SIGINT ignored, and install() leaves that so, as it should)
    yield
    for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
        timer.join(5)  # (a signal still to come again: before the handlers it would meet are put back)
    for sig, handler in before.items():
        signal.signal(sig, handler)


@needs_posix
def test_a_stop_signal_raises_keyboard_interrupt_once_and_sets_the_exit_code(fresh):
    stop_signals.install()
    assert stop_signals.exit_code(0) == 0
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)  # a second one must not break the cleanup the first one started
    assert stop_signals.received() == signal.SIGTERM
    assert stop_signals.exit_code(0) == 128 + signal.SIGTERM == 143


class _SignalledWhenCollected:
    """Sends `sig` to its own process from its finalizer, so that the handler runs inside `__del__`."""

    def __init__(self, sig: signal.Signals) -> None:
        self.sig = sig

    def __del__(self) -> None:
        signal.raise_signal(self.sig)  # (the handler runs here, inside the finalizer)


def _raised_after_a_finalizer(sig: signal.Signals) -> bool:
    """Whether `sig`, landing inside a finalizer, raises KeyboardInterrupt in the code that follows it. An exception
    raised in `__del__` is only printed ("Exception ignored") and the run carries on: the signal would be lost."""
    try:
        _SignalledWhenCollected(sig)  # (collected at once)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            time.sleep(0.001)
    except KeyboardInterrupt:
        return True
    return False


@needs_posix
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_that_lands_in_a_finalizer_is_raised_once_it_returns(sig, fresh, capfd):
    stop_signals.install()
    assert _raised_after_a_finalizer(getattr(signal, sig))
    assert "Exception ignored" not in capfd.readouterr().err
    if sig != "SIGINT":
        assert stop_signals.received() == getattr(signal, sig)
        assert not _raised_after_a_finalizer(getattr(signal, sig))  # a second stop signal: still ignored
    else:
        assert stop_signals.received() is None  # (Ctrl-C's exit code stays the CLI's 130)
        assert _raised_after_a_finalizer(signal.SIGINT)  # every Ctrl-C raises, as Python's own handler does


class _SlowFinalizer:
    """Its finalizer gets `sig` at its start and runs `seconds` more (longer than the waits in eval'd code)."""

    def __init__(self, sig: signal.Signals, seconds: float) -> None:
        self.sig, self.seconds = sig, seconds

    def __del__(self) -> None:
        signal.raise_signal(self.sig)
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            time.sleep(0.001)


@needs_posix
def test_a_signal_waits_out_a_long_finalizer_and_one_sent_again_at_once_is_not_lost(fresh, monkeypatch):
    """The cap on waiting (for eval'd code) raised inside a long finalizer, where the stop was lost; and a signal
    sent again before the handler had marked it as waiting was dropped as a second one."""
    stop_signals.install()
    monkeypatch.setattr(stop_signals, "_AGAIN_MAX", 3)
    with pytest.raises(KeyboardInterrupt):
        _SlowFinalizer(signal.SIGTERM, 0.1)
        _wait_a_while()
    assert stop_signals.received() == signal.SIGTERM
    monkeypatch.setattr(stop_signals, "_received", None)
    real, calls = stop_signals._again_later, []

    def at_once(signum: int) -> bool:  # the first time, as a Timer that fired before the handler went on
        calls.append(signum)
        if len(calls) == 1:
            stop_signals._raise_interrupt(signum, sys._getframe())  # (its frames: the finalizer's below)
            return True
        return real(signum)

    monkeypatch.setattr(stop_signals, "_again_later", at_once)
    assert _raised_after_a_finalizer(signal.SIGTERM) and len(calls) >= 2


def _wait_a_while() -> None:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.001)


@needs_posix
def test_the_chat_apps_loop_gets_pythons_ctrl_c_handler(fresh):
    """asyncio's runner (Textual's) cancels its main task on Ctrl-C only over Python's own handler: over ours, a
    `kill -INT` raised KeyboardInterrupt anywhere in the event loop."""
    stop_signals.install()
    assert signal.getsignal(signal.SIGINT) is stop_signals._interrupt
    with stop_signals.pythons_ctrl_c():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is stop_signals._interrupt
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a shell's background job, nohup): Ctrl-C stays ignored
    stop_signals.install()
    with stop_signals.pythons_ctrl_c():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _raised_after_eval(sig: signal.Signals) -> list[str]:
    """The files of the frames KeyboardInterrupt went through, where `sig` landed inside `eval`'d code (a
    namedtuple's class is made so)."""
    try:
        eval("signal.raise_signal(sig) or sum(range(1000))", {"signal": signal, "sig": sig})  # (lands in "<string>")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            time.sleep(0.001)
    except KeyboardInterrupt as err:
        return [frame.f_code.co_filename for frame, _ in traceback.walk_tb(err.__traceback__)]
    return []


@needs_posix
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_that_lands_in_evald_code_is_raised_once_it_returns(sig, fresh):
    stop_signals.install()
    files = _raised_after_eval(getattr(signal, sig))
    assert files and "<string>" not in files


@needs_posix
def test_python_m_stopped_inside_evald_code_exits_with_its_code_not_by_sigint(tmp_path):
    """An interrupt that left `eval`'d code (a namedtuple's class made as transformers imported) marked the run as
    ended by an uncaught Ctrl-C, even caught: `python -m ssd_chat` died of SIGINT (-2) instead of exiting 129."""
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "__main__.py").write_text(
        "import signal, sys\n"
        "from ssd_chat import stop_signals\n"
        "stop_signals.install()\n"
        "try:\n"
        "    eval('signal.raise_signal(signal.SIGHUP) or sum(range(1000))', {'signal': signal})\n"
        "    while True:\n"
        "        pass\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(stop_signals.exit_code(0))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    done = subprocess.run([sys.executable, "-m", "stopped"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 128 + signal.SIGHUP, done.stderr.decode()


@needs_posix
@pytest.mark.asyncio
async def test_sigterm_quits_the_chat_app_and_keeps_the_reply_under_way(fresh, tmp_path):
    from ssd_chat.history import HistoryStore

    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    app = make_app(engine, tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await first_delta(app, pilot)
        signal.raise_signal(signal.SIGTERM)
        await wait_for(pilot, lambda: app.quitting, what="the quit")
        gate.set()  # the engine's next step: it sees the stop
        await wait_for(pilot, lambda: engine.closed, what="the engine closed")  # the quit's last step
    assert stop_signals.received() == signal.SIGTERM
    saved = HistoryStore(tmp_path / "history.sqlite3").latest()
    assert [(m.role, m.content) for m in saved.messages] == [("user", "Hi"), ("assistant", "Hello")]
    assert signal.getsignal(signal.SIGTERM) is before  # the app's handler is gone with it


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _blocks_of(pids: set[int]) -> list[str]:
    return sorted(p.name for p in SHM.glob("ssdchat_*") if int(p.name.split("_")[1]) in pids)


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@needs_posix
@pytest.mark.parametrize(("sig", "when"), [("SIGTERM", "starting"), ("SIGHUP", "starting"), ("SIGTERM", "replying")])
def test_ask_in_ssd_stopped_by_a_signal_cleans_up_and_exits_128_plus_it(sig, when, tiny_llama_dir):
    """The leader takes the signal as a Ctrl-C: its draft process stops, its shared-memory block is removed, and
    nothing is printed on stderr (not the resource tracker's "leaked shared_memory" warning, nor a child's
    traceback). "starting": as soon as the block exists (the draft process is being spawned); "replying": once the
    reply's first text is out."""
    tiny = str(tiny_llama_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssd_chat", "ask", "Paris is", "--target", tiny, "--draft", tiny, "--mode", "ssd",
         "--draft-device", "cpu", "--max-tokens", "100000"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    seen: set[int] = set()

    def started() -> bool:
        seen.update(_descendants(proc.pid))
        return bool(_blocks_of(seen | {proc.pid})) or proc.poll() is not None

    _wait_until(started, 120, "the SSD block")
    if when == "replying":
        assert proc.stdout.read(1)  # (blocks until the reply's first byte)
        seen.update(_descendants(proc.pid))
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate(timeout=60)
    stderr = stderr.decode()
    assert proc.returncode == 128 + getattr(signal, sig), stderr
    assert stderr.strip() == ""
    assert _blocks_of(seen | {proc.pid}) == []
    _wait_until(lambda: not any(_alive(p) for p in seen), 10, "its processes to end")


@needs_posix
def test_ask_in_ssd_whose_reader_goes_mid_reply_cleans_up_and_exits_as_sigpipe_would(tiny_llama_dir):
    """`ssd-chat ask ... --mode ssd | head -c 1`: the reader goes after the reply's first byte; the next write's
    BrokenPipeError ends the run as SIGPIPE ends a filter (128 + 13), once the draft process is stopped and its
    block removed, and nothing is printed. Greedy, the reply runs to the context limit (seconds after its first
    byte): sampled, it could end first (an early end-of-sequence), and the reader then went after the reply."""
    from engine import shm_channel

    tiny = str(tiny_llama_dir)
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssd_chat", "ask", "Paris is", "--target", tiny, "--draft", tiny, "--mode", "ssd",
         "--draft-device", "cpu", "--max-tokens", "100000", "--temperature", "0"], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**buffered, "HF_HUB_OFFLINE": "1"},  # stdout buffered
    )
    assert proc.stdout.read(1)  # (blocks until the reply's first byte)
    seen = _descendants(proc.pid)
    assert _blocks_of(seen | {proc.pid}) or not shm_channel.available()  # SSD's block: there is one to remove
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=60)
    stderr = stderr.decode()
    assert proc.returncode == 128 + signal.SIGPIPE, stderr
    assert stderr.strip() == ""
    assert _blocks_of(seen | {proc.pid}) == []
    _wait_until(lambda: not any(_alive(p) for p in seen), 10, "its processes to end")


@needs_posix
def test_closing_the_terminal_mid_reply_keeps_the_reply_and_leaves_nothing_behind(tiny_llama_dir, tmp_path):
    """The chat app in SSD on a real pseudo-terminal, closed while a reply streams as a terminal window is: SIGHUP
    reaches the app and, as a shell passes it on to its job, the app's whole process group (tmux's kill-server did
    that too, and the SSD block was left behind). The app stops the engine, saves the reply and exits 129; its
    processes and the SSD block are gone."""
    import fcntl
    import pty
    import struct
    import termios

    tiny = str(tiny_llama_dir)
    argv = [sys.executable, "-m", "ssd_chat", "--target", tiny, "--draft", tiny, "--mode", "ssd", "--draft-device",
            "cpu", "--max-tokens", "2000", "--temperature", "0"]
    (tmp_path / "tmp").mkdir()  # (where the engine's stderr file goes: child_stderr)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SSD_CHAT_DATA": str(tmp_path), "TERM": "xterm-256color",
           "TMPDIR": str(tmp_path / "tmp")}
    pid, master = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.chdir(REPO_ROOT)
        os.execve(sys.executable, argv, env)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    screen = bytearray()
    seen: set[int] = set()

    def shows(text: bytes) -> bool:
        seen.update(_descendants(pid))
        while select.select([master], [], [], 0.05)[0]:
            try:
                screen.extend(os.read(master, 65536))
            except OSError:
                break
        return text in screen

    try:
        _wait_until(lambda: shows(" · ready · k".encode()), 120, "the app to be ready")
        os.write(master, b"Tell me a long story\r")
        _wait_until(lambda: shows("replying…".encode()), 60, "the reply")
    finally:
        os.close(master)  # the terminal is gone: the kernel's SIGHUP (and SIGCONT) to the session's leader, the app
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGHUP)  # and the shell's to its job: the app's whole process group
    status: list[int] = []

    def ended() -> bool:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(code)
        return bool(done)

    _wait_until(ended, 15, "the app to exit")
    assert os.waitstatus_to_exitcode(status[0]) == 128 + signal.SIGHUP
    assert _blocks_of(seen | {pid}) == []
    _wait_until(lambda: not any(_alive(p) for p in seen), 10, "its processes to end")
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    roles = [row[0] for row in db.execute("SELECT role FROM messages ORDER BY position")]
    assert roles == ["user", "assistant"]  # the reply under way, kept
    assert not list((tmp_path / "tmp").glob("ssd-chat-engine-*"))  # its engine's stderr file: no terminal to print to


@needs_posix
def test_the_forced_exit_after_a_hangup_removes_the_engines_stderr_file_first(fresh, monkeypatch):
    """A quit that took longer than HANGUP_EXIT_S after the terminal closed: os._exit ran no atexit handler, and the
    engine process's stderr file (/tmp/ssd-chat-engine-*.stderr) stayed behind."""
    from ssd_chat.tui import child_stderr

    path = child_stderr.new_file()
    exits: list[tuple[int, bool]] = []
    exited = threading.Event()

    def exit_now(code: int) -> None:  # (the process's own os._exit would end the test run)
        exits.append((code, path.exists()))
        exited.set()

    monkeypatch.setattr(stop_signals.os, "_exit", exit_now)
    monkeypatch.setattr(stop_signals, "_received", signal.SIGHUP)
    stop_signals._exit_later(0.0)
    assert exited.wait(10)
    assert exits == [(128 + signal.SIGHUP, False)]
