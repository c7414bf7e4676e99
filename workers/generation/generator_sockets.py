"""The generator's sockets to the rest of the run: admission and one pusher per buffer shard.

``AdmissionClient`` asks the controller for groups (DEALER -> the controller's ROUTER); its
replies carry the grant, the directives, the learner clock and the shards' receipts
(docs/design.md §5). ``ShardPushers`` owns acknowledged delivery (``buffers.delivery``): each
group's delivery identity is its grant's (grant k of this incarnation, counted in grant
order as the controller's ledger counts them: shard k % S, seq k // S), given when it is
sampled, so that pushing groups in the order their scores settle still lets the controller
tell exactly which grants arrived. Its frame is kept in that shard's ``Outbox`` until the
shard's receipt comes back on an admission reply; a shard restarted meanwhile is sent every
frame it has not acknowledged again.

Example: grants a, b, c over 2 shards -> a and c to shard 0 (seqs 0, 1), b to shard 1 (seq 0),
in whatever order they are pushed; a reply with ``Receipts(delivered={0: 0},
shard_epochs={1: 1})`` forgets a and sends b again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

import msgspec
import zmq

from streamrl.buffers.delivery import Outbox, shard_sender
from streamrl.protocol import AdmissionReply, AdmissionRequest, Receipts, TrajectoryGroup
from streamrl.transport import Codec, make_socket

log = logging.getLogger(__name__)

# A leaving generator waits this long at most for the shards' receipts of what it pushed
# (normally under a second: shards report twice a second, admission relays the floors).
RECEIPT_WAIT_S = 10.0
RECEIPT_POLL_S = 0.1


class AdmissionClient:
    """Asks the controller for permission to start groups (DEALER -> controller ROUTER)."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        generator_id: int,
        incarnation: int = 0,
        sender: str = "",
    ) -> None:
        self.sock = make_socket(ctx, zmq.DEALER)
        self.sock.connect(endpoint)
        self.generator_id, self.incarnation, self.sender = generator_id, incarnation, sender
        self.codec: Codec[AdmissionReply] = Codec(AdmissionReply, "admission client")

    def request(self, n_groups: int, timeout_s: float = 30.0) -> AdmissionReply:
        request = AdmissionRequest(self.generator_id, n_groups, self.incarnation, self.sender)
        self.sock.send(self.codec.encode(request))
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"controller did not answer admission within {timeout_s:.0f}s")
        reply = self.codec.decode(self.sock.recv())
        if reply is None:
            raise RuntimeError("malformed admission reply from the controller")
        return reply


class Admission(Protocol):
    """What receipts are asked from (an ``AdmissionClient``; a test double in tests)."""

    def request(self, n_groups: int, timeout_s: float = 30.0) -> AdmissionReply: ...


class Pusher(Protocol):
    def send(self, frame: bytes) -> None: ...


class ShardPushers:
    """One PUSH socket and one ``Outbox`` per shard; ``groups_pushed`` counts what was sent.

    Invariant: grant k of this incarnation is shard k % S's seq k // S, whatever order groups
    are pushed in; a frame is kept from its first send until its shard's receipt covers its
    seq (or ``Outbox`` forgets the oldest past its cap), and sent again only to a shard whose
    epoch rose since."""

    def __init__(self, pushers: Sequence[Pusher], sender: str, generator_id: int) -> None:
        self.pushers = list(pushers)
        self.outboxes = [Outbox(shard_sender(sender, s)) for s in range(len(self.pushers))]
        self.generator_id = generator_id
        self.groups_pushed = 0
        self.granted = 0  # grants to this incarnation so far: the next grant's position
        self._shard_of = {box.sender: shard for shard, box in enumerate(self.outboxes)}
        self._encoder = msgspec.msgpack.Encoder()

    @classmethod
    def connect(
        cls, ctx: zmq.Context, endpoints: list[str], sender: str, generator_id: int
    ) -> ShardPushers:
        pushers = []
        for endpoint in endpoints:
            sock = make_socket(ctx, zmq.PUSH)
            sock.connect(endpoint)
            pushers.append(sock)
        return cls(pushers, sender, generator_id)

    def take_grant(self, n: int) -> int:
        """A grant of ``n`` groups came (in the order the controller granted them): the
        position of its first, as the ledger counts it (``PromptLedger.grant``)."""
        first, self.granted = self.granted, self.granted + n
        return first

    def address(self, groups: list[TrajectoryGroup], first: int) -> None:
        """Give a grant's groups (in grant order, the first at position ``first``) their
        delivery identity: position k is shard k % S's seq k // S."""
        shards = len(self.outboxes)
        for k, group in enumerate(groups, start=first):
            self.outboxes[k % shards].address(group, k // shards)

    def push(self, groups: list[TrajectoryGroup]) -> None:
        """Send each group to the shard its delivery identity names (a group without one
        takes the next grant position), and keep its frame until the shard's receipt."""
        for group in groups:
            if not group.sender:
                self.address([group], self.take_grant(1))
            shard = self._shard_of[group.sender]
            frame = self._encoder.encode(group)
            self.pushers[shard].send(frame)
            self.outboxes[shard].keep(group.seq, frame)
            self.groups_pushed += 1

    def take_receipts(self, receipts: Receipts) -> None:
        """Forget the groups each shard acknowledged; send a restarted shard the rest again."""
        for shard, outbox in enumerate(self.outboxes):
            outbox.acknowledge(receipts.delivered.get(shard, -1))
            frames = outbox.resend_for(receipts.shard_epochs.get(shard, 0))
            if frames:
                log.info(
                    "generator[%d]: shard %d restarted; sending %d unacknowledged groups again",
                    self.generator_id,
                    shard,
                    len(frames),
                )
            for frame in frames:
                self.pushers[shard].send(frame)

    def await_receipts(self, admission: Admission, timeout_s: float = RECEIPT_WAIT_S) -> int:
        """Before leaving: wait until the shards acknowledged every group pushed, sending a
        shard that restarted meanwhile its groups again (receipts come with admission
        replies, which grant a leaving generator nothing). Returns the groups still without a
        receipt after ``timeout_s`` (logged): the run's ``groups_lost_in_transit`` if their
        shard lost them."""
        deadline = time.monotonic() + timeout_s
        while any(box.unacked for box in self.outboxes):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(RECEIPT_POLL_S, left))
            try:
                reply = admission.request(0, timeout_s=max(left, 0.1))
                self.take_receipts(reply.parts().receipts)
            except TimeoutError:
                break  # the controller is gone: nobody to relay receipts
        unacked = sum(len(box.unacked) for box in self.outboxes)
        if unacked:
            log.warning(
                "generator[%d]: leaving with %d groups no shard acknowledged after %.0fs",
                self.generator_id,
                unacked,
                timeout_s,
            )
        return unacked
