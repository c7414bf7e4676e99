"""Liveness is progress, not a thread (issue 52 item 3): a role's heartbeat carries how long
its work has not moved (``workers.progress``), and supervision replaces a role that is silent
or stalled by one rule (``RoleSlot.unresponsive``)."""

from __future__ import annotations

import threading
import time

import msgspec
import zmq

from streamrl.config import RunConfig
from streamrl.controller.roles import FIRST_BEAT_GRACE_S, RoleSlot
from streamrl.controller.state import GeneratorHealth, RunState
from streamrl.protocol import Heartbeat
from streamrl.transport import bind_random, make_socket
from streamrl.workers.generation.generator_reports import HeartbeatThread
from streamrl.workers.progress import Progress


def test_work_without_a_step_is_a_stall_and_waiting_for_work_is_not() -> None:
    progress = Progress()
    start = time.monotonic()
    assert progress.stalled_s(start + 1000) == 0.0  # idle: waiting for admission or requests
    with progress.working():
        assert 99 < progress.stalled_s(time.monotonic() + 100) < 101
        progress.tick()
        assert progress.stalled_s(time.monotonic()) < 1
        with progress.working():  # a wait for weights inside a call: still the same work
            pass
        assert progress.stalled_s(time.monotonic() + 5) > 4
    assert progress.stalled_s(time.monotonic() + 1000) == 0.0
    assert progress.steps == 3  # one tick, and the end of each block


def test_the_heartbeat_carries_the_main_thread_s_stall_while_the_main_thread_is_wedged() -> None:
    """A heartbeat thread beats on while the main thread (here: a worker thread standing in for
    it) is stuck in its work; the beats say for how long."""
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL)
    endpoint = bind_random(pull, "127.0.0.1", "reports")
    progress, release = Progress(), threading.Event()

    def wedged_forward() -> None:
        with progress.working():
            release.wait(10)

    worker = threading.Thread(target=wedged_forward)
    beats = HeartbeatThread(ctx, endpoint, 3, 1, every_s=0.1, role="reward role", progress=progress)
    try:
        worker.start()
        decoder = msgspec.msgpack.Decoder(Heartbeat)
        deadline, beat = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            assert pull.poll(2000)
            beat = decoder.decode(pull.recv())
            if beat.stalled_s > 0.5:
                break
        assert beat is not None and beat.stalled_s > 0.5, beat
        assert (beat.role, beat.index, beat.incarnation) == ("reward role", 3, 1)
    finally:
        release.set()
        worker.join()
        beats.stop()
        pull.close(linger=0)
        ctx.term()


def test_one_rule_says_why_a_live_process_is_replaced() -> None:
    run = RunConfig(heartbeat_timeout_s=60.0, stall_timeout_s=30.0)
    slot = RoleSlot(actor=None, started_at=1000.0)
    now = 5000.0
    assert slot.unresponsive(now - 1, 0.0, now, run) is None
    assert slot.unresponsive(now - 1, 29.0, now, run) is None
    assert slot.unresponsive(now - 1, 31.0, now, run) == "no progress for 31 s with work in hand"
    assert slot.unresponsive(now - 61, 0.0, now, run) == "no heartbeat for 61 s"
    # Silence is said first: a SIGSTOPped process's last beat may say it was working.
    assert slot.unresponsive(now - 61, 31.0, now, run) == "no heartbeat for 61 s"
    # Before its first beat a role has its start-up grace.
    fresh = RoleSlot(actor=None, started_at=now - 10)
    assert fresh.unresponsive(None, 0.0, now, run) is None
    late = now + FIRST_BEAT_GRACE_S + 61
    assert fresh.unresponsive(None, 0.0, late, run) is not None
    assert slot.unresponsive(now - 1, 10**6, now, RunConfig(stall_timeout_s=0.0)) is None
    # A restart held the controller until 10 s ago: silence counts from there.
    assert slot.unresponsive(now - 61, 0.0, now, run, listening_since=now - 10) is None
    held = slot.unresponsive(now - 100, 0.0, now, run, listening_since=now - 61)
    assert held == "no heartbeat for 61 s"


def test_the_controller_keeps_the_stall_of_the_current_incarnation_only() -> None:
    state = RunState()
    state.health[0] = GeneratorHealth(incarnation=2)
    state.heartbeat(Heartbeat("generator", 0, 1, 10.0, progress=5, stalled_s=400.0))  # replaced
    assert "generator 0" not in state.stalled
    state.heartbeat(Heartbeat("generator", 0, 2, 11.0, progress=1, stalled_s=3.0))
    assert state.stalled["generator 0"] == 3.0 and state.last_seen["generator 0"] == 11.0
    state.scorer_epochs[1] = 1
    state.heartbeat(Heartbeat("reward role", 1, 0, 12.0, stalled_s=99.0))  # the dead one
    assert "reward role 1" not in state.stalled
    state.heartbeat(Heartbeat("reward role", 1, 1, 13.0, stalled_s=7.0))
    assert state.stalled["reward role 1"] == 7.0
    state.not_heard("reward role 1")  # restarted: a fresh grace, no stall carried over
    assert "reward role 1" not in state.stalled and "reward role 1" not in state.last_seen
