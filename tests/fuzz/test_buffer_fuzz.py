"""Bad input never takes a buffer shard down (``buffers.server.BufferShard``, ingest PULL and
requests ROUTER): garbage, truncated msgpack, wrong types, wrong kinds, multipart junk,
oversized frames and random mutations are counted, logged once per kind and dropped, while
well-behaved peers keep being served. The ingest and the request sockets each get 10,000
seeded inputs (``fuzzgen.msgpack_corpus``), without and with the durable log.
"""

from __future__ import annotations

import logging
import random

import msgspec
import pytest
import zmq
from fuzzgen import Tally, classify, msgpack_corpus, send, send_all, serving
from support import make_group, wait_until

from streamrl.buffers.client import BufferClient
from streamrl.buffers.frames import GroupDecoder
from streamrl.buffers.server import BufferShard
from streamrl.config import BufferConfig
from streamrl.protocol import (
    Ack,
    AdmissionRequest,
    Batch,
    BatchRequest,
    Checkpoint,
    Peek,
    PeekReply,
    RawBatch,
    Reconfigure,
    ShardReply,
    ShardRequest,
    ShardStats,
    StatsRequest,
    Trajectory,
    TrajectoryGroup,
    pack_float32,
    pack_int32,
)
from streamrl.transport import DECODE_ERRORS

pytestmark = pytest.mark.slow

N_INPUTS = 10_000
MAX_BYTES = 64 * 1024
encode = msgspec.msgpack.encode


def group_dict(gid: str) -> dict:
    return msgspec.to_builtins(make_group(gid), builtin_types=(bytes,))


BASE_POLICY = {
    "capacity": 4096,
    "max_staleness": 2,
    "sampling": "fifo",
    "max_reuse": 1,
    "overflow": "drop-oldest",
    "drop_zero_variance": False,
}


@pytest.fixture(params=[False, True], ids=["memory", "durable"])
def shard(request, tmp_path):
    """A serving shard; every test runs without and with the durable log."""
    config = BufferConfig(max_message_bytes=MAX_BYTES, durable=request.param, **BASE_POLICY)
    with serving(BufferShard(config, 0, log_dir=tmp_path)) as shard:
        yield shard


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
    junk += [b"\x91" * 50_000, too_deep()]
    # valid messages of the wrong kind
    junk += [encode(BatchRequest(1, 2, 0, 0)), encode(StatsRequest()), encode([1, 2, 3])]
    junk += [encode(Batch(1, [make_group("inner")])), encode("a string"), b"\xc1"]
    # multipart: even with a valid group inside, the message is not one frame
    junk += [[b"junk", valid], [valid, valid]]
    return junk


def too_deep() -> bytes:
    """A group frame cut where a value may be an array, then arrays nested deeper than msgspec
    recurses: the first cut (from the end) whose decode raises ``RecursionError``."""
    frame = encode(group_dict("deep"))
    for cut in range(40, len(frame)):
        candidate = frame[:-cut] + b"\x91" * 30_000
        try:
            msgspec.msgpack.decode(candidate, type=TrajectoryGroup)
        except RecursionError:
            return candidate
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    raise AssertionError("no cut nests deep enough")


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


def _bad_utf8_kind() -> str:
    """The kind invalid UTF-8 in a string field is counted as: msgspec raised
    UnicodeDecodeError before 0.23 and raises its DecodeError since. Either way it is refused
    and counted (``transport.DECODE_ERRORS`` holds both)."""
    try:
        msgspec.msgpack.decode(b"\xa4\xff\xfe\xfd\xfc", type=str)
    except DECODE_ERRORS as exc:
        return type(exc).__name__
    raise AssertionError("msgspec decoded invalid UTF-8")


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
    kinds = ("DecodeError", "ValidationError", "frames", _bad_utf8_kind(), "RecursionError")
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


def ingest_seeds() -> list[TrajectoryGroup]:
    """Valid groups of every shape the ingest path sees: 0 to 4 trajectories, versions 0-3,
    empty responses, texts, a data source and a ground truth; 400 distinct ids, so that
    mutants that still decode are not all duplicates."""
    seeds = [make_group(f"seed-{i}") for i in range(300)]
    seeds.append(TrajectoryGroup("empty", "p", [], 0.0, 0.0))
    for i in range(99):
        trajectories = [
            Trajectory.from_lists(
                [1] * (j + 1), [5] * j, [-0.5] * j, [i % 4] * j, 0.25 * j, "length", j, "t", 0.7
            )
            for j in range(1 + i % 4)
        ]
        seeds.append(TrajectoryGroup(f"s{i}", f"p{i}", trajectories, 1.0, 2.0, "math", "42"))
    return seeds


def test_ingest_survives_10k_fuzz_inputs(shard, ctx):
    """Every frame ends in exactly one place: malformed (by the kind a local decoder
    predicts), ingested, or dropped by policy; then valid groups still go in and come out."""
    tally = Tally(f"buffer ingest ({'durable' if shard.log else 'memory'})")
    rng = random.Random(13_004)
    other = [BatchRequest(1, 2, 0, 0), StatsRequest(), Batch(1, [make_group("inner")])]
    other += [ShardStats(0, 0, 0, 0, 0, {}, 0), AdmissionRequest(0, 1)]
    inputs = msgpack_corpus(rng, ingest_seeds(), N_INPUTS, other_kinds=other)
    local = GroupDecoder("local prediction")
    decoded, expected = classify(inputs, local.decode)
    expected.update(local.malformed)  # inconsistent lengths, negative versions
    valid = sum(d is not None for d in decoded)
    assert valid > 100 and expected["inconsistent_lengths"] > 0

    push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
    send_all(push, inputs, tally)
    sentinel = encode(make_group("sentinel"))
    push.send(sentinel)
    client = BufferClient([shard.request_endpoint], ctx=ctx, reply_timeout_s=5)

    def accounted() -> int:
        s = client.stats()[0]
        return s.malformed + s.ingested + sum(s.dropped.values())

    try:
        wait_until(lambda: accounted() == len(inputs) + 1, timeout=60)
        stats = client.stats()[0]
        by_kind = {k.removeprefix("ingest/"): n for k, n in stats.malformed_by_kind.items()}
        assert by_kind == dict(expected)
        assert stats.ingested + sum(stats.dropped.values()) == valid + 1

        # The shard still answers, and hands back frames byte for byte.
        dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
        dealer.send(encode(BatchRequest(1, stats.size, -(2**40), 0, 0)))
        assert dealer.poll(10_000)
        reply = msgspec.msgpack.decode(dealer.recv(), type=RawBatch)
        assert len(reply.groups) == stats.size
        assert bytes(reply.groups[-1]) == sentinel
        push.send(encode(make_group("after")))
        assert client.fetch(1, 0, 0, timeout_s=10) == [make_group("after")]
        assert client.group_codec.malformed_total == 0  # the shard let nothing bad through
    finally:
        stats = client.stats()[0]
        tally.report(
            {
                "ingested": stats.ingested,
                **{f"dropped/{k}": n for k, n in stats.dropped.items() if n},
                **{f"malformed/{k}": n for k, n in stats.malformed_by_kind.items()},
            }
        )
        client.close()


def request_seeds() -> list:
    # wait_ms is each long poll's last field and 0: a byte mutation parks it 127 ms at most.
    return [
        BatchRequest(7, 2, 0, 0, 0),
        Peek(8, 1, 0, 0, 0),
        StatsRequest(),
        Reconfigure(capacity=4096, sampling="fifo"),
        Reconfigure(max_reuse=1, overflow="drop-oldest", drop_zero_variance=False),
        Checkpoint(),
    ]


def tame_long_polls(inputs: list, decoded: list) -> int:
    """Cap, in place, the well-typed long polls the corpus made absurd: ``wait_ms`` to 1 s
    (a shard parks up to 10 minutes) and ``learner_version`` into int32 (a shard that heard of
    version 2**63 drops every group as stale, for good: versions are trusted). The other
    fields (``k``, ``floor``, ``request_id``) stay as fuzzed. Returns how many. The learner
    epoch is trusted too (a shard told of epoch 5 without its forks drops every older
    group, as it must): it goes back to 0."""
    tamed = 0
    for i, d in enumerate(decoded):
        if isinstance(d, BatchRequest | Peek):
            version = d.learner_version if 0 <= d.learner_version < 2**31 else 0
            if d.wait_ms > 1_000 or version != d.learner_version or d.learner_epoch:
                decoded[i] = msgspec.structs.replace(
                    d, wait_ms=min(d.wait_ms, 1_000), learner_version=version, learner_epoch=0
                )
                inputs[i] = encode(decoded[i])
                tamed += 1
    return tamed


def test_requests_survive_10k_fuzz_inputs(shard, ctx):
    """Every request that decodes is answered exactly once, every other one is counted by
    kind; afterwards the shard serves a learner as before."""
    tally = Tally(f"buffer requests ({'durable' if shard.log else 'memory'})")
    rng = random.Random(13_005)
    other = [make_group("wrong-socket"), ShardStats(0, 0, 0, 0, 0, {}, 0), Ack(True)]
    other += [Batch(1, []), AdmissionRequest(0, 1), PeekReply(1, [], 0)]
    tags = ["batch_request", "stats_request", "reconfigure", "peek", "checkpoint", "batch"]
    inputs = msgpack_corpus(rng, request_seeds(), N_INPUTS, other_kinds=other, tags=tags)
    decoded, expected = classify(inputs, msgspec.msgpack.Decoder(ShardRequest).decode)
    tamed = tame_long_polls(inputs, decoded)
    valid = [d for d in decoded if d is not None]
    polls = [d for d in valid if isinstance(d, BatchRequest | Peek)]
    assert len(valid) > 100 and polls
    # Learners' versions are trusted: a well-typed request raises the shard's version for good.
    version = max(0, *(d.learner_version for d in polls))

    dealer = connect(ctx, zmq.DEALER, shard.request_endpoint)
    dealer.setsockopt(zmq.RCVHWM, 0)
    replies = 0

    def drain() -> int:
        nonlocal replies
        while dealer.poll(0):
            msgspec.msgpack.decode(dealer.recv(), type=ShardReply)
            replies += 1
        return replies

    client = BufferClient([shard.request_endpoint], ctx=ctx, reply_timeout_s=5)
    try:
        send_all(dealer, inputs, tally, drain)
        wait_until(lambda: drain() == len(valid), timeout=30)
        stats = client.stats()[0]
        by_kind = {k.removeprefix("requests/"): n for k, n in stats.malformed_by_kind.items()}
        assert by_kind == dict(expected)

        # A learner is served as before, once the policy is put back (the fuzz reconfigured it).
        assert all(ack.ok for ack in client.reconfigure(**BASE_POLICY))
        push = connect(ctx, zmq.PUSH, shard.ingest_endpoint)
        groups = [make_group(f"after-{i}", version) for i in range(3)]
        for group in groups:
            push.send(encode(group))
        got = client.fetch(3, version, version, timeout_s=10)
        assert got == groups
        assert not drain() > len(valid)  # nothing more came to the fuzzing peer
    finally:
        stats = client.stats()[0]
        tally.report(
            {
                "answered": replies,
                "shard_version": version,
                "long_polls_capped": tamed,
                **{f"malformed/{k}": n for k, n in stats.malformed_by_kind.items()},
            }
        )
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
