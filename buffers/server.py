"""Buffer shard server: sockets around one ``ReplayStore`` (docs/design.md §1, §3).

One asyncio loop (uvloop) per shard process owns every socket and the store, so no lock is
needed and every decision sees a consistent store. Three tasks share it:

- ingest:   PULL <- generators. ``TrajectoryGroup`` frames, drained in bursts; each accepted
  burst is appended to the durable log before the loop can serve any request;
- requests: ROUTER <- learners and the controller. ``Peek`` and ``BatchRequest`` (both long
  polls: parked until they can be answered or their wait runs out), ``StatsRequest``,
  ``Reconfigure``, ``Checkpoint``;
- upkeep:   PUSH -> controller, a ``ShardReport`` twice a second (and right after a burst that
  dropped groups: admission returns a dropped group's budget only when it hears of it);
  periodic log compaction.

Sockets are read with non-blocking drains once asyncio says they are readable: one wake-up
per burst, not per frame (within noise of a plain ``zmq.Poller`` loop on the benchmark).

What waits for what: the shard never waits on a peer. With ``overflow=block`` it stops
reading PULL while a group is held for want of space, so generators block at the socket's
high-water mark instead (backpressure); a take or a larger capacity lets it read again.

Every ingest frame is decoded and checked (``frames.GroupDecoder``); the shard keeps a
summary plus the frame, and forwards the frame unchanged in ``RawBatch`` replies. Malformed
input is counted by kind, logged once per kind and dropped; nothing is unpickled. Frames over
``max_message_bytes`` are refused by libzmq, which drops the sending peer's connection (it
reconnects by itself), counted as ``disconnects``.

Durability (``buffer.durable``): a group is on the log before any request can take it; a
group leaving the store (taken for the last time, or dropped) is marked consumed, and a take
is logged with its client and request id, before the reply carrying it is sent. So a
``kill -9`` never hands a group out twice across a restart, and a reply lost with the process
is sent again when its client repeats the request (``buffers.takes``); drop marks not yet
flushed at a crash only bring dropped groups back (the store re-checks them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import uvloop
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from streamrl.clock import LearnerClock
from streamrl.config import BufferConfig
from streamrl.protocol import (
    Ack,
    BatchRequest,
    Checkpoint,
    Peek,
    PeekReply,
    RawBatch,
    Reconfigure,
    ShardReport,
    ShardRequest,
    ShardStats,
    StatsRequest,
    TakeReceipt,
)
from streamrl.transport import Codec, bind_random, make_socket

from .delivery import Delivered
from .durable_log import DurableLog
from .frames import GroupDecoder, StoredGroup
from .receipts import Receipts
from .replay import Offer, ReplayPolicy, ReplayStore
from .takes import LastTakes

log = logging.getLogger(__name__)

INGEST_BURST = 256  # frames read per ingest turn before requests get a turn
REPORT_EVERY_S = 0.5
# At most this often an extra report after drops: generators wait for admission while drops
# go unheard (a default-job group is dropped 6 times in 10), so a report per burst pays; the
# floor keeps many generators' bursts from flooding the controller.
DROP_REPORT_MIN_S = 0.02
MAX_REQUEST_BYTES = 1 << 20
MAX_WAIT_MS = 600_000  # a longer long poll is cut to this
# Parked long polls per peer and in all: past either cap the oldest one (that peer's, or any)
# is answered at once with what there is, so a peer that floods polls costs bounded memory
# and timers, and every poll is still answered exactly once. A learner rank parks one.
MAX_PARKED_PER_PEER = 16
MAX_PARKED = 1024
# Take receipts kept (``ShardStats.receipts``): takes since the learners' newest checkpoint
# (none before the first); a learner that stops checkpointing would grow them without a cap.
MAX_RECEIPTS = 4096
# The request loop's longest sleep without a wakeup from the socket: a backstop for a lost edge
# (see _reply); an idle shard wakes this often to find nothing.
REQUEST_POLL_MS = 100
POLICY_KNOBS = (
    "capacity",
    "capacity_tokens",
    "max_staleness",
    "sampling",
    "max_reuse",
    "overflow",
    "drop_zero_variance",
)
STORE_STATS = ("size", "capacity", "ingested", "consumed", "dropped", "bytes", "staleness_hist")
_WHY = "it closed, or sent a frame over the size limit: libzmq drops such peers; counted"


@dataclass(eq=False)
class _Waiting:
    """A parked long poll: answered once it can be, or by its timer when its wait runs out."""

    identity: bytes
    request: BatchRequest | Peek
    timer: asyncio.TimerHandle | None = None


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
        self.shard_id = shard_id
        self.config = config
        self.name = f"shard[{shard_id}]"
        self.versions = LearnerClock()
        self._to_mark: list[tuple[str, str]] = []  # (group id, why it left), to log
        self._refused: list[tuple[str, str]] = []  # dropped on arrival, to log
        policy = {k: getattr(config, k) for k in POLICY_KNOBS}
        self.store: ReplayStore[StoredGroup] = ReplayStore(
            ReplayPolicy(**policy),
            self.versions,
            seed=shard_id,
            on_remove=lambda gid, reason: self._to_mark.append((gid, reason)),
        )
        self.decoder = GroupDecoder(f"{self.name} ingest", vocab_size)
        self.invalid: dict[str, int] = {}  # groups refused at the door, by reason
        self.request_codec: Codec[ShardRequest] = Codec(ShardRequest, f"{self.name} requests")
        # overflow=block: groups refused as full, oldest first; on the log already (a held
        # group is in the shard's keeping: a restart must not lose it).
        self.held: deque[StoredGroup] = deque()
        self.waiting: list[_Waiting] = []
        self.disconnects = 0
        self.log = DurableLog(log_dir, shard_id) if log_dir is not None and config.durable else None
        # What each take since the learners' newest checkpoint handed out: a learner restart
        # hands exactly those prompts out again (``buffers.receipts``); kept beside the log.
        path = self.log.shard_dir / "receipts.jsonl" if self.log is not None else None
        self.receipts = Receipts(path, MAX_RECEIPTS)
        # Each learner client's last take (frames), answered again if the client repeats it.
        self.takes: LastTakes[bytes] = self.log.recover_takes() if self.log else LastTakes()
        self.retried_takes = 0
        self.recovered = self._recover()
        self._flush_marks()
        # Generator groups received, by sender (``buffers.delivery``): the log's own record
        # when durable (so a restart knows what arrived before it), else this process's.
        self.delivered = self.log.tallies.delivered if self.log is not None else Delivered()
        self.resent_duplicates = 0  # resent groups that had arrived already: dropped

        self.ctx = zmq.Context()
        self.pull = make_socket(
            self.ctx, zmq.PULL, rcvhwm=config.ingest_hwm, maxmsgsize=config.max_message_bytes
        )
        self.ingest_endpoint = bind_random(self.pull, host, f"{self.name} ingest", ports[0])
        self.router = make_socket(self.ctx, zmq.ROUTER, maxmsgsize=MAX_REQUEST_BYTES)
        self.request_endpoint = bind_random(self.router, host, f"{self.name} requests", ports[1])
        self.monitors = [
            sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) for sock in (self.pull, self.router)
        ]
        self.reporter: zmq.Socket | None = None
        if report_endpoint:
            self.reporter = make_socket(self.ctx, zmq.PUSH, sndhwm=10)
            self.reporter.connect(report_endpoint)
        self.reply_encoder = msgspec.msgpack.Encoder()
        self.report_encoder = msgspec.msgpack.Encoder()
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handling_requests = False
        self._drain_scheduled = False
        self._last_report = 0.0  # time.monotonic() of the last ShardReport sent
        self._drop_report_scheduled = False
        self._stopping: asyncio.Event | None = None
        self._space: asyncio.Event | None = None
        self._marked_since_compact = 0
        self._last_compact = time.monotonic()

    def _recover(self) -> int:
        if self.log is None:
            return 0
        decoded = map(self.decoder.decode, self.log.recover_payloads())  # checked as on ingest
        groups = [group for group in decoded if group is not None]
        for group in groups:
            if self._offer_logged(group) is Offer.FULL:
                self.held.append(group)
        if groups:
            log.info("%s: recovered %d unconsumed groups", self.name, len(groups))
        return len(groups)

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
        self._stopping, self._space = asyncio.Event(), asyncio.Event()
        if not self.held:
            self._space.set()
        if self._stop:
            return
        tasks = [
            asyncio.create_task(self._ingest_loop(zmq.asyncio.Socket.from_socket(self.pull))),
            asyncio.create_task(self._request_loop(zmq.asyncio.Socket.from_socket(self.router))),
            asyncio.create_task(self._upkeep_loop()),
        ] + [
            asyncio.create_task(self._monitor_loop(zmq.asyncio.Socket.from_socket(m)))
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
        assert self._space is not None
        while True:
            await self._space.wait()  # overflow=block: read nothing while a group is held
            await pull.poll(flags=zmq.POLLIN)
            self._ingest()
            await asyncio.sleep(0)  # a burst done: let requests in

    async def _request_loop(self, router: zmq.asyncio.Socket) -> None:
        while True:
            await router.poll(timeout=REQUEST_POLL_MS, flags=zmq.POLLIN)
            self._handle_requests()

    def _drain_requests(self) -> None:
        self._drain_scheduled = False
        self._handle_requests()

    async def _upkeep_loop(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self._flush_marks()
            if self.held:
                self._admit_held()  # stale evictions may have freed space
            self._report()
            every = self.config.compact_every_s
            due = every > 0 and time.monotonic() - self._last_compact >= every
            if due and self._marked_since_compact:
                self.compact()

    async def _monitor_loop(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                if not self.disconnects:  # info: most disconnects are peers that exit
                    endpoint = event["endpoint"].decode()
                    log.info("%s: a peer disconnected from %s (%s)", self.name, endpoint, _WHY)
                self.disconnects += 1

    # ------------------------------------------------------------------ ingest

    def _ingest(self) -> None:
        assert self._space is not None
        accepted: list[StoredGroup] = []
        dropped = False
        for _ in range(INGEST_BURST):
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 1:
                self.decoder.reject("frames", f"{len(frames)} frames in one message, want 1")
                continue
            group = self.decoder.decode(frames[0])
            if group is None:
                continue
            # A resend of a group this shard has (by its typed identity; an old frame's id).
            if not self.delivered.add(group.group_id, group.sender, group.seq):
                self.resent_duplicates += 1
                continue
            if group.refused:  # acknowledged (never resent), counted, dropped
                self._refuse_invalid(group)
                dropped = True
                continue
            result = self.store.offer(group)
            if result is Offer.ACCEPTED:
                accepted.append(group)
            elif result is Offer.FULL:  # overflow=block: read nothing more until there is space
                accepted.append(group)  # logged now, admitted later
                self.held.append(group)
                self._space.clear()
                break
            else:
                self._refused.append((group.group_id, result.value))
                dropped = True
        self._log_accepted(accepted)
        if accepted and self.waiting:
            self._answer_waiting()
        if dropped:
            self._report_drops()

    def _report_drops(self) -> None:
        """Report now, or once ``DROP_REPORT_MIN_S`` after the last report: the controller
        counts a dropped group against the staleness budget until a report says it was dropped,
        and a generator at the budget waits for admission meanwhile."""
        if self._drop_report_scheduled:
            return
        wait = self._last_report + DROP_REPORT_MIN_S - time.monotonic()
        if wait <= 0 or self._loop is None:
            self._report()
            return
        self._drop_report_scheduled = True
        self._loop.call_later(wait, self._scheduled_drop_report)

    def _scheduled_drop_report(self) -> None:
        self._drop_report_scheduled = False
        self._report()

    def _refuse_invalid(self, group: StoredGroup) -> None:
        reason = group.refused
        if reason not in self.invalid:
            log.warning("%s: refused group %r: %s", self.name, group.group_id, reason)
        self.invalid[reason] = self.invalid.get(reason, 0) + 1
        self.store.refuse_invalid()
        self._refused.append((group.group_id, "invalid"))

    def _log_accepted(self, groups: list[StoredGroup]) -> None:
        """Append, then flush marks: a group's mark must never precede its append."""
        if self.log is not None and groups:
            self.log.append_many(groups, [g.frame for g in groups])
        self._flush_marks()

    def _offer_logged(self, group: StoredGroup) -> Offer:
        """Offer a group that is on the log already; a drop is marked on the log with its
        reason (the caller keeps it when the store is FULL)."""
        result = self.store.offer(group)
        if result not in (Offer.ACCEPTED, Offer.FULL):
            self._to_mark.append((group.group_id, result.value))
        return result

    def _admit_held(self) -> None:
        """Offer held groups again, oldest first, after something freed space."""
        while self.held and self._offer_logged(self.held[0]) is not Offer.FULL:
            self.held.popleft()
        self._flush_marks()
        if not self.held and self._space is not None:
            self._space.set()

    def _flush_marks(self) -> None:
        if self._to_mark:
            if self.log is not None:
                ids, reasons = zip(*self._to_mark, strict=True)
                self.log.mark_consumed(list(ids), list(reasons))
                self._marked_since_compact += len(ids)
            self._to_mark = []
        if self._refused:
            if self.log is not None:
                ids, reasons = zip(*self._refused, strict=True)
                self.log.refuse(list(ids), list(reasons))
            self._refused = []

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
                    self._observe_clock(req)
                    self._park(identity, req)
                case StatsRequest():
                    self._reply(identity, self.stats())
                case Reconfigure() as req:
                    self._reply(identity, self.reconfigure(req))
                case Checkpoint():
                    self._reply(identity, self.checkpoint())

    def _observe_clock(self, req: BatchRequest | Peek) -> None:
        """Follow the learner clock (``streamrl.clock``). When its epoch rises the learner
        group restarted: groups sampled from weights it took back leave, and long polls of
        the replaced group are dropped unanswered (an answer would go to a dead peer and
        take groups with it)."""
        if self.versions.observe(req.learner_epoch, req.learner_version, req.forks):
            dead = self.store.evict_off_timeline()
            stale = [w for w in self.waiting if w.request.learner_epoch < req.learner_epoch]
            for waiting in stale:
                if waiting.timer is not None:
                    waiting.timer.cancel()
                self.waiting.remove(waiting)
            log.info(
                "%s: learner epoch %d at version %d: %d groups off its timeline dropped, "
                "%d parked requests of the replaced group cancelled",
                self.name,
                req.learner_epoch,
                req.learner_version,
                dead,
                len(stale),
            )
            self._flush_marks()
        if isinstance(req, BatchRequest) and req.learner_epoch == self.versions.epoch:
            self.receipts.prune(req.learner_epoch, req.checkpointed)

    def _park(self, identity: bytes, req: BatchRequest | Peek) -> None:
        if self._try_answer(identity, req, expired=req.wait_ms <= 0):
            return
        mine = [w for w in self.waiting if w.identity == identity]
        if len(mine) >= MAX_PARKED_PER_PEER:
            self._answer_now(mine[0])
        elif len(self.waiting) >= MAX_PARKED:
            self._answer_now(self.waiting[0])
        waiting = _Waiting(identity, req)
        self.waiting.append(waiting)
        assert self._loop is not None
        wait_s = min(req.wait_ms, MAX_WAIT_MS) / 1e3
        waiting.timer = self._loop.call_later(wait_s, self._expire, waiting)

    def _answer_now(self, waiting: _Waiting) -> None:
        if waiting.timer is not None:
            waiting.timer.cancel()
        self._expire(waiting)

    def _expire(self, waiting: _Waiting) -> None:
        self.waiting.remove(waiting)
        self._try_answer(waiting.identity, waiting.request, expired=True)

    def _answer_waiting(self) -> None:
        still = []
        for w in self.waiting:
            if self._try_answer(w.identity, w.request, expired=False):
                if w.timer is not None:
                    w.timer.cancel()
            else:
                still.append(w)
        self.waiting = still

    def _try_answer(self, identity: bytes, req: BatchRequest | Peek, *, expired: bool) -> bool:
        """Answer ``req`` if it can be answered now, or with what there is if ``expired``;
        say whether it was answered."""
        match req:
            case Peek():
                order = self.peek(req.k, req.floor)
                if not order and not expired:
                    return False
                self._reply(identity, PeekReply(req.request_id, order, len(self.store)))
            case BatchRequest():
                if req.client and self._answer_repeat(identity, req):
                    return True
                if req.learner_epoch < self.versions.epoch:
                    # A replaced learner group's: its reply would be lost with what it took.
                    self._reply(identity, RawBatch(req.request_id, []))
                    return True
                if not expired and (
                    len(self.store) < req.k or len(self.peek(req.k, req.floor)) < req.k
                ):
                    return False
                groups = self.store.take(req.k, req.floor)
                if groups and req.checkpointed >= 0:  # without a checkpoint none is needed
                    indices = [g.prompt_index for g in groups]
                    step = req.learner_version + 1  # the step this batch trains
                    self.receipts.add(TakeReceipt(req.learner_epoch, step, indices))
                if req.client and groups:
                    self.takes.put(req.client, req.request_id, [g.frame for g in groups])
                    if self.log is not None:
                        ids = [g.group_id for g in groups]
                        self.log.record_take(req.client, req.request_id, ids)
                frames = [msgspec.Raw(g.frame) for g in groups]
                self._reply(identity, RawBatch(req.request_id, frames))
                if self.held:
                    self._admit_held()
        return True

    def _answer_repeat(self, identity: bytes, req: BatchRequest) -> bool:
        """Answer a request that is not a new take of its client (``buffers.takes``): the
        same frames again for a repeat of its last take, none for an older request."""
        frames = self.takes.answer(req.client, req.request_id)
        if frames is None:
            return False
        self.retried_takes += bool(frames)
        self._reply(identity, RawBatch(req.request_id, [msgspec.Raw(f) for f in frames]))
        return True

    def peek(self, k: int, floor: int) -> list[tuple[int, float]]:
        """Sort keys (``PeekReply.order``) of the groups ``store.take(k, floor)`` would
        return next, in its order."""
        freshest = self.store.policy.sampling == "freshest"
        return [
            (-g.min_version if freshest else 0, g.finished_at) for g in self.store.peek(k, floor)
        ]

    def _reply(self, identity: bytes, message: Any) -> None:
        """Marks first: a group leaves on the log before it leaves on the wire."""
        self._flush_marks()
        self.router.send_multipart([identity, self.reply_encoder.encode(message)])
        if not self._handling_requests and not self._drain_scheduled and self._loop is not None:
            # A send processes the socket's pending commands, which consumes the edge-triggered
            # wakeup of requests that arrived meanwhile: the request loop would not see them
            # until the next edge. Replies sent outside it (an expired long poll, a group that
            # answers a parked one) read the queue on the next turn. CI stalled on exactly this.
            self._drain_scheduled = True
            self._loop.call_soon(self._drain_requests)

    # ------------------------------------------------------------------ control

    def reconfigure(self, req: Reconfigure) -> Ack:
        changes = {k: v for k, v in msgspec.structs.asdict(req).items() if v is not None}
        try:
            applied = self.store.reconfigure(**changes)
        except ValueError as exc:
            return Ack(False, str(exc))
        if applied:
            log.info("%s: reconfigured %s", self.name, applied)
        self._flush_marks()
        if self.held:
            self._admit_held()
        if self.waiting:
            self._answer_waiting()
        return Ack(True)

    def checkpoint(self) -> Ack:
        if self.log is None:
            return Ack(True, "no durable log")
        try:
            self.compact()
        except OSError as exc:
            return Ack(False, f"compaction failed: {exc}")
        return Ack(True)

    def compact(self) -> None:
        """Rewrite the log with only the groups still stored (or held). Blocks the loop for
        about one read of the log plus one write of the live groups."""
        assert self.log is not None
        self._flush_marks()
        start = time.perf_counter()
        self.log.compact()
        self._marked_since_compact = 0
        self._last_compact = time.monotonic()
        log.info("%s: compacted the log in %.3fs", self.name, time.perf_counter() - start)

    def stats(self, with_receipts: bool = True) -> ShardStats:
        """The shard's figures; ``with_receipts``: its take receipts too (``buffers.receipts``),
        which only a learner restart reads."""
        s = self.store.stats()
        malformed = {f"ingest/{k}": n for k, n in self.decoder.malformed.items()}
        malformed.update({f"requests/{k}": n for k, n in self.request_codec.malformed.items()})
        return ShardStats(
            shard_id=self.shard_id,
            **{k: s[k] for k in STORE_STATS},
            malformed=sum(malformed.values()),
            malformed_by_kind=dict(malformed),
            disconnects=self.disconnects,
            recovered=self.recovered,
            held=len(self.held),
            delivered=self.delivered.floors(),
            resent_duplicates=self.resent_duplicates,
            retried_takes=self.retried_takes,
            invalid=dict(self.invalid),
            learner_epoch=self.versions.epoch,
            learner_version=self.versions.version,
            receipts=list(self.receipts.items) if with_receipts else [],
            **self._log_totals(),
        )

    def _log_totals(self) -> dict[str, Any]:
        """The durable log's tallies, over every process that served this shard."""
        if self.log is None:
            return {}
        self._flush_marks()
        t = self.log.tallies
        return {"received_total": t.received, "removed_total": dict(t.removed)}

    def _report(self) -> None:
        if self.reporter is None:
            return
        self._last_report = time.monotonic()
        with contextlib.suppress(zmq.Again):
            # Receipts only on request (the controller reads them at a learner restart).
            report = ShardReport(self.stats(with_receipts=False), time.time())
            self.reporter.send(self.report_encoder.encode(report), zmq.NOBLOCK)

    def close(self) -> None:
        self._flush_marks()
        if self.log is not None:
            self.log.close()
        for monitor in self.monitors:
            monitor.close(linger=0)
        self.ctx.destroy(linger=0)
