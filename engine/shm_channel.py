"""SSD's round messages through shared memory: the leader and the draft process poll a sequence number.

A round's exchange over gloo (engine.distributed.Channel) costs about 0.6 ms on loopback: two messages each way,
each about 100 us through gloo's socket threads (README, "Where an SSD cache hit's wait goes"), against 80 us of
work in the draft process on a cache hit. Here each direction is a mailbox in one shared-memory block, [sequence,
length, taken, payload...]: the sender waits until its last message was taken, writes the payload, then the length,
then bumps the sequence; the receiver spins on the sequence, copies the payload and marks it taken (so a one-way
message, START or FINISH, followed by another waits for the draft process to read the first). A tensor (the q rows
of requests sampled by the rejection rule, [k, V] float32) goes the same way as raw bytes. Over gloo the leader
waited 4-6 ms for a cache hit's rows (a bare two-process exchange of them takes 0.5 ms): the draft process starts
building the next cache on its one core as soon as gloo has taken the rows, and gloo's socket threads then send them
from that core; here it copies them before it builds (0.2-1.1 ms, on a loaded VM). Lists and tensors longer than a
mailbox (a long prompt's START; more than 21 q rows) go over the gloo channel, which also stays the group the
processes were started with.

x86-64 only: its stores become visible in program order (TSO), which the sender's plain stores rely on; other CPUs
keep gloo (``available``). ``SSD_CHAT_SHM=0`` keeps gloo everywhere.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import time
from array import array
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import TYPE_CHECKING

from engine.spawning import ensure_resource_tracker

if TYPE_CHECKING:  # no torch at run time: the chat app's process removes a killed engine's blocks (release_blocks_of)
    import torch

    from engine.distributed import Channel

CAPACITY = 1 << 19        # int64 payload slots a mailbox (4 MB: 21 q rows of 49152 floats; pages are touched as used)
SPIN_S = 0.05             # spin this long (letting other threads run between checks: the chat app's UI), then
POLL_S = 2e-4             # check every POLL_S, and after IDLE_S every IDLE_POLL_S: a draft process idle between
IDLE_S, IDLE_POLL_S = 1.0, 0.01  # turns, or beside SD, wakes 100 times a second, and reads a turn's first message
                                 # within 10 ms
HEADER = 3                # sequence, length, taken (the receiver's sequence)
OVER_GLOO = -1            # length slot: the list follows on the gloo channel
PREFIX = "ssdchat_"       # block names: PREFIX<leader pid>_<random>


def remove_stale_blocks(shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Unlink the blocks (``PREFIX<pid>_...``) whose leader is no longer running; returns their names."""
    def stale(name: str) -> bool:
        pid = name[len(PREFIX):].split("_")[0]
        return pid.isdigit() and not _running(int(pid))

    return [path.name for path in _blocks(shm_dir) if stale(path.name) and _unlink(path)]


def release_blocks_of(leader: int, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Unlink the blocks of a leader this process killed, and drop them from the resource tracker that its processes
    shared with this one (else it warns of leaked blocks when this process exits). Returns their names."""
    from multiprocessing import resource_tracker

    removed = [path.name for path in _blocks(shm_dir, f"{leader}_") if _unlink(path)]
    for name in removed:
        resource_tracker.unregister(f"/{name}", "shared_memory")
    return removed


def _blocks(shm_dir: Path, infix: str = "") -> list[Path]:
    return sorted(shm_dir.glob(f"{PREFIX}{infix}*")) if shm_dir.is_dir() else []


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:  # gone already (another leader's sweep)
        return False
    return True


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def available() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and os.environ.get("SSD_CHAT_SHM", "1") != "0"


class ShmChannel:
    """Channel's interface (send_ints / recv_ints / send_tensor / recv_tensor) over two shared-memory mailboxes,
    oversized lists and tensors over ``gloo``. The leader makes the block (``new_block``) and wraps it (side 0),
    the draft process ``attach``es to it by name (side 1)."""

    def __init__(self, block: shared_memory.SharedMemory, side: int, gloo: Channel, *, owner: bool,
                 alive: Callable[[], bool] | None = None, timeout_s: float | None = None):
        """side 0 (leader) sends into mailbox 0 and reads mailbox 1; side 1 the other way round. `alive`: whether
        the peer still runs (polled while waiting); `timeout_s`: the longest wait before the peer counts as gone."""
        self.block, self.gloo, self.owner = block, gloo, owner
        self.alive, self.timeout_s = alive, timeout_s
        self.slots = block.buf.cast("q")
        size = HEADER + CAPACITY
        self.out = self.slots[side * size : (side + 1) * size]
        self.inbox = self.slots[(1 - side) * size : (2 - side) * size]
        self.out_bytes, self.inbox_bytes = self.out.cast("B"), self.inbox.cast("B")  # (tensors' payload)
        self.sent = self.seen = 0  # a new block: the peer may have written before this side attached

    @staticmethod
    def new_block() -> shared_memory.SharedMemory:
        """The leader's block, made before the draft process starts (its name goes in the DraftSpec). Named after
        the leader's pid, so that a later leader removes the blocks of one that was killed with its resource
        tracker (a whole process group killed: nothing else would unlink them)."""
        ensure_resource_tracker()  # the block registers with it: a failed start would leave the block behind
        remove_stale_blocks()
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        return shared_memory.SharedMemory(name=name, create=True, size=2 * (HEADER + CAPACITY) * 8)  # zeros

    @classmethod
    def attach(cls, name: str, gloo: Channel) -> ShmChannel:
        # (it registers the name with the resource tracker, which a spawned process shares with the leader and
        # which keeps one entry a name: the leader's unlink at close clears it; after a crash the tracker unlinks it)
        return cls(shared_memory.SharedMemory(name=name), 1, gloo, owner=False)

    @property
    def name(self) -> str:
        return self.block.name

    def send_ints(self, values: list[int]) -> None:
        n = len(values)
        self._send(n <= CAPACITY, n, lambda: self.out.__setitem__(slice(HEADER, HEADER + n), array("q", values)))
        if n > CAPACITY:
            self.gloo.send_ints(values)

    def recv_ints(self) -> list[int]:
        values = self._recv(lambda n: self.inbox[HEADER : HEADER + n].tolist())
        return self.gloo.recv_ints() if values is None else values

    def poll(self) -> bool:
        """Whether a list has come (recv_ints then returns at once)."""
        return self.inbox[0] == self.seen + 1

    def send_tensor(self, x: torch.Tensor) -> None:
        data = memoryview(_bytes(x.detach().cpu().contiguous()))
        n = data.nbytes
        fits = n <= CAPACITY * 8
        self._send(fits, n, lambda: self.out_bytes.__setitem__(slice(HEADER * 8, HEADER * 8 + n), data))
        if not fits:
            self.gloo.send_tensor(x)

    def recv_tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        import torch  # (only the engine's processes send tensors)

        out = torch.empty(shape, dtype=dtype)
        target = memoryview(_bytes(out))

        def copy(n: int) -> bool:
            if n != target.nbytes:
                raise RuntimeError(f"the peer sent {n} bytes for a {tuple(shape)} {dtype} tensor")
            target[:] = self.inbox_bytes[HEADER * 8 : HEADER * 8 + n]
            return True

        return out if self._recv(copy) is not None else self.gloo.recv_tensor(shape, dtype)

    def _send(self, fits: bool, n: int, write: Callable[[], object]) -> None:
        """One message into the mailbox: `write` puts its payload there (where it `fits`; else the length slot says
        it follows over gloo), then its length `n`, then the sequence, which the receiver waits on."""
        out = self.out
        self._wait(lambda: out[2] == self.sent)  # the last one taken: the mailbox is free
        if fits:
            write()
        out[1] = n if fits else OVER_GLOO
        out[0] = self.sent + 1  # last: the receiver reads the payload only after it sees this
        self.sent += 1

    def _recv(self, read: Callable[[int], object]) -> object | None:
        """The next message: read(length) of its payload, or None where it follows over gloo."""
        want, inbox = self.seen + 1, self.inbox
        self._wait(lambda: inbox[0] == want)
        self.seen, n = want, inbox[1]
        value = None if n == OVER_GLOO else read(n)
        inbox[2] = want  # taken
        return value

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Until ready(): spin, then poll; raise RuntimeError if the peer dies or times out."""
        start = time.perf_counter()
        while True:
            waited = time.perf_counter() - start
            if waited < SPIN_S:
                for _ in range(500):
                    if ready():
                        return
                time.sleep(0)  # the GIL to any other thread
            elif ready():
                return
            else:
                time.sleep(POLL_S if waited < IDLE_S else IDLE_POLL_S)
            if self.alive is not None and not self.alive() and not ready():
                raise RuntimeError("the peer process exited")
            if self.timeout_s is not None and waited > self.timeout_s and not ready():
                raise RuntimeError(f"no answer from the peer process in {self.timeout_s:.0f} s")

    def __del__(self) -> None:  # never closed (an LLM left open at exit): its views first, then the block
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        if getattr(self, "slots", None) is None:
            return
        for view in (self.out_bytes, self.inbox_bytes, self.out, self.inbox, self.slots):
            view.release()
        self.slots = None
        self.block.close()
        if self.owner:
            self.block.unlink()


def _bytes(x: torch.Tensor):  # -> a numpy uint8 array over x's memory (contiguous x)
    import torch

    return x.reshape(-1).view(torch.uint8).numpy()
