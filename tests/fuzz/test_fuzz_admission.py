"""Fuzzing the controller's admission ROUTER (``controller.admission.AdmissionServer``).

10,000 seeded inputs from one DEALER: every malformed one is counted by kind in
``codec.malformed`` (``frames`` for multipart), every one that decodes is answered exactly
once, the thread never dies, and a well-behaved generator is granted as before afterwards.
"""

from __future__ import annotations

import random

import msgspec
import pytest
import zmq
from fuzzgen import Tally, classify, msgpack_corpus, send_all
from support import wait_until

from streamrl.config import BufferConfig
from streamrl.controller.admission import MAX_REQUEST_BYTES, AdmissionServer
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import GeneratorHealth, RunState
from streamrl.protocol import (
    AdmissionReply,
    AdmissionRequest,
    AnchorRequest,
    BatchRequest,
    GeneratorReport,
    Grant,
    Heartbeat,
    LearnerClockInfo,
    StatsRequest,
)
from streamrl.transport import make_socket

N_INPUTS = 10_000

pytestmark = pytest.mark.slow


def serve(ctx: zmq.Context) -> tuple[RunState, AdmissionServer]:
    state = RunState()
    state.health[0] = GeneratorHealth()
    state.health[1] = GeneratorHealth(incarnation=2)
    return state, AdmissionServer(
        ctx, AdmissionPolicy(4, BufferConfig(max_staleness=1), state), state
    )


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = make_socket(ctx, zmq.DEALER, rcvhwm=0)
    sock.connect(endpoint)
    return sock


def ask(sock: zmq.Socket, request: AdmissionRequest) -> AdmissionReply:
    sock.send(msgspec.msgpack.encode(request))
    assert sock.poll(5000), "no admission reply"
    return msgspec.msgpack.decode(sock.recv(), type=AdmissionReply)


def test_admission_survives_fuzz_and_keeps_granting(ctx: zmq.Context) -> None:
    tally = Tally("admission")
    state, server = serve(ctx)
    seeds = [AdmissionRequest(0, 2, 0), AdmissionRequest(1, 5, 2), AdmissionRequest(7, 1, 0)]
    other = [
        AnchorRequest(0),
        BatchRequest(1, 2, 0, 0),
        StatsRequest(),
        Heartbeat("generator", 0, 0, 1.0),
        GeneratorReport(0, 1, 2, 3, 0, 0, 1.0),
        AdmissionReply(grant=Grant(1), clock=LearnerClockInfo(learner_version=1)),
    ]
    tags = ["admission_request", "admission_reply", "heartbeat", "anchor_request", ""]
    inputs = msgpack_corpus(random.Random(13_001), seeds, N_INPUTS, other_kinds=other, tags=tags)
    decoded, expected = classify(inputs, msgspec.msgpack.Decoder(AdmissionRequest).decode)
    valid = sum(d is not None for d in decoded)
    assert valid > 100 and expected["frames"] > 100  # the corpus reaches both paths

    sock = dealer(ctx, server.endpoint)
    replies = 0

    def drain() -> int:
        nonlocal replies
        while sock.poll(0):
            msgspec.msgpack.decode(sock.recv(), type=AdmissionReply)
            replies += 1
        return replies

    try:
        send_all(sock, inputs, tally, drain)
        wait_until(lambda: drain() == valid, what="a reply to every valid request")
        wait_until(lambda: server.codec.malformed_total == sum(expected.values()))
        assert dict(server.codec.malformed) == dict(expected)
        assert server.failures == 0 and server.thread.is_alive()

        # Oversized: libzmq drops the sender's connection; nobody else notices.
        big = dealer(ctx, server.endpoint)
        big.send(b"\x00" * (MAX_REQUEST_BYTES + 1))

        # Valid traffic is still served, and correctly: the learner moved on, so there is room.
        with state.lock:
            state.version = 1_000
        good = dealer(ctx, server.endpoint)
        grant, directives, clock, _ = ask(good, AdmissionRequest(0, 3, 0)).parts()
        assert (grant.granted, clock.learner_version, directives.retire) == (3, 1_000, False)
        assert len(grant.prompt_indices) == 3
        assert ask(good, AdmissionRequest(5, 3, 0)).parts().directives.retire  # nobody's id
        # Refusals leave no trace in the prompt ledger (it used to grow an entry per id).
        assert set(state.prompts.outstanding) <= {0, 1}
        assert server.codec.malformed_total == sum(expected.values())  # big frame: not decoded
        big.close()
        sock.close()
        good.close()
    finally:
        tally.crashes = server.failures + (not server.thread.is_alive())
        tally.report(
            {
                **{f"malformed/{k}": n for k, n in server.codec.malformed.items()},
                "answered": replies,
                "failures": server.failures,
            }
        )
        server.close()
    assert tally.crashes == 0


def test_an_unencodable_reply_does_not_end_admission(ctx: zmq.Context) -> None:
    """A live knob over 64 bits (set before admin/live.py refused them) made the reply
    unencodable; the OverflowError ended the admission thread and every generator waited."""
    state, server = serve(ctx)
    sock = dealer(ctx, server.endpoint)
    try:
        with state.lock:
            state.prompts_per_call = 2**64
        sock.send(msgspec.msgpack.encode(AdmissionRequest(0, 1, 0)))
        wait_until(lambda: server.failures == 1, what="the failure to be counted")
        assert not sock.poll(200) and server.thread.is_alive()
        with state.lock:
            state.prompts_per_call = 3
        assert ask(sock, AdmissionRequest(0, 1, 0)).parts().directives.prompts_per_call == 3
    finally:
        sock.close()
        server.close()
