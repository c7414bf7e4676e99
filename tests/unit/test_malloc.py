"""streamrl.malloc's collector settings: no automatic collection during setup, the startup
heap frozen (a full collection no longer walks it), and a slow collection logged with its
generation and time."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest

from streamrl.malloc import SlowCollections, defer_collections, freeze_startup_heap


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the test process's heap back as it was
    gc.enable()


def test_setup_runs_no_collection_and_the_freeze_collects_its_cycles(unfrozen) -> None:
    defer_collections()
    assert not gc.isenabled()

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    collections = gc.get_stats()[0]["collections"]
    garbage = [cycle() for _ in range(5000)]  # far past generation 0's threshold
    assert gc.get_stats()[0]["collections"] == collections
    assert all(ref() is not None for ref in garbage)  # setup's cycles wait
    freeze_startup_heap()
    assert gc.isenabled()
    assert all(ref() is None for ref in garbage)  # collected by the freeze, not frozen


def test_the_startup_heap_is_frozen_and_a_new_cycle_still_collected(unfrozen) -> None:
    frozen = freeze_startup_heap()
    assert frozen > 0 and gc.get_freeze_count() == frozen
    tracked = len(gc.get_objects())
    assert tracked < frozen  # a full collection walks only what came after

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after the freeze: garbage once dropped
    del a, b
    assert gc.collect() >= 2


def test_a_slow_collection_is_logged_and_counted(caplog) -> None:
    slow = SlowCollections(threshold_s=0.0).install()
    try:
        with caplog.at_level(logging.INFO, logger="streamrl.malloc"):
            gc.collect()
    finally:
        gc.callbacks.remove(slow._callback)
    assert slow.count >= 1 and slow.seconds > 0
    assert "gc: generation 2 collection took" in caplog.text
