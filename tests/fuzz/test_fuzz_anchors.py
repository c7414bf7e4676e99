"""Fuzzing a learner rank's anchor service (the ROUTER of
``workers.learning.publisher.WeightPublisher``).

10,000 seeded inputs from one DEALER against a publisher around a tiny model: malformed
requests are counted by kind (``_codec.malformed``), every request that decodes is answered
with a whole anchor, the anchor thread survives, and afterwards a subscriber's request gets
the current image bit for bit.

Multipart junk (a message with other than one body) is counted as ``frames``; requests over
64 KiB are refused by libzmq, which drops that peer unread.
"""

from __future__ import annotations

import random

import msgspec
import pytest
import torch
import zmq
from fuzzgen import Tally, classify, msgpack_corpus, send_all
from support import wait_until

from streamrl.config import WeightsConfig
from streamrl.protocol import (
    AdmissionRequest,
    AnchorRequest,
    BatchRequest,
    Heartbeat,
    StatsRequest,
    WeightAnchor,
)
from streamrl.transport import make_socket
from streamrl.workers.learning.publisher import WeightPublisher
from streamrl.workers.learning.shard_image import local_bf16_shards

N_INPUTS = 10_000

pytestmark = pytest.mark.slow


def recv_anchor(sock: zmq.Socket, timeout_ms: int = 5000) -> tuple[WeightAnchor, list[bytes]]:
    assert sock.poll(timeout_ms), "no anchor"
    header, *payload = sock.recv_multipart()
    return msgspec.msgpack.decode(header, type=WeightAnchor), payload


def test_anchor_service_survives_fuzz_and_serves_the_image(ctx: zmq.Context) -> None:
    tally = Tally("anchors")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 3, bias=False))
    publisher = WeightPublisher(model, 0, 1, WeightsConfig(), ctx=ctx)
    codec = publisher._codec  # the anchor thread's own counter (no public one)
    seeds = [AnchorRequest(0), AnchorRequest(12_345)]
    other = [AdmissionRequest(0, 1), BatchRequest(1, 2, 0, 0), StatsRequest()]
    other += [Heartbeat("generator", 0, 0, 1.0), WeightAnchor(1, 0, 1, [], 1.0)]
    tags = ["anchor_request", "weight_anchor", "weight_diff", ""]
    inputs = msgpack_corpus(random.Random(13_003), seeds, N_INPUTS, other_kinds=other, tags=tags)
    decoded, expected = classify(inputs, msgspec.msgpack.Decoder(AnchorRequest).decode)
    valid = sum(d is not None for d in decoded)
    assert valid > 100

    sock = make_socket(ctx, zmq.DEALER, rcvhwm=0)
    sock.connect(publisher.anchor_endpoint)
    anchors = 0

    def drain() -> int:
        nonlocal anchors
        while sock.poll(0):
            header = sock.recv_multipart()[0]
            assert msgspec.msgpack.decode(header, type=WeightAnchor).num_chunks == 1
            anchors += 1
        return anchors

    try:
        send_all(sock, inputs, tally, drain)
        # Over 64 KiB: libzmq refuses the request and drops that peer, unread and uncounted.
        big = make_socket(ctx, zmq.DEALER)
        big.connect(publisher.anchor_endpoint)
        big.send(b"\xc1" * (8 << 20))
        tally.inputs += 1
        wait_until(lambda: drain() == valid, what="an anchor for every valid request")
        wait_until(lambda: codec.malformed_total == sum(expected.values()))
        big.close(linger=0)
        assert publisher.anchors_served == valid
        assert all(thread.is_alive() for thread in publisher._threads)

        # A subscriber asking now gets the current version's image, bit for bit.
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.5)
        publisher.publish(1)
        assert publisher.flush(10)
        good = make_socket(ctx, zmq.DEALER)
        good.connect(publisher.anchor_endpoint)
        good.send(msgspec.msgpack.encode(AnchorRequest(99)))
        anchor, payload = recv_anchor(good)
        image = local_bf16_shards(model)
        assert anchor.version == 1 and [p.name for p in anchor.parts] == list(image)
        for part, values in zip(anchor.parts, payload[::2], strict=True):
            assert values == image[part.name].bits.tobytes()
        # Counted once its last message is handed to the socket, which may be after we read it.
        wait_until(lambda: publisher.anchors_served == valid + 1, what="the count")
        good.close()
        sock.close()
    finally:
        alive = all(thread.is_alive() for thread in publisher._threads)
        tally.crashes = int(not alive)
        tally.report(
            {
                **{f"malformed/{k}": n for k, n in codec.malformed.items()},
                "anchors_served": publisher.anchors_served,
            }
        )
        publisher.close(flush_timeout_s=5)
    assert tally.crashes == 0
