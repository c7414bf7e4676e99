"""The learner group's store: rank 0's port is held from the moment it is chosen."""

from __future__ import annotations

import errno
import socket
import threading

import pytest
import torch.distributed as dist

from streamrl.workers.learning.learner import group_listener, rendezvous


def test_the_chosen_port_cannot_be_taken_before_the_store_starts() -> None:
    listener = group_listener("127.0.0.1", world_size=2)
    port = listener.getsockname()[1]
    with socket.socket() as other, pytest.raises(OSError) as refused:
        other.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    listener.close()


def test_a_group_of_two_meets_on_the_listener_rank_zero_bound() -> None:
    listener = group_listener("127.0.0.1", world_size=2)
    master = f"127.0.0.1:{listener.getsockname()[1]}"
    stores: dict[int, dist.TCPStore] = {}
    # Rank 1's copy, as a process spawned with the listener holds one: rendezvous closes it.
    copy = listener.dup()

    def join(rank: int) -> None:
        stores[rank] = rendezvous(master, rank, 2, listener if rank == 0 else copy)

    ranks = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join(timeout=60)
    stores[1].set("from", "rank 1")
    assert stores[0].get("from") == b"rank 1"
    assert copy.fileno() == -1  # closed: rank 0's store alone serves on the port


def test_a_group_of_one_takes_any_free_port() -> None:
    store = rendezvous("127.0.0.1:0", 0, 1)
    store.set("k", "v")
    assert store.get("k") == b"v" and store.port > 0
