"""A shard's learner clock, and what a new learner epoch does to the shard (docs/design.md §3, §6).

Every ``BatchRequest`` and ``Peek`` carries the learner clock (epoch, version, forks); the
shard follows it by the one rule of ``streamrl.clock``: a higher epoch replaces (the version
may go down), the same epoch takes the max, a lower epoch is ignored. The store measures
staleness against this clock, so a shard follows a restarted learner group *down* instead of
refusing its fresh groups as stale.

When the epoch rises the learner group restarted from a checkpoint, and the shard does two
things at once, before it answers anything:

- groups sampled from weights the restart took back leave the store (``dead_timeline``);
- parked polls of the replaced group are dropped unanswered (``ParkedTakes.cancel_before``).

Example::

    clock.follow(Peek(0, 0, 0, learner_version=8, learner_epoch=1, forks=[8]))
    # epoch 0 reached 11: groups sampled after version 8 of epoch 0 are dropped,
    # epoch 0's parked takes are cancelled, and staleness now counts from version 8
"""

from __future__ import annotations

import logging

from streamrl.clock import LearnerClock
from streamrl.protocol import BatchRequest, Peek

from .logged_store import LoggedStore
from .parked import ParkedTakes

log = logging.getLogger(__name__)


class ShardClock:
    """Moves the shard's ``LearnerClock`` (its only writer) and applies a new epoch."""

    def __init__(
        self, name: str, versions: LearnerClock, kept: LoggedStore, parked: ParkedTakes
    ) -> None:
        self.name, self.versions, self.kept, self.parked = name, versions, kept, parked

    def follow(self, req: BatchRequest | Peek) -> None:
        """Observe the clock ``req`` carries; on a new epoch, drop what it took back."""
        if not self.versions.observe(req.learner_epoch, req.learner_version, req.forks):
            return
        dead = self.kept.store.evict_off_timeline()
        cancelled = self.parked.cancel_before(req.learner_epoch)
        log.info(
            "%s: learner epoch %d at version %d: %d groups off its timeline dropped, "
            "%d parked requests of the replaced group cancelled",
            self.name,
            req.learner_epoch,
            req.learner_version,
            dead,
            cancelled,
        )
        self.kept.flush()
