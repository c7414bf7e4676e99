"""A shard's groups and their durable log, kept in step (docs/design.md §5, §6).

The ``ReplayStore`` decides what stays and what leaves; this part writes each of those
decisions on the shard's ``DurableLog`` (``buffer.durable``) before anything else can see it.
It is the only writer of the log's group rows, and the invariants are its own:

- a group is on the log before any request can take it, and its mark (consumed, or its drop
  reason) never precedes its append (``log_accepted`` appends, then flushes);
- a group leaves on the log before it leaves on the wire: whatever sends a reply or a
  figure flushes first (``flush``);
- a group refused on arrival is logged as refused, so over every process of the shard
  ``received == sum(removed by reason) + remaining`` holds exactly (``figures``).

Removals are queued as the store reports them (``on_remove``) and written in one batch by
``flush``: one log write per burst or reply, not per group. Without a log the queues are
simply emptied. ``compact`` rewrites the log with only the live groups; it blocks the shard's
loop for about one read of the log plus one write of those groups.

Example::

    kept = LoggedStore(BufferConfig(), 0, LearnerClock(), DurableLog(run_dir / "buffer", 0))
    kept.store.offer(group)        # Offer.ACCEPTED: in the store, not yet on the log
    kept.log_accepted([group])     # appended; marks queued before it follow it
    kept.store.take(1, 0)          # queued as consumed ...
    kept.flush()                   # ... and marked, before the reply carrying it is sent
"""

from __future__ import annotations

import logging
import time
from typing import Any

from streamrl.config import BufferConfig

from .durable_log import DurableLog
from .frames import StoredGroup
from .replay import Offer, ReplayPolicy, ReplayStore, VersionProvider

log = logging.getLogger(__name__)

POLICY_KNOBS = (
    "capacity",
    "capacity_tokens",
    "max_staleness",
    "sampling",
    "max_reuse",
    "overflow",
    "drop_zero_variance",
)
STORE_STATS = (
    "size",
    "capacity",
    "ingested",
    "consumed",
    "dropped",
    "bytes",
    "staleness_hist",
    "tokens_by_fate",
    "stored_policy_tokens",
)


class LoggedStore:
    """The shard's ``ReplayStore`` and the ``DurableLog`` (or none) that records it."""

    def __init__(
        self,
        config: BufferConfig,
        shard_id: int,
        versions: VersionProvider,
        durable: DurableLog | None,
    ) -> None:
        self.name = f"shard[{shard_id}]"
        self.log = durable
        self._to_mark: list[tuple[str, str]] = []  # (group id, why it left), to log
        self._refused: list[tuple[str, str]] = []  # dropped on arrival, to log
        policy = {k: getattr(config, k) for k in POLICY_KNOBS}
        self.store: ReplayStore[StoredGroup] = ReplayStore(
            ReplayPolicy(**policy),
            versions,
            seed=shard_id,
            on_remove=lambda gid, reason: self._to_mark.append((gid, reason)),
        )
        self.marked_since_compact = 0
        self.last_compact = time.monotonic()

    def offer_logged(self, group: StoredGroup) -> Offer:
        """Offer a group that is on the log already; a drop is marked on the log with its
        reason (the caller keeps it when the store is FULL)."""
        result = self.store.offer(group)
        if result not in (Offer.ACCEPTED, Offer.FULL):
            self._to_mark.append((group.group_id, result.value))
        return result

    def refuse(self, group_id: str, reason: str) -> None:
        """A group dropped on arrival: logged as received and removed for ``reason``."""
        self._refused.append((group_id, reason))

    def log_accepted(self, groups: list[StoredGroup]) -> None:
        """Append, then flush marks: a group's mark must never precede its append."""
        if self.log is not None and groups:
            self.log.append_many(groups, [g.frame for g in groups])
        self.flush()

    def record_take(self, client: str, request_id: int, groups: list[StoredGroup]) -> None:
        """Log a client's take (``buffers.takes``), so a restart answers its repeat too."""
        if self.log is not None:
            self.log.record_take(client, request_id, [g.group_id for g in groups])

    def flush(self) -> None:
        """Write the queued marks and refusals (or forget them, without a log)."""
        if self._to_mark:
            if self.log is not None:
                ids, reasons = zip(*self._to_mark, strict=True)
                self.log.mark_consumed(list(ids), list(reasons))
                self.marked_since_compact += len(ids)
            self._to_mark = []
        if self._refused:
            if self.log is not None:
                ids, reasons = zip(*self._refused, strict=True)
                self.log.refuse(list(ids), list(reasons))
            self._refused = []

    def compact(self) -> None:
        """Rewrite the log with only the groups still stored (or held). Blocks the loop for
        about one read of the log plus one write of the live groups."""
        assert self.log is not None
        self.flush()
        start = time.perf_counter()
        self.log.compact()
        self.marked_since_compact = 0
        self.last_compact = time.monotonic()
        log.info("%s: compacted the log in %.3fs", self.name, time.perf_counter() - start)

    def figures(self) -> dict[str, Any]:
        """``ShardStats`` fields: the store's, and the log's tallies over every process that
        served this shard (none without a log)."""
        s = self.store.stats()
        figures = {k: s[k] for k in STORE_STATS}
        if self.log is not None:
            self.flush()
            t = self.log.tallies
            figures.update(received_total=t.received, removed_total=dict(t.removed))
        return figures

    def close(self) -> None:
        self.flush()
        if self.log is not None:
            self.log.close()
