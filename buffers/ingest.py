"""A shard's ingest: generators' groups from its PULL socket into the store (docs/design.md §5).

``read_burst`` drains up to ``INGEST_BURST`` frames per turn and takes each through the same
gates, in order; a frame leaves at the first that stops it:

1. decoded and checked (``frames.GroupDecoder``): malformed input is counted by kind, logged
   once per kind and dropped; nothing is unpickled;
2. delivery (``buffers.delivery``): a resend of a group that arrived already is dropped and
   counted (``resent_duplicates``); every other group is acknowledged, refused ones too;
3. a group the decoder refused (a token id outside the vocabulary, ...) is counted by reason
   (``invalid``), logged as refused and dropped: acknowledged, never resent;
4. the store's offer: accepted, dropped with a reason, or FULL.

The accepted groups of a burst are appended to the durable log before the loop serves any
request (``LoggedStore.log_accepted``).

**Backpressure** (``overflow=block``): a FULL group is logged and *held* (in the shard's
keeping: a restart must not lose it) and the burst ends; ``space`` is cleared, so the loop
reads nothing more and generators block at the socket's high-water mark. ``admit_held`` offers
held groups again, oldest first, whenever something may have freed space (a take, a larger
capacity, stale evictions); ``space`` is set again once none is held.

Example::

    ingest = Ingest("shard[0]", kept, vocab_size=49152)   # recovers what the log held
    burst = ingest.read_burst(pull)   # Burst(accepted=True, dropped=False)
    ingest.admit_held()               # after a take: held groups get their turn
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from .delivery import Delivered
from .frames import GroupDecoder, StoredGroup
from .logged_store import LoggedStore
from .replay import Offer

log = logging.getLogger(__name__)

INGEST_BURST = 256  # frames read per ingest turn before requests get a turn


@dataclass(frozen=True)
class Burst:
    accepted: bool  # groups were logged (held ones included): parked takes may be answered
    dropped: bool  # groups were dropped: the controller should hear of it soon (admission)


class Ingest:
    """Generators' groups in: decoded, deduplicated, offered, logged; held while full."""

    def __init__(self, name: str, kept: LoggedStore, vocab_size: int = 0) -> None:
        """Recovers the unconsumed groups of ``kept``'s log (checked as on ingest)."""
        self.name, self.kept = name, kept
        self.decoder = GroupDecoder(f"{name} ingest", vocab_size)
        self.invalid: dict[str, int] = {}  # groups refused at the door, by reason
        # overflow=block: groups refused as full, oldest first; on the log already.
        self.held: deque[StoredGroup] = deque()
        self.space = asyncio.Event()  # set while nothing is held: the loop reads PULL
        self.recovered = self._recover()
        kept.flush()
        if not self.held:
            self.space.set()
        # Generator groups received, by sender (``buffers.delivery``): the log's own record
        # when durable (so a restart knows what arrived before it), else this process's.
        self.delivered = kept.log.tallies.delivered if kept.log is not None else Delivered()
        self.resent_duplicates = 0  # resent groups that had arrived already: dropped

    def _recover(self) -> int:
        if self.kept.log is None:
            return 0
        decoded = map(self.decoder.decode, self.kept.log.recover_payloads())
        groups = [group for group in decoded if group is not None]
        for group in groups:
            if self.kept.offer_logged(group) is Offer.FULL:
                self.held.append(group)
        if groups:
            log.info("%s: recovered %d unconsumed groups", self.name, len(groups))
        return len(groups)

    def read_burst(self, pull: zmq.Socket) -> Burst:
        """Read what ``pull`` holds, up to ``INGEST_BURST`` frames, without blocking."""
        accepted: list[StoredGroup] = []
        dropped = False
        for _ in range(INGEST_BURST):
            try:
                frames = pull.recv_multipart(zmq.NOBLOCK)
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
            result = self.kept.store.offer(group)
            if result is Offer.ACCEPTED:
                accepted.append(group)
            elif result is Offer.FULL:  # overflow=block: read nothing more until there is space
                accepted.append(group)  # logged now, admitted later
                self.held.append(group)
                self.space.clear()
                break
            else:
                self.kept.refuse(group.group_id, result.value)
                dropped = True
        self.kept.log_accepted(accepted)
        return Burst(bool(accepted), dropped)

    def _refuse_invalid(self, group: StoredGroup) -> None:
        reason = group.refused
        if reason not in self.invalid:
            log.warning("%s: refused group %r: %s", self.name, group.group_id, reason)
        self.invalid[reason] = self.invalid.get(reason, 0) + 1
        self.kept.store.refuse_invalid()
        self.kept.refuse(group.group_id, "invalid")

    def admit_held(self) -> None:
        """Offer held groups again, oldest first, after something may have freed space."""
        if not self.held:
            return
        while self.held and self.kept.offer_logged(self.held[0]) is not Offer.FULL:
            self.held.popleft()
        self.kept.flush()
        if not self.held:
            self.space.set()

    def figures(self) -> dict[str, Any]:
        """``ShardStats`` fields this part owns."""
        return {
            "recovered": self.recovered,
            "held": len(self.held),
            "delivered": self.delivered.floors(),
            "delivered_above": {s: sorted(a) for s, a in self.delivered.above.items()},
            "resent_duplicates": self.resent_duplicates,
            "invalid": dict(self.invalid),
        }
