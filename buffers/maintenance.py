"""A shard's maintenance: reports, compaction, live reconfiguration, peers that drop off.

Nothing here is on the path of a group; all of it runs on the shard's loop between bursts
and requests (docs/design.md §3, §6, §8):

- **reports**: a ``ShardReport`` (the shard's figures, without receipts) to the controller
  at every turn, and right after a burst that dropped groups, at most every
  ``DROP_REPORT_MIN_S``: admission returns a dropped group's budget only when it hears of it;
- **the periodic turn** (``tick``, every ``buffers.server.REPORT_EVERY_S``): flush the log's
  marks, offer held groups again (stale evictions may have freed space), report, and compact
  the log every ``compact_every_s`` when something was marked since the last compaction;
- ``Reconfigure`` (a live knob) and ``Checkpoint`` (compact now) requests;
- **disconnects**: the sockets' monitors count peers that left (``ShardStats.disconnects``).

Example::

    upkeep = Maintenance(config, kept, ingest, parked, ctx, endpoint, figures=shard_figures)
    upkeep.reconfigure(Reconfigure(capacity=128))   # Ack(True); held groups may go in
    upkeep.report_drops()   # a report now, or DROP_REPORT_MIN_S after the last one
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from streamrl.config import BufferConfig
from streamrl.protocol import Ack, Reconfigure, ShardReport, ShardStats
from streamrl.transport import make_socket

from .ingest import Ingest
from .logged_store import LoggedStore
from .parked import ParkedTakes

log = logging.getLogger(__name__)

# At most this often an extra report after drops: generators wait for admission while drops
# go unheard (a default-job group is dropped 6 times in 10), so a report per burst pays; the
# floor keeps many generators' bursts from flooding the controller.
DROP_REPORT_MIN_S = 0.02
_WHY = "it closed, or sent a frame over the size limit: libzmq drops such peers; counted"


class Maintenance:
    """The shard's upkeep, reports and control requests (``report_endpoint`` "": no reports)."""

    def __init__(
        self,
        config: BufferConfig,
        kept: LoggedStore,
        ingest: Ingest,
        parked: ParkedTakes,
        ctx: zmq.Context,
        report_endpoint: str | None,
        figures: Callable[[], ShardStats],
    ) -> None:
        self.config, self.kept, self.ingest, self.parked = config, kept, ingest, parked
        self.name = kept.name
        self.figures = figures
        self.reporter: zmq.Socket | None = None
        if report_endpoint:
            self.reporter = make_socket(ctx, zmq.PUSH, sndhwm=10)
            self.reporter.connect(report_endpoint)
        self.report_encoder = msgspec.msgpack.Encoder()
        self._last_report = 0.0  # time.monotonic() of the last ShardReport sent
        self._drop_report_scheduled = False
        self.disconnects = 0

    def tick(self) -> None:
        self.kept.flush()
        self.ingest.admit_held()  # stale evictions may have freed space
        self.report()
        every = self.config.compact_every_s
        due = every > 0 and time.monotonic() - self.kept.last_compact >= every
        if due and self.kept.marked_since_compact:
            self.kept.compact()

    def report(self) -> None:
        if self.reporter is None:
            return
        self._last_report = time.monotonic()
        with contextlib.suppress(zmq.Again):
            report = ShardReport(self.figures(), time.time())
            self.reporter.send(self.report_encoder.encode(report), zmq.NOBLOCK)

    def report_drops(self) -> None:
        """Report now, or once ``DROP_REPORT_MIN_S`` after the last report: the controller
        counts a dropped group against the staleness budget until a report says it was dropped,
        and a generator at the budget waits for admission meanwhile."""
        if self._drop_report_scheduled:
            return
        wait = self._last_report + DROP_REPORT_MIN_S - time.monotonic()
        if wait <= 0:
            self.report()
            return
        self._drop_report_scheduled = True
        asyncio.get_running_loop().call_later(wait, self._scheduled_drop_report)

    def _scheduled_drop_report(self) -> None:
        self._drop_report_scheduled = False
        self.report()

    def reconfigure(self, req: Reconfigure) -> Ack:
        changes = {k: v for k, v in msgspec.structs.asdict(req).items() if v is not None}
        try:
            applied = self.kept.store.reconfigure(**changes)
        except ValueError as exc:
            return Ack(False, str(exc))
        if applied:
            log.info("%s: reconfigured %s", self.name, applied)
        self.kept.flush()
        self.ingest.admit_held()
        self.parked.answer_ready()
        return Ack(True)

    def checkpoint(self) -> Ack:
        if self.kept.log is None:
            return Ack(True, "no durable log")
        try:
            self.kept.compact()
        except OSError as exc:
            return Ack(False, f"compaction failed: {exc}")
        return Ack(True)

    async def watch_disconnects(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                if not self.disconnects:  # info: most disconnects are peers that exit
                    endpoint = event["endpoint"].decode()
                    log.info("%s: a peer disconnected from %s (%s)", self.name, endpoint, _WHY)
                self.disconnects += 1
