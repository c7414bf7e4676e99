"""Bad input never takes a shard down: garbage, truncated msgpack, wrong types, wrong kinds,
multipart junk, oversized frames and random mutations are counted, logged once per kind and
dropped, while well-behaved peers keep being served.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import msgspec
import pytest
import zmq

from streamrl.buffers.client import BufferClient
from streamrl.buffers.server import BufferShard
from streamrl.config import BufferConfig
from streamrl.protocol import (
    Batch,
    BatchRequest,
    RawBatch,
    ShardStats,
    StatsRequest,
    Trajectory,
    TrajectoryGroup,
    pack_float32,
    pack_int32,
)

MAX_BYTES = 64 * 1024
encode = msgspec.msgpack.encode


def make_group(gid: str) -> TrajectoryGroup:
    trajectories = [
        Trajectory.from_lists([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], [0, 0, 0], reward, "stop", 0)
        for reward in (0.0, 1.0)
    ]
    return TrajectoryGroup(gid, f"p-{gid}", trajectories, 1.0, 2.0)


def group_dict(gid: str) -> dict:
    return msgspec.to_builtins(make_group(gid), builtin_types=(bytes,))


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture(params=[False, True], ids=["memory", "durable"])
def shard(request, tmp_path):
    """A serving shard; every test runs without and with the durable log."""
    config = BufferConfig(max_message_bytes=MAX_BYTES, capacity=4096, durable=request.param)
    shard = BufferShard(config, 0, log_dir=tmp_path)
    thread = threading.Thread(target=shard.serve, daemon=True)
    thread.start()
    yield shard
    shard.stop()
    thread.join(10)
    assert not thread.is_alive()
    shard.close()


def connect(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def ingest_junk(rng: random.Random) -> list[bytes | list[bytes]]:
    """Frames (or multipart messages) that must all be counted as malformed on PULL."""
    valid = encode(make_group("template"))
    junk: list[bytes | list[bytes]] = [rng.randbytes(rng.randrange(0, 300)) for _ in range(100)]
    junk += [valid[:cut] for cut in range(0, len(valid), 7)]  # truncated msgpack
    bad_fields = [
        {"group_id": 5},
        {"trajectories": "nope"},
        {"created_at": "yesterday"},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "reward": "high"}]},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "finish_reason": "bogus"}]},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "token_versions": ["a"] * 3}]},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "response_ids": {"a": 1}}]},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "prompt_ids": [1, 2]}]},
        {"trajectories": [{**group_dict("x")["trajectories"][0], "token_versions": "AAAA"}]},
        {
            "trajectories": [
                {**group_dict("x")["trajectories"][0], "token_versions": pack_int32([-1] * 3)}
            ]
        },
    ]
    junk += [encode({**group_dict(f"typed-{i}"), **bad}) for i, bad in enumerate(bad_fields)]
    missing = group_dict("missing")
    del missing["prompt_id"]
    junk.append(encode(missing))
    lengths = group_dict("lengths")
    lengths["trajectories"][0]["behavior_logprobs"] = pack_float32([-0.1])  # 3 tokens, 1 logprob
    junk.append(encode(lengths))
    ragged = group_dict("ragged")
    ragged["trajectories"][1]["response_ids"] += b"\x00"  # 13 bytes: not whole int32s
    junk.append(encode(ragged))
    # invalid UTF-8 in a string field; arrays nested deeper than msgspec recurses
    junk.append(encode(make_group("AAAA")).replace(b"\xa4AAAA", b"\xa4\xff\xfe\xfd\xfc", 1))
    with_truth = msgspec.structs.replace(make_group("t"), ground_truth="BBBB")
    junk.append(encode(with_truth).replace(b"\xa4BBBB", b"\xa4\xc3\x28\xa0\xa1"))
    junk += [b"\x91" * 50_000, encode(group_dict("deep"))[:-60] + b"\x91" * 30_000]
    # valid messages of the wrong kind
    junk += [encode(BatchRequest(1, 2, 0, 0)), encode(StatsRequest()), encode([1, 2, 3])]
    junk += [encode(Batch(1, [make_group("inner")])), encode("a string"), b"\xc1"]
    # multipart: even with a valid group inside, the message is not one frame
    junk += [[b"junk", valid], [valid, valid]]
    return junk


def request_junk(rng: random.Random) -> list[bytes | list[bytes]]:
    """Bodies (or multipart bodies) that must all be counted as malformed on ROUTER."""
    valid = encode(BatchRequest(7, 2, 0, 0, 100))
    junk: list[bytes | list[bytes]] = [rng.randbytes(rng.randrange(0, 200)) for _ in range(100)]
    junk += [valid[:cut] for cut in range(len(valid))]  # truncated, including empty
    junk += [
        encode({"type": "batch_request", "request_id": 1, "k": "two", "floor": 0}),
        encode({"type": "batch_request", "request_id": 1}),
        encode({"type": "reconfigure", "capacity": "big"}),
        encode({"type": "no_such_kind"}),
        encode({"k": 2}),
        encode(make_group("wrong-socket")),
        encode(ShardStats(0, 0, 0, 0, 0, {}, 0)),
    ]
    junk += [[b"a", b"b"], [b"", b"", b""], [valid, valid]]
    nested = encode({"type": "stats_request", "x": 0})[:-1] + b"\x91" * 50_000  # skipped key
    utf8 = encode({"type": "reconfigure", "sampling": "SSSS"})
    junk += [nested, utf8.replace(b"\xa4SSSS", b"\xa4\xff\xff\xff\xff")]
    return junk


def send(sock: zmq.Socket, message: bytes | list[bytes]) -> None:
    if isinstance(message, list):
        sock.send_multipart(message)
    else:
        sock.send(message)


def test_shard_survives_malformed_input_and_keeps_serving(shard, ctx, caplog):
    rng = random.Random(1234)
    ingest, requests = ingest_junk(rng), request_junk(rng)
    client = BufferClient([shard.request_endpoint], ctx=ctx, reply_timeout_s=5)
    good = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
    send(good, encode(make_group("before")))
    wait_until(lambda: client.stats()[0].ingested == 1)

    with caplog.at_level(logging.INFO, logger="streamrl"):
        # Oversized frames: libzmq drops the sending peer, nobody else notices.
        big_push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
        send(big_push, encode(make_group("x" * (MAX_BYTES + 10))))
        big_dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
        send(big_dealer, b"\x00" * ((1 << 20) + 10))

        junk_push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
        for message in ingest:
            send(junk_push, message)
        send(junk_push, encode(make_group("after-junk")))  # same connection: arrives last

        junk_dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
        for message in requests:
            send(junk_dealer, message)
        send(junk_dealer, encode(StatsRequest()))  # same connection: answered after the junk
        assert junk_dealer.poll(10_000)
        msgspec.msgpack.decode(junk_dealer.recv(), type=ShardStats)

        send(good, encode(make_group("after")))
        wait_until(lambda: client.stats()[0].ingested == 3)
        wait_until(lambda: client.stats()[0].disconnects >= 2)

    stats = client.stats()[0]
    by_kind = stats.malformed_by_kind
    assert sum(n for k, n in by_kind.items() if k.startswith("ingest/")) == len(ingest)
    assert sum(n for k, n in by_kind.items() if k.startswith("requests/")) == len(requests)
    assert stats.malformed == len(ingest) + len(requests)
    kinds = ("DecodeError", "ValidationError", "frames", "UnicodeDecodeError", "RecursionError")
    for kind in (*kinds, "inconsistent_lengths"):
        assert by_kind[f"ingest/{kind}"] > 0, kind
    for kind in kinds:
        assert by_kind[f"requests/{kind}"] > 0, kind
    # Logged once per kind, however many arrived.
    warnings = [r.getMessage() for r in caplog.records if "dropped malformed" in r.getMessage()]
    assert len(warnings) == len(by_kind)

    # Well-behaved peers are still served: exactly the valid groups come out, intact.
    got = client.fetch(3, 0, 0, timeout_s=10)
    assert got[0] == make_group("before")  # ingested before anything else was sent
    assert sorted(g.group_id for g in got[1:]) == ["after", "after-junk"]
    assert client.group_codec.malformed_total == 0  # the shard let nothing bad through
    assert client.stats()[0].size == 0
    client.close()


def test_shard_survives_random_mutations_of_valid_frames(shard, ctx):
    """Every frame ends in exactly one place: malformed, ingested, or dropped by policy."""
    rng = random.Random(99)
    frames = []
    for i in range(1500):
        frame = bytearray(encode(make_group(f"m{i}")))
        for _ in range(rng.randrange(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        frames.append(bytes(frame))
    sentinel = encode(make_group("sentinel"))
    frames.append(sentinel)
    push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
    for frame in frames:
        push.send(frame)

    client = BufferClient([shard.request_endpoint], ctx=ctx, reply_timeout_s=5)

    def accounted() -> int:
        s = client.stats()[0]
        return s.malformed + s.ingested + sum(s.dropped.values())

    wait_until(lambda: accounted() == len(frames))
    stats = client.stats()[0]
    assert stats.malformed > 0 and stats.ingested > 0
    assert stats.dropped["overflow"] == stats.dropped["capacity"] == 0  # no double counting

    # The shard still answers requests, and hands back frames byte for byte.
    dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
    dealer.send(encode(BatchRequest(1, stats.size, -(2**40), 0, 0)))
    assert dealer.poll(10_000)
    reply = msgspec.msgpack.decode(dealer.recv(), type=RawBatch)
    assert len(reply.groups) == stats.size
    assert bytes(reply.groups[-1]) == sentinel
    client.close()


def test_absurd_but_well_typed_requests_are_answered(shard, ctx):
    dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
    for request in (
        BatchRequest(1, k=-5, floor=0, learner_version=0, wait_ms=-1),
        BatchRequest(2, k=10**12, floor=2**62, learner_version=0, wait_ms=0),
        BatchRequest(3, k=1, floor=0, learner_version=0, wait_ms=2**62),  # capped wait
    ):
        dealer.send(encode(request))
    replies = []
    while len(replies) < 2:
        assert dealer.poll(5_000)
        replies.append(msgspec.msgpack.decode(dealer.recv(), type=Batch))
    assert sorted(r.request_id for r in replies) == [1, 2]
    push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
    push.send(encode(make_group("g")))  # answers the parked request 3
    assert dealer.poll(5_000)
    reply = msgspec.msgpack.decode(dealer.recv(), type=Batch)
    assert reply.request_id == 3 and reply.groups == [make_group("g")]
