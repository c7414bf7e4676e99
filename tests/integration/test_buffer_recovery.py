"""Durable buffer: ``kill -9`` a shard process, restart it on the same log directory, and
every accepted, unconsumed group is back exactly once; no consumed group ever comes back.

The shard runs as a real OS process (``python -m streamrl.buffers.shard_main``); the test
kills only the process it started, by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from streamrl.buffers.client import BufferClient
from streamrl.protocol import Trajectory, TrajectoryGroup


def make_group(i: int) -> TrajectoryGroup:
    trajectories = [
        Trajectory.from_lists([1, 2, i % 100], [3, 4], [-0.1, -0.2], [0, 0], reward, "stop", 0)
        for reward in (0.0, 1.0)
    ]
    return TrajectoryGroup(f"g{i:05d}", f"p{i}", trajectories, float(i), float(i))


class ShardProcess:
    def __init__(self, log_dir: Path, **config) -> None:
        cmd = [sys.executable, "-m", "streamrl.buffers.shard_main", "--log-dir", str(log_dir)]
        cmd += ["--config", json.dumps({"capacity": 10_000, **config})]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        endpoints = json.loads(self.proc.stdout.readline())
        assert endpoints["pid"] == self.proc.pid
        self.ingest, self.requests = endpoints["ingest"], endpoints["requests"]

    def kill_9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def processes():
    started: list[ShardProcess] = []

    def start(log_dir: Path, **config) -> ShardProcess:
        started.append(ShardProcess(log_dir, **config))
        return started[-1]

    yield start
    for shard in started:
        shard.stop()


def push_all(ctx: zmq.Context, endpoint: str, groups: list[TrajectoryGroup]) -> None:
    sock = ctx.socket(zmq.PUSH)
    sock.connect(endpoint)
    for group in groups:
        sock.send(msgspec.msgpack.encode(group))
    sock.close(linger=-1)  # deliver everything


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def ids(groups: list[TrajectoryGroup]) -> list[str]:
    return [g.group_id for g in groups]


def drain(client: BufferClient, n: int) -> list[str]:
    """Fetch exactly ``n`` groups, then check nothing else is left."""
    got = ids(client.fetch(n, 0, 0, timeout_s=20)) if n else []
    with pytest.raises(TimeoutError):
        client.fetch(1, 0, 0, timeout_s=0.3)
    return got


def test_kill_9_after_n_accepted_recovers_every_unconsumed_group_once(ctx, processes, tmp_path):
    groups = [make_group(i) for i in range(60)]
    shard = processes(tmp_path)
    push_all(ctx, shard.ingest, groups)
    client = BufferClient([shard.requests], ctx=ctx)
    wait_until(lambda: client.stats()[0].ingested == 60)

    consumed = ids(client.fetch(15, 0, 0))
    assert [a.ok for a in client.checkpoint()] == [True]  # recovery also works across a compaction
    consumed += ids(client.fetch(10, 0, 0))
    client.close()
    shard.kill_9()

    restarted = processes(tmp_path)
    client = BufferClient([restarted.requests], ctx=ctx)
    stats = client.stats()[0]
    assert (stats.recovered, stats.size, stats.ingested) == (35, 35, 35)
    recovered = drain(client, 35)
    assert recovered == ids(groups[25:])  # all unconsumed, each once, in acceptance order
    assert not set(recovered) & set(consumed)
    client.close()
    restarted.kill_9()

    # Everything consumed before the second kill stays consumed.
    third = processes(tmp_path)
    client = BufferClient([third.requests], ctx=ctx)
    assert client.stats()[0].recovered == 0
    drain(client, 0)
    client.close()


def produce(endpoint: str, groups: list[TrajectoryGroup], stop: threading.Event) -> None:
    """Push ``groups`` at a few thousand a second until done or ``stop`` is set."""
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    for i, group in enumerate(groups):
        if stop.is_set():
            break
        try:
            sock.send(msgspec.msgpack.encode(group), zmq.NOBLOCK)
        except zmq.Again:  # the shard is gone
            break
        if i % 5 == 0:
            time.sleep(0.001)
    sock.close()
    context.term()


def test_kill_9_mid_stream_loses_no_accepted_group(ctx, processes, tmp_path):
    """Kill while a producer is still pushing: every group the shard had counted as accepted
    and not handed out is recovered; none is handed out twice."""
    groups = [make_group(i) for i in range(20_000)]
    shard = processes(tmp_path, capacity=50_000)
    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(shard.ingest, groups, stop))
    producer.start()
    client = BufferClient([shard.requests], ctx=ctx, reply_timeout_s=5)
    wait_until(lambda: client.stats()[0].ingested >= 200)
    consumed = ids(client.fetch(50, 0, 0))
    accepted_before_kill = client.stats()[0].ingested
    shard.kill_9()
    stop.set()
    producer.join(30)
    client.close()
    assert accepted_before_kill < len(groups)  # the kill did land mid-stream

    restarted = processes(tmp_path)
    client = BufferClient([restarted.requests], ctx=ctx)
    recovered_count = client.stats()[0].recovered
    recovered = drain(client, recovered_count)
    assert len(set(recovered)) == len(recovered)
    assert not set(recovered) & set(consumed)
    # One producer, FIFO: the first `accepted_before_kill` groups were accepted (the shard
    # kept accepting more until the kill; those may be recovered too).
    must_have = set(ids(groups[:accepted_before_kill])) - set(consumed)
    assert must_have <= set(recovered)
    assert set(recovered) <= set(ids(groups))
    client.close()
