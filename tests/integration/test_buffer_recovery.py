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
from support import ids, make_group, wait_until

from streamrl.buffers.client import BufferClient
from streamrl.buffers.delivery import Outbox, new_sender, shard_sender
from streamrl.protocol import TrajectoryGroup


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


def drain(client: BufferClient, n: int) -> list[str]:
    """Fetch exactly ``n`` groups, then check nothing else is left."""
    got = ids(client.fetch(n, 0, 0, timeout_s=20)) if n else []
    with pytest.raises(TimeoutError):
        client.fetch(1, 0, 0, timeout_s=0.3)
    return got


def test_kill_9_after_n_accepted_recovers_every_unconsumed_group_once(ctx, processes, tmp_path):
    groups = [make_group(f"g{i:05d}", finished_at=float(i)) for i in range(60)]
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
    groups = [make_group(f"g{i:05d}", finished_at=float(i)) for i in range(20_000)]
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


def test_acknowledged_delivery_resends_what_a_killed_shard_lost_and_nothing_twice(
    ctx, processes, tmp_path
):
    """Groups in a killed shard's socket buffers are gone (PUSH has no receipt). The sender's
    ``Outbox`` keeps every unacknowledged frame; after the restart it sends all of them again
    and the shard, knowing from its log what arrived, drops exactly those: its log ends with
    every group once, and what it received equals what was sent."""
    box = Outbox(shard_sender(new_sender(), 0))
    groups = [make_group(f"g{i:05d}", finished_at=float(i)) for i in range(6_000)]
    frames = []
    for group in groups:
        seq = box.address(group)
        frames.append(msgspec.msgpack.encode(group))
        if seq < 4_000:
            box.keep(seq, frames[-1])  # sent before the kill
    shard = processes(tmp_path, capacity=50_000)
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(shard.ingest)
    client = BufferClient([shard.requests], ctx=ctx, reply_timeout_s=5)
    for frame in frames[:4_000]:
        sock.send(frame)
    wait_until(lambda: client.stats()[0].ingested >= 500)
    consumed = ids(client.fetch(50, 0, 0))
    shard.kill_9()  # mid-stream: some of the 4,000 were in its socket buffers
    sock.close()
    client.close()

    restarted = processes(tmp_path, capacity=50_000)
    client = BufferClient([restarted.requests], ctx=ctx)
    logged_before = client.stats()[0].received_total
    assert 500 <= logged_before <= 4_000
    resend = ctx.socket(zmq.PUSH)
    resend.connect(restarted.ingest)
    again = box.resend_for(1)  # no receipt taken: all 4,000 again
    assert len(again) == 4_000 and box.resend_for(1) == []  # once per restart
    for frame in again + frames[4_000:]:
        resend.send(frame)
    resend.close(linger=-1)
    # Received over both processes, plus the resent ones the log had already.
    wait_until(lambda: sum(_received_and_dropped(client)) == len(groups) + logged_before)
    stats = client.stats()[0]
    assert stats.received_total == len(groups)
    assert stats.resent_duplicates == logged_before  # what the log had, dropped once more
    assert stats.delivered == {box.sender: len(groups) - 1}
    rest = drain(client, len(groups) - len(consumed))
    assert sorted(consumed + rest) == sorted(ids(groups))  # every group once
    box.acknowledge(stats.delivered[box.sender])
    assert not box.unacked
    client.close()


def _received_and_dropped(client: BufferClient) -> tuple[int, int]:
    stats = client.stats()[0]
    return stats.received_total, stats.resent_duplicates
