"""Learner-side buffer client: assemble exactly ``k`` groups for one rank from S shards.

Each request asks a shard for at most the groups still missing, and a shard removes what it
hands out, so a group is never given to two ranks and a rank never gets more than ``k``.
Groups are never split. Shards are visited round-robin, long-polling briefly on each, so a
slow shard does not starve the rank while another has data.
"""

from __future__ import annotations

import logging
import time

import zmq

from streamrl.protocol import Batch, BatchRequest, ShardReply, TrajectoryGroup
from streamrl.transport import Codec, make_socket

log = logging.getLogger(__name__)


class BufferClient:
    def __init__(
        self,
        endpoints: list[str],
        *,
        name: str = "learner",
        ctx: zmq.Context | None = None,
        poll_ms: int = 100,
        log_every_s: float = 30.0,
    ) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.name, self.poll_ms, self.log_every_s = name, poll_ms, log_every_s
        self.sockets = []
        for endpoint in endpoints:
            sock = make_socket(self.ctx, zmq.DEALER)
            sock.connect(endpoint)
            self.sockets.append(sock)
        self.codec: Codec[ShardReply] = Codec(ShardReply, f"{name} buffer client")
        self._request_id = 0
        self._next = 0

    def _ask(
        self, shard: int, k: int, floor: int, version: int, wait_ms: int
    ) -> list[TrajectoryGroup]:
        self._request_id += 1
        sock = self.sockets[shard]
        sock.send(self.codec.encode(BatchRequest(self._request_id, k, floor, version, wait_ms)))
        # The shard always answers a request by its deadline; allow generous slack on top.
        deadline = time.monotonic() + wait_ms / 1e3 + 60.0
        while time.monotonic() < deadline:
            if not sock.poll(1000):
                continue
            reply = self.codec.decode(sock.recv())
            if isinstance(reply, Batch) and reply.request_id == self._request_id:
                return reply.groups
        raise TimeoutError(f"{self.name}: buffer shard {shard} did not answer within 60s")

    def fetch(
        self, k: int, floor: int, learner_version: int, timeout_s: float | None = None
    ) -> list[TrajectoryGroup]:
        """Block until ``k`` groups with ``min_version >= floor`` are in hand."""
        groups: list[TrajectoryGroup] = []
        start = last_log = time.monotonic()
        while len(groups) < k:
            shard = self._next
            self._next = (self._next + 1) % len(self.sockets)
            groups.extend(self._ask(shard, k - len(groups), floor, learner_version, self.poll_ms))
            now = time.monotonic()
            if now - last_log > self.log_every_s:
                last_log = now
                log.info(
                    "%s: waiting for data: %d/%d groups with min_version >= %d after %.0fs",
                    self.name,
                    len(groups),
                    k,
                    floor,
                    now - start,
                )
            if timeout_s is not None and now - start > timeout_s:
                raise TimeoutError(f"{self.name}: only {len(groups)}/{k} groups after {timeout_s}s")
        return groups

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
