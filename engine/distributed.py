"""Process launch and point-to-point messages over torch.distributed (gloo; NCCL for CUDA TP collectives).

The leader (the caller's process) is rank 0 of a small process group; every other rank is a child
started with `spawn_rank`. Each group is its own ProcessGroupGloo object (no global default group), so
one process can hold several engines and tear them down independently.

Children are pinned to their CPU cores with their own thread count, and leave as soon as the leader
is gone (a watchdog polls the parent pid: a killed leader takes its ranks down). A child never tears
gloo down itself: it exits with os._exit once it is told to, which avoids gloo's destructor racing the
peer's closing sockets.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine import spawning
from engine.affinity import pin
from engine.spawning import ensure_resource_tracker

log = logging.getLogger(__name__)

LEADER = 0
WAIT_FOREVER = datetime.timedelta(days=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RankSpec:
    """Where one child rank runs: its CPU cores (None: unpinned) and torch thread count."""

    rank: int
    cores: tuple[int, ...] | None
    threads: int


def host_store(port: int, world_size: int, *, leader: bool = True) -> dist.TCPStore:
    """The group's TCP store on `port`: hosted by the leader (for `make_group(..., store=)`: hosted before the
    ranks start, a rank can check in while the leader is still busy loading the target), joined by the others."""
    return dist.TCPStore("127.0.0.1", port, world_size, leader, timeout=datetime.timedelta(seconds=1),
                         wait_for_workers=False)


def make_group(
    port: int, rank: int, world_size: int, timeout: datetime.timedelta, children: list[mp.Process] | None = None,
    store: dist.TCPStore | None = None,
) -> dist.ProcessGroup:
    """A gloo group over a TCP store the leader hosts on `port` (`store`: the leader's, hosted earlier by
    `host_store`). The leader waits for every rank to check in and gives up at once if one of its `children` dies
    first (a bad device, a crash while importing)."""
    if store is None:
        store = host_store(port, world_size, leader=rank == LEADER)
    if rank != LEADER:
        store.set(f"up{rank}", "1")
    else:
        keys = [f"up{r}" for r in range(1, world_size)]
        # Polled: a blocking wait with a timeout makes torch print a warning to stderr every second (over the chat
        # app's screen while the draft process starts).
        while not store.check(keys):
            dead = [p for p in children or [] if not p.is_alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with code {dead[0].exitcode} while starting")
            time.sleep(0.02)
    store.set_timeout(datetime.timedelta(seconds=60))
    options = dist.ProcessGroupGloo._Options()
    # every rank is on this machine: loopback. gloo's default device binds to the address the hostname resolves to,
    # which fails where that is not a local address (host-network containers, some Macs)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def collective_backend(device: torch.device | str) -> str:
    """The backend of a TP group's collectives: NCCL for CUDA tensors, gloo for CPU tensors."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def make_collective_group(
    port: int, rank: int, world_size: int, device: torch.device | str, timeout: datetime.timedelta
) -> dist.ProcessGroup:
    """The group for the TP all-reduce/all-gather of tensors on `device`: NCCL on CUDA, on its own TCP store
    (the leader hosts it on `port`). Control messages (CPU int64 lists) stay on make_group's gloo group.
    UNVERIFIED: no GPU has run this yet (see README, GPU section)."""
    if collective_backend(device) == "gloo":
        return make_group(port, rank, world_size, timeout)
    torch.cuda.set_device(torch.device(device))
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == LEADER, timeout=timeout, wait_for_workers=False)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, options)


def spawn_rank(
    main: Callable[..., None], spec: RankSpec, port: int, world_size: int, *args, load: Callable | None = None
) -> mp.Process:
    """Start a child rank running `main(group, *args)`, or with `load`, `main(group, load(*args))` where `load`
    runs before the rank joins the group (so the leader's wait for the group covers it, with no timeout).
    The child exits (os._exit) when `main` returns."""
    ctx = mp.get_context("spawn")
    ensure_resource_tracker()
    proc = ctx.Process(target=_child, args=(main, load, spec, port, world_size, os.getpid(), args), daemon=True,
                       name=f"ssd-chat-rank{spec.rank}")
    spawning.start(proc, spec.cores)  # the leader takes a Ctrl-C and stops its ranks
    return proc


def _child(main, load, spec: RankSpec, port: int, world_size: int, leader_pid: int, args) -> None:
    code = 0
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=f"rank {spec.rank}: %(message)s")
    try:
        pin(spec.cores, spec.threads)
        threading.Thread(target=_watch_leader, args=(leader_pid,), daemon=True).start()
        if load is not None:
            args = (load(*args),)
        group = make_group(port, spec.rank, world_size, WAIT_FOREVER)
        main(group, *args)
    except BaseException as exc:  # the leader sees this rank's death; keep the message short
        if os.getppid() == leader_pid:
            log.error("rank %d stopped: %s", spec.rank, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        code = 1
    finally:
        os._exit(code)


def _watch_leader(leader_pid: int) -> None:
    while os.getppid() == leader_pid:
        time.sleep(0.2)
    os._exit(0)


class Channel:
    """Framed messages to one peer: a length header, then an int64 payload (and float tensors on request)."""

    def __init__(self, group: dist.ProcessGroup, peer: int):
        self.group = group
        self.peer = peer
        self._header = torch.zeros(1, dtype=torch.long)
        self._reader: _Reader | None = None  # poll's receive of the next list, which recv_ints then waits for

    def send_ints(self, values: list[int]) -> None:
        payload = torch.tensor(values, dtype=torch.long)
        self.group.send([torch.tensor([len(values)], dtype=torch.long)], self.peer, 0).wait()
        if values:
            self.group.send([payload], self.peer, 0).wait()

    def poll(self) -> bool:
        """Whether a list has come, for a receiver that works on until then (recv_ints, not recv_tensor, must
        follow a poll). Gloo's receives tell only by waiting: a thread waits for the next list."""
        if self._reader is None:
            self._reader = _Reader(self._receive)
        return self._reader.done.is_set()

    def recv_ints(self) -> list[int]:
        reader, self._reader = self._reader, None
        return self._receive() if reader is None else reader.result()

    def _receive(self) -> list[int]:
        self.group.recv([self._header], self.peer, 0).wait()
        n = int(self._header[0])
        if n == 0:
            return []
        payload = torch.empty(n, dtype=torch.long)
        self.group.recv([payload], self.peer, 0).wait()
        return payload.tolist()

    def send_tensor(self, x: torch.Tensor) -> None:
        self.group.send([x.contiguous()], self.peer, 0).wait()

    def recv_tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        self.group.recv([out], self.peer, 0).wait()
        return out

    def close(self) -> None:
        """Nothing to free: the group is torn down with its process (engine.shm_channel's has a block to free)."""


class _Reader:
    """One blocking call on a thread of its own (which releases the GIL in gloo's wait); its result or its error."""

    def __init__(self, call: Callable[[], list[int]]):
        self.call, self.done = call, threading.Event()
        self.value: list[int] = []
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="channel-poll", daemon=True).start()

    def _run(self) -> None:
        try:
            self.value = self.call()
        except BaseException as exc:  # (handed to the caller of result)
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> list[int]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def float_bits(x: float) -> int:
    """A float carried in an int64 message (exact round trip)."""
    return int(torch.tensor([x], dtype=torch.float64).view(torch.int64)[0])


def bits_float(x: int) -> float:
    return float(torch.tensor([x], dtype=torch.int64).view(torch.float64)[0])
