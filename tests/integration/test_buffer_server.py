"""Buffer shards over loopback sockets: exactly-k fetches across shards, oldest first, long
polls, staleness, live reconfiguration, backpressure, checkpoints and reports.

Each shard serves from a thread of the test process (its own uvloop); everything talks
through real ZeroMQ sockets on 127.0.0.1.
"""

from __future__ import annotations

import logging
import threading
import time

import msgspec
import pytest
import zmq
from support import make_group, wait_until

from streamrl.buffers import server
from streamrl.buffers.client import BufferClient, FetchStopped, plan_takes
from streamrl.buffers.delivery import Outbox, new_sender, shard_sender
from streamrl.buffers.durable_log import DurableLog
from streamrl.buffers.log_history import scan_shard
from streamrl.buffers.server import MAX_PARKED_PER_PEER, BufferShard
from streamrl.config import BufferConfig
from streamrl.protocol import (
    Batch,
    BatchRequest,
    Peek,
    PeekReply,
    RawBatch,
    ShardReport,
    ShardStats,
    TrajectoryGroup,
)


@pytest.fixture
def start_shard():
    """``start_shard(shard_id, log_dir=None, **config)`` -> a serving ``BufferShard``."""
    running: list[tuple[BufferShard, threading.Thread]] = []

    def start(
        shard_id: int = 0, log_dir=None, report_endpoint=None, ports=(0, 0), **config
    ) -> BufferShard:
        shard = BufferShard(
            BufferConfig(**config),
            shard_id,
            log_dir=log_dir,
            report_endpoint=report_endpoint,
            ports=ports,
        )
        thread = threading.Thread(target=shard.serve, daemon=True)
        thread.start()
        running.append((shard, thread))
        return shard

    yield start
    for shard, thread in running:
        shard.stop()
        thread.join(10)
        assert not thread.is_alive()
        shard.close()


def pusher(ctx: zmq.Context, *shards: BufferShard) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    for shard in shards:
        sock.connect(shard.ingest_endpoint)
    return sock


def push(sock: zmq.Socket, groups: list[TrajectoryGroup]) -> None:
    for group in groups:
        sock.send(msgspec.msgpack.encode(group))


def client_for(ctx: zmq.Context, *shards: BufferShard, **kwargs) -> BufferClient:
    return BufferClient([s.request_endpoint for s in shards], ctx=ctx, **kwargs)


def wait_ingested(client: BufferClient, n: int) -> None:
    wait_until(lambda: sum(s.ingested for s in client.stats()) >= n)


# --------------------------------------------------------------------------- planning


def test_plan_takes_merges_prefixes_oldest_first():
    orders = {0: [(0, 1.0), (0, 4.0)], 1: [(0, 2.0), (0, 3.0), (0, 5.0)], 2: []}
    assert plan_takes(orders, 3) == {0: 1, 1: 2}
    assert plan_takes(orders, 10) == {0: 2, 1: 3}
    assert plan_takes(orders, 0) == {}
    # freshest keys (-min_version, finished_at): the higher version goes first
    assert plan_takes({0: [(-1, 0.0)], 1: [(-3, 9.0)]}, 1) == {1: 1}


# --------------------------------------------------------------------------- fetching


def test_fetch_takes_exactly_k_oldest_first_across_shards(ctx, start_shard):
    shards = [start_shard(0), start_shard(1)]
    groups = [make_group(f"g{i}", finished_at=float(i)) for i in range(12)]
    to_first, to_second = pusher(ctx, shards[0]), pusher(ctx, shards[1])
    push(to_first, groups[0::2])
    push(to_second, groups[1::2])
    client = client_for(ctx, *shards)
    wait_ingested(client, 12)

    first = client.fetch(5, floor=0, learner_version=0)
    assert sorted(g.finished_at for g in first) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert groups[0] in first  # groups arrive whole and intact
    rest = client.fetch(7, floor=0, learner_version=0)
    assert sorted(g.group_id for g in first + rest) == sorted(g.group_id for g in groups)
    stats = client.stats()
    assert [s.size for s in stats] == [0, 0]
    assert [s.consumed for s in stats] == [6, 6]
    client.close()


def test_concurrent_ranks_never_share_a_group(ctx, start_shard):
    shards = [start_shard(0), start_shard(1)]
    groups = [make_group(f"g{i}", finished_at=float(i)) for i in range(60)]
    sock = pusher(ctx, *shards)
    push(sock, groups)
    wait_ingested(client_for(ctx, *shards), 60)

    got: dict[int, list[list[str]]] = {rank: [] for rank in range(3)}

    def rank_loop(rank: int) -> None:
        client = client_for(ctx, *shards, name=f"rank{rank}")
        for _ in range(5):
            got[rank].append([g.group_id for g in client.fetch(4, 0, 0, timeout_s=20)])
        client.close()

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batches = [batch for rank in got.values() for batch in rank]
    assert len(batches) == 15 and all(len(b) == 4 for b in batches)
    ids = [gid for batch in batches for gid in batch]
    assert len(set(ids)) == 60 == len(ids)


def test_fetch_long_polls_until_data_arrives(ctx, start_shard):
    shards = [start_shard(0), start_shard(1)]
    client = client_for(ctx, *shards, poll_ms=50)
    result: list[TrajectoryGroup] = []
    fetcher = threading.Thread(target=lambda: result.extend(client.fetch(2, 0, 0, timeout_s=20)))
    start = time.monotonic()
    fetcher.start()
    time.sleep(0.3)
    assert not result
    sock = pusher(ctx, shards[1])
    push(sock, [make_group("late-0"), make_group("late-1")])
    fetcher.join(20)
    assert sorted(g.group_id for g in result) == ["late-0", "late-1"]
    assert time.monotonic() - start >= 0.3


def test_fetch_times_out_with_a_clear_log_line(ctx, start_shard, caplog):
    shard = start_shard(0)
    sock = pusher(ctx, shard)
    push(sock, [make_group("old", version=0)])
    client = client_for(ctx, shard, poll_ms=20, log_every_s=0.05)
    wait_ingested(client, 1)
    with caplog.at_level(logging.INFO, logger="streamrl.buffers.client"):
        with pytest.raises(TimeoutError, match="0/1 groups with min_version >= 1"):
            client.fetch(1, floor=1, learner_version=1, timeout_s=0.3)
    lines = [r.getMessage() for r in caplog.records if "waiting for data" in r.getMessage()]
    assert lines
    assert "0/1 groups with min_version >= 1" in lines[0]
    assert "shards hold [1] groups, none eligible" in lines[0]


def test_fetch_stops_when_asked_while_holding_nothing(ctx, start_shard):
    shard = start_shard(0)
    client = client_for(ctx, shard, poll_ms=20)
    stop = threading.Event()
    start = time.monotonic()  # before the timer: it fires 0.2 s after its own start
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(FetchStopped) as info:
        client.fetch(2, 0, 0, timeout_s=20, should_stop=stop.is_set)
    assert info.value.dropped == 0
    assert 0.2 <= time.monotonic() - start < 5
    client.close()


def test_fetch_asked_to_stop_while_holding_groups_waits_for_the_rest_then_gives_up(
    ctx, start_shard, caplog
):
    shard = start_shard(0)
    sock = pusher(ctx, shard)
    push(sock, [make_group("only")])
    client = client_for(ctx, shard, poll_ms=20, stop_grace_s=0.3)
    wait_ingested(client, 1)
    asked = iter([False])  # asked to stop from the second round on: holding 1 of 2 by then
    start = time.monotonic()
    with pytest.raises(FetchStopped) as info:
        client.fetch(2, 0, 0, timeout_s=20, should_stop=lambda: next(asked, True))
    assert info.value.dropped == 1
    assert time.monotonic() - start >= 0.3  # waited out the grace period for the second
    assert any("dropping the 1 groups" in r.getMessage() for r in caplog.records)

    push(sock, [make_group("a")])
    wait_ingested(client, 2)
    asked = iter([False])
    threading.Timer(0.1, push, (sock, [make_group("b")])).start()
    got = client.fetch(2, 0, 0, timeout_s=20, should_stop=lambda: next(asked, True))
    assert [g.group_id for g in got] == ["a", "b"]  # the rest came within the grace period
    client.close()


def test_client_drops_a_group_with_inconsistent_arrays(ctx):
    """A real shard refuses such a group; the client checks anyway. A fake shard (ROUTER on
    loopback) answers one peek and one take with a good group and a bad one."""
    bad = make_group("bad")
    bad.trajectories[1].behavior_logprobs = bad.trajectories[1].behavior_logprobs[:-4]
    frames = [msgspec.msgpack.encode(g) for g in (make_group("ok"), bad)]
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def fake_shard() -> None:
        for _ in range(2):
            identity, body = router.recv_multipart()
            match msgspec.msgpack.decode(body, type=Peek | BatchRequest):
                case Peek() as peek:
                    reply = PeekReply(peek.request_id, [(0, 0.0), (0, 1.0)], 2)
                case BatchRequest() as take:
                    reply = RawBatch(take.request_id, [msgspec.Raw(f) for f in frames])
            router.send_multipart([identity, msgspec.msgpack.encode(reply)])

    thread = threading.Thread(target=fake_shard, daemon=True)
    thread.start()
    # The fake shard answers twice; the third request's reply is awaited reply_timeout_s.
    client = BufferClient([f"tcp://127.0.0.1:{port}"], ctx=ctx, reply_timeout_s=0.5)
    with pytest.raises(TimeoutError):  # one of the two groups was dropped, none come after
        client.fetch(2, 0, 0, timeout_s=0.2)
    thread.join(5)
    assert client.group_codec.malformed == {"inconsistent_lengths": 1}
    client.close()
    router.close(linger=0)


def test_a_logged_group_that_does_not_decode_does_not_stop_a_restart(ctx, start_shard, tmp_path):
    with DurableLog(tmp_path, 0) as log:
        log.append(make_group("g0"))
        log.append_many([make_group("bad")], [b"\xc1junk"])
        log.append(make_group("g1"))
    shard = start_shard(0, log_dir=tmp_path)
    client = client_for(ctx, shard)
    (stats,) = client.stats()
    assert stats.recovered == 2 and stats.size == 2
    assert stats.malformed_by_kind == {"ingest/DecodeError": 1}
    assert client.fetch(2, 0, 0) == [make_group("g0"), make_group("g1")]
    client.close()


def test_floor_and_staleness_bound_what_is_handed_out(ctx, start_shard):
    shard = start_shard(0, max_staleness=1)
    sock = pusher(ctx, shard)
    push(sock, [make_group(f"v{v}", version=v) for v in range(4)])
    client = client_for(ctx, shard)
    wait_ingested(client, 4)
    assert client.stats()[0].staleness_hist == {0: 1, -1: 1, -2: 1, -3: 1}

    # The learner at version 3: v0 and v1 are past max_staleness=1 and are evicted.
    got = client.fetch(2, floor=2, learner_version=3)
    assert sorted(g.group_id for g in got) == ["v2", "v3"]
    stats = client.stats()[0]
    assert stats.dropped["stale"] == 2
    assert stats.size == 0


def test_batch_request_long_poll_speaks_plain_batch(ctx, start_shard):
    """The shard's ``RawBatch`` reply decodes as a ``Batch``; a long poll answers as soon as
    ``k`` groups exist, or with what there is when its wait runs out."""
    shard = start_shard(0)
    sock = pusher(ctx, shard)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(shard.request_endpoint)
    decoder = msgspec.msgpack.Decoder(Batch)

    def ask(request_id: int, k: int, wait_ms: int) -> None:
        dealer.send(msgspec.msgpack.encode(BatchRequest(request_id, k, 0, 0, wait_ms)))

    ask(1, k=2, wait_ms=0)
    assert decoder.decode(dealer.recv()) == Batch(1, [])

    dealer.send(
        msgspec.msgpack.encode(BatchRequest(2, k=2, floor=0, learner_version=0, wait_ms=5000))
    )
    push(sock, [make_group("a")])
    assert not dealer.poll(300)  # one group is not enough
    push(sock, [make_group("b")])
    assert dealer.poll(5000)
    reply = decoder.decode(dealer.recv())
    assert reply.request_id == 2 and [g.group_id for g in reply.groups] == ["a", "b"]

    start = time.monotonic()
    dealer.send(
        msgspec.msgpack.encode(BatchRequest(3, k=5, floor=0, learner_version=0, wait_ms=200))
    )
    push(sock, [make_group("c")])
    assert dealer.poll(5000)
    reply = decoder.decode(dealer.recv())
    assert [g.group_id for g in reply.groups] == ["c"]
    assert time.monotonic() - start >= 0.19
    dealer.close(linger=0)


def test_a_peer_flooding_long_polls_keeps_a_bounded_number_parked(ctx, start_shard):
    """Past MAX_PARKED_PER_PEER, each new poll of a peer answers its oldest at once (empty):
    every poll is answered exactly once and the shard parks at most the cap for that peer."""
    shard = start_shard(0)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(shard.request_endpoint)
    decoder = msgspec.msgpack.Decoder(Batch)
    flood = MAX_PARKED_PER_PEER + 5
    for request_id in range(flood):
        dealer.send(msgspec.msgpack.encode(BatchRequest(request_id, 1, 0, 0, wait_ms=60_000)))
    early = [decoder.decode(dealer.recv()) for _ in range(5)]
    assert [b.request_id for b in early] == list(range(5)) and all(not b.groups for b in early)
    assert not dealer.poll(300)  # the newest MAX_PARKED_PER_PEER stay parked
    wait_until(lambda: len(shard.waiting) == MAX_PARKED_PER_PEER)
    sock = pusher(ctx, shard)
    push(sock, [make_group("a")])
    assert dealer.poll(5000)
    reply = decoder.decode(dealer.recv())
    assert reply.request_id == 5 and [g.group_id for g in reply.groups] == ["a"]
    dealer.close(linger=0)


# --------------------------------------------------------------------------- live tuning


def test_reconfigure_changes_knobs_live(ctx, start_shard):
    shard = start_shard(0, capacity=8)
    sock = pusher(ctx, shard)
    push(sock, [make_group(f"g{i}", finished_at=float(i)) for i in range(8)])
    client = client_for(ctx, shard)
    wait_ingested(client, 8)

    assert [a.ok for a in client.reconfigure(capacity=3)] == [True]
    stats = client.stats()[0]
    assert (stats.capacity, stats.size, stats.dropped["capacity"]) == (3, 3, 5)

    (bad,) = client.reconfigure(sampling="bogus")
    assert not bad.ok and "sampling" in bad.error

    assert client.reconfigure(sampling="freshest", capacity=10)[0].ok
    push(sock, [make_group("fresh", version=2), make_group("mid", version=1)])
    wait_ingested(client, 10)
    got = client.fetch(2, floor=0, learner_version=2)
    assert [g.group_id for g in got] == ["fresh", "mid"]
    assert [g.group_id for g in client.fetch(3, 0, 2)] == ["g5", "g6", "g7"]


def test_overflow_block_holds_groups_until_space_frees(ctx, start_shard):
    shard = start_shard(0, capacity=2, overflow="block")
    sock = pusher(ctx, shard)
    push(sock, [make_group(f"g{i}") for i in range(5)])
    client = client_for(ctx, shard)
    wait_until(lambda: client.stats()[0].held == 1)
    stats = client.stats()[0]
    assert (stats.ingested, stats.size, sum(stats.dropped.values())) == (2, 2, 0)

    got = client.fetch(2, 0, 0) + client.fetch(3, 0, 0, timeout_s=10)
    assert [g.group_id for g in got] == [f"g{i}" for i in range(5)]
    assert client.stats()[0].held == 0

    assert client.reconfigure(overflow="drop-oldest")[0].ok


# --------------------------------------------------------------------------- durability


def test_checkpoint_compacts_the_durable_log(ctx, start_shard, tmp_path):
    shard = start_shard(0, log_dir=tmp_path)
    sock = pusher(ctx, shard)
    push(sock, [make_group(f"g{i}", finished_at=float(i)) for i in range(6)])
    client = client_for(ctx, shard)
    wait_ingested(client, 6)
    client.fetch(4, 0, 0)

    assert [a.ok for a in client.checkpoint()] == [True]
    shard_dir = tmp_path / "shard-0"
    assert list(shard_dir.glob("*.compact.arrows"))
    # The unconsumed groups, and the groups of the client's last take (consumed): a repeat of
    # that request must get them again after a restart (buffers.takes).
    assert [(g.group_id, consumed) for g, consumed in scan_shard(shard_dir)] == [
        *[(f"g{i}", True) for i in range(4)],
        ("g4", False),
        ("g5", False),
    ]


def test_typed_identities_and_old_ids_are_one_delivery_record_across_a_restart(
    ctx, start_shard, tmp_path
):
    """A group's delivery identity is its typed fields (sender, seq); a frame from before them
    names it in its id only. To a shard both are the same group, before and after it restarts
    on its log (which keeps only ids); a frame whose fields and id disagree is malformed."""
    box = Outbox(shard_sender(new_sender(), 0))
    groups = [make_group("") for _ in range(4)]
    for group in groups:
        box.address(group)

    def old_frame(group: TrajectoryGroup) -> bytes:  # as generators sent groups before
        fields = msgspec.to_builtins(group, builtin_types=(bytes,))
        del fields["sender"], fields["seq"]
        return msgspec.msgpack.encode(fields)

    new = [msgspec.msgpack.encode(g) for g in groups]
    old = [old_frame(g) for g in groups]
    liar = msgspec.msgpack.encode(msgspec.structs.replace(groups[0], seq=9))  # its id says 0
    shard = start_shard(0, log_dir=tmp_path)
    sock = pusher(ctx, shard)
    for frame in (new[0], old[1], new[2], old[0], new[1], liar, new[3]):
        sock.send(frame)
    client = client_for(ctx, shard)
    wait_until(lambda: client.stats()[0].delivered == {box.sender: 3})
    stats = client.stats()[0]
    assert (stats.ingested, stats.resent_duplicates) == (4, 2)
    assert stats.malformed_by_kind == {"ingest/ValidationError": 1}
    shard.stop()
    time.sleep(0.2)
    shard.close()

    restarted = start_shard(0, log_dir=tmp_path)
    sock = pusher(ctx, restarted)
    for frame in old + new:  # every one of them arrived before the restart
        sock.send(frame)
    client = client_for(ctx, restarted)
    wait_until(lambda: client.stats()[0].resent_duplicates == 8)
    stats = client.stats()[0]
    assert stats.delivered == {box.sender: 3} and (stats.received_total, stats.size) == (4, 4)
    assert sorted(g.group_id for g in client.fetch(4, 0, 0)) == sorted(g.group_id for g in groups)


def test_periodic_compaction_runs_after_consumption(ctx, start_shard, tmp_path):
    shard = start_shard(0, log_dir=tmp_path, compact_every_s=0.2)
    sock = pusher(ctx, shard)
    push(sock, [make_group(f"g{i}") for i in range(3)])
    client = client_for(ctx, shard)
    wait_ingested(client, 3)
    assert not list((tmp_path / "shard-0").glob("*.compact.arrows"))
    client.fetch(2, 0, 0)
    wait_until(lambda: list((tmp_path / "shard-0").glob("*.compact.arrows")))
    # g0 and g1 stay as the client's last take (consumed), g2 unconsumed.
    kept = [(g.group_id, consumed) for g, consumed in scan_shard(tmp_path / "shard-0")]
    assert kept == [("g0", True), ("g1", True), ("g2", False)]


def test_durable_off_writes_no_log(ctx, start_shard, tmp_path):
    shard = start_shard(0, log_dir=tmp_path, durable=False)
    sock = pusher(ctx, shard)
    push(sock, [make_group("g0")])
    client = client_for(ctx, shard)
    wait_ingested(client, 1)
    (ack,) = client.checkpoint()
    assert ack.ok and ack.error == "no durable log"
    assert not (tmp_path / "shard-0").exists()


def test_shard_reports_to_the_controller(ctx, start_shard):
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    shard = start_shard(3, report_endpoint=f"tcp://127.0.0.1:{port}")
    sock = pusher(ctx, shard)
    push(sock, [make_group("g0")])
    decoder = msgspec.msgpack.Decoder(ShardReport)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert pull.poll(2000)
        report = decoder.decode(pull.recv())
        if report.stats.ingested == 1:
            break
    assert report.stats.shard_id == 3 and report.stats.size == 1
    pull.close(linger=0)


def test_a_drop_is_reported_at_once_not_at_the_next_tick(ctx, start_shard, monkeypatch):
    """Admission counts a dropped group against the staleness budget until a report says it
    was dropped, so a burst that drops is reported right away; an accepted group waits for
    the periodic report (here an hour away)."""
    monkeypatch.setattr(server, "REPORT_EVERY_S", 3600.0)
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    shard = start_shard(report_endpoint=f"tcp://127.0.0.1:{port}", drop_zero_variance=True)
    sock = pusher(ctx, shard)
    push(sock, [make_group("kept")])
    wait_ingested(client_for(ctx, shard), 1)
    assert not pull.poll(300), "an accepted group alone should wait for the periodic report"
    flat = make_group("flat")
    for trajectory in flat.trajectories:
        trajectory.reward = 1.0
    push(sock, [flat])
    assert pull.poll(10_000), "no report after a drop"
    report = msgspec.msgpack.decode(pull.recv(), type=ShardReport)
    assert report.stats.dropped["zero_variance"] == 1 and report.stats.size == 1
    pull.close(linger=0)


# --------------------------------------------------------------------------- idempotent takes


def ask(sock: zmq.Socket, request: BatchRequest) -> list[str]:
    """Send one batch request; the ids of the groups in its reply."""
    sock.send(msgspec.msgpack.encode(request))
    assert sock.poll(5000), "no reply"
    reply = msgspec.msgpack.decode(sock.recv(), type=Batch)
    assert reply.request_id == request.request_id
    return [g.group_id for g in reply.groups]


def test_a_repeated_take_gets_the_same_groups_across_a_shard_restart(ctx, start_shard, tmp_path):
    """The reply to a take is lost with its shard's process: the restarted shard answers the
    client's repeat with the same groups, takes nothing new for it, and the log's tallies stay
    exact."""
    shard = start_shard(0, log_dir=tmp_path)
    pushing = pusher(ctx, shard)  # kept: a collected socket drops what it has not sent
    push(pushing, [make_group(f"g{i}", finished_at=float(i)) for i in range(4)])
    wait_ingested(client_for(ctx, shard), 4)
    first = ctx.socket(zmq.DEALER)
    first.connect(shard.request_endpoint)
    take = BatchRequest(7, 2, 0, 0, 0, client="learner.0")
    assert ask(first, take) == ["g0", "g1"]

    ports = tuple(int(e.rsplit(":", 1)[1]) for e in (shard.ingest_endpoint, shard.request_endpoint))
    shard.stop()
    time.sleep(0.2)
    shard.close()
    restarted = start_shard(0, log_dir=tmp_path, ports=ports)
    sock = ctx.socket(zmq.DEALER)
    sock.connect(restarted.request_endpoint)
    assert ask(sock, take) == ["g0", "g1"]  # the same groups again
    assert ask(sock, take) == ["g0", "g1"]  # as often as asked
    assert ask(sock, BatchRequest(6, 2, 0, 0, 0, client="learner.0")) == []  # stale request
    assert ask(sock, BatchRequest(8, 2, 0, 0, 0, client="learner.0")) == ["g2", "g3"]
    stats = client_for(ctx, restarted).stats()[0]
    assert (stats.size, stats.retried_takes) == (0, 2)
    assert (stats.received_total, stats.removed_total) == (4, {"consumed": 4})


def test_the_client_asks_again_for_a_take_whose_reply_was_lost(ctx, start_shard, monkeypatch):
    shard = start_shard(0)
    pushing = pusher(ctx, shard)  # kept: a collected socket drops what it has not sent
    push(pushing, [make_group(f"g{i}", finished_at=float(i)) for i in range(4)])
    client = client_for(ctx, shard, retry_s=0.2)
    wait_ingested(client, 4)
    real_exchange = client._exchange
    lost = []

    def lose_the_first_batch(requests, **kwargs):
        replies = real_exchange(requests, **kwargs)
        if not lost and any(isinstance(r, BatchRequest) for r in requests.values()):
            lost.append(replies)  # the shard took the groups; the reply never arrives
            return {}
        return replies

    monkeypatch.setattr(client, "_exchange", lose_the_first_batch)
    assert [g.group_id for g in client.fetch(2, 0, 0)] == ["g0", "g1"]
    lost_ids = [msgspec.msgpack.decode(f, type=TrajectoryGroup).group_id for f in lost[0][0].groups]
    assert lost_ids == ["g0", "g1"]
    stats = client.stats()[0]
    assert (stats.size, stats.consumed, stats.retried_takes) == (2, 2, 1)


# --------------------------------------------------------------------------- the learner clock


def test_a_new_learner_epoch_cancels_the_dead_groups_takes_and_its_timeline(ctx, start_shard):
    """A learner group restarted from step 8 after reaching 11 (``streamrl.clock``): the
    shard follows its version down, drops groups sampled after the fork on the dead
    timeline, cancels the dead group's parked take (an answer would go to a dead peer with
    the groups it took), and its take receipts name the prompts each step took (kept since
    a checkpoint exists: at 8)."""
    shard = start_shard(0, max_staleness=4)
    sock = pusher(ctx, shard)
    dead = ctx.socket(zmq.DEALER)
    dead.connect(shard.request_endpoint)
    observer = client_for(ctx, shard)

    def stats() -> ShardStats:
        (figures,) = observer.stats()
        return figures

    # Epoch 0 reaches version 10 and takes a batch for step 11.
    push(sock, [make_group("g10", 10)])
    push(
        sock,
        [TrajectoryGroup(**{**msgspec.structs.asdict(make_group("p", 10)), "prompt_index": 7})],
    )
    wait_until(lambda: stats().ingested == 2)
    assert ask(dead, BatchRequest(1, 2, 9, 10, 0, "dead.rank0", checkpointed=8)) == ["g10", "p"]
    # ... and parks a take for step 12 that nothing answers yet.
    dead.send(
        msgspec.msgpack.encode(BatchRequest(2, 1, 10, 11, 60_000, "dead.rank0", checkpointed=8))
    )
    push(sock, [make_group("v11", 11)])  # sampled on the dead timeline
    assert dead.poll(5000)  # v11 answered the parked take
    assert [g.group_id for g in msgspec.msgpack.decode(dead.recv(), type=Batch).groups] == ["v11"]
    assert len(stats().receipts) == 2
    push(sock, [make_group("v11b", 11), make_group("v8", 8)])
    wait_until(lambda: stats().ingested == 5)
    # A parked take the shard would answer with what there is after 1.5 s, were it kept.
    dead.send(msgspec.msgpack.encode(BatchRequest(3, 5, 0, 11, 1500, "dead.rank0", checkpointed=8)))
    time.sleep(0.2)

    announcer = client_for(ctx, shard, epoch=1, forks=[8])
    assert announcer.announce(8) == [0]
    now = stats()
    assert (now.learner_epoch, now.learner_version) == (1, 8)
    assert now.dropped["dead_timeline"] == 1 and now.size == 1  # v11b gone, v8 kept
    receipts = [(r.epoch, r.step, r.prompt_indices) for r in now.receipts]
    assert receipts == [(0, 11, [-1, 7]), (0, 12, [-1])]
    # The dead group's parked take was cancelled: nothing answers it, even when groups come.
    push(sock, [make_group("late", 11)])  # the dead timeline, arriving late: refused
    fresh = TrajectoryGroup(**{**msgspec.structs.asdict(make_group("new", 9)), "weights_epoch": 1})
    push(sock, [fresh])
    wait_until(lambda: stats().ingested == 6)
    assert not dead.poll(2500)
    assert stats().dropped["dead_timeline"] == 2
    # A request of the replaced group is answered empty, taking nothing.
    assert ask(dead, BatchRequest(4, 2, 0, 11, 0, "dead.rank0")) == []
    # The new group takes what is on its timeline; its first take prunes old receipts.
    learner = client_for(ctx, shard, epoch=1, forks=[8])
    learner.checkpointed = 8  # resumed from it, as a restarted learner's client says
    taken = learner.fetch(2, 7, 8, timeout_s=5)
    assert sorted(g.group_id for g in taken) == ["new", "v8"]
    assert [(r.epoch, r.step) for r in stats().receipts] == [(1, 9)]
    for s in (dead, sock):
        s.close(linger=0)
    for client in (announcer, learner, observer):
        client.close()


def test_a_shard_reports_the_seqs_that_arrived_above_its_floor(ctx, start_shard):
    """Groups are given seqs by grant and pushed as their scores settle: seqs 2 and 1 before
    0. The shard's stats name them above the floor (``delivered_above``) until 0 comes, so
    the controller can tell which of a dead generator's grants arrived."""
    box = Outbox(shard_sender(new_sender(), 0))
    groups = [make_group("") for _ in range(3)]
    for seq, group in enumerate(groups):
        box.address(group, seq)
    shard = start_shard(0)
    sock = pusher(ctx, shard)
    client = client_for(ctx, shard)
    for group in (groups[2], groups[1]):
        sock.send(msgspec.msgpack.encode(group))
    stats = wait_until(lambda: (s := client.stats()[0]).delivered_above and s)
    assert stats.delivered == {box.sender: -1}
    assert stats.delivered_above == {box.sender: [1, 2]}
    sock.send(msgspec.msgpack.encode(groups[0]))
    stats = wait_until(lambda: (s := client.stats()[0]).delivered.get(box.sender) == 2 and s)
    assert stats.delivered_above == {}
    client.close()
