"""Buffer shard server: sockets around one ``ReplayStore`` (DESIGN.md §1, §3).

One single-threaded loop per shard process owns every socket and the store, so no lock is
needed and every decision sees a consistent store:

- PULL  <- generators: ``TrajectoryGroup`` frames; accepted groups are appended to the durable
  log in the same loop turn, before any request can take them;
- ROUTER <- learners and the controller: ``BatchRequest`` (long-poll), ``StatsRequest``,
  ``Reconfigure``;
- PUSH  -> controller: a ``ShardReport`` twice a second.

The shard never waits on anyone: with ``overflow=block`` it stops reading PULL while full, so
generators block at the socket's high-water mark instead (backpressure).
A malformed frame is counted and dropped; nothing is unpickled.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from streamrl.config import BufferConfig
from streamrl.protocol import (
    Ack,
    Batch,
    BatchRequest,
    Reconfigure,
    ShardReport,
    ShardRequest,
    ShardStats,
    StatsRequest,
    TrajectoryGroup,
)
from streamrl.transport import Codec, bind_random, make_socket

from .durable_log import DurableLog
from .replay import Offer, ReplayPolicy, ReplayStore

log = logging.getLogger(__name__)


class LearnerVersion:
    """The newest learner version this shard has heard of (from batch requests)."""

    def __init__(self) -> None:
        self.version = 0

    def current_version(self) -> int:
        return self.version

    def observe(self, version: int) -> None:
        self.version = max(self.version, version)


@dataclass
class _Waiting:
    identity: bytes
    request: BatchRequest
    deadline: float
    taken: list[TrajectoryGroup] = field(default_factory=list)


class BufferShard:
    def __init__(
        self,
        config: BufferConfig,
        shard_id: int,
        *,
        log_dir: Path | None = None,
        report_endpoint: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.shard_id = shard_id
        self.versions = LearnerVersion()
        self._to_mark: list[str] = []
        self.store = ReplayStore(
            ReplayPolicy(
                capacity=config.capacity,
                max_staleness=config.max_staleness,
                sampling=config.sampling,
                max_reuse=config.max_reuse,
                overflow=config.overflow,
            ),
            self.versions,
            seed=shard_id,
            on_remove=lambda gid, _reason: self._to_mark.append(gid),
        )
        self.log = DurableLog(log_dir, shard_id) if log_dir is not None else None
        self.recovered = self._recover()
        self.ctx = zmq.Context()
        self.pull = make_socket(
            self.ctx, zmq.PULL, rcvhwm=config.ingest_hwm, maxmsgsize=config.max_message_bytes
        )
        self.ingest_endpoint = bind_random(self.pull, host, f"shard[{shard_id}] ingest")
        self.router = make_socket(self.ctx, zmq.ROUTER, maxmsgsize=1 << 20)
        self.request_endpoint = bind_random(self.router, host, f"shard[{shard_id}] requests")
        self.reporter = None
        if report_endpoint:
            self.reporter = make_socket(self.ctx, zmq.PUSH, sndhwm=10)
            self.reporter.connect(report_endpoint)
        self.group_codec: Codec[TrajectoryGroup] = Codec(
            TrajectoryGroup, f"shard[{shard_id}] ingest"
        )
        self.request_codec: Codec[ShardRequest] = Codec(ShardRequest, f"shard[{shard_id}] requests")
        self.encoder = msgspec.msgpack.Encoder()
        self.waiting: list[_Waiting] = []
        self.held: tuple[TrajectoryGroup, bytes] | None = None  # overflow=block: not yet admitted
        self._stop = False
        self._last_report = 0.0

    def _recover(self) -> int:
        if self.log is None:
            return 0
        groups = self.log.recover()
        for group in groups:
            self.store.offer(group)
        if groups:
            log.info("shard[%d]: recovered %d unconsumed groups", self.shard_id, len(groups))
        return len(groups)

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        pull_registered = False
        while not self._stop:
            want_pull = self.held is None
            if want_pull != pull_registered:
                if want_pull:
                    poller.register(self.pull, zmq.POLLIN)
                else:
                    poller.unregister(self.pull)
                pull_registered = want_pull
            events = dict(poller.poll(20))
            if self.pull in events:
                self._ingest()
            if self.router in events:
                self._handle_requests()
            self._retry_held()
            self._answer_waiting()
            self._flush_consumed()
            self._report()

    def stop(self) -> None:
        self._stop = True

    def _ingest(self, max_messages: int = 512) -> None:
        accepted: list[TrajectoryGroup] = []
        payloads: list[bytes] = []
        for _ in range(max_messages):
            try:
                frame = self.pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            group = self.group_codec.decode(frame)
            if group is None:
                continue
            result = self.store.offer(group)
            if result is Offer.ACCEPTED:
                accepted.append(group)
                payloads.append(frame)
            elif result is Offer.FULL:
                self.held = (group, frame)
                break
        if self.log is not None and accepted:
            self.log.append_many(accepted, payloads)

    def _retry_held(self) -> None:
        if self.held is None:
            return
        group, frame = self.held
        result = self.store.offer(group)
        if result is Offer.FULL:
            return
        self.held = None
        if result is Offer.ACCEPTED and self.log is not None:
            self.log.append_many([group], [frame])

    def _handle_requests(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self.request_codec.malformed["frames"] += 1
                continue
            identity, body = frames
            match self.request_codec.decode(body):
                case BatchRequest() as req:
                    self.versions.observe(req.learner_version)
                    self.waiting.append(
                        _Waiting(identity, req, time.monotonic() + req.wait_ms / 1e3)
                    )
                case StatsRequest():
                    self._reply(identity, self.stats())
                case Reconfigure() as req:
                    self._reply(identity, self.reconfigure(req))
                case None:
                    pass

    def _answer_waiting(self) -> None:
        """Answer a request once it holds ``k`` groups or its wait ran out. Groups taken for a
        request are reserved for it (already out of the store), so no group goes to two."""
        now = time.monotonic()
        still = []
        for w in self.waiting:
            need = w.request.k - len(w.taken)
            if need > 0 and len(self.store):
                w.taken.extend(self.store.take(need, w.request.floor))
            if len(w.taken) >= w.request.k or now >= w.deadline:
                self._reply(w.identity, Batch(w.request.request_id, w.taken))
            else:
                still.append(w)
        self.waiting = still

    def _reply(self, identity: bytes, message) -> None:
        self.router.send_multipart([identity, self.encoder.encode(message)])

    def _flush_consumed(self) -> None:
        if self._to_mark:
            if self.log is not None:
                self.log.mark_consumed(self._to_mark)
            self._to_mark = []

    # ------------------------------------------------------------------ control

    def reconfigure(self, req: Reconfigure) -> Ack:
        changes = {k: v for k, v in msgspec.structs.asdict(req).items() if v is not None}
        try:
            applied = self.store.reconfigure(**changes)
        except ValueError as exc:
            return Ack(False, str(exc))
        if applied:
            log.info("shard[%d]: reconfigured %s", self.shard_id, applied)
        return Ack(True)

    def stats(self) -> ShardStats:
        s = self.store.stats()
        malformed = self.group_codec.malformed_total + self.request_codec.malformed_total
        return ShardStats(
            shard_id=self.shard_id,
            size=s["size"],
            capacity=s["capacity"],
            ingested=s["ingested"],
            consumed=s["consumed"],
            dropped=s["dropped"],
            bytes=s["bytes"],
            malformed=malformed,
            staleness_hist=s["staleness_hist"],
        )

    def _report(self) -> None:
        now = time.monotonic()
        if self.reporter is None or now - self._last_report < 0.5:
            return
        self._last_report = now
        try:
            self.reporter.send(
                self.encoder.encode(ShardReport(self.stats(), time.time())), zmq.NOBLOCK
            )
        except zmq.Again:
            pass

    def close(self) -> None:
        self._flush_consumed()
        if self.log is not None:
            self.log.close()
        self.ctx.destroy(linger=0)
