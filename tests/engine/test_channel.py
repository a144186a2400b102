"""The round transports between the leader and SSD's draft process: engine.distributed.Channel (gloo) and
engine.shm_channel.ShmChannel (shared memory, gloo for long lists and tensors). int64 lists of any length (empty
included; int64's extremes; longer than a mailbox), one-way messages in a row and float tensors, in order, between
two ranks that are two threads of one process here; a dead or silent peer is an error, not a hang."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch

from engine import shm_channel
from engine.distributed import Channel, free_port, make_group
from engine.shm_channel import ShmChannel

LENGTHS = [0, 1, 17, 63, 64, 65, 3000, shm_channel.CAPACITY, shm_channel.CAPACITY + 1]


def _lists() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(-(2**62), 2**62, (n,), generator=g).tolist() for n in LENGTHS] + [[2**63 - 1, -(2**63)]]


@pytest.fixture(scope="module")
def gloo_pair():
    port, timeout = free_port(), datetime.timedelta(seconds=60)
    groups: dict[int, object] = {}
    joiner = threading.Thread(target=lambda: groups.__setitem__(1, make_group(port, 1, 2, timeout)))
    joiner.start()
    groups[0] = make_group(port, 0, 2, timeout)
    joiner.join()
    return Channel(groups[0], 1), Channel(groups[1], 0)


@pytest.fixture(params=["gloo", "shm"])
def pair(request, gloo_pair):
    if request.param == "gloo":
        yield gloo_pair
        return
    leader = ShmChannel(ShmChannel.new_block(), 0, gloo_pair[0], owner=True, alive=lambda: True, timeout_s=60)
    leader.send_ints([0])  # before the other side attaches, as the leader may send START before the draft listens
    rank = ShmChannel.attach(leader.name, gloo_pair[1])
    rank.timeout_s = 60
    assert rank.recv_ints() == [0]
    yield leader, rank
    rank.close()
    leader.close()


def test_lists_and_tensors_cross_in_order(pair):
    leader, rank = pair
    echoed, tensor, errors = [], torch.randn(3, 5), []

    def echo():  # the other rank: two one-way lists, then each list back reversed, then the tensor back doubled
        try:
            assert rank.recv_ints() == [1] and rank.recv_ints() == [2, 3]
            for _ in range(len(_lists())):
                rank.send_ints(rank.recv_ints()[::-1])
            rank.send_tensor(rank.recv_tensor((3, 5), torch.float32) * 2)
        except BaseException as exc:
            errors.append(exc)
            raise

    peer = threading.Thread(target=echo)
    peer.start()
    leader.send_ints([1])  # one-way messages in a row (START, then a round; FINISH, then FINISH)
    leader.send_ints([2, 3])
    for values in _lists():
        leader.send_ints(values)
        echoed.append(leader.recv_ints())
    leader.send_tensor(tensor)
    back = leader.recv_tensor((3, 5), torch.float32)
    peer.join()
    assert errors == []
    assert echoed == [values[::-1] for values in _lists()]
    assert torch.equal(back, tensor * 2)


def test_poll_says_whether_a_list_has_come_without_taking_it(pair):
    """The draft process polls between two chunks of a long prefill, and reads the leader's message when one came."""
    leader, rank = pair
    assert not rank.poll() and not rank.poll()  # nothing sent (asked twice: gloo's receive stays posted)
    sender = threading.Thread(target=lambda: [leader.send_ints(v) for v in ([4, 5], [6])])  # (gloo's send waits
    sender.start()                                                                       # for its receive)
    deadline = time.monotonic() + 30
    while not rank.poll():
        assert time.monotonic() < deadline
    assert rank.poll()  # still there
    assert rank.recv_ints() == [4, 5] and rank.recv_ints() == [6]
    sender.join()
    assert not rank.poll()
    sender = threading.Thread(target=leader.send_ints, args=([7],))
    sender.start()
    assert rank.recv_ints() == [7]  # a posted poll's receive is the next list's
    sender.join()


def test_a_dead_or_silent_peer_is_an_error(gloo_pair, monkeypatch):
    monkeypatch.setattr(shm_channel, "SPIN_S", 0.0)
    dead = ShmChannel(ShmChannel.new_block(), 0, gloo_pair[0], owner=True, alive=lambda: False, timeout_s=60)
    silent = ShmChannel(ShmChannel.new_block(), 0, gloo_pair[0], owner=True, alive=lambda: True, timeout_s=0.05)
    try:
        with pytest.raises(RuntimeError, match="exited"):
            dead.recv_ints()
        with pytest.raises(RuntimeError, match="no answer"):
            silent.recv_ints()
        silent.send_ints([1])  # nobody takes it: the next send waits, and gives up
        with pytest.raises(RuntimeError, match="no answer"):
            silent.send_ints([2])
    finally:
        dead.close()
        silent.close()


def test_blocks_of_a_killed_leader_are_removed_by_the_next(tmp_path):
    """A block's name carries its leader's pid; a new block unlinks those whose leader is gone (killed with its
    resource tracker, nothing else would) and keeps a running leader's."""
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # exited: (almost surely) not reused yet
    names = [f"{shm_channel.PREFIX}{dead_pid}_0a0b0c0d", f"{shm_channel.PREFIX}{os.getpid()}_0a0b0c0d",
             f"{shm_channel.PREFIX}notapid_1", "psm_other"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert shm_channel.remove_stale_blocks(tmp_path) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
    block = ShmChannel.new_block()
    try:
        assert block.name.lstrip("/").startswith(f"{shm_channel.PREFIX}{os.getpid()}_")
    finally:
        block.close()
        block.unlink()


def test_tensors_cross_through_the_mailbox_and_past_its_size_over_gloo(pair, monkeypatch):
    """A sampled round's q rows ([k, V] float32) go through shared memory as bytes (any byte count, any dtype); a
    tensor larger than a mailbox goes over gloo, as a long list does."""
    leader, rank = pair
    shapes = [((3, 5), torch.float32), ((4, 49152), torch.float32), ((2, 3), torch.int64), ((0, 7), torch.float32),
              ((1 + shm_channel.CAPACITY * 8 // (49152 * 4), 49152), torch.float32)]  # the last: past a mailbox
    over_gloo, errors = [], []
    gloo_send = Channel.send_tensor
    monkeypatch.setattr(Channel, "send_tensor", lambda self, x: over_gloo.append(tuple(x.shape)) or gloo_send(self, x))

    def echo():
        try:
            for shape, dtype in shapes:
                rank.send_tensor(rank.recv_tensor(shape, dtype) * 2)
        except BaseException as exc:
            errors.append(exc)
            raise

    peer = threading.Thread(target=echo)
    peer.start()
    gen = torch.Generator().manual_seed(1)
    for shape, dtype in shapes:
        x = (torch.randn(shape, generator=gen) * 100).to(dtype)
        leader.send_tensor(x)
        assert torch.equal(leader.recv_tensor(shape, dtype), x * 2)
    peer.join()
    assert errors == []
    shm = isinstance(leader, ShmChannel)
    assert over_gloo == ([shapes[-1][0]] * 2 if shm else [s for s, _ in shapes for _ in range(2)])
