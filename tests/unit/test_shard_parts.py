"""The buffer shard's parts without its loop (``buffers.server`` names them): ingest, parked
takes and the clock wired by hand over an inproc socket, and a shard built from its spec."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import zmq

from streamrl.buffers.ingest import Ingest
from streamrl.buffers.logged_store import LoggedStore
from streamrl.buffers.parked import ParkedTakes
from streamrl.buffers.receipts import Receipts
from streamrl.buffers.server import BufferShard
from streamrl.buffers.shard_clock import ShardClock
from streamrl.buffers.takes import LastTakes
from streamrl.clock import LearnerClock
from streamrl.config import BufferConfig
from streamrl.controller.specs import ShardSpec
from streamrl.protocol import Batch, BatchRequest, Peek
from tests.support import make_group


def test_parts_answer_a_parked_take_and_a_new_epoch_cancels_it() -> None:
    """A take parks while the store is short; a burst answers it; a parked take of an epoch
    the learners left is dropped unanswered, with the groups sampled on its dead timeline."""
    sent: list[tuple[bytes, object]] = []
    versions = LearnerClock()
    kept = LoggedStore(BufferConfig(max_staleness=4), 0, versions, None)
    ingest = Ingest("shard[0]", kept)
    parked = ParkedTakes(
        kept, versions, ingest, lambda who, msg: sent.append((who, msg)), Receipts(), LastTakes()
    )
    clock = ShardClock("shard[0]", versions, kept, parked)
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://ingest")
    push.connect("inproc://ingest")

    def arrive(*groups) -> None:
        for group in groups:
            push.send(msgspec.msgpack.encode(group))
        burst = ingest.read_burst(pull)
        if burst.accepted:
            parked.answer_ready()

    async def scenario() -> None:
        take = BatchRequest(1, 2, 0, 5, wait_ms=60_000)
        clock.follow(take)
        parked.park(b"rank0", take)
        arrive(make_group("a", 5))
        assert not sent and len(parked.waiting) == 1  # one group of two: still parked
        arrive(make_group("b", 5))
        (who, reply), *_ = sent
        answered = msgspec.msgpack.decode(msgspec.msgpack.encode(reply), type=Batch)
        assert who == b"rank0" and sorted(g.group_id for g in answered.groups) == ["a", "b"]
        assert not parked.waiting
        parked.park(b"rank0", BatchRequest(2, 2, 0, 7, wait_ms=60_000))
        arrive(make_group("v7", 7))  # sampled on weights the restart below takes back
        clock.follow(Peek(0, 0, 0, learner_version=6, learner_epoch=1, forks=[6]))
        assert not parked.waiting and len(sent) == 1  # cancelled, never answered
        assert kept.store.stats()["dropped"]["dead_timeline"] == 1 and len(kept.store) == 0

    try:
        asyncio.run(scenario())
    finally:
        ctx.destroy(linger=0)


def test_a_shard_is_built_from_its_spec(tmp_path: Path) -> None:
    spec = ShardSpec(
        log_file=str(tmp_path / "buffer-2.log"),
        bind_host="127.0.0.1",
        config=BufferConfig(),
        shard_id=2,
        log_dir=str(tmp_path / "buffer"),
        report_endpoint="",
    )
    shard = BufferShard.from_spec(spec)
    try:
        assert shard.shard_id == 2 and shard.ingest_endpoint.startswith("tcp://127.0.0.1:")
        assert shard.log is not None and shard.log.shard_dir == tmp_path / "buffer" / "shard-2"
    finally:
        shard.close()
