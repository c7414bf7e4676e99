"""Buffer shard server: one ``ReplayStore`` behind two sockets (docs/design.md §1, §3, §6).

One asyncio loop (uvloop) per shard process owns every socket and every part, so no lock is
needed and every decision sees a consistent store. The shard is its parts, each the one owner
of what it keeps, wired by the loop below:

- ``LoggedStore`` (``logged_store``): the store and its durable log; a group is on the log
  before it can be taken, and leaves the log before it leaves on the wire;
- ``Ingest`` (``ingest``): PULL <- generators; decoding, delivery, refusals, groups held for
  want of space (``overflow=block``), recovery from the log;
- ``ParkedTakes`` (``parked``): ``Peek``/``BatchRequest`` long polls, and the records each take
  leaves (receipts, the client's last take);
- ``ShardClock`` (``shard_clock``): the learner clock; what a new learner epoch drops and
  cancels;
- ``Maintenance`` (``maintenance``): reports to the controller, compaction, ``Reconfigure`` and
  ``Checkpoint``, disconnects.

The loop runs four kinds of task: ingest (a burst of frames per wake-up, then requests get a
turn), requests (ROUTER <- learners and the controller, dispatched below), upkeep
(``Maintenance.tick``) and one disconnect monitor per socket. Sockets are read with
non-blocking drains once asyncio says they are readable: one wake-up per burst, not per frame.

What waits for what: the shard never waits on a peer. With ``overflow=block`` it stops reading
PULL while a group is held, so generators block at the socket's high-water mark instead; a
take or a larger capacity lets it read again. Frames over ``max_message_bytes`` are refused by
libzmq, which drops the sending peer's connection (it reconnects by itself; ``disconnects``).

Durability (``buffer.durable``): a take is logged with its client and request id before the
reply carrying it is sent. So a ``kill -9`` never hands a group out twice across a restart,
and a reply lost with the process is sent again when its client repeats the request
(``buffers.takes``); drop marks not yet flushed at a crash only bring dropped groups back (the
store re-checks them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Any, Protocol

import msgspec
import uvloop
import zmq
import zmq.asyncio

from streamrl.clock import LearnerClock
from streamrl.config import BufferConfig
from streamrl.protocol import (
    BatchRequest,
    Checkpoint,
    Peek,
    Reconfigure,
    ShardRequest,
    ShardStats,
    StatsRequest,
)
from streamrl.transport import Codec, bind_random, make_socket, resolve_host

from .durable_log import DurableLog
from .frames import StoredGroup
from .ingest import Ingest
from .logged_store import LoggedStore
from .maintenance import Maintenance
from .parked import MAX_PARKED_PER_PEER, ParkedTakes, Waiting
from .receipts import Receipts
from .replay import ReplayStore
from .shard_clock import ShardClock
from .takes import LastTakes

__all__ = ["MAX_PARKED_PER_PEER", "BufferShard", "ShardWiring"]

MAX_REQUEST_BYTES = 1 << 20
REPORT_EVERY_S = 0.5  # the upkeep turn (``Maintenance.tick``): a report, marks, compaction
# Take receipts kept (``ShardStats.receipts``): takes since the learners' newest checkpoint
# (none before the first); a learner that stops checkpointing would grow them without a cap.
MAX_RECEIPTS = 4096
# The request loop's longest sleep without a wakeup from the socket: a backstop for a lost edge
# (see _reply); an idle shard wakes this often to find nothing.
REQUEST_POLL_MS = 100


class ShardWiring(Protocol):
    """What a shard is started with: ``controller.specs.ShardSpec``, which buffers may not
    import (docs/design.md §2, rule 4)."""

    config: BufferConfig
    shard_id: int
    log_dir: str
    report_endpoint: str
    bind_host: str
    ingest_port: int
    request_port: int
    vocab_size: int


class BufferShard:
    """One shard: a ``ReplayStore`` behind PULL/ROUTER sockets, served by ``serve()``.

    Invariant: a group id is in at most one reply, ever (across restarts too, with the log).

    Example::

        shard = BufferShard(BufferConfig(capacity=64), 0, log_dir=run_dir / "buffer")
        threading.Thread(target=shard.serve).start()  # or run it as the process's main loop
        # generators PUSH to shard.ingest_endpoint; learners talk to shard.request_endpoint
        shard.stop()  # from any thread; serve() returns, then shard.close()
    """

    def __init__(
        self,
        config: BufferConfig,
        shard_id: int,
        *,
        log_dir: Path | None = None,
        report_endpoint: str | None = None,
        host: str = "127.0.0.1",
        ports: tuple[int, int] = (0, 0),
        vocab_size: int = 0,
    ) -> None:
        """``ports``: (ingest, requests) to bind; 0 picks a free one. A restarted shard
        passes its predecessor's, so peers reconnect to it unchanged. ``vocab_size``: the
        model's; a group with a token id outside it is refused (0: not checked)."""
        self.shard_id, self.config = shard_id, config
        self.name = f"shard[{shard_id}]"
        self.versions = LearnerClock()  # moved only by self.clock
        self.log = DurableLog(log_dir, shard_id) if log_dir is not None and config.durable else None
        self.kept = LoggedStore(config, shard_id, self.versions, self.log)
        # Read from the log before its unconsumed groups: take receipts (kept beside it) and
        # each learner client's last take, which a repeat of its request gets again.
        path = self.log.shard_dir / "receipts.jsonl" if self.log is not None else None
        receipts = Receipts(path, MAX_RECEIPTS)
        takes: LastTakes[bytes] = self.log.recover_takes() if self.log else LastTakes()
        self.ingest = Ingest(self.name, self.kept, vocab_size)  # recovers the log's groups
        self.parked = ParkedTakes(
            self.kept, self.versions, self.ingest, self._reply, receipts, takes
        )
        self.clock = ShardClock(self.name, self.versions, self.kept, self.parked)

        self.ctx = zmq.Context()
        self.pull = make_socket(
            self.ctx, zmq.PULL, rcvhwm=config.ingest_hwm, maxmsgsize=config.max_message_bytes
        )
        self.ingest_endpoint = bind_random(self.pull, host, f"{self.name} ingest", ports[0])
        self.router = make_socket(self.ctx, zmq.ROUTER, maxmsgsize=MAX_REQUEST_BYTES)
        self.request_endpoint = bind_random(self.router, host, f"{self.name} requests", ports[1])
        self.request_codec: Codec[ShardRequest] = Codec(ShardRequest, f"{self.name} requests")
        self.reply_encoder = msgspec.msgpack.Encoder()
        self.monitors = [
            sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) for sock in (self.pull, self.router)
        ]
        report = functools.partial(self.stats, with_receipts=False)  # receipts: on request
        self.upkeep = Maintenance(
            config, self.kept, self.ingest, self.parked, self.ctx, report_endpoint, report
        )
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._handling_requests = False
        self._drain_scheduled = False

    @classmethod
    def from_spec(cls, spec: ShardWiring) -> BufferShard:
        """The shard a spec describes, bound on its (resolved) bind host."""
        return cls(
            spec.config,
            spec.shard_id,
            log_dir=Path(spec.log_dir),
            report_endpoint=spec.report_endpoint,
            host=resolve_host(spec.bind_host),
            ports=(spec.ingest_port, spec.request_port),
            vocab_size=spec.vocab_size,
        )

    @property
    def store(self) -> ReplayStore[StoredGroup]:
        return self.kept.store

    @property
    def waiting(self) -> list[Waiting]:
        """The parked long polls (``ParkedTakes``)."""
        return self.parked.waiting

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        """Serve until ``stop()``. Runs its own uvloop; call it from any one thread."""
        loop = uvloop.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            self._loop = None
            loop.close()

    def stop(self) -> None:
        """Thread-safe: ``serve()`` returns shortly after."""
        self._stop = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(stopping.set)

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        if self._stop:
            return
        tasks = [
            asyncio.create_task(self._ingest_loop(zmq.asyncio.Socket.from_socket(self.pull))),
            asyncio.create_task(self._request_loop(zmq.asyncio.Socket.from_socket(self.router))),
            asyncio.create_task(self._upkeep_loop()),
        ] + [
            asyncio.create_task(self.upkeep.watch_disconnects(zmq.asyncio.Socket.from_socket(m)))
            for m in self.monitors
        ]
        stopping = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in [*tasks, stopping]:
            task.cancel()
        await asyncio.gather(*tasks, stopping, return_exceptions=True)
        for task in done:
            if task is not stopping and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _ingest_loop(self, pull: zmq.asyncio.Socket) -> None:
        while True:
            await self.ingest.space.wait()  # overflow=block: read nothing while a group is held
            await pull.poll(flags=zmq.POLLIN)
            burst = self.ingest.read_burst(self.pull)
            if burst.accepted:
                self.parked.answer_ready()
            if burst.dropped:
                self.upkeep.report_drops()
            await asyncio.sleep(0)  # a burst done: let requests in

    async def _request_loop(self, router: zmq.asyncio.Socket) -> None:
        while True:
            await router.poll(timeout=REQUEST_POLL_MS, flags=zmq.POLLIN)
            self._handle_requests()

    async def _upkeep_loop(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self.upkeep.tick()

    def _drain_requests(self) -> None:
        self._drain_scheduled = False
        self._handle_requests()

    # ------------------------------------------------------------------ requests

    def _handle_requests(self) -> None:
        self._handling_requests = True
        try:
            self._read_requests()
        finally:
            self._handling_requests = False

    def _read_requests(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            routed = self.request_codec.decode_routed(frames)
            if routed is None:
                continue
            identity, request = routed
            match request:
                case BatchRequest() | Peek() as req:
                    self.clock.follow(req)
                    self.parked.park(identity, req)
                case StatsRequest():
                    self._reply(identity, self.stats())
                case Reconfigure() as req:
                    self._reply(identity, self.upkeep.reconfigure(req))
                case Checkpoint():
                    self._reply(identity, self.upkeep.checkpoint())

    def _reply(self, identity: bytes, message: Any) -> None:
        """Marks first: a group leaves on the log before it leaves on the wire."""
        self.kept.flush()
        self.router.send_multipart([identity, self.reply_encoder.encode(message)])
        if not self._handling_requests and not self._drain_scheduled and self._loop is not None:
            # A send processes the socket's pending commands, which consumes the edge-triggered
            # wakeup of requests that arrived meanwhile: the request loop would not see them
            # until the next edge. Replies sent outside it (an expired long poll, a group that
            # answers a parked one) read the queue on the next turn. CI stalled on exactly this.
            self._drain_scheduled = True
            self._loop.call_soon(self._drain_requests)

    def stats(self, with_receipts: bool = True) -> ShardStats:
        """The shard's figures, each from the part that owns it; ``with_receipts``: its take
        receipts too (``buffers.receipts``), which only a learner restart reads."""
        malformed = {f"ingest/{k}": n for k, n in self.ingest.decoder.malformed.items()}
        malformed.update({f"requests/{k}": n for k, n in self.request_codec.malformed.items()})
        return ShardStats(
            shard_id=self.shard_id,
            malformed=sum(malformed.values()),
            malformed_by_kind=dict(malformed),
            disconnects=self.upkeep.disconnects,
            learner_epoch=self.versions.epoch,
            learner_version=self.versions.version,
            **self.ingest.figures(),
            **self.parked.figures(with_receipts),
            **self.kept.figures(),
        )

    def close(self) -> None:
        self.kept.close()
        for monitor in self.monitors:
            monitor.close(linger=0)
        self.ctx.destroy(linger=0)
