"""engine.distributed.Channel: int64 lists of any length (empty included; int64's extremes) and float tensors
between two gloo ranks, here two threads of one process, in order."""

from __future__ import annotations

import datetime
import threading

import torch

from engine.distributed import Channel, free_port, make_group

LENGTHS = [0, 1, 17, 63, 64, 65, 3000]


def _lists() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(-(2**62), 2**62, (n,), generator=g).tolist() for n in LENGTHS] + [[2**63 - 1, -(2**63)]]


def test_lists_and_tensors_cross_in_order():
    port, timeout = free_port(), datetime.timedelta(seconds=60)
    groups: dict[int, object] = {}
    joiner = threading.Thread(target=lambda: groups.__setitem__(1, make_group(port, 1, 2, timeout)))
    joiner.start()
    groups[0] = make_group(port, 0, 2, timeout)
    joiner.join()
    leader, rank = Channel(groups[0], 1), Channel(groups[1], 0)
    echoed, tensor = [], torch.randn(3, 5)

    def echo():  # the other rank: each list back reversed, then the tensor back doubled
        for _ in range(len(_lists())):
            rank.send_ints(rank.recv_ints()[::-1])
        rank.send_tensor(rank.recv_tensor((3, 5), torch.float32) * 2)

    peer = threading.Thread(target=echo)
    peer.start()
    for values in _lists():
        leader.send_ints(values)
        echoed.append(leader.recv_ints())
    leader.send_tensor(tensor)
    back = leader.recv_tensor((3, 5), torch.float32)
    peer.join()
    assert echoed == [values[::-1] for values in _lists()]
    assert torch.equal(back, tensor * 2)
