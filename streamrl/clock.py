"""The learner group's clock: one version and one epoch, and the rule every reader follows.

The learner group owns the clock. ``version`` is optimizer steps done; ``epoch`` is the
group's incarnation: it rises each time the group restarts from a checkpoint, and versions
then go on from that checkpoint's, so a number such as 9 names different weights in epoch 0
and epoch 1. ``forks[e - 1]`` is the version epoch ``e`` resumed at: the timelines of epochs
``e - 1`` and ``e`` agree up to it and differ after.

Every message that carries a learner version carries the epoch (and the forks), and every
reader (buffer shards, the controller) applies one rule (docs/design.md §3):

- a higher epoch replaces what the reader held, version included (it may go down);
- the same epoch takes the higher version;
- a lower epoch is ignored (a late message of a replaced group).

Weights of epoch ``e`` at version ``m`` still exist on the current timeline iff ``e`` is the
current epoch, or ``m <= forks[e]`` (the fork where epoch ``e + 1`` left it; forks never
go down, since a restart resumes from the newest checkpoint, which no dead timeline wrote
past its death). A group sampled from weights that no longer exist is dropped.

Example::

    clock = LearnerClock()
    clock.observe(0, 11)              # True: news; epoch 0 at version 11
    clock.observe(1, 8, [8])          # True: the group restarted from step 8
    clock.version                     # 8: a higher epoch replaces
    clock.observe(0, 11)              # False: a late message of epoch 0
    clock.on_timeline(0, 8)           # True: version 8 of epoch 0 is epoch 1's start
    clock.on_timeline(0, 9)           # False: epoch 0's version 9 is gone
"""

from __future__ import annotations

from typing import Any


class LearnerClock:
    """The newest (epoch, version) a reader has heard, with the forks between epochs."""

    def __init__(self, epoch: int = 0, version: int = 0, forks: list[int] | None = None) -> None:
        self.epoch, self.version = epoch, version
        self.forks: list[int] = list(forks or [])

    def current_version(self) -> int:
        return self.version

    def observe(self, epoch: int, version: int, forks: list[int] | None = None) -> bool:
        """Apply the rule; True if the epoch rose (the reader must drop what is off the
        timeline now)."""
        if epoch < self.epoch:
            return False
        if epoch > self.epoch:
            self.epoch, self.version = epoch, version
            if forks is not None and len(forks) >= len(self.forks):
                self.forks = list(forks)
            return True
        self.version = max(self.version, version)
        return False

    def on_timeline(self, epoch: int, max_version: int) -> bool:
        """Whether weights of ``epoch`` up to ``max_version`` are on the current timeline.
        A fork this reader was never told of counts as version -1 (nothing of that epoch is
        kept): dropping too much costs a regeneration, keeping too much trains on weights
        that no learner has."""
        if epoch >= self.epoch:
            return True
        fork = self.forks[epoch] if 0 <= epoch < len(self.forks) else -1
        return max_version <= fork


def evaluated_version(record: dict[str, Any]) -> int:
    """The version an ``eval`` record's figures are of: ``eval/version``, the weights
    evaluated, which may be later than the version asked for (``requested``: a lagging
    evaluation process answers an old ask with the newer weights it holds); records written
    before they carried it name only the ask."""
    return int(record.get("eval/version", record.get("requested", 0)))


def live_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` on the run's final timeline: step records and eval
    events of weights a learner restart or a ``--resume`` took back are left out (their step
    numbers repeat in the next epoch); every other event is kept. The clock is read from the
    ``epoch`` events the controller writes as each epoch starts; records without an
    ``epoch`` (written before records carried it) count as epoch 0.

    Example: epoch 0 stepped to 12, then resumed at its checkpoint 10 in epoch 1 (an
    ``{"event": "epoch", "epoch": 1, "forks": [10]}`` record): epoch 0's steps 11 and 12 go,
    its steps 1-10 and epoch 1's stay."""
    clock = LearnerClock()
    for record in records:
        if record.get("event") == "epoch":
            clock.observe(int(record["epoch"]), 0, [int(v) for v in record.get("forks", [])])

    def live(record: dict[str, Any]) -> bool:
        if "step" in record:
            version = record["step"]
        elif record.get("event") == "eval":
            version = evaluated_version(record)
        else:
            return True
        return clock.on_timeline(int(record.get("epoch", 0)), int(version))

    return [record for record in records if live(record)]
